"""Exchange between neighbour ranks: what arrives equals what the sender holds, bit for bit, in
the bytes of ``wire.wire_bytes`` (8 or 16-bit codes plus a header; at 2 and 4 bits a change's
packed codes plus a header per row)."""

from __future__ import annotations

import math

import pytest
import torch

from deepjimu.admm_math.quantize import change, project
from deepjimu.admm_math.wire import per_row, wire_bytes
from deepjimu.comm import Comm, CommStats
from deepjimu.strategies.admm.driver import Exchange
from distributed import distributed_test

# every test here starts processes (workers, a CLI run) or trains whole runs
pytestmark = pytest.mark.slow

# an odd row length (6 values: 3 bytes at 4 bits, 1.5 at 2) and a conv layer's feature maps
SHAPES = [(13, 6), (5, 3, 3, 3)]


@distributed_test(world_size=[2])
def test_boundary_tensors_round_trip_bit_exactly(rank: int, world: int) -> None:
    g = torch.Generator().manual_seed(0)
    for shape in SHAPES:
        for bits in (16, 8, 4, 2, 0):
            t = torch.randn(shape, generator=g) * 3 + 1
            ref = torch.randn(shape, generator=g)  # what both sides hold before a change
            stats = CommStats()
            ex = Exchange(Comm(stats), bits, torch.device("cpu"))
            wire = wire_bytes(shape[0], math.prod(shape[1:]), bits)
            if per_row(bits):  # a change crosses, and makes t from ref on both sides
                step = change(ref, t, bits)
                sent, message = step.apply(ref), step
            else:  # what blocks exchange: p, q already on the grid
                sent = message = project(t, bits) if bits else t
            if rank == 0:
                for pending in ex.isend(message, 1):
                    pending.wait()
                assert (stats.bytes_sent, stats.bytes_recv) == (wire, 0), bits
            else:
                got = ex.irecv(shape, 0, ref.clone()).wait()
                assert got.dtype == torch.float32 and torch.equal(got, sent), bits
                assert (stats.bytes_sent, stats.bytes_recv) == (0, wire), bits


def test_a_value_or_a_missing_reference_is_refused_at_2_and_4_bits() -> None:
    ex = Exchange(Comm(CommStats()), 4, torch.device("cpu"))
    with pytest.raises(TypeError, match="at 4 bits a change crosses, not a value"):
        ex.isend(torch.ones(2, 3), 1)
    with pytest.raises(TypeError, match="at 4 bits a change arrives"):
        ex.irecv((2, 3), 0)
