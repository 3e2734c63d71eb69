"""The options of a run: groups that check their own values, composed for each strategy.

``base`` (the group and its helpers), ``run`` (run, data), ``gradient`` (optimiser, K-FAC,
pipeline, ddp sync), ``admm``, ``groups`` (the compositions, ``--help``'s order, checks
between groups), ``compress`` (the ``--compress`` spelling). No torch import here.
"""

from deepjimu.options.admm import AdmmGroup
from deepjimu.options.base import Group, narrow
from deepjimu.options.gradient import KfacGroup, OptimGroup, PipelineGroup, SyncGroup
from deepjimu.options.groups import (
    GROUPS,
    AdmmOptions,
    DdpOptions,
    GradientOptions,
    LocalOptions,
    PipelineOptions,
    applies_of,
    group_of,
)
from deepjimu.options.run import DataGroup, RunGroup

__all__ = [
    "GROUPS", "AdmmGroup", "AdmmOptions", "DataGroup", "DdpOptions", "GradientOptions",
    "Group", "KfacGroup", "LocalOptions", "OptimGroup", "PipelineGroup", "PipelineOptions",
    "RunGroup", "SyncGroup", "applies_of", "group_of", "narrow",
]  # fmt: skip
