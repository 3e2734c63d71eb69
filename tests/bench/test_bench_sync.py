"""``jimu bench --sync-plan allreduce,ps,sfb,auto``: sync plans as one more matrix dimension."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from deepjimu.bench.matrix import plan, split_variants
from deepjimu.bench.results import read_csv
from deepjimu.cli import main
from deepjimu.config import RunConfig


def test_sync_plans_are_a_dimension_of_ddp_only() -> None:
    _, options = split_variants({"sync_plan": "allreduce,ps,sfb,auto"})
    assert [o[0][1] for o in options] == ["allreduce", "ps", "sfb", "auto"]
    cells = plan(RunConfig(), ["local", "ddp"], [1, 2], ["mlp:16x1"], options)
    ddp = [c for c in cells if c.strategy == "ddp" and c.workers == 2]
    assert [c.name for c in ddp] == [
        "ddp-w2-mlp-16x1-sync-planallreduce",
        "ddp-w2-mlp-16x1-sync-planps",
        "ddp-w2-mlp-16x1-sync-plansfb",
        "ddp-w2-mlp-16x1-sync-planauto",
    ]
    assert all(c.skip is None for c in ddp)
    # local takes the default (allreduce: nothing to synchronise), not the others
    local = [c.skip is None for c in cells if c.strategy == "local" and c.workers == 1]
    assert local == [True, False, False, False]


@pytest.mark.slow
def test_a_tiny_bench_runs_sync_plans_side_by_side(tmp_path: Path) -> None:
    argv = ["bench", "--bench-dir", str(tmp_path), "--name", "sync", "--strategies", "ddp"]
    argv += ["--workers", "2", "--models", "mlp:16x1", "--epochs", "1"]
    argv += ["--batch-size", "128", "--sync-plan", "allreduce,auto"]  # two real runs: short
    assert main(argv) == 0
    rows = read_csv(tmp_path / "sync" / "results.csv")
    assert [(r["options"], r["status"]) for r in rows] == [
        (f"sync-plan={p}", "ok") for p in ("allreduce", "auto")
    ]
    for r in rows:
        assert float(r["bytes_per_sample"]) > 0
        saved = Path(r["run_dir"], "sync_plan.json")
        assert saved.exists() == (r["options"] != "sync-plan=allreduce")
        if saved.exists():
            assert json.loads(saved.read_text())["plan"] == r["options"].split("=")[1]
