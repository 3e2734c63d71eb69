"""deepjimu: train one network with every way of splitting it over workers, and measure."""

from deepjimu.errors import JimuError

__version__ = "0.1.0"
__all__ = ["JimuError", "__version__"]
