"""examples/: the README's API example runs (serial, and 2 gloo ranks under torch's launcher)
and its result equals ``jimu train`` with the same settings."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from deepjimu.config import RunConfig
from deepjimu.launch import train
from processes import env

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "admm_api.py"
# momentum 0.7, the MLP default: the reported objective of 2 workers equals 1 worker's too
# (it differed by ~0.2% while the copy of p_right was extrapolated and p was not)
SETTINGS = {
    "model": "mlp:32x2",
    "rho": 0.5,
    "nu": 2.0,
    "epochs": 12,
    "seed": 3,
    "admm_momentum": 0.7,
}


@pytest.fixture(scope="module")
def jimu_train(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """``jimu train --strategy admm`` (1 worker: the iterates of 2 equal it, tests/strategies)."""
    root = tmp_path_factory.mktemp("example")
    cfg = RunConfig(
        strategy="admm",
        workers=1,
        dataset="digits",
        quiet=True,
        runs_dir=str(root),
        name="ref",
        threads=1,  # as the example runs (OMP_NUM_THREADS=1): same rounding
    )
    summary = train(RunConfig(**{**cfg.to_dict(), **SETTINGS}))
    assert summary is not None
    last = json.loads((root / "ref" / "events.jsonl").read_text().splitlines()[-1])
    return {
        **summary,
        "objective": last["admm_objective"],
        "residual": last["admm_residual"],
        "readout": last["admm_readout"],
    }


@pytest.mark.parametrize("workers", [1, 2])
def test_example_equals_jimu_train(jimu_train: dict, workers: int, tmp_path: Path) -> None:
    args = [
        "--workers",
        str(workers),
        "--model",
        SETTINGS["model"],
        "--seed",
        str(SETTINGS["seed"]),
    ]
    args += ["--rho", str(SETTINGS["rho"]), "--nu", str(SETTINGS["nu"])]
    args += ["--iterations", str(SETTINGS["epochs"]), "--momentum", str(SETTINGS["admm_momentum"])]
    r = subprocess.run(
        [sys.executable, str(EXAMPLE), *args],
        capture_output=True,
        text=True,
        timeout=300,
        env={**env(), "OMP_NUM_THREADS": "1", "TMPDIR": str(tmp_path)},  # torchrun's files
    )
    assert r.returncode == 0, r.stderr[-2000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["iterations"] == SETTINGS["epochs"]
    assert out["readout"] == jimu_train["readout"]
    for key in ("objective", "residual", "train_acc", "test_acc"):
        assert out[key] == pytest.approx(jimu_train[key], rel=1e-6), key
