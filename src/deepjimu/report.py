"""``jimu report``: a run's events as a table, its summary, and its loss / accuracy plots."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

from deepjimu.atomic import atomic_write_bytes
from deepjimu.cost.compress import Prediction, format_predictions
from deepjimu.cost.probe import format_probe, read_probe
from deepjimu.errors import JimuError
from deepjimu.record.read import (
    ACCURACY,
    VAL_LOSS,
    finite_number,
    read_config,
    read_events,
    read_json,
    read_summary,
    train_time_to,
)
from deepjimu.strategies.registry import entry, strategy_names
from deepjimu.units import format_bytes

__all__ = [
    "accuracy_limits",
    "epoch_unit",
    "plot_run",
    "report",
    "run_figures",
    "run_title",
    "save_figures",
    "table",
]

_ACC_SPLITS = ("train_acc", "val_acc", "test_acc")
# a bench's record (deepjimu.bench.record.RECORD, not imported: it loads torch)
_BENCH_RECORD = "bench.json"


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
    strategy = info.get("strategy")
    if strategy not in strategy_names():
        return "epoch"
    return entry(strategy).epoch_unit(info)


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
    from matplotlib.ticker import MaxNLocator

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
    x, y = numbers("val_loss")
    if x:
        ax.plot(x, y, marker="o", markersize=3, label="validation loss")
    ax.set_xlabel(unit)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # no epoch 2.5
    ax.set_ylabel("cross-entropy loss (nats per sample, or per token)")
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
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
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
    path = run_dir / "probe.json"
    probe = read_probe(path)
    print(f"{run_dir} is a probe's folder (jimu probe): no training events, only {path.name}")
    print(format_probe(probe))
    saved = read_json(path)
    predictions = saved.get("predictions")
    if isinstance(predictions, list) and isinstance(saved.get("choice"), str):
        try:
            print(format_predictions([Prediction(**p) for p in predictions], saved["choice"]))
        except TypeError as e:
            raise JimuError(f"probe file {path} is damaged: {e}") from None


def _bench_line(bench_dir: Path) -> str:
    """The line for a bench's folder given to ``jimu report``: where its report is."""
    head = f"{bench_dir} is a bench's folder (jimu bench), not a run folder"
    if not (bench_dir / "report.md").exists():  # stopped before it wrote one
        return f"{head}, and has no report.md yet (go on with: jimu bench --resume {bench_dir})"
    return (
        f"{head}: its report is {bench_dir / 'report.md'} "
        f"(one run's: jimu report {bench_dir / 'runs' / 'NAME'})"
    )


def _time_to_line(
    events: list[dict[str, Any]], target_acc: float, target_loss: float | None
) -> str:
    """The training time to ``target_loss`` (a validation loss) if given, else to
    ``target_acc`` (a test accuracy)."""
    metric, target = (VAL_LOSS, target_loss) if target_loss is not None else (ACCURACY, target_acc)
    what = metric.phrase(target)
    train_s, wall_s = train_time_to(events, target, metric)
    if train_s is None:
        return f"time to {what}: not reached"
    return (
        f"time to {what}: {train_s:.2f} s of training "
        f"(evaluation excluded; {wall_s:.2f} s since the run started)"
    )


def report(
    run_dir: Path,
    plots: bool = True,
    target_acc: float = 0.9,
    out_dir: Path | None = None,
    target_loss: float | None = None,
) -> None:
    """Print a run's event table, its resumes, time to a target and summary; write its plots.

    A probe's folder (``probe.json``, no ``events.jsonl``) prints the probe's table instead;
    a bench's folder (``bench.json``) is refused in one line naming its ``report.md``.

    Args:
        run_dir: a run folder written by ``jimu train`` (or ``jimu probe``).
        plots: also write ``loss.png`` and ``accuracy.png``.
        target_acc: the test accuracy (a fraction) whose training time to reach is printed.
        out_dir: where the plots go (default: the run folder).
        target_loss: a validation loss whose training time to reach is printed instead
            (``--target-loss``; a language model's figure).

    Raises:
        JimuError: missing folder or ``events.jsonl``, a bench's folder, a damaged JSON
            file (named), or a plot folder that cannot be written (named, with ``--out``).

    Example:
        >>> report(Path("runs/ddp-digits-20250101-120000"))  # doctest: +SKIP
    """
    run_dir = Path(run_dir)
    if run_dir.is_dir() and not (run_dir / "events.jsonl").exists():
        if (run_dir / "probe.json").exists():
            _print_probe(run_dir)
            return
        if (run_dir / _BENCH_RECORD).exists():
            raise JimuError(_bench_line(run_dir))
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
    print(_time_to_line(events, target_acc, target_loss))
    if summary is None:
        print("summary: none (the run has not finished)")
    else:
        print("summary:")
        print("\n".join(_summary_lines(summary)))
    if plots:
        for path in plot_run(run_dir, events, title, out_dir):
            print(f"wrote {path}")
