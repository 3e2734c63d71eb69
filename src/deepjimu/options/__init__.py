"""The options of a run: option groups (each with its own checks), the ``--compress`` spelling.

No torch import here: ``--help`` is built before torch loads.
"""

from deepjimu.options.groups import (
    GRADIENT_STRATEGIES,
    GROUPS,
    AdmmGroup,
    AdmmOptions,
    DataGroup,
    DdpOptions,
    GradientOptions,
    Group,
    KfacGroup,
    LocalOptions,
    OptimGroup,
    PipelineGroup,
    PipelineOptions,
    RunGroup,
    SyncGroup,
    applies_of,
    group_of,
    narrow,
)

__all__ = [
    "GRADIENT_STRATEGIES", "GROUPS", "AdmmGroup", "AdmmOptions", "DataGroup", "DdpOptions",
    "GradientOptions", "Group", "KfacGroup", "LocalOptions", "OptimGroup", "PipelineGroup",
    "PipelineOptions", "RunGroup", "SyncGroup", "applies_of", "group_of", "narrow",
]  # fmt: skip
