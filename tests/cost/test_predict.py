"""deepjimu.cost.predict: every predictor on hand-made compute and cluster figures, against hand-computed times."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest

from deepjimu.admm_math.wire import wire_bytes
from deepjimu.config import RunConfig
from deepjimu.cost.cluster import Cluster, Device, Link
from deepjimu.cost.ddp import BUCKET, FIRST_BUCKET
from deepjimu.cost.predict.staged import staged_step
from deepjimu.cost.probe import TimedStep
from deepjimu.cost.profile import AdmmTimes, BlockTimes, KfacTimes, Layer
from deepjimu.plan.setup import _action_s, _ddp_sync
from deepjimu.strategies.registry import predict

M = 4  # the probe's micro-batches of a pipeline step

GPU = Device("g", {"fp32": 1e12}, 2**34)
LINK = Link(alpha_s=1e-3, bytes_per_s=1e6)  # 1 ms + 1 us per byte: easy sums


@dataclasses.dataclass
class Fixed:
    """Compute of made-up figures: block l takes ``per_row[l]`` s per row forward, twice
    that backward; a step adds ``overhead`` s (the loss) and the optimizer's update of every
    block (``update_s[l]``, none by default); admm's layers ``admm_s``."""

    per_row: list[float]
    overhead: float = 0.0
    update_s: list[float] = dataclasses.field(default_factory=list)
    admm_s: list[float] = dataclasses.field(default_factory=list)
    readout_s: float = 0.0
    widths: list[int] = dataclasses.field(default_factory=list)
    ddp_extra: float = 0.0  # DDP's own work per step
    action: float = 0.0  # the pipelining runtime's per action

    def blocks(self, rows: int, threads: int) -> BlockTimes:
        return BlockTimes(
            rows, threads, [rows * a for a in self.per_row], [2 * rows * a for a in self.per_row]
        )

    def step(self, rows: int, threads: int) -> float:
        n = len(self.per_row)
        return sum(self.blocks(rows, threads).costs()) + self.overhead + self.update(0, n, threads)

    def update(self, first: int, count: int, threads: int) -> float:
        return sum(self.update_s[first : first + count])

    def admm(self, rows: int, threads: int, pooled: bool = False) -> AdmmTimes:
        return AdmmTimes(rows, threads, self.admm_s, self.readout_s, list(self.admm_s), self.widths)

    def ddp_step(self, rows: int, threads: int) -> float:
        return self.step(rows, threads) + self.ddp_extra

    def pipeline_action(self, rows: int, m: int, threads: int) -> float:
        return self.action


def layers(params: list[int], outs: list[int]) -> list[Layer]:
    return [Layer(f"{i}", 0.0, p, 1, o) for i, (p, o) in enumerate(zip(params, outs, strict=True))]


def gpus(n: int) -> Cluster:
    return Cluster("gpus", 1, n, GPU, LINK, None)


def cpus(ranks: int, cores: int) -> Cluster:
    return Cluster("cpus", 1, ranks, GPU, LINK, None, cores_per_node=cores)


def cfg(strategy: str, workers: int, **kw: object) -> RunConfig:
    return RunConfig(strategy=strategy, workers=workers, epochs=1, batch_size=10, **kw)  # type: ignore[arg-type]


def test_local_is_its_steps_batch_after_batch() -> None:
    compute = Fixed([0.001, 0.002], overhead=0.005)
    # 25 samples, batch 10: ceil(25 / 10) = 3 nearly equal steps, of 9, 8 and 8 rows
    p = predict(cfg("local", 1), layers([10, 10], [4, 2]), 25, compute, gpus(1))
    steps = [3 * rows * 0.003 + 0.005 for rows in (9, 8, 8)]
    assert p.samples_per_s == pytest.approx(25 / sum(steps))
    assert p.step_s == pytest.approx(sum(steps) / 3)
    assert p.bytes_per_sample == 0


