"""Measure the link and this device: collective times fitted to latency + bytes / bandwidth, compute and codec time per step.

The probe is collective: every rank of the run's group calls :func:`measure`. It times

- ``all_reduce`` of float32, float16 and bfloat16 tensors and ``all_gather`` (bytes) over
  the real group, and a blocking send from rank 0 to rank 1 (``p2p``, what the
  model-parallel strategies hand on; for the planning layer), for payloads of 4 KB,
  16 KB, ... 64 MB per rank (a size is measured only
  while the previous one took under ``max_op_s``: on a slow link the small sizes already
  fix the fit), and fits t(n) = alpha + beta n to each (:func:`fit_alpha_beta`). A
  reduction's time depends on its dtype, not only on its bytes: gloo adds 16-bit floats
  one element at a time through float32, and on the 2-core VM over loopback 6 MB took
  4.7 ms as float32, 6.2 ms as bfloat16 and 8.5 ms as float16, a difference that decides
  between fp16 and bf16 on a fast link (BENCHMARKS.md section 6);
- with more than one rank, each all-gather the probed options make, at its own size (from
  DDP's bucket layout), because all-gather's speed can jump with the payload in a way the
  fit cannot follow (:func:`_time_messages`);
- training steps of the run's model on a batch of ``batch_size / world`` rows on this
  device, under DDP over a group of this rank alone (so there is no communication), with
  each compressor in turn: the plain step is the compute time, the difference is the
  compressor's encode/decode time; for compressors that all-gather, each further rank
  adds the decode time of one more payload. The ranks start each timed step together and
  a step counts at its slowest rank's time, as a synchronous step does: ranks that share a
  machine then compete for its cores as in training (on the 2-core VM this raised the
  compute estimate of mlp:1024x4 from 34 to 41 ms and brought the prediction of plain ddp
  within 5% of the measured step on loopback, from 16% below).

Every figure is the slowest rank's, so that all ranks hold the same probe and the cost
model (:mod:`deepjimu.compress.cost`) makes the same choice on each. The probe also records
DDP's bucket layout (the gradient shapes of each bucket), from which the cost model derives
every option's messages.
"""

from __future__ import annotations

import copy
import json
import math
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from deepjimu.atomic import atomic_write_text
from deepjimu.comm import Comm, CommStats
from deepjimu.counters import Counters
from deepjimu.data import DataSplits
from deepjimu.errors import JimuError
from deepjimu.options import DdpOptions
from deepjimu.run import Run
from deepjimu.units import format_bytes

