"""deepjimu: train one network with every way of splitting it over workers, and measure."""

import os

# Before torch loads OpenMP (workers import torch after this): idle OpenMP threads sleep
# instead of spinning. With spinning threads, a worker sharing the cores with other workers
# or jobs ran pdADMM iterations 13x slower on a 2-core machine (0.20 vs 2.67 s).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from deepjimu.errors import JimuError

__version__ = "0.1.0"
__all__ = ["JimuError", "__version__"]
