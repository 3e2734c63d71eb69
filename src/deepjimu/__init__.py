"""deepjimu: train one network with every way of splitting it over workers, and measure.

The command line is ``jimu`` (``jimu train --help``); the Python API (``help(deepjimu.fit)``,
``help(deepjimu.PdADMM)`` for the whole of each):

    fit(strategy, model_factory, x, y, ...)
        train ``model_factory()`` on your tensors or numpy arrays with any strategy
        (``local``, ``ddp``, ``model-parallel``, ``pipeline``, ``admm``), through the real
        engine: workers, run folder, checkpoints. Returns a :class:`Fitted`.
    Fitted
        what ``fit`` returns: ``summary``, the trained ``model``, ``run_dir``.
    PdADMM(model, rho, nu, ...)
        pdADMM on your own ``nn.Sequential``, an MLP or a CNN, in your own loop: ``init(x)``,
        then one ``step(x, y)`` per iteration, serial or one block of layers per rank of a group.
    JimuError
        the one error type for a user's mistake (its message is one line).
"""

import importlib
from typing import Any

from deepjimu.errors import JimuError

__version__ = "0.1.0"
__all__ = ["Fitted", "JimuError", "PdADMM", "__version__", "fit"]

# the API loads torch; `import deepjimu` (the CLI's first import) stays light until it is used
_LAZY = {"PdADMM": "deepjimu.api.admm", "fit": "deepjimu.api.fit", "Fitted": "deepjimu.api.fit"}


def __getattr__(name: str) -> Any:
    """The API's names (fit, Fitted, PdADMM), imported when first used."""
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'deepjimu' has no attribute {name!r}")


def __dir__() -> list[str]:
    """The module's names and the API's, so that help(deepjimu) documents fit and PdADMM."""
    return sorted({*globals(), *_LAZY})