def test_ddp_on_cpus_adds_the_ring_all_reduce_after_the_step() -> None:
    compute = Fixed([0.001], overhead=0.0)
    lay = layers([1000], [2])  # 4,000 bytes of gradients: one bucket
    p = predict(cfg("ddp", 2), lay, 20, compute, cpus(2, 2))
    compute_s = 3 * 5 * 0.001  # 5 rows each, 2 threads' worth of cores: no slowdown
    # the link is one hop; all-reduce over 2 ranks: 2 hops of alpha + (2(p-1)/p) n / B
    all_reduce = 2 * 1e-3 + 1.0 * 4000 / 1e6
    assert p.step_s == pytest.approx(compute_s + all_reduce)
    assert p.samples_per_s == pytest.approx(20 / (2 * (compute_s + all_reduce)))
    # each of 2 ranks hands 4,000 bytes to each of the 2 steps, over 20 samples
    assert p.bytes_per_sample == pytest.approx(2 * 4000 * 2 / 20)


def test_ddp_ranks_that_outnumber_the_cores_slow_each_other() -> None:
    compute = Fixed([0.001])
    lay = layers([1], [2])
    alone = predict(cfg("ddp", 3), lay, 30, compute, cpus(3, 3)).parts["compute_s"]
    shared = predict(cfg("ddp", 3), lay, 30, compute, cpus(3, 2)).parts["compute_s"]
    assert shared == pytest.approx(1.5 * alone)  # 3 single-thread ranks on 2 cores


def test_ddp_buckets_follow_torch_caps() -> None:
    # 3 layers of 200,000 floats (800 KB each), last first: the 1 MiB first bucket closes
    # after two (1.6 MB), the rest (800 KB) stays under 25 MiB: two all-reduces
    lay = layers([200_000] * 3, [2] * 3)
    assert FIRST_BUCKET <= 2 * 800_000 and BUCKET > 800_000
    p = predict(cfg("ddp", 2), lay, 10, Fixed([0.0] * 3), cpus(2, 2))
    expected = (2e-3 + 1_600_000 / 1e6) + (2e-3 + 800_000 / 1e6)
    assert p.parts["comm_s"] == pytest.approx(expected)


def test_ddp_on_gpus_hides_the_all_reduce_behind_the_backward_pass() -> None:
    lay = layers([100, 900], [2, 2])  # 4 KB of gradients, 10% in the first layer
    slow_backward = Fixed([0.1, 0.1])  # 10 rows: backward 2 s, far longer than the 6 ms ring
    p = predict(cfg("ddp", 2), lay, 20, slow_backward, gpus(2))
    assert p.step_s == pytest.approx(p.parts["compute_s"])
    quick = Fixed([1e-6, 1e-6])
    q = predict(cfg("ddp", 2), lay, 20, quick, gpus(2))
    comm = 2e-3 + 4000 / 1e6
    bwd = 2 * 5 * 2e-6
    assert q.step_s == pytest.approx(q.parts["compute_s"] + comm - 0.9 * bwd)


def test_model_parallel_runs_the_stages_one_after_the_other() -> None:
    lay = layers([1, 1, 1], [8, 16, 2])
    c = cfg("model-parallel", 2, balance="1,2")
    compute = Fixed([0.001, 0.001, 0.002], overhead=0.004, update_s=[0.003, 0.001, 0.002])
    p = predict(c, lay, 10, compute, gpus(2))
    # one step of 10 rows: all blocks forward and backward, the loss, the 8-wide activation
    # and its gradient across the cut after block 0; rank 1 updates while rank 0 runs its
    # backward, so only rank 0's update (block 0's) comes after
    blocks = 3 * 10 * 0.004
    move = 1e-3 + 10 * 8 * 4 / 1e6
    assert p.step_s == pytest.approx(blocks + 0.004 + 2 * move + 0.003)
    assert p.bytes_per_sample == pytest.approx(2 * 8 * 4)
    # an update longer than the way back to rank 0 and its backward is the step's end
    heavy = dataclasses.replace(compute, update_s=[0.003, 0.02, 0.02])
    q = predict(c, lay, 10, heavy, gpus(2))
    rank1_done = 10 * 0.001 + move + 10 * 0.003 + 10 * 0.006 + 0.004
    assert q.step_s == pytest.approx(rank1_done + 0.04)


