"""``bow``: synthetic bags of words, Zipf-distributed token ids, labels from a seeded linear rule; any size, no files."""

from __future__ import annotations

import torch

from deepjimu.choices import Family
from deepjimu.data.base import DataOptions, RawData, register_dataset

__all__ = ["BAG", "ZIPF_S", "load_bow"]

BAG = 32
"""Tokens per sample (a fixed bag length, as a padded text batch has)."""
ZIPF_S = 1.1
"""The Zipf exponent: token r (from 0) is drawn with probability proportional to (r + 1)^-s."""


@register_dataset("bow", Family.TABULAR)
def load_bow(opts: DataOptions) -> RawData:
    """``synthetic_n`` training and ``synthetic_n // 5`` test bags of :data:`BAG` token ids
    from a vocabulary of ``synthetic_features``.

    Token ids follow Zipf's law, as words do, so a batch touches few distinct rows of an
    embedding (the sparse gradients ``embed:VOCAB:DIM`` makes). Each token carries a random
    score per class; a bag's label is the class of the highest mean score, which a mean
    embedding bag of dimension >= the classes followed by a Linear can represent exactly.
    The samples are float32 rows of ids (exact below 2^24); ``embed`` casts them back.
    A tabular data set: rows of features with no spatial or graph structure.
    """
    g = torch.Generator().manual_seed(opts.seed + 104729)
    vocab, c = opts.synthetic_features, opts.synthetic_classes
    n, n_test = opts.synthetic_n, max(opts.synthetic_n // 5, c)
    zipf = (torch.arange(vocab, dtype=torch.float64) + 1) ** -ZIPF_S
    ids = torch.multinomial(zipf, (n + n_test) * BAG, replacement=True, generator=g)
    ids = ids.view(n + n_test, BAG)
    scores = torch.randn(vocab, c, generator=g)
    y = scores[ids].mean(1).argmax(1)
    x = ids.float()
    return RawData(x[:n].numpy(), y[:n].numpy(), x[n:].numpy(), y[n:].numpy(), num_classes=c)
