"""Serial pdADMM on a CNN (every layer in one process): test accuracy, CG iterations, settings.

The iteration is ``driver.serial_iteration`` on a ``blocks.LayerBlock`` that owns every layer:
p -> (W, b) -> z -> q -> u over the layer operators of ``strategies/admm/layers.py`` (conv
layers with the previous block's average pooling folded in, then the dense classifier), with
the parameters the ``admm`` strategy uses (tau = 1). The model, its initial weights and the data split are those
of ``jimu train --model SPEC`` (seed 0, 10% of the training split held out for validation),
so the test accuracy compares directly with ``jimu train --strategy local --model SPEC``.

Before the first iteration every hidden layer is rescaled to unit-RMS activations (the
``--admm-init unit`` start, ``LayerBlock.init_forward(..., unit=True)``: the network's function
is unchanged; ``--no-unit-scales`` skips it). ``jimu train --strategy admm --model SPEC`` runs
the same iteration on one or more workers; this script adds the solver and tolerance knobs.
Per setting it prints the test (and train) accuracy after each iteration count in
``--report``, how well the auxiliary logits z_L fit the training labels at the end, the CG iterations per p-step (mean and largest over layers and iterations) and
how often the cap was hit. Timings are informative only (the development machine is shared).

Usage:
    python benchmarks/admm_cnn.py                                   # cnn:16-32, rho = nu = 1
    python benchmarks/admm_cnn.py --rho 1,0.1 --nu 1,10 --report 30,100
    python benchmarks/admm_cnn.py --model cnn:16x8 --solver dense
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import time

import deepjimu  # noqa: F401  (before torch: OpenMP's wait policy as deepjimu's workers have it)

# isort: split
import torch
from torch import nn

from deepjimu.admm_math import conv as C
from deepjimu.data import DataOptions, load_dataset
from deepjimu.models import build_model
from deepjimu.strategies.admm.blocks import AdmmParams, LayerBlock
from deepjimu.strategies.admm.driver import serial_iteration
from deepjimu.strategies.admm.layers import ConvOp, layer_ops

__all__ = ["main"]


def _accuracy(block: LayerBlock, x: torch.Tensor, y: torch.Tensor) -> float:
    return float((block.forward(x).argmax(dim=1) == y).float().mean())


def run_setting(args: argparse.Namespace, rho: float, nu: float) -> None:
    data = load_dataset(
        args.dataset, DataOptions(data_dir=args.data_dir, downsample=args.downsample)
    )
    model = build_model(args.model, data.feature_shape, data.num_classes, seed=0)
    ops = layer_ops(model, data.feature_shape)
    for l, op in enumerate(ops):
        if isinstance(op, ConvOp):
            solver = op.solver if args.solver == "auto" else C.PSolver(args.solver)
            ops[l] = dataclasses.replace(
                op, solver=solver, cg_tol=args.cg_tol, cg_max_iter=args.cg_max_iter
            )
    maps = [m for m in model.modules() if isinstance(m, nn.Conv2d | nn.Linear)]
    W = [m.weight.detach().clone() for m in maps]
    b = [m.bias.detach().clone() for m in maps]
    L = len(ops)
    block = LayerBlock(0, L, L, W, b, AdmmParams(rho=rho, nu=nu, tau=args.tau), ops)
    solvers = [op.solver.value if isinstance(op, ConvOp) else "exact" for op in ops[1:]]
    t0 = time.perf_counter()
    if args.no_unit_scales:
        block.init_forward(data.train_x)
    else:
        block.init_forward(data.train_x, (1.0, 0.0), unit=True)
    report = sorted(int(r) for r in args.report.split(","))
    accs, trains = {}, {}
    for it in range(1, report[-1] + 1):
        serial_iteration(block, data.train_y)  # type: ignore[arg-type]
        if it in report:
            trains[it] = _accuracy(block, data.train_x, data.train_y)
            accs[it] = _accuracy(block, data.test_x, data.test_y)
    elapsed = time.perf_counter() - t0
    with torch.no_grad():
        for m, W_l, b_l in zip(maps, block.W.values(), block.b.values(), strict=True):
            m.weight.copy_(W_l)
            m.bias.copy_(b_l)
    check = float((model.eval()(data.test_x).argmax(1) == data.test_y).float().mean())
    assert abs(check - accs[report[-1]]) < 1e-9, "the layer operators must compute the model"
    cg = "-"
    if block.cg_solves:
        cg = f"{block.cg_iters / block.cg_solves:.1f} / {block.cg_solves}"
    acc_txt = " | ".join(f"{accs[r]:.4f} ({trains[r]:.3f})" for r in report)
    # the auxiliary logits z_L against the labels: how well pdADMM's own variables fit the
    # training set, which the network's forward pass (train acc) may not reproduce
    aux = float((block.z[L - 1].argmax(dim=1) == data.train_y).float().mean())
    units = "no" if args.no_unit_scales else "yes"
    print(
        f"| {args.model} | {rho:g} | {nu:g} | {units} | {','.join(solvers)} | {acc_txt} | "
        f"{aux:.3f} | {cg} | "
        f"{block.cg_hits} | {elapsed / report[-1]:.2f} |",
        flush=True,
    )


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="cnn:16-32")
    ap.add_argument("--dataset", default="digits")
    ap.add_argument("--data-dir", default="data")
    ap.add_argument("--downsample", type=int, default=1)
    ap.add_argument("--rho", default="1", help="comma-separated values")
    ap.add_argument("--nu", default="1", help="comma-separated values")
    ap.add_argument("--tau", type=float, default=1.0, help="proximal weight of the (W, b) step")
    ap.add_argument("--report", default="30,100", help="iteration counts to report accuracy at")
    ap.add_argument(
        "--solver", default="auto", choices=("auto", "cg", "dense"), help="auto: layer_ops' choice"
    )
    ap.add_argument("--cg-tol", type=float, default=1e-3)
    ap.add_argument("--cg-max-iter", type=int, default=50)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    ap.add_argument(
        "--no-unit-scales", action="store_true", help="skip the unit start (raw torch init)"
    )
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    report = args.report.split(",")
    print(
        "| model | rho | nu | unit scales | p solvers (layers 2..L) | "
        + " | ".join(f"test (train) acc @{r}" for r in report)
        + " | z_L train acc | CG iters per p-step / CG p-steps | CG caps hit | s/iter |"
    )
    print("|---" * (9 + len(report)) + "|")
    for rho, nu in itertools.product(
        (float(r) for r in args.rho.split(",")), (float(n) for n in args.nu.split(","))
    ):
        run_setting(args, rho, nu)


if __name__ == "__main__":
    main()
