"""Memory: the machine's available memory, and a run's workers refused where they do not fit their limits."""

from __future__ import annotations

import subprocess
import sys

import pytest

from deepjimu.errors import JimuError
from deepjimu.memory import MARGIN, Limit, available_memory, check_fit
from processes import env

MB = 2**20


def test_available_memory_is_what_the_system_says() -> None:
    available = available_memory()
    assert available is None or available > 100 * MB


def test_workers_that_fit_pass_and_no_limit_is_no_check() -> None:
    check_fit([300 * MB] * 2, [Limit(1000 * MB, "the 1000 MB available", True)])  # 600 of 800
    check_fit([300 * MB] * 64, [])
    check_fit([], [Limit(1, "x", True)])


@pytest.mark.parametrize(
    ("workers", "available", "todo"),
    [(64, 16 * 1024 * MB, "give --workers 43 or fewer"), (1, 100 * MB, "free memory first")],
)
def test_workers_that_do_not_fit_are_one_line_with_what_fits(
    workers: int, available: int, todo: str
) -> None:
    with pytest.raises(JimuError) as e:
        check_fit([300 * MB] * workers, [Limit(available, "the machine", True)])
    msg = str(e.value)
    them = "1 worker needs" if workers == 1 else f"{workers} workers need"
    assert msg.startswith(f"{them} about ") and msg.endswith(f"of the machine; {todo}"), msg
    assert ("300.0 MB each" if workers > 1 else "(300.0 MB: ") in msg and "\n" not in msg


def test_a_split_model_is_charged_its_largest_worker() -> None:
    # four workers of different shares: their sum is checked, the largest named
    with pytest.raises(JimuError) as e:
        check_fit([100 * MB, 400 * MB, 100 * MB, 100 * MB], [Limit(800 * MB, "the box", True)])
    assert "700.0 MB of memory (400.0 MB the largest" in str(e.value)
    assert str(e.value).endswith("free memory first")


def test_a_budget_counts_the_training_state_and_refuses_only_past_the_margin() -> None:
    budget = Limit(100 * MB, "its --memory-limit 100.0 MB", shared=False, state_only=True)
    peaks, states = [500 * MB, 500 * MB], [120 * MB, 125 * MB]
    check_fit(peaks, [budget], states)  # 125 MB is within 30% of 100 MB: the run starts
    with pytest.raises(JimuError) as e:
        check_fit(peaks, [budget], [120 * MB, round(MARGIN * 100 * MB) + 1])
    assert str(e.value).startswith(
        "worker 1 needs about 130.0 MB of memory (predicted: its part of the model, its "
        "optimizer state and activations), more than its --memory-limit 100.0 MB by over "
        "the predictions' 30% margin; give a larger budget"
    ), str(e.value)
    # a limit of the whole process (RLIMIT_AS) is held to the whole peak
    with pytest.raises(JimuError, match=r"worker 0 needs about 500\.0 MB .* and the process"):
        check_fit(peaks, [Limit(300 * MB, "RLIMIT_AS", shared=False)], states)


_FRAGMENTS = """
import sys, torch
from deepjimu.memory import return_freed_memory
def rss():
    return next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmRSS")) >> 10
big = torch.ones(16 << 20, dtype=torch.uint8); del big  # glibc raises its threshold to 16 MiB
if sys.argv[1] == "1":
    return_freed_memory()
blocks = [torch.ones(4 << 20, dtype=torch.uint8) for _ in range(20)]
before = rss()
del blocks[::2]  # every other block freed: 40 MB of holes in the heap
print(before - rss())
"""


@pytest.mark.slow  # starts python processes
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's allocator")
def test_return_freed_memory_hands_freed_blocks_back_to_the_system() -> None:
    def returned(flag: str) -> int:
        r = subprocess.run([sys.executable, "-c", _FRAGMENTS, flag], capture_output=True,
                           text=True, env=env(), timeout=60, check=True)  # fmt: skip
        return int(r.stdout)

    assert returned("0") < 10  # glibc keeps the holes
    assert returned("1") >= 35  # each block had its own mapping, returned when freed
