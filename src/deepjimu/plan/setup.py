"""The cluster and the compute figures of a plan: measured here (``--cluster probe``) or from a cluster file.

``probe`` times this machine: its collectives by ``jimu probe`` over as many real
workers as the plan's largest configuration (at least 2; the ring formulas of
:class:`~deepjimu.plan.cluster.Cluster` carry the fit to other worker counts), its cores
(:func:`deepjimu.threads.available_cores`), and the model's work in this process
(:class:`~deepjimu.plan.measure.MeasuredCompute`). A TOML file describes a cluster that
is not here: the model's FLOPs over its device's rate
(:class:`~deepjimu.plan.profile.AnalyticCompute`). A ``probe.json`` of ``jimu probe``
(run anywhere: two nodes under torchrun over their real link) gives the collectives of
that link, with the model's work measured here.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from deepjimu.config import RunConfig
from deepjimu.errors import JimuError
from deepjimu.plan.cluster import Cluster, probed_cluster, read_cluster
from deepjimu.plan.profile import AnalyticCompute, Compute, Layer

__all__ = ["cluster_and_compute", "probe_cluster"]


def probe_cluster(cfg: RunConfig, workers: int, out: Path) -> Cluster:
    """This machine as a one-node cluster: ``jimu probe``'s collective fits over ``workers``
    real workers (written to ``out/probe``), its cores shared by the ranks."""
    from deepjimu.compress.probe import Probe
    from deepjimu.launch import probe
    from deepjimu.threads import available_cores

    world = max(2, workers)
    probed = probe(
        dataclasses.replace(
            cfg, strategy="ddp", workers=world, runs_dir=str(out), name="probe", quiet=True,
            compress="none", given={},
        )
    )  # fmt: skip
    assert probed is not None
    found = Probe.from_dict(probed["probe"])
    cluster = probed_cluster(
        found.links, found.world, found.device, available_cores() if found.device == "cpu" else None
    )
    return dataclasses.replace(cluster, ranks_per_node=max(workers, world))


def _probe_file(path: Path, workers: int) -> Cluster:
    """The cluster of a ``probe.json`` that ``jimu probe`` wrote, wherever it ran (under
    torchrun across nodes too): its fitted collectives, this machine's cores (the model's
    work is measured here)."""
    from deepjimu.compress.probe import read_probe
    from deepjimu.threads import available_cores

    found = read_probe(path)
    if found.world < 2:
        raise JimuError(f"probe file {path} was measured on one worker: it holds no link")
    cores = available_cores() if found.device == "cpu" else None
    cluster = probed_cluster(found.links, found.world, found.device, cores)
    return dataclasses.replace(cluster, ranks_per_node=max(workers, found.world), source=str(path))


def _layers_and_data(cfg: RunConfig) -> tuple[Any, Any, list[Layer]]:
    """The model of ``cfg`` (built as a run builds it), its training data, and its blocks' sizes."""
    from deepjimu.data import DataOptions, load_dataset
    from deepjimu.models import build_model
    from deepjimu.plan.measure import layers_of

    data = load_dataset(cfg.dataset, DataOptions.from_config(cfg))
    model = build_model(cfg.model, data.feature_shape, data.num_classes, seed=cfg.seed)
    return model, data, layers_of(model, data.train_x[:1])


def _admm_flops(model: Any, feature_shape: tuple[int, ...], cfg: RunConfig) -> Any:
    """Per layer pdADMM FLOPs of an iteration and of the readout's refit, and output widths."""
    import math

    from deepjimu.strategies.admm.layers import layer_ops
    from deepjimu.strategies.admm.model import layer_blocks

    ops = layer_ops(layer_blocks(model), feature_shape, cg_max_iter=cfg.admm_cg_iters)

    def flops(n: int) -> tuple[list[float], list[float], list[int]]:
        costs = [op.flops(n, with_p=l > 0) for l, op in enumerate(ops)]
        refits = [op.flops(n, with_p=False) for op in ops]
        return costs, refits, [math.prod(op.out_shape) for op in ops]

    return flops


def _factors(model: Any) -> list[tuple[int, int]]:
    """K-FAC's factor sizes (n_a, n_g) of each Linear and Conv2d layer, as ``kfac.layers`` sizes them."""
    import torch

    from deepjimu.kfac.layers import kfac_candidates

    out = []
    for _, m in kfac_candidates(model):
        w = m.weight
        assert isinstance(w, torch.Tensor)
        out.append((w[0].numel() + (m.bias is not None), int(w.shape[0])))
    return out


def cluster_and_compute(
    cfg: RunConfig, cluster_arg: str, out: Path, made: dict[Any, Any], all_cfgs: list[RunConfig]
) -> tuple[Cluster, Compute, list[Layer], int]:
    """The cluster, compute, blocks and training-set size that predict ``cfg``; ``made``
    keeps what configurations share (the cluster, each model's figures)."""
    if "cluster" not in made:
        most = max(c.workers or 1 for c in all_cfgs)
        if cluster_arg == "probe":
            made["cluster"] = probe_cluster(cfg, most, out)
        elif cluster_arg.endswith(".json"):
            made["cluster"] = _probe_file(Path(cluster_arg), most)
        else:
            made["cluster"] = read_cluster(cluster_arg)
    cluster: Cluster = made["cluster"]
    key = (
        cfg.model,
        cfg.dataset,
        cfg.data_dir,
        cfg.seed,
        cfg.optimizer,
        cfg.admm_readout,
        cfg.quantize,
    )
    if key not in made:
        model, data, layers = _layers_and_data(cfg)
        compute: Compute
        if cluster.source == "probe" or cluster.source.endswith(".json"):
            from deepjimu.plan.measure import MeasuredCompute

            compute = MeasuredCompute(model, data.train_x, data.train_y, cfg)
        else:
            compute = AnalyticCompute(
                layers,
                cluster.device,
                str(cfg.precision),
                _admm_flops(model, data.feature_shape, cfg),
            )
        made[key] = (compute, layers, len(data.train_y))
    compute, layers, n = made[key]
    return cluster, compute, layers, n
