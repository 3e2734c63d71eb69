"""2-D rows (``--replicas``) of deepjimu.cost.predict and cost.memory on hand-made figures."""

from __future__ import annotations

import dataclasses

import pytest
from test_predict import GPU, LINK, Fixed, cfg, cpus, gpus, layers

from deepjimu.cost.cluster import Cluster, Link
from deepjimu.cost.memory import admm_state, staged_state, tensor_state
from deepjimu.cost.profile import Layer
from deepjimu.strategies.registry import predict

SLOW = Link(alpha_s=1e-2, bytes_per_s=1e5)  # between nodes: 10 ms + 10 us per byte


def two_nodes(per_node: int) -> Cluster:
    return Cluster("two", 2, per_node, GPU, LINK, SLOW)


def test_a_chains_replicas_each_step_on_their_part_then_all_reduce_each_stage() -> None:
    lay = layers([1000, 500], [8, 2])  # stage 0 holds 4,000 bytes of gradients, stage 1 2,000
    compute = Fixed([0.001, 0.001])
    one = predict(cfg("model-parallel", 2, balance="1,1"), lay, 20, compute, gpus(4))
    two = predict(cfg("model-parallel", 4, replicas=2, balance="1,1"), lay, 20, compute, gpus(4))
    # the same chain on half the rows of each batch (5 of 10), then each stage's ring all-reduce
    # over its two replicas (one node: the intra link), one after the other: a stage's DDP
    # all-reduces before the gradient of its input goes back to the stage before
    halves = dataclasses.replace(cfg("model-parallel", 2, balance="1,1"), batch_size=5)
    half = predict(halves, lay, 10, compute, gpus(4))
    ring = (2 * 1e-3 + 4000 / 1e6) + (2 * 1e-3 + 2000 / 1e6)
    assert two.parts["replicas_s"] == pytest.approx(ring)
    assert two.step_s == pytest.approx(half.step_s + ring)
    assert two.samples_per_s == pytest.approx(20 / (2 * two.step_s))
    # bytes: both chains' activations and gradients (10 rows in all a step) and every
    # rank's gradients once a step: (2 x 10 x 8 x 4 + 2 x 6,000) x 2 steps over 20 samples
    assert two.bytes_per_sample == pytest.approx((2 * 10 * 8 * 4 + 2 * 6000) * 2 / 20)
    assert one.parts["replicas_s"] == 0.0


def test_replicas_on_two_nodes_cross_the_slow_link_and_the_chain_does_not() -> None:
    lay = layers([1000, 1000], [8, 2])
    compute = Fixed([0.001, 0.001])
    # 2 x 2 on two nodes of 2: a replica's chain within a node, each column across the nodes
    two = predict(
        cfg("model-parallel", 4, replicas=2, balance="1,1"), lay, 20, compute, two_nodes(2)
    )
    assert two.parts["replicas_s"] == pytest.approx(2 * (2 * 1e-2 + 4000 / 1e5))


