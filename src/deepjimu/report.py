"""``jimu report``: a run's events as a table, its summary, and its loss / accuracy plots."""

from __future__ import annotations

import io
import json
import math
import sys
from pathlib import Path
from typing import Any

from deepjimu.atomic import atomic_write_bytes
from deepjimu.errors import JimuError
from deepjimu.units import format_bytes

__all__ = [
    "accuracy_limits",
    "best_validation",
    "epoch_unit",
    "finite_number",
    "plot_run",
    "read_config",
    "read_event_log",
    "read_events",
    "read_summary",
    "report",
    "run_figures",
    "run_title",
    "save_figures",
    "table",
    "train_time_to",
]

_ACC_SPLITS = ("train_acc", "val_acc", "test_acc")


def _read_json(path: Path) -> dict[str, Any]:
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
    return _read_json(path) if path.exists() else None


def read_config(run_dir: Path) -> dict[str, Any]:
    """``config.json`` of a run folder, or ``{}`` when it is missing.

    Raises:
        JimuError: the file exists but is not a JSON object.
    """
    path = Path(run_dir) / "config.json"
    return _read_json(path) if path.exists() else {}


def train_time_to(
    events: list[dict[str, Any]], target_acc: float
) -> tuple[float | None, float | None]:
    """(training seconds, seconds since the start) until the test accuracy first reaches
    ``target_acc``; (None, None) if it never does.

    Training seconds are that event's ``train_s``, the run's training clock: evaluation,
    logging and checkpoints are not counted.
    """
    for e in events:
        acc = finite_number(e.get("test_acc"))
        if acc is not None and acc >= target_acc:
            return finite_number(e.get("train_s")), finite_number(e.get("time_s"))
    return None, None


def finite_number(v: Any) -> float | None:
    """``v`` as a float if it is a finite number (not a bool, not a "nan" string), else None."""
    return (
        float(v)
        if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
        else None
    )


def _fmt(value: Any, spec: str) -> str:
    if value is None:
        return "-"
    if isinstance(value, str):  # non-finite numbers are logged as strings ("nan")
        return value
    return format(value, spec)


