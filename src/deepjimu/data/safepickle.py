"""Unpickling with an allow-list of globals, so that a data file that is a pickle cannot run code."""

from __future__ import annotations

import codecs
import importlib
import pickle
from collections.abc import Mapping
from typing import IO, Any

import numpy as np

__all__ = ["RestrictedUnpickler", "numpy_globals"]


def _numpy_reconstruct() -> Any:
    for module in ("numpy._core.multiarray", "numpy.core.multiarray"):
        try:
            return importlib.import_module(module)._reconstruct
        except ImportError:
            continue
    raise ImportError("numpy multiarray._reconstruct not found")


def numpy_globals() -> dict[tuple[str, str], Any]:
    """The globals a pickled numpy array names (Python 2 and 3 spellings of each)."""
    rebuild = _numpy_reconstruct()
    return {
        ("numpy.core.multiarray", "_reconstruct"): rebuild,
        ("numpy._core.multiarray", "_reconstruct"): rebuild,
        ("numpy", "ndarray"): np.ndarray,
        ("numpy", "dtype"): np.dtype,
        ("_codecs", "encode"): codecs.encode,  # how protocol 2 spells bytes
    }


class RestrictedUnpickler(pickle.Unpickler):
    """A :class:`pickle.Unpickler` that resolves only the globals in ``allowed``.

    Pickles run code only through the globals they name (a class or function to call), so
    refusing every global outside a short list of data classes makes loading safe. Module
    names arrive as the file spells them (``__builtin__`` in Python 2 pickles).

    Args:
        file: the open binary file.
        allowed: ``(module, name) -> object`` for each global the files may name.
        **kw: passed to :class:`pickle.Unpickler` (e.g. ``encoding="latin1"``).

    Example:
        >>> with open(path, "rb") as f:  # doctest: +SKIP
        ...     array = RestrictedUnpickler(f, numpy_globals(), encoding="latin1").load()
    """

    def __init__(self, file: IO[bytes], allowed: Mapping[tuple[str, str], Any], **kw: Any) -> None:
        super().__init__(file, **kw)
        self._allowed = allowed

    def find_class(self, module: str, name: str) -> Any:
        found = self._allowed.get((module, name))
        if found is None:
            raise pickle.UnpicklingError(f"global {module}.{name} is not allowed")
        return found
