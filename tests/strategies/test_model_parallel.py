"""Tests of ``model-parallel``: same parameters as ``local`` after a few steps, a real run, bad settings."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
import torch

from deepjimu.cli import main
from deepjimu.config import RunConfig
from deepjimu.data import DataOptions, DataSplits, load_dataset
from deepjimu.launch import train
from deepjimu.measure.measurer import ThisMachine
from deepjimu.models import build_model
from deepjimu.record.folder import latest_checkpoint
from deepjimu.run import Run
from deepjimu.strategies import get_strategy
from deepjimu.strategies.base import count_correct
from deepjimu.strategies.local import LocalStrategy
from deepjimu.validation import validate
from distributed import run_world
from processes import params

# 171 training rows in batches of 29 and 28 (so pipelines pad micro-batches), 4 blocks of width 16
SMALL = {
    "dataset": "synthetic",
    "synthetic_n": 190,
    "synthetic_features": 12,
    "synthetic_classes": 5,
    "model": "mlp:16x3",
    "batch_size": 32,
    "epochs": 1,
    "quiet": True,
}
WIDTH_BYTES = 16 * 8  # one activation row between blocks, float64


def _double(data: DataSplits) -> DataSplits:
    return dataclasses.replace(
        data,
        **{f"{s}_x": getattr(data, f"{s}_x").double() for s in ("train", "val", "test")},
    )


def transparency_world(
    rank: int, world: int, cases: list[dict[str, Any]], out_dir: str
) -> list[dict[str, Any]]:
    """On every rank: for each case, one epoch of the strategy and of ``local``, in float64.

    Returns, per case, this rank's view: largest parameter and loss differences to local
    (where this rank knows them), bytes counted, the stage plan and the evaluation metrics.
    """
    results = []
    for case in cases:
        cfg = validate(RunConfig(**{**SMALL, **case, "workers": world}))
        data = _double(load_dataset(cfg.dataset, DataOptions.from_config(cfg)))
        local_cfg = dataclasses.replace(cfg, strategy="local", workers=1)
        ref = build_model(cfg.model, data.feature_shape, data.num_classes, seed=cfg.seed).double()
        local = LocalStrategy(local_cfg)
        local_run = Run(local_cfg, Path(out_dir), measurer=ThisMachine())
        local.setup(ref, data, local_run)
        batches = local.batches(data, 0, local_run)
        ref_losses = [float(local.train_step(x, y)) for x, y in batches]

        model = build_model(cfg.model, data.feature_shape, data.num_classes, seed=cfg.seed).double()
        run = Run(cfg, Path(out_dir), rank, world, measurer=ThisMachine())
        strategy: Any = get_strategy(cfg.strategy)(cfg)
        strategy.setup(model, data, run)
        losses = [strategy.train_step(x, y) for x, y in strategy.batches(data, 0, run)]
        metrics = strategy.evaluate(data, run)
        full = strategy.full_model(run)
        out: dict[str, Any] = {
            "case": case,
            "steps": len(batches),
            "bytes_sent": run.stats.bytes_sent,
            "bytes_recv": run.stats.bytes_recv,
            "sizes": strategy.plan.sizes,
            "rows": getattr(strategy, "rows", None),
            "metrics": metrics,
            "local_test_acc": count_correct(ref, data.test_x, data.test_y)[0] / len(data.test_y),
        }
        if losses[0] is not None:
            out["loss_diff"] = max(
                abs(float(a) - b) for a, b in zip(losses, ref_losses, strict=True)
            )
        if full is not None:  # every rank: its own blocks, the others freed (meta)
            ref_state = ref.state_dict()
            held = {k: v for k, v in full.state_dict().items() if not v.is_meta}
            out["held"], out["all_keys"] = sorted(held), sorted(ref_state)
            out["param_diff"] = max(float((v - ref_state[k]).abs().max()) for k, v in held.items())
            out["moved"] = max(
                float((v - w).abs().max())
                for v, w in zip(
                    ref_state.values(),
                    build_model(cfg.model, data.feature_shape, data.num_classes)
                    .state_dict()
                    .values(),
                    strict=True,
                )
            )
        results.append(out)
    return results


def expected_bytes(rank: int, sizes: tuple[int, ...], world: int, rows: int) -> int:
    """Bytes each rank sends (and receives): activations forward and gradients back per stage."""
    n = len(sizes)
    messages = sum((s < n - 1) + (s > 0) for s in range(rank, n, world))
    return messages * rows * WIDTH_BYTES


def check_transparency(per_rank: list[list[dict[str, Any]]], world: int) -> None:
    """Assert what :func:`transparency_world` returned: local's parameters, losses and bytes."""
    for i, case_rank0 in enumerate(per_rank[0]):
        views = [per_rank[r][i] for r in range(world)]
        case = case_rank0["case"]
        assert case_rank0["moved"] > 1e-3, case  # training changed the weights at all
        assert all(v["param_diff"] < 1e-10 for v in views), case
        # each rank holds its own blocks only, and together they hold the model once
        held = [k for v in views for k in v["held"]]
        assert sorted(held) == case_rank0["all_keys"], case
        loss_diffs = [v["loss_diff"] for v in views if "loss_diff" in v]
        assert len(loss_diffs) == 1 and loss_diffs[0] < 1e-10, case
        metrics = {k: v for view in views for k, v in view["metrics"].items()}
        assert metrics["test_acc"] == case_rank0["local_test_acc"], case
        assert 0 <= metrics["idle_frac"] <= 1 and len(metrics["idle_frac_per_rank"]) == world
        m = 1 if case["strategy"] == "model-parallel" else case["microbatches"]
        v = 2 if case.get("schedule") == "interleaved" else 1
        assert metrics["bubble_theory"] == pytest.approx((world - 1) / (v * m + world - 1))
        for r, view in enumerate(views):
            rows = 171 if view["rows"] is None else view["steps"] * m * view["rows"]
            want = expected_bytes(r, view["sizes"], world, rows)
            assert view["bytes_sent"] == view["bytes_recv"] == want, (case, r)


