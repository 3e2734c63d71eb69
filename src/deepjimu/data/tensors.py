"""``tensors``: the caller's own tensors, saved once to a file that every worker process reads.

A loader registered in the caller's process is unknown to the workers that the launcher
spawns (each imports deepjimu afresh), so the tensors travel as a file, not as code: written
atomically by :func:`save_tensors` before any worker starts, read with
``torch.load(weights_only=True)`` (plain tensors, no pickled code), and named in the config
by its folder (``data_dir``), so a checkpointed run can be resumed from its config alone.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import Tensor

from deepjimu.atomic import atomic_path
from deepjimu.choices import Family
from deepjimu.data.base import DataOptions, RawData, register_dataset
from deepjimu.errors import JimuError

__all__ = ["load_tensors", "save_tensors", "tensors_file"]


def tensors_file(data_dir: Path) -> Path:
    """Where the ``tensors`` data set of ``data_dir`` lives."""
    return Path(data_dir) / "tensors" / "tensors.pt"


def save_tensors(
    data_dir: Path,
    x: Tensor,
    y: Tensor,
    test: tuple[Tensor, Tensor] | None = None,
    num_classes: int | None = None,
) -> Path:
    """Write the samples ``x`` [N, ...] and class indices ``y`` [N] for ``--dataset tensors``.

    Args:
        data_dir: the data folder the run will read (its ``tensors/`` subfolder is written).
        x, y: the training samples and labels (validation is split off them as for every
            data set, ``val_fraction``).
        test: held-out samples and labels (default: none; the test figures are then None).
        num_classes: default: the largest label + 1.

    Returns:
        the file written.

    Raises:
        ValueError: shapes that do not pair up, labels that are not class indices.
    """
    test_x, test_y = test if test is not None else (x[:0], y[:0])
    for name, (a, b) in {"x, y": (x, y), "test": (test_x, test_y)}.items():
        if a.shape[1:] != x.shape[1:] or b.dim() != 1 or len(a) != len(b):
            raise ValueError(
                f"{name}: samples [N, ...] and labels [N] must pair up "
                f"(shapes: {tuple(a.shape)}, {tuple(b.shape)}; features {tuple(x.shape[1:])})"
            )
        if b.is_floating_point() or (len(b) and int(b.min()) < 0):
            raise ValueError(f"{name}: labels must be class indices >= 0 (dtype: {b.dtype})")
    top = int(torch.cat([y, test_y]).max()) + 1 if len(y) else 0
    k = num_classes if num_classes is not None else top
    if k < max(top, 1):
        raise ValueError(
            f"num_classes must exceed every label (num_classes: {k}, labels up to {top - 1})"
        )
    state = {
        "train_x": x.detach().cpu().float().contiguous(),
        "train_y": y.detach().cpu().long().contiguous(),
        "test_x": test_x.detach().cpu().float().contiguous(),
        "test_y": test_y.detach().cpu().long().contiguous(),
        "num_classes": k,
    }
    path = tensors_file(data_dir)
    with atomic_path(path) as tmp:
        torch.save(state, tmp)
    return path


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
