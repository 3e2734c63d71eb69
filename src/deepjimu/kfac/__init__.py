"""K-FAC: second-order preconditioning of SGD, distributed as in KAISA (Pauloski et al., SC21).

factors (A and G of a batch), precondition (eigen / inverse forms, KL clipping),
assignment (who decomposes and who preconditions each layer), layers (hooks),
preconditioner (the distributed steps through Comm), optimizer (SGD on the result).
"""

from deepjimu.kfac.assignment import WorkAssignment
from deepjimu.kfac.optimizer import KFAC
from deepjimu.kfac.preconditioner import KFACPreconditioner, KFACSettings

__all__ = ["KFAC", "KFACPreconditioner", "KFACSettings", "WorkAssignment"]
