"""One pdADMM engine: PdADMM in the user's loop computes what ``jimu train --strategy admm``
computes for what the API gained from it (CNNs, restarted mini-batches, rho growth).

Each test runs the strategy in this process (``train``, one worker) and PdADMM on the same
data set and start, both on one thread (the same rounding), and compares the figures the
run reports with the ones the user's model gives."""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from deepjimu import PdADMM
from deepjimu.config import RunConfig
from deepjimu.data import DataOptions, DataSplits, load_dataset
from deepjimu.launch import train
from deepjimu.models import build_model
from deepjimu.strategies.base import epoch_order, split_steps

pytestmark = pytest.mark.slow  # whole trainings, twice each


@pytest.fixture(autouse=True)
def _one_thread() -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _jimu_train(root: Path, **settings: Any) -> tuple[dict, dict]:
    """The summary and last event of ``jimu train --strategy admm --workers 1`` with ``settings``."""
    cfg = RunConfig(
        strategy="admm", workers=1, quiet=True, runs_dir=str(root), name="ref", threads=1
    )
    summary = train(RunConfig(**{**cfg.to_dict(), **settings}))
    assert summary is not None
    last = json.loads((root / "ref" / "events.jsonl").read_text().splitlines()[-1])
    return summary, last


def _accuracy(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    with torch.no_grad():
        return (model(x).argmax(1) == y).double().mean().item()


def _data_and_model(spec: str) -> tuple[DataSplits, torch.nn.Sequential]:
    data = load_dataset("digits", DataOptions(seed=0))
    return data, build_model(spec, data.feature_shape, data.num_classes, seed=0)


def _same_figures(summary: dict, data: DataSplits, model: torch.nn.Module) -> None:
    assert _accuracy(model, data.train_x, data.train_y) == pytest.approx(
        summary["train_acc"], rel=1e-6
    )
    assert _accuracy(model, data.test_x, data.test_y) == pytest.approx(
        summary["test_acc"], rel=1e-6
    )


def test_a_cnn_steps_as_jimu_train_iterates(tmp_path: Path) -> None:
    """A CNN (unit start, CG p-steps, pooling folded in) at the CNN defaults, readout auto."""
    summary, last = _jimu_train(tmp_path, model="cnn:4-8", epochs=3)
    data, model = _data_and_model("cnn:4-8")
    admm = PdADMM(model)
    admm.init(data.train_x)
    for _ in range(3):
        result = admm.step(data.train_x, data.train_y)
    assert {k: admm.settings[k] for k in ("ridge", "momentum", "sweeps")} == {
        k: summary["admm_settings"][k] for k in ("ridge", "momentum", "sweeps")
    }
    assert result.readout == last["admm_readout"]
    assert result.objective == pytest.approx(last["admm_objective"], rel=1e-6)
    assert result.residual == pytest.approx(last["admm_residual"], rel=1e-6)
    _same_figures(summary, data, model)
    assert summary["test_acc"] > 0.5  # it learns (chance: 0.1)


def test_batch_steps_are_jimu_trains_restarted_mini_batches(tmp_path: Path) -> None:
    """``--admm-batch B --admm-aux restart``: the same batches, in the same order, each
    restarted from the weights and iterated ``inner`` times, statistics kept by ``memory``."""
    batch, epochs = 300, 2
    summary, _ = _jimu_train(
        tmp_path, model="mlp:32x2", epochs=epochs, admm_batch=batch, admm_aux="restart"
    )
    data, model = _data_and_model("mlp:32x2")
    admm = PdADMM(model)
    n = len(data.train_y)
    for epoch in range(epochs):  # the strategy's order: a function of (seed, epoch)
        for idx in split_steps(epoch_order(n, 0, epoch), math.ceil(n / batch)):
            result = admm.batch_step(data.train_x[idx], data.train_y[idx])
    assert result.readout == "iterate" and admm.settings["memory"] == 0.8  # MLP default
    assert result.iteration == epochs * math.ceil(n / batch) * 2 * 3  # inner: 2 per layer
    _same_figures(summary, data, model)


def test_rho_grows_as_jimu_train_grows_it(tmp_path: Path) -> None:
    """``--rho-growth 2``: rho doubles where the residual stalls, at the same iterations."""
    iterations = 24
    settings = {"model": "mlp:16x2", "epochs": iterations, "rho_growth": 2.0, "rho": 0.3}
    summary, last = _jimu_train(tmp_path, eval_every=1, **settings)
    data, model = _data_and_model("mlp:16x2")
    admm = PdADMM(model, rho=0.3, rho_growth=2.0)
    results = [admm.step(data.train_x, data.train_y) for _ in range(iterations)]
    events = [json.loads(e) for e in (tmp_path / "ref" / "events.jsonl").read_text().splitlines()]
    logged = [e["rho"] for e in events if "rho" in e]
    assert [r.rho for r in results] == pytest.approx(logged[-iterations:], rel=1e-12)
    assert results[-1].rho == 1.2  # it grew twice (at iterations 12 and 23)
    assert results[-1].objective == pytest.approx(last["admm_objective"], rel=1e-6)
    _same_figures(summary, data, model)
