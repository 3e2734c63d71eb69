"""Exchange between neighbour ranks: grid values arrive bit-exactly, as 8- or 16-bit codes plus a header."""

from __future__ import annotations

import pytest
import torch

from deepjimu.admm_math.quantize import project
from deepjimu.comm import Comm, CommStats
from deepjimu.strategies.admm.driver import Exchange
from distributed import distributed_test

# every test here starts processes (workers, a CLI run) or trains whole runs
pytestmark = pytest.mark.slow

SHAPE = (13, 6)
# bytes on the wire per bits: float32, or the codes plus the (scale, offset) float32 header
WIRE = {0: 13 * 6 * 4, 8: 13 * 6 + 8, 16: 13 * 6 * 2 + 8}


@distributed_test(world_size=[2])
def test_boundary_tensors_round_trip_bit_exactly(rank: int, world: int) -> None:
    g = torch.Generator().manual_seed(0)
    for bits in (16, 8, 0):
        t = torch.randn(SHAPE, generator=g) * 3 + 1
        sent = project(t, bits) if bits else t  # what blocks exchange: p, q already on the grid
        stats = CommStats()
        ex = Exchange(Comm(stats), bits, torch.device("cpu"))
        if rank == 0:
            for pending in ex.isend(sent, 1):
                pending.wait()
            assert (stats.bytes_sent, stats.bytes_recv) == (WIRE[bits], 0), bits
        else:
            got = ex.irecv(SHAPE, 0).wait()
            assert got.dtype == torch.float32 and torch.equal(got, sent), bits
            assert (stats.bytes_sent, stats.bytes_recv) == (0, WIRE[bits]), bits
