"""--balance auto: the ranks agree on the split, time-shared cores split evenly, a resume keeps
the split of the run it goes on."""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from deepjimu.balance import chosen_balance
from deepjimu.config import RunConfig
from deepjimu.measure import speeds
from deepjimu.measure.speeds import SPEEDS_FILE, balance_speeds, emulation_unmet
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


def test_an_emulation_the_measured_speeds_do_not_show_is_named() -> None:
    assert emulation_unmet([1.0, 0.5], [1.0, 0.45]) is None  # within the tolerance
    assert emulation_unmet([0.5], [0.5, 1.0]) is None  # unnamed workers run at full speed
    line = emulation_unmet([1.0, 0.5], [1.0, 0.96])
    assert line is not None and "asked for 1.00, 0.50 but the workers ran at 1.00, 0.96" in line


def _emulated(rank: int, world: int, tmp: str) -> str:
    cfg = validate(RunConfig(strategy="admm", workers=world, runs_dir=tmp, name="e", quiet=True))
    cfg = dataclasses.replace(cfg, emulate_speeds="1,0.5")  # asked, but the quota never took
    run = Run(cfg, Path(tmp) / "e", rank, world)
    speeds.calibrate = lambda *_: 100.0  # type: ignore[assignment]  # both ran at one speed
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        balance_speeds(build_model("mlp:16x1", (64,), 10), torch.randn(8, 64),
                       torch.randint(0, 10, (8,)), run)  # fmt: skip
    return err.getvalue()


@pytest.mark.slow
def test_a_run_says_when_its_emulated_speeds_did_not_take(tmp_path: Path) -> None:
    said = run_world(_emulated, 2, str(tmp_path))
    assert said[0].startswith("warning: --emulate-speeds asked for 1.00, 0.50") and not said[1]


@pytest.mark.parametrize("sequential", [True, False])
def test_calibration_steps_the_model_itself_and_leaves_it_as_it_was(sequential: bool) -> None:
    model = build_model("mlp:16x2", (64,), 10)
    if not sequential:  # any other module: one whole step
        model = nn.ModuleDict({"m": model})
        model.forward = model["m"].forward  # type: ignore[method-assign]
    before = {k: v.clone() for k, v in model.state_dict().items()}
    x, y = torch.randn(8, 64), torch.randint(0, 10, (8,))
    assert speeds.calibrate(model, x, y, seconds=0.01, windows=1) > 0
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
    assert all(p.grad is None for p in model.parameters())  # no gradient kept