def test_pipeline_gpipe_makespan_from_the_schedule() -> None:
    # 2 equal stages, 4 micro-batches of 10/4 -> 3 rows, forward 3 ms and backward 6 ms a
    # stage: (m + S - 1)(F + B) = 5 x 9 ms without transfers; here each costs 1 ms + 3*8*4 us
    compute = Fixed([0.001, 0.001])
    lay = layers([1, 1], [8, 2])
    p = predict(cfg("pipeline", 2, microbatches=4, balance="1,1"), lay, 10, compute, gpus(2))
    send = 1e-3 + 3 * 8 * 4 / 1e6
    # forwards: stage 1 starts micro-batch i at 3 ms + send + 3i; its last forward ends at
    # 3 + send + 12; then backwards on stage 1 at 6 ms each (4 -> 24 ms), stage 0 follows
    # each with a send: the last backward of stage 0 ends send + 6 after stage 1's last
    expected = 3e-3 + send + 4 * 3e-3 + 4 * 6e-3 + send + 6e-3
    assert p.parts["makespan_s"] == pytest.approx(expected)
    assert p.step_s == pytest.approx(expected)  # no optimizer overhead in these figures


def test_admm_iteration_is_the_slowest_rank_then_the_exchange() -> None:
    compute = Fixed([], admm_s=[1.0, 2.0, 3.0], readout_s=0.5, widths=[100, 50, 10])
    lay = layers([1, 1, 1], [100, 50, 10])
    c = cfg("admm", 2, balance="2,1", eval_every=2)
    p = predict(c, lay, 1000, compute, gpus(2))
    # rank 0: layers 0, 1 (3 s); rank 1: layer 2 (3 s); the cut after layer 1 carries
    # 1000 x 50 floats each way; the readout (every 2nd iteration) adds its solves and the
    # plain and refitted activations across the cut
    cut = 1e-3 + 1000 * 50 * 4 / 1e6
    assert p.parts["compute_s"] == pytest.approx(3.0)
    assert p.step_s == pytest.approx(3.0 + 2 * cut + (0.5 + 2 * cut) / 2)
    assert p.bytes_per_sample == pytest.approx(2 * 50 * 4 + 2 * 50 * 4 / 2)


def test_admm_quantized_exchange_sends_fewer_bytes() -> None:
    compute = Fixed([], admm_s=[1.0, 1.0], widths=[100, 10])
    lay = layers([1, 1], [100, 10])
    full = predict(cfg("admm", 2, eval_every=1000), lay, 100, compute, gpus(2))
    q8 = predict(cfg("admm", 2, eval_every=1000, quantize=8), lay, 100, compute, gpus(2))
    assert q8.bytes_per_sample < full.bytes_per_sample / 3


@pytest.mark.parametrize("bits", [0, 2, 4, 8, 16])
def test_admm_bytes_are_the_exchanges_messages(bits: int) -> None:
    """Every message across the cut (p left, q right; each log the readout's two passes) as
    the exchange sends it: ``wire.wire_bytes``, which the exchange's tests measure."""
    compute = Fixed([], admm_s=[1.0, 1.0], widths=[99, 10])
    lay = layers([1, 1], [99, 10])
    p = predict(cfg("admm", 2, eval_every=2, quantize=bits), lay, 37, compute, gpus(2))
    message = wire_bytes(37, 99, bits)
    assert p.bytes_per_sample * 37 == pytest.approx(2 * message + 2 * message / 2)
    # the p (or q) exchange and the readout's chain, each at the link's 1 ms + 1 us a byte
    chain = 2 * (1e-3 + message / 1e6)
    assert p.parts["exchange_s"] == pytest.approx(chain)
    assert p.step_s == pytest.approx(1.0 + chain + chain / 2)


def test_what_is_not_predicted_says_so() -> None:
    with pytest.raises(ValueError, match="full-batch admm only"):
        predict(cfg("admm", 2, admm_batch=64), layers([1, 1], [2, 2]), 100, Fixed([]), gpus(2))
    with pytest.raises(ValueError, match="compress none, fp16 or bf16"):
        predict(cfg("ddp", 2, compress="qsgd:8"), layers([1], [2]), 100, Fixed([0.0]), gpus(2))


