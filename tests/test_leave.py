"""deepjimu.leave: a process that ran a process group exits with its code, output flushed,
and without Python's shutdown (where gloo's threads can abort it)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from processes import env

# every test here starts processes (workers, a CLI run) or trains whole runs
pytestmark = pytest.mark.slow


def run(body: str) -> subprocess.CompletedProcess[str]:
    """``body`` in a fresh interpreter, after an atexit hook that prints ``shutdown ran``."""
    code = "import atexit, sys\nfrom deepjimu.leave import group_started, leave, leave_at_exit\n"
    code += "atexit.register(print, 'shutdown ran')\nprint('out', end='')\n"
    code += textwrap.dedent(body)
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env(), timeout=60
    )


@pytest.mark.parametrize("code", [0, 3, 130])
def test_after_a_group_leave_skips_the_shutdown_and_keeps_code_and_output(code: int) -> None:
    done = run(f"group_started()\nleave({code})\n")
    assert (done.returncode, done.stdout) == (code, "out")


def test_without_a_group_leave_is_sys_exit() -> None:
    done = run("leave(4)\n")
    assert (done.returncode, done.stdout) == (4, "outshutdown ran\n")


def test_leave_at_exit_takes_over_someone_elses_sys_exit() -> None:
    done = run("group_started()\nleave_at_exit(5)\nsys.exit(0)\n")
    assert (done.returncode, done.stdout) == (5, "out")
    assert run("leave_at_exit(5)\nsys.exit(0)\n").returncode == 0  # no group: nothing to skip
