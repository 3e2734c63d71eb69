"""Tests of the bench plots: labels that fit, a distinct and stable style per configuration,
enough digits, no empty panel, and a target that says where it comes from."""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

from matplotlib.backends.backend_agg import FigureCanvasAgg

from deepjimu.bench.plots import figures
from deepjimu.bench.results import Target, add_speedups, add_time_to_target, choose_target
from deepjimu.record.read import VAL_LOSS

STRATEGIES = ("local", "ddp", "model-parallel", "pipeline", "admm")
TARGET = Target(0.9, "set with --target-acc")


def _row(
    tmp: Path, strategy: str, workers: int, options: str, model: str = "mlp:256x3", **extra: Any
) -> dict[str, Any]:
    """An ok result row whose run folder holds three events."""
    run_dir = tmp / f"{strategy}-{workers}-{model}-{options}".replace(":", "").replace("=", "")
    run_dir.mkdir(parents=True, exist_ok=True)
    acc = 0.9 + 0.001 * workers + 0.001 * len(options)
    events = [{"epoch": e, "train_s": 0.1 * e * workers, "test_acc": acc - 0.01 * (3 - e)}
              for e in (1, 2, 3)]  # fmt: skip
    (run_dir / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    row = {"strategy": strategy, "workers": workers, "model": model, "options": options,
           "status": "ok", "samples_per_s": 1000.0 + 37 * workers, "test_acc": acc,
           "time_to_target_s": 0.2 * workers, "bytes_per_sample": 2048.0 * workers,
           "peak_mem_mb": 300.0 + workers, "idle_frac": 0.1, "bubble_theory": 0.2,
           "run_dir": str(run_dir)}  # fmt: skip
    return row | extra


def _matrix(tmp: Path, strategies: tuple[str, ...] = STRATEGIES) -> list[dict[str, Any]]:
    rows = [
        _row(tmp, s, w, f"compress={c}")
        for s, c, w in itertools.product(strategies, ("none", "bf16", "fp16"), (1, 2, 3))
    ]
    add_speedups(rows)
    return rows


def _drawn(rows: list[dict[str, Any]], target: Target = TARGET) -> dict[str, Any]:
    figs = figures(rows, "digits, seed 0, 2 epochs", target)
    for fig in figs.values():
        FigureCanvasAgg(fig).draw()
    return figs


def _bars(fig: Any) -> list[Any]:
    return [p for p in fig.axes[0].patches if p.get_width() > 0]


def _data_lines(ax: Any) -> list[Any]:
    return [ln for ln in ax.get_lines() if ln.get_gid() != "reference" and len(ln.get_xdata())]


def _in_view(axis: Any, loc: float) -> bool:
    """Whether a tick is drawn: the locator also places ticks just outside the view."""
    lo, hi = sorted(axis.get_view_interval())
    return bool(lo <= loc <= hi)


def test_tick_labels_do_not_overlap_and_stay_in_the_figure(tmp_path: Path) -> None:
    for rows in (_matrix(tmp_path), _matrix(tmp_path)[:3]):  # 45 configurations, and 3
        for name, fig in _drawn(rows).items():
            renderer = fig.canvas.get_renderer()
            for ax in fig.axes:
                for axis in (ax.xaxis, ax.yaxis):
                    boxes = [
                        t.label1.get_window_extent(renderer)
                        for t in axis.get_major_ticks()
                        if _in_view(axis, t.get_loc())
                        and t.label1.get_visible()
                        and t.label1.get_text()
                    ]
                    if axis is fig.axes[0].yaxis and name != "accuracy_time":
                        drawn = [
                            r
                            for r in rows
                            if name != "pipeline_bubble" or r["strategy"] == "pipeline"
                        ]
                        assert len(boxes) == len(drawn), name  # a label per configuration
                    for a, b in itertools.combinations(boxes, 2):
                        assert not a.overlaps(b), (name, a, b)
                    for box in boxes:
                        assert fig.bbox.contains(box.x0, box.y0), (name, box)
                        assert fig.bbox.contains(box.x1, box.y1), (name, box)


def test_titles_notes_and_legends_stay_in_the_figure(tmp_path: Path) -> None:
    one = [_row(tmp_path, "ddp", 2, f"compress={c}") for c in ("none", "bf16", "fp16")]
    few = [_row(tmp_path, s, w, "") for s in ("local", "ddp") for w in (1, 2)][1:]
    add_speedups(few)
    for rows in (_matrix(tmp_path), one, few):
        for name, fig in _drawn(rows).items():
            renderer = fig.canvas.get_renderer()
            texts = [fig._suptitle, fig._supxlabel, *fig.texts, *fig.legends]
            for ax in fig.axes:
                texts += [ax.title, ax.xaxis.label, ax.yaxis.label, *ax.texts]
                texts += [ax.get_legend()] if ax.get_legend() else []
            for t in texts:
                if (
                    t is None
                    or not t.get_visible()
                    or (hasattr(t, "get_text") and not t.get_text())
                ):
                    continue
                box = t.get_window_extent(renderer)
                assert fig.bbox.x0 - 1 <= box.x0 and box.x1 <= fig.bbox.x1 + 1, (name, t)
                assert fig.bbox.y0 - 1 <= box.y0 and box.y1 <= fig.bbox.y1 + 1, (name, t)


def test_every_configuration_has_its_own_style(tmp_path: Path) -> None:
    rows = _matrix(tmp_path)
    figs = _drawn(rows)
    bars = _bars(figs["throughput"])
    assert len(bars) == len(rows) == 45
    looks = {(tuple(b.get_facecolor()), b.get_hatch()) for b in bars}
    assert len(looks) == len(rows)
    lines = _data_lines(figs["accuracy_time"].axes[0])
    assert len(lines) == len(rows)
    looks = {
        (ln.get_color(), str(ln.get_linestyle()), ln.get_marker(), ln.get_fillstyle())
        for ln in lines
    }
    assert len(looks) == len(rows)
    two_models = [_row(tmp_path, "ddp", 2, ""), _row(tmp_path, "ddp", 2, "", model="mlp:64x2")]
    bars = _bars(_drawn(two_models)["throughput"])
    assert (tuple(bars[0].get_facecolor()), bars[0].get_hatch()) != (
        tuple(bars[1].get_facecolor()),
        bars[1].get_hatch(),
    )


def test_a_strategy_keeps_its_colour_from_one_bench_to_the_next(tmp_path: Path) -> None:
    def ddp_x2_colour(strategies: tuple[str, ...]) -> tuple[float, ...]:
        rows = [_row(tmp_path, s, w, "") for s in strategies for w in (1, 2)]
        fig = _drawn(rows)["throughput"]
        labels = [t.get_text() for t in fig.axes[0].get_yticklabels()]
        return tuple(fig.axes[0].patches[labels.index("ddp x2")].get_facecolor())

    assert ddp_x2_colour(("local", "ddp")) == ddp_x2_colour(("admm", "pipeline", "ddp"))
    assert ddp_x2_colour(("ddp",)) == ddp_x2_colour(("local", "ddp"))


def test_no_panel_is_empty_and_a_left_out_one_says_why(tmp_path: Path) -> None:
    # the README's bench: ddp x2 with three --compress options; no 1-worker run to compare
    rows = [_row(tmp_path, "ddp", 2, f"compress={c}") for c in ("none", "bf16", "fp16")]
    rows[1]["time_to_target_s"] = None
    add_speedups(rows)
    figs = _drawn(rows)
    for name, fig in figs.items():
        for ax in fig.axes:
            assert _bars(fig) if ax.patches else _data_lines(ax), (name, ax.get_title())
    assert len(figs["throughput"].axes) == 1  # no speedup panel...
    note = figs["throughput"].get_supxlabel()
    assert "No speedup panel" in note and "1-worker run" in note  # ...and the figure says why
    local = [_row(tmp_path, "local", 1, "", bytes_per_sample=0.0, time_to_target_s=None)]
    figs = _drawn(local)
    assert [ax.get_title() for ax in figs["comm_memory"].axes] == ["Peak memory per worker"]
    assert "no configuration sent any bytes" in figs["comm_memory"].get_supxlabel()
    assert [ax.get_title() for ax in figs["time_to_target"].axes] == ["Final test accuracy"]
    assert "no configuration reached 90%" in figs["time_to_target"].get_supxlabel()


def test_bar_values_have_three_significant_figures(tmp_path: Path) -> None:
    rows = [
        _row(tmp_path, "ddp", 2, "compress=none", time_to_target_s=0.28),
        _row(tmp_path, "ddp", 2, "compress=bf16", time_to_target_s=0.26),
        _row(tmp_path, "ddp", 2, "compress=fp16", time_to_target_s=11651.2),
    ]
    ax = _drawn(rows)["time_to_target"].axes[0]
    assert [t.get_text() for t in ax.texts] == ["0.280", "0.260", "11651"]


def test_the_target_and_its_reason_are_in_the_plot(tmp_path: Path) -> None:
    rows = [_row(tmp_path, "admm", 2, "", test_acc=0.812), _row(tmp_path, "ddp", 2, "")]
    rows[1]["test_acc"] = 0.79
    target = choose_target(rows, None)
    assert target.value == 0.77  # 95% of 81.2%, rounded down
    fig = _drawn(rows, target)["time_to_target"]
    title = fig.get_suptitle()
    assert "target 77%" in title
    assert "95% of the best final test accuracy, 81.20% (admm x2" in " ".join(title.split())
    assert choose_target(rows, 0.5) == Target(0.5, "set with --target-acc")


def test_a_language_models_target_is_a_validation_loss_reached_from_above(tmp_path: Path) -> None:
    rows = [_row(tmp_path, "local", 1, ""), _row(tmp_path, "ddp", 2, "")]
    for row, losses in zip(rows, ([2.4, 2.0, 1.8536], [2.5, 2.1, 1.95]), strict=True):
        events = [{"epoch": e, "train_s": 10.0 * e, "val_loss": v} for e, v in enumerate(losses)]
        Path(row["run_dir"], "events.jsonl").write_text(
            "".join(json.dumps(e) + "\n" for e in events)
        )
        row["val_loss"] = losses[-1]
    target = choose_target(rows, None, VAL_LOSS)
    assert target.value == 1.96  # 1.8536 / 0.95 = 1.951, rounded up: within reach of the best
    assert target.text == "validation loss 1.96" and "(local x1 mlp:256x3)" in target.why
    add_time_to_target(rows, target)
    assert [r["time_to_target_s"] for r in rows] == [20.0, 20.0]  # the first at or below
    add_time_to_target(rows, choose_target(rows, 1.9, VAL_LOSS))
    assert [r["time_to_target_s"] for r in rows] == [20.0, None]  # 1.95 never reached 1.9
    figs = _drawn(rows, target)
    assert "accuracy_time" not in figs
    ax = figs["loss_time"].axes[0]
    assert ax.get_ylabel() == "validation loss (nats)"
    assert [ln.get_ydata()[0] for ln in ax.get_lines() if ln.get_gid() == "reference"] == [1.96]
    assert "target validation loss 1.96" in figs["time_to_target"].get_suptitle()


def test_every_figure_names_the_configurations_that_did_not_fit(tmp_path: Path) -> None:
    rows = [_row(tmp_path, "tp", 4, "none"), _row(tmp_path, "pipeline", 4, "none")]
    rows += [{"strategy": s, "workers": 2, "model": "mlp:256x3", "options": "none",
              "status": "does-not-fit", "error": "worker 1 passed its memory budget ..."}
             for s in ("model-parallel", "admm")]  # fmt: skip
    add_speedups(rows)
    figs = _drawn(rows)
    assert {"throughput", "comm_memory", "pipeline_bubble"} <= set(figs)
    for name, fig in figs.items():
        note = fig.get_supxlabel().replace("\n", " ")
        assert "Does not fit in its memory" in note, name
        assert "model-parallel x2" in note and "admm x2" in note, name
    # nothing is said where everything fitted
    assert not any("fit" in f.get_supxlabel() for f in _drawn(rows[:2]).values())
