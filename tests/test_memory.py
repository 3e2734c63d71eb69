"""Memory: the machine's available memory, a worker's estimate, and N workers refused where they do not fit."""

from __future__ import annotations

import pytest

from deepjimu.errors import JimuError
from deepjimu.memory import (
    WORKER_BYTES,
    available_memory,
    check_workers_fit,
    worker_bytes,
)

MB = 2**20


def test_available_memory_is_what_the_system_says() -> None:
    available = available_memory()
    assert available is None or available > 100 * MB


def test_a_worker_is_the_measured_base_plus_its_data_and_four_copies_of_its_model() -> None:
    assert worker_bytes(model_bytes=10 * MB, data_bytes=5 * MB) == WORKER_BYTES + 45 * MB


def test_workers_that_fit_pass_and_unknown_memory_is_not_checked() -> None:
    check_workers_fit(2, 300 * MB, 1000 * MB)  # 600 MB of 800 MB (80%)
    check_workers_fit(64, 300 * MB, None)


@pytest.mark.parametrize(
    ("workers", "available", "todo"),
    [(64, 16 * 1024 * MB, "give --workers 43 or fewer"), (1, 100 * MB, "free memory first")],
)
def test_workers_that_do_not_fit_are_one_line_with_what_fits(
    workers: int, available: int, todo: str
) -> None:
    with pytest.raises(JimuError) as e:
        check_workers_fit(workers, 300 * MB, available)
    msg = str(e.value)
    them = "1 worker needs" if workers == 1 else f"{workers} workers need"
    assert msg.startswith(f"{them} about ") and msg.endswith(f"available; {todo}"), msg
    assert "300.0 MB each" in msg and "\n" not in msg
