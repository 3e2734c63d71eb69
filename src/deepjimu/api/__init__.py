"""The Python API: deepjimu's training on the user's own model, from the user's own script."""

from deepjimu.api.admm import AdmmStep, PdADMM, admm_linears

__all__ = ["AdmmStep", "PdADMM", "admm_linears"]