@dataclasses.dataclass
class WithKfac(Fixed):
    """Fixed, plus a K-FAC step of 10 ms and decompositions of 40 ms and 20 ms."""

    def kfac(self, rows: int, threads: int) -> KfacTimes:
        return KfacTimes(rows, threads, 0.010, [0.040, 0.020], [5, 3], [4, 2])


def test_kfac_splits_the_decompositions_over_the_ranks() -> None:
    lay = layers([20, 6], [4, 2])
    one = predict(
        cfg("local", 1, optimizer="kfac", kfac_inv_every=10), lay, 10, WithKfac([0.0] * 2), gpus(1)
    )
    # one process decomposes both layers every 10th step: 10 ms + 60 ms / 10
    assert one.step_s == pytest.approx(0.010 + 0.060 / 10)
    two = predict(
        cfg("ddp", 2, optimizer="kfac", kfac_inv_every=10), lay, 20, WithKfac([0.0] * 2), gpus(2)
    )
    # two ranks: the greedy assignment gives each one layer, the slower (40 ms) counts; the
    # gradients (26 floats), the factors' upper triangles (15 + 10 + 6 + 3 floats) are
    # all-reduced each step; each rank's decomposition goes to the other (COMM-OPT)
    grads = 2e-3 + 26 * 4 / 1e6
    factors = 2e-3 + 34 * 4 / 1e6
    # one column of both ranks: rank 0 broadcasts layer 0's (25 + 5 + 16 + 4 floats), then
    # rank 1 layer 1's (9 + 3 + 4 + 2)
    bcast = (1e-3 + 50 * 4 / 1e6) + (1e-3 + 18 * 4 / 1e6)
    assert two.step_s == pytest.approx(0.010 + grads + factors + (0.040 + bcast) / 10)


def test_ddp_pays_ddps_own_work_and_local_does_not() -> None:
    compute = Fixed([0.001], ddp_extra=0.002)
    lay = layers([1], [2])
    local = predict(cfg("local", 1), lay, 10, compute, gpus(1))
    ddp = predict(cfg("ddp", 1), lay, 10, compute, gpus(1))
    assert ddp.step_s == pytest.approx(local.step_s + 0.002)


def test_pipeline_actions_pay_the_runtime() -> None:
    lay = layers([1, 1], [8, 2])
    c = cfg("pipeline", 2, microbatches=4, balance="1,1")
    plain = predict(c, lay, 10, Fixed([0.001, 0.001]), gpus(2)).parts["makespan_s"]
    paid = predict(c, lay, 10, Fixed([0.001, 0.001], action=5e-4), gpus(2)).parts["makespan_s"]
    # the same critical path as test_pipeline_gpipe_makespan_from_the_schedule: 1 + 4 + 4 + 1
    # forward and backward actions on it, each 0.5 ms longer
    assert paid == pytest.approx(plain + 10 * 5e-4)


def test_the_runtime_per_action_is_solved_from_the_probes_step_of_each_split_strategy() -> None:
    # the probe's GPipe step of stages of 2 and 1 blocks, 4 rows, and its model-parallel
    # step of 16 rows through the same stages, with known work, a cut's transfer, the loss,
    # each stage's update and a synchronisation penalty: solving each gives back the
    # per-action time that made it
    cluster = dataclasses.replace(cpus(2, 2), sync_s={2: 3e-4})
    compute = Fixed([0.001, 0.002, 0.001], overhead=5e-4, update_s=[1e-4, 2e-4, 1e-4])
    lay = layers([1, 1, 1], [8, 8, 2])
    probed = cfg("pipeline", 2, schedule="gpipe", microbatches=M)
    step = staged_step(probed, lay, compute, cluster, [2, 1], 4, M, 7e-4).step_s
    chain = staged_step(cfg("model-parallel", 2), lay, compute, cluster, [2, 1], 16, 1, 2e-4)
    steps = {
        "pipeline": TimedStep(step, [2, 1], 4, M),
        "model-parallel": TimedStep(chain.step_s, [2, 1], 16, 1),
        "ddp": TimedStep(0.01, [], 4, 1),  # a data-parallel step: no runtime per action
    }
    found = SimpleNamespace(world=2, model="m", steps=steps)
    solved = _action_s(cluster, found, cfg("ddp", 2), compute, lay)
    assert solved == pytest.approx({"pipeline": 7e-4, "model-parallel": 2e-4})
    # a step faster than the work alone: the runtime costs nothing
    quick = SimpleNamespace(
        world=2, model="m", steps={**steps, "pipeline": TimedStep(step / 100, [2, 1], 4, M)}
    )
    assert _action_s(cluster, quick, cfg("ddp", 2), compute, lay)["pipeline"] == 0.0
    # no step timed (one rank, fewer blocks than ranks) or an older probe file: left out
    for left in ({k: v for k, v in steps.items() if k != "pipeline"},
                 {**steps, "pipeline": TimedStep(step, [], 4, M)}):  # fmt: skip
        other = SimpleNamespace(world=2, model="m", steps=left)
        assert list(_action_s(cluster, other, cfg("ddp", 2), compute, lay)) == ["model-parallel"]


