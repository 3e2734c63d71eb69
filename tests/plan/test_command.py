"""``jimu plan``: a ranked table and plan.json, from a cluster file or from this machine, and --check."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from deepjimu.cli import main
from deepjimu.measure.compute import ROUNDS

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "clusters"


def test_plan_on_a_cluster_file_ranks_every_configuration(tmp_path, capsys) -> None:
    out = tmp_path / "plan"
    code = main(
        [
            "plan", "--cluster", str(EXAMPLES / "h100-node.toml"), "--strategies",
            "local,ddp,pipeline,admm", "--workers", "1,2,4", "--models", "mlp:64x4",
            "--out", str(out),
        ]
    )  # fmt: skip
    text = capsys.readouterr().out
    assert code == 0, text
    rows = json.loads((out / "plan.json").read_text())["rows"]
    # local x1, ddp x1 2 4, pipeline x2 x4 (it needs 2 workers), admm x1 x2 x4
    assert len(rows) == 9
    speeds = [r["predicted"]["samples_per_s"] for r in rows]
    assert speeds == sorted(speeds, reverse=True)
    for r in rows:
        assert set(r["predicted"]) >= {"step_s", "samples_per_s", "bytes_per_sample", "peak_mem_mb"}
    assert "skipped local x2 mlp:64x4" in text


def test_plan_with_a_bad_cluster_file_says_so_in_one_line(tmp_path, capsys) -> None:
    bad = tmp_path / "c.toml"
    bad.write_text('name = "x"\nnodes = "two"\n')
    code = main(["plan", "--cluster", str(bad), "--strategies", "local", "--workers", "1"])
    err = capsys.readouterr().err
    assert code == 2
    assert err.count("\n") == 1 and "nodes" in err and "'two'" in err
    assert not (tmp_path / "plans").exists()


@pytest.mark.slow
def test_plan_probes_this_machine_and_checks_against_real_runs(
    tmp_path, capsys, monkeypatch
) -> None:
    monkeypatch.chdir(tmp_path)
    code = main(
        [
            "plan", "--strategies", "local,ddp", "--workers", "1,2", "--models", "mlp:16x1",
            "--epochs", "2", "--out", "p", "--check",
        ]
    )  # fmt: skip
    text = capsys.readouterr().out
    assert code == 0, text
    plan = json.loads(Path("p/plan.json").read_text())
    assert plan["cluster"]["source"] == "probe"
    checked = [r for r in plan["rows"] if "measured" in r]
    assert len(checked) == 3  # local x1, ddp x1, ddp x2
    for r in checked:
        assert r["measured"]["samples_per_s"] > 0
        assert r["error"] == pytest.approx(
            r["predicted"]["samples_per_s"] / r["measured"]["samples_per_s"] - 1
        )
    assert "check: 3 configurations" in text


def test_configurations_without_a_prediction_say_why_and_come_last(tmp_path, capsys) -> None:
    out = tmp_path / "plan"
    code = main(
        [
            "plan", "--cluster", str(EXAMPLES / "h100-node.toml"), "--strategies", "ddp,local",
            "--workers", "1,2", "--models", "mlp:16x1", "--compress", "qsgd:8", "--out", str(out),
        ]
    )  # fmt: skip
    text = capsys.readouterr().out
    assert code == 0, text
    rows = json.loads((out / "plan.json").read_text())["rows"]
    # ddp with one worker sends nothing, so qsgd costs it nothing; with two it is not predicted
    assert [(r["strategy"], r["workers"]) for r in rows][-1] == ("ddp", 2)
    assert all(r["predicted"] is not None for r in rows[:-1])
    assert rows[-1]["predicted"] is None and "qsgd:8" in rows[-1]["not_predicted"]
    assert "not predicted: the planner predicts ddp with --compress none, fp16 or bf16" in text


def test_repeated_checks_compare_with_each_configurations_median_run() -> None:
    from deepjimu.plan.check import _check_summary, _compare

    def row(strategy: str, predicted: float) -> dict:
        return {"strategy": strategy, "workers": 1, "model": "m", "options": {},
                "predicted": {"samples_per_s": predicted}}  # fmt: skip

    def run(speed: float, sent: float) -> dict:
        return {"samples_per_s": speed, "bytes_per_sample": sent, "peak_mem_mb": 1.0, "train_s": 1}

    fast, slow = row("local", 120.0), row("ddp", 50.0)
    _compare(fast, [run(150, 1), run(100, 2), run(90, 3)])
    _compare(slow, [run(40, 7), run(60, 8)])
    # the median run's figures: 100 samples/s and its own bytes; an even count averages speeds
    assert fast["measured"]["samples_per_s"] == 100 and fast["measured"]["bytes_per_sample"] == 2
    assert fast["error"] == pytest.approx(0.2)
    assert fast["measured"]["runs_samples_per_s"] == [90, 100, 150]
    assert slow["measured"]["samples_per_s"] == 50 and slow["error"] == pytest.approx(0.0)
    text = _check_summary([fast, slow], repeats=3)
    assert "local x1 m: predicted 120, measured 100 samples/s (+20%)" in text
    # spread: 150 / 90 - 1 = 67% and 60 / 40 - 1 = 50%
    assert "median of 3 runs each" in text and "median +58%, worst +67%" in text
    assert "median 10%, worst 20%" in text and "is the measured fastest" in text
    assert "it ran at 1.000 of the measured fastest's samples/s" in text


def test_plan_refuses_repeats_below_one_in_one_line(tmp_path, capsys) -> None:
    code = main(
        ["plan", "--workers", "1", "--check", "--repeats", "0", "--out", str(tmp_path / "p")]
    )
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "--repeats must be >= 1" in err
    assert not (tmp_path / "p").exists()


def test_a_paper_plan_of_a_model_admm_cannot_train_ranks_the_other_strategies(
    tmp_path, capsys
) -> None:
    out = tmp_path / "plan"
    code = main(
        [
            "plan", "--cluster", str(EXAMPLES / "h100-node.toml"), "--strategies", "local,ddp",
            "--workers", "1", "--models", "resnet:3", "--dataset", "digits", "--out", str(out),
        ]
    )  # fmt: skip
    captured = capsys.readouterr()
    assert code == 0, captured.err
    rows = json.loads((out / "plan.json").read_text())["rows"]
    assert sorted(r["strategy"] for r in rows) == ["ddp", "local"]
    assert all(r["predicted"]["samples_per_s"] > 0 for r in rows)


def test_admm_flops_are_counted_only_when_asked_and_refused_as_not_predicted() -> None:
    from deepjimu.config import RunConfig
    from deepjimu.models import build_model
    from deepjimu.plan.setup import _admm_flops

    model = build_model("resnet:3", (1, 8, 8), 10, seed=0)
    flops = _admm_flops(model, (1, 8, 8), RunConfig())  # a model admm cannot train: no error yet
    with pytest.raises(ValueError, match="module 1 is a BasicBlock"):
        flops(16)


def test_a_paper_plan_says_where_its_figures_come_from_and_how_far_off(tmp_path, capsys) -> None:
    out = tmp_path / "plan"
    cluster = EXAMPLES / "h100-node.toml"
    code = main(
        [
            "plan", "--cluster", str(cluster), "--strategies", "local", "--workers", "1",
            "--models", "mlp:16x2", "--out", str(out),
        ]
    )  # fmt: skip
    text = capsys.readouterr().out
    assert code == 0, text
    lines = text.splitlines()
    below = lines[lines.index(next(ln for ln in lines if ln.startswith("local x1"))) + 1]
    assert str(cluster) in below and "datasheet" in below and "1.35-6x" in below
    assert "--check" in below and "--cluster probe" in below
    assert json.loads((out / "plan.json").read_text())["caveat"] == below


def test_a_plan_folder_is_named_as_a_bench_folder_is(tmp_path, capsys) -> None:
    common = ["plan", "--cluster", str(EXAMPLES / "h100-node.toml"), "--strategies", "local",
              "--workers", "1", "--models", "mlp:16x2"]  # fmt: skip
    assert main([*common, "--plans-dir", str(tmp_path / "p"), "--name", "n"]) == 0
    assert (tmp_path / "p" / "n" / "plan.json").exists()
    assert capsys.readouterr().out.splitlines()[-1] == f"plan: {tmp_path / 'p' / 'n' / 'plan.json'}"


def _fake_check(monkeypatch, calls: int, out: Path) -> list[str]:
    """``run_cell`` and ``measure`` of the check made instant: the first ``calls`` runs finish
    at 100 samples/s, the next leaves its run folder holding only its lock and is stopped by
    Ctrl-C. Returns what each call saw in ``out`` (plan.json there or not)."""
    import deepjimu.plan.check
    from deepjimu.bench.runner import Outcome

    seen: list[str] = []

    def run_cell(cmd: list[str], log_dir: Path, name: str, timeout: float) -> Outcome:
        seen.append("plan.json" if (out / "plan.json").exists() else "none")
        if len(seen) > calls:
            folder = log_dir.parent / "runs" / name
            folder.mkdir(parents=True)
            (folder / ".lock").write_text("1\n")
            raise KeyboardInterrupt
        return Outcome("ok", "", 0.1)

    def measure(run_dir: Path) -> dict:
        return {"samples_per_s": 100.0, "bytes_per_sample": 0.0, "peak_mem_mb": 1.0, "train_s": 1}

    monkeypatch.setattr(deepjimu.plan.check, "run_cell", run_cell)
    monkeypatch.setattr(deepjimu.plan.check, "measure", measure)
    return seen


def test_ctrl_c_in_the_check_keeps_the_plan_and_the_finished_rows(
    tmp_path, capsys, monkeypatch
) -> None:
    out = tmp_path / "plan"
    seen = _fake_check(monkeypatch, 1, out)
    code = main(
        [
            "plan", "--cluster", str(EXAMPLES / "here-2cores.toml"), "--strategies", "local,ddp",
            "--workers", "1", "--models", "mlp:16x2", "--out", str(out), "--check",
        ]
    )  # fmt: skip
    err = capsys.readouterr().err
    assert code == 130
    assert seen == ["plan.json", "plan.json"]  # the predictions were written before the check
    rows = json.loads((out / "plan.json").read_text())["rows"]
    assert all(r["predicted"] for r in rows)
    assert [r["measured"]["samples_per_s"] for r in rows if "measured" in r] == [100.0]
    assert err.count("\n") == 1 and "1 of 2 checked runs not done" in err
    assert str(out / "plan.json") in err
    # the stopped run's folder held only its lock: gone, and so is check/runs with it
    assert not (out / "check" / "runs").exists()


def test_ctrl_c_in_the_probe_removes_its_empty_folder_and_says_what_was_not_done(
    tmp_path, capsys, monkeypatch
) -> None:
    import signal

    import deepjimu.plan.setup
    from deepjimu.errors import Interrupted

    out = tmp_path / "plan"

    def probe(cfg):
        folder = Path(cfg.runs_dir) / cfg.name
        folder.mkdir(parents=True)
        (folder / ".lock").write_text("1\n")
        raise Interrupted(signal.SIGINT, f"stopped by SIGINT; {folder} has no checkpoint yet")

    monkeypatch.setattr(deepjimu.plan.setup, "probe", probe)
    code = main(
        [
            "plan", "--strategies", "ddp", "--workers", "2", "--models", "mlp:16x2",
            "--out", str(out), "--check",
        ]
    )  # fmt: skip
    err = capsys.readouterr().err
    assert code == 130
    assert err.count("\n") == 1 and "0 of 1 configurations predicted" in err
    assert "no checkpoint" not in err
    assert not out.exists()


def _machine(monkeypatch, cores: int, busy: int) -> None:
    """This machine seen as ``cores`` cores with ``busy`` runnable threads of other jobs, and
    a user's environment that sets no thread variable."""
    import deepjimu.plan.setup
    import deepjimu.threads

    monkeypatch.setattr(deepjimu.threads, "available_cores", lambda: cores)
    monkeypatch.setattr(deepjimu.plan.setup, "available_cores", lambda: cores)
    monkeypatch.setattr(deepjimu.threads, "busy_elsewhere", lambda *a, **k: busy)
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)


