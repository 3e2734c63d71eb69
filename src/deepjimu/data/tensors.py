"""``tensors``: the caller's own tensors, saved once to a file that every worker process reads.

A loader registered in the caller's process is unknown to the workers that the launcher
spawns (each imports deepjimu afresh), so the tensors travel as a file, not as code: written
atomically by :func:`save_tensors` before any worker starts, read with
``torch.load(weights_only=True)`` (plain tensors, no pickled code), and named in the config
by its folder (``data_dir``), so a checkpointed run can be resumed from its config alone.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from deepjimu.atomic import atomic_path
from deepjimu.choices import Family
from deepjimu.data.base import DataOptions, RawData, register_dataset
from deepjimu.errors import JimuError

__all__ = [
    "as_labels",
    "as_samples",
    "load_tensors",
    "samples_and_labels",
    "save_tensors",
    "tensors_file",
]


def _as_tensor(a: Any, name: str) -> Tensor:
    """``a`` as a tensor without copying where it already is one (numpy arrays of any
    strides, lists of numbers)."""
    if isinstance(a, Tensor):
        return a.detach()
    try:
        return torch.as_tensor(np.ascontiguousarray(a) if isinstance(a, np.ndarray) else a)
    except (TypeError, ValueError, RuntimeError):
        raise ValueError(
            f"{name} must be a torch.Tensor or a numpy array of numbers (got {type(a).__name__})"
        ) from None


def as_samples(x: Any, name: str = "x", dtype: torch.dtype = torch.float32) -> Tensor:
    """Samples [N, ...] as a PyTorch user passes them, as a tensor of ``dtype``.

    A numpy array or a tensor of any real dtype (float64, integers, bool) is converted: the
    layers compute in ``dtype``.

    Raises:
        ValueError: not an array of real numbers.

    Example:
        >>> as_samples(np.zeros((2, 3))).dtype
        torch.float32
    """
    t = _as_tensor(x, name)
    if t.is_complex():
        raise ValueError(f"{name}: samples must be real numbers (dtype: {t.dtype})")
    return t.to(dtype)


def as_labels(y: Any, name: str = "y") -> Tensor:
    """Class indices [N] as a PyTorch user passes them (a tensor or a numpy array of any
    integer dtype), as int64.

    Raises:
        ValueError: labels that are not integers >= 0, in one line that says what to pass.

    Example:
        >>> as_labels(np.array([0, 2], dtype=np.uint8))
        tensor([0, 2])
    """
    t = _as_tensor(y, name)
    if t.is_floating_point() or t.is_complex() or t.dtype == torch.bool:
        raise ValueError(
            f"{name}: labels must be class indices of an integer dtype (dtype: {t.dtype}); "
            "pass whole numbers as integers, e.g. y.long() (torch) or y.astype(int) (numpy)"
        )
    t = t.long()
    if t.numel() and int(t.min()) < 0:
        raise ValueError(f"{name}: labels must be class indices >= 0 (smallest: {int(t.min())})")
    return t


def tensors_file(data_dir: Path) -> Path:
    """Where the ``tensors`` data set of ``data_dir`` lives."""
    return Path(data_dir) / "tensors" / "tensors.pt"


def save_tensors(
    data_dir: Path,
    x: Any,
    y: Any,
    test: tuple[Any, Any] | None = None,
    num_classes: int | None = None,
) -> Path:
    """Write the samples ``x`` [N, ...] and class indices ``y`` [N] for ``--dataset tensors``.

    Args:
        data_dir: the data folder the run will read (its ``tensors/`` subfolder is written).
        x, y: the training samples and labels (validation is split off them as for every
            data set, ``val_fraction``): tensors or numpy arrays, converted by
            :func:`as_samples` (float32) and :func:`as_labels` (int64).
        test: held-out samples and labels (default: none; the test figures are then None).
        num_classes: default: the largest label + 1.

    Returns:
        the file written.

    Raises:
        ValueError: shapes that do not pair up, labels that are not class indices.
    """
    x, y, test_x, test_y = samples_and_labels(x, y, test)
    top = int(torch.cat([y, test_y]).max()) + 1 if len(y) else 0
    k = num_classes if num_classes is not None else top
    if k < max(top, 1):
        raise ValueError(
            f"num_classes must exceed every label (num_classes: {k}, labels up to {top - 1})"
        )
    state = {
        "train_x": x.cpu().contiguous(),
        "train_y": y.cpu().contiguous(),
        "test_x": test_x.cpu().contiguous(),
        "test_y": test_y.cpu().contiguous(),
        "num_classes": k,
    }
    path = tensors_file(data_dir)
    with atomic_path(path) as tmp:
        torch.save(state, tmp)
    return path


def samples_and_labels(
    x: Any, y: Any, test: tuple[Any, Any] | None = None
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """``x``, ``y`` and the test pair (empty when None) converted (:func:`as_samples`,
    :func:`as_labels`) and checked to pair up: what :func:`save_tensors` stores.

    Raises:
        ValueError: a conversion failed, or the shapes do not pair up.
    """
    x, y = as_samples(x), as_labels(y)
    test_x, test_y = (
        (as_samples(test[0], "test x"), as_labels(test[1], "test y"))
        if test is not None
        else (x[:0], y[:0])
    )
    for name, (a, b) in {"x, y": (x, y), "test": (test_x, test_y)}.items():
        if a.shape[1:] != x.shape[1:] or b.dim() != 1 or len(a) != len(b):
            raise ValueError(
                f"{name}: samples [N, ...] and labels [N] must pair up "
                f"(shapes: {tuple(a.shape)}, {tuple(b.shape)}; features {tuple(x.shape[1:])})"
            )
    return x, y, test_x, test_y


@register_dataset("tensors", Family.TENSORS)
def load_tensors(opts: DataOptions) -> RawData:
    """The tensors :func:`save_tensors` wrote into ``opts.data_dir``.

    Raises:
        JimuError: the file is missing or is not such a file.
    """
    path = tensors_file(opts.data_dir)
    if not path.exists():
        raise JimuError(f"tensors: missing file {path} (write it with deepjimu.data.save_tensors)")
    try:
        s = torch.load(path, weights_only=True)
        return RawData(s["train_x"], s["train_y"], s["test_x"], s["test_y"], int(s["num_classes"]))
    except Exception as e:  # a damaged or foreign file: name it, do not show a traceback
        raise JimuError(
            f"tensors: {path} is not a saved tensors file ({type(e).__name__})"
        ) from None
