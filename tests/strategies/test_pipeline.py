"""Tests of ``pipeline``: GPipe / 1F1B / interleaved equal ``local`` after a few steps, a real run, bad settings."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_model_parallel import check_transparency, transparency_world

from deepjimu.cli import main
from deepjimu.config import RunConfig
from deepjimu.launch import train
from distributed import run_world


@pytest.mark.slow
def test_two_stages_match_local(tmp_path: Path) -> None:
    cases = [
        {"strategy": "pipeline", "schedule": "gpipe", "microbatches": 4, "balance": "time"},
        {"strategy": "pipeline", "schedule": "1f1b", "microbatches": 4, "balance": "1,3"},
        {
            "strategy": "pipeline",
            "schedule": "interleaved",
            "microbatches": 4,
            "balance": "1,1,1,1",
        },
    ]
    per_rank = run_world(transparency_world, 2, cases, str(tmp_path))
    assert [per_rank[0][i]["rows"] for i in range(3)] == [8, 8, 8]  # 29 rows / 4, padded
    check_transparency(per_rank, 2)


@pytest.mark.slow
def test_three_stages_match_local(tmp_path: Path) -> None:
    cases = [
        {"strategy": "pipeline", "schedule": "gpipe", "microbatches": 4, "balance": "1,1,2"},
        {"strategy": "pipeline", "schedule": "1f1b", "microbatches": 3, "balance": "size"},
        {"strategy": "model-parallel", "balance": "2,1,1"},
    ]
    per_rank = run_world(transparency_world, 3, cases, str(tmp_path))
    assert per_rank[0][1]["rows"] == 10  # 29 rows / 3
    check_transparency(per_rank, 3)


@pytest.mark.slow
@pytest.mark.usefixtures("spawned")
def test_pipeline_run_through_launcher(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    cfg = RunConfig(
        strategy="pipeline",
        workers=2,
        model="mlp:32x3",
        schedule="1f1b",
        microbatches=4,
        balance="size",
        epochs=3,
        lr=0.01,
        runs_dir=str(tmp_path),
        name="pp",
    )
    summary = train(cfg)
    assert summary is not None and summary["workers"] == 2
    assert "pipeline: 2 stages, blocks [1, 3], balance by size" in capfd.readouterr().out
    saved = json.loads((tmp_path / "pp" / "summary.json").read_text())
    assert saved["test_acc"] >= 0.6
    events = [
        json.loads(line) for line in (tmp_path / "pp" / "events.jsonl").read_text().splitlines()
    ]
    assert len(events) == 3
    assert all(e["bytes_sent"] > 0 and min(e["bytes_recv_per_rank"]) > 0 for e in events)
    assert events[-1]["bubble_theory"] == pytest.approx(1 / 5, abs=1e-6)
    assert 0 <= events[-1]["idle_frac"] <= 1


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (
            ["--workers", "4", "--schedule", "1f1b", "--microbatches", "2"],
            "schedule 1f1b needs at least one micro-batch per stage (microbatches: 2, stages: 4)",
        ),
        (["--workers", "1"], "strategy pipeline needs at least 2 workers (workers: 1)"),
        (
            ["--batch-size", "3", "--microbatches", "4"],
            "batch-size must be >= microbatches (batch-size: 3, microbatches: 4)",
        ),
        (
            ["--workers", "5"],
            "strategy pipeline needs at least one block per worker (workers: 5, blocks in mlp:16x3: 4)",
        ),
        (
            ["--workers", "3", "--schedule", "interleaved", "--microbatches", "3"],
            "schedule interleaved needs at least 2 blocks per worker (workers: 3, blocks in mlp:16x3: 4)",
        ),
        (
            ["--schedule", "interleaved", "--microbatches", "5", "--balance", "1,1,1,1"],
            "schedule interleaved needs microbatches to be a multiple of microbatches // workers "
            "(microbatches: 5, workers: 2)",
        ),
        (
            ["--balance", "1,2"],
            "balance must sum to the number of blocks (blocks: 4, sum of balance: 3)",
        ),
        (
            ["--schedule", "interleaved", "--balance", "2,2"],
            "balance must give one block count per stage (stages: 4, entries: 2)",
        ),
        (
            ["--balance", "fastest"],
            "balance must be auto, even, speed, time, size or block counts per stage like 2,2",
        ),
    ],
)
def test_pipeline_refuses_impossible_settings(
    flags: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["train", "--strategy", "pipeline", "--model", "mlp:16x3", *flags]
    assert main(argv) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {message}")
