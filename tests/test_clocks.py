"""One clock: events, summary.json, the progress line and ``jimu report`` read the same four clocks."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from deepjimu.cli import _print_summary
from deepjimu.clocks import CLOCKS
from deepjimu.config import RunConfig
from deepjimu.launch import train
from deepjimu.record.read import read_events, train_time_to
from deepjimu.report import table

# every test here starts processes (workers, a CLI run) or trains whole runs
pytestmark = pytest.mark.slow

RUNS = [
    ("local", 1, {}),
    ("ddp", 2, {}),
    ("model-parallel", 2, {}),
    ("pipeline", 2, {"microbatches": 2}),
    ("admm", 2, {}),
    ("admm", 1, {"admm_batch": 400, "admm_aux": "restart"}),  # restarts: readout, inner iterations
]


@pytest.mark.parametrize(("strategy", "workers", "extra"), RUNS)
def test_every_strategy_keeps_one_clock(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    strategy: str,
    workers: int,
    extra: dict[str, Any],
) -> None:
    cfg = RunConfig(strategy=strategy, workers=workers, model="mlp:32x2", epochs=3, quiet=True,
                    runs_dir=str(tmp_path), name="c", **extra)  # fmt: skip
    summary = train(cfg)
    assert summary is not None
    events = read_events(tmp_path / "c")
    assert json.loads((tmp_path / "c" / "summary.json").read_text()) == summary
    # the summary's clocks and samples are the last event's
    assert [summary[k] for k in (*CLOCKS, "samples")] == [
        events[-1][k] for k in (*CLOCKS, "samples")
    ]
    previous = dict.fromkeys(CLOCKS, 0.0)
    for e in events:
        assert e["train_s"] + e["eval_s"] <= e["fit_s"] <= e["time_s"], e
        assert all(e[k] >= previous[k] for k in CLOCKS), "a clock went back"
        previous = {k: e[k] for k in CLOCKS}
    assert summary["samples_per_s"] == pytest.approx(
        summary["samples"] / summary["train_s"], rel=1e-3
    )
    # jimu report: its time column is the events' time_s, its time to target their train_s
    last_row = table(events).splitlines()[-1].split()
    assert float(last_row[1]) == pytest.approx(events[-1]["time_s"], abs=0.006)
    assert float(last_row[2]) == pytest.approx(events[-1]["train_s"], abs=0.006)
    reached = train_time_to(events, 0.0)
    assert reached == (events[0]["train_s"], events[0]["time_s"])
    # the progress line says the same
    _print_summary(summary)
    line = capsys.readouterr().out
    assert f"in {summary['fit_s']:.1f} s (training {summary['train_s']:.1f} s" in line
