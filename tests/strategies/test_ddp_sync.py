"""ddp with ``--sync-plan``: trained end to end through ``jimu train``, the plan saved, bytes as planned, bad combinations refused."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from deepjimu.cli import main
from deepjimu.config import RunConfig
from deepjimu.data import DataOptions, load_dataset
from deepjimu.measure.measurer import ThisMachine
from deepjimu.models import build_model
from deepjimu.run import Run
from deepjimu.strategies.ddp import DDPStrategy
from deepjimu.validation import validate
from distributed import distributed_test


def _events(folder: Path) -> list[dict]:
    return [json.loads(line) for line in (folder / "events.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_auto_trains_an_embedding_bag_on_bow_and_writes_its_plan(tmp_path: Path) -> None:
    argv = ["train", "--strategy", "ddp", "--workers", "2", "--dataset", "bow"]
    argv += ["--model", "embed:300:12", "--synthetic-features", "300", "--synthetic-n", "600"]
    argv += ["--optimizer", "sgd", "--lr", "0.5", "--epochs", "4", "--sync-plan", "auto"]
    argv += ["--runs-dir", str(tmp_path), "--name", "auto", "--quiet"]
    assert main(argv) == 0
    run = tmp_path / "auto"
    plan = json.loads((run / "sync_plan.json").read_text())
    assert plan["plan"] == "auto" and plan["world"] == 2
    names = [t["name"] for t in plan["tensors"]]
    assert names == ["0.weight", "1.weight", "1.bias"]
    assert set(plan["tensors"][0]["options"]) == {"allreduce", "ps", "sparse"}
    assert set(plan["tensors"][1]["options"]) == {"allreduce", "ps", "sfb"}
    summary = json.loads((run / "summary.json").read_text())
    assert summary["test_acc"] > 0.3  # 10 classes: it learns


@pytest.mark.slow
def test_sfb_sends_the_planned_bytes_every_step(tmp_path: Path) -> None:
    argv = ["train", "--strategy", "ddp", "--workers", "2", "--model", "mlp:32x1"]
    argv += ["--batch-size", "50", "--optimizer", "sgd", "--lr", "0.05", "--epochs", "2"]
    # an even split: --balance auto would split by speeds measured on a loaded machine
    argv += ["--sync-plan", "sfb", "--balance", "even"]
    argv += ["--runs-dir", str(tmp_path), "--name", "sfb", "--quiet"]
    assert main(argv) == 0
    run = tmp_path / "sfb"
    plan = json.loads((run / "sync_plan.json").read_text())
    assert [t["method"] for t in plan["tensors"]] == ["sfb", "allreduce", "sfb", "allreduce"]
    summary = json.loads((run / "summary.json").read_text())
    steps = 2 * math.ceil(summary["samples"] / 2 / 50)
    sent = sum(e["bytes_sent"] for e in _events(run))
    assert sent == 2 * steps * plan["bytes"]  # two ranks, every step as planned
    assert summary["test_acc"] > 0.8


@pytest.mark.slow
def test_a_resumed_run_keeps_its_plan_and_the_summary_names_it(tmp_path: Path) -> None:
    argv = ["train", "--strategy", "ddp", "--workers", "2", "--model", "mlp:32x1"]
    argv += ["--batch-size", "50", "--optimizer", "sgd", "--lr", "0.05", "--balance", "even"]
    argv += ["--sync-plan", "auto", "--checkpoint-every", "1", "--runs-dir", str(tmp_path)]
    argv += ["--name", "r", "--quiet"]
    assert main([*argv, "--epochs", "1"]) == 0
    run = tmp_path / "r"
    plan = json.loads((run / "sync_plan.json").read_text())
    first = json.loads((run / "summary.json").read_text())["sync_plan"]
    assert first == {"plan": "auto", "tensors": {t["name"]: t["method"] for t in plan["tensors"]}}
    # a plan the planner would not pick on its own: all parameter-server
    for t in plan["tensors"]:
        t["method"] = "ps"
    (run / "sync_plan.json").write_text(json.dumps(plan))
    assert main(["train", "--resume", str(run), "--epochs", "2"]) == 0
    kept = json.loads((run / "summary.json").read_text())["sync_plan"]["tensors"]
    assert kept == dict.fromkeys(first["tensors"], "ps")


@pytest.mark.slow
@distributed_test(world_size=[2, 3], preload=["torch._dynamo"])
def test_every_plan_trains_exactly_as_ddp_does(rank: int, world: int, tmp: str) -> None:
    """A transparency test: the same gradients each step, so the same weights at the end
    (SGD: Adam's normalised step would turn float rounding of near-zero gradients into
    whole steps, and two summation orders would part ways)."""
    weights = {}
    for plan in ("allreduce", "ps", "sfb", "auto"):
        cfg = validate(
            RunConfig(
                strategy="ddp", workers=world, model="mlp:32x1", batch_size=50, optimizer="sgd",
                lr=0.05, epochs=2, sync_plan=plan, quiet=True, runs_dir=tmp, name=plan,
            )
        )  # fmt: skip
        run = Run(cfg, Path(tmp) / plan, rank, world, measurer=ThisMachine())
        data = load_dataset(cfg.dataset, DataOptions.from_config(cfg)).shard(rank, world)
        model = build_model(cfg.model, data.feature_shape, data.num_classes, seed=cfg.seed)
        DDPStrategy(cfg).fit(model, data, run)
        weights[plan] = [p.detach().clone() for p in model.parameters()]
    for plan, ws in weights.items():
        for got, want in zip(ws, weights["allreduce"], strict=True):
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5, msg=plan)


@pytest.mark.parametrize(
    "flags, expected",
    [
        (
            ["--sync-plan", "ps", "--compress", "fp16"],
            "error: sync-plan ps synchronises each tensor its own way and does not combine with "
            "--compress, --local-sgd or --optimizer kfac",
        ),
        (
            ["--sync-plan", "sparse"],
            "error: sync-plan sparse sends the touched rows of sparse embedding gradients; "
            "model mlp:256x3 has none",
        ),
        (
            ["--sync-plan", "gossip"],
            "error: sync-plan must be one of allreduce, ps, sfb, sparse, auto",
        ),
    ],
)
def test_bad_combinations_end_in_one_line(flags, expected, capsys, tmp_path: Path) -> None:
    code = main(["train", "--strategy", "ddp", *flags, "--runs-dir", str(tmp_path)])
    err = capsys.readouterr().err.strip()
    assert code == 2 and err.startswith(expected) and len(err.splitlines()) == 1, err
    assert not any(tmp_path.iterdir())


def test_sync_plan_applies_to_ddp_only(capsys, tmp_path: Path) -> None:
    code = main(
        ["train", "--strategy", "local", "--sync-plan", "auto", "--runs-dir", str(tmp_path)]
    )
    err = capsys.readouterr().err.strip()
    assert (
        code == 2 and err == "error: --sync-plan applies to strategy ddp; strategy local is not one"
    )