def test_admm_replicas_solve_on_their_samples_and_pool_the_statistics() -> None:
    compute = Fixed([], admm_s=[1.0, 2.0], widths=[4, 3])
    lay = [Layer("0", 0.0, 10, 2, 4, ((4, 2), (4,))), Layer("1", 0.0, 15, 4, 3, ((3, 4), (3,)))]
    c = cfg("admm", 4, replicas=2, balance="1,1", eval_every=1)
    p = predict(c, lay, 100, compute, gpus(4))

    # per iteration each rank pools its layer's statistics with its replica in two
    # all-reduces: layer 0 (the data's inputs kept) its 4 sums of z, then C_zp's 4 x 2;
    # layer 1 its means and count (4 + 3 + 1), then C_pp and C_zp (4 x (4 + 3))
    def ring(floats: int) -> float:
        return 2 * 1e-3 + floats * 4 / 1e6

    iteration = max(ring(4) + ring(8), ring(8) + ring(28))
    assert p.parts["replicas_s"] == pytest.approx(iteration)
    # a readout refits layer after layer (two each), and the last block refits its
    # classifier again (two) and pools the fits (one)
    readout = 2 * (ring(8) + ring(28)) + ring(8)
    # the exchange: each replica's 50 samples, 4 wide, each way; the readout's chain as much
    cut = 1e-3 + 50 * 4 * 4 / 1e6
    assert p.step_s == pytest.approx(2.0 + 2 * cut + iteration + 0.0 + 2 * cut + readout)
    floats = [4 * 3, 4 + 3 + 1 + 4 * 7]
    pooled = 2 * sum(floats) * 4  # both replicas' ranks, each layer once an iteration
    exchange = 2 * (2 * 50 * 4 * 4) * 2  # both replicas, p and q, and the readout's two passes
    assert p.bytes_per_sample == pytest.approx((exchange + 2 * pooled) / 100)
    # where ranks lose time at each synchronisation (a probe's sync_s), every pooled sum is
    # one: the iteration's 3 and its 2 pooled sums, and the last block's readout's 2 + 3
    busy = predict(c, lay, 100, compute, dataclasses.replace(gpus(4), sync_s={4: 1e-3}))
    assert busy.step_s - p.step_s == pytest.approx((3 + 2 + 5) * 1e-3)


def test_a_replicas_memory_holds_its_part_of_the_samples_and_batch() -> None:
    lay = layers([64 * 32, 32 * 10], [32, 10])
    lay = [dataclasses.replace(l, in_elems=i) for l, i in zip(lay, (64, 32), strict=True)]
    one = admm_state(cfg("admm", 2, balance="1,1"), lay, 1000)
    two = admm_state(cfg("admm", 4, replicas=2, balance="1,1"), lay, 1000)
    assert len(two) == 4 and two[:2] == two[2:]
    # the per-sample variables (p, z, q, u and momentum's records) halve, the weights do not
    assert two[1] < one[1] and one[1] - two[1] == pytest.approx(7 * 500 * 10 * 4)
    mp = staged_state(cfg("model-parallel", 4, replicas=2, balance="1,1"), lay, 1000)
    assert len(mp) == 4 and mp[:2] == mp[2:]


def test_tp_replicas_cut_pairs_within_a_replica_and_move_shards_among_the_replicas() -> None:
    # blocks 0 and 1 paired over a replica's 2 ranks (4 ranks on 4 cores: none share one):
    # each replica steps on 5 of the 10 rows with half the paired work, all-reduces the row
    # block's output within the replica, and per block moves its 1/2 of the rank's part
    # among the replicas as FSDP does (two all-gathers, one reduce-scatter: each half a ring
    # all-reduce of the whole part)
    lay = layers([100, 60], [4, 2])
    compute = Fixed([0.001, 0.002], overhead=0.005)
    one = predict(dataclasses.replace(cfg("tp", 2), batch_size=5), lay, 5, compute, cpus(4, 4))
    two = predict(cfg("tp", 4, replicas=2), lay, 10, compute, cpus(4, 4))
    parts = [50, 30]  # a rank's part of each paired block
    rings = [2 * 1e-3 + 4 * p / 1e6 for p in parts]  # 2 ranks, the part's bytes
    assert two.step_s == pytest.approx(one.step_s + sum(3 * r / 2 for r in rings))
    # bytes a rank hands on a step: the pair's all-reduce on 5 rows (2 floats each) and per
    # block 2 shards gathered, 2 shards reduce-scattered (each shard half the part)
    shard_bytes = sum((2 + 2) * 4 * p // 2 for p in parts)
    assert two.bytes_per_sample == pytest.approx(4 * (5 * 2 * 4 + shard_bytes) / 10)
    # memory: a rank holds a quarter of each paired block's state (the pair cut in two, then
    # sharded over the replicas), the batch's half of the activations
    held_one, held_two = (
        tensor_state(c, lay, 10)[0] for c in (cfg("tp", 2), cfg("tp", 4, replicas=2))
    )
    assert held_two < held_one
