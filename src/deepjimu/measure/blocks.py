"""A model's blocks measured on this device: their sizes, each block's forward and backward, a training step, a stage's update.

Every figure is the median of a few repeats after a warm-up, on a copy of the model under a
forked RNG, so that measuring changes neither the weights nor what training does
afterwards. FLOPs are counted by torch's own ``FlopCounterMode``, so a profile can be
scaled to a device that is not here (:mod:`deepjimu.cost.profile`).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.flop_counter import FlopCounterMode

from deepjimu.compress.sync import sparse_embeddings
from deepjimu.config import RunConfig
from deepjimu.cost.profile import BlockTimes, Layer
from deepjimu.measure.timing import median_s, timed_runs
from deepjimu.models.parts import shaped, zeroed
from deepjimu.strategies.base import make_optimizer

__all__ = [
    "block_times",
    "layers_of",
    "plain_step",
    "runnable",
    "step_times",
    "update_time",
    "use_threads",
]


def runnable(block: nn.Module, device: torch.device) -> nn.Module:
    """A copy of ``block`` on ``device`` to time. A block on the meta device (another
    worker's, which this one never built) gets weights of its shapes, zero: a dense
    layer's time does not depend on its values, and zeros are no denormals."""
    if not any(t.is_meta for t in [*block.parameters(), *block.buffers()]):
        return copy.deepcopy(block).to(device)
    # zeroed, not Module.to_empty: a worker slowed to a twentieth by --emulate-speeds spent
    # minutes on the import to_empty makes before its first timing
    return zeroed(block, device)


@contextmanager
def use_threads(n: int) -> Iterator[None]:
    """torch's intra-op threads set to ``n`` inside the block, restored after."""
    before = torch.get_num_threads()
    torch.set_num_threads(max(1, n))
    try:
        yield
    finally:
        torch.set_num_threads(before)


def layers_of(model: nn.Sequential, sample: Tensor, flops: bool = True) -> list[Layer]:
    """Each block's size figures: forward FLOPs, parameters and activations, per sample.

    Args:
        model: the model's blocks (not changed); on the meta device, shapes alone are
            counted and nothing is allocated.
        sample: a batch of inputs (its first row is used).
        flops: count the forward FLOPs (torch's ``FlopCounterMode``, whose first use
            imports sympy and much of torch's compiler: about a second of CPU, which a
            memory check before every run need not pay); False leaves ``fwd_flops`` 0.

    Example:
        >>> [l.params for l in layers_of(nn.Sequential(nn.Linear(4, 2)), torch.zeros(1, 4))]
        [10]
    """
    out, x = [], sample[:1]
    first = x  # an embedding's distinct ids are read from the real sample
    # shapes alone (models.parts.shaped): nothing of the model's size is allocated
    meta = any(p.is_meta for p in model.parameters())
    if meta:
        x = x.to("meta")
    with torch.no_grad():
        for i, block in enumerate(model):
            rows: dict[str, float] = {}
            kinds = {n: "embedding" for n in sparse_embeddings(block)}
            hooks = []
            for name, m in block.named_modules():
                if isinstance(m, nn.Linear):
                    weight = f"{name}.weight" if name else "weight"
                    kinds[weight] = "linear"
                    hooks.append(m.register_forward_hook(_rows_seen(rows, weight, m.in_features)))
            for name in kinds:
                if kinds[name] == "embedding":
                    ids = first if i == 0 else x
                    rows[name] = float(ids[0].numel() if ids.is_meta else len(torch.unique(ids[0])))
            counter = FlopCounterMode(display=False, custom_mapping=_COUNTED) if flops else None
            with counter if counter is not None else nullcontext():
                # a meta model's shapes alone: as zeros on the CPU (models.parts.shaped; the
                # hooks travel with the copy); its FLOPs counted on the meta device
                y = shaped(block, x) if meta and counter is None else block(x)
            for h in hooks:
                h.remove()
            named = list(block.named_parameters())
            out.append(
                Layer(
                    name=f"{i}:{type(block).__name__}",
                    fwd_flops=0.0 if counter is None else float(counter.get_total_flops()),
                    params=sum(p.numel() for _, p in named),
                    in_elems=math.prod(x.shape[1:]),
                    out_elems=math.prod(y.shape[1:]),
                    shapes=tuple(tuple(p.shape) for _, p in named),
                    kinds=tuple(kinds.get(n, "dense") for n, _ in named),
                    rows=tuple(rows.get(n, 0.0) for n, _ in named),
                )
            )
            x = y
    return out


def _cpu_attention_flops(
    query: list[int], key: list[int], value: list[int], *_: object, **__: object
) -> int:
    """FLOPs of the CPU's attention kernel on these shapes ([B, H, S, E]): Q K^T and the
    weights times V, as torch counts its GPU kernels."""
    b, h, s, e = query
    return 2 * b * h * s * key[-2] * (e + value[-1])


# torch's FlopCounterMode knows the attention kernels of GPUs (and of the meta device) but
# not the CPU's, so a real gpt model measured here counted no attention at all
_COUNTED = {torch.ops.aten._scaled_dot_product_flash_attention_for_cpu: _cpu_attention_flops}


def _rows_seen(rows: dict[str, float], name: str, width: int) -> Callable[..., None]:
    """A forward hook that records a Linear's input rows per sample (1 for flat inputs)."""

    def hook(_m: nn.Module, inputs: tuple[Tensor, ...], _out: Tensor) -> None:
        rows[name] = inputs[0].numel() / width

    return hook


def block_times(model: nn.Sequential, x: Tensor, repeats: int = 7) -> BlockTimes:
    """Forward and backward seconds of each block on the rows of ``x``, one block at a time.

    Profiles a copy of each block in turn (the model's weights and ``.grad`` stay
    untouched; one block's copy and its gradients at a time, not the whole model's: a split
    model's rank 0 times the blocks with room for little more than the model) under a forked
    RNG, so profiling does not change what training does afterwards. A block's backward is
    timed from its output's gradient (ones) to its input's and its parameters'.
    """
    devices = [x.device] if x.device.type == "cuda" else []
    fwd, bwd = [], []
    with torch.random.fork_rng(devices=devices):
        inp = x
        for original in model:
            block = runnable(original, x.device)
            inp = inp.detach().requires_grad_(inp.is_floating_point())
            with torch.no_grad():
                out = block(inp)
            ones = torch.ones_like(out)

            def forward(b: nn.Module = block, i: Tensor = inp) -> None:
                b(i)  # with autograd recording, as in training

            def backward(b: nn.Module = block, i: Tensor = inp, g: Tensor = ones) -> None:
                b(i).backward(g)

            fwd.append(median_s(forward, repeats, x.device))
            both = median_s(backward, repeats, x.device)
            bwd.append(max(0.0, both - fwd[-1]))
            inp = out
    return BlockTimes(rows=len(x), threads=torch.get_num_threads(), fwd_s=fwd, bwd_s=bwd)


def step_times(
    model: nn.Sequential, x: Tensor, y: Tensor, cfg: RunConfig, repeats: int = 15
) -> list[float]:
    """Seconds of each of ``repeats`` plain training steps (``local``'s) on ``x``, after a
    warm one: zero_grad, forward, loss, backward and the optimizer's step, on a copy of
    ``model`` under a forked RNG (their median is the step; their spread, how noisy it is)."""
    probe = copy.deepcopy(model).to(x.device)
    step = plain_step(probe, make_optimizer(probe.parameters(), cfg, probe), x, y)
    devices = [x.device] if x.device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        return timed_runs(step, repeats, x.device)


def plain_step(
    model: nn.Module, optimizer: torch.optim.Optimizer, x: Tensor, y: Tensor
) -> Callable[[], None]:
    """One plain training step of ``model`` on ``(x, y)``, as ``local`` runs it: zero_grad,
    forward, loss, backward, the optimizer's step."""

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        F.cross_entropy(model(x), y).backward()
        optimizer.step()

    return step


def update_time(
    model: nn.Sequential, x: Tensor, cfg: RunConfig, first: int, count: int, repeats: int = 15
) -> float:
    """Seconds of one optimizer update of blocks ``first .. first + count - 1`` alone, as a
    stage's rank runs it after its backward: zero_grad and the optimizer's step (Adam's and
    SGD's cost is mostly per call and per tensor, so a stage's update is not its share of
    the whole model's). Gradients come from one backward of the blocks on ``x``'s rows."""
    probe = copy.deepcopy(model).to(x.device)
    devices = [x.device] if x.device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        with torch.no_grad():
            inp = probe[:first](x) if first else x
        stage = probe[first : first + count]
        params = list(stage.parameters())
        if not params:
            return 0.0
        optimizer = make_optimizer(params, cfg)
        out = stage(inp.detach().requires_grad_(inp.is_floating_point()))
        out.backward(torch.ones_like(out))
        grads = [p.grad for p in params]

        def update() -> None:
            optimizer.zero_grad(set_to_none=True)
            for p, g in zip(params, grads, strict=True):
                p.grad = g
            optimizer.step()

        return median_s(update, repeats, x.device)
