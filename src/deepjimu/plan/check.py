"""``jimu plan --check``: run the best predicted configurations for real and compare.

Split from :mod:`deepjimu.plan.command`, which predicts and ranks; this module runs the
rows it ranked as ``jimu bench`` would run them and sets their measured figures and errors.
"""

from __future__ import annotations

import argparse
import signal
import statistics
from pathlib import Path
from typing import Any

from deepjimu.bench.runner import measure, run_cell, train_command
from deepjimu.errors import Interrupted

__all__ = ["check", "label", "signum", "stopped"]


def signum(e: KeyboardInterrupt) -> int:
    """The signal that stopped the plan: an :class:`Interrupted`'s own, else Ctrl-C's."""
    return e.signum if isinstance(e, Interrupted) else int(signal.SIGINT)


def stopped(e: KeyboardInterrupt, what: str) -> Interrupted:
    """``e`` as one line: ``stopped by`` its signal, then ``what``."""
    return Interrupted(signum(e), f"stopped by {signal.Signals(signum(e)).name}{what}")


def label(r: dict[str, Any]) -> str:
    """A row's configuration in one phrase: strategy, workers, model and options."""
    opts = "".join(f" {k.replace('_', '-')}={v}" for k, v in r["options"].items())
    return f"{r['strategy']} x{r['workers']} {r['model']}{opts}"


def check(rows: list[dict[str, Any]], args: argparse.Namespace, out: Path) -> None:
    """Run the rows of :func:`_to_check` for real, ``args.repeats`` rounds of them; add
    ``measured`` (the median run's figures, every run's samples/s) and the error to each.

    Rounds rather than a configuration's repeats back to back: a machine whose speed drifts
    over minutes then moves every configuration alike, not one of them.

    Raises:
        Interrupted: Ctrl-C (or SIGTERM), in one line saying how many runs were not done;
            the rows are compared on the runs that finished first.
    """
    predicted = [r for r in rows if r.get("predicted")]
    todo = _to_check(predicted, args.check)
    got: dict[int, list[dict[str, Any]]] = {id(r): [] for r in todo}
    total, finished = args.repeats * len(todo), 0
    stop: KeyboardInterrupt | None = None
    try:
        for round_ in range(args.repeats):
            for i, r in enumerate(todo, start=1):
                at = f"{i}/{len(todo)}" if args.repeats == 1 else f"{round_ + 1}.{i}/{len(todo)}"
                print(f"[{at}] {label(r)}...", end=" ", flush=True)
                figures = _check_run(r, round_, args, out / "check")
                if figures is not None:
                    got[id(r)].append(figures)
                finished += 1
    except KeyboardInterrupt as e:
        print(flush=True)  # ends the stopped run's line
        stop = e
    for r in todo:
        _compare(r, got[id(r)])
    print(_check_summary(todo, args.repeats, _unverified(todo, args.check, len(predicted))))
    if stop is not None:
        raise stopped(stop, f" in the check ({total - finished} of {total} checked runs not done)")


def _to_check(predicted: list[dict[str, Any]], top: int) -> list[dict[str, Any]]:
    """The rows that ``--check top`` runs, of the ``predicted`` ones (ranked): every one for
    0; else the ``top`` best and, where one is ranked below them, the best configuration of
    one worker that fits.

    A one-worker row's figures come from this process's measurements alone, which a busy
    machine once put 50-150x too slow: the fastest configuration was ranked last, and a
    check of the top two said its ranking held (issue 48). One run of it is cheap.
    """
    if not top:
        return predicted
    below = [r for r in predicted[top:] if r["workers"] == 1 and "does_not_fit" not in r]
    return predicted[:top] + below[:1]


def _unverified(todo: list[dict[str, Any]], top: int, predicted: int) -> str:
    """The check summary's clause on what it did not run: empty where it ran every
    predicted row; else that only the predicted top ``top`` (and the one-worker row of
    :func:`_to_check`) were checked, so that the ranking of the others is unverified."""
    if len(todo) >= predicted:
        return ""
    also = f" and {label(todo[top])}, the best of one worker below them," if todo[top:] else ""
    return (
        f"; only the predicted top {top}{also} were checked: the ranking of the other "
        f"{predicted - len(todo)} is unverified"
    )