def table(events: list[dict[str, Any]]) -> str:
    """A fixed-width text table of ``events``, one row per event.

    Columns: epoch, the clocks ``time_s`` (since the run started) and ``train_s`` (in
    training steps), loss, train / val / test accuracy, training samples/s, bytes sent
    (all ranks), compute and wait seconds (slowest rank).
    """
    header = (
        "epoch",
        "time_s",
        "train_s",
        "loss",
        "train",
        "val",
        "test",
        "samples/s",
        "sent",
        "compute_s",
        "wait_s",
    )
    rows: list[tuple[str, ...]] = [header]
    for e in events:
        rows.append(
            (
                str(e.get("epoch", "-")),
                _fmt(e.get("time_s"), ".2f"),
                _fmt(e.get("train_s"), ".2f"),
                _fmt(e.get("loss"), ".4f"),
                *(_fmt(e.get(k), ".4f") for k in _ACC_SPLITS),
                _fmt(e.get("samples_per_s"), ".0f"),
                format_bytes(e.get("bytes_sent")),
                _fmt(e.get("compute_s"), ".3f"),
                _fmt(e.get("wait_s"), ".3f"),
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    return "\n".join("  ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)) for r in rows)


def _summary_lines(summary: dict[str, Any]) -> list[str]:
    lines = []
    for key, value in summary.items():
        if isinstance(value, float):
            text = f"{value:.4f}"
        elif key.startswith("bytes") and isinstance(value, int):
            text = f"{value} ({format_bytes(value)})"
        elif isinstance(value, list):
            text = (
                "[" + ", ".join(f"{v:.4g}" if isinstance(v, float) else str(v) for v in value) + "]"
            )
        else:
            text = str(value)
        lines.append(f"  {key}: {text}")
    return lines


def run_title(run_dir: Path, events: list[dict[str, Any]], summary: dict[str, Any] | None) -> str:
    """``<strategy> x<workers> on <dataset> (<model>)`` from the summary, else the saved config."""
    info = summary or read_config(run_dir)
    workers = info.get("workers")
    if workers is None and events:
        workers = len(events[-1].get("peak_mem_mb_per_rank") or []) or None
    return (
        f"{info.get('strategy', '?')} x{workers if workers is not None else '?'} on "
        f"{info.get('dataset', '?')} ({info.get('model', '?')})"
    )


def epoch_unit(info: dict[str, Any]) -> str:
    """What one logged ``epoch`` of a run is: ``iteration`` for full-batch admm (one pdADMM
    iteration over every training sample), else ``epoch`` (a pass over the training data).

    Args:
        info: the run's ``config.json`` and/or ``summary.json`` (``strategy``, ``admm_batch``).

    Example:
        >>> epoch_unit({"strategy": "admm", "admm_batch": 0}), epoch_unit({"strategy": "ddp"})
        ('iteration', 'epoch')
    """
    return "iteration" if info.get("strategy") == "admm" and not info.get("admm_batch") else "epoch"


def accuracy_limits(percents: list[float]) -> tuple[float, float]:
    """Axis limits (in %) that show every value of ``percents`` off the frame, within 0-100.

    A fixed 0-100 axis puts runs at 98-99% on the frame, one over the other; the limits
    follow the data with a margin of a tenth of its spread (at least half a point).

    Example:
        >>> accuracy_limits([98.0, 99.0])
        (97.5, 99.5)
    """
    if not percents:
        return 0.0, 100.0
    lo, hi = min(percents), max(percents)
    margin = max(0.5, 0.1 * (hi - lo))
    return max(0.0, lo - margin), min(max(100.0, hi + margin / 2), hi + margin)


def run_figures(events: list[dict[str, Any]], title: str, unit: str = "epoch") -> dict[str, Any]:
    """The loss and accuracy figures of a run, per logged ``unit`` (see :func:`epoch_unit`).

    Returns:
        ``{"loss": Figure, "accuracy": Figure}`` (matplotlib figures, not yet saved).
    """
    from matplotlib.figure import Figure

    def numbers(key: str) -> tuple[list[float], list[float]]:
        pts = [
            (float(e["epoch"]), float(e[key]))
            for e in events
            if finite_number(e.get(key)) is not None and finite_number(e.get("epoch")) is not None
        ]
        return [p[0] for p in pts], [p[1] for p in pts]

    loss = Figure(figsize=(7, 4.5), layout="constrained")
    ax = loss.add_subplot()
    x, y = numbers("loss")
    ax.plot(x, y, marker="o", markersize=3, label=f"training loss (mean over the {unit})")
    ax.set_xlabel(unit)
    ax.set_ylabel("cross-entropy loss (nats per sample)")
    ax.set_title(f"Loss: {title}")
    ax.grid(alpha=0.3)
    ax.legend()

    accuracy = Figure(figsize=(7, 4.5), layout="constrained")
    ax = accuracy.add_subplot()
    shown: list[float] = []
    for key, label in zip(_ACC_SPLITS, ("train", "validation", "test"), strict=True):
        x, y = numbers(key)
        if x:
            shown += [100 * v for v in y]
            ax.plot(x, [100 * v for v in y], marker="o", markersize=3, label=label)
    ax.set_xlabel(unit)
    ax.set_ylabel("accuracy (% correct)")
    ax.set_ylim(*accuracy_limits(shown))
    ax.set_title(f"Accuracy: {title}")
    ax.grid(alpha=0.3)
    ax.legend(loc="best")
    return {"loss": loss, "accuracy": accuracy}


def save_figures(figures: dict[str, Any], out_dir: Path, flag: str = "--out") -> list[Path]:
    """Write each figure to ``out_dir/<name>.png`` atomically (a failed write leaves no file).

    Args:
        figures: name -> matplotlib figure.
        out_dir: the folder (created if missing).
        flag: the option that picks another folder, for the message.

    Returns:
        the paths written.

    Raises:
        JimuError: the folder cannot be created or written (read-only, full, no permission).
    """
    out_dir = Path(out_dir)
    written = []
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        for name, fig in figures.items():
            buf = io.BytesIO()
            fig.savefig(buf, format="png", dpi=110)
            atomic_write_bytes(out_dir / f"{name}.png", buf.getvalue())
            written.append(out_dir / f"{name}.png")
    except OSError as e:
        raise JimuError(
            f"cannot write the plots in {out_dir}: {e.strerror or e}; "
            f"give {flag} DIR to write them elsewhere"
        ) from None
    return written


def plot_run(
    run_dir: Path, events: list[dict[str, Any]], title: str, out_dir: Path | None = None
) -> list[Path]:
    """Write ``loss.png`` and ``accuracy.png`` (per logged epoch or admm iteration) into
    ``out_dir`` (default: ``run_dir``).

    Returns:
        the paths written.

    Raises:
        JimuError: the folder cannot be written (the message names it and ``--out``).
    """
    run_dir = Path(run_dir)
    summary = read_summary(run_dir) or {}
    unit = epoch_unit({**read_config(run_dir), **summary})
    return save_figures(run_figures(events, title, unit), out_dir or run_dir)


def _print_probe(run_dir: Path) -> None:
    """Print the table of a ``jimu probe`` folder (it holds probe.json, no events)."""
    from deepjimu.cost.compress import Prediction, format_predictions
    from deepjimu.compress.probe import format_probe, read_probe

    path = run_dir / "probe.json"
    probe = read_probe(path)
    print(f"{run_dir} is a probe's folder (jimu probe): no training events, only {path.name}")
    print(format_probe(probe))
    saved = _read_json(path)
    predictions = saved.get("predictions")
    if isinstance(predictions, list) and isinstance(saved.get("choice"), str):
        try:
            print(format_predictions([Prediction(**p) for p in predictions], saved["choice"]))
        except TypeError as e:
            raise JimuError(f"probe file {path} is damaged: {e}") from None


def report(
    run_dir: Path, plots: bool = True, target_acc: float = 0.9, out_dir: Path | None = None
) -> None:
    """Print a run's event table, its resumes, time to ``target_acc`` and summary; write its plots.

    A probe's folder (``probe.json``, no ``events.jsonl``) prints the probe's table instead.

    Args:
        run_dir: a run folder written by ``jimu train`` (or ``jimu probe``).
        plots: also write ``loss.png`` and ``accuracy.png``.
        target_acc: the test accuracy (a fraction) whose training time to reach is printed.
        out_dir: where the plots go (default: the run folder).

    Raises:
        JimuError: missing folder or ``events.jsonl``, a damaged JSON file (named), or a
            plot folder that cannot be written (named, with ``--out``).

    Example:
        >>> report(Path("runs/ddp-digits-20250101-120000"))  # doctest: +SKIP
    """
    run_dir = Path(run_dir)
    if (
        run_dir.is_dir()
        and (run_dir / "probe.json").exists()
        and not (run_dir / "events.jsonl").exists()
    ):
        _print_probe(run_dir)
        return
    events = read_events(run_dir)
    summary = read_summary(run_dir)
    title = run_title(run_dir, events, summary)
    print(f"{title}: {run_dir}")
    print(table(events))
    for e in events:
        r = e.get("resumed")
        if isinstance(r, dict):
            print(
                f"epoch {e.get('epoch')}: went on from the checkpoint at epoch {r.get('epoch')} "
                f"(by {r.get('by')}; {r.get('events_dropped')} later event(s) dropped)"
            )
    train_s, wall_s = train_time_to(events, target_acc)
    if train_s is None:
        print(f"time to {target_acc:.0%} test accuracy: not reached")
    else:
        print(
            f"time to {target_acc:.0%} test accuracy: {train_s:.2f} s of training "
            f"(evaluation excluded; {wall_s:.2f} s since the run started)"
        )
    if summary is None:
        print("summary: none (the run has not finished)")
    else:
        print("summary:")
        print("\n".join(_summary_lines(summary)))
    if plots:
        for path in plot_run(run_dir, events, title, out_dir):
            print(f"wrote {path}")
