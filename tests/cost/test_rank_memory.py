"""Each rank's memory as its strategy puts it there, from shapes alone (deepjimu.cost.memory)."""

from __future__ import annotations

import pytest

from deepjimu.config import RunConfig
from deepjimu.cost.memory import (
    BASE_BYTES,
    IN_PROCESS_BYTES,
    RUNTIME_BYTES,
    admm_state,
    fsdp_state,
    replicated_state,
    staged_state,
    tensor_state,
    transients,
    with_whole_model,
)
from deepjimu.cost.profile import Layer
from deepjimu.strategies.registry import entry, rank_peaks

# four Linear blocks of 1000 parameters, 10 wide, on 4-wide inputs; 8 rows a batch
LAYERS = [Layer(f"{i}", 100.0, 1000, 4 if i == 0 else 10, 10) for i in range(4)]


def cfg(strategy: str, workers: int, **kw: object) -> RunConfig:
    return RunConfig(strategy=strategy, workers=workers, batch_size=8, **kw)  # type: ignore[arg-type]


def acts(rows: float, layers: list[Layer]) -> float:
    """Each block's input and output kept, and the widest output's gradient, in floats."""
    return rows * (sum(l.in_elems + l.out_elems for l in layers) + 10) * 4


def test_one_process_holds_weights_grads_and_adams_two_moments() -> None:
    assert replicated_state(cfg("local", 1), LAYERS, 100) == [4 * 4000 * 4 + acts(8, LAYERS)]
    sgd = replicated_state(cfg("local", 1, optimizer="sgd"), LAYERS, 100)
    assert sgd == [3 * 4000 * 4 + acts(8, LAYERS)]


def test_ddp_adds_its_buckets_and_halves_the_rows() -> None:
    assert replicated_state(cfg("ddp", 2), LAYERS, 100) == [5 * 4000 * 4 + acts(4, LAYERS)] * 2


def test_fsdp_holds_a_shard_and_two_blocks_whole() -> None:
    out = fsdp_state(cfg("fsdp", 4), LAYERS, 100)
    # 1/4 of the state, one block's weights and gradients, the next block's weights
    assert out == [4 * 1000 * 4 + 3 * 1000 * 4 + acts(2, LAYERS)] * 4
    assert out[0] < replicated_state(cfg("ddp", 4), LAYERS, 100)[0]


def test_tp_splits_each_pair_and_keeps_the_whole_batch() -> None:
    out = tensor_state(cfg("tp", 2), LAYERS, 100)
    assert out == [4 * 2000 * 4 + acts(8, LAYERS)] * 2
    # an odd block is whole on every rank
    assert tensor_state(cfg("tp", 2), LAYERS[:3], 100) == [4 * 2000 * 4 + acts(8, LAYERS[:3])] * 2


# a step's transients of a stage: twice its largest block (1000 parameters here)
STEP = 2 * 1000 * 4


def test_a_split_model_puts_its_stages_blocks_on_each_rank() -> None:
    out = staged_state(cfg("model-parallel", 2), LAYERS, 100)
    own = [4 * 2000 * 4 + acts(8, LAYERS[:2]), 4 * 2000 * 4 + acts(8, LAYERS[2:])]
    assert out == [o + STEP for o in own]
    listed = staged_state(cfg("model-parallel", 2, balance="3,1"), LAYERS, 100)
    assert listed[0] == 4 * 3000 * 4 + acts(8, LAYERS[:3]) + STEP
    # a rank with no block has no step
    assert staged_state(cfg("model-parallel", 2), LAYERS[:1], 100)[1] == 0


def test_1f1b_keeps_fewer_micro_batches_than_gpipe() -> None:
    gpipe = staged_state(cfg("pipeline", 4, microbatches=8), LAYERS, 100)
    ofob = staged_state(cfg("pipeline", 4, microbatches=8, schedule="1f1b"), LAYERS, 100)
    # stage s keeps min(8, 4 - s) micro-batches of one row each under 1F1B, all 8 rows under GPipe
    for s in range(4):
        assert ofob[s] == 4 * 1000 * 4 + acts(min(8, 4 - s), LAYERS[s : s + 1]) + STEP
        assert gpipe[s] == 4 * 1000 * 4 + acts(8, LAYERS[s : s + 1]) + STEP