def test_a_chain_pays_no_synchronisation_penalty_and_its_solved_action_time() -> None:
    # model-parallel's ranks compute one at a time: the penalty of ranks computing at once
    # is not theirs; a pipeline of 4 micro-batches pays it once a step
    lay = layers([1, 1], [8, 2])
    rule = cpus(2, 2)
    measured = dataclasses.replace(rule, sync_s={2: 0.002})
    chain = cfg("model-parallel", 2, balance="1,1")
    assert predict(chain, lay, 10, Fixed([0.001, 0.001]), measured).step_s == pytest.approx(
        predict(chain, lay, 10, Fixed([0.001, 0.001]), rule).step_s
    )
    pipe = cfg("pipeline", 2, microbatches=4, balance="1,1")
    assert predict(pipe, lay, 10, Fixed([0.001, 0.001]), measured).step_s == pytest.approx(
        predict(pipe, lay, 10, Fixed([0.001, 0.001]), rule).step_s + 0.002
    )
    # the probe's action time: each of the chain's 4 actions (2 forwards, 2 backwards)
    # 0.5 ms longer, one after the other
    solved = dataclasses.replace(rule, action_s={"model-parallel": 5e-4})
    base = predict(chain, lay, 10, Fixed([0.001, 0.001]), rule).step_s
    assert predict(chain, lay, 10, Fixed([0.001, 0.001]), solved).step_s == pytest.approx(
        base + 4 * 5e-4
    )


def test_a_measured_synchronisation_penalty_is_paid_once_a_step() -> None:
    lay = layers([1], [2])
    rule = cpus(3, 2)
    measured = dataclasses.replace(rule, sync_s={3: 0.002})
    one = predict(cfg("ddp", 3), lay, 30, Fixed([0.001]), rule)
    two = predict(cfg("ddp", 3), lay, 30, Fixed([0.001]), measured)
    assert two.step_s == pytest.approx(one.step_s + 0.002)
    admm = Fixed([], admm_s=[1.0, 1.0, 1.0], widths=[4, 4, 4])
    a = predict(cfg("admm", 3, eval_every=1), layers([1] * 3, [4] * 3), 10, admm, rule)
    b = predict(cfg("admm", 3, eval_every=1), layers([1] * 3, [4] * 3), 10, admm, measured)
    assert b.step_s == pytest.approx(a.step_s + 3 * 0.002)  # the p and q exchanges, the readout


