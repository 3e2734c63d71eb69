"""Mesh: a run's workers as R replicas x K stages (``--replicas R``), and its two kinds of groups.

Rank g is stage ``g % K`` of replica ``g // K`` (torch's ``DeviceMesh`` of shape (R, K),
dimensions ``replica`` and ``stage``, row-major as torch lays it out): replica 0 holds ranks
0 .. K-1, so rank 0 and the last stage of replica 0 are where a 1-D run has them. A *row*
(the ranks of one replica) runs the strategy's split as a 1-D run of K workers does; a
*column* (the ranks of one stage, one per replica) averages that stage over the replicas.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

__all__ = ["Mesh", "batch_problems", "device_mesh"]


@dataclass(frozen=True)
class Mesh:
    """Where global rank ``rank`` sits in a mesh of ``replicas`` x ``stages`` ranks.

    Example:
        >>> m = Mesh(replicas=2, stages=3, rank=4)
        >>> m.replica, m.stage, m.row, m.column
        (1, 1, [3, 4, 5], [1, 4])
    """

    replicas: int
    stages: int
    rank: int

    @property
    def replica(self) -> int:
        return self.rank // self.stages

    @property
    def stage(self) -> int:
        return self.rank % self.stages

    @property
    def row(self) -> list[int]:
        """The global ranks of this rank's replica, stage by stage."""
        return [self.replica * self.stages + k for k in range(self.stages)]

    @property
    def column(self) -> list[int]:
        """The global ranks of this rank's stage, replica by replica."""
        return [r * self.stages + self.stage for r in range(self.replicas)]

    def parts(
        self, batches: Sequence[tuple[Tensor, Tensor]]
    ) -> tuple[list[tuple[Tensor, Tensor]], list[float]]:
        """This replica's part of each batch (the r-th of R nearly equal consecutive parts),
        and the weight of each part's mean loss, R b / B where it holds b of the batch's B
        rows: the replicas' gradients are averaged, so the average is the gradient of the
        whole batch's mean loss, as one process would take it.

        Example:
            >>> x, y = torch.zeros(5, 2), torch.arange(5)
            >>> parts, weights = Mesh(replicas=2, stages=1, rank=1).parts([(x, y)])
            >>> parts[0][1].tolist(), weights
            ([3, 4], [0.8])
        """
        parts = [
            (
                x.tensor_split(self.replicas)[self.replica],
                y.tensor_split(self.replicas)[self.replica],
            )
            for x, y in batches
        ]
        weights = [
            self.replicas * len(p[1]) / len(b[1]) for p, b in zip(parts, batches, strict=True)
        ]
        return parts, weights


def device_mesh(mesh: Mesh, device: torch.device) -> DeviceMesh:
    """Collective (every rank of the default group): torch's ``DeviceMesh`` of ``mesh``,
    dimensions ``replica`` and ``stage``, over the default group's backend; its
    ``get_group("stage")`` is this rank's row, ``get_group("replica")`` its column."""
    return init_device_mesh(
        device.type, (mesh.replicas, mesh.stages), mesh_dim_names=("replica", "stage")
    )


def batch_problems(batch_size: int, replicas: int) -> list[str]:
    """The one-line problem of a batch too small for each replica to take a share of it."""
    if batch_size >= replicas:
        return []
    return [
        f"batch-size must be >= replicas, each replica takes its share of every batch "
        f"(batch-size: {batch_size}, replicas: {replicas})"
    ]
