"""Datasets behind one registry; each returns train / validation / test splits with a fixed seed."""

# importing the loaders registers the datasets
from deepjimu.data import (  # noqa: F401
    bow,
    cifar,
    digits,
    eurosat,
    hyperspectral,
    idx,
    landsat,
    planetoid,
    sbm,
    synthetic,
    tensors,
    text,
)
from deepjimu.data.base import (
    DataOptions,
    DataSplits,
    GraphData,
    RawData,
    dataset_family,
    dataset_names,
    datasets_of,
    epoch_seed,
    load_dataset,
    register_dataset,
)
from deepjimu.data.graph import GRAPH_DATASETS
from deepjimu.data.tensors import save_tensors

__all__ = [
    "GRAPH_DATASETS", "DataOptions", "DataSplits", "GraphData", "RawData", "dataset_family",
    "dataset_names", "datasets_of", "epoch_seed", "load_dataset", "register_dataset", "save_tensors",
]  # fmt: skip
