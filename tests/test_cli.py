"""The jimu command: one line and exit code 2 for user errors, summaries for good runs."""

from __future__ import annotations

import json

import pytest

from deepjimu.cli import main


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["train", "--wokers", "2"], "unrecognized arguments: --wokers 2"),
        (["train", "--workers", "two"], "flag: workers must be a whole number (got 'two')"),
        (["train", "--strategy", "nope"], "unknown strategy 'nope'"),
        (["train", "--strategy", "local", "--lr", "-1"], "lr must be a positive number (lr: -1.0)"),
        (["train", "--config", "missing.toml"], "config file missing.toml does not exist"),
        (["train", "--resume", "nowhere"], "--resume nowhere: not a run folder"),
        (["frobnicate"], "invalid choice: 'frobnicate'"),
        (
            ["train", "--strategy", "ddp", "--optimizer", "kfac", "--kfac-grad-workers", "0.1"],
            "kfac-grad-workers must be in [1/workers, 1] = [0.5, 1]",
        ),
        (["train", "--strategy", "ddp", "--compress", "qsgd:9"], "bits must be in 2..8"),
        (["probe", "--workers", "2", "--compress", "topk:0"], "ratio must be in (0, 1]"),
    ],
)
def test_user_errors_print_one_line(
    argv: list[str], expected: str, capsys, tmp_path, monkeypatch
) -> None:
    monkeypatch.chdir(tmp_path)
    code, _, err = _run(argv, capsys)
    assert code == 2
    assert err.count("\n") == 1 and err.startswith("error: "), err
    assert expected in err
    assert "Traceback" not in err
    assert not (tmp_path / "runs").exists()  # before any run folder or worker


def test_missing_data_file_is_one_line_and_leaves_no_run_folder(
    capsys, tmp_path, monkeypatch
) -> None:
    monkeypatch.chdir(tmp_path)
    code, _, err = _run(
        ["train", "--strategy", "local", "--dataset", "mnist", "--data-dir", "nodata"], capsys
    )
    assert code == 2 and err.count("\n") == 1 and "nodata" in err
    assert not (tmp_path / "runs").exists()


def test_train_local_writes_events_and_summary(capsys, tmp_path) -> None:
    argv = [
        "train",
        "--strategy",
        "local",
        "--model",
        "mlp:32x1",
        "--epochs",
        "2",
        "--lr",
        "0.01",
        "--quiet",
    ]
    code, out, err = _run([*argv, "--runs-dir", str(tmp_path), "--name", "r"], capsys)
    assert code == 0, err
    assert "test_acc" in out
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    for key in (
        "test_acc",
        "train_acc",
        "loss",
        "time_s",
        "epochs",
        "strategy",
        "workers",
        "dataset",
        "model",
    ):
        assert key in summary
    assert summary["epochs"] == 2 and summary["strategy"] == "local" and summary["test_acc"] > 0.5
    events = [json.loads(x) for x in (tmp_path / "r" / "events.jsonl").read_text().splitlines()]
    assert [e["epoch"] for e in events] == [1, 2]
    keys = {
        "step",
        "epoch",
        "time_s",
        "loss",
        "train_acc",
        "test_acc",
        "samples_per_s",
        "bytes_sent",
    }
    assert keys | {"bytes_recv", "compute_s", "wait_s"} <= set(events[0])
    # the same name again is refused rather than mixed into the old run
    code, _, err = _run([*argv, "--runs-dir", str(tmp_path), "--name", "r"], capsys)
    assert code == 2 and "already holds a run" in err


def test_default_run_name(capsys, tmp_path) -> None:
    code, _, err = _run(
        [
            "train",
            "--strategy",
            "local",
            "--model",
            "mlp:8x1",
            "--epochs",
            "1",
            "--quiet",
            "--runs-dir",
            str(tmp_path),
        ],
        capsys,
    )
    assert code == 0, err
    (folder,) = list(tmp_path.iterdir())
    assert folder.name.startswith("local-digits-")


@pytest.mark.slow
def test_python_dash_m_entry_point() -> None:
    import subprocess
    import sys

    r = subprocess.run(
        [sys.executable, "-m", "deepjimu", "train", "--help"], capture_output=True, text=True
    )
    assert r.returncode == 0 and "--strategy" in r.stdout and "--checkpoint-every" in r.stdout


def test_entry_leaves_by_deepjimu_leave_with_mains_code(monkeypatch: pytest.MonkeyPatch) -> None:
    """``jimu`` exits through leave (no interpreter shutdown once a group ran: test_leave.py)."""
    import deepjimu.cli as cli

    left: list[int] = []
    monkeypatch.setattr(cli, "main", lambda: 2)
    monkeypatch.setattr(cli, "leave", left.append)
    cli.entry()
    assert left == [2]


def test_the_summary_line_counts_one_epoch_as_one(capsys) -> None:
    from deepjimu.cli import _print_summary

    s = {"strategy": "local", "workers": 1, "dataset": "digits", "model": "mlp:8x1",
         "test_acc": 0.5, "train_acc": 0.5, "epochs": 1, "time_s": 2.0, "fit_s": 1.0,
         "train_s": 0.5, "eval_s": 0.25}  # fmt: skip
    _print_summary(s)
    assert ", 1 epoch in 1.0 s (training 0.5 s, " in capsys.readouterr().out
