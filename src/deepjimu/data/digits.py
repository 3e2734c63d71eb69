"""``digits``: scikit-learn's bundled 8x8 handwritten digits, the embedded default (no network)."""

from __future__ import annotations

import numpy as np

from deepjimu.choices import Family
from deepjimu.data.base import DataOptions, RawData, register_dataset

__all__ = ["load_digits_raw"]


@register_dataset("digits", Family.IMAGES)
def load_digits_raw(opts: DataOptions) -> RawData:
    """1,797 images, 1 x 8 x 8, pixels / 16; a stratified 80/20 train/test split with ``opts.seed``.

    This is the split of the reference measurements (1,437 train / 360 test at seed 0).
    """
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    bunch = load_digits()
    x = (bunch.images.astype(np.float32) / 16.0)[:, None, :, :]
    y = bunch.target.astype(np.int64)
    tr_x, te_x, tr_y, te_y = train_test_split(
        x, y, test_size=0.2, stratify=y, random_state=opts.seed
    )
    return RawData(tr_x, tr_y, te_x, te_y, num_classes=10)
