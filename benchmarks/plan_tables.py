"""BENCHMARKS.md section 13's tables from the plan.json files of ``jimu plan --check``.

Each plan gives one table, its rows in the plan's (predicted) order: predicted and measured
samples/s (the median of the runs; the slowest and fastest run), the error, and the bytes
sent per sample, predicted and measured. Then one table over all plans: per strategy, the
median and worst absolute error, and overall.

Usage::

    jimu plan --models mlp:256x3 --out /tmp/v41 --check --repeats 3
    python benchmarks/plan_tables.py /tmp/v41 [/tmp/v42 ...]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

from deepjimu.units import format_bytes


def _rows(folder: Path) -> list[dict[str, Any]]:
    """The checked rows of ``folder/plan.json`` (one line if it is missing or unreadable)."""
    path = folder / "plan.json"
    try:
        rows = json.loads(path.read_text())["rows"]
    except (OSError, ValueError, KeyError) as e:
        sys.exit(f"error: {path} is not a plan of jimu plan ({e})")
    return [r for r in rows if r.get("error") is not None]


def _label(r: dict[str, Any]) -> str:
    return f"{r['strategy']} x{r['workers']}"


def plan_table(rows: list[dict[str, Any]]) -> str:
    """One plan's markdown table and its median and worst |error|."""
    head = (
        "| configuration | predicted samples/s | measured samples/s (median) | runs: slowest - "
        "fastest | error | predicted sent/sample | measured sent/sample |\n"
        "|---|---|---|---|---|---|---|"
    )
    lines = [head]
    for r in rows:
        p, m = r["predicted"], r["measured"]
        runs = m.get("runs_samples_per_s") or [m["samples_per_s"]]
        lines.append(
            f"| {_label(r)} | {p['samples_per_s']:,.0f} | {m['samples_per_s']:,.0f} | "
            f"{min(runs):,.0f} - {max(runs):,.0f} | {r['error']:+.0%} | "
            f"{format_bytes(p['bytes_per_sample'])} | {format_bytes(m['bytes_per_sample'] or 0)} |"
        )
    errors = [abs(r["error"]) for r in rows]
    lines.append(
        f"\n|error| median **{statistics.median(errors):.0%}**, worst **{max(errors):.0%}**"
    )
    return "\n".join(lines)


def summary_table(rows: list[dict[str, Any]]) -> str:
    """Per strategy over every plan: configurations, median and worst |error|; then all."""
    by: dict[str, list[float]] = {}
    for r in rows:
        by.setdefault(r["strategy"], []).append(abs(r["error"]))
    lines = ["| strategy | configurations | median abs. error | worst |", "|---|---|---|---|"]
    for name, errs in by.items():
        lines.append(f"| {name} | {len(errs)} | {statistics.median(errs):.0%} | {max(errs):.0%} |")
    errs = [abs(r["error"]) for r in rows]
    lines.append(
        f"| **all** | {len(errs)} | **{statistics.median(errs):.0%}** | **{max(errs):.0%}** |"
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("plans", nargs="+", type=Path, help="--out folders of jimu plan --check")
    args = parser.parse_args(argv)
    every = []
    for folder in args.plans:
        rows = _rows(folder)
        if not rows:
            sys.exit(f"error: {folder / 'plan.json'} has no checked configuration")
        print(f"**{folder}**\n\n{plan_table(rows)}\n")
        every += rows
    print(summary_table(every))


if __name__ == "__main__":
    main()