def _fake_steps(monkeypatch, seconds: list[float], *rounds: list[float]) -> list[int]:
    """The plan's in-process step made instant: each measurement's repeats take ``seconds``
    (the n-th measurement's, ``[seconds, *rounds]``'s n-th, cycled). Returns the threads each
    measurement ran at."""
    import torch

    import deepjimu.measure.compute

    threads: list[int] = []
    each = [seconds, *rounds]

    def step_times(model, x, y, cfg, repeats: int = 15) -> list[float]:
        threads.append(torch.get_num_threads())
        return list(each[(len(threads) - 1) % len(each)])

    monkeypatch.setattr(deepjimu.measure.compute, "step_times", step_times)
    return threads


def _plan_one_worker(tmp_path, monkeypatch, *flags: str) -> None:
    """``jimu plan --cluster probe`` of one worker of a small model, in ``tmp_path``."""
    monkeypatch.chdir(tmp_path)
    argv = ["plan", "--strategies", "local", "--workers", "1", "--models", "mlp:16x1"]
    assert main([*argv, "--out", "p", *flags]) == 0


def test_a_probe_plan_measures_one_worker_as_its_run_would_on_a_busy_machine(
    tmp_path, capsys, monkeypatch
) -> None:
    _machine(monkeypatch, cores=2, busy=1)
    threads = _fake_steps(monkeypatch, [0.001] * 15)
    _plan_one_worker(tmp_path, monkeypatch)
    text = capsys.readouterr().out
    # a one-worker run on 2 cores with another job busy waits passively (issue 48)
    assert (
        "measuring in this process as one worker: 1 worker x 2 threads on 2 cores, 1 other "
        "busy, oversubscribed: OpenMP wait passive (threads: cores / workers, wait: rule)"
    ) in text
    assert threads and set(threads) == {2}  # a step of each batch size the run takes
    assert "OMP_WAIT_POLICY" not in os.environ  # set for torch's load alone
    assert "warning" not in text  # repeats that agree


