"""Counters: intervals of bytes and time, compute apart from wait, and their state across a checkpoint."""

from __future__ import annotations

import time

import pytest
import torch

from deepjimu.counters import Counters


def test_an_interval_holds_what_happened_since_the_last_one() -> None:
    c = Counters(torch.device("cpu"))
    c.comm.count(sent=100, recv=40)
    c.comm.count(sent=30, kind="kfac_factors")
    first = c.interval()
    assert first.delta[:2] == [130.0, 40.0] and first.kinds == {"kfac_factors": 30}
    c.comm.count(sent=5, kind="kfac_factors")
    second = c.interval()
    assert second.delta[:2] == [5.0, 0.0] and second.kinds == {"kfac_factors": 5}
    assert c.stats.bytes_sent == 135, "the totals keep counting"


def test_training_time_splits_into_compute_and_wait() -> None:
    c = Counters(torch.device("cpu"))
    with c.training():
        time.sleep(0.03)
        c.stats.wait_s += 0.01  # as if Comm had waited 10 ms inside the block
    with c.evaluation():
        time.sleep(0.01)
    interval = c.interval(samples=7)
    assert interval.train_s >= 0.03 and 0.01 <= interval.clocks["eval_s"] < 0.03
    _, _, compute, wait = interval.delta
    assert wait == 0.01 and abs(compute + wait - interval.train_s) < 1e-9
    again = c.interval()
    assert (again.train_s, again.samples) == (0.0, 0), "each interval starts from zero"
    assert again.clocks["train_s"] == interval.clocks["train_s"] and again.samples_total == 7


def test_time_set_aside_in_training_counts_as_evaluation() -> None:
    c = Counters(torch.device("cpu"))
    t0 = time.perf_counter()
    with c.training():
        time.sleep(0.02)
        with c.aside():
            time.sleep(0.04)
    wall = time.perf_counter() - t0
    clocks = c.clocks()
    assert clocks["eval_s"] >= 0.04 and clocks["train_s"] >= 0.02
    assert clocks["train_s"] + clocks["eval_s"] <= wall  # each second counted once
    assert abs(c.stats.compute_s - clocks["train_s"]) < 1e-9  # compute is training's
    with c.aside():  # outside training: an evaluation block
        time.sleep(0.01)
    after = c.clocks()
    assert after["eval_s"] >= clocks["eval_s"] + 0.01 and after["train_s"] == clocks["train_s"]
    t0 = time.perf_counter()
    with c.evaluation(), c.aside():  # inside evaluation: part of it, counted once
        time.sleep(0.01)
    assert 0.01 <= c.clocks()["eval_s"] - after["eval_s"] <= time.perf_counter() - t0
    with c.training():  # the next training block sets nothing aside from the last
        time.sleep(0.01)
    assert c.clocks()["train_s"] >= clocks["train_s"] + 0.01


def test_clocks_never_count_a_second_twice() -> None:
    c = Counters(torch.device("cpu"))
    c.begin_fit()
    with c.training():
        time.sleep(0.01)
    with c.evaluation():
        time.sleep(0.01)
    clocks = c.clocks()
    # within a microsecond: this VM's monotonic clock was seen 40 ns behind itself when a
    # process moved between cores, and a second counted twice would be 10 ms over
    tick = 1e-6
    assert clocks["train_s"] + clocks["eval_s"] <= clocks["fit_s"] + tick
    assert clocks["fit_s"] <= clocks["time_s"] + tick
    with c.training(), pytest.raises(RuntimeError, match="do not nest"), c.evaluation():
        pass


def test_state_and_go_on_continue_the_counts_and_clocks() -> None:
    c = Counters(torch.device("cpu"))
    c.comm.count(sent=8, recv=2, kind="x")
    c.interval()
    c.comm.count(sent=1)
    c.train_s += 0.5
    c.begin_fit()
    again = Counters(torch.device("cpu"))
    again.go_on(c.state(), time_s=100.0, fit_s=50.0)
    assert again.stats.bytes_sent == 9 and again.stats.sent_by_kind == {"x": 8}
    assert again.elapsed() >= 100.0 and again.fit_s() == 50.0
    interval = again.interval()
    assert interval.delta[:2] == [1.0, 0.0] and interval.train_s == 0.5
    assert interval.clocks["train_s"] == 0.5
    fresh = Counters(torch.device("cpu"))
    fresh.go_on(None, time_s=7.0, fit_s=3.0)  # a checkpoint without counters: only the clocks
    assert fresh.stats.bytes_sent == 0 and fresh.elapsed() >= 7.0
