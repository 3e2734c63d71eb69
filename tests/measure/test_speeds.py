"""--balance auto: the ranks agree on the split, time-shared cores split evenly, a resume keeps
the split of the run it goes on."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from deepjimu.balance import chosen_balance
from deepjimu.config import RunConfig
from deepjimu.measure.speeds import SPEEDS_FILE, balance_speeds
from deepjimu.models import build_model
from deepjimu.run import Run
from deepjimu.validation import validate
from distributed import run_world


def _decide(rank: int, world: int, tmp: str) -> list[Any]:
    cfg = validate(RunConfig(strategy="admm", workers=world, runs_dir=tmp, name="s", quiet=True))
    run = Run(cfg, Path(tmp) / "s", rank, world)
    model = build_model("mlp:16x1", (64,), 10)
    x, y = torch.randn(8, 64), torch.randint(0, 10, (8,))
    # only rank 1's node is time-shared: every rank must still split alike, evenly
    balance_speeds(model, x, y, run, None, time_shared=rank == 1)
    first = (run.balance, run.speeds)
    run.barrier()
    # a resume reads the split it goes on, whatever it would measure now
    balance_speeds(model, x, y, run, Path(tmp) / "s", time_shared=False)
    return [first, (run.balance, run.speeds)]


@pytest.mark.slow
def test_time_shared_cores_split_evenly_on_every_rank_and_a_resume_keeps_it(tmp_path: Path) -> None:
    results = run_world(_decide, 2, str(tmp_path))
    assert results == [[("even", None), ("even", None)]] * 2
    assert json.loads((tmp_path / "s" / SPEEDS_FILE).read_text()) == {"speeds": None}


def test_auto_follows_speeds_that_differ_by_more_than_a_tenth() -> None:
    assert chosen_balance("auto", [1.0, 0.89]) == "speed"
    assert chosen_balance("auto", [1.0, 0.95]) == "even"
    assert chosen_balance("auto", None) == "even"
    assert chosen_balance("speed", [1.0, 1.0]) == "speed"
    assert chosen_balance("time", [1.0, 0.2]) == "time"
