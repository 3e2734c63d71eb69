"""Datasets behind one registry; each returns train / validation / test splits with a fixed seed."""

from deepjimu.data import cifar, digits, idx, synthetic  # noqa: F401  (registers the datasets)
from deepjimu.data.base import (
    DataOptions,
    DataSplits,
    RawData,
    dataset_names,
    load_dataset,
    register_dataset,
)

__all__ = [
    "DataOptions",
    "DataSplits",
    "RawData",
    "dataset_names",
    "load_dataset",
    "register_dataset",
]
