"""ddp with ``--sync-plan``: trained end to end through ``jimu train``, the plan saved, bytes as planned, bad combinations refused."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from torch.nn.parallel import DistributedDataParallel

from deepjimu.cli import main
from deepjimu.config import RunConfig
from deepjimu.cost.sync import SyncTrial
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
def test_a_resumed_run_keeps_its_plan_or_ddp_and_the_summary_names_it(tmp_path: Path) -> None:
    argv = ["train", "--strategy", "ddp", "--workers", "2", "--model", "mlp:32x1"]
    argv += ["--batch-size", "50", "--optimizer", "sgd", "--lr", "0.05", "--balance", "even"]
    argv += ["--sync-plan", "auto", "--checkpoint-every", "1", "--runs-dir", str(tmp_path)]
    argv += ["--name", "r", "--quiet"]
    assert main([*argv, "--epochs", "1"]) == 0
    run = tmp_path / "r"
    plan = json.loads((run / "sync_plan.json").read_text())
    first = json.loads((run / "summary.json").read_text())["sync_plan"]
    assert plan["trial"]["kept"] in ("plan", "DDP")  # as this machine's load had it
    if plan["trial"]["kept"] == "plan":
        assert first == {
            "plan": "auto",
            "tensors": {t["name"]: t["method"] for t in plan["tensors"]},
        }
    else:
        assert first == {"plan": "auto", "kept": "DDP"}
    # a plan the planner would not pick on its own (all parameter-server), kept by its trial
    for t in plan["tensors"]:
        t["method"] = "ps"
    plan["trial"]["kept"] = "plan"
    (run / "sync_plan.json").write_text(json.dumps(plan))
    assert main(["train", "--resume", str(run), "--epochs", "2"]) == 0
    kept = json.loads((run / "summary.json").read_text())["sync_plan"]["tensors"]
    assert kept == dict.fromkeys(plan_names(plan), "ps")
    # the same run, had DDP won its trial: the resumed run keeps DDP
    plan["trial"]["kept"] = "DDP"
    (run / "sync_plan.json").write_text(json.dumps(plan))
    assert main(["train", "--resume", str(run), "--epochs", "3"]) == 0
    summary = json.loads((run / "summary.json").read_text())
    assert summary["sync_plan"] == {"plan": "auto", "kept": "DDP"}


def plan_names(plan: dict) -> list[str]:
    return [t["name"] for t in plan["tensors"]]


class _Decided(ThisMachine):
    """This machine, but its sync trial's verdict decided: the trial is stepped for real, and
    its figures replaced by nine rounds of a plan at ``ratio`` of DDP's step."""

    def __init__(self, ratio: float) -> None:
        self.ratio = ratio

    def sync_trial(self, model, ddp, executor, batches, run) -> SyncTrial:  # type: ignore[no-untyped-def]
        steps = super().sync_trial(model, ddp, executor, batches, run)
        assert len(steps.ddp_s) >= 7  # it ran
        return SyncTrial((self.ratio,) * 9, (1.0,) * 9)


@pytest.mark.slow
@distributed_test(world_size=[2], preload=["torch._dynamo"])
def test_auto_keeps_ddp_unless_its_plan_wins_and_the_trial_leaves_no_trace(
    rank: int, world: int, tmp: str
) -> None:
    """Whichever the trial keeps, the run trains as DDP does and counts only its own
    messages: the trial's steps change no weight and send nothing the run counts."""
    out = {}
    for name, plan, measurer in [
        ("ddp", "allreduce", ThisMachine()),
        ("won", "auto", _Decided(0.5)),
        ("lost", "auto", _Decided(0.99)),
    ]:
        cfg = validate(
            RunConfig(
                strategy="ddp", workers=world, model="mlp:32x1", batch_size=50, optimizer="sgd",
                lr=0.05, epochs=2, sync_plan=plan, quiet=True, runs_dir=tmp, name=name,
                balance="even",
            )
        )  # fmt: skip
        run = Run(cfg, Path(tmp) / name, rank, world, measurer=measurer)
        data = load_dataset(cfg.dataset, DataOptions.from_config(cfg)).shard(rank, world)
        model = build_model(cfg.model, data.feature_shape, data.num_classes, seed=cfg.seed)
        strategy = DDPStrategy(cfg)
        result = strategy.fit(model, data, run)
        out[name] = (strategy, result, run.stats.bytes_sent, list(model.parameters()))
    won, lost = out["won"][0], out["lost"][0]
    assert won.sync is not None and not won.kept_ddp  # the plan, by its executor
    assert lost.sync is None and lost.kept_ddp and isinstance(lost.ddp, DistributedDataParallel)
    assert out["lost"][1].extra["sync_plan"] == {"plan": "auto", "kept": "DDP"}
    assert out["lost"][2] == out["ddp"][2]  # DDP's bytes alone: the trial's were not counted
    for name in ("won", "lost"):
        for got, want in zip(out[name][3], out["ddp"][3], strict=True):
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5, msg=name)
    if rank == 0:
        saved = json.loads((Path(tmp) / "lost" / "sync_plan.json").read_text())["trial"]
        assert saved["kept"] == "DDP" and saved["ratio"] == 0.99


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
