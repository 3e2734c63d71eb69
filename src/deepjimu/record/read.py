"""Reading a run folder back: its events (a last line cut short by a crash left out), summary and options, and figures of them."""

from __future__ import annotations

import json
import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from deepjimu.errors import JimuError

__all__ = [
    "ACCURACY",
    "VAL_LOSS",
    "Metric",
    "best_validation",
    "check_targets",
    "finite_number",
    "first_reaching",
    "read_config",
    "read_event_log",
    "read_events",
    "read_json",
    "read_summary",
    "train_time_to",
]


def read_json(path: Path) -> dict[str, Any]:
    """The JSON object in ``path``.

    Raises:
        JimuError: the file cannot be read, is not JSON or holds no object (one line).
    """
    try:
        value = json.loads(path.read_text())
    except OSError as e:
        raise JimuError(f"{path} cannot be read: {e.strerror}") from None
    except ValueError as e:
        raise JimuError(f"{path} is not valid JSON: {e}") from None
    if not isinstance(value, dict):
        raise JimuError(f"{path} must hold a JSON object (got {type(value).__name__})")
    return value


def read_event_log(run_dir: Path) -> tuple[list[dict[str, Any]], str | None]:
    """The events of a run folder, and a note if the last line was cut short.

    A worker appends each event as one line ending in a newline; a last line without its
    newline that is not valid JSON was being written when the run stopped (a crash, a full
    disk). It is left out, and the note (one line, None if the file is whole) says so.

    Raises:
        JimuError: as :func:`read_events`.
    """
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise JimuError(f"run folder {run_dir} does not exist")
    path = run_dir / "events.jsonl"
    if not path.exists():
        raise JimuError(f"{path} does not exist (has the run logged an epoch yet?)")
    try:
        text = path.read_text()
    except OSError as e:
        raise JimuError(f"{path} cannot be read: {e.strerror}") from None
    lines = text.splitlines()
    events, torn = [], None
    for i, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            event = json.loads(line)
        except ValueError as e:
            if i == len(lines) and not text.endswith("\n"):
                torn = f"{path} line {i} was cut short while being written; left out"
                break
            raise JimuError(f"{path} line {i} is not valid JSON: {e}") from None
        if not isinstance(event, dict):
            raise JimuError(f"{path} line {i} must be a JSON object (got {line.strip()[:40]!r})")
        events.append(event)
    return events, torn


def read_events(run_dir: Path) -> list[dict[str, Any]]:
    """The events of a run folder, one dict per line of ``events.jsonl``.

    A last line cut short by a crash is left out with a one-line warning on stderr
    (see :func:`read_event_log`).

    Args:
        run_dir: a run folder (``runs/<name>``).

    Returns:
        the events in file order (blank lines skipped).

    Raises:
        JimuError: the folder or ``events.jsonl`` is missing, or a line other than a torn
            last one is not a JSON object (the message names the file and line).

    Example:
        >>> read_events(Path("runs/ddp-digits-20250101-120000"))[-1]["test_acc"]  # doctest: +SKIP
        0.975
    """
    events, torn = read_event_log(run_dir)
    if torn:
        print(f"warning: {torn}", file=sys.stderr)
    return events


def best_validation(events: list[dict[str, Any]]) -> dict[str, Any]:
    """The event with the best validation accuracy, as the graph literature reports results.

    Returns:
        ``best_val_acc``, ``best_val_epoch`` (the earliest epoch that reached it) and
        ``test_acc_at_best_val`` (that event's test accuracy); empty when no event has a
        validation accuracy (e.g. ``--val-fraction 0``).

    Example:
        >>> best_validation([{"epoch": 1, "val_acc": 0.7, "test_acc": 0.68},
        ...                  {"epoch": 2, "val_acc": 0.8, "test_acc": 0.79},
        ...                  {"epoch": 3, "val_acc": 0.8, "test_acc": 0.81}])
        {'best_val_acc': 0.8, 'best_val_epoch': 2, 'test_acc_at_best_val': 0.79}
    """
    scored = [e for e in events if isinstance(e.get("val_acc"), (int, float))]
    if not scored:
        return {}
    best = max(scored, key=lambda e: e["val_acc"])  # max keeps the first of equals
    return {
        "best_val_acc": best["val_acc"],
        "best_val_epoch": best.get("epoch"),
        "test_acc_at_best_val": best.get("test_acc"),
    }


