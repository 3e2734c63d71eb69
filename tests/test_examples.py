"""examples/: the README's API example runs (serial, and 2 gloo ranks under torch's launcher)
and its result equals ``jimu train --strategy admm``'s, at its defaults and with flags; the
hyperspectral example classifies a generated scene and draws its maps."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from deepjimu.config import RunConfig
from deepjimu.launch import train
from processes import env

# every test here starts processes (workers, a CLI run) or trains whole runs
pytestmark = pytest.mark.slow

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "admm_api.py"
HYPERSPECTRAL = EXAMPLE.with_name("hyperspectral.py")
# the workload made small for the test; every other setting is the defaults of both
SMALL = {"model": "mlp:32x2", "epochs": 12}
# given as flags to both: the example passes each on as jimu train does
FLAGS = {"rho": 0.5, "nu": 2.0, "seed": 3, "admm_momentum": 0.5}
# the example's flags for RunConfig's fields
EXAMPLE_FLAG = {"epochs": "--iterations", "admm_momentum": "--momentum"}


def _jimu_train(root: Path, settings: dict) -> dict:
    """``jimu train --strategy admm`` (1 worker: the iterates of 2 equal it, tests/strategies)."""
    cfg = RunConfig(
        strategy="admm",
        workers=1,
        quiet=True,
        runs_dir=str(root),
        name="ref",
        threads=1,  # as the example runs (OMP_NUM_THREADS=1): same rounding
    )
    summary = train(RunConfig(**{**cfg.to_dict(), **settings}))
    assert summary is not None
    last = json.loads((root / "ref" / "events.jsonl").read_text().splitlines()[-1])
    return {
        **summary,
        "objective": last["admm_objective"],
        "residual": last["admm_residual"],
        "readout": last["admm_readout"],
    }


@pytest.mark.parametrize(("workers", "flags"), [(1, {}), (2, FLAGS)], ids=["defaults", "flags"])
def test_example_equals_jimu_train(workers: int, flags: dict, tmp_path: Path) -> None:
    """At jimu train's defaults (1 worker), and with flags for both (2 workers)."""
    settings = {**SMALL, **flags}
    args = ["--workers", str(workers)]
    for name, value in settings.items():
        args += [EXAMPLE_FLAG.get(name, f"--{name}"), str(value)]
    r = subprocess.run(
        [sys.executable, str(EXAMPLE), *args],
        capture_output=True,
        text=True,
        timeout=300,
        env={**env(), "OMP_NUM_THREADS": "1", "TMPDIR": str(tmp_path)},  # torchrun's files
    )
    assert r.returncode == 0, r.stderr[-2000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    ref = _jimu_train(tmp_path / "runs", settings)
    assert ref["dataset"] == "digits"  # jimu train's default, the example's data set
    assert out["iterations"] == settings["epochs"]
    assert out["readout"] == ref["readout"]
    for key in ("objective", "residual", "train_acc", "test_acc"):
        assert out[key] == pytest.approx(ref[key], rel=1e-6), key


def test_hyperspectral_example_draws_the_maps(tmp_path: Path) -> None:
    """On its generated scene (no files): both strategies learn it, and the PNG is written."""
    out = tmp_path / "map.png"
    r = subprocess.run(
        [sys.executable, str(HYPERSPECTRAL), "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
        env={**env(), "TMPDIR": str(tmp_path)},
    )
    assert r.returncode == 0, r.stderr[-2000:]
    assert "a generated scene, not Indian Pines" in r.stdout
    result = json.loads(r.stdout.strip().splitlines()[-1])
    assert result["scene"] == "generated" and result["png"] == str(out)
    # measured 0.971 (admm) and 0.983 (Adam) at seed 0: the scene is easy, not trivial
    assert result["admm_test_acc"] > 0.9 and result["adam_test_acc"] > 0.9
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
