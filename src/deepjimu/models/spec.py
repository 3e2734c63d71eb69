"""Parse model specs (``mlp:256x3``, ``cnn:16-32``, ``lenet``, ``resnet``, ``gcn``, ``gpt:4x128:4``) and build the block sequence."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from deepjimu.errors import JimuError
from deepjimu.models.cnn import cnn, lenet, resnet
from deepjimu.models.embed import embed
from deepjimu.models.gcn import gcn
from deepjimu.models.gpt import gpt
from deepjimu.models.mlp import mlp
from deepjimu.models.parts import Place, placed

__all__ = ["ModelSpec", "build_model", "count_blocks", "factory_spec", "parse_spec"]

_SPEC_HELP = (
    "mlp:WIDTHxDEPTH (e.g. mlp:256x3), mlp:W1-W2-..., cnn:C1-C2-... (e.g. cnn:16-32), cnn:CxDEPTH, "
    "lenet, resnet or resnet:BLOCKS, gcn or gcn:HIDDEN, embed:VOCAB:DIM[:WIDTHxDEPTH or :W1-W2-...], "
    "gpt:LAYERSxWIDTH:HEADS (e.g. gpt:4x128:4)"
)
# the spec of a model that a Python factory builds (deepjimu.fit): it names, not describes
_FACTORY = "factory:"


@dataclass(frozen=True)
class ModelSpec:
    """A parsed spec: ``kind`` and its numbers (mlp, gcn: hidden widths, cnn: channels, resnet:
    blocks, embed: vocabulary, dimension, then the hidden widths of its head, if any; gpt:
    each transformer block's width, and ``heads``)."""

    kind: str
    widths: tuple[int, ...] = ()
    blocks_per_stage: int = 1
    heads: int = 0

    @property
    def needs_graph(self) -> bool:
        """True for models that take the whole graph (gcn), not feature rows."""
        return self.kind == "gcn"


def factory_spec(factory: Callable[[], nn.Module]) -> str:
    """``factory:<module>.<name>``, the spec a run records for a model its factory builds.

    A ``functools.partial`` is named by its function, a callable instance by its type.

    Example:
        >>> factory_spec(functools.partial(build_model, "mlp:8x1", (4,), 2))  # doctest: +SKIP
        'factory:deepjimu.models.spec.build_model'
    """
    f = getattr(factory, "func", factory)
    name = getattr(f, "__qualname__", type(f).__qualname__)
    return f"{_FACTORY}{getattr(f, '__module__', '?')}.{name}"


def parse_spec(spec: str) -> ModelSpec:
    """Parse a model spec string (``factory:...`` gives kind ``factory``: no shape to read).

    Example:
        >>> parse_spec("mlp:256x3")
        ModelSpec(kind='mlp', widths=(256, 256, 256), blocks_per_stage=1)

    Raises:
        JimuError: the spec is not one of the known forms.
    """
    s = spec.strip().lower()
    if m := re.fullmatch(r"(mlp|cnn):(\d+)x(\d+)", s):
        kind, widths = m[1], (int(m[2]),) * int(m[3])
    elif m := re.fullmatch(r"(mlp|cnn):(\d+(?:-\d+)*)", s):
        kind, widths = m[1], tuple(int(w) for w in m[2].split("-"))
    elif s == "lenet":
        return ModelSpec("lenet")
    elif m := re.fullmatch(r"embed:(\d+):(\d+)(?::(\d+)x(\d+)|:(\d+(?:-\d+)*))?", s):
        if m[3]:
            head = (int(m[3]),) * int(m[4])
        else:
            head = tuple(int(w) for w in m[5].split("-")) if m[5] else ()
        if min(int(m[1]), int(m[2]), *head) < 1:
            raise JimuError(
                f"model {spec!r}: embed needs a vocabulary, a dimension and hidden widths >= 1"
            )
        return ModelSpec("embed", widths=(int(m[1]), int(m[2]), *head))
    elif m := re.fullmatch(r"gpt:(\d+)x(\d+):(\d+)", s):
        layers, width, heads = int(m[1]), int(m[2]), int(m[3])
        if min(layers, width, heads) < 1 or width % heads:
            raise JimuError(
                f"model {spec!r}: gpt needs layers, width and heads >= 1, the width a "
                f"multiple of the heads (width: {width}, heads: {heads})"
            )
        return ModelSpec("gpt", widths=(width,) * layers, heads=heads)
    elif s.startswith("gpt"):
        raise JimuError(f"model {spec!r}: a gpt spec is gpt:LAYERSxWIDTH:HEADS (e.g. gpt:4x128:4)")
    elif s.startswith(_FACTORY):
        return ModelSpec("factory")
    elif m := re.fullmatch(r"gcn(?::(\d+))?", s):
        hidden = int(m[1]) if m[1] else 16  # Kipf & Welling's width
        if hidden < 1:
            raise JimuError(f"model {spec!r}: gcn needs a hidden width >= 1")
        return ModelSpec("gcn", widths=(hidden,))
    elif m := re.fullmatch(r"resnet(?::(\d+))?", s):
        n = int(m[1]) if m[1] else 1
        if n < 1:
            raise JimuError(f"model {spec!r}: resnet needs >= 1 block per stage")
        return ModelSpec("resnet", blocks_per_stage=n)
    else:
        raise JimuError(f"unknown model spec {spec!r} (expected {_SPEC_HELP})")
    if not widths or min(widths) < 1:
        need = "hidden layer of width" if kind == "mlp" else "conv block of channels"
        raise JimuError(f"model {spec!r}: {kind} needs at least one {need} >= 1")
    return ModelSpec(kind, widths=widths)


def count_blocks(spec: str) -> int:
    """Number of blocks (cut points + 1) the spec builds, without building it.

    Raises:
        JimuError: a bad spec, or a factory's (only its model knows).
    """
    ms = parse_spec(spec)
    if ms.kind == "factory":
        raise JimuError(f"model {spec}: the blocks of a factory's model are counted on the model")
    if ms.kind in ("mlp", "cnn"):
        return len(ms.widths) + 1
    if ms.kind == "lenet":
        return 5
    if ms.kind == "embed":
        return len(ms.widths)  # the bag, the hidden layers, the classifier
    if ms.kind == "gcn":
        return 2
    if ms.kind == "gpt":
        return len(ms.widths) + 2  # the embeddings, the transformer blocks, the head
    return 2 + 3 * ms.blocks_per_stage


def build_model(
    spec: str, feature_shape: tuple[int, ...], num_classes: int, seed: int = 0,
    place: Place = None, dropout: float = 0.0,
) -> nn.Sequential:  # fmt: skip
    """Build the model of ``spec`` for inputs of ``feature_shape``; weights drawn from ``seed``.

    ``dropout``: a gpt's dropout probability (``--dropout``; the other models have none or
    their own). ``place``: what this worker does with each block as it is built (None: keeps it): keeps
    it, frees it to the meta device or loads its weights into its shards first
    (:mod:`deepjimu.models.parts`). An ``mlp`` or ``cnn`` is built one block at a time, so
    every block's weights equal the whole model's and a worker never holds more than what
    it keeps and one block besides; any other model is built whole first.

    Returns:
        ``nn.Sequential`` whose children are the blocks. For ``mlp``, block l is
        ``Sequential([Flatten,] Linear, ReLU)`` and the last block ``Sequential(Linear)``;
        for ``cnn``, ``Sequential(Conv2d, ReLU[, AvgPool2d])`` and ``Sequential(Flatten, Linear)``.
        ``gcn`` is a :class:`~deepjimu.models.gcn.GCN`, whose forward takes the node
        features and the normalised adjacency; ``embed`` a
        :class:`~deepjimu.models.embed.TokenBag`, ``Sequential(Linear, ReLU)`` per hidden
        layer and ``Linear``.

    Raises:
        JimuError: bad spec, or a convolutional model on flat features.
    """
    ms = parse_spec(spec)
    if ms.kind == "factory":
        raise JimuError(
            f"model {spec} is built by a Python function that only deepjimu.fit can call"
        )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        if ms.kind == "mlp":
            return mlp(feature_shape, ms.widths, num_classes, place)
        if ms.kind == "cnn" and len(feature_shape) == 3:
            return cnn(feature_shape, ms.widths, num_classes, place)
        model = _whole(ms, spec, feature_shape, num_classes, dropout)
    if place is None or not isinstance(model, nn.Sequential):
        return model
    return nn.Sequential(*(placed(i, b, place) for i, b in enumerate(model)))


def _whole(
    ms: ModelSpec, spec: str, feature_shape: tuple[int, ...], num_classes: int, dropout: float
) -> nn.Sequential:
    """The model of a spec that is built whole (not an ``mlp`` or an image ``cnn``);
    ``dropout`` is a gpt's (``--dropout``)."""
    if ms.kind == "embed":
        return embed(feature_shape, ms.widths[0], ms.widths[1], num_classes, ms.widths[2:])
    if ms.kind == "gpt":
        if len(feature_shape) != 1:
            raise JimuError(
                f"model {spec!r} needs token sequences (a text data set such as "
                f"shakespeare-char); the data has shape {feature_shape}"
            )
        return gpt(feature_shape[0], num_classes, len(ms.widths), ms.widths[0], ms.heads, dropout)
    if ms.kind == "gcn":
        if len(feature_shape) != 1:
            raise JimuError(
                f"model {spec!r} needs node feature rows; the data has shape {feature_shape}"
            )
        return gcn(feature_shape[0], ms.widths[0], num_classes)
    if len(feature_shape) != 3:
        raise JimuError(
            f"model {spec!r} needs image inputs (C, H, W); the data has shape {feature_shape}"
        )
    if ms.kind == "lenet":
        return lenet(feature_shape, num_classes)
    return resnet(feature_shape, num_classes, ms.blocks_per_stage)
