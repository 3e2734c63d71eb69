"""Timing the links of a run's group: collectives and a point-to-point send at growing sizes, and messages at their own sizes.

Collective: every rank of the group calls these at the same point. Each figure is the
slowest rank's (a median of a few repeats after a warm one), so that every rank fits the
same line (:func:`deepjimu.cost.probe.fit_alpha_beta`).
"""

from __future__ import annotations

import statistics

import torch
import torch.distributed as dist

from deepjimu.cost.probe import TIMED_AT_SIZE, message_key
from deepjimu.measure.timing import median_s, slowest, timed_s

__all__ = [
    "COLLECTIVES",
    "REDUCE_SCATTER",
    "SIZES",
    "measure_links",
    "time_collective",
    "time_messages",
    "time_p2p",
]

SIZES = tuple(4096 * 4**i for i in range(8))  # 4 KB .. 64 MB per rank
# the probed collectives: name -> (operation, element dtype)
COLLECTIVES = {
    "all_reduce": ("all_reduce", torch.float32),
    "all_reduce_fp16": ("all_reduce", torch.float16),
    "all_reduce_bf16": ("all_reduce", torch.bfloat16),
    "all_gather": ("all_gather", torch.uint8),
}
# timed only for --sync-plan (its sharded parameter server), so that jimu probe and
# --compress auto keep their time
REDUCE_SCATTER = {"reduce_scatter": ("reduce_scatter", torch.float32)}


def time_collective(name: str, nbytes: int, device: torch.device, reps: int) -> float:
    """Median seconds of one blocking collective ``name`` (:data:`COLLECTIVES`) of ``nbytes`` per rank, the slowest rank's."""
    world = dist.get_world_size()
    kind, dtype = {**COLLECTIVES, **REDUCE_SCATTER}[name]
    # zeros: repeated sums of ones would overflow float16 to inf after 16 all-reduces
    t = torch.zeros(nbytes // dtype.itemsize, dtype=dtype, device=device)
    if kind == "all_reduce":
        op = lambda: dist.all_reduce(t)  # noqa: E731
    elif kind == "reduce_scatter":  # nbytes in, nbytes / world out (whole entries per rank)
        t = t[: len(t) // world * world]
        shard = torch.empty(len(t) // world, dtype=dtype, device=device)
        # torch 2.13 renamed reduce_scatter_tensor (deprecated there)
        scatter = getattr(dist, "reduce_scatter_single", dist.reduce_scatter_tensor)
        op = lambda: scatter(shard, t)  # noqa: E731
    else:
        out = [torch.empty_like(t) for _ in range(world)]
        op = lambda: dist.all_gather(out, t)  # noqa: E731
    op()  # connections and buffers warm
    dist.barrier()
    return slowest([median_s(op, reps, device, warm=0)], device)[0]


def time_p2p(nbytes: int, device: torch.device, reps: int) -> float:
    """Median seconds of one blocking send of ``nbytes`` from rank 0 to rank 1 (half a
    round trip: rank 1 sends it back), as the model-parallel strategies hand activations
    on; every rank returns rank 0's figure."""
    t = torch.zeros(nbytes, dtype=torch.uint8, device=device)
    rank = dist.get_rank()

    def round_trip() -> None:
        if rank == 0:
            dist.send(t, 1)
            dist.recv(t, 1)
        elif rank == 1:
            dist.recv(t, 0)
            dist.send(t, 0)

    times = []
    for r in range(reps + 1):  # the first round trip warms the connection
        dist.barrier()
        seconds = timed_s(round_trip, device)
        if r:
            times.append(seconds / 2)
    mine = torch.tensor([statistics.median(times)], dtype=torch.float64, device=device)
    dist.broadcast(mine, src=0)
    return float(mine)


def measure_links(
    device: torch.device,
    max_op_s: float,
    names: list[str] | None = None,
    max_bytes: int | None = None,
) -> dict[str, list[tuple[int, float]]]:
    """Collective: (bytes, seconds) of each collective in ``names`` (default: :data:`COLLECTIVES`
    and, with more than one rank, p2p) at :data:`SIZES` up to ``max_bytes`` (two sizes at least)."""
    points: dict[str, list[tuple[int, float]]] = {}
    if names is None:  # a point-to-point send needs a second rank
        names = [*COLLECTIVES, "p2p"] if dist.get_world_size() > 1 else list(COLLECTIVES)
    sizes = [s for i, s in enumerate(SIZES) if max_bytes is None or i < 2 or s <= 4 * max_bytes]
    for name in names:
        points[name] = []
        for size in sizes:
            reps = 5 if size <= 2**20 else 3
            if name == "p2p":
                seconds = time_p2p(size, device, reps)
            else:
                seconds = time_collective(name, size, device, reps)
            points[name].append((size, seconds))
            if seconds > max_op_s and len(points[name]) >= 2:
                break
    return points


def time_messages(messages: list[tuple[str, int]], device: torch.device) -> dict[str, float]:
    """Collective: the slowest rank's median time of each distinct all-gather message.

    The alpha-beta fit cannot follow a collective whose speed jumps with the payload: under
    a 100 Mbit/s cap gloo's all-gather ran at 95 Mbit/s for some sizes and 65 for others
    (topk's 258,096 bytes fast, the fit's 262,144 slow), which put topk's prediction 10-28%
    above its measured step. So the all-gathers the options really make are timed at their
    own sizes, and the cost model uses those times. All-reduce ran at 91-95 Mbit/s at every
    size and keeps its fit: timed one size at a time (median of 3-5) its messages were
    noisier than the fit over 8 sizes (on the uncapped link, 4.3 MB of float16 took 5.3 ms
    in one probe and 8.4 ms in the next), enough to swap fp16 and bf16 (BENCHMARKS.md
    section 6).
    """
    out = {}
    for name, nbytes in sorted(set(messages)):
        if name in TIMED_AT_SIZE and nbytes > 0:
            out[message_key(name, nbytes)] = time_collective(name, nbytes, device, reps=7)
    return out
