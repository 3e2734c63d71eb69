"""Seconds per full-batch pdADMM iteration: the public reference's computation against deepjimu's.

Same run, same synthetic MNIST-shaped data (N samples, 196 features, 10 classes, deepjimu's
``synthetic`` dataset), same MLP sizes and starting weights, rho = nu = 1e-4:

- reference: ``benchmarks/pdadmm_reference.py`` (the reference implementation's update
  functions: linearised p and W steps with backtracking, FISTA for z_L), once per ridge
  weight mu of its W step in ``--ref-mu``. The reference's own scripts use mu = 0.1 to 10
  (pdADMM-G, whose PyTorch functions these are) and no mu at all (pdADMM's TensorFlow MLP
  scripts): with mu > 0 the W line search accepts its first trial, with mu = 0 it needs 30-40
  objective evaluations per iteration. Both are reported, each with its own ratio;
- deepjimu: ``LayerBlock`` + ``serial_iteration`` (exact p and (W, b) solves), started by
  ``block.init_forward(x)``, with the parameters the ``admm`` strategy uses (tau = 1).

One warm-up iteration each, then ``--iters`` timed iterations that alternate between the two
sides (so background load hits both alike); the figure per side is the median, and the ratio
reference / deepjimu is taken between the medians of the same run. It also reports
deepjimu's FLOPs per iteration (matmuls, factorisations and solves, counted analytically by
``deepjimu.admm_math.flops``), the FLOP/s achieved and their fraction of a large matmul's
measured in the same run (8192^3 on CUDA, 4096^3 on a CPU); on CUDA, peak memory per side.

``--workers 1,2,4`` instead launches deepjimu's real ``admm`` strategy through
``deepjimu.launch.train`` for each worker count and reports, from its ``events.jsonl``, the
time per iteration and its split into compute and wait per rank.

Usage:
    python benchmarks/admm_speed.py [--layers 5] [--width 500] [--n 10000] [--iters 3]
    python benchmarks/admm_speed.py --device cuda --dtype tf32 --n 55000 --layers 10 --width 1000
    python benchmarks/admm_speed.py --workers 1,2,4
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from deepjimu.admm_math.flops import iteration_flops
from deepjimu.data import DataOptions, load_dataset
from deepjimu.models import build_model
from deepjimu.precision import autocast, matmul_precision
from deepjimu.strategies.admm.blocks import AdmmParams, LayerBlock
from deepjimu.strategies.admm.driver import serial_iteration
from deepjimu.strategies.admm.model import admm_maps

sys.path.insert(0, str(Path(__file__).resolve().parent))
from pdadmm_reference import init_reference, reference_iteration

__all__ = ["main"]

RHO = NU = 1e-4


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@contextlib.contextmanager
def _precision(device: torch.device, dtype: str) -> Iterator[None]:
    """The matmul mode of ``jimu train --precision dtype``: the same switches and autocast."""
    with matmul_precision(dtype, device), autocast(dtype, device):
        yield


def matmul_peak(device: torch.device, dtype: str, size: int = 8192, reps: int = 5) -> float:
    """FLOP/s of a size^3 matmul in ``dtype`` (the best of ``reps``)."""
    a = torch.randn(size, size, device=device)
    b = torch.randn(size, size, device=device)
    if dtype == "bf16":
        a, b = a.bfloat16(), b.bfloat16()
    with _precision(device, dtype):
        a @ b
        _sync(device)
        best = float("inf")
        for _ in range(reps):
            t0 = time.perf_counter()
            a @ b
            _sync(device)
            best = min(best, time.perf_counter() - t0)
    return 2 * size**3 / best


def _timed(step: Callable[[], None], device: torch.device) -> float:
    _sync(device)
    t0 = time.perf_counter()
    step()
    _sync(device)
    return time.perf_counter() - t0


def serial_speed(args: argparse.Namespace) -> None:
    device = torch.device(args.device)
    data = load_dataset("synthetic", DataOptions(synthetic_n=args.n, val_fraction=0.0))
    x, y = data.train_x.flatten(1).to(device), data.train_y.to(device)
    model = build_model(f"mlp:{args.width}x{args.layers - 1}", data.feature_shape, 10, seed=0)
    linears = admm_maps(model)
    W = [m.weight.detach().to(device) for m in linears]
    b = [m.bias.detach().to(device) for m in linears]
    widths = [W[0].shape[1]] + [w.shape[0] for w in W]
    L = len(W)
    print(
        f"pdADMM full batch: N={len(y)}, widths {widths}, rho=nu={RHO}, device {device}, "
        f"{args.dtype}, {torch.get_num_threads()} threads"
    )

    onehot = F.one_hot(y, 10).T.to(torch.float32).contiguous()
    made: dict[str, Any] = {}

    def setup_deepjimu() -> Callable[[], None]:
        block = LayerBlock(
            0, L, L, [w.clone() for w in W], [v.clone() for v in b], AdmmParams(RHO, NU, tau=1.0)
        )
        block.init_forward(x)
        made["deepjimu"] = block
        return lambda: serial_iteration(block, y)

    def setup_reference(mu: float) -> Callable[[], Callable[[], None]]:
        def setup() -> Callable[[], None]:
            ref = made[f"reference mu={mu:g}"] = init_reference(x, W, b)
            return lambda: reference_iteration(ref, onehot, RHO, mu)

        return setup

    sides = {"deepjimu": setup_deepjimu} if args.only in (None, "deepjimu") else {}
    if args.only in (None, "reference"):
        sides |= {f"reference mu={mu:g}": setup_reference(mu) for mu in args.ref_mu}
    setups = sides
    steps: dict[str, Callable[[], None]] = {}
    times: dict[str, list[float]] = {k: [] for k in setups}
    peak: dict[str, float] = {}
    resident = 0  # bytes held by the sides set up before (CUDA only)
    with _precision(device, args.dtype):
        for name, setup in setups.items():
            if device.type == "cuda":
                before = torch.cuda.memory_allocated(device)
                torch.cuda.reset_peak_memory_stats(device)
            steps[name] = setup()
            _timed(steps[name], device)  # warm-up
            if device.type == "cuda":
                peak[name] = (torch.cuda.max_memory_allocated(device) - resident) / 2**30
                resident += torch.cuda.memory_allocated(device) - before
        for _ in range(args.iters):
            for name, step in steps.items():
                times[name].append(_timed(step, device))
    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"\n{'side':<18} {'median s/iter':>14} {'min':>8} {'max':>8}  all")
    for k, v in times.items():
        print(f"{k:<18} {med[k]:>14.3f} {min(v):>8.3f} {max(v):>8.3f}  {[round(t, 3) for t in v]}")
    for k, ref in made.items():
        if k.startswith("reference"):
            print(
                f"{k}, last iteration: objective evaluations (one GEMM each) in the p line "
                f"searches {ref.trials['p']}, W line searches {ref.trials['W']}; "
                f"FISTA steps {ref.trials['fista']}"
            )
    if "deepjimu" in med:
        for k in med:
            if k.startswith("reference"):
                print(
                    f"ratio {k} / deepjimu: {med[k] / med['deepjimu']:.2f}x (medians), "
                    f"{min(times[k]) / min(times['deepjimu']):.2f}x (fastest)"
                )
    if "deepjimu" in made:
        _achieved(made["deepjimu"], widths, len(y), med["deepjimu"], device, args.dtype)
    for k, v in peak.items():
        print(f"peak memory {k} (data included, the other side's state not): {v:.2f} GiB")


def _achieved(
    block: LayerBlock, widths: list[int], n: int, seconds: float, device: torch.device, dtype: str
) -> None:
    """deepjimu's iteration FLOPs (counted analytically), the FLOP/s it achieved and their
    fraction of a large matmul's, measured now (8192^3 on a GPU, 4096^3 on a CPU)."""
    counts = iteration_flops(widths, n, data_gram_kept=block._data_gram is not None)
    kinds: dict[str, float] = {}
    for c in counts:
        kinds[c.kind] = kinds.get(c.kind, 0.0) + c.flops
    flops = sum(kinds.values())
    peak_flops = matmul_peak(device, dtype, 8192 if device.type == "cuda" else 4096)
    achieved = flops / seconds
    split = ", ".join(f"{k} {v / 1e9:.2f}" for k, v in kinds.items())
    print(
        f"deepjimu: {flops / 1e9:.2f} GFLOP per iteration ({split}), "
        f"{achieved / 1e9:.1f} GFLOP/s = {achieved / peak_flops:.1%} of the "
        f"{peak_flops / 1e9:.1f} GFLOP/s of a {dtype} matmul measured now"
    )


