"""Bench plots (PNG, matplotlib's Agg canvas): throughput, accuracy over time, bytes, memory, bubble.

Every configuration has its own style, the same in every bench: the colour comes from the
strategy (a fixed table), its shade from the worker count; the hatch of a bar and the
marker of a line come from the configuration's model and options, the dash of a line from
its worker count. Bars are horizontal, one configuration per row, so that labels of any
length fit; a panel with nothing to show is left out, and the figure says why.
"""

from __future__ import annotations

import textwrap
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from deepjimu.bench.results import Target, three_figures
from deepjimu.bench.runner import NO_FIT
from deepjimu.errors import JimuError
from deepjimu.record.read import finite_number, read_events
from deepjimu.report import accuracy_limits, save_figures
from deepjimu.strategies.registry import ENTRIES, entry_traits

__all__ = ["Style", "figures", "styles", "write_plots"]

_SPARE_COLORS = ("#7f7f7f", "#bcbd22", "#17becf")
_MARKERS = "osD^vP*Xh<>p"
_FILLS = ("full", "none", "left", "bottom")
_HATCHES = ("//", "\\\\", "xx", "..", "++", "oo")
_DASHES: dict[int, Any] = {1: "-", 2: "--", 3: ":", 4: "-."}
_ROW_INCHES = 0.28  # a bar row: room for one 8-point label line and a gap


@dataclass(frozen=True)
class Style:
    """How one configuration is drawn: bar ``color`` and ``hatch``; line ``color``,
    ``linestyle``, ``marker`` and ``fillstyle``; ``base`` is the strategy's own colour."""

    color: tuple[float, float, float]
    base: str
    hatch: str
    linestyle: Any
    marker: str
    fillstyle: str


def _strategy_color(strategy: str) -> str:
    """A strategy's colour: its registry entry's, else one fixed by its name (crc32, not
    Python's salted hash, so it is the same in every process)."""
    own = {e.name: e.color for e in ENTRIES}.get(strategy)
    return own or _SPARE_COLORS[zlib.crc32(strategy.encode()) % len(_SPARE_COLORS)]


def _shade(color: str, workers: int) -> tuple[float, float, float]:
    """``color`` mixed with white, less so for more workers (1: half, 2: a quarter, ...)."""
    from matplotlib.colors import to_rgb

    white = 0.5**workers
    r, g, b = to_rgb(color)
    return (r + (1 - r) * white, g + (1 - g) * white, b + (1 - b) * white)


def _variant(row: dict[str, Any]) -> str:
    return f"{row['model']} {row.get('options') or ''}".strip()


def _variant_slots(rows: list[dict[str, Any]]) -> dict[str, int]:
    """A slot per (model, options) variant: each takes its name's crc32 slot, or the next free.

    The slot of a variant depends on its name, not on its place in the matrix, so adding an
    option value to a bench leaves the others' markers and hatches as they were (unless two
    names meet in one slot). Slot 0, plain bars and round markers, is the first model's
    variant without options.
    """
    names = sorted(dict.fromkeys(_variant(r) for r in rows))
    plain = rows[0]["model"] if rows else ""
    slots: dict[str, int] = {}
    taken: set[int] = set()
    for name in ([plain] if plain in names else []) + [n for n in names if n != plain]:
        slot = 0 if name == plain else 1 + zlib.crc32(name.encode()) % (len(_MARKERS) - 1)
        while slot in taken:
            slot += 1
        slots[name] = slot
        taken.add(slot)
    return slots