def test_a_ddp_steps_all_reduce_penalty_is_solved_from_the_probe_and_paid_by_ddp_alone() -> None:
    # the probe's plain step of 3 ranks stepping together (each alone: 4 ms) and its ddp
    # step over the group (11 ms); one 1 MiB-first bucket of 40 bytes all-reduced over a
    # 1 ms + 1 us/byte hop: ring all-reduce of 3 ranks = 2 * 2 hops of alpha, 2 * 2/3 * 40 B
    lay = layers([10], [2])
    rule = cpus(3, 2)

    def probed(step_s: float | None) -> SimpleNamespace:
        steps = {} if step_s is None else {"ddp": TimedStep(step_s, [], 4, 1)}
        return SimpleNamespace(world=3, model="m", compute_s=0.004, steps=steps)

    ring = 4 * 1e-3 + 2 * (2 / 3) * 40 / 1e6
    sync = _ddp_sync(rule, probed(0.011), cfg("ddp", 3), lay)
    assert sync == {3: pytest.approx(0.011 - 0.004 - ring)}
    # a step over the group no slower than the plain step and its all-reduce: nothing
    assert _ddp_sync(rule, probed(0.004), cfg("ddp", 3), lay) == {3: 0.0}
    # a probe of one rank (or an earlier probe file): no figure
    assert _ddp_sync(rule, probed(None), cfg("ddp", 3), lay) == {}
    measured = dataclasses.replace(rule, ddp_sync_s=sync)
    one = predict(cfg("ddp", 3), lay, 30, Fixed([0.001]), rule)
    two = predict(cfg("ddp", 3), lay, 30, Fixed([0.001]), measured)
    assert two.step_s == pytest.approx(one.step_s + sync[3])
    # only at the probed worker count, and only ddp's steps pay it
    assert predict(cfg("ddp", 2), lay, 30, Fixed([0.001]), measured).step_s == pytest.approx(
        predict(cfg("ddp", 2), lay, 30, Fixed([0.001]), rule).step_s
    )
    staged = cfg("model-parallel", 3)
    three = layers([1] * 3, [4] * 3)
    assert predict(staged, three, 30, Fixed([0.001] * 3), measured).step_s == pytest.approx(
        predict(staged, three, 30, Fixed([0.001] * 3), rule).step_s
    )


def test_a_slow_rank_sets_the_pace_and_balancing_by_speed_gives_it_less() -> None:
    compute = Fixed([0.001])
    lay = layers([1], [2])
    mixed = dataclasses.replace(gpus(2), speeds=(1.0, 0.25))
    # ddp, batch 10 of 10 rows: even, each rank 5 rows, the slow one 4x longer
    even = predict(cfg("ddp", 2, balance="even"), lay, 10, compute, mixed)
    assert even.parts["compute_s"] == pytest.approx(3 * 5 * 0.001 / 0.25)
    # by speed: 8 and 2 rows (shard_sizes), the slower of 8 rows at 1 and 2 at 0.25
    fast = predict(cfg("ddp", 2, balance="speed"), lay, 10, compute, mixed)
    assert fast.parts["compute_s"] == pytest.approx(max(3 * 8 * 0.001, 3 * 2 * 0.001 / 0.25))
    # auto balances by speed when the speeds differ by more than 10%
    auto = predict(cfg("ddp", 2), lay, 10, compute, mixed)
    assert auto.step_s == pytest.approx(fast.step_s)
    same = predict(cfg("ddp", 2), lay, 10, compute, gpus(2))
    assert same.parts["compute_s"] == pytest.approx(3 * 5 * 0.001)


def test_admm_by_speed_gives_the_slow_rank_fewer_layers() -> None:
    admm = Fixed([], admm_s=[1.0, 1.0, 1.0, 1.0], widths=[4, 4, 4, 4])
    lay = layers([1] * 4, [4] * 4)
    mixed = dataclasses.replace(gpus(2), speeds=(1.0, 0.25))
    even = predict(cfg("admm", 2, balance="even", eval_every=1), lay, 10, admm, mixed)
    fast = predict(cfg("admm", 2, balance="speed", eval_every=1), lay, 10, admm, mixed)
    assert even.parts["compute_s"] == pytest.approx(2 / 0.25)  # 2 layers at a quarter speed
    # 3 layers at speed 1 (3 s) and 1 at a quarter (4 s): the slowest 4 s, not 8
    assert fast.parts["compute_s"] == pytest.approx(4.0)
    assert fast.step_s < even.step_s


