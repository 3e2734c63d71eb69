"""How work is split over workers, pure: the ``--balance`` values, the stage solver, the shards by speed.

Like torchgpipe's ``balance/``, the split is computed here as plain lists and handed to the
code that runs it: the strategies cut their models by :func:`partition` (of costs measured
elsewhere, :mod:`deepjimu.measure`), the data is sharded by :func:`shard_sizes`, and the
planner predicts the same splits. No torch import here.
"""

from __future__ import annotations

from collections.abc import Sequence

from deepjimu.errors import JimuError

__all__ = [
    "NAMED_BALANCES",
    "SPEED_BALANCES",
    "UNEVEN",
    "balance_problems",
    "chosen_balance",
    "listed_balance",
    "parse_balance",
    "partition",
    "shard_counts",
    "shard_sizes",
]

UNEVEN = 1.1
"""``auto`` balances by speed when the fastest rank is more than this many times the slowest."""

SPEED_BALANCES = ("auto", "speed")
"""``--balance`` values that measure the ranks' speeds."""


def partition(
    costs: Sequence[float],
    k: int,
    speeds: Sequence[float] | None = None,
    cut_costs: Sequence[float] | None = None,
) -> list[int]:
    """Cut ``costs`` into ``k`` non-empty contiguous parts so that the slowest part is fastest.

    A part's time is its costs over its rank's speed, plus the cost of the cuts at its two
    ends (its rank sends and receives there, whatever its speed). With no speeds and no cut
    costs that is the largest part sum. Exact dynamic programme over (items, parts),
    O(k n^2). Among optimal cuts the one with the latest cut points wins (earlier parts take
    more), so the result is deterministic.

    Args:
        costs: non-negative cost of each block, in model order.
        k: number of parts (stages).
        speeds: each part's rank's speed (> 0; default all 1): a part on a rank at speed
            0.5 takes twice its costs.
        cut_costs: ``cut_costs[i]``, the cost of a cut after block ``i`` (``n - 1`` of them;
            default 0), paid by both parts it separates.

    Returns:
        the part sizes (``len == k``, ``sum == len(costs)``, each >= 1).

    Raises:
        JimuError: ``k`` < 1, more parts than costs, a negative cost, or speeds or cut
            costs of the wrong length or sign.

    Example:
        >>> partition([1, 1, 1, 3], 2)
        [3, 1]
        >>> partition([1, 1, 1, 1], 2, speeds=[1.0, 0.25])
        [3, 1]
    """
    n = len(costs)
    if k < 1 or k > n:
        raise JimuError(f"cannot cut {n} blocks into {k} non-empty stages")
    if any(c < 0 for c in costs):
        raise JimuError(f"block costs must be >= 0 (costs: {list(costs)})")
    speeds = list(speeds) if speeds is not None else [1.0] * k
    if len(speeds) != k or any(not v > 0 for v in speeds):
        raise JimuError(f"need {k} speeds > 0 (speeds: {speeds})")
    cuts = list(cut_costs) if cut_costs is not None else [0.0] * (n - 1)
    if len(cuts) != n - 1 or any(c < 0 for c in cuts):
        raise JimuError(f"need {n - 1} cut costs >= 0 (cut costs: {cuts})")
    prefix = [0.0]
    for c in costs:
        prefix.append(prefix[-1] + float(c))

    def part_time(j: int, s: int, i: int) -> float:
        """Part j (0-based) holding items s .. i - 1."""
        ends = (cuts[s - 1] if s > 0 else 0.0) + (cuts[i - 1] if i < n else 0.0)
        return (prefix[i] - prefix[s]) / speeds[j] + ends

    inf = float("inf")
    # best[j][i]: smallest slowest-part of the first i items in j parts; cut[j][i]: start of part j
    best = [[inf] * (n + 1) for _ in range(k + 1)]
    cut = [[0] * (n + 1) for _ in range(k + 1)]
    best[0][0] = 0.0
    for j in range(1, k + 1):
        for i in range(j, n - (k - j) + 1):
            for s in range(j - 1, i):
                value = max(best[j - 1][s], part_time(j - 1, s, i))
                if value <= best[j][i]:
                    best[j][i], cut[j][i] = value, s
    sizes, i = [], n
    for j in range(k, 0, -1):
        s = cut[j][i]
        sizes.append(i - s)
        i = s
    return sizes[::-1]


