"""signals_interrupt: SIGINT and SIGTERM unwind as Interrupted; with ``once``, only the first."""

from __future__ import annotations

import os
import signal

import pytest

from deepjimu.errors import Interrupted, signals_interrupt


@pytest.fixture
def handlers():
    """Whatever a test does to the handlers, pytest gets its own back."""
    old = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    yield
    for s, h in old.items():
        signal.signal(s, h)


@pytest.mark.usefixtures("handlers")
def test_each_signal_unwinds_and_the_old_handlers_come_back() -> None:
    before = signal.getsignal(signal.SIGTERM)
    with signals_interrupt():
        for sig in (signal.SIGTERM, signal.SIGINT):
            with pytest.raises(Interrupted) as e:
                os.kill(os.getpid(), sig)
            assert e.value.exit_code == 128 + sig
    assert signal.getsignal(signal.SIGTERM) is before


@pytest.mark.usefixtures("handlers")
def test_once_the_clean_up_after_the_first_signal_runs_to_its_end() -> None:
    """A worker that Ctrl-C reached gets its launcher's SIGTERM while it cleans up."""
    cleaned = False
    with pytest.raises(Interrupted) as e, signals_interrupt(once=True):
        try:
            os.kill(os.getpid(), signal.SIGINT)
        finally:
            os.kill(os.getpid(), signal.SIGTERM)  # ignored: the clean-up goes on
            cleaned = True
    assert cleaned and e.value.exit_code == 130
    # and ignored on the way out, after the block, too
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_IGN
    assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
