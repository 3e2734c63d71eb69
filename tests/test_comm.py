"""Comm: every payload counted where it is sent (bytes of its own dtype), per kind, on 1-3 gloo ranks."""

from __future__ import annotations

import pytest
import torch

from deepjimu.comm import Comm, CommStats, nbytes, sum_by_kind
from distributed import distributed_test


def test_payload_sizes_and_kind_sums() -> None:
    assert nbytes(torch.zeros(3, 4)) == 48 and nbytes(torch.zeros(5, dtype=torch.int16)) == 10
    assert sum_by_kind([{"b": 1, "a": 2}, {"a": 3}]) == {"a": 5, "b": 1}


def test_a_sparse_tensor_counts_its_indices_and_values_not_its_dense_size() -> None:
    # an embedding's gradient: 2 of 1000 rows of 8, int64 row indices and float32 values
    g = torch.sparse_coo_tensor(torch.tensor([[3, 7]]), torch.ones(2, 8), (1000, 8))
    assert nbytes(g) == 2 * 8 + 2 * 8 * 4


@pytest.mark.slow
@distributed_test(world_size=[1, 2, 3])
def test_collectives_count_their_payload_once_each_way(rank: int, world: int) -> None:
    comm = Comm(CommStats())
    t = torch.full((6,), float(rank + 1))
    comm.all_reduce(t, kind="grads")
    assert torch.equal(t, torch.full((6,), world * (world + 1) / 2))
    src = world - 1
    b = torch.arange(5, dtype=torch.float64) * (rank == src)
    comm.broadcast(b, src=src)
    assert torch.equal(b, torch.arange(5, dtype=torch.float64))
    s = comm.stats
    if world == 1:  # a group of one: nothing leaves the process, nothing is counted
        assert (s.bytes_sent, s.bytes_recv, s.messages, s.sent_by_kind) == (0, 0, 0, {})
        return
    # all-reduce: its 24 bytes sent and received; broadcast: 40 bytes sent by src, received by the rest
    assert (s.bytes_sent, s.bytes_recv) == (24 + 40 * (rank == src), 24 + 40 * (rank != src))
    assert s.sent_by_kind == {"grads": 24} and s.messages == 2 and s.wait_s >= 0


@pytest.mark.slow
@distributed_test(world_size=[2, 3])
def test_point_to_point_counts_the_sender_and_the_receiver(rank: int, world: int) -> None:
    comm = Comm(CommStats())
    right, left = (rank + 1) % world, (rank - 1) % world
    out = torch.full((7,), rank, dtype=torch.int16)  # 14 bytes: its own dtype, not float32
    sending = comm.isend(out, right, kind="ring")
    got = comm.recv(torch.empty(7, dtype=torch.int16), left)
    sending.wait()
    assert torch.equal(got, torch.full((7,), left, dtype=torch.int16))
    comm.count(sent=100, recv=50, kind="library")  # bytes a library moved for this rank
    s = comm.stats
    assert (s.bytes_sent, s.bytes_recv, s.messages) == (114, 64, 3)
    assert s.sent_by_kind == {"library": 100, "ring": 14}