def test_admms_variables_grow_with_the_samples() -> None:
    small = admm_state(cfg("admm", 2), LAYERS, 100)
    large = admm_state(cfg("admm", 2), LAYERS, 1000)
    # per layer: weights twice and their last value (momentum), p, q, z and u for every
    # sample and the last q, z and u, and its solves' matrices: the (W, b) step's on the
    # smaller of samples and input width three times; but for the first layer the
    # p-step's on the smaller of its widths three times and its solved map (out x in)
    first = (3 * 1000 + 7 * 100 * 10 + 3 * 4**2) * 4
    other = (3 * 1000 + 7 * 100 * 10 + 3 * 10**2 + 3 * 10**2 + 1000) * 4
    assert small == [first + other, 2 * other]
    assert large[1] - small[1] == 2 * 7 * 900 * 10 * 4
    # without momentum nothing's last value is kept
    plain = admm_state(cfg("admm", 2, admm_momentum=0.0), LAYERS, 100)
    assert small[1] - plain[1] == 2 * (1000 + 3 * 100 * 10) * 4
    assert admm_state(cfg("admm", 2, admm_batch=10), LAYERS, 1000) == admm_state(
        cfg("admm", 2), LAYERS, 10
    )


@pytest.mark.parametrize("strategy", ["ddp", "pipeline"])
def test_a_cpu_worker_adds_the_process_base_and_the_data(strategy: str) -> None:
    c = cfg(strategy, 2)
    state = entry(strategy).memory(c, LAYERS, 100)
    assert transients(LAYERS) == 2 * 1000 * 4  # a step's: twice the largest block
    if strategy == "pipeline":  # a split model's worker first builds the whole model it
        # is cut from, then frees the other blocks: the more of that start and its part
        # (whose step's transients its state holds); rank 0 also times the blocks (a copy
        # of each and its gradients) beside the whole model, as --balance auto splits
        state = with_whole_model(state, LAYERS, kept=False, timed=True)
        assert with_whole_model([0.0, 4e5], LAYERS, kept=False) == [16000, 4e5]
        assert with_whole_model([0.0, 0.0], LAYERS, False, timed=True) == [24000, 16000]
        # built in parts (an mlp's blocks, each rank its own): no whole model at the start
        assert with_whole_model([0.0, 0.0], LAYERS, False, True, parts=True) == [8000, 0]
        # a sharded model's keeps the whole model beside its shards (the copy, the gather)
        assert with_whole_model([0.0, 4e5], LAYERS, kept=True) == [16000, 16000 + 4e5]
    else:  # a step's transients, beside the state
        state = [s + transients(LAYERS) for s in state]
    base = BASE_BYTES + entry(strategy).traits.base_mb * 2**20
    whole = rank_peaks(c, LAYERS, 100, 1234, cuda=False)
    assert whole == [round(s + RUNTIME_BYTES + base + 1234) for s in state]
    # what --memory-limit counts: the worker's own allocations once started
    budget = rank_peaks(c, LAYERS, 100, 1234, cuda=False, whole=False)
    assert budget == [round(s + RUNTIME_BYTES) for s in state]
    assert rank_peaks(c, LAYERS, 100, 1234, cuda=True) == [round(s) for s in state]


def test_one_worker_in_the_launchers_process_holds_what_the_launcher_read() -> None:
    alone = rank_peaks(cfg("local", 1), LAYERS, 100, 0, cuda=False)
    spawned = rank_peaks(cfg("local", 1, memory_limit="1G"), LAYERS, 100, 0, cuda=False)
    assert alone[0] - spawned[0] == IN_PROCESS_BYTES
