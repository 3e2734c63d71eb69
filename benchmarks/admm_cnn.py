"""Serial pdADMM on a CNN (every layer in one process): test accuracy, CG iterations, settings.

A prototype of what ``LayerBlock`` + ``serial_iteration`` will do for conv layers: the same
Jacobi iteration p -> (W, b) -> z -> q -> u, written over the layer operators of
``strategies/admm/layers.py`` (conv layers with the previous block's average pooling folded
in, then the dense classifier). The model, its initial weights and the data split are those
of ``jimu train --model SPEC`` (seed 0, 10% of the training split held out for validation),
so the test accuracy compares directly with ``jimu train --strategy local --model SPEC``.

Before the first iteration every hidden layer is rescaled to unit-RMS activations
(``layers.unit_scales``: the network's function is unchanged; ``--no-unit-scales`` skips it).
Per setting it prints the test (and train) accuracy after each iteration count in
``--report``, the CG iterations per p-step (mean and largest over layers and iterations) and
how often the cap was hit. Timings are informative only (the development machine is shared).

Usage:
    python benchmarks/admm_cnn.py                                   # cnn:16-32, rho = nu = 1
    python benchmarks/admm_cnn.py --rho 1,0.1 --nu 1,10 --report 30,100
    python benchmarks/admm_cnn.py --model cnn:16x8 --solver dense
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import time
from dataclasses import dataclass, field

import deepjimu  # noqa: F401  (before torch: OpenMP's wait policy as deepjimu's workers have it)

# isort: split
import torch
from torch import Tensor, nn

from deepjimu.data import DataOptions, load_dataset
from deepjimu.models import build_model
from deepjimu.strategies.admm import conv as C
from deepjimu.strategies.admm import updates as U
from deepjimu.strategies.admm.layers import ConvOp, LayerOp, layer_ops, unit_scales

__all__ = ["SerialCNN", "main"]


@dataclass
class SerialCNN:
    """All pdADMM variables of an mlp or cnn model in one process (``LayerBlock``'s layout).

    ``p[l]`` is the input of layer l (p[0] = data), ``q[l]`` its output (not pooled) and
    ``u[l]`` the dual of p[l+1] = q[l].
    """

    ops: list[LayerOp]
    W: list[Tensor]
    b: list[Tensor]
    rho: float = 1.0
    nu: float = 1.0
    tau: float = 1.0
    p: list[Tensor] = field(default_factory=list)
    z: list[Tensor] = field(default_factory=list)
    q: list[Tensor] = field(default_factory=list)
    u: list[Tensor] = field(default_factory=list)
    cg_iters: list[int] = field(default_factory=list)
    cg_capped: int = 0
    _gram: Tensor | None = None

    @classmethod
    def from_model(
        cls, model: nn.Sequential, feature_shape: tuple[int, ...], **kw: float
    ) -> SerialCNN:
        ops = layer_ops(model, feature_shape)
        maps = [m for m in model.modules() if isinstance(m, nn.Conv2d | nn.Linear)]
        W = [m.weight.detach().clone() for m in maps]
        b = [m.bias.detach().clone() for m in maps]
        return cls(ops, W, b, **kw)

    @property
    def L(self) -> int:
        return len(self.ops)

    @torch.no_grad()
    def init_forward(self, x: Tensor) -> None:
        """z, q by a forward pass from the data, p[l+1] = q[l], u = 0."""
        self.p, self.z, self.q, self.u, self._gram = [x], [], [], [], None
        for l, op in enumerate(self.ops):
            a = op.forward(self.p[l], self.W[l], self.b[l])
            self.z.append(a)
            if l < self.L - 1:
                self.q.append(torch.relu(a))
                self.u.append(torch.zeros_like(a))
                self.p.append(self.q[l])

    @torch.no_grad()
    def iterate(self, y: Tensor) -> None:
        """One Jacobi iteration, as ``driver.serial_iteration``: p -> (W, b) -> z -> q -> u."""
        rho, nu = self.rho, self.nu
        new_p = [self.p[0]]
        for l in range(1, self.L):
            sol = self.ops[l].solve_p(
                self.W[l], self.b[l], self.z[l], self.q[l - 1], self.u[l - 1], rho, nu,
                p_old=self.p[l],
            )  # fmt: skip
            new_p.append(sol.p)
            if isinstance(self.ops[l], ConvOp) and self.ops[l].solver is C.PSolver.CG:
                self.cg_iters.append(sol.iterations)
                self.cg_capped += int(not sol.converged)
        self.p = new_p
        for l, op in enumerate(self.ops):
            if l == 0 and self._gram is None:  # the data's patch Gram is the same every iteration
                x = self.p[0]
                rows = C.patch_rows(x, op.kernel) if isinstance(op, ConvOp) else x.flatten(1)
                self._gram = U.centred_gram(rows)
            gram = self._gram if l == 0 else None
            self.W[l], self.b[l] = op.solve_Wb(
                self.p[l], self.z[l], self.W[l], nu, tau=self.tau, gram=gram
            )
            a = op.forward(self.p[l], self.W[l], self.b[l])
            if l == self.L - 1:
                self.z[l] = U.update_z_last(a, y, self.z[l], nu).z
            else:
                self.z[l] = U.update_z_hidden(a, self.q[l], self.z[l])
        for l in range(self.L - 1):
            self.q[l] = U.update_q(self.p[l + 1], self.u[l], self.z[l], rho, nu)
            self.u[l] = U.update_u(self.u[l], self.p[l + 1], self.q[l], rho)

    @torch.no_grad()
    def predict(self, x: Tensor) -> Tensor:
        for l, op in enumerate(self.ops):
            x = op.forward(x, self.W[l], self.b[l])
            if l < self.L - 1:
                x = torch.relu(x)
        return x.argmax(dim=1)

    def write_back(self, model: nn.Sequential) -> None:
        maps = [m for m in model.modules() if isinstance(m, nn.Conv2d | nn.Linear)]
        with torch.no_grad():
            for m, W, b in zip(maps, self.W, self.b, strict=True):
                m.weight.copy_(W)
                m.bias.copy_(b)


def run_setting(args: argparse.Namespace, rho: float, nu: float) -> None:
    data = load_dataset(
        args.dataset, DataOptions(data_dir=args.data_dir, downsample=args.downsample)
    )
    model = build_model(args.model, data.feature_shape, data.num_classes, seed=0)
    net = SerialCNN.from_model(model, data.feature_shape, rho=rho, nu=nu, tau=args.tau)
    if not args.no_unit_scales:
        net.W, net.b, _ = unit_scales(net.ops, net.W, net.b, data.train_x)
    for l, op in enumerate(net.ops):
        if isinstance(op, ConvOp):
            solver = args.solver
            if solver == "auto":
                solver = C.choose_p_solver(
                    op.map_shape, op.c_out, op.kernel, cg_iters=args.auto_iters
                )
            net.ops[l] = ConvOp(
                op.in_shape,
                op.c_out,
                op.kernel,
                op.pool,
                C.PSolver(solver),
                args.cg_tol,
                args.cg_max_iter,
            )
    solvers = [op.solver.value if isinstance(op, ConvOp) else "exact" for op in net.ops[1:]]
    t0 = time.perf_counter()
    net.init_forward(data.train_x)
    report = sorted(int(r) for r in args.report.split(","))
    accs, trains = {}, {}
    for it in range(1, report[-1] + 1):
        net.iterate(data.train_y)
        if it in report:
            train = float((net.predict(data.train_x) == data.train_y).float().mean())
            accs[it] = float((net.predict(data.test_x) == data.test_y).float().mean())
            trains[it] = train
    elapsed = time.perf_counter() - t0
    net.write_back(model)
    check = float((model.eval()(data.test_x).argmax(1) == data.test_y).float().mean())
    assert abs(check - accs[report[-1]]) < 1e-9, "the layer operators must compute the model"
    its = net.cg_iters
    cg = f"{statistics.mean(its):.1f} / {max(its)}" if its else "-"
    acc_txt = " | ".join(f"{accs[r]:.4f} ({trains[r]:.3f})" for r in report)
    units = "no" if args.no_unit_scales else "yes"
    print(
        f"| {args.model} | {rho:g} | {nu:g} | {units} | {','.join(solvers)} | {acc_txt} | {cg} | "
        f"{net.cg_capped} | {elapsed / report[-1]:.2f} |",
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
    ap.add_argument("--solver", default="cg", choices=("cg", "dense", "auto"))
    ap.add_argument("--auto-iters", type=float, default=10.0, help="CG iterations 'auto' expects")
    ap.add_argument("--cg-tol", type=float, default=1e-3)
    ap.add_argument("--cg-max-iter", type=int, default=50)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    ap.add_argument(
        "--no-unit-scales", action="store_true", help="skip layers.unit_scales (raw torch init)"
    )
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    report = args.report.split(",")
    print(
        "| model | rho | nu | unit scales | p solvers (layers 2..L) | "
        + " | ".join(f"test (train) acc @{r}" for r in report)
        + " | CG iters mean / max | CG caps hit | s/iter |"
    )
    print("|---" * (9 + len(report)) + "|")
    for rho, nu in itertools.product(
        (float(r) for r in args.rho.split(",")), (float(n) for n in args.nu.split(","))
    ):
        run_setting(args, rho, nu)


if __name__ == "__main__":
    main()
