"""Train an MLP by pdADMM from your own script, serially or one block of layers per rank.

    python examples/admm_api.py                           # serial
    python examples/admm_api.py --workers 2               # 2 ranks, under torch's launcher
    torchrun --nproc-per-node 2 -- examples/admm_api.py   # the same, launched by hand

(the ``--`` keeps torchrun's own parser from reading ``--nu`` as its ``--numa-binding``.)

It prints one JSON line (the iterations, the objective and residual of the last one, the
train and test accuracy), which equals what ``jimu train --strategy admm --workers W``
reports on digits: its defaults are jimu train's, read from where jimu train reads them
(``RunConfig``'s fields, the strategy's iterations, and ``PdADMM``'s own defaults, which are
the admm strategy's for the model's kind: ``--model cnn:4-8`` trains a CNN), and each flag below is the jimu train flag of the same name
(``--iterations``: ``--epochs``, ``--momentum``: ``--admm-momentum``). The model holds the
readout of the iterate, ``--admm-readout auto``, as jimu train evaluates it.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

import torch
import torch.distributed as dist

from deepjimu import PdADMM
from deepjimu.config import RunConfig
from deepjimu.data import DataOptions, load_dataset
from deepjimu.models import build_model
from deepjimu.strategies.registry import entry


def main() -> None:
    train = RunConfig()  # jimu train's defaults, where jimu train reads them
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--iterations", type=int, default=entry("admm").traits.default_epochs)
    parser.add_argument("--model", default=train.model)
    parser.add_argument("--rho", type=float, default=train.rho)
    parser.add_argument("--nu", type=float, default=train.nu)
    parser.add_argument("--seed", type=int, default=train.seed)
    parser.add_argument("--momentum", type=float, help="default: jimu train's for the model's kind")
    args = parser.parse_args()
    if args.workers > 1 and "RANK" not in os.environ:  # start the ranks: torchrun, this script
        launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
        launcher += [f"--nproc-per-node={args.workers}", "--", __file__, *sys.argv[1:]]
        raise SystemExit(subprocess.call(launcher))

    group = None
    if "RANK" in os.environ:  # under a launcher: one block of layers per rank of the world
        dist.init_process_group("gloo")
        group = dist.group.WORLD
    data = load_dataset("digits", DataOptions(seed=args.seed))
    model = build_model(args.model, data.feature_shape, data.num_classes, seed=args.seed)

    given = {"momentum": args.momentum} if args.momentum is not None else {}
    admm = PdADMM(model, rho=args.rho, nu=args.nu, group=group, **given)
    admm.init(data.train_x)
    for _ in range(args.iterations):
        result = admm.step(data.train_x, data.train_y)  # the weights are now in `model`

    admm.gather()  # every rank's layers into every rank's model
    with torch.no_grad():
        train_acc = (model(data.train_x).argmax(1) == data.train_y).float().mean().item()
        test_acc = (model(data.test_x).argmax(1) == data.test_y).float().mean().item()
    if group is None or dist.get_rank() == 0:
        out = {"iterations": result.iteration, "objective": result.objective}
        out |= {"residual": result.residual, "readout": result.readout}
        out |= {"train_acc": train_acc, "test_acc": test_acc}
        print(json.dumps(out))
    if group is not None:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