def test_a_probe_plan_measures_one_worker_at_the_threads_its_run_gets(
    tmp_path, capsys, monkeypatch
) -> None:
    _machine(monkeypatch, cores=2, busy=0)
    threads = _fake_steps(monkeypatch, [0.001] * 15)
    _plan_one_worker(tmp_path, monkeypatch, "--threads", "1")
    text = capsys.readouterr().out
    assert threads and set(threads) == {1}  # --threads 1, not every core
    assert "1 worker x 1 thread on 2 cores: OpenMP wait default (threads: --threads" in text
    cluster = json.loads(Path("p/plan.json").read_text())["cluster"]
    assert cluster["name"].endswith(", 2 cores, 1 thread)")


def test_a_probe_plan_says_in_one_line_that_its_step_timings_disagree(
    tmp_path, capsys, monkeypatch
) -> None:
    _machine(monkeypatch, cores=2, busy=0)
    threads = _fake_steps(monkeypatch, [0.010, 0.011, 0.030])  # another job took the cores once
    _plan_one_worker(tmp_path, monkeypatch)
    warned = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("warning")]
    assert len(threads) == ROUNDS * len(warned) > 0  # one line per figure, not per round
    for line in warned:
        assert line.startswith("warning: the step measured in this process (mlp:16x1, ")
        # (30 - 10) / 11 ms
        assert "took 10 to 30 ms over 3 repeats: a spread of 182% of its median" in line


