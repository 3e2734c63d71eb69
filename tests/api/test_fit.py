"""fit: the user's tensors and model factory through the real engine, equal to ``jimu train``."""

from __future__ import annotations

import functools
import json
from pathlib import Path

import pytest
import torch

from deepjimu import fit
from deepjimu.cli import main
from deepjimu.config import RunConfig
from deepjimu.data import DataOptions
from deepjimu.data.digits import load_digits_raw
from deepjimu.errors import JimuError
from deepjimu.launch import train
from deepjimu.models import build_model


def _digits() -> tuple[torch.Tensor, ...]:
    raw = load_digits_raw(DataOptions())
    return tuple(torch.as_tensor(a) for a in (raw.train_x, raw.train_y, raw.test_x, raw.test_y))


def test_fit_equals_jimu_train_on_the_same_data(tmp_path: Path) -> None:
    """Transparency: digits' own arrays and build_model as the factory reproduce the CLI run."""
    x, y, xt, yt = _digits()
    factory = functools.partial(build_model, "mlp:32x2", tuple(x.shape[1:]), 10, seed=0)
    fitted = fit("local", factory, x, y, test=(xt, yt), workers=1, epochs=2, run_dir=tmp_path / "f")
    ref = train(
        RunConfig(
            strategy="local",
            model="mlp:32x2",
            epochs=2,
            quiet=True,
            runs_dir=str(tmp_path),
            name="r",
        )
    )
    assert ref is not None
    for key in ("loss", "train_acc", "val_acc", "test_acc"):
        assert fitted.summary[key] == ref[key], key
    assert fitted.summary["model"] == "factory:deepjimu.models.spec.build_model"
    assert fitted.run_dir == tmp_path / "f" and (fitted.run_dir / "summary.json").exists()
    with torch.no_grad():  # the returned model holds the trained weights
        acc = (fitted.model(xt).argmax(1) == yt).double().mean().item()
    assert acc == pytest.approx(ref["test_acc"], abs=1e-12)


def test_fit_with_two_ddp_workers_reaches_the_workers_tensors() -> None:
    """The workers are spawned processes: they read the caller's tensors from the run folder."""
    x, y, xt, yt = _digits()
    factory = functools.partial(build_model, "mlp:32x1", tuple(x.shape[1:]), 10)
    fitted = fit("ddp", factory, x, y, test=(xt, yt), workers=2, epochs=3, lr=0.01)
    assert fitted.summary["workers"] == 2 and fitted.run_dir is None
    assert fitted.summary["test_acc"] > 0.85
    with torch.no_grad():
        acc = (fitted.model(xt).argmax(1) == yt).double().mean().item()
    assert acc == pytest.approx(fitted.summary["test_acc"], abs=1e-12)


def test_fit_checks_its_arguments_up_front() -> None:
    x, y = torch.randn(20, 4), torch.randint(0, 2, (20,))
    factory = functools.partial(build_model, "mlp:8x1", (4,), 2)
    with pytest.raises(ValueError, match="picklable"):
        fit("local", lambda: factory(), x, y)
    with pytest.raises(ValueError, match="unknown option 'epoch'"):
        fit("local", factory, x, y, epoch=2)
    with pytest.raises(ValueError, match="dataset is set by fit"):
        fit("local", factory, x, y, dataset="digits")
    with pytest.raises(ValueError, match="must pair up"):
        fit("local", factory, x, y[:5])
    with pytest.raises(JimuError, match="lr must be a positive number"):
        fit("local", factory, x, y, lr=-1.0)


def test_a_fit_run_is_resumed_through_fit_and_refused_by_the_cli(tmp_path: Path, capsys) -> None:
    x, y, xt, yt = _digits()
    factory = functools.partial(build_model, "mlp:16x1", tuple(x.shape[1:]), 10)
    common = {"test": (xt, yt), "workers": 1, "optimizer": "sgd"}
    full = fit("local", factory, x, y, epochs=3, run_dir=tmp_path / "full", **common)
    fit("local", factory, x, y, epochs=1, run_dir=tmp_path / "part", **common)
    saved = json.loads((tmp_path / "part" / "config.json").read_text())
    assert saved["model"] == "factory:deepjimu.models.spec.build_model"  # what built it, truthfully
    capsys.readouterr()
    assert main(["train", "--resume", str(tmp_path / "part"), "--epochs", "3"]) == 2
    assert capsys.readouterr().err.splitlines() == [
        f"error: --resume {tmp_path / 'part'}: its model comes from a Python factory "
        f"(factory:deepjimu.models.spec.build_model); resume it with "
        f"deepjimu.fit(..., resume={str(tmp_path / 'part')!r})"
    ]
    with pytest.raises(ValueError, match="train_y differs from the tensors the run in"):
        fit("local", factory, x, 9 - y, resume=tmp_path / "part", epochs=3, **common)
    with pytest.raises(ValueError, match="give run_dir or resume, not both"):
        fit("local", factory, x, y, run_dir=tmp_path / "x", resume=tmp_path / "part")
    resumed = fit("local", factory, x, y, resume=tmp_path / "part", epochs=3, **common)
    assert resumed.run_dir == tmp_path / "part" and resumed.summary["epochs"] == 3
    for a, b in zip(resumed.model.parameters(), full.model.parameters(), strict=True):
        assert torch.equal(a, b)  # as if never interrupted