def parse_balance(text: str, n_blocks: int, k: int) -> list[int]:
    """Parse ``--balance N,N,...``: the number of blocks of each of ``k`` stages.

    Args:
        text: comma-separated block counts, e.g. ``"2,2"``.
        n_blocks: blocks in the model.
        k: number of stages.

    Returns:
        the block counts.

    Raises:
        JimuError: one line naming the problem and the values, e.g.
            ``balance must sum to the number of blocks (blocks: 4, sum of balance: 3)``.

    Example:
        >>> parse_balance("3,1", 4, 2)
        [3, 1]
    """
    try:
        sizes = [int(part) for part in text.split(",")]
    except ValueError:
        raise JimuError(
            f"balance must be auto, even, speed, time, size or block counts per stage like "
            f"2,2 (balance: {text!r})"
        ) from None
    if len(sizes) != k:
        raise JimuError(
            f"balance must give one block count per stage (stages: {k}, entries: {len(sizes)})"
        )
    if min(sizes) < 1:
        raise JimuError(f"balance entries must be >= 1 (balance: {text})")
    if sum(sizes) != n_blocks:
        raise JimuError(
            f"balance must sum to the number of blocks (blocks: {n_blocks}, sum of balance: {sum(sizes)})"
        )
    return sizes


NAMED_BALANCES = ("auto", "even", "speed", "time", "size")
"""``--balance`` values that name a split (the others list blocks per stage)."""


def listed_balance(text: str) -> bool:
    """Whether ``--balance`` lists the blocks per stage (``N,N,...``) rather than naming a
    named split (:data:`NAMED_BALANCES`)."""
    return text not in NAMED_BALANCES


def balance_problems(text: str, n_blocks: int, stages: int) -> list[str]:
    """Validation: the one-line problem of a ``--balance N,N,...`` list, if any.

    ``time`` and ``size`` have none, nor has a model with fewer blocks than stages (the
    strategy reports that on its own line).
    """
    if not listed_balance(text) or n_blocks < stages:
        return []
    try:
        parse_balance(text, n_blocks, stages)
    except JimuError as e:
        return [str(e)]
    return []


def chosen_balance(balance: str, speeds: Sequence[float] | None) -> str:
    """What ``--balance`` means once the speeds are known: ``auto`` becomes ``speed`` when
    they differ by more than :data:`UNEVEN`, else ``even``; other values stay.

    Example:
        >>> chosen_balance("auto", [1.0, 0.3]), chosen_balance("auto", [1.0, 0.95])
        ('speed', 'even')
    """
    if balance != "auto":
        return balance
    if speeds is None or max(speeds) <= UNEVEN * min(speeds):
        return "even"
    return "speed"


def shard_sizes(n: int, weights: Sequence[float]) -> list[int]:
    """Rows of each rank when ``n`` rows are shared in proportion to ``weights``: the
    largest-remainder rounding, every rank at least one row.

    Example:
        >>> shard_sizes(10, [1.0, 0.25])
        [8, 2]
    """
    total = sum(weights)
    exact = [n * w / total for w in weights]
    sizes = [max(1, int(e)) for e in exact]
    order = sorted(range(len(weights)), key=lambda r: exact[r] - int(exact[r]), reverse=True)
    for r in order[: max(0, n - sum(sizes))]:
        sizes[r] += 1
    while sum(sizes) > n:  # the floor of one row took more than there are
        big = max(range(len(sizes)), key=lambda r: sizes[r])
        sizes[big] -= 1
    return sizes


def shard_counts(n: int, world: int, weights: Sequence[float] | None = None) -> list[int]:
    """Training rows of each rank's :meth:`DataSplits.shard` of ``n`` rows: ``rank::world``
    (even), or in proportion to ``weights`` (:func:`shard_sizes`).

    Example:
        >>> shard_counts(5, 2), shard_counts(5, 2, [1.0, 0.25])
        ([3, 2], [4, 1])
    """
    if weights is None:
        return [len(range(r, n, world)) for r in range(world)]
    return shard_sizes(n, weights)