@pytest.mark.slow
def test_openmp_loads_in_a_probe_plan_with_a_busy_machines_passive_wait(tmp_path) -> None:
    import subprocess
    import sys

    script = (
        "import deepjimu.threads as t\n"
        "t.busy_elsewhere = lambda *a, **k: 1\n"
        "from deepjimu.cli import main\n"
        "raise SystemExit(main(['plan', '--strategies', 'local', '--workers', '1', "
        "'--models', 'mlp:16x1', '--out', 'p']))\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "OMP_NUM_THREADS")}
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True,
        env={**env, "OMP_DISPLAY_ENV": "VERBOSE"}, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    # what torch's libgomp, the first OpenMP to load, read: passive, no spinning at all
    torchs = done.stderr.split("OPENMP DISPLAY ENVIRONMENT END")[0]
    assert "OMP_WAIT_POLICY = 'PASSIVE'" in torchs
    assert "GOMP_SPINCOUNT = '0'" in torchs, torchs


def test_check_of_the_top_also_runs_the_best_one_worker_row_below_and_says_what_it_left(
    tmp_path, capsys, monkeypatch
) -> None:
    import deepjimu.plan.check

    out = tmp_path / "plan"
    seen = _fake_check(monkeypatch, 10, out)
    ran: list[str] = []

    def measure(run_dir: Path) -> dict:
        ran.append(run_dir.name)
        speed = 150.0 if run_dir.name.startswith("ddp-w1") else 100.0
        return {"samples_per_s": speed, "bytes_per_sample": 0.0, "peak_mem_mb": 1.0, "train_s": 1}

    monkeypatch.setattr(deepjimu.plan.check, "measure", measure)
    code = main(
        [
            "plan", "--cluster", str(EXAMPLES / "here-2cores.toml"), "--strategies", "local,ddp",
            "--workers", "1,2", "--models", "mlp:16x2", "--out", str(out), "--check", "1",
        ]
    )  # fmt: skip
    text = capsys.readouterr().out
    assert code == 0, text
    ranked = json.loads((out / "plan.json").read_text())["rows"]
    assert [(r["strategy"], r["workers"]) for r in ranked] == [("local", 1), ("ddp", 1), ("ddp", 2)]
    # the top 1, then the best-ranked row of one worker below it; ddp x2 is not run
    assert len(seen) == 2 and ran == ["local-w1-mlp-16x2", "ddp-w1-mlp-16x2"]
    summary = next(ln for ln in text.splitlines() if ln.startswith("check:"))
    assert "is 33% slower than the measured fastest (ddp x1 mlp:16x2)" in summary
    assert "it ran at 0.667 of the measured fastest's samples/s" in summary
    assert summary.endswith(
        "; only the predicted top 1 and ddp x1 mlp:16x2, the best of one worker below them, "
        "were checked: the ranking of the other 1 is unverified"
    )


@pytest.mark.parametrize("spread", [0.0, 0.4])
def test_predictions_within_half_the_measured_spread_of_the_fastest_are_shown_as_a_tie(
    tmp_path, capsys, monkeypatch, spread: float
) -> None:
    _machine(monkeypatch, cores=2, busy=0)
    # each model's step measured in 3 rounds, their medians 0.8, 1 and 1.2 times each other
    times = [[0.010 * (1 + k * spread / 2)] * 3 for k in (-1, -1, 0, 0, 1, 1)]
    _fake_steps(monkeypatch, *times)
    monkeypatch.chdir(tmp_path)
    argv = ["plan", "--strategies", "local", "--workers", "1", "--models", "mlp:16x1,mlp:32x1"]
    assert main([*argv, "--out", "p"]) == 0
    out = capsys.readouterr().out
    rows = json.loads(Path("p/plan.json").read_text())["rows"]
    ranked = [r for r in rows if r.get("predicted")]
    assert len(ranked) == 2  # the same step measured for both: the same prediction
    if spread:
        assert [r["tie"] for r in ranked] == [pytest.approx(0.2)] * 2
        assert out.count("  = tie") == 2
        assert "= tie: predicted within 20% of the fastest, half the spread" in out
    else:  # repeats that agree: the order is the plan's
        assert not any("tie" in r for r in ranked) and "= tie" not in out


def test_the_plans_own_figures_are_measured_in_interleaved_rounds_and_one_slow_round_loses(
    tmp_path, monkeypatch
) -> None:
    import deepjimu.measure.compute

    _machine(monkeypatch, cores=2, busy=0)
    order: list[tuple[int, int]] = []

    def step_times(model, x, y, cfg, repeats: int = 15) -> list[float]:
        figure = (next(model.parameters()).shape[0], len(x))  # the model's width, the rows
        order.append(figure)
        # the machine in a slow mode for the first round only
        return [0.030] * 3 if order.count(figure) == 1 else [0.010] * 3

    monkeypatch.setattr(deepjimu.measure.compute, "step_times", step_times)
    monkeypatch.chdir(tmp_path)
    argv = ["plan", "--strategies", "local", "--workers", "1", "--models", "mlp:16x1,mlp:32x1"]
    assert main([*argv, "--out", "p"]) == 0
    # a round of each model's steps (a full batch's and the last one's), then the next
    # round of each: interleaved
    first = order[: len(order) // ROUNDS]
    assert {w for w, _ in first} == {16, 32} and order == first * ROUNDS
    rows = json.loads(Path("p/plan.json").read_text())["rows"]
    assert [r["predicted"]["step_s"] for r in rows] == [pytest.approx(0.010)] * 2
    # the rounds' medians (30, 10, 10 ms) spread by 200%: the two rows tie
    assert [r["tie"] for r in rows] == [pytest.approx(1.0)] * 2
