"""``bow``: Zipf-distributed bags of token ids with learnable labels, sized by the synthetic options."""

from __future__ import annotations

import torch

from deepjimu.data import DataOptions, dataset_family, load_dataset
from deepjimu.data.bow import BAG


def test_bow_is_sized_by_the_synthetic_options_and_seeded() -> None:
    opts = DataOptions(synthetic_n=500, synthetic_features=300, synthetic_classes=4, seed=3)
    d = load_dataset("bow", opts)
    assert str(dataset_family("bow")) == "tabular"
    assert d.feature_shape == (BAG,) and d.num_classes == 4
    assert len(d.train_y) + len(d.val_y) == 500 and len(d.test_y) == 100
    x = d.train_x
    assert torch.equal(x, x.round()) and x.min() >= 0 and x.max() < 300
    assert set(d.train_y.tolist()) == {0, 1, 2, 3}
    again = load_dataset("bow", opts)
    assert torch.equal(again.train_x, x) and torch.equal(again.train_y, d.train_y)


def test_token_ids_follow_zipfs_law() -> None:
    d = load_dataset("bow", DataOptions(synthetic_n=2000, synthetic_features=1000))
    counts = torch.bincount(d.train_x.long().flatten(), minlength=1000).float()
    # rank 0 about 2^1.1 times as frequent as rank 1, 10^1.1 times rank 9 (within sampling noise)
    assert 1.6 < counts[0] / counts[1] < 2.8
    assert 8 < counts[0] / counts[9] < 18
    # a batch of 32 bags touches few of the rows
    assert len(torch.unique(d.train_x[:32].long())) < 0.5 * 32 * BAG
