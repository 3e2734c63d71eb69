"""The event log: metrics and counters merged over ranks, rank 0's file, a resumed history, a full disk, the bar."""

from __future__ import annotations

import errno
import io
import json
import math
from pathlib import Path
from typing import Any

import pytest
import torch

from deepjimu import atomic
from deepjimu.bookkeeping import Bookkeeping
from deepjimu.counters import Counters
from deepjimu.errors import JimuError
from deepjimu.record.events import EventLog, merge_event
from distributed import distributed_test


def _report(rank: int, clocks: tuple[float, ...] = (0.0,) * 4, **kw: object) -> dict:
    base = {"metrics": {}, "delta": [0.0] * 4, "kinds": {}, "mem": 1.0, "samples": 0}
    readings = dict(zip(("time_s", "fit_s", "train_s", "eval_s"), clocks, strict=True))
    return {**base, "train": 0.0, "clocks": readings, "samples_total": 0, **kw}


def test_merge_takes_each_metric_from_the_lowest_rank_that_has_it() -> None:
    gathered = [
        _report(0, (12.3456789, 10.0, 4.0, 1.0), metrics={"loss": None, "test_acc": 0.5},
                delta=[10, 1, 0.2, 0.1], samples=40, train=0.5, samples_total=400),
        _report(1, (12.5, 10.2, 4.5, 1.1), metrics={"loss": torch.tensor(1.25), "x": float("nan")},
                delta=[5, 2, 0.3, 0.05], kinds={"a": 5}, train=0.6, samples_total=400),
    ]  # fmt: skip
    event = merge_event(3, 1, gathered)
    assert (event["step"], event["epoch"], event["time_s"]) == (3, 1, 12.345679)
    assert (event["loss"], event["test_acc"], event["x"]) == (1.25, 0.5, "nan")
    assert (event["bytes_sent"], event["bytes_recv"]) == (15, 3)
    assert event["bytes_sent_per_rank"] == [10, 5] and event["bytes_sent_by_kind"] == {"a": 5}
    assert (event["compute_s"], event["wait_s"]) == (0.3, 0.1), "the critical path: the largest"
    clocks = [event[k] for k in ("time_s", "fit_s", "train_s", "eval_s", "samples")]
    assert clocks == [12.345679, 10.0, 4.0, 1.0, 400], "one clock: rank 0's readings"
    assert event["samples_per_s"] == 80.0  # rank 0's samples over its training time
    assert event["val_acc"] is None and not math.isnan(event["peak_mem_mb_per_rank"][0])


def test_rank_0_writes_and_a_resume_drops_the_later_events(tmp_path: Path) -> None:
    log = EventLog(tmp_path, True, True, Counters(torch.device("cpu")), Bookkeeping(1))
    for step in (1, 2, 3):
        log.log(step, step, loss=0.5)
    with open(tmp_path / "events.jsonl", "a") as f:
        f.write('{"step": 4, "ep')  # a line cut short by a crash
    assert log.drop_after(2) == (1, True)  # step 3, and the torn line apart
    log.note_resumed({"step": 2})
    assert log.log(3, 3)["resumed"] == {"step": 2}
    assert "resumed" not in log.log(4, 4), "only the first event after the resume"
    events = [json.loads(x) for x in (tmp_path / "events.jsonl").read_text().splitlines()]
    assert [e["step"] for e in events] == [1, 2, 3, 4]


@pytest.mark.slow
@distributed_test(world_size=[2, 3])
def test_every_rank_reports_and_rank_0_alone_writes(rank: int, world: int, tmp: str) -> None:
    counters = Counters(torch.device("cpu"))
    log = EventLog(Path(tmp), rank == 0, True, counters, Bookkeeping(world))
    counters.comm.count(sent=10 * (rank + 1), recv=rank)
    event = log.log(1, 1, samples=8, loss=0.25 if rank == world - 1 else None, rank=rank)
    assert event["bytes_sent_per_rank"] == [10 * (r + 1) for r in range(world)]
    assert event["bytes_recv"] == sum(range(world)) and event["loss"] == 0.25
    assert event["rank"] == 0, "a metric every rank gives is rank 0's"
    Bookkeeping(world).barrier()
    lines = (Path(tmp) / "events.jsonl").read_text().splitlines()
    assert [json.loads(x)["bytes_sent"] for x in lines] == [event["bytes_sent"]]


def test_the_progress_bar_starts_once(tmp_path: Path, capsys) -> None:
    log = EventLog(tmp_path, True, False, Counters(torch.device("cpu")), Bookkeeping(1))
    log.progress(3, "local")
    log.progress_at(0)  # a run from the start: the bar is already there
    assert capsys.readouterr().err.count("0/3") == 1
    log.progress_at(2)  # a resumed run: the bar moves on
    assert "2/3" in capsys.readouterr().err
    log.close()


def test_an_event_that_finds_no_room_is_one_line_and_no_half_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = EventLog(tmp_path, True, True, Counters(torch.device("cpu")), Bookkeeping(1))
    log.log(1, 1, loss=0.5)
    before = (tmp_path / "events.jsonl").read_text()

    class Full(io.FileIO):  # the disk fills up halfway through the line
        def write(self, b: Any) -> int:
            super().write(bytes(b)[: len(b) // 2])
            raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(
        atomic, "open", lambda path, mode, buffering: Full(path, "a"), raising=False
    )
    with pytest.raises(JimuError) as e:
        log.log(2, 2, loss=0.25)
    assert str(e.value).startswith(
        f"cannot write {tmp_path / 'events.jsonl'}: no space left on the disk of {tmp_path} ("
    )
    assert (tmp_path / "events.jsonl").read_text() == before
