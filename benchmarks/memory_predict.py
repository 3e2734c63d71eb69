"""Each rank's predicted peak memory against the peak it measured, for every run of a bench.

Runs ``jimu bench`` (every strategy, 1-3 workers, two models on digits, 2 epochs; or reads a
finished bench folder with ``--bench``), then, for every finished run and every rank, puts
the prediction the launcher's pre-check and ``jimu plan`` make
(``strategies.registry.rank_peaks``: the strategy's part, the whole model it was built from,
the process's base and the data) beside the rank's measured peak RSS (``VmHWM``), and prints
the table and ``median |error| M%, worst W%``, then the same with a split model cut as its
run cut it (by measured block times, which the prediction replaces by FLOPs)::

    python benchmarks/memory_predict.py
    python benchmarks/memory_predict.py --bench bench/mem    # a finished bench
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

from deepjimu.config import RunConfig
from deepjimu.data import DataOptions, load_dataset
from deepjimu.measure.blocks import layers_of
from deepjimu.models import build_model
from deepjimu.strategies.registry import rank_peaks


def run_split(run: Path) -> list[int] | None:
    """The blocks of each rank of a split model's run in folder ``run``, as it cut them
    (its last event's ``stage_blocks``, admm's ``admm_blocks``); None for other runs."""
    summary = json.loads((run / "summary.json").read_text())
    last = json.loads((run / "events.jsonl").read_text().splitlines()[-1])
    sizes = summary.get("admm_blocks") or last.get("stage_blocks")
    return list(sizes) if sizes and len(sizes) == summary["workers"] else None


def predicted(run: Path, as_run: bool = False) -> list[float]:
    """Each rank's predicted peak (MB) of the run in folder ``run``, from its config; with
    ``as_run``, a split model cut as the run cut it (its measured block times decide the cut
    the prediction otherwise makes from FLOPs: where two cuts tie, the largest block lands on
    another rank, which is the split's prediction, not the memory's)."""
    saved = json.loads((run / "config.json").read_text())
    cfg = RunConfig.from_dict(
        {k: v for k, v in saved.items() if k in RunConfig.__dataclass_fields__}
    )
    cut = run_split(run) if as_run else None
    data = load_dataset(cfg.dataset, DataOptions.from_config(cfg))
    with torch.device("meta"):
        model = build_model(cfg.model, data.feature_shape, data.num_classes)
    layers = layers_of(model, data.train_x[:1])
    splits = (data.train_x, data.train_y, data.val_x, data.val_y, data.test_x, data.test_y)
    data_bytes = sum(t.numel() * t.element_size() for t in splits)
    peaks = rank_peaks(cfg, layers, len(data.train_x), data_bytes, cuda=False, cut=cut)
    return [p / 2**20 for p in peaks]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bench", default=None, help="a finished bench folder (default: run one)")
    ap.add_argument("--models", default="mlp:1024x4,mlp:4096x2")
    ap.add_argument("--workers", default="1,2,3")
    args = ap.parse_args()
    if args.bench is None:
        out = Path(tempfile.mkdtemp(prefix="memory-predict-")) / "bench"
        cmd = [
            sys.executable, "-m", "deepjimu", "bench", "--bench-dir", str(out.parent), "--name",
            "bench", "--workers", args.workers, "--models", args.models, "--epochs", "2",
        ]  # fmt: skip
        print("$", " ".join(cmd[1:]), flush=True)
        subprocess.run(cmd, check=False, stdout=subprocess.DEVNULL)
    else:
        out = Path(args.bench)
    errors, given = [], []  # |error| with the predicted split, and with the run's split
    head = f"{'run':<32}{'rank':>5}{'predicted MB':>14}{'measured MB':>13}{'error':>8}"
    print(f"{head}{'run cut':>9}{'error':>8}")
    for summary in sorted((out / "runs").glob("*/summary.json")):
        run = summary.parent
        measured = json.loads(summary.read_text()).get("peak_mem_mb_per_rank") or []
        rows = zip(predicted(run), predicted(run, as_run=True), measured, strict=False)
        for rank, (p, q, m) in enumerate(rows):
            errors.append(abs((p - m) / m))
            given.append(abs((q - m) / m))
            line = f"{run.name:<32}{rank:>5}{p:>14.0f}{m:>13.0f}{(p - m) / m:>+8.0%}"
            print(f"{line}{q:>9.0f}{(q - m) / m:>+8.0%}")
    if not errors:
        raise SystemExit(f"no finished run in {out / 'runs'}")
    print(
        f"\n{len(errors)} ranks of {out}: median |error| {statistics.median(errors):.0%}, "
        f"worst {max(errors):.0%}; a split model cut as its run cut it: median "
        f"{statistics.median(given):.0%}, worst {max(given):.0%}"
    )


if __name__ == "__main__":
    main()