__all__ = [
    "PIPELINE_M",
    "SIZES",
    "TIMED_AT_SIZE",
    "LinkFit",
    "Probe",
    "fit_alpha_beta",
    "format_probe",
    "measure",
    "message_key",
    "read_probe",
    "write_probe",
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


@dataclass(frozen=True)
class LinkFit:
    """t(n) = ``alpha_s`` + ``beta_s_per_byte`` * n for a collective with n bytes per rank."""

    alpha_s: float
    beta_s_per_byte: float

    def seconds(self, nbytes: int) -> float:
        """Predicted time of one collective moving ``nbytes`` per rank."""
        return self.alpha_s + self.beta_s_per_byte * nbytes

    @property
    def gbit_per_s(self) -> float:
        """The fitted bandwidth in Gbit/s (inf when the time does not grow with size)."""
        return 8e-9 / self.beta_s_per_byte if self.beta_s_per_byte > 0 else float("inf")


def fit_alpha_beta(sizes: list[int], seconds: list[float]) -> LinkFit:
    """Fit t = alpha + beta n to measured (n, t) points, minimising the relative error.

    Sizes span four orders of magnitude, so plain least squares would fit the largest
    points only; each equation is divided by its measured time instead. alpha and beta are
    kept >= 0 (a negative one is set to 0 and the other refitted).

    Example:
        >>> f = fit_alpha_beta([1000, 2000, 4000], [0.0011, 0.0012, 0.0014])
        >>> round(f.alpha_s, 6), round(f.beta_s_per_byte * 1e9, 3)
        (0.001, 100.0)

    Raises:
        ValueError: fewer than two points, or a time that is not positive.
    """
    n = np.asarray(sizes, dtype=float)
    t = np.asarray(seconds, dtype=float)
    if len(n) < 2 or len(n) != len(t) or not np.all(t > 0):
        raise ValueError(
            f"need >= 2 points with positive times (sizes: {sizes}, seconds: {seconds})"
        )
    a = np.stack([np.ones_like(n), n], axis=1) / t[:, None]
    b = np.ones_like(t)
    alpha, beta = np.linalg.lstsq(a, b, rcond=None)[0]
    if alpha < 0:
        alpha, beta = 0.0, float(np.sum(n / t) / np.sum((n / t) ** 2))
    elif beta < 0:
        alpha, beta = float(np.sum(1 / t) / np.sum(1 / t**2)), 0.0
    return LinkFit(float(alpha), float(beta))


@dataclass
class Probe:
    """What :func:`measure` found on this group and device (all times in seconds).

    ``links``: the fit per collective; ``points``: its measured (bytes per rank, seconds);
    ``compute_s``: one training step without communication; ``codec_s``: per option, the
    encode/decode time one step adds (with this ``world``); ``buckets``: the gradient
    shapes of each DDP bucket; ``pipeline_step_s``: a step of the ``pipeline``
    strategy itself, GPipe with :data:`PIPELINE_M` micro-batches of ``pipeline_rows`` rows,
    the model cut into stages of ``pipeline_sizes`` blocks (:func:`_time_staged`; from it
    the planning layer solves the pipelining runtime's own cost per action);
    ``chain_step_s``: the same of the ``model-parallel`` strategy (one batch of
    ``chain_rows`` rows through stages of ``chain_sizes`` blocks, one rank after the
    other; the hand-offs' cost beyond the fitted send is solved from it); ``message_s``: the
    measured time of each all-gather the probed options make (:data:`TIMED_AT_SIZE`),
    keyed ``"collective:bytes"`` (:func:`message_key`); ``ddp_step_s``: a plain ddp step over
    the probed group itself, its all-reduce included (None with one rank; from it the
    planning layer measures what a step's all-reduce costs beyond its fitted time when the
    ranks reach it at different moments, :attr:`deepjimu.plan.cluster.Cluster.ddp_sync_s`).
    """

    world: int
    device: str
    model: str
    batch_per_rank: int
    compute_s: float
    codec_s: dict[str, float]
    links: dict[str, LinkFit]
    points: dict[str, list[tuple[int, float]]] = field(default_factory=dict)
    buckets: list[list[list[int]]] = field(default_factory=list)
    message_s: dict[str, float] = field(default_factory=dict)
    pipeline_step_s: float | None = None
    pipeline_sizes: list[int] = field(default_factory=list)
    pipeline_rows: int = 0
    chain_step_s: float | None = None
    chain_sizes: list[int] = field(default_factory=list)
    chain_rows: int = 0
    ddp_step_s: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Probe:
        fields = {**d, "links": {k: LinkFit(**v) for k, v in d["links"].items()}}
        fields["points"] = {k: [tuple(p) for p in v] for k, v in d.get("points", {}).items()}
        return cls(**{k: fields[k] for k in cls.__dataclass_fields__ if k in fields})


def write_probe(
    probe: Probe, path: Path, predictions: list[Any] | None = None, choice: str | None = None
) -> None:
    """Write ``probe`` (and the cost model's predictions and choice, when given) to ``path`` atomically."""
    out = probe.to_dict()
    if predictions is not None:
        out["predictions"] = [asdict(p) for p in predictions]
        out["choice"] = choice
    atomic_write_text(path, json.dumps(out, indent=2))


def read_probe(path: Path) -> Probe:
    """The probe written by :func:`write_probe`.

    Raises:
        JimuError: the file is missing or damaged.
    """
    try:
        return Probe.from_dict(json.loads(Path(path).read_text()))
    except FileNotFoundError:
        raise JimuError(f"probe file {path} does not exist; run jimu probe first") from None
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise JimuError(f"probe file {path} is damaged: {e}") from None


PIPELINE_M = 4
"""Micro-batches of the probe's pipeline step (:func:`_time_staged`)."""


def _strategy_step_s(
    strategy: Any,
    model: nn.Module,
    data: DataSplits,
    run: Run,
    rows: Callable[[], int],
    rounds: int = 3,
    steps: int = 10,
) -> float:
    """Collective: the seconds of one ``train_step`` of ``strategy`` (set up here on a copy of
    ``model``) on a batch of ``rows()`` of this rank's rows (asked once it is set up), the
    slowest rank's, on every rank: exactly what training runs, so that a prediction solved
    from it pays what training pays (the strategy's padding, loss, counted hand-offs,
    hooks and update).

    The strategy runs on counters of its own (a ddp run's ``--compress auto`` probes inside
    training, whose byte counts must not hold the probe's). The steps run one after the
    other, as in training, ``steps`` at a time after 3 warm ones; the figure is the median
    over ``rounds`` of the mean step. (On cores that the ranks time-share, steps timed one
    at a time from a barrier each measured up to 40% faster than back to back.)
    """
    view = copy.copy(run)
    view.counters = Counters(run.device)
    view.stats, view.comm = view.counters.stats, view.counters.comm
    strategy.setup(copy.deepcopy(model), data, view)
    index = torch.arange(rows()) % len(data.train_y)
    x, y = data.train_x[index].to(run.device), data.train_y[index].to(run.device)
    for _ in range(3):  # warm steps (DDP rebuilds its buckets after the first)
        strategy.train_step(x, y)
    times = []
    for _ in range(rounds):
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(steps):
            strategy.train_step(x, y)
        run.synchronize()
        times.append((time.perf_counter() - t0) / steps)
    return _slowest({"step": statistics.median(times)}, run.device)["step"]


def _time_staged(
    kind: str, model: nn.Module, data: DataSplits, cfg: DdpOptions, run: Run, **timing: int
) -> tuple[float, list[int], int] | None:
    """Collective: a step of the split-model strategy ``kind`` itself over the group's ranks
    (:func:`_strategy_step_s`), one stage a rank, the model cut as the strategy cuts it (the
    run's resolved ``--balance``), with the run's optimizer: ``pipeline`` runs GPipe with
    :data:`PIPELINE_M` micro-batches of the largest batch of ``--batch-size`` rows,
    ``model-parallel`` that batch whole through the stages one after the other. From each the
    planning layer solves that runtime's own work per action (:attr:`Cluster.action_s`).
    (A bare GPipe step of the same stages, the probe's figure before, timed 5.2-7.0 ms on the
    2-core VM where training's step of cnn:16-32 took 6-8 ms, and put pipeline predictions
    11-50% above the measured samples/s.)

    Returns:
        the step's seconds, the stage sizes and the rows of a micro-batch (model-parallel:
        of the batch), the same on every rank; None where the strategy does not run the
        model on this group (not a Sequential, fewer blocks than ranks, or an optimizer it
        does not take).
    """
    from deepjimu.choices import Schedule
    from deepjimu.options import GradientOptions, PipelineOptions
    from deepjimu.strategies.model_parallel import ModelParallelStrategy
    from deepjimu.strategies.pipeline import PipelineStrategy

    if not isinstance(model, nn.Sequential) or len(model) < run.world:
        return None
    if str(cfg.optimizer) == "kfac":
        return None
    own = {f.name: getattr(cfg, f.name) for f in fields(GradientOptions)}
    own.update(strategy=kind, workers=run.world, quiet=True)
    if kind == "pipeline":
        pcfg = PipelineOptions(**own, schedule=Schedule.GPIPE, microbatches=PIPELINE_M)
        if PipelineStrategy.problems(pcfg, len(model)):
            return None
        pipe = PipelineStrategy(pcfg)
        step = _strategy_step_s(pipe, model, data, run, lambda: PIPELINE_M * pipe.rows, **timing)
        return step, list(pipe.plan.sizes), pipe.rows
    chain = ModelParallelStrategy(GradientOptions(**own))
    rows = math.ceil(data.train_size / chain.steps_per_epoch(data))  # the largest batch
    step = _strategy_step_s(chain, model, data, run, lambda: rows, **timing)
    return step, list(chain.plan.sizes), rows


def _time_ddp(
    model: nn.Module, data: DataSplits, cfg: DdpOptions, run: Run, rows: int, **timing: int
) -> float:
    """Collective: a step of the ``ddp`` strategy itself over the group's ranks
    (:func:`_strategy_step_s`), its all-reduce included, on ``rows`` rows a rank (the
    probe's plain step's, so that the two compare): plain all-reduce (no compressor, local
    SGD or sync plan), the run's optimizer."""
    from deepjimu.strategies.ddp import DDPStrategy

    plain = replace(
        cfg, strategy="ddp", workers=run.world, quiet=True, compress="none", local_sgd=0,
        sync_plan="allreduce",
    )  # fmt: skip
    return _strategy_step_s(DDPStrategy(plain), model, data, run, lambda: rows, **timing)


def _time_collective(name: str, nbytes: int, device: torch.device, reps: int) -> float:
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
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        op()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        times.append(time.perf_counter() - t0)
    slowest = torch.tensor([statistics.median(times)], dtype=torch.float64, device=device)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
    return float(slowest)


def _time_p2p(nbytes: int, device: torch.device, reps: int) -> float:
    """Median seconds of one blocking send of ``nbytes`` from rank 0 to rank 1 (half a
    round trip: rank 1 sends it back), as the model-parallel strategies hand activations
    on; every rank returns rank 0's figure."""
    t = torch.zeros(nbytes, dtype=torch.uint8, device=device)
    rank = dist.get_rank()
    times = []
    for r in range(reps + 1):  # the first round trip warms the connection
        dist.barrier()
        t0 = time.perf_counter()
        if rank == 0:
            dist.send(t, 1)
            dist.recv(t, 1)
        elif rank == 1:
            dist.recv(t, 0)
            dist.send(t, 0)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        if r:
            times.append((time.perf_counter() - t0) / 2)
    mine = torch.tensor([statistics.median(times)], dtype=torch.float64, device=device)
    dist.broadcast(mine, src=0)
    return float(mine)


def _measure_links(
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
                seconds = _time_p2p(size, device, reps)
            else:
                seconds = _time_collective(name, size, device, reps)
            points[name].append((size, seconds))
            if seconds > max_op_s and len(points[name]) >= 2:
                break
    return points


def message_key(collective: str, nbytes: int) -> str:
    """The key of one message in :attr:`Probe.message_s`."""
    return f"{collective}:{nbytes}"


TIMED_AT_SIZE = ("all_gather",)
"""The collectives whose messages are timed at their own sizes (:func:`_time_messages`)."""


def _time_messages(messages: list[tuple[str, int]], device: torch.device) -> dict[str, float]:
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
            out[message_key(name, nbytes)] = _time_collective(name, nbytes, device, reps=7)
    return out


def _time_options(
    options: list[str],
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    cfg: DdpOptions,
    run: Run,
    group: Any,
    warm: int = 10,
    rounds: int = 9,
) -> tuple[dict[str, float], dict[str, float], list[list[list[int]]]]:
    """Collective: step time of each option on a DDP over ``group`` (this rank alone).

    The options take turns, one step each per round, so that other work on the machine
    slows them alike. Every timed step starts at a barrier of the run's group, so ranks
    that share a machine's cores compete for them as they do in training; a step's time
    is the slowest rank's. The first ``warm`` steps (DDP's bucket rebuild, the compressors'
    warm-up of 2 steps of plain all-reduce, and their own first steps) are not timed. With
    3, QSGD's first timed steps took 106-150 ms against 58-83 ms later (two nodes in network
    namespaces: its large per-step allocations settle over several steps), which put its
    prediction 82-110% above the measured step in 2 probes of 3; with 10 (and 9 timed
    rounds), 3 probes of 3 were within 23% (BENCHMARKS.md section 6).

    Returns:
        the median step per option (the same on every rank), this rank's median decode
        time per step, and DDP's bucket layout.
    """
    from torch.nn.parallel import DistributedDataParallel

    from deepjimu.compress.hooks import comm_hook
    from deepjimu.compress.spec import parse_compress
    from deepjimu.strategies.base import make_optimizer

    ids = [run.device.index] if run.device.type == "cuda" else None
    setups = {}
    for option in options:
        ddp = DistributedDataParallel(copy.deepcopy(model), device_ids=ids, process_group=group)
        spec = parse_compress(option)
        state, hook = comm_hook(spec, Comm(CommStats()), 2, run.device, seed=cfg.seed, group=group)
        ddp.register_comm_hook(state, hook)
        setups[option] = (ddp, state, make_optimizer(ddp.parameters(), cfg))
    times: dict[str, list[float]] = {o: [] for o in options}
    decodes: dict[str, list[float]] = {o: [] for o in options}
    for _ in range(warm + rounds):
        for option, (ddp, state, opt) in setups.items():
            decoded = state.decode_s
            dist.barrier()  # the ranks step together, as in training: they share the machine
            t0 = time.perf_counter()
            opt.zero_grad(set_to_none=True)
            with run.autocast():
                loss = F.cross_entropy(ddp(x), y)
            loss.backward()
            opt.step()
            run.synchronize()
            times[option].append(time.perf_counter() - t0)
            decodes[option].append(state.decode_s - decoded)
    state = setups[options[0]][1]
    layout = [[list(s) for s in state.layout[i]] for i in sorted(state.layout)]
    # a synchronous DDP step waits for its slowest rank: each step's time is the maximum
    # over the ranks (they started it together), then the median over the rounds
    per_step = torch.tensor(
        [t[warm:] for t in times.values()], dtype=torch.float64, device=run.device
    )
    dist.all_reduce(per_step, op=dist.ReduceOp.MAX)
    medians = {o: statistics.median(row) for o, row in zip(times, per_step.tolist(), strict=True)}
    # the median, not the mean: a memory-bound decode that shares the cores with the other
    # rank's backward pass has rare slow steps (QSGD's: 46 to 273 ms), which a mean over the
    # rounds let into the prediction (+44% to +78%, BENCHMARKS.md section 6)
    decode = {o: statistics.median(d[warm:]) for o, d in decodes.items()}
    return medians, decode, layout


def _slowest(values: dict[str, float], device: torch.device) -> dict[str, float]:
    """Collective: each value's maximum over the ranks (so that every rank holds the same probe)."""
    t = torch.tensor(list(values.values()), dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return dict(zip(values, t.tolist(), strict=True))


def measure(
    model: nn.Module, data: DataSplits, cfg: DdpOptions, run: Run, max_op_s: float = 0.25
) -> Probe:
    """Collective: probe the run's group and this device for ``model`` (see the module docstring).

    Args:
        model: the model to time (copied; its weights are not touched).
        data: this rank's data; the step is timed on its first ``batch_size / world`` rows.
        cfg: the run's config (batch size, optimizer, precision, seed).
        run: the rank's run (group, device).
        max_op_s: a collective is not timed at the next size once it took longer than this.

    Returns:
        the same probe on every rank: each time is the slowest rank's.
    """
    from deepjimu.compress.cost import PROBED, CostModel
    from deepjimu.compress.spec import parse_compress

    world = run.world
    batch = max(1, cfg.batch_size // world)
    x, y = data.train_x[:batch].to(run.device), data.train_y[:batch].to(run.device)
    points = _measure_links(run.device, max_op_s)
    links = {k: fit_alpha_beta([n for n, _ in v], [t for _, t in v]) for k, v in points.items()}
    wanted = str(parse_compress(cfg.compress))  # the run's own option, if not a candidate
    extra = [wanted] if wanted not in ("auto", *PROBED) else []
    options = ["none", *(o for o in [*PROBED, *extra] if o != "none")]
    solo, _ = dist.new_subgroups(group_size=1)
    steps, decode, layout = _time_options(options, model, x, y, cfg, run, solo)
    dist.destroy_process_group(solo)
    decode = _slowest(decode, run.device)
    compute_s = steps["none"]
    # a step's codec time: what the option adds to the plain step, plus, for the options
    # that all-gather, one more payload to decode per further rank
    codec = {o: max(0.0, steps[o] - compute_s) + (world - 1) * decode[o] for o in options}
    codec["none"] = 0.0
    probe = Probe(
        world=world,
        device=str(run.device),
        model=cfg.model,
        batch_per_rank=batch,
        compute_s=compute_s,
        codec_s=codec,
        links=links,
        points=points,
        buckets=layout,
    )
    if world > 1:  # every rank derives the same messages from the same layout
        probe.ddp_step_s = _time_ddp(model, data, cfg, run, batch)
        timed = _time_staged("pipeline", model, data, cfg, run)
        if timed is not None:
            probe.pipeline_step_s, probe.pipeline_sizes, probe.pipeline_rows = timed
        timed = _time_staged("model-parallel", model, data, cfg, run)
        if timed is not None:
            probe.chain_step_s, probe.chain_sizes, probe.chain_rows = timed
        cost = CostModel(probe)
        probe.message_s = _time_messages([m for o in options for m in cost.messages(o)], run.device)
    return probe


def format_probe(probe: Probe) -> str:
    """A short table of the probe's fits and device times."""
    lines = [
        f"probe: {probe.world} worker(s) on {probe.device}, {probe.model}, {probe.batch_per_rank} rows per worker"
    ]
    lines.append(
        f"{'collective':<16}{'latency':>12}{'bandwidth':>16}   measured (per-rank payload: time)"
    )
    for kind, fit in probe.links.items():
        pts = ", ".join(
            f"{format_bytes(n)}: {t * 1e3:.3g} ms" for n, t in probe.points.get(kind, [])
        )
        lines.append(
            f"{kind:<16}{fit.alpha_s * 1e6:>9.0f} us{fit.gbit_per_s:>11.3g} Gbit/s   {pts}"
        )
    if probe.message_s:
        lines.append(f"messages timed at their own sizes: {len(probe.message_s)}")
    lines.append(f"compute per step: {probe.compute_s * 1e3:.2f} ms")
    codec = ", ".join(f"{o} {s * 1e3:.2f} ms" for o, s in probe.codec_s.items() if o != "none")
    lines.append(f"encode/decode per step: {codec}")
    return "\n".join(lines)
