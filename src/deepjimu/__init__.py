"""deepjimu: train one network with every way of splitting it over workers, and measure."""

from typing import Any

from deepjimu.errors import JimuError

__version__ = "0.1.0"
__all__ = ["Fitted", "JimuError", "PdADMM", "__version__", "fit"]

# the API loads torch; `import deepjimu` (the CLI's first import) stays light until it is used
_LAZY = {"PdADMM": "deepjimu.api.admm", "fit": "deepjimu.api.fit", "Fitted": "deepjimu.api.fit"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'deepjimu' has no attribute {name!r}")