@pytest.mark.slow
def test_model_parallel_matches_local(tmp_path: Path) -> None:
    cases = [
        {"strategy": "model-parallel", "balance": "time"},
        {"strategy": "model-parallel", "balance": "3,1"},
    ]
    per_rank = run_world(transparency_world, 2, cases, str(tmp_path))
    assert per_rank[0][1]["sizes"] == (3, 1)
    check_transparency(per_rank, 2)


@pytest.mark.slow
def test_model_parallel_run_through_launcher(tmp_path: Path) -> None:
    cfg = RunConfig(
        strategy="model-parallel",
        workers=2,
        model="mlp:32x2",
        epochs=3,
        lr=0.01,
        quiet=True,
        runs_dir=str(tmp_path),
        name="mp",
    )
    summary = train(cfg)
    assert summary is not None and summary["workers"] == 2
    saved = json.loads((tmp_path / "mp" / "summary.json").read_text())
    assert saved["test_acc"] >= 0.6
    events = [
        json.loads(line) for line in (tmp_path / "mp" / "events.jsonl").read_text().splitlines()
    ]
    assert len(events) == 3
    assert all(e["bytes_sent"] > 0 and e["bytes_sent_per_rank"][0] > 0 for e in events)
    assert events[-1]["bubble_theory"] == 0.5 and events[-1]["test_acc"] == saved["test_acc"]


def test_model_parallel_refuses_bad_balance(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["train", "--strategy", "model-parallel", "--model", "mlp:16x3", "--balance", "2,1"]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err == "error: balance must sum to the number of blocks (blocks: 4, sum of balance: 3)"
    assert not torch.distributed.is_initialized()


@pytest.mark.slow
def test_each_rank_checkpoints_its_own_blocks_and_a_resume_is_exact(tmp_path: Path) -> None:
    common: dict[str, Any] = dict(
        strategy="model-parallel", workers=2, model="mlp:32x3", lr=0.01, balance="3,1",
        quiet=True, runs_dir=str(tmp_path), checkpoint_every=1,
    )  # fmt: skip
    train(RunConfig(epochs=4, name="full", **common))
    train(RunConfig(epochs=2, name="part", **common))
    train(RunConfig(epochs=4, resume=str(tmp_path / "part"), **common))
    found = latest_checkpoint(tmp_path / "full")
    assert found is not None
    # rank 0 wrote blocks 0-2, rank 1 block 3: no rank gathered the whole model
    own = {p.name: sorted(torch.load(p, weights_only=True)) for p in found[0].glob("model*.pt")}
    assert own == {
        "model.pt": [f"{b}.{w}" for b in ("0.1", "1.0", "2.0") for w in ("bias", "weight")],
        "model-rank1.pt": ["3.0.bias", "3.0.weight"],
    }
    full, resumed = params(tmp_path / "full"), params(tmp_path / "part")
    assert full.keys() == resumed.keys() and len(full) == 8
    for k in full:
        assert torch.equal(full[k], resumed[k]), k
    # each rank built its own blocks alone, as the whole model would have: local's weights
    local = {**common, "strategy": "local", "workers": 1, "balance": "auto"}
    train(RunConfig(epochs=4, name="local", **local))
    for k, v in params(tmp_path / "local").items():
        assert torch.allclose(full[k], v, rtol=0, atol=1e-6), k
