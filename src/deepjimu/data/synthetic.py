"""``synthetic``: labels from a random teacher network; any size, no files (for scaling runs)."""

from __future__ import annotations

import torch

from deepjimu.choices import Family
from deepjimu.data.base import DataOptions, RawData, register_dataset

__all__ = ["load_synthetic"]


@register_dataset("synthetic", Family.TABULAR)
def load_synthetic(opts: DataOptions) -> RawData:
    """``synthetic_n`` training and ``synthetic_n // 5`` test samples of ``synthetic_features``.

    Inputs are standard normal; the label is the argmax of a random two-layer ReLU teacher
    (hidden width 64), so the task is learnable but not linear. Generated in chunks so that
    N = 55,000 x 196 costs only the output arrays.
    """
    g = torch.Generator().manual_seed(opts.seed + 7919)
    n_test = max(opts.synthetic_n // 5, opts.synthetic_classes)
    d, c = opts.synthetic_features, opts.synthetic_classes
    w1 = torch.randn(d, 64, generator=g) / d**0.5
    w2 = torch.randn(64, c, generator=g) / 8.0
    x = torch.randn(opts.synthetic_n + n_test, d, generator=g)
    y = torch.cat([torch.relu(chunk @ w1) @ w2 for chunk in x.split(8192)]).argmax(1)
    n = opts.synthetic_n
    return RawData(x[:n].numpy(), y[:n].numpy(), x[n:].numpy(), y[n:].numpy(), num_classes=c)
