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
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    ParallelStyle,
    RowwiseParallel,
    parallelize_module,
)

from deepjimu.comm import nbytes
from deepjimu.data import DataSplits
from deepjimu.errors import JimuError
from deepjimu.models import parse_spec
from deepjimu.options import GradientOptions
from deepjimu.run import Run
from deepjimu.strategies.base import GradientStrategy, accuracies, make_optimizer
from deepjimu.strategies.sharding import ShardedModel, shard_copy, sharded_skeleton

__all__ = ["TensorParallelStrategy", "tp_plan"]

_ELEMENTWISE = (nn.ReLU, nn.Flatten, nn.Sequential)


def tp_plan(model: nn.Module) -> dict[str, ParallelStyle]:
    """Megatron's plan of ``model``: its Linear layers in pairs, columns then rows.

    Raises:
        JimuError: a module other than Linear, ReLU and Flatten (an activation that mixes
            units, a convolution, ...), or fewer than two Linear layers.

    Example:
        >>> sorted(tp_plan(nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))).items())
        [('0', ColwiseParallel()), ('2', RowwiseParallel())]
    """
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
        if spec.kind not in ("mlp", "factory"):  # a factory's model: model_blocks checked it
            return [f"tp splits mlp:... models into Linear pairs; model {cfg.model} is not one"]
        if spec.kind == "mlp" and n_blocks < 2:
            return [f"tp needs at least two Linear layers to pair (model: {cfg.model})"]
        assert cfg.workers is not None, "defaults not resolved"
        # a pair's hidden width is cut into equal parts (each column layer's outputs)
        split = spec.widths[0::2]
        if any(w % cfg.workers for w in split):
            return [
                f"tp cuts each pair's hidden width into workers equal parts: widths "
                f"{', '.join(map(str, split))} and workers {cfg.workers} (model: {cfg.model})"
            ]
        return []

    def setup(self, model: nn.Sequential, data: DataSplits, run: Run) -> None:
        self.run, self.model = run, model
        self.sharded = self.training_copy(model, run)
        self._counting = True
        plan = tp_plan(self.sharded)
        first = next(iter(plan))  # its input is the data: no gradient, no all-reduce
        for name, style in plan.items():
            layer = self.sharded.get_submodule(name)
            if isinstance(style, RowwiseParallel):
                layer.register_forward_hook(self._forward_all_reduce)
            elif name != first:
                layer.register_full_backward_hook(self._backward_all_reduce)
        # the paired layers' parameters are DTensors, an unpaired last layer's plain tensors:
        # torch's multi-tensor kernels (its default on a GPU) refuse such a mix
        self.optimizer = make_optimizer(self.sharded.parameters(), self.cfg, foreach=False)

    def _shard(self, model: nn.Sequential, run: Run, whole: bool) -> nn.Module:
        """The training copy of ``model`` (loaded with its weights where it is built
        ``whole``), its Linear pairs cut over the ranks' mesh."""
        mesh = init_device_mesh(run.device.type, (run.world,))
        plan = tp_plan(model)
        for name, style in plan.items():
            layer = model.get_submodule(name)
            assert isinstance(layer, nn.Linear)
            width = layer.out_features
            if isinstance(style, ColwiseParallel) and width % run.world:
                raise JimuError(
                    f"tp cuts each pair's hidden width into workers equal parts: layer {name} "
                    f"has {width} outputs, workers {run.world}"
                )

        def shard(m: nn.Module) -> None:
            parallelize_module(m, mesh, plan, src_data_rank=None)

        return (shard_copy if whole else sharded_skeleton)(model, shard, run.device)

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
            yield
        finally:
            self._counting = True

    def train_step(self, x: Tensor, y: Tensor) -> Tensor:
        self.optimizer.zero_grad(set_to_none=True)
        with self.run.autocast():
            loss = F.cross_entropy(self.sharded(x), y)
        loss.backward()
        self.optimizer.step()
        self.run.synchronize()
        return loss

    def evaluate(self, data: DataSplits, run: Run) -> dict[str, float | None]:
        """Collective: accuracies by the sharded model, every rank running the same forwards
        on the same data; only rank 0 reports them."""
        with self._uncounted(), torch.no_grad():
            out = accuracies(self.sharded, data, ("train", "val", "test"))
        return out if run.is_main else {}
