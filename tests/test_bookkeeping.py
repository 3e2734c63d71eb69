"""Bookkeeping collectives: every rank's object on every rank, one rank's object everywhere."""

from __future__ import annotations

import pytest

from deepjimu.bookkeeping import Bookkeeping
from distributed import distributed_test

# every test here starts processes (workers, a CLI run) or trains whole runs
pytestmark = pytest.mark.slow


@distributed_test(world_size=[1, 2, 3])
def test_objects_reach_every_rank_in_rank_order(rank: int, world: int) -> None:
    book = Bookkeeping(world)
    assert book.gather_objects({"rank": rank}) == [{"rank": r} for r in range(world)]
    assert book.broadcast_object(f"from {rank}", src=world - 1) == f"from {world - 1}"
    book.barrier()
