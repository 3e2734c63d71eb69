"""``tp``: tensor parallelism with torch's own ``torch.distributed.tensor.parallel`` (Megatron's split).

The model's Linear layers are taken in pairs: the first of a pair is cut by columns
(``ColwiseParallel``: each rank holds some of its output units and computes them on the whole
input), the second by rows (``RowwiseParallel``: each rank multiplies its slice of the
input, and one all-reduce sums the partial outputs), so that the ReLU between them works on
each rank's own units and a pair costs one all-reduce forward and one backward (the
gradient of the pair's input; none for the first pair, whose input is the data). A Linear
left without a partner is replicated: every rank computes it alike. Every rank trains on
the whole batch, so an update equals ``local``'s. The all-reduces are those of torch's
DTensor, counted where their result is handed back: the row layer's output after its
forward all-reduce, the column layer's input gradient after its backward one.

With ``--replicas R`` (torchtitan's two dimensions): the pairs cut over the K = workers / R
ranks of a replica (the mesh's ``stage`` dimension), each replica on its part of every
batch, and every block sharded over the R replicas by torch's FSDP2 (``fully_shard`` on
the ``replica`` dimension: its shards all-gathered before the block's forward and backward,
its gradients reduce-scattered and averaged over the replicas), so a rank holds 1/(R K)
of each paired block. FSDP rather than DDP because torch's DDP does not take DTensor
parameters, and FSDP on a tensor-parallel mesh is the composition torch documents.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    ParallelStyle,
    RowwiseParallel,
    parallelize_module,
)

from deepjimu.comm import nbytes
from deepjimu.data import DataSplits
from deepjimu.errors import JimuError
from deepjimu.mesh import batch_problems
from deepjimu.models import parse_spec
from deepjimu.models.gpt import TransformerBlock
from deepjimu.options import GradientOptions
from deepjimu.run import Run
from deepjimu.strategies.base import GradientStrategy, accuracies, make_optimizer
from deepjimu.strategies.fsdp import Counted, counted_units, uncounted
from deepjimu.strategies.sharding import ShardedModel, shard_copy, sharded_skeleton

__all__ = ["TensorParallelStrategy", "tp_plan"]

_ELEMENTWISE = (nn.ReLU, nn.Flatten, nn.Sequential)


def tp_plan(model: nn.Module) -> dict[str, ParallelStyle]:
    """Megatron's plan of ``model``: its Linear layers in pairs, columns then rows; of a GPT
    (:func:`gpt_plan`), each transformer block's attention by heads and its MLP.

    Raises:
        JimuError: a module other than Linear, ReLU and Flatten (an activation that mixes
            units, a convolution, ...), or fewer than two Linear layers.

    Example:
        >>> sorted(tp_plan(nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))).items())
        [('0', ColwiseParallel()), ('2', RowwiseParallel())]
    """
    if any(isinstance(m, TransformerBlock) for m in model.modules()):
        return gpt_plan(model)
    linears = []
    for name, m in model.named_modules():
        if isinstance(m, nn.Linear):
            linears.append(name)
        elif not isinstance(m, _ELEMENTWISE) and name:
            raise JimuError(
                f"tp splits models of Linear layers with ReLU between them; module {name} is "
                f"{type(m).__name__}"
            )
    if len(linears) < 2:
        raise JimuError(
            f"tp needs at least two Linear layers to pair (Linear layers: {len(linears)})"
        )
    plan: dict[str, ParallelStyle] = {}
    for first, second in zip(linears[0::2], linears[1::2], strict=False):
        plan[first], plan[second] = ColwiseParallel(), RowwiseParallel()
    return plan


def gpt_plan(model: nn.Module) -> dict[str, ParallelStyle]:
    """Megatron's plan of a GPT: in each transformer block q, k and v cut by columns (each
    rank a share of the heads, attention run on its own heads), the attention's output
    projection by rows; the MLP's first Linear by columns, its second by rows. So a block
    costs two all-reduces forward (each projection's output) and two kinds backward (the
    inputs' gradients of q, k, v and of the MLP's first Linear). The embeddings, the norms
    and the head stay whole on every rank."""
    plan: dict[str, ParallelStyle] = {}
    for name, m in model.named_modules():
        if isinstance(m, TransformerBlock):
            for column in ("attn.q", "attn.k", "attn.v", "mlp.fc"):
                plan[f"{name}.{column}"] = ColwiseParallel()
            for row in ("attn.proj", "mlp.proj"):
                plan[f"{name}.{row}"] = RowwiseParallel()
    return plan


class TensorParallelStrategy(ShardedModel, GradientStrategy):
    """Tensor parallel (Megatron's Linear pairs) with torch's ``parallelize_module``.

    Every rank holds the whole data and runs every step on the whole batch; its share of
    each paired Linear layer's weights, gradients and optimizer state is 1/world. The
    training copy is sharded before it is allocated and loaded a block or a tensor at a
    time; each rank checkpoints its own shards (:mod:`deepjimu.strategies.sharding`).
    """

    name = "tp"
    cfg: GradientOptions

    @classmethod
    def model_blocks(cls, model: nn.Sequential) -> int:
        tp_plan(model)
        return len(model)

    @classmethod
    def problems(cls, cfg: GradientOptions, n_blocks: int) -> list[str]:
        spec = parse_spec(cfg.model)
        assert cfg.workers is not None, "defaults not resolved"
        if spec.kind == "gpt":
            k = cfg.workers // max(1, cfg.replicas)
            if spec.heads % k:
                return [
                    f"tp splits attention by heads, an equal share a rank: heads {spec.heads} "
                    f"and {k} ranks to split them over (model: {cfg.model})"
                ]
            return batch_problems(cfg.batch_size, cfg.replicas)
        if spec.kind not in ("mlp", "factory"):  # a factory's model: model_blocks checked it
            return [
                f"tp splits mlp:... models into Linear pairs and gpt:... models by heads; "
                f"model {cfg.model} is neither"
            ]
        if spec.kind == "mlp" and n_blocks < 2:
            return [f"tp needs at least two Linear layers to pair (model: {cfg.model})"]
        assert cfg.workers is not None, "defaults not resolved"
        # a pair's hidden width is cut into equal parts (each column layer's outputs)
        split, k = spec.widths[0::2], cfg.workers // max(1, cfg.replicas)
        if any(w % k for w in split):
            widths = ", ".join(map(str, split))
            if cfg.replicas == 1:
                return [
                    f"tp cuts each pair's hidden width into workers equal parts: widths "
                    f"{widths} and workers {k} (model: {cfg.model})"
                ]
            return [
                f"tp cuts each pair's hidden width into equal parts, one per rank of a "
                f"replica: widths {widths} and {k} ranks a replica (workers: {cfg.workers}, "
                f"replicas: {cfg.replicas}, model: {cfg.model})"
            ]
        return batch_problems(cfg.batch_size, cfg.replicas)

    def setup(self, model: nn.Sequential, data: DataSplits, run: Run) -> None:
        self.run, self.model = run, model
        self.sharded = self.training_copy(model, run)
        self._counting = True
        self._scales: list[float] = []
        plan = tp_plan(self.sharded)
        for name, style in plan.items():
            layer = self.sharded.get_submodule(name)
            if isinstance(style, RowwiseParallel):
                layer.register_forward_hook(self._forward_all_reduce)
            elif name.split(".")[0] != "0":  # block 0's input is the data: no gradient
                layer.register_full_backward_hook(self._backward_all_reduce)
        # the paired layers' parameters are DTensors, an unpaired last layer's plain tensors:
        # torch's multi-tensor kernels (its default on a GPU) refuse such a mix
        self.optimizer = make_optimizer(self.sharded.parameters(), self.cfg, foreach=False)

    def _shard(self, model: nn.Sequential, run: Run, whole: bool) -> nn.Module:
        """The training copy of ``model`` (loaded with its weights where it is built
        ``whole``), its Linear pairs cut over a replica's ranks; with ``--replicas``, every
        block then sharded over the replicas (FSDP), its collectives counted."""
        run.chain()  # collective: the R x K mesh of --replicas
        both = run.device_mesh
        mesh = (
            both["stage"] if both is not None else init_device_mesh(run.device.type, (run.world,))
        )
        plan = tp_plan(model)
        for name, style in plan.items():
            layer = model.get_submodule(name)
            assert isinstance(layer, nn.Linear)
            width = layer.out_features
            if isinstance(style, ColwiseParallel) and width % mesh.size():
                raise JimuError(
                    f"tp cuts each pair's hidden width into equal parts: layer {name} has "
                    f"{width} outputs, ranks to cut it over {mesh.size()}"
                )

        def shard(m: nn.Module) -> None:
            parallelize_module(m, mesh, plan, src_data_rank=None)
            if both is not None:
                _shard_over(m, both["replica"])

        sharded = (shard_copy if whole else sharded_skeleton)(model, shard, run.device)
        self._comms: list[Counted] = []
        if both is not None:
            self._comms = counted_units(sharded, run.comm, all_reduce=False)
        return sharded

    def _count(self, t: Tensor) -> None:
        if self._counting:
            self.run.comm.count(sent=nbytes(t), recv=nbytes(t))

    def _forward_all_reduce(self, _m: nn.Module, _inputs: Any, out: Tensor) -> None:
        self._count(out)  # the row layer's partial outputs, summed over the ranks

    def _backward_all_reduce(self, _m: nn.Module, grad_input: Any, _grad_output: Any) -> None:
        self._count(grad_input[0])  # the column layer's input gradient, summed over the ranks

    @contextlib.contextmanager
    def _uncounted(self) -> Iterator[None]:
        """Evaluation's all-reduces are bookkeeping, as every other strategy's."""
        self._counting = False
        try:
            with uncounted(self._comms, self.run.comm):
                yield
        finally:
            self._counting = True

    def batches(self, data: DataSplits, epoch: int, run: Run) -> list[tuple[Tensor, Tensor]]:
        """The batches of ``local``; with ``--replicas``, this replica's part of each, its
        mean loss weighted so that FSDP's average over the replicas is the whole batch's
        gradient (:meth:`~deepjimu.mesh.Mesh.parts`)."""
        out = super().batches(data, epoch, run)
        if run.mesh is None:
            return out
        parts, self._scales = run.mesh.parts(out)
        self._scales.reverse()  # popped in step order
        return parts

    def train_step(self, x: Tensor, y: Tensor) -> Tensor:
        self.optimizer.zero_grad(set_to_none=True)
        with self.run.autocast():
            loss = F.cross_entropy(self.sharded(x), y)
        (loss * (self._scales.pop() if self._scales else 1.0)).backward()
        self.optimizer.step()
        self.run.synchronize()
        return loss

    def evaluate(self, data: DataSplits, run: Run) -> dict[str, float | None]:
        """Collective: accuracies by the sharded model, every rank running the same forwards
        on the same data; only rank 0 reports them."""
        with self._uncounted(), torch.no_grad():
            out = accuracies(self.sharded, data, ("train", "val", "test"))
        return out if run.is_main else {}


def _shard_over(model: nn.Module, replicas: DeviceMesh) -> None:
    """Each block of ``model`` (its pairs already cut by tensor parallelism), then the whole,
    an FSDP unit sharded over ``replicas``."""
    # the model's output is the last row layer's all-reduced local tensor, a view: FSDP warns
    # that an in-place op on it would skip its backward hook; nothing here writes into it
    warnings.filterwarnings(
        "ignore", message=r"FSDP2-wrapped module \(FSDPSequential\) returned a view tensor"
    )
    for unit in [*model.children(), model]:
        fully_shard(unit, mesh=replicas)
