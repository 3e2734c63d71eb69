"""ddp with ``--sync-plan``: trained end to end through ``jimu train``, the plan saved, bytes as planned, bad combinations refused."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from deepjimu.cli import main


def _events(folder: Path) -> list[dict]:
    return [json.loads(line) for line in (folder / "events.jsonl").read_text().splitlines()]


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


def test_sfb_sends_the_planned_bytes_every_step(tmp_path: Path) -> None:
    argv = ["train", "--strategy", "ddp", "--workers", "2", "--model", "mlp:32x1"]
    # SGD: Adam's normalised step turns float rounding of near-zero gradients into whole
    # steps, so two summation orders part ways; SGD keeps them together
    argv += ["--batch-size", "50", "--optimizer", "sgd", "--lr", "0.05", "--epochs", "2"]
    argv += ["--sync-plan", "sfb"]
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
    # the same gradients as DDP's: the same training, to float rounding (a transparency test)
    i = argv.index("sfb")
    assert main([*argv[:i], "allreduce", *argv[i + 1 : -2], "ddp", "--quiet"]) == 0
    ddp = json.loads((tmp_path / "ddp" / "summary.json").read_text())
    assert ddp["test_acc"] == summary["test_acc"]
    assert ddp["loss"] == pytest.approx(summary["loss"], rel=1e-4)


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
