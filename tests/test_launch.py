"""The launcher: local workers under torch's elastic agent, torchrun, failing workers, restarts, signals."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from deepjimu.config import RunConfig
from deepjimu.errors import JimuError
from deepjimu.launch import train
from deepjimu.record.folder import latest_checkpoint, lock_run_dir
from disks import small_disk
from processes import descendants, events, fault_flags, params, start, wait_for_epochs

FAST = {"model": "mlp:64x2", "epochs": 8, "quiet": True, "lr": 3e-3}


def _private_tmpdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A TMPDIR of the test's own, for this process and the workers it starts."""
    spill = tmp_path / "tmp"
    spill.mkdir()
    monkeypatch.setenv("TMPDIR", str(spill))
    monkeypatch.setattr(tempfile, "tempdir", str(spill))
    return spill


def _left_behind(spill: Path) -> list[str]:
    """Per-run folders in a TMPDIR (torch's compile cache, torchinductor_*, is shared, kept)."""
    return [p.name for p in spill.iterdir() if p.name.startswith(("torchelastic_", "jimu-"))]


@pytest.mark.slow
def test_ddp_matches_local_accuracy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    spill = _private_tmpdir(tmp_path, monkeypatch)
    local = train(RunConfig(strategy="local", runs_dir=str(tmp_path), name="local", **FAST))
    # even shards: the test is ddp against local, not the split a busy machine measured
    ddp = train(
        RunConfig(
            strategy="ddp", workers=2, balance="even", runs_dir=str(tmp_path), name="ddp", **FAST
        )
    )
    assert local is not None and ddp is not None
    assert ddp["workers"] == 2
    assert abs(ddp["test_acc"] - local["test_acc"]) <= 0.01 + 1e-9, (
        ddp["test_acc"],
        local["test_acc"],
    )
    # ddp really communicates: every gradient of every step, counted in its comm hook
    events = [json.loads(x) for x in (tmp_path / "ddp" / "events.jsonl").read_text().splitlines()]
    n_params = sum(64 * i + 64 for i in (64, 64)) + 64 * 10 + 10
    per_step = 4 * n_params
    steps = events[-1]["step"]
    assert sum(e["bytes_sent_per_rank"][1] for e in events) == per_step * steps
    assert all(e["wait_s"] >= 0 for e in events)
    assert not _left_behind(spill)  # torch elastic's folder of worker files is removed


