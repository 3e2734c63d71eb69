"""``report.md`` of a bench: the setup, one table of every configuration, skips, failures, plots."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from deepjimu.atomic import atomic_write_text
from deepjimu.bench.results import Target, options_text, three_figures
from deepjimu.bench.runner import NO_FIT
from deepjimu.bench.tune import Tuning
from deepjimu.strategies.registry import ENTRIES
from deepjimu.units import format_bytes

__all__ = ["write_markdown"]

_PLOT_TEXT = {
    "throughput": "Training throughput and speedup over 1 worker",
    "accuracy_time": "Test accuracy over training time, every configuration",
    "loss_time": "Validation loss over training time, every configuration",
    "time_to_target": "Training time to the target and the final figure",
    "comm_memory": "Bytes communicated per training sample and peak memory per worker",
    "pipeline_bubble": "Pipeline: measured idle fraction next to the GPipe bubble (n-1)/(m+n-1)",
}


def _num(value: Any, spec: str, scale: float = 1.0) -> str:
    return "-" if value is None else format(value * scale, spec)


def _secs(value: Any) -> str:
    return "-" if value is None else three_figures(value)


def _row_cells(r: dict[str, Any], with_options: bool, with_loss: bool) -> list[str]:
    speedup = "-" if r.get("speedup") is None else f"{r['speedup']:.2f} (over {r['speedup_base']})"
    bubble = "-"
    if r.get("idle_frac") is not None or r.get("bubble_theory") is not None:
        bubble = f"{_num(r.get('idle_frac'), '.1%')} / {_num(r.get('bubble_theory'), '.1%')}"
    options = " ".join(x for x in (r.get("options"), r.get("tuned")) if x) or "-"
    return [
        r["strategy"],
        str(r["workers"]),
        r["model"],
        *([options] if with_options else []),
        str(r.get("epochs") or "-"),
        _secs(r.get("train_s")),
        _secs(r.get("fit_s")),
        _secs(r.get("wall_s")),
        _num(r.get("samples_per_s"), ".0f"),
        speedup,
        *([_num(r.get("val_loss"), ".4f")] if with_loss else []),
        _num(r.get("test_acc"), ".2%"),
        _secs(r.get("time_to_target_s")),
        "-" if r.get("bytes_per_sample") is None else format_bytes(r["bytes_per_sample"]),
        _num(r.get("peak_mem_mb"), ".0f"),
        bubble,
    ]


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    return [
        "| " + " | ".join(header) + " |",
        "|" + "|".join("---" for _ in header) + "|",
        *("| " + " | ".join(c.replace("|", "\\|") for c in row) + " |" for row in rows),
    ]


def _tuning_lines(tunings: list[Tuning]) -> list[str]:
    rows = []
    for t in tunings:
        tried = "; ".join(
            f"{options_text(x.setting)}: "
            + (f"{x.val_acc:.2%}" if x.val_acc is not None else f"{x.status} ({x.error})")
            for x in t.trials
        )
        group = " ".join(filter(None, (t.model, options_text(t.options))))
        rows.append([t.strategy, group, str(t.workers), tried, options_text(t.choice) or "-"])
    return [
        "",
        "## Tuning",
        "",
        "Every strategy had the same number of trials; each trial is a full run with the "
        "group's smallest worker count, scored by its final validation accuracy; the matrix "
        "ran at the chosen setting. Test accuracy played no part in the choice.",
        "",
        *_table(
            ["strategy", "model / options", "workers", "tried: validation accuracy", "chosen"], rows
        ),
    ]


def write_markdown(
    path: Path,
    rows: list[dict[str, Any]],
    setup: dict[str, Any],
    plots: list[Path],
    tunings: list[Tuning] | None = None,
) -> None:
    """Write ``report.md`` (atomically).

    Args:
        path: where to write it (the bench folder's ``report.md``).
        rows: every result row, including skipped, failed, interrupted and pending ones.
        setup: what all runs share: ``name``, ``command``, ``dataset``, ``seed``, ``epochs``,
            ``target`` (a :class:`~deepjimu.bench.results.Target`), ``train_args``, ``host``,
            ``date``, ``elapsed_s``; ``resumed`` (the ``--resume`` command, when this part of
            the bench was a resume) and ``interrupted`` (the signal's line, when it was stopped).
        plots: the PNG files (in the same folder) to embed.
        tunings: the ``--tune`` trials and choices, if the bench tuned.
    """
    target: Target = setup["target"]
    lines = _setup_lines(setup, target)
    lines += _results_lines(rows, target)
    if tunings:
        lines += _tuning_lines(tunings)
    lines += _no_fit_lines(rows)
    lines += _skipped_lines(rows)
    lines += _failed_lines(rows)
    lines += _missing_lines(rows, path)
    lines += _plot_lines(rows, plots)
    atomic_write_text(path, "\n".join(lines).rstrip() + "\n")


def _setup_lines(setup: dict[str, Any], target: Target) -> list[str]:
    """The title and what all runs shared (see :func:`write_markdown`), the signal if any."""
    lines = [
        f"# deepjimu bench `{setup['name']}`",
        "",
        f"- command: `{setup['command']}`",
        f"- date: {setup['date']}; host: {setup['host']}; bench took {setup['elapsed_s']:.0f} s"
        + (f" (the part resumed with `{setup['resumed']}`)" if setup.get("resumed") else ""),
        f"- dataset: {setup['dataset']}, seed {setup['seed']}, "
        f"epochs: {setup['epochs'] or 'each strategy default'}, "
        f"extra train flags: `{setup['train_args'] or 'none'}`",
        f"- time-to-target: {target.text}; {target.why}",
        "- every configuration ran in its own `jimu train` process, one after the other",
    ]
    if setup.get("interrupted"):
        lines.append(f"- **interrupted**: {setup['interrupted']}")
    return lines


def _results_lines(rows: list[dict[str, Any]], target: Target) -> list[str]:
    """The results section: one table row per finished configuration, then what the columns mean."""
    lines = ["", "## Results", ""]
    metric = target.metric
    pct = "the target" if target.value is None else metric.text(target.value)
    with_loss = not metric.higher
    ok = [r for r in rows if r["status"] == "ok"]
    with_options = any(r.get("options") or r.get("tuned") for r in rows)
    header = [
        "strategy",
        "workers",
        "model",
        *(["options"] if with_options else []),
        "epochs",
        "train s",
        "fit s",
        "wall s",
        "samples/s",
        "speedup",
        *(["val loss"] if with_loss else []),
        "test acc",
        f"train s to {pct}",
        "sent/sample",
        "peak MiB/worker",
        "idle / bubble",
    ]
    cells = [_row_cells(r, with_options, with_loss) for r in ok]
    lines += _table(header, cells) if ok else ["No configuration finished."]
    lines += [
        "",
        "- *train s*: time in training steps (`summary.json` `train_s`); *fit s*: the whole "
        "fit, evaluations and checkpoints included (`fit_s`); *wall s*: the whole "
        "`jimu train` process, start-up included.",
        "- *speedup*: throughput over that of the same strategy and model with 1 worker; "
        "where that run does not exist or failed, over `local` with 1 worker.",
        f"- *train s to {pct}*: training time (evaluation excluded, so a strategy that "
        f"evaluates more often is not penalised) until the first event whose {metric.name} "
        f"reaches {pct}; `-` when it was not reached.",
        "- *sent/sample*: bytes sent by all ranks (the payload each rank handed to torch.distributed) "
        "per training sample processed.",
        "- *idle / bubble*: pipeline runs only: measured idle fraction / (n-1)/(m+n-1).",
    ]
    return lines


def _skipped_lines(rows: list[dict[str, Any]]) -> list[str]:
    """The skipped section (impossible combinations, with why), or nothing."""
    skipped = [r for r in rows if r["status"] == "skipped"]
    if not skipped:
        return []
    return [
        "",
        "## Skipped (impossible combinations, not failures)",
        "",
        *(
            f"- {r['strategy']} x{r['workers']} {r['model']} {r.get('options') or ''}".rstrip()
            + f": {r['error']}"
            for r in skipped
        ),
    ]


def _no_fit_lines(rows: list[dict[str, Any]]) -> list[str]:
    """The does-not-fit section (configurations their memory cannot hold, with the
    prediction or the budget's peak that said so), or nothing."""
    short = [r for r in rows if r["status"] == NO_FIT]
    if not short:
        return []
    return [
        "",
        "## Does not fit (a result: the memory cannot hold it)",
        "",
        *(
            f"- {r['strategy']} x{r['workers']} {r['model']} {r.get('options') or ''}".rstrip()
            + f": {r['error']}"
            for r in short
        ),
    ]


def _failed_lines(rows: list[dict[str, Any]]) -> list[str]:
    """The failed section (failed and timed-out runs, their errors and logs), or nothing."""
    failed = [r for r in rows if r["status"] in ("failed", "timeout")]
    if not failed:
        return []
    return [
        "",
        "## Failed",
        "",
        *_table(
            ["strategy", "workers", "model", "status", "error", "log"],
            [
                [r["strategy"], str(r["workers"]), r["model"], r["status"], r["error"], r["log"]]
                for r in failed
            ],
        ),
    ]


def _missing_lines(rows: list[dict[str, Any]], path: Path) -> list[str]:
    """The not-finished section (interrupted and pending runs, and how to run them), or nothing."""
    missing = [r for r in rows if r["status"] in ("interrupted", "pending")]
    if not missing:
        return []
    return [
        "",
        "## Not finished",
        "",
        *(
            f"- {r['strategy']} x{r['workers']} {r['model']} {r.get('options') or ''}".rstrip()
            + (f": interrupted ({r['error']})" if r["status"] == "interrupted" else ": not run")
            for r in missing
        ),
        "",
        f"Run them with `jimu bench --resume {path.parent}`.",
    ]


def _plot_lines(rows: list[dict[str, Any]], plots: list[Path]) -> list[str]:
    """The plots section, each PNG embedded under its title, or nothing."""
    if not plots:
        return []
    lines = ["", "## Plots", ""]
    for p in plots:
        lines += [f"### {_PLOT_TEXT.get(p.stem, p.stem)}", "", f"![{p.stem}]({p.name})", ""]
    pipelined = {e.name for e in ENTRIES if e.traits.pipelined}
    asked = any(r["strategy"] in pipelined and r["status"] != "skipped" for r in rows)
    if asked and not any(p.stem == "pipeline_bubble" for p in plots):
        lines += [
            f"No {' or '.join(sorted(pipelined))} run finished, so there is no idle-fraction plot."
        ]
    return lines