def _check_run(
    r: dict[str, Any], round_: int, args: argparse.Namespace, runs: Path
) -> dict[str, Any] | None:
    """Run row ``r`` once for real (round ``round_``, under ``runs``) and print its figures:
    the run's measured figures, or None where it did not end well (``r["measured"]`` says how)."""
    cell = r["_cell"]
    # one folder of runs per round: runs/NAME, then runs-1/NAME, ...
    folder = runs / ("runs" if round_ == 0 else f"runs-{round_}")
    cmd = train_command(
        cell, folder, args.dataset, args.data_dir, args.seed, args.epochs, r["_argv"]
    )
    name = cell.name if round_ == 0 else f"{cell.name}-{round_}"
    outcome = run_cell(cmd, runs / "logs", name, args.timeout)
    if outcome.status != "ok":
        r["measured"] = {"status": outcome.status, "error": outcome.error}
        print(f"{outcome.status}: {outcome.error}", flush=True)
        return None
    figures = measure(folder / cell.name)
    real = figures.get("samples_per_s")
    pred = r["predicted"]["samples_per_s"]
    error = f" ({(pred - real) / real:+.0%})" if real else ""
    print(f"predicted {pred:.0f}, measured {real:.0f} samples/s{error}", flush=True)
    return figures


def _compare(row: dict[str, Any], runs: list[dict[str, Any]]) -> None:
    """Set ``row``'s measured figures from its runs (the median run by samples/s) and its error."""
    done = sorted((g for g in runs if g.get("samples_per_s")), key=lambda g: g["samples_per_s"])
    if not done or "status" in row.get("measured", {}):
        return
    median = done[len(done) // 2] if len(done) % 2 else None
    speeds = [g["samples_per_s"] for g in done]
    real = statistics.median(speeds)
    row["measured"] = {
        k: (median or done[0]).get(k) for k in ("bytes_per_sample", "peak_mem_mb", "train_s")
    }
    row["measured"]["samples_per_s"] = real
    if len(done) > 1:
        row["measured"]["runs_samples_per_s"] = speeds
    row["error"] = (row["predicted"]["samples_per_s"] - real) / real


def _check_summary(rows: list[dict[str, Any]], repeats: int = 1, unverified: str = "") -> str:
    """Predicted against measured per row, the median and worst error of samples/s, and
    whether the predicted fastest is the fastest (with repeats: against each row's median run,
    and how far the runs of one configuration spread), then ``unverified``
    (:func:`_unverified`)."""
    done = [r for r in rows if r.get("error") is not None]
    if not done:
        return "check: no configuration finished"
    spread = [
        max(s) / min(s) - 1
        for r in done
        if len(s := r["measured"].get("runs_samples_per_s", [])) > 1
    ]
    lines = [
        f"{label(r)}: predicted {r['predicted']['samples_per_s']:.0f}, measured "
        f"{r['measured']['samples_per_s']:.0f} samples/s ({r['error']:+.0%})"
        for r in done
    ]
    noise = (
        f" (median of {repeats} runs each; a configuration's fastest run over its slowest: "
        f"median +{statistics.median(spread):.0%}, worst +{max(spread):.0%})"
        if spread
        else ""
    )
    errors = [abs(r["error"]) for r in done]
    fastest = max(done, key=lambda r: r["measured"]["samples_per_s"])
    first = done[0]  # rows are ranked by prediction
    share = first["measured"]["samples_per_s"] / fastest["measured"]["samples_per_s"]
    verdict = (
        "the measured fastest"
        if first is fastest
        else f"{1 - share:.0%} slower than the measured fastest ({label(fastest)})"
    )
    summary = (
        f"check: {len(done)} configurations, |error| of samples/s median {statistics.median(errors):.0%}, "
        f"worst {max(errors):.0%}; the predicted fastest ({label(first)}) is {verdict}{noise}"
        f"; it ran at {share:.3f} of the measured fastest's samples/s{unverified}"
    )
    return "\n".join([*lines, summary]) if repeats > 1 else summary