def test_torchrun_refuses_a_conflicting_worker_count(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(JimuError, match="--workers 3 disagrees with torchrun's WORLD_SIZE 2"):
        train(RunConfig(strategy="ddp", workers=3, runs_dir=str(tmp_path)))
    with pytest.raises(JimuError, match="under torchrun, give torchrun --max-restarts 1 instead"):
        train(RunConfig(strategy="ddp", max_restarts=1, runs_dir=str(tmp_path)))


@pytest.mark.slow
def test_a_worker_error_is_reported_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a diverging ddp run: every worker raises the same JimuError at the same epoch
    spill = _private_tmpdir(tmp_path, monkeypatch)
    cfg = RunConfig(strategy="ddp", workers=2, model="mlp:64x2", epochs=6, lr=1e6, optimizer="sgd",
                    momentum=0.0, quiet=True, runs_dir=str(tmp_path), name="nan")  # fmt: skip
    with pytest.raises(JimuError) as e:
        train(cfg)
    msg = str(e.value)
    assert "\n" not in msg
    # the one that raised first is named
    assert re.match(r"worker [01]: training diverged at epoch \d+: loss is nan; lower --lr", msg), (
        msg
    )
    assert not (tmp_path / "nan" / ".errors").exists()
    assert not _left_behind(spill)


_SAME = ("step", "epoch", "loss", "train_acc", "test_acc", "bytes_sent")


@pytest.mark.slow
@pytest.mark.parametrize("launcher", ["torchrun", "jimu"])
def test_after_a_kill_restarted_workers_rejoin_and_finish_the_run(
    tmp_path: Path, uninterrupted: Callable[[str, int], Path], launcher: str
) -> None:
    """torchrun --max-restarts 1 (and our launcher's --max-restarts 1): kill rank 1 mid-run;
    the whole group restarts, rejoins and goes on from the latest checkpoint."""
    run = tmp_path / "r"
    argv = [
        "train",
        "--strategy",
        "ddp",
        *fault_flags("ddp"),
        "--runs-dir",
        str(tmp_path),
        "--name",
        "r",
    ]
    if launcher == "torchrun":  # its per-worker files in the test's folder, not in TMPDIR
        logs = ["--log-dir", str(tmp_path / "torchrun")]
        proc = start(argv, ["--standalone", "--nproc-per-node", "2", "--max-restarts", "1", *logs])
    else:
        proc = start([*argv, "--workers", "2", "--max-restarts", "1"])
    try:
        wait_for_epochs(run, 2, proc)
        workers = _workers(proc.pid)
        assert len(workers) == 2, workers
        os.kill(max(workers), signal.SIGKILL)  # started second: rank 1
        _, err = proc.communicate(timeout=240)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 0, err[-3000:]
    assert "connectFullMesh" not in err
    ref, got = events(uninterrupted("ddp", 2)), events(run)
    assert [[e[k] for k in _SAME] for e in got] == [[e[k] for k in _SAME] for e in ref]
    times = [e["time_s"] for e in got]
    assert times == sorted(times)
    (resumed,) = [e["resumed"] for e in got if "resumed" in e]
    assert resumed["by"] == "restart 1" and resumed["step"] >= got[0]["step"]
    summary = json.loads((run / "summary.json").read_text())
    assert (summary["workers"], summary["strategy"], summary["epochs"]) == (2, "ddp", 8)
    full, restarted = params(uninterrupted("ddp", 2)), params(run)
    for k in full:
        assert torch.equal(full[k], restarted[k]), k


def _workers(pid: int) -> list[int]:
    """The worker processes below ``pid``: torchrun's run ``deepjimu train``, ours are spawned."""
    out = []
    for p in descendants(pid):
        try:
            cmd = Path(f"/proc/{p}/cmdline").read_bytes()
        except OSError:
            continue
        if b"spawn_main" in cmd or (b"deepjimu\0train" in cmd and b"distributed.run" not in cmd):
            out.append(p)
    return out


def test_under_torchrun_a_job_claims_its_run_folder_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As torchrun starts rank 0 of a one-process job (the job's store is torchrun's agent's)."""
    job = torch.distributed.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    env = {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1",
           "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(job.port),
           "TORCHELASTIC_USE_AGENT_STORE": "True", "TORCHELASTIC_RESTART_COUNT": "0"}  # fmt: skip
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    cfg = RunConfig(strategy="local", model="mlp:8x1", epochs=2, checkpoint_every=1, quiet=True,
                    threads=1, runs_dir=str(tmp_path), name="t")  # fmt: skip
    with lock_run_dir(tmp_path / "t"), pytest.raises(JimuError, match="in use by another run"):
        train(cfg)  # another run holds the folder
    assert train(cfg) is not None
    # torchrun restarts this job's group: it goes on in the folder the job claimed
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")
    assert train(RunConfig(**{**cfg.to_dict(), "epochs": 3})) is not None
    got = events(tmp_path / "t")
    assert [e["epoch"] for e in got] == [1, 2, 3] and got[2]["resumed"]["by"] == "restart 1"
    # a later job with the same name never claimed it: refused, whatever its restart count
    later = torch.distributed.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    monkeypatch.setenv("MASTER_PORT", str(later.port))
    with pytest.raises(JimuError, match="already holds a run; pick another --name or --resume"):
        train(cfg)
    assert len(events(tmp_path / "t")) == 3


@pytest.mark.slow
@pytest.mark.parametrize(
    ("sig", "strategy", "workers"), [(signal.SIGINT, "ddp", 2), (signal.SIGTERM, "local", 1)]
)
def test_a_signal_ends_every_worker_and_the_run_in_one_line(
    tmp_path: Path, sig: signal.Signals, strategy: str, workers: int
) -> None:
    """Ctrl-C reaches the whole process group (here: the agent and its workers); SIGTERM
    (kill, a scheduler) only the launcher (here: one worker in the launcher's process)."""
    run = tmp_path / "s"
    argv = ["train", "--strategy", strategy, "--workers", str(workers)]
    argv += fault_flags(strategy, epochs=100000)
    proc = start([*argv, "--runs-dir", str(tmp_path), "--name", "s"])
    try:
        wait_for_epochs(run, 2, proc)
        below = descendants(proc.pid)
        (os.killpg if sig == signal.SIGINT else os.kill)(proc.pid, sig)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 128 + sig, err[-3000:]
    lines = [x for x in err.splitlines() if x.strip()]
    found = latest_checkpoint(run)
    assert found is not None, "the last checkpoint is kept"
    assert lines == [
        f"error: stopped by {sig.name}; every worker ended; last checkpoint: {found[0]} "
        f"(go on with: jimu train --resume {run})"
    ], err[-3000:]
    deadline = time.time() + 5  # a worker may still be in its exit (the kernel frees it)
    while (left := [p for p in below if _alive(p)]) and time.time() < deadline:
        time.sleep(0.05)
    assert not left, f"left behind: {[_cmd(p) for p in left]}"
    with lock_run_dir(run):  # and the folder is free
        pass


@pytest.mark.slow
@pytest.mark.parametrize("how", ["ctrl-c", "kill -9 rank 0", "kill -9 rank 1"])
def test_with_the_progress_bar_a_stopped_run_still_ends_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    """Not quiet: the bar's line is ended, and nothing follows the one line (no torch
    log of the workers it stops, no resource tracker warning); admm's kept batches, whose
    files are unnamed, leave nothing in TMPDIR even from a worker killed by SIGKILL."""
    spill = _private_tmpdir(tmp_path, monkeypatch)
    run = tmp_path / "b"
    argv = ["train", "--strategy", "admm", "--workers", "2", "--admm-batch", "100"]
    argv += [a for a in fault_flags("admm", epochs=100000) if a != "--quiet"]
    proc = start([*argv, "--runs-dir", str(tmp_path), "--name", "b"])
    try:
        wait_for_epochs(run, 2, proc)
        workers = sorted(_workers(proc.pid))
        assert len(workers) == 2, workers
        if how == "ctrl-c":
            os.killpg(proc.pid, signal.SIGINT)
        else:  # in pid order: rank 0, whose bar it is, started first
            os.kill(workers[int(how[-1])], signal.SIGKILL)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    # a line glued to the bar's ("admm: ...]error: ...") is dropped here with the bar's
    lines = [x for x in re.split(r"[\r\n]", err) if x.strip() and not x.startswith("admm:")]
    assert len(lines) == 1 and err.splitlines()[-1] == lines[0], err[-3000:]
    if how == "ctrl-c":
        assert lines[0].startswith("error: stopped by SIGINT; every worker ended"), lines
        assert not (run / ".errors").exists(), "no worker's record of the interrupt is kept"
    else:  # and what the run kept (the run may be killed before its first checkpoint)
        assert lines[0].startswith(
            f"error: worker {how[-1]} died (killed by SIGKILL) without reporting an error; "
        ), lines
        assert lines[0].endswith((f"(go on with: jimu train --resume {run})", "checkpoint yet"))
    assert not _left_behind(spill)


def _alive(pid: int) -> bool:
    """Whether ``pid`` still runs (a zombie is dead; it waits for its parent to reap it)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _cmd(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()[:200]
    except OSError:
        return "?"


def test_after_restarts_the_last_attempts_errors_explain_the_failure(tmp_path: Path) -> None:
    from deepjimu.launch import _failure_line
    from deepjimu.worker import error_dir

    def record(rank: int, attempt: int, message: str) -> None:
        rec = {"rank": rank, "attempt": attempt, "time": attempt, "user_error": True,
               "message": message, "traceback": message}  # fmt: skip
        path = error_dir(tmp_path) / f"rank{rank}.json"
        path.parent.mkdir(exist_ok=True)
        path.write_text(json.dumps(rec))

    record(0, 0, "an error of the first attempt")  # rank 0 did not report again
    record(1, 1, "the error that ended the run")
    assert _failure_line(tmp_path, RuntimeError()) == "worker 1: the error that ended the run"


@pytest.mark.slow
@pytest.mark.parametrize("fills", ["the checkpoint", "the events"])
def test_a_full_disk_is_one_line_naming_it_and_leaves_no_debris(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fills: str
) -> None:
    """Two workers on a 200 KB tmpfs: the final checkpoint (2.4 MB) finds no room, or with the
    disk nearly full beforehand the first event and then every error record find none."""
    spill = _private_tmpdir(tmp_path, monkeypatch)
    with small_disk(tmp_path / "disk", "200k") as disk:
        if fills == "the events":  # room for .lock and config.json alone (a 4 KB page each)
            (disk / "filler").write_bytes(bytes(200 * 1024 - 8192))
        run = disk / "r"
        cfg = RunConfig(
            strategy="ddp", workers=2, epochs=2, quiet=True, runs_dir=str(disk), name="r"
        )
        with pytest.raises(JimuError) as e:
            train(cfg)
        msg = str(e.value)
        assert f"no space left on the disk of {run}" in msg and "\n" not in msg, msg
        assert msg.endswith(
            "(no earlier checkpoint)"
            if fills == "the checkpoint"
            else "pick a --runs-dir on a disk with room"
        ), msg
        assert not (run / ".errors").exists() and not (run / "checkpoint").exists()
    assert not _left_behind(spill)


def test_a_failed_worker_without_a_record_is_explained_by_its_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from types import SimpleNamespace

    from deepjimu.launch import _failure_line
    from deepjimu.worker import UNREPORTED_EXIT

    failed = RuntimeError("ChildFailedError")
    failed.failures = {1: SimpleNamespace(exitcode=UNREPORTED_EXIT)}  # type: ignore[attr-defined]
    gone = tmp_path / "gone"
    assert _failure_line(gone, failed) == (
        f"run folder {gone} was removed while the run was going; start the run again"
    )
    assert not gone.exists(), "nothing written back into a removed folder"
    head = f"worker 1 failed and could not write its error record in {tmp_path}"
    free = shutil.disk_usage(tmp_path).free
    if free >= 2**20:
        assert _failure_line(tmp_path, failed).startswith(f"{head} (")
    monkeypatch.setattr(shutil, "disk_usage", lambda p: SimpleNamespace(free=0))
    assert _failure_line(tmp_path, failed) == (
        f"{head}: no space left on the disk of {tmp_path} (0 B free); free space there or "
        "pick a --runs-dir on a disk with room"
    )


def test_a_worker_that_died_without_an_error_says_how_to_go_on(tmp_path: Path) -> None:
    from types import SimpleNamespace

    from deepjimu.launch import _failure_line

    killed = RuntimeError("ChildFailedError")
    killed.failures = {1: SimpleNamespace(exitcode=-signal.SIGKILL)}  # type: ignore[attr-defined]
    died = "worker 1 died (killed by SIGKILL) without reporting an error"
    assert _failure_line(tmp_path, killed) == f"{died}; {tmp_path} has no checkpoint yet"
    ckpt = tmp_path / "checkpoint" / "step-00000004"
    ckpt.mkdir(parents=True)
    (ckpt / "meta.json").write_text(json.dumps({"step": 4, "epoch": 2, "world": 2}))
    (tmp_path / "checkpoint" / "latest").write_text(ckpt.name)
    assert _failure_line(tmp_path, killed) == (
        f"{died}; last checkpoint: {ckpt} (go on with: jimu train --resume {tmp_path})"
    )


def test_a_new_run_in_a_failed_run_s_folder_shows_none_of_its_errors(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = tmp_path / "r"
    run.mkdir()
    (run / "worker-errors.log").write_text("--- rank 0\nan old run's traceback")  # no events
    monkeypatch.setenv("OMP_WAIT_POLICY", "PASSIVE")  # the worker runs in this process
    cfg = RunConfig(strategy="local", model="mlp:16x1", epochs=1, quiet=True, omp_wait="passive",
                    runs_dir=str(tmp_path), name="r")  # fmt: skip
    assert train(cfg) is not None
    assert not (run / "worker-errors.log").exists()
    for name in ("config.json", "summary.json", "events.jsonl"):  # the user's umask, 022 here
        assert (run / name).stat().st_mode & 0o777 == 0o666 & ~_umask(), name


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def test_more_workers_than_the_memory_holds_are_refused_before_any_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from deepjimu import preflight
    from deepjimu.threads import plan_threads

    monkeypatch.setattr(preflight, "available_memory", lambda: 900 * 2**20)
    cfg = RunConfig(
        strategy="ddp", workers=3, epochs=1, quiet=True, runs_dir=str(tmp_path), name="m"
    )
    with pytest.raises(JimuError) as e:
        train(cfg, plan_threads(3, cores=2, busy=0))
    assert re.fullmatch(
        r"3 workers need about 9\d\d\.\d MB of memory \(3\d\d\.\d MB each: a process with torch "
        r"loaded, the data and its part of the model\), more than 80% of the 900\.0 MB "
        r"available; give --workers 2 or fewer",
        str(e.value),
    ), str(e.value)
    assert not (tmp_path / "m").exists(), "refused before the run folder exists"
    # more workers than cores: said once, as a warning, before anything else
    assert capsys.readouterr().err == (
        "warning: 3 workers on 2 cores take turns on them, each slower than alone; "
        "--workers 2 gives each worker a core\n"
    )


def test_a_probe_runs_in_a_folder_named_as_a_probe(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from deepjimu import launch

    seen = []

    def workers(cfg: RunConfig, out_dir: Path, plan: object, job: str, *_: object) -> dict:
        seen.append((out_dir, job))
        return {"probe": {}, "choice": "none", "text": ""}

    monkeypatch.setattr(launch, "_run_workers", workers)
    launch.probe(RunConfig(strategy="local", workers=2, quiet=True, runs_dir=str(tmp_path)))
    ((out_dir, job),) = seen
    assert re.fullmatch(r"probe-ddp-digits-\d{8}-\d{6}", out_dir.name) and job == "probe"


def test_data_the_launcher_cannot_save_is_read_by_each_worker_and_leaves_no_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from deepjimu import launch
    from deepjimu.data import DataOptions, load_dataset

    data = load_dataset("synthetic", DataOptions(synthetic_n=100))
    assert launch._saved(data, tmp_path / "data.pt") == str(tmp_path / "data.pt")

    def full_disk(obj: object, f: str) -> None:  # torch's writer, out of room half way
        Path(f).write_bytes(b"half")
        raise RuntimeError("PytorchStreamWriter failed writing file data/0: file write failed")

    monkeypatch.setattr(torch, "save", full_disk)
    assert launch._saved(data, tmp_path / "again.pt") is None
    assert not (tmp_path / "again.pt").exists()
