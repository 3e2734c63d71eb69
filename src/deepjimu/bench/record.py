"""A bench's record in its folder: its options and tuning (``bench.json``), and what ``--resume`` reads back from it."""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path
from typing import Any

from deepjimu.atomic import atomic_write_text
from deepjimu.bench.flags import Options
from deepjimu.bench.matrix import Cell
from deepjimu.bench.options import BenchOptions, bench_options, option_text
from deepjimu.bench.results import read_csv
from deepjimu.bench.runner import measure
from deepjimu.bench.tune import Trial, Tuning
from deepjimu.config import ConfigErrors
from deepjimu.errors import JimuError

__all__ = ["RECORD", "read_back", "recorded_tunings", "resumed", "write_record"]

RECORD = "bench.json"
"""The bench's options and tuning choices, in its folder: what ``--resume`` goes on with."""


def resumed(args: argparse.Namespace) -> BenchOptions:
    """The options of the bench in ``--resume DIR``, checked against the ones given now.

    Raises:
        JimuError: DIR holds no bench record; ConfigErrors: one line per option given that
            differs from the record (only ``--timeout`` and the target may change).
    """
    out = Path(args.resume)
    path = out / RECORD
    if not path.exists():
        raise JimuError(
            f"--resume {out}: {path} does not exist (not a bench folder, or one from a "
            "deepjimu without --resume); start a new bench"
        )
    try:
        recorded = BenchOptions.from_dict(json.loads(path.read_text())["options"])
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise JimuError(f"--resume {out}: {path} cannot be read: {e}") from None
    if args.name is not None or args.bench_dir is not None:
        raise JimuError(f"--resume {out} names the bench folder; leave out --name and --bench-dir")
    recorded = dataclasses.replace(recorded, name=out.name, bench_dir=out.parent)
    asked = bench_options(args, recorded)
    problems = []
    for f in dataclasses.fields(BenchOptions):
        if f.name in ("timeout", "target_acc", "target_loss", "flags"):  # none changes a run
            continue
        was, now = getattr(recorded, f.name), getattr(asked, f.name)
        if was != now:
            flag = "--" + f.name.replace("_", "-")
            problems.append(
                f"--resume {out}: {flag} {option_text(now)} differs from the bench's {option_text(was)} "
                f"({path}); a resumed bench runs the matrix it recorded"
            )
    for k, v in asked.flags.items():
        if recorded.flags.get(k) != v:
            problems.append(
                f"--resume {out}: --{k.replace('_', '-')} {v} differs from the bench's "
                f"{recorded.flags.get(k, 'default')} ({path}); a resumed bench runs the matrix "
                "it recorded"
            )
    if problems:
        raise ConfigErrors(problems)
    return asked


def write_record(opts: BenchOptions, tunings: list[Tuning] | None) -> None:
    """Write the bench's record (:data:`RECORD`): its options, and its tuning once done."""
    record = {
        "options": opts.to_dict(),
        "tunings": None if tunings is None else [dataclasses.asdict(t) for t in tunings],
    }
    atomic_write_text(opts.out_dir / RECORD, json.dumps(record, indent=2) + "\n")


def recorded_tunings(out: Path) -> list[Tuning] | None:
    """The tuning a resumed bench already did (None: it had not finished tuning)."""
    saved = json.loads((out / RECORD).read_text()).get("tunings")
    if saved is None:
        return None

    def options(pairs: list[list[str]]) -> Options:
        return tuple((k, v) for k, v in pairs)

    return [
        Tuning(
            t["strategy"],
            t["model"],
            options(t["options"]),
            t["workers"],
            [
                Trial(options(x["setting"]), x["status"], x["val_acc"], x["error"])
                for x in t["trials"]
            ],
        )
        for t in saved
    ]


def read_back(cells: list[Cell], rows: list[dict[str, Any]], out: Path) -> int:
    """Fill the rows of the configurations that a stopped bench finished (ok in its
    ``results.csv``) from their run folders; the number read back. A run whose folder no
    longer reads is run again."""
    path = out / "results.csv"
    if not path.exists():
        return 0
    key = ("strategy", "workers", "model", "options")
    done = {tuple(r[k] or "" for k in key): r for r in read_csv(path) if r["status"] == "ok"}
    n = 0
    for cell, row in zip(cells, rows, strict=True):
        prev = done.get(tuple(str(row[k] or "") for k in key))
        if row["status"] != "pending" or prev is None:
            continue
        run_dir = out / "runs" / cell.name  # the folder as it is now, wherever the bench moved
        try:
            figures = measure(run_dir)
        except JimuError:
            continue
        row.update(
            status="ok",
            error="",
            wall_s=float(prev["wall_s"]) if prev["wall_s"] else None,
            run_dir=str(run_dir),
            log=str(out / "logs" / f"{cell.name}.stderr.log"),
            **figures,
        )
        n += 1
    return n
