"""Bench plots (PNG, matplotlib's Agg canvas): throughput, accuracy over time, bytes, memory, bubble."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from deepjimu.errors import JimuError
from deepjimu.report import finite_number, read_events

__all__ = ["write_plots"]


def _figure(width: float = 10, height: float = 4.5) -> Any:
    from matplotlib.figure import Figure

    return Figure(figsize=(width, height), layout="constrained")


def _colors(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """One colour per strategy, stable across the plots of a bench."""
    from matplotlib import colormaps

    cmap = colormaps["tab10"]
    names = list(dict.fromkeys(r["strategy"] for r in rows))
    return {name: cmap(i % 10) for i, name in enumerate(names)}


def _label(row: dict[str, Any], many_models: bool) -> str:
    text = f"{row['strategy']} x{row['workers']}"
    if row.get("options"):
        text += f" {row['options']}"
    return f"{text}\n{row['model']}" if many_models else text


def _bars(
    ax: Any,
    rows: list[dict[str, Any]],
    key: str,
    colors: dict[str, Any],
    many: bool,
    scale: float = 1.0,
    fmt: str = "{:.0f}",
) -> None:
    """A bar per row of ``key`` x ``scale``, coloured by strategy and labelled with its value."""
    labels = [_label(r, many) for r in rows]
    values = [(r.get(key) or 0.0) * scale for r in rows]
    bars = ax.bar(labels, values, color=[colors[r["strategy"]] for r in rows])
    for bar, row, v in zip(bars, rows, values, strict=True):
        text = fmt.format(v) if row.get(key) is not None else "n/a"
        ax.annotate(
            text,
            (bar.get_x() + bar.get_width() / 2, bar.get_height()),
            ha="center",
            va="bottom",
            fontsize=8,
        )
    ax.tick_params(axis="x", labelrotation=45 if len(rows) > 6 else 0, labelsize=8)
    ax.grid(axis="y", alpha=0.3)
    ax.margins(y=0.15)
    ax.set_ylim(bottom=0)


def _throughput(
    rows: list[dict[str, Any]], colors: dict[str, Any], many: bool, title: str, path: Path
) -> None:
    fig = _figure(12, 4.8)
    ax1, ax2 = fig.subplots(1, 2)
    _bars(ax1, rows, "samples_per_s", colors, many)
    ax1.set_ylabel("training throughput (samples/s)")
    ax1.set_title("Throughput")
    series: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
    for r in rows:
        if r.get("speedup") is not None:
            series.setdefault((r["strategy"], r["model"], r.get("options") or ""), []).append(r)
    top = 1
    for (strategy, model, options), rs in series.items():
        rs.sort(key=lambda r: r["workers"])
        base = rs[0]["speedup_base"]
        name = " ".join(filter(None, (strategy, model if many else "", options)))
        ax2.plot(
            [r["workers"] for r in rs],
            [r["speedup"] for r in rs],
            marker="o",
            color=colors[strategy],
            label=f"{name} (over {base})",
        )
        top = max(top, *(r["workers"] for r in rs))
    ax2.plot([1, top], [1, top], linestyle="--", color="grey", label="linear speedup")
    ax2.set_xlabel("workers (processes)")
    ax2.set_ylabel("speedup (x, throughput / 1-worker throughput)")
    ax2.set_xticks(range(1, top + 1))
    ax2.set_title("Speedup over 1 worker")
    ax2.grid(alpha=0.3)
    ax2.legend(fontsize=8)
    fig.suptitle(title)
    fig.savefig(path, dpi=110)


def _accuracy_time(
    rows: list[dict[str, Any]],
    colors: dict[str, Any],
    many: bool,
    target: float,
    title: str,
    path: Path,
) -> None:
    fig = _figure(10, 5.5)
    ax = fig.add_subplot()
    styles, markers = ["-", "--", ":", "-."], ".^sDv"
    models = list(dict.fromkeys(r["model"] for r in rows))
    for r in rows:
        try:
            events = read_events(Path(r["run_dir"]))
        except JimuError:
            continue
        pts = []
        for e in events:
            train_s, acc = finite_number(e.get("train_s")), finite_number(e.get("test_acc"))
            if train_s is not None and acc is not None:
                pts.append((train_s, 100 * acc))
        if not pts:
            continue
        ax.plot(
            [p[0] for p in pts],
            [p[1] for p in pts],
            linestyle=styles[(r["workers"] - 1) % len(styles)],
            color=colors[r["strategy"]],
            marker=markers[models.index(r["model"]) % len(markers)],
            markersize=4,
            label=_label(r, many).replace("\n", " "),
        )
    ax.axhline(
        100 * target, color="black", linewidth=0.8, linestyle=":", label=f"target {100 * target:g}%"
    )
    ax.set_ylim(0, 101)
    ax.set_xlabel("training time (s, evaluation excluded)")
    ax.set_ylabel("test accuracy (% correct)")
    ax.set_title(f"Test accuracy over time: {title}")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, ncol=2, loc="lower right")
    fig.savefig(path, dpi=110)


def _target(
    rows: list[dict[str, Any]],
    colors: dict[str, Any],
    many: bool,
    target: float,
    title: str,
    path: Path,
) -> None:
    fig = _figure(12, 4.8)
    ax1, ax2 = fig.subplots(1, 2)
    _bars(ax1, rows, "time_to_target_s", colors, many, fmt="{:.1f}")
    ax1.set_ylabel("training time to target (s, evaluation excluded)")
    ax1.set_title(f"Time to {100 * target:g}% test accuracy (n/a: not reached)")
    _bars(ax2, rows, "test_acc", colors, many, scale=100, fmt="{:.1f}")
    ax2.set_ylabel("final test accuracy (% correct)")
    ax2.set_ylim(0, 105)
    ax2.set_title("Final test accuracy")
    fig.suptitle(title)
    fig.savefig(path, dpi=110)


def _comm_memory(
    rows: list[dict[str, Any]], colors: dict[str, Any], many: bool, title: str, path: Path
) -> None:
    fig = _figure(12, 4.8)
    ax1, ax2 = fig.subplots(1, 2)
    _bars(ax1, rows, "bytes_per_sample", colors, many, scale=1 / 1024, fmt="{:.1f}")
    ax1.set_ylabel("bytes sent per training sample (KiB, all ranks)")
    ax1.set_title("Communication per sample")
    _bars(ax2, rows, "peak_mem_mb", colors, many)
    ax2.set_ylabel("peak memory per worker (MiB, max over ranks)")
    ax2.set_title("Peak memory per worker")
    fig.suptitle(title)
    fig.savefig(path, dpi=110)


def _bubble(rows: list[dict[str, Any]], many: bool, title: str, path: Path) -> None:
    import numpy as np

    fig = _figure(8, 4.5)
    ax = fig.add_subplot()
    x = np.arange(len(rows))
    measured = [100 * (r.get("idle_frac") or 0.0) for r in rows]
    theory = [100 * (r.get("bubble_theory") or 0.0) for r in rows]
    ax.bar(x - 0.2, measured, width=0.4, label="measured idle fraction")
    ax.bar(x + 0.2, theory, width=0.4, label="GPipe bubble (n-1)/(m+n-1)")
    for i, r in enumerate(rows):
        if r.get("idle_frac") is None:
            ax.annotate("not logged", (i - 0.2, 0), ha="center", va="bottom", fontsize=8)
    ax.set_xticks(x, [_label(r, many) for r in rows])
    ax.set_ylabel("idle time (% of the step)")
    ax.set_title(f"Pipeline idle time: {title}")
    ax.grid(axis="y", alpha=0.3)
    ax.legend()
    fig.savefig(path, dpi=110)


def write_plots(rows: list[dict[str, Any]], out_dir: Path, title: str, target: float) -> list[Path]:
    """Write the bench's PNG plots of the ok ``rows`` into ``out_dir``.

    Args:
        rows: result rows (see :data:`deepjimu.bench.results.COLUMNS`); only ok ones are drawn.
        out_dir: the bench folder.
        title: names the dataset (and what is shared by every run).
        target: the target test accuracy (fraction).

    Returns:
        the files written: throughput.png, accuracy_time.png, time_to_target.png,
        comm_memory.png and, when a pipeline run finished, pipeline_bubble.png.
    """
    ok = [r for r in rows if r["status"] == "ok"]
    if not ok:
        return []
    colors = _colors(ok)
    many = len({r["model"] for r in ok}) > 1
    paths = {
        name: out_dir / f"{name}.png"
        for name in (
            "throughput",
            "accuracy_time",
            "time_to_target",
            "comm_memory",
            "pipeline_bubble",
        )
    }
    _throughput(ok, colors, many, title, paths["throughput"])
    _accuracy_time(ok, colors, many, target, title, paths["accuracy_time"])
    _target(ok, colors, many, target, title, paths["time_to_target"])
    _comm_memory(ok, colors, many, title, paths["comm_memory"])
    pipes = [r for r in ok if r["strategy"] == "pipeline"]
    if pipes:
        _bubble(pipes, many, title, paths["pipeline_bubble"])
    else:
        del paths["pipeline_bubble"]
    return list(paths.values())
