"""Embedding-bag classifier: the mean of a bag's token embeddings (sparse gradients), then Linears."""

from __future__ import annotations

import itertools
from collections.abc import Sequence

from torch import Tensor, nn

from deepjimu.errors import JimuError

__all__ = ["TokenBag", "embed"]


class TokenBag(nn.EmbeddingBag):
    """``nn.EmbeddingBag`` (mean, ``sparse=True``) over rows of token ids.

    Data sets hold their samples as float32 (token ids are exact below 2^24), so the ids
    are cast back to integers here; an id outside the vocabulary ends in one line instead
    of an index error deep inside the bag.
    """

    def forward(self, x: Tensor) -> Tensor:  # type: ignore[override]  # one argument: the rows of ids
        ids = x.long()
        if len(ids) and (int(ids.max()) >= self.num_embeddings or int(ids.min()) < 0):
            raise JimuError(
                f"token ids must be in 0..{self.num_embeddings - 1} for this embed model "
                f"(ids: {int(ids.min())}..{int(ids.max())}); give embed:VOCAB:DIM with VOCAB "
                "at least the data set's vocabulary"
            )
        return super().forward(ids)


def embed(
    feature_shape: tuple[int, ...],
    vocab: int,
    dim: int,
    num_classes: int,
    hidden: Sequence[int] = (),
) -> nn.Sequential:
    """A mean :class:`TokenBag` of ``vocab`` x ``dim``, a ``Sequential(Linear, ReLU)`` block
    per ``hidden`` width, and a Linear to the classes: the dense head of a recommender or a
    text classifier, whose wide layers and sparse embedding want different synchronisations.

    Example:
        >>> embed((32,), 1000, 16, 4)
        Sequential(
          (0): TokenBag(1000, 16, mode='mean')
          (1): Linear(in_features=16, out_features=4, bias=True)
        )

    Raises:
        JimuError: inputs that are not one bag of ids per sample.
    """
    if len(feature_shape) != 1:
        raise JimuError(
            f"model embed needs one bag of token ids per sample (--dataset bow); "
            f"the data has shape {feature_shape}"
        )
    widths = [dim, *hidden]
    layers = [nn.Sequential(nn.Linear(a, b), nn.ReLU()) for a, b in itertools.pairwise(widths)]
    return nn.Sequential(
        TokenBag(vocab, dim, mode="mean", sparse=True), *layers, nn.Linear(widths[-1], num_classes)
    )