def test_stages_run_at_their_ranks_speed() -> None:
    lay = layers([1, 1], [8, 2])
    c = cfg("model-parallel", 2, balance="1,1")
    base = predict(c, lay, 10, Fixed([0.001, 0.001]), gpus(2))
    slow = predict(
        c, lay, 10, Fixed([0.001, 0.001]), dataclasses.replace(gpus(2), speeds=(1.0, 0.5))
    )
    # stage 1's forward (10 ms) and backward (20 ms) take twice as long
    assert slow.step_s == pytest.approx(base.step_s + 0.030)


def test_fsdp_is_ddps_step_with_each_blocks_gathers_and_reduce_scatter() -> None:
    # two blocks of 10 parameters on 2 ranks: a shard is 5 floats (20 bytes); per block two
    # all-gathers ((p-1) alpha + (p-1) 20 B / B each) and one reduce-scatter of 40 bytes
    # ((p-1) alpha + (p-1)/p 40 B / B), against ddp's one all-reduce of the 80 bytes
    lay = layers([10, 10], [4, 2])
    compute, cluster = Fixed([0.001, 0.002], overhead=0.005), cpus(2, 2)
    fsdp = predict(cfg("fsdp", 2), lay, 20, compute, cluster)
    ddp = predict(cfg("ddp", 2), lay, 20, compute, cluster)
    gathers = 2 * 2 * (1e-3 + 20e-6) + 2 * (1e-3 + 20e-6)
    all_reduce = 2 * 1e-3 + 80e-6
    assert fsdp.step_s - ddp.step_s == pytest.approx(gathers - all_reduce)
    assert fsdp.bytes_per_sample > ddp.bytes_per_sample  # 1.5x the bytes of an all-reduce


def test_fsdp_and_tp_pay_their_runtime_per_unit_solved_from_the_probes_own_steps() -> None:
    # fsdp pays the solved seconds once per unit (each block and the root), tp once per
    # paired block; the probe's steps of each (fsdp on 4 rows a rank, tp on the whole 8)
    # made with known runtimes solve back to them, and ddp's sync penalty ignores fsdp's step
    lay = layers([10, 10, 10], [4, 4, 2])
    compute, cluster = Fixed([0.001, 0.002, 0.001], overhead=0.005), cpus(2, 2)
    paid = dataclasses.replace(cluster, action_s={"fsdp": 3e-4, "tp": 7e-4})
    for name, units in (("fsdp", 4), ("tp", 2)):
        base = predict(cfg(name, 2), lay, 20, compute, cluster).step_s
        assert predict(cfg(name, 2), lay, 20, compute, paid).step_s == pytest.approx(
            base + units * paid.action_s[name]
        )

    def one_batch(name: str) -> float:
        at = dataclasses.replace(cfg(name, 2), batch_size=8)
        return predict(at, lay, 8, compute, paid).step_s

    timed = {
        "fsdp": TimedStep(one_batch("fsdp"), [], 4, 1),
        "tp": TimedStep(one_batch("tp"), [], 8, 1),
    }
    found = SimpleNamespace(world=2, model="m", compute_s=0.004, steps=timed)
    assert _action_s(cluster, found, cfg("ddp", 2), compute, lay) == pytest.approx(paid.action_s)
    assert _ddp_sync(cluster, found, cfg("ddp", 2), lay) == {}  # no ddp step timed


def test_tp_halves_the_paired_blocks_and_pays_each_pairs_all_reduce() -> None:
    # blocks 0 and 1 paired on 2 ranks: each rank does half their work on the whole batch of
    # 10 rows, then all-reduces the row block's output (2 per row, float32) forward; the
    # first pair's input is the data, so nothing backward
    lay = layers([10, 10], [4, 2])
    compute, cluster = Fixed([0.001, 0.002], overhead=0.005), cpus(2, 2)
    local = predict(cfg("local", 1), lay, 10, compute, cpus(1, 2))
    tp = predict(cfg("tp", 2), lay, 10, compute, cluster)
    half = (3 * 10 * 0.001 + 3 * 10 * 0.002) / 2
    assert tp.step_s == pytest.approx(local.step_s - half + 2 * 1e-3 + 80 / 1e6)
    assert tp.bytes_per_sample == pytest.approx(2 * 80 / 10)  # both ranks, per sample
