"""Bench results: one row per cell, speedups against a 1-worker baseline, ``results.csv``."""

from __future__ import annotations

import csv
import io
from pathlib import Path
from typing import Any

from deepjimu.atomic import atomic_write_text

__all__ = ["COLUMNS", "add_speedups", "options_text", "read_csv", "write_csv"]

COLUMNS = (
    "strategy",
    "workers",
    "model",
    "options",
    "tuned",
    "status",
    "error",
    "epochs",
    "time_s",
    "fit_s",
    "train_s",
    "eval_s",
    "wall_s",
    "samples_per_s",
    "speedup",
    "speedup_base",
    "test_acc",
    "time_to_target_s",
    "wall_to_target_s",
    "bytes_sent",
    "bytes_per_sample",
    "peak_mem_mb",
    "idle_frac",
    "bubble_theory",
    "run_dir",
)


def options_text(options: tuple[tuple[str, str], ...]) -> str:
    """``lr=0.01 precision=bf16`` (empty for no options)."""
    return " ".join(f"{k.replace('_', '-')}={v}" for k, v in options)


def _baseline(
    rows: list[dict[str, Any]], strategy: str, model: str, options: str
) -> dict[str, Any] | None:
    for row in rows:
        if (
            row["strategy"] == strategy
            and row["model"] == model
            and (row.get("options") or "") == options
            and row["workers"] == 1
            and row["status"] == "ok"
            and row.get("samples_per_s")
        ):
            return row
    return None


def add_speedups(rows: list[dict[str, Any]]) -> None:
    """Set ``speedup`` and ``speedup_base`` of every ok row, in place.

    The speedup is throughput (samples/s) over that of the same strategy, model and options
    with 1 worker; where that run is missing or failed, over ``local`` with 1 worker (same
    model and options); where neither exists, it stays empty. ``speedup_base`` names the
    baseline.

    Example:
        >>> rows = [{"strategy": "local", "model": "m", "workers": 1, "status": "ok", "samples_per_s": 100.0},
        ...         {"strategy": "ddp", "model": "m", "workers": 2, "status": "ok", "samples_per_s": 150.0}]
        >>> add_speedups(rows); rows[1]["speedup"], rows[1]["speedup_base"]
        (1.5, 'local x1')
    """
    for row in rows:
        row["speedup"] = row["speedup_base"] = None
        if row["status"] != "ok" or not row.get("samples_per_s"):
            continue
        opts = row.get("options") or ""
        base = _baseline(rows, row["strategy"], row["model"], opts) or _baseline(
            rows, "local", row["model"], opts
        )
        if base is not None:
            row["speedup"] = row["samples_per_s"] / base["samples_per_s"]
            row["speedup_base"] = f"{base['strategy']} x1"


def _cell_text(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.6g}"
    return str(value)


def write_csv(rows: list[dict[str, Any]], path: Path) -> None:
    """Write ``rows`` to ``path`` (atomically) with the :data:`COLUMNS` header; None is empty."""
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(COLUMNS)
    writer.writerows([_cell_text(row.get(c)) for c in COLUMNS] for row in rows)
    atomic_write_text(path, buf.getvalue())


def read_csv(path: Path) -> list[dict[str, str]]:
    """The rows of a ``results.csv`` as dicts of strings (for tests and later tools)."""
    with open(path, newline="") as f:
        return list(csv.DictReader(f))