def styles(rows: list[dict[str, Any]]) -> dict[int, Style]:
    """The style of each row (by index): distinct for distinct configurations.

    Args:
        rows: result rows (``strategy``, ``workers``, ``model``, ``options``).

    Returns:
        row index -> :class:`Style`.
    """
    slots = _variant_slots(rows)
    out = {}
    for i, r in enumerate(rows):
        k, w = slots[_variant(r)], int(r["workers"])
        base = _strategy_color(r["strategy"])
        out[i] = Style(
            color=_shade(base, w),
            base=base,
            hatch=""
            if k == 0
            else _HATCHES[(k - 1) % len(_HATCHES)] * (1 + (k - 1) // len(_HATCHES)),
            linestyle=_DASHES.get(w, (0, (w, 1.5))),
            marker=_MARKERS[k % len(_MARKERS)],
            fillstyle=_FILLS[(k // len(_MARKERS)) % len(_FILLS)],
        )
    return out


def _label(row: dict[str, Any], many_models: bool) -> str:
    parts = [row["strategy"], f"x{row['workers']}", row["model"] if many_models else ""]
    return " ".join(p for p in (*parts, row.get("options") or "") if p)


def _figure(panels: int, rows: int) -> Any:
    from matplotlib.figure import Figure

    height = max(3.2, _ROW_INCHES * rows + 1.6)
    return Figure(figsize=(max(8.0, 6.5 * panels), height), layout="constrained")


def _wrap(fig: Any, text: str, points: float) -> str:
    """``text`` broken into lines that fit the figure's width at a font of ``points``."""
    chars = int(72 * fig.get_figwidth() / (0.6 * points))  # a character is ~0.6 em wide
    return "\n".join(textwrap.fill(line, chars) for line in text.splitlines())


def _note(fig: Any, notes: list[str]) -> None:
    """Say under the figure which panels or rows were left out and why (after what it
    says already)."""
    said = [fig.get_supxlabel()] if fig.get_supxlabel() else []
    if notes:
        fig.supxlabel(_wrap(fig, "\n".join([*said, *notes]), 9), fontsize=9, color="0.3")


def _not_drawn(rows: list[dict[str, Any]], many: bool) -> list[str]:
    """The line under every figure for the configurations that have no figures because
    their memory could not hold them (``does-not-fit``: a result, in report.md with why)."""
    short = [_label(r, many) for r in rows if r["status"] == NO_FIT]
    if not short:
        return []
    return [f"Does not fit in its memory (not drawn; report.md says why): {', '.join(short)}"]


def _bars(
    ax: Any,
    rows: list[dict[str, Any]],
    style: dict[int, Style],
    values: list[float | None],
    labels: list[str] | None,
) -> None:
    """A horizontal bar per row (first row on top), in its style, labelled with its value;
    ``labels`` None: a panel that shares the rows of the one on its left."""
    y = list(range(len(rows)))
    bars = ax.barh(
        y,
        [v or 0.0 for v in values],
        color=[style[i].color for i in range(len(rows))],
        hatch=[style[i].hatch for i in range(len(rows))],
        edgecolor="0.25",
        linewidth=0.5,
    )
    for bar, v in zip(bars, values, strict=True):
        ax.annotate(
            three_figures(v) if v is not None else "n/a",
            (bar.get_width(), bar.get_y() + bar.get_height() / 2),
            xytext=(3, 0),
            textcoords="offset points",
            ha="left",
            va="center",
            fontsize=8,
        )
    if labels is not None:
        ax.set_yticks(y, labels)
        ax.tick_params(axis="y", labelsize=8)
    else:  # a panel beside the first shares its rows (sharey): the labels are shown once
        ax.tick_params(axis="y", labelleft=False)
    ax.set_ylim(len(rows) - 0.5, -0.5)
    ax.grid(axis="x", alpha=0.3)
    ax.margins(x=0.15)
    ax.set_xlim(left=0)


def _values(rows: list[dict[str, Any]], key: str, scale: float = 1.0) -> list[float | None]:
    return [None if (v := finite_number(r.get(key))) is None else v * scale for r in rows]


def _bar_figure(
    rows: list[dict[str, Any]],
    style: dict[int, Style],
    many: bool,
    title: str,
    panels: list[tuple[str, list[float | None], str, str]],
) -> Any | None:
    """Side-by-side bar panels of ``(title, values, x label, why it is left out)``; a panel
    whose values are all missing or zero is left out; None when every panel is."""
    shown = [p for p in panels if any(v for v in p[1])]
    if not shown:
        return None
    fig = _figure(len(shown), len(rows))
    axes = fig.subplots(1, len(shown), sharey=True, squeeze=False)[0]
    labels = [_label(r, many) for r in rows]
    for j, (ax, (name, values, xlabel, _)) in enumerate(zip(axes, shown, strict=True)):
        _bars(ax, rows, style, values, labels if j == 0 else None)
        ax.set_title(name)
        ax.set_xlabel(xlabel)
    _note(fig, [f"No '{p[0]}' panel: {p[3]}" for p in panels if p not in shown])
    fig.suptitle(title)
    return fig


def _speedup(ax: Any, rows: list[dict[str, Any]], style: dict[int, Style], many: bool) -> None:
    series: dict[tuple[str, str], list[int]] = {}
    for i, r in enumerate(rows):
        if r.get("speedup") is not None:
            series.setdefault((r["strategy"], _variant(r)), []).append(i)
    top = 1
    for (strategy, _), idx in series.items():
        idx.sort(key=lambda i: rows[i]["workers"])
        first = rows[idx[0]]
        name = " ".join(
            p for p in (strategy, first["model"] if many else "", first.get("options")) if p
        )
        s = style[idx[0]]
        ax.plot(
            [rows[i]["workers"] for i in idx],
            [rows[i]["speedup"] for i in idx],
            color=s.base,
            marker=s.marker,
            fillstyle=s.fillstyle,
            label=f"{name} (over {first['speedup_base']})",
        )
        top = max(top, *(rows[i]["workers"] for i in idx))
    ax.plot(
        [1, top], [1, top], linestyle="--", color="grey", label="linear speedup", gid="reference"
    )
    ax.set_xlabel("workers (processes)")
    ax.set_ylabel("speedup (x)")
    ax.set_xticks(range(1, top + 1))
    ax.set_title("Speedup: throughput over the 1-worker run's")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)


def _throughput(
    rows: list[dict[str, Any]], style: dict[int, Style], many: bool, title: str
) -> Any | None:
    values = _values(rows, "samples_per_s")
    has_speedup = any(r.get("speedup") is not None for r in rows)
    if not any(values):
        return None
    fig = _figure(2 if has_speedup else 1, len(rows))
    axes = fig.subplots(1, 2 if has_speedup else 1, squeeze=False)[0]
    _bars(axes[0], rows, style, values, [_label(r, many) for r in rows])
    axes[0].set_xlabel("training throughput (samples/s)")
    axes[0].set_title("Throughput")
    if has_speedup:
        _speedup(axes[1], rows, style, many)
    else:
        _note(
            fig,
            [
                "No speedup panel: no configuration has a 1-worker run of its strategy, "
                "or of local, with the same model and options to compare with"
            ],
        )
    fig.suptitle(title)
    return fig


def _over_time(
    rows: list[dict[str, Any]], style: dict[int, Style], many: bool, target: Target, title: str
) -> Any | None:
    """The target's figure (test accuracy, or validation loss) of every run over its
    training time, and the target as a dotted line."""
    from matplotlib.figure import Figure

    metric = target.metric
    scale = 100 if metric.higher else 1  # accuracies in percent
    lines = []
    for i, r in enumerate(rows):
        try:
            events = read_events(Path(r["run_dir"])) if r.get("run_dir") else []
        except JimuError:
            continue
        pts = []
        for e in events:
            train_s, value = finite_number(e.get("train_s")), finite_number(e.get(metric.key))
            if train_s is not None and value is not None:
                pts.append((train_s, scale * value))
        if pts:
            lines.append((i, pts))
    if not lines:
        return None
    fig = Figure(figsize=(12, max(5.0, 0.2 * len(lines) + 1.5)), layout="constrained")
    ax = fig.add_subplot()
    shown = [p[1] for _, pts in lines for p in pts]
    for i, pts in lines:
        s = style[i]
        ax.plot(
            [p[0] for p in pts],
            [p[1] for p in pts],
            color=s.color,
            linestyle=s.linestyle,
            marker=s.marker,
            fillstyle=s.fillstyle,
            markersize=5,
            label=_label(rows[i], many),
        )
    if target.value is not None:
        shown.append(scale * target.value)
        ax.axhline(
            scale * target.value,
            color="black",
            linewidth=0.8,
            linestyle=":",
            label=f"target {metric.text(target.value)}",
            gid="reference",
        )
    if metric.higher:
        ax.set_ylim(*accuracy_limits(shown))
    ax.set_xlabel("training time (s, evaluation excluded)")
    ax.set_ylabel("test accuracy (% correct)" if metric.higher else f"{metric.name} (nats)")
    ax.set_title(f"{metric.name.capitalize()} over time: {title}")
    ax.grid(alpha=0.3)
    fig.legend(fontsize=8, loc="outside right upper")
    return fig


def _target(
    rows: list[dict[str, Any]], style: dict[int, Style], many: bool, target: Target, title: str
) -> Any | None:
    metric = target.metric
    shown = "-" if target.value is None else metric.text(target.value)
    final = (
        ("Final test accuracy", _values(rows, "test_acc", 100), "final test accuracy (% correct)")
        if metric.higher
        else ("Final validation loss", _values(rows, "val_loss"), "final validation loss (nats)")
    )
    fig = _bar_figure(
        rows,
        style,
        many,
        title,
        [
            (
                f"Time to {target.text} (n/a: not reached)",
                _values(rows, "time_to_target_s"),
                "training time to the target (s, evaluation excluded)",
                f"no configuration reached {shown}",
            ),
            (*final, f"no configuration logged a {metric.name}"),
        ],
    )
    if fig is not None and target.value is not None:
        fig.suptitle(_wrap(fig, f"{title}\ntarget {target.text}: {target.why}", 10), fontsize=10)
    return fig


def _comm_memory(
    rows: list[dict[str, Any]], style: dict[int, Style], many: bool, title: str
) -> Any | None:
    return _bar_figure(
        rows,
        style,
        many,
        title,
        [
            (
                "Communication per sample",
                _values(rows, "bytes_per_sample", 1 / 1024),
                "bytes sent per training sample (KiB, all ranks)",
                "no configuration sent any bytes",
            ),
            (
                "Peak memory per worker",
                _values(rows, "peak_mem_mb"),
                "peak memory per worker (MiB, max over ranks)",
                "no configuration logged its memory",
            ),
        ],
    )


def _bubble(rows: list[dict[str, Any]], many: bool, title: str) -> Any:
    fig = _figure(1, 2 * len(rows))
    ax = fig.add_subplot()
    y = [2 * i for i in range(len(rows))]
    measured = _values(rows, "idle_frac", 100)
    theory = _values(rows, "bubble_theory", 100)
    color = _strategy_color(rows[0]["strategy"])
    for offset, values, label, c in (
        (-0.4, measured, "measured idle fraction", color),
        (0.4, theory, "GPipe bubble (n-1)/(m+n-1)", "0.6"),
    ):
        bars = ax.barh(
            [v + offset for v in y], [v or 0.0 for v in values], 0.8, color=c, label=label
        )
        for bar, v in zip(bars, values, strict=True):
            ax.annotate(
                three_figures(v) if v is not None else "not logged",
                (bar.get_width(), bar.get_y() + bar.get_height() / 2),
                xytext=(3, 0),
                textcoords="offset points",
                va="center",
                fontsize=8,
            )
    ax.set_yticks(y, [_label(r, many) for r in rows])
    ax.tick_params(axis="y", labelsize=8)
    ax.set_ylim(y[-1] + 1, -1)
    ax.margins(x=0.2)
    ax.set_xlabel("idle time (% of the step)")
    fig.suptitle(f"Pipeline idle time: {title}")
    ax.grid(axis="x", alpha=0.3)
    fig.legend(fontsize=8, loc="outside lower center", ncols=2)
    return fig


def figures(rows: list[dict[str, Any]], title: str, target: Target) -> dict[str, Any]:
    """The bench's figures of the ok ``rows``, by file stem (not yet saved).

    Args:
        rows: result rows (see :data:`deepjimu.bench.results.COLUMNS`); only ok ones are drawn.
        title: names the dataset (and what is shared by every run).
        target: the time-to-target figure and why it was chosen.

    Returns:
        throughput, accuracy_time (loss_time for a validation-loss target), time_to_target,
        comm_memory and, when a pipeline run finished, pipeline_bubble; a figure with
        nothing to show is left out. Each names, under it, the configurations that did not
        fit in their memory.
    """
    ok = [r for r in rows if r["status"] == "ok"]
    if not ok:
        return {}
    style = styles(ok)
    many = len({r["model"] for r in rows}) > 1
    out = {
        "throughput": _throughput(ok, style, many, title),
        ("accuracy_time" if target.metric.higher else "loss_time"): _over_time(
            ok, style, many, target, title
        ),
        "time_to_target": _target(ok, style, many, target, title),
        "comm_memory": _comm_memory(ok, style, many, title),
    }
    pipes = [r for r in ok if entry_traits(r["strategy"]).pipelined]
    if pipes:
        out["pipeline_bubble"] = _bubble(pipes, many, title)
    shown = {k: v for k, v in out.items() if v is not None}
    for fig in shown.values():
        _note(fig, _not_drawn(rows, many))
    return shown


def write_plots(
    rows: list[dict[str, Any]], out_dir: Path, title: str, target: Target
) -> list[Path]:
    """Write :func:`figures` as PNG files into ``out_dir`` (each atomically); the paths written.

    Raises:
        JimuError: the folder cannot be written.
    """
    return save_figures(figures(rows, title, target), out_dir, flag="--bench-dir")