def workers_speed(args: argparse.Namespace) -> None:
    from deepjimu.config import RunConfig
    from deepjimu.launch import train

    iters = args.iters + 1
    print(
        f"admm strategy, full batch: N={args.n}, mlp:{args.width}x{args.layers - 1}, "
        f"{iters} iterations per run, device {args.device}, {args.dtype}"
    )
    print(
        f"\n{'workers':>7} {'s/iter':>8} {'last iter':>9}  "
        f"{'compute s/iter per rank':<30} wait s/iter per rank"
    )
    with tempfile.TemporaryDirectory() as tmp:
        for w in args.workers:
            cfg = RunConfig(
                strategy="admm",
                dataset="synthetic",
                synthetic_n=args.n,
                model=f"mlp:{args.width}x{args.layers - 1}",
                workers=w,
                epochs=iters,
                eval_every=iters,
                quiet=True,
                val_fraction=0.0,
                rho=RHO,
                nu=NU,
                device=args.device,
                precision=args.dtype,
                runs_dir=tmp,
                name=f"w{w}",
            )
            train(cfg)
            events = [
                json.loads(line)
                for line in (Path(tmp) / f"w{w}" / "events.jsonl").read_text().splitlines()
            ]
            e = events[-1]
            compute = [c / iters for c in e["compute_s_per_rank"]]
            wait = [c / iters for c in e["wait_s_per_rank"]]
            per_iter = max(c + t for c, t in zip(compute, wait, strict=True))
            print(
                f"{w:>7} {per_iter:>8.3f} {e['train_s'] / iters:>9.3f}  "
                f"{[round(c, 3) for c in compute]!s:<30} {[round(c, 3) for c in wait]}"
            )
    print(
        "\ns/iter: the slowest rank's (compute + wait) over the run / iterations (includes the"
        " start-up forward pass); last iter: the wall time of the last iteration."
    )


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=5, help="linear layers (hidden + output)")
    ap.add_argument("--width", type=int, default=500, help="hidden units per layer")
    ap.add_argument("--n", type=int, default=10000, help="training samples (full batch)")
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    ap.add_argument("--dtype", choices=("fp32", "tf32", "bf16"), default="fp32")
    ap.add_argument("--iters", type=int, default=3, help="timed iterations (after one warm-up)")
    ap.add_argument("--threads", type=int, default=2, help="torch CPU threads (serial mode)")
    ap.add_argument(
        "--only",
        choices=("deepjimu", "reference"),
        default=None,
        help="time one side (e.g. when both sides' state would not fit in GPU memory at once)",
    )
    ap.add_argument(
        "--ref-mu",
        type=lambda s: [float(m) for m in s.split(",")],
        default=[0.1, 0.01, 0.0],
        help="comma-separated ridge weights of the reference's W step, one reference side each "
        "(default: 0.1,0.01,0: its pdADMM-G scripts' smallest, the issue's, the paper's problem)",
    )
    ap.add_argument(
        "--workers",
        type=lambda s: [int(w) for w in s.split(",")],
        default=None,
        help="comma-separated worker counts: run the admm strategy instead",
    )
    args = ap.parse_args(argv)
    if args.dtype == "tf32" and args.device != "cuda":
        ap.error("--dtype tf32 needs --device cuda")
    if args.device == "cuda" and not torch.cuda.is_available():
        ap.error("--device cuda: no CUDA device")
    if args.workers:
        workers_speed(args)
        return
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    serial_speed(args)


if __name__ == "__main__":
    main()