def read_summary(run_dir: Path) -> dict[str, Any] | None:
    """``summary.json`` of a run folder, or None when the run has not finished.

    Raises:
        JimuError: the file exists but is not a JSON object.
    """
    path = Path(run_dir) / "summary.json"
    return read_json(path) if path.exists() else None


def read_config(run_dir: Path) -> dict[str, Any]:
    """``config.json`` of a run folder, or ``{}`` when it is missing.

    Raises:
        JimuError: the file exists but is not a JSON object.
    """
    path = Path(run_dir) / "config.json"
    return read_json(path) if path.exists() else {}


@dataclass(frozen=True)
class Metric:
    """A figure a run's evaluations log, whose first reaching of a target is timed: the test
    accuracy (higher is better) or a language model's validation loss (lower is better).

    Example:
        >>> ACCURACY.reached(0.91, 0.9), VAL_LOSS.reached(1.91, 1.9)
        (True, False)
        >>> ACCURACY.text(0.9), VAL_LOSS.text(1.9)
        ('90%', '1.90')
    """

    key: str
    name: str
    flag: str
    higher: bool

    def reached(self, value: float, target: float) -> bool:
        """Whether ``value`` is at ``target`` or better."""
        return value >= target if self.higher else value <= target

    def text(self, value: float) -> str:
        """``value`` as a target is written: a percentage, or a loss to two decimals."""
        return f"{value:.0%}" if self.higher else f"{value:.2f}"

    def phrase(self, value: float) -> str:
        """``90% test accuracy`` or ``validation loss 1.90``."""
        shown = self.text(value)
        return f"{shown} {self.name}" if self.higher else f"{self.name} {shown}"


ACCURACY = Metric("test_acc", "test accuracy", "--target-acc", higher=True)
VAL_LOSS = Metric("val_loss", "validation loss", "--target-loss", higher=False)


def train_time_to(
    events: list[dict[str, Any]], target: float, metric: Metric = ACCURACY
) -> tuple[float | None, float | None]:
    """(training seconds, seconds since the start) until ``metric`` (the test accuracy by
    default) first reaches ``target``; (None, None) if it never does.

    Training seconds are that event's ``train_s``, the run's training clock: evaluation,
    logging and checkpoints are not counted.
    """
    e = first_reaching(events, target, metric)
    if e is None:
        return None, None
    return finite_number(e.get("train_s")), finite_number(e.get("time_s"))


def check_targets(target_acc: float | None, target_loss: float | None) -> None:
    """Refuse, in one line, a target accuracy outside (0, 1] or a target loss not above 0
    (``jimu report`` and ``jimu bench`` both take them; None: not given).

    Raises:
        JimuError: a bad target.
    """
    if target_acc is not None and not 0 < target_acc <= 1:
        raise JimuError(f"--target-acc must be a fraction in (0, 1] (target-acc: {target_acc})")
    if target_loss is not None and not target_loss > 0:
        raise JimuError(f"--target-loss must be > 0 (target-loss: {target_loss})")


def first_reaching(
    events: list[dict[str, Any]], target: float, metric: Metric = ACCURACY
) -> dict[str, Any] | None:
    """The first event whose ``metric`` (the test accuracy by default) reaches ``target``;
    None if none does."""
    for e in events:
        value = finite_number(e.get(metric.key))
        if value is not None and metric.reached(value, target):
            return e
    return None


def finite_number(v: Any) -> float | None:
    """``v`` as a float if it is a finite number (not a bool, not a "nan" string), else None."""
    return (
        float(v)
        if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
        else None
    )
