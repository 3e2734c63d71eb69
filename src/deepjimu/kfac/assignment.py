"""Which rank decomposes each layer's factors and which ranks precondition its gradient (KAISA)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from deepjimu.choices import KfacMethod

__all__ = ["WorkAssignment", "decomposition_cost", "packed_numel"]


def decomposition_cost(n_a: int, n_g: int) -> float:
    """Cost of decomposing a layer's n_a x n_a factor A and n_g x n_g factor G: ~ n^3 each."""
    return float(n_a**3 + n_g**3)


def packed_numel(method: KfacMethod, n_a: int, n_g: int) -> int:
    """Entries of a layer's packed decomposition (what its inverse worker broadcasts) for
    factors of sizes ``n_a`` and ``n_g``: eigenvectors and eigenvalues of both (eigen), or
    the upper triangles of both damped inverses (inverse).

    Example:
        >>> packed_numel(KfacMethod.EIGEN, 2, 1), packed_numel(KfacMethod.INVERSE, 2, 1)
        (8, 4)
    """
    if method == KfacMethod.EIGEN:
        return n_a * n_a + n_a + n_g * n_g + n_g
    return n_a * (n_a + 1) // 2 + n_g * (n_g + 1) // 2


@dataclass(frozen=True)
class WorkAssignment:
    """The KAISA work split for ``world`` ranks, ``grad_workers`` of which precondition each layer.

    The ranks form a grid of ``grad_workers`` rows by ``world / grad_workers`` columns, in
    row-major order. A column is a *gradient-worker group*: a layer is decomposed by one
    rank (its inverse worker) and preconditioned by every rank of that rank's column, which
    receives the decomposition by broadcast. A row is a *receiver group*: it holds exactly
    one gradient worker of every layer, which broadcasts the preconditioned gradient to the
    rest of the row. ``grad_workers = world`` (F = 1) is COMM-OPT: one column, every rank
    preconditions every layer, no gradient broadcast. ``grad_workers = 1`` (F = 1/world) is
    MEM-OPT: one row, only the inverse worker holds a layer's decomposition and broadcasts
    its preconditioned gradient to all. Between the two is HYBRID.

    Example:
        >>> a = WorkAssignment.greedy([8.0, 1.0, 1.0], world=4, grad_workers=2)
        >>> a.inv_workers, a.worker_groups(), a.receiver_groups()
        ((0, 1, 3), [(0, 2), (1, 3)], [(0, 1), (2, 3)])

    Args:
        world: number of ranks.
        grad_workers: ranks that precondition each layer; divides ``world``.
        inv_workers: per layer, the rank that decomposes its factors.
    """

    world: int
    grad_workers: int
    inv_workers: tuple[int, ...]

    def __post_init__(self) -> None:
        if not 1 <= self.grad_workers <= self.world or self.world % self.grad_workers:
            raise ValueError(
                f"grad_workers must divide world (grad_workers: {self.grad_workers}, world: {self.world})"
            )
        if any(not 0 <= r < self.world for r in self.inv_workers):
            raise ValueError(f"inverse workers must be ranks < {self.world} ({self.inv_workers})")

    @classmethod
    def greedy(
        cls,
        costs: Sequence[float],
        world: int,
        grad_workers: int,
        speeds: Sequence[float] | None = None,
    ) -> WorkAssignment:
        """Greedy load balancing: the costliest layer first, to the least loaded group, then rank.

        Each layer goes to the gradient-worker group whose ranks carry the least
        decomposition cost so far, and within it to the least loaded rank (ties: the lower
        group, the lower rank), as KAISA assigns with its factors colocated. With
        ``speeds`` a load is time, cost over the rank's speed, and within the group the
        layer goes to the rank that would finish it first.

        Args:
            costs: per layer, the cost of its decomposition (:func:`decomposition_cost`).
            world, grad_workers: as for the class.
            speeds: each rank's speed (> 0; default all 1).

        Example:
            >>> WorkAssignment.greedy([4.0, 4.0, 4.0], 2, 2, speeds=[1.0, 0.25]).inv_workers
            (0, 0, 1)
        """
        groups = cls(world, grad_workers, ()).worker_groups()  # (checks world and grad_workers)
        speed = list(speeds) if speeds is not None else [1.0] * world
        if len(speed) != world or any(not v > 0 for v in speed):
            raise ValueError(f"need {world} speeds > 0 (speeds: {speed})")
        load = [0.0] * world
        owner = [0] * len(costs)
        for layer in sorted(range(len(costs)), key=lambda i: (-costs[i], i)):
            group = min(groups, key=lambda g: sum(load[r] for r in g))
            rank = min(group, key=lambda r: load[r] + costs[layer] / speed[r])
            owner[layer] = rank
            load[rank] += costs[layer] / speed[rank]
        return cls(world, grad_workers, tuple(owner))

    @property
    def columns(self) -> int:
        """Number of gradient-worker groups (world / grad_workers)."""
        return self.world // self.grad_workers

    def worker_groups(self) -> list[tuple[int, ...]]:
        """The gradient-worker groups (grid columns), each ``grad_workers`` ranks."""
        return [tuple(range(c, self.world, self.columns)) for c in range(self.columns)]

    def receiver_groups(self) -> list[tuple[int, ...]]:
        """The receiver groups (grid rows), each ``world / grad_workers`` ranks."""
        c = self.columns
        return [tuple(range(r * c, (r + 1) * c)) for r in range(self.grad_workers)]

    def grad_workers_of(self, layer: int) -> tuple[int, ...]:
        """The ranks that precondition ``layer``: its inverse worker's column."""
        return self.worker_groups()[self.inv_workers[layer] % self.columns]

    def is_grad_worker(self, layer: int, rank: int) -> bool:
        """Whether ``rank`` holds ``layer``'s decomposition and preconditions its gradient."""
        return rank % self.columns == self.inv_workers[layer] % self.columns

    def grad_source(self, layer: int, rank: int) -> int:
        """The gradient worker of ``layer`` in ``rank``'s receiver group (``rank`` itself if it is one)."""
        return rank - rank % self.columns + self.inv_workers[layer] % self.columns

    def loads(self, costs: Sequence[float]) -> list[float]:
        """Per rank, the summed cost of the layers it decomposes."""
        load = [0.0] * self.world
        for layer, rank in enumerate(self.inv_workers):
            load[rank] += costs[layer]
        return load
