"""The Python API: deepjimu's training on the user's own model, from the user's own script."""

from deepjimu.api.admm import AdmmStep, PdADMM, admm_maps
from deepjimu.api.fit import Fitted, fit

__all__ = ["AdmmStep", "Fitted", "PdADMM", "admm_maps", "fit"]
