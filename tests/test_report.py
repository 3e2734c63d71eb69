"""Tests of ``jimu report``: table, summary, plots, and one-line errors for bad run folders."""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from deepjimu import atomic
from deepjimu.cli import main
from deepjimu.errors import JimuError
from deepjimu.record.read import best_validation, read_events
from deepjimu.report import report, run_title, table
from deepjimu.units import format_bytes
from processes import env


def _event(epoch: int, acc: float) -> dict[str, object]:
    return {
        "step": 10 * epoch,
        "epoch": epoch,
        "time_s": 1.5 * epoch,
        "loss": 2.0 / epoch,
        "train_acc": acc,
        "val_acc": acc - 0.02,
        "test_acc": acc - 0.01,
        "samples_per_s": 1000.0,
        "train_s": 1.0 * epoch,
        "bytes_sent": 3 * 2**20,
        "bytes_recv": 3 * 2**20,
        "compute_s": 0.8,
        "wait_s": 0.2,
        "peak_mem_mb_per_rank": [100.0, 120.0],
    }


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    """A finished 2-worker ddp run folder, written by hand."""
    d = tmp_path / "ddp-run"
    d.mkdir()
    events = [_event(1, 0.5), _event(2, 0.8), _event(3, 0.95)]
    (d / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    summary = {"strategy": "ddp", "workers": 2, "dataset": "digits", "model": "mlp:16x1"}
    (d / "summary.json").write_text(json.dumps({**summary, "test_acc": 0.94, "bytes_sent": 9}))
    return d


def test_report_prints_table_and_summary_and_writes_plots(
    run_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    report(run_dir)
    out = capsys.readouterr().out
    assert "ddp x2 on digits (mlp:16x1)" in out
    assert "epoch" in out and "samples/s" in out and "3.0 MB" in out
    assert "test_acc: 0.9400" in out
    for name in ("loss.png", "accuracy.png"):
        assert (run_dir / name).stat().st_size > 10_000
        assert (run_dir / name).read_bytes()[:4] == b"\x89PNG"


def test_report_without_plots_and_summary(
    run_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (run_dir / "summary.json").unlink()
    (run_dir / "config.json").write_text(json.dumps({"strategy": "ddp", "dataset": "digits"}))
    report(run_dir, plots=False)
    out = capsys.readouterr().out
    assert "not finished" in out
    assert "ddp x2 on digits" in out  # workers from the per-rank lists
    assert not (run_dir / "loss.png").exists()


def test_the_time_to_a_target_accuracy_or_validation_loss_is_printed(
    run_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    events = [_event(1, 0.5) | {"val_loss": 2.4}, _event(2, 0.8) | {"val_loss": 1.95},
              _event(3, 0.95) | {"val_loss": 1.85}]  # fmt: skip
    (run_dir / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    report(run_dir, plots=False, target_acc=0.75)
    assert "time to 75% test accuracy: 2.00 s of training" in capsys.readouterr().out
    report(run_dir, plots=False, target_loss=1.9)
    assert "time to validation loss 1.90: 3.00 s of training" in capsys.readouterr().out
    report(run_dir, plots=False, target_loss=1.5)
    assert "time to validation loss 1.50: not reached" in capsys.readouterr().out


def test_table_shows_missing_values_as_dash() -> None:
    text = table([{"epoch": 1, "loss": None, "test_acc": "nan"}])
    assert text.splitlines()[1].split()[:4] == ["1", "-", "-", "-"]
    assert "nan" in text


def test_missing_folder_and_missing_events(tmp_path: Path) -> None:
    with pytest.raises(JimuError, match="does not exist"):
        read_events(tmp_path / "nope")
    with pytest.raises(JimuError, match=r"events\.jsonl does not exist"):
        read_events(tmp_path)


def test_corrupt_line_names_file_and_line(run_dir: Path) -> None:
    with open(run_dir / "events.jsonl", "a") as f:
        f.write('{"epoch": 4, "loss"\n')
    with pytest.raises(JimuError, match=r"events\.jsonl line 4 is not valid JSON") as err:
        read_events(run_dir)
    assert "\n" not in str(err.value)


def test_a_torn_last_line_is_left_out_and_reported(
    run_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # a crash while appending leaves a last line without its newline
    with open(run_dir / "events.jsonl", "a") as f:
        f.write('{"step": 40, "epoch": 4, "lo')
    assert main(["report", str(run_dir), "--no-plots"]) == 0
    out, err = capsys.readouterr()
    assert "ddp x2 on digits" in out and len(_table_rows(out)) == 3
    assert (
        err
        == f"warning: {run_dir / 'events.jsonl'} line 4 was cut short while being written; left out\n"
    )
    # a resume shows under the table
    resumed = {**_event(4, 0.96), "resumed": {"step": 20, "epoch": 2, "by": "restart 1",
                                              "events_dropped": 1}}  # fmt: skip
    (run_dir / "events.jsonl").write_text(json.dumps(resumed) + "\n")
    report(run_dir, plots=False)
    out = capsys.readouterr().out
    assert "epoch 4: went on from the checkpoint at epoch 2 (by restart 1; 1 later" in out
    # a whole last line without its newline is an event like the others
    (run_dir / "events.jsonl").write_text(json.dumps(_event(1, 0.5)))
    assert [e["epoch"] for e in read_events(run_dir)] == [1]


def _table_rows(out: str) -> list[str]:
    """The data rows of a printed event table (lines that start with an epoch number)."""
    return [ln for ln in out.splitlines() if ln.strip()[:1].isdigit() and "s of training" not in ln]


def test_corrupt_summary_is_named(run_dir: Path) -> None:
    (run_dir / "summary.json").write_text("{")
    with pytest.raises(JimuError, match=r"summary\.json is not valid JSON"):
        report(run_dir, plots=False)


def test_cli_prints_one_error_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["report", str(tmp_path / "missing")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: run folder")


def test_format_bytes_and_title(run_dir: Path) -> None:
    assert format_bytes(512) == "512 B"
    assert format_bytes(3 * 2**20) == "3.0 MB"
    assert format_bytes(None) == "-"
    assert run_title(run_dir, [], None) == "? x? on ? (?)"


def test_best_validation_takes_the_first_best_epoch() -> None:
    events = [_event(1, 0.5), _event(2, 0.9), _event(3, 0.7), _event(4, 0.9)]
    events[3]["test_acc"] = 0.99  # a later tie does not replace the first best epoch
    assert best_validation(events) == {
        "best_val_acc": pytest.approx(0.88),
        "best_val_epoch": 2,
        "test_acc_at_best_val": pytest.approx(0.89),
    }
    assert best_validation([{**_event(1, 0.5), "val_acc": None}]) == {}


def test_out_puts_the_plots_elsewhere(run_dir: Path, tmp_path: Path) -> None:
    elsewhere = tmp_path / "plots" / "ddp"
    assert main(["report", str(run_dir), "--out", str(elsewhere)]) == 0
    assert sorted(p.name for p in elsewhere.iterdir()) == ["accuracy.png", "loss.png"]
    assert not (run_dir / "loss.png").exists()


def _read_only(path: Path) -> Callable[..., Any]:
    """The atomic writes' file creation, failing as a read-only file system does in ``path``."""
    real = atomic._new_file

    def new_file(folder: Path, *args: Any) -> Path:
        if Path(folder).resolve() == path.resolve():
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(path))
        return real(folder, *args)

    return new_file


def test_a_read_only_run_folder_ends_in_one_line_naming_it_and_out(
    run_dir: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # simulated: the write of a plot raises EROFS, as on a read-only mount (root ignores
    # chmod); the next test does it for real where a private mount namespace can be had
    monkeypatch.setattr(atomic, "_new_file", _read_only(run_dir))
    assert main(["report", str(run_dir)]) == 2
    err = capsys.readouterr().err
    assert err == (
        f"error: cannot write the plots in {run_dir}: Read-only file system; "
        "give --out DIR to write them elsewhere\n"
    )
    assert sorted(p.name for p in run_dir.iterdir()) == ["events.jsonl", "summary.json"]
    assert main(["report", str(run_dir), "--out", str(tmp_path / "elsewhere")]) == 0
    assert (tmp_path / "elsewhere" / "accuracy.png").exists()


@pytest.mark.slow
@pytest.mark.skipif(
    shutil.which("unshare") is None or os.geteuid() != 0, reason="needs root and unshare"
)
def test_a_read_only_mount_for_real(run_dir: Path) -> None:
    # a read-only bind mount in a private mount namespace: gone when the shell ends
    script = (
        'mount --bind "$1" "$1" && mount -o remount,ro,bind "$1" || exit 77; '
        'exec "$2" -m deepjimu report "$1"'
    )
    cmd = ["unshare", "--mount", "sh", "-c", script, "sh", str(run_dir), sys.executable]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env(), timeout=120)
    if proc.returncode == 77:
        pytest.skip(f"no read-only bind mount here: {proc.stderr.strip()}")
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr == (
        f"error: cannot write the plots in {run_dir}: Read-only file system; "
        "give --out DIR to write them elsewhere\n"
    )


def _figures(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """The figures :func:`report` draws, caught before they are saved."""
    caught: dict[str, Any] = {}

    def save(figures: dict[str, Any], out_dir: Path, flag: str = "--out") -> list[Path]:
        caught.update(figures)
        return []

    monkeypatch.setattr("deepjimu.report.save_figures", save)
    return caught


def test_accuracy_axis_follows_the_data_and_admm_counts_iterations(
    run_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    events = [_event(e, acc) for e, acc in ((1, 0.985), (2, 0.99), (3, 0.995))]
    (run_dir / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    figs = _figures(monkeypatch)
    report(run_dir)
    ax = figs["accuracy"].axes[0]
    lo, hi = ax.get_ylim()
    shown = [y for line in ax.get_lines() for y in line.get_ydata()]
    assert 95 < lo < min(shown) and max(shown) < hi <= 100  # off the frame, not 0-100
    assert min(shown) - lo >= 0.5 and hi - max(shown) >= 0.25
    assert [f.axes[0].get_xlabel() for f in figs.values()] == ["epoch", "epoch"]
    summary = json.loads((run_dir / "summary.json").read_text())
    (run_dir / "summary.json").write_text(json.dumps({**summary, "strategy": "admm"}))
    (run_dir / "config.json").write_text(json.dumps({"strategy": "admm", "admm_batch": 0}))
    report(run_dir)
    assert [f.axes[0].get_xlabel() for f in figs.values()] == ["iteration", "iteration"]
    (run_dir / "config.json").write_text(json.dumps({"strategy": "admm", "admm_batch": 64}))
    report(run_dir)
    assert [f.axes[0].get_xlabel() for f in figs.values()] == ["epoch", "epoch"]


def test_a_probe_folder_prints_the_probe(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from deepjimu.cost.compress import Prediction
    from deepjimu.cost.probe import LinkFit, Probe, write_probe

    probe = Probe(2, "cpu", "mlp:16x1", 64, 0.002, {"none": 0.0, "bf16": 0.0001},
                  {"all_reduce": LinkFit(5e-5, 1e-9)}, {"all_reduce": [(4096, 6e-5)]})  # fmt: skip
    predictions = [Prediction("none", 0.003, 0.002, 0.0, 0.001, 4096)]
    folder = tmp_path / "probe-ddp-digits"
    folder.mkdir()
    write_probe(probe, folder / "probe.json", predictions, "none")
    assert main(["report", str(folder)]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0] == (
        f"{folder} is a probe's folder (jimu probe): no training events, only probe.json"
    )
    assert "probe: 2 worker(s) on cpu, mlp:16x1, 64 rows per worker" in out
    assert "compress auto: none" in out and "epoch yet" not in out
    assert not list(folder.glob("*.png"))


def test_a_bench_folder_points_to_its_report_md(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from deepjimu.bench.record import RECORD

    bench = tmp_path / "bench-1"
    (bench / "runs" / "local-w1-mlp-16x1").mkdir(parents=True)
    (bench / RECORD).write_text("{}")
    assert main(["report", str(bench)]) == 2
    resume = f"(go on with: jimu bench --resume {bench})"
    head = f"error: {bench} is a bench's folder (jimu bench), not a run folder"
    assert capsys.readouterr().err == f"{head}, and has no report.md yet {resume}\n"
    (bench / "report.md").write_text("# bench\n")
    assert main(["report", str(bench)]) == 2
    assert capsys.readouterr().err == (
        f"{head}: its report is {bench / 'report.md'} "
        f"(one run's: jimu report {bench / 'runs' / 'NAME'})\n"
    )


@pytest.mark.parametrize("logged", [3, 20])
def test_the_epoch_axis_has_whole_ticks(
    run_dir: Path, monkeypatch: pytest.MonkeyPatch, logged: int
) -> None:
    """Matplotlib's own ticks would read 1.5 for 3 epochs and 2.5, 7.5 for 20."""
    events = [_event(e, 0.5 + 0.02 * e) for e in range(1, logged + 1)]
    (run_dir / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    figs = _figures(monkeypatch)
    report(run_dir)
    for name, fig in figs.items():
        ticks = list(fig.axes[0].get_xticks())
        assert ticks and all(t == int(t) for t in ticks), (name, ticks)
