"""Tests of ``jimu bench``: the matrix plan, the figures read back, failures, and a tiny bench end to end."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

import deepjimu.bench.run
from deepjimu.bench.markdown import write_markdown
from deepjimu.bench.matrix import (
    Cell,
    option_argv,
    plan,
    split_variants,
    train_config,
    train_options,
)
from deepjimu.bench.results import Target, add_speedups, read_csv
from deepjimu.bench.runner import NO_FIT, Outcome, error_line, measure, run_cell
from deepjimu.bench.tune import tune_group, tuned_keys
from deepjimu.cli import main
from deepjimu.config import ConfigErrors, RunConfig
from deepjimu.errors import JimuError
from deepjimu.strategies import strategy_names
from processes import start


def test_plan_skips_impossible_combinations_and_refuses_bad_ones_up_front() -> None:
    cells = plan(RunConfig(), ["local", "ddp"], [1, 2], ["mlp:16x1"])
    skipped = {c.label: c.skip for c in cells if c.skip}
    assert list(skipped) == ["local x2 mlp:16x1"]
    assert "at most 1 worker" in skipped["local x2 mlp:16x1"]  # type: ignore[operator]
    assert Cell("ddp", 2, "mlp:16x1").name == "ddp-w2-mlp-16x1"
    with pytest.raises(ConfigErrors) as err:  # one line per problem, naming its configurations
        plan(RunConfig(), ["nope", "local"], [1, 2, 3, 4], ["mlp:16x1", "mlp:8x1"])
    assert err.value.problems == [
        "nope x1 mlp:16x1, nope x2 mlp:16x1, nope x3 mlp:16x1 and 5 more: "
        f"unknown strategy 'nope' (known: {', '.join(strategy_names())})"
    ]
    # a strategy that cannot train one model of the matrix skips it; a model that no
    # strategy of the matrix trains is a mistake
    cells = plan(RunConfig(), ["local", "tp"], [1, 2], ["cnn:4", "mlp:16x1"])
    skipped = {c.label: c.skip for c in cells if c.skip}
    assert (
        skipped["tp x2 cnn:4"]
        == "tp splits mlp:... models into Linear pairs and gpt:... models by heads; model cnn:4 is neither"
    )
    assert [c.label for c in cells if not c.skip] == [
        "local x1 cnn:4",
        "local x1 mlp:16x1",
        "tp x2 mlp:16x1",
    ]
    with pytest.raises(ConfigErrors) as err:
        plan(RunConfig(), ["tp"], [2], ["cnn:4"])
    assert err.value.problems == [
        "tp x2 cnn:4: tp splits mlp:... models into Linear pairs and gpt:... models by heads; "
        "model cnn:4 is neither"
    ]
    # a value that runs nowhere is a mistake, not an impossible combination
    _, lrs = split_variants({"lr": "0.1,-1"})
    with pytest.raises(ConfigErrors) as err:
        plan(RunConfig(), ["local", "ddp"], [1], ["mlp:16x1"], lrs)
    assert err.value.problems == [
        "local x1 mlp:16x1 lr=-1, ddp x1 mlp:16x1 lr=-1: lr must be a positive number (lr: -1.0)"
    ]


def test_train_args_are_parsed_and_must_not_repeat_bench_flags() -> None:
    options = train_options(["--batch-size", "32", "--lr", "0.01", "--no-error-feedback"])
    assert options == (("batch_size", "32"), ("lr", "0.01"), ("error_feedback", "false"))
    cfg = train_config(options, {"seed": 3, "epochs": None})
    assert (cfg.batch_size, cfg.lr, cfg.seed, cfg.error_feedback) == (32, 0.01, 3, False)
    with pytest.raises(JimuError, match="must not set --workers"):
        train_options(["--workers", "2"])
    with pytest.raises(JimuError, match="unrecognized arguments"):
        train_options(["--no-such-flag", "1"])


def test_an_option_given_every_run_is_left_out_where_it_does_not_apply() -> None:
    base = train_config((("lr", "0.01"),), {})
    cells = plan(base, ["local", "admm"], [1], ["mlp:16x1"], fixed=["lr"])
    assert [(c.strategy, c.dropped, c.skip) for c in cells] == [
        ("local", (), None),
        ("admm", ("lr",), None),
    ]
    assert cells[1].argv((("lr", "0.01"),)) == [] and cells[0].argv((("lr", "0.01"),)) == [
        "--lr",
        "0.01",
    ]
    # of use to none of the runs: a mistake, in one line
    with pytest.raises(ConfigErrors) as err:
        plan(train_config((("rho", "2"),), {}), ["local", "ddp"], [1], ["mlp:16x1"], fixed=["rho"])
    assert err.value.problems == ["--rho applies to strategy admm; strategy local is not one"]


def test_comma_lists_of_one_value_options_become_matrix_dimensions() -> None:
    fixed, variants = split_variants(
        {
            "lr": "0.1,0.2",
            "precision": "fp32,bf16",
            "balance": "2,2",
            "classes": "0,1",
            "quiet": "true",
        }
    )
    assert fixed == (("balance", "2,2"), ("classes", "0,1"), ("quiet", "true"))
    assert len(variants) == 4 and variants[0] == (("lr", "0.1"), ("precision", "fp32"))
    assert option_argv(fixed) == ["--balance", "2,2", "--classes", "0,1", "--quiet"]
    with pytest.raises(JimuError, match=r"lr must be a number \(got 'x'\)"):
        split_variants({"lr": "0.1,x"})
    cells = plan(RunConfig(), ["local"], [1], ["mlp:16x1"], variants[:1])
    assert cells[0].name == "local-w1-mlp-16x1-lr0.1-precisionfp32"
    assert cells[0].label == "local x1 mlp:16x1 lr=0.1 precision=fp32"
    _, optimizers = split_variants({"optimizer": "adam,kfac"})
    cells = plan(RunConfig(), ["local", "admm"], [1], ["mlp:16x1"], optimizers)
    assert [c.skip is not None for c in cells] == [False, False, False, True]  # admm + kfac


def test_compress_options_are_one_more_dimension_and_impossible_without_gradients() -> None:
    _, options = split_variants({"compress": "none,bf16,powersgd:4"})
    assert options == [
        (("compress", "none"),),
        (("compress", "bf16"),),
        (("compress", "powersgd:4"),),
    ]
    cells = plan(RunConfig(), ["ddp", "admm"], [2], ["mlp:16x1"], options)
    assert [c.name for c in cells[:3]] == [
        "ddp-w2-mlp-16x1-compressnone",
        "ddp-w2-mlp-16x1-compressbf16",
        "ddp-w2-mlp-16x1-compresspowersgd-4",
    ]
    assert [c.skip is None for c in cells] == [True, True, True, True, False, False]
    assert cells[4].skip is not None and "compress" in cells[4].skip  # admm sends no gradients


def test_tuning_keeps_the_best_validation_accuracy_and_the_default_on_ties() -> None:
    cells = [Cell("local", 1, "mlp:16x1"), Cell("local", 2, "mlp:16x1", skip="at most 1 worker")]
    scores = {"0.001": 0.5, "0.0001": 0.9, "0.01": 0.9}
    ran: list[tuple[int, tuple[tuple[str, str], ...]]] = []

    def run_trial(
        cell: Cell, setting: tuple[tuple[str, str], ...]
    ) -> tuple[str, str, float | None]:
        ran.append((cell.workers, setting))
        return "ok", "", scores[setting[0][1]]

    t = tune_group(cells, RunConfig(), 3, run_trial)
    assert t is not None and [w for w, _ in ran] == [1, 1, 1]
    assert t.choice == (("lr", "0.0001"),)  # 0.9 twice: the first tried wins the tie
    assert tuned_keys(["local", "admm"], RunConfig(), 3) >= {"lr"}


def test_error_line_prefers_the_cli_error() -> None:
    assert error_line("Traceback\nerror: lr must be positive\n", 2) == "lr must be positive"
    assert error_line("Traceback ...\nValueError: bad\n", 1) == "ValueError: bad"
    assert error_line("", 9) == "exit code 9 without a message"


def test_a_full_disk_names_the_bench_s_option() -> None:
    full = "error: cannot write r/events.jsonl: no space left on the disk of r (0 B free); "
    assert error_line(full + "free space there or pick a --runs-dir on a disk with room", 2) == (
        full.removeprefix("error: ") + "free space there or pick a --bench-dir on a disk with room"
    )


@pytest.mark.slow
def test_run_cell_times_out_and_records_failures(tmp_path: Path) -> None:
    slow = run_cell([sys.executable, "-c", "import time; time.sleep(30)"], tmp_path, "slow", 0.5)
    assert slow.status == "timeout" and "0.5 s" in slow.error and slow.wall_s < 15
    bad = run_cell(
        [sys.executable, "-c", "import sys; sys.exit('error: broken on purpose')"],
        tmp_path,
        "bad",
        30,
    )
    assert (bad.status, bad.error) == ("failed", "broken on purpose")
    assert (tmp_path / "bad.stderr.log").exists()


def _fake_run(d: Path, strategy: str, workers: int, extra: dict[str, object]) -> Path:
    d.mkdir(parents=True)
    events = [
        {"epoch": e, "time_s": 2.0 * e, "train_s": 1.0 * e, "samples": 100 * e, "samples_per_s": 100.0,
         "test_acc": acc, "bytes_sent": 50, "peak_mem_mb_per_rank": [10.0 * e] * workers, **extra}
        for e, acc in ((1, 0.5), (2, 0.92), (3, 0.95))
    ]  # fmt: skip
    (d / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    summary = {"strategy": strategy, "workers": workers, "epochs": 3, "time_s": 6.0, "fit_s": 5.0,
               "train_s": 3.0, "eval_s": 1.0, "samples": 300, "samples_per_s": 100.0,
               "test_acc": 0.95, "bytes_sent": 150}  # fmt: skip
    (d / "summary.json").write_text(json.dumps(summary))
    (d / "config.json").write_text(json.dumps({"microbatches": 4}))
    return d


def test_measure_reads_target_bytes_memory_and_bubble(tmp_path: Path) -> None:
    m = measure(_fake_run(tmp_path / "p", "pipeline", 2, {}), target_acc=0.9)
    assert (m["time_to_target_s"], m["wall_to_target_s"]) == (2.0, 4.0)
    assert m["bytes_per_sample"] == pytest.approx(150 / 300)
    assert m["peak_mem_mb"] == 30.0
    assert m["idle_frac"] is None and m["bubble_theory"] is None  # the run logged neither
    # the strategy logs both with every event of training steps: the mean over the events
    figures = {"idle_frac": 0.3, "bubble_theory": 1 / 9}
    logged = measure(_fake_run(tmp_path / "q", "pipeline", 2, figures), 0.99)
    assert logged["idle_frac"] == pytest.approx(0.3) and logged["time_to_target_s"] is None
    assert logged["bubble_theory"] == pytest.approx(1 / 9)
    with pytest.raises(JimuError, match=r"summary\.json does not exist"):
        (tmp_path / "q" / "summary.json").unlink()
        measure(tmp_path / "q", 0.9)


def test_speedup_falls_back_to_local() -> None:
    rows = [
        {"strategy": "local", "model": "m", "workers": 1, "status": "ok", "samples_per_s": 100.0},
        {"strategy": "ddp", "model": "m", "workers": 1, "status": "failed", "samples_per_s": None},
        {"strategy": "ddp", "model": "m", "workers": 2, "status": "ok", "samples_per_s": 150.0},
        {"strategy": "pp", "model": "m", "workers": 1, "status": "ok", "samples_per_s": 50.0},
        {"strategy": "pp", "model": "m", "workers": 2, "status": "ok", "samples_per_s": 80.0},
    ]
    add_speedups(rows)
    assert (rows[2]["speedup"], rows[2]["speedup_base"]) == (1.5, "local x1")
    assert (rows[4]["speedup"], rows[4]["speedup_base"]) == (1.6, "pp x1")
    assert rows[1]["speedup"] is None


@pytest.mark.slow
def test_bench_end_to_end_records_failures_and_goes_on(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # ddp fp32 dies (a stand-in: every configuration is valid), local x2 is impossible, ddp
    # bf16 runs: one real run keeps this test short
    real_run_cell = deepjimu.bench.run.run_cell

    def run_cell(cmd: list[str], log_dir: Path, name: str, timeout: float) -> Outcome:
        if name.endswith("precisionfp32"):
            return Outcome("failed", "broken on purpose", 0.1)
        return real_run_cell(cmd, log_dir, name, timeout)

    monkeypatch.setattr(deepjimu.bench.run, "run_cell", run_cell)
    argv = ["bench", "--bench-dir", str(tmp_path), "--name", "tiny", "--strategies", "local,ddp"]
    argv += ["--workers", "2", "--models", "mlp:16x1", "--epochs", "2"]
    argv += ["--train-args", "--batch-size 128", "--precision", "fp32,bf16"]
    assert main(argv) == 2  # everything is written, then the failed configurations are named
    err = capsys.readouterr().err
    assert err == (
        "error: 1 of 2 runs failed: ddp x2 mlp:16x1 precision=fp32 (failed); "
        f"their errors are in {tmp_path / 'tiny' / 'report.md'}\n"
    )
    out = tmp_path / "tiny"
    all_rows = read_csv(out / "results.csv")
    assert [(r["strategy"], r["options"], r["status"]) for r in all_rows] == [
        ("local", "precision=fp32", "skipped"),
        ("local", "precision=bf16", "skipped"),
        ("ddp", "precision=fp32", "failed"),
        ("ddp", "precision=bf16", "ok"),
    ]
    assert all_rows[2]["error"] == "broken on purpose"
    ddp = all_rows[3]
    assert (ddp["workers"], ddp["epochs"], ddp["speedup"]) == ("2", "2", "")  # no 1-worker baseline
    assert float(ddp["samples_per_s"]) > 0 and float(ddp["bytes_per_sample"]) > 0
    assert 0 < float(ddp["test_acc"]) <= 1 and float(ddp["peak_mem_mb"]) > 0
    assert Path(ddp["run_dir"], "summary.json").exists()
    # no --target-acc: 95% of the best final accuracy, which the best run reaches
    target = math.floor(95 * float(ddp["test_acc"]))
    assert 0 < float(ddp["time_to_target_s"]) <= float(ddp["train_s"])
    md = (out / "report.md").read_text()
    assert (
        f"- time-to-target: {target}% test accuracy; 95% of the best final test "
        f"accuracy, {float(ddp['test_acc']):.2%} (ddp x2 mlp:16x1 precision=bf16), rounded down"
    ) in md
    assert f"train s to {target}%" in md
    assert "## Skipped" in md and "local x2" in md.split("## Skipped")[1]
    assert "## Failed" in md and "broken on purpose" in md
    assert "No pipeline run" not in md  # none was asked for, so none is missed
    for name in ("throughput", "accuracy_time", "time_to_target", "comm_memory"):
        assert f"({name}.png)" in md
        assert (out / f"{name}.png").read_bytes()[:4] == b"\x89PNG"
    assert main(argv) == 2  # the folder holds results now
    assert (
        f"already holds results; pick another --name, or go on with: jimu bench --resume {out}"
        in (capsys.readouterr().err)
    )


def test_every_configuration_is_checked_before_anything_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["bench", "--bench-dir", str(tmp_path), "--name", "b", "--strategies", "foo,local"]
    assert main([*argv, "--workers", "1,2", "--models", "mlp:16x1"]) == 2
    known = ", ".join(strategy_names())
    # one line per problem, naming the configurations that have it
    assert capsys.readouterr().err == (
        f"error: foo x1 mlp:16x1, foo x2 mlp:16x1: unknown strategy 'foo' (known: {known})\n"
    )
    assert not (tmp_path / "b").exists()  # nothing ran, nothing was written


@pytest.mark.parametrize(
    ("command", "flag", "value"),
    [("bench", "--workers", "1,,2"), ("bench", "--lr", "0.1,"), ("plan", "--workers", "1,,2")],
)
def test_an_empty_item_of_a_comma_list_is_one_line_naming_the_option(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], command: str, flag: str, value: str
) -> None:
    where = ["--bench-dir", str(tmp_path), "--name", "b"] if command == "bench" else []
    argv = [command, *where, "--strategies", "local", "--models", "mlp:16x1"]
    assert main([*argv, flag, value]) == 2
    assert capsys.readouterr().err == f"error: {flag} has an empty item (got {value!r})\n"
    assert not (tmp_path / "b").exists()


@pytest.mark.parametrize(
    ("flags", "says"),
    [
        (["--target-acc", "0.9", "--target-loss", "1.9"], "give one target: --target-acc or "
         "--target-loss, not both"),
        (["--target-loss", "0"], "--target-loss must be > 0 (target-loss: 0.0)"),
    ],
)  # fmt: skip
def test_a_bench_takes_one_target_and_a_positive_loss(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], flags: list[str], says: str
) -> None:
    argv = ["bench", "--bench-dir", str(tmp_path), "--name", "b", "--strategies", "local"]
    assert main([*argv, *flags]) == 2
    assert capsys.readouterr().err == f"error: {says}\n"
    assert not (tmp_path / "b").exists()


@pytest.mark.slow
def test_tune_runs_the_same_trials_for_each_strategy_then_the_matrix(tmp_path: Path) -> None:
    argv = ["bench", "--bench-dir", str(tmp_path), "--name", "t", "--strategies", "local"]
    argv += [
        "--workers",
        "1",
        "--models",
        "mlp:16x1",
        "--epochs",
        "1",
        "--tune",
        "--tune-trials",
        "2",
    ]
    assert main(argv) == 0
    out = tmp_path / "t"
    (row,) = read_csv(out / "results.csv")
    assert row["status"] == "ok" and row["tuned"] in ("lr=0.0001", "lr=0.01")
    trials = sorted(p.name for p in (out / "tune" / "runs").iterdir())
    assert trials == ["local-w1-mlp-16x1-lr0.0001", "local-w1-mlp-16x1-lr0.01"]
    chosen = json.loads((out / "runs" / "local-w1-mlp-16x1" / "config.json").read_text())
    assert f"lr={chosen['lr']:g}" == row["tuned"]
    assert "## Tuning" in (out / "report.md").read_text()
    assert main([*argv[:4], "t2", *argv[5:], "--lr", "0.1"]) == 2  # --tune sets lr itself


def _wait(check: Callable[[], bool], proc: subprocess.Popen[str], what: str) -> None:
    deadline = time.time() + 180
    while not check():
        if proc.poll() is not None:
            raise AssertionError(f"the bench ended before {what}: {proc.communicate()[1][-3000:]}")
        assert time.time() < deadline, f"no {what} in 180 s"
        time.sleep(0.05)


@pytest.mark.slow
def test_a_stopped_bench_writes_what_finished_and_resume_runs_only_the_rest(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "b"
    argv = ["bench", "--bench-dir", str(tmp_path), "--name", "b", "--strategies", "local"]
    argv += ["--workers", "1", "--models", "mlp:16x1", "--epochs", "2", "--lr", "0.01,0.02,0.03"]
    proc = start(argv)
    names = [f"local-w1-mlp-16x1-lr{lr}" for lr in ("0.01", "0.02", "0.03")]
    first = out / "runs" / names[0] / "summary.json"
    _wait(lambda: (out / "runs" / names[1]).exists(), proc, "the second configuration")
    os.kill(proc.pid, signal.SIGINT)  # Ctrl-C while the second configuration runs
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130
    assert err.splitlines()[-1] == (
        f"error: stopped by SIGINT; 1 of 3 configurations finished, written to "
        f"{out / 'report.md'} (go on with: jimu bench --resume {out})"
    )
    rows = read_csv(out / "results.csv")
    assert [r["status"] for r in rows] == ["ok", "interrupted", "pending"]
    assert rows[1]["error"] == "stopped by SIGINT"
    md = (out / "report.md").read_text()
    assert "## Not finished" in md and "lr=0.02: interrupted (stopped by SIGINT)" in md
    assert f"jimu bench --resume {out}" in md and "lr=0.03: not run" in md
    for name in ("throughput", "accuracy_time", "time_to_target", "comm_memory"):
        assert f"({name}.png)" in md and (out / f"{name}.png").exists()
    finished_at = first.stat().st_mtime_ns
    # the record decides: a configuration other than the bench's is refused in one line
    assert main(["bench", "--resume", str(out), "--epochs", "3"]) == 2
    assert capsys.readouterr().err == (
        f"error: --resume {out}: --epochs 3 differs from the bench's 2 ({out / 'bench.json'}); "
        "a resumed bench runs the matrix it recorded\n"
    )
    assert main(["bench", "--resume", str(out), "--timeout", "200"]) == 0
    printed = capsys.readouterr().out
    assert "bench b: 2 runs (1 finished before, read back)" in printed
    assert (
        "[1/2] local x1 mlp:16x1 lr=0.02" in printed
        and "[2/2] local x1 mlp:16x1 lr=0.03" in printed
    )
    assert first.stat().st_mtime_ns == finished_at  # read back, not run again
    rows = read_csv(out / "results.csv")
    assert [(r["options"], r["status"]) for r in rows] == [
        (f"lr={lr}", "ok") for lr in ("0.01", "0.02", "0.03")
    ]
    best = max(rows, key=lambda r: float(r["test_acc"]))
    assert best["time_to_target_s"]  # the target is chosen from every row, the read-back one too
    md = (out / "report.md").read_text()
    assert "## Not finished" not in md and md.count("| local | 1 | mlp:16x1 | lr=") == 3
    assert main(["bench", "--resume", str(tmp_path)]) == 2  # not a bench folder
    assert capsys.readouterr().err.startswith(f"error: --resume {tmp_path}: ")


def test_the_report_misses_a_pipeline_plot_only_when_a_pipeline_was_asked_for(
    tmp_path: Path,
) -> None:
    setup = {"name": "b", "command": "jimu bench", "dataset": "digits", "seed": 0, "epochs": 2,
             "target": Target(0.9, "set with --target-acc"), "train_args": "", "host": "h",
             "date": "d", "elapsed_s": 1.0}  # fmt: skip
    plot = [tmp_path / "throughput.png"]

    def report(*strategies: str) -> str:
        rows = [{"strategy": s, "workers": 2, "model": "m", "status": "failed", "error": "x",
                 "log": "l"} for s in strategies]  # fmt: skip
        rows.append({"strategy": "ddp", "workers": 2, "model": "m", "status": "ok"})
        write_markdown(tmp_path / "report.md", rows, setup, plot)
        return (tmp_path / "report.md").read_text()

    assert "No pipeline run finished" in report("pipeline")
    assert "No pipeline run finished" not in report("local")


@pytest.mark.slow  # starts a python process
def test_run_cell_records_a_run_its_memory_cannot_hold_as_a_result(tmp_path: Path) -> None:
    short = run_cell(
        [sys.executable, "-c", "import sys; print('error: needs 9 GB, has 1 GB', file=sys.stderr); sys.exit(3)"],
        tmp_path,
        "big",
        30,
    )  # fmt: skip
    assert (short.status, short.error) == (NO_FIT, "needs 9 GB, has 1 GB")


@pytest.mark.slow
def test_a_configuration_past_the_budget_is_does_not_fit_and_the_matrix_goes_on(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # mlp:2048x3 with Adam needs about 250 MB a worker beside torch; 100 MB refuses it before
    # any worker starts (no cgroup is made, so no root is needed); mlp:16x1 fits
    argv = ["bench", "--bench-dir", str(tmp_path), "--name", "fit", "--strategies", "local"]
    argv += ["--workers", "1", "--models", "mlp:16x1,mlp:2048x3", "--epochs", "1"]
    argv += ["--memory-limit", "100M"]
    assert main(argv) == 0, capsys.readouterr().err  # not a failure
    rows = read_csv(tmp_path / "fit" / "results.csv")
    assert [(r["model"], r["status"]) for r in rows] == [
        ("mlp:16x1", "ok"),
        ("mlp:2048x3", NO_FIT),
    ]
    assert rows[1]["error"].startswith("worker 0 needs about ")
    assert "more than its --memory-limit 100.0 MB" in rows[1]["error"]
    md = (tmp_path / "fit" / "report.md").read_text()
    assert "## Does not fit" in md and "local x1 mlp:2048x3: worker 0 needs about" in md
    assert "## Failed" not in md


def test_a_default_value_of_an_option_that_does_not_apply_leaves_the_cell_plain() -> None:
    # jimu plan --replicas 1,2: ddp takes no --replicas, and jimu train refuses it given
    _, replicas = split_variants({"replicas": "1,2"})
    cells = plan(RunConfig(), ["ddp", "pipeline"], [4], ["mlp:16x3"], replicas)
    assert [(c.label, c.skip is None) for c in cells] == [
        ("ddp x4 mlp:16x3", True),
        ("ddp x4 mlp:16x3 replicas=2", False),
        ("pipeline x4 mlp:16x3 replicas=1", True),
        ("pipeline x4 mlp:16x3 replicas=2", True),
    ]
    assert "--replicas" not in cells[0].argv(())
