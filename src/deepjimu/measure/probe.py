"""Measure the link and this device: collective times fitted to latency + bytes / bandwidth, compute and codec time per step.

The probe is collective: every rank of the run's group calls :func:`measure`. It times

- ``all_reduce`` of float32, float16 and bfloat16 tensors and ``all_gather`` (bytes) over
  the real group, and a blocking send from rank 0 to rank 1 (``p2p``, what the
  model-parallel strategies hand on; for the planning layer), for payloads of 4 KB,
  16 KB, ... 64 MB per rank (a size is measured only
  while the previous one took under ``max_op_s``: on a slow link the small sizes already
  fix the fit, :mod:`deepjimu.measure.links`), and fits t(n) = alpha + beta n to each
(:func:`~deepjimu.cost.probe.fit_alpha_beta`). A
  reduction's time depends on its dtype, not only on its bytes: gloo adds 16-bit floats
  one element at a time through float32, and on the 2-core VM over loopback 6 MB took
  4.7 ms as float32, 6.2 ms as bfloat16 and 8.5 ms as float16, a difference that decides
  between fp16 and bf16 on a fast link (BENCHMARKS.md section 6);
- with more than one rank, each all-gather the probed options make, at its own size (from
  DDP's bucket layout), because all-gather's speed can jump with the payload in a way the
  fit cannot follow (:func:`~deepjimu.measure.links.time_messages`);
- training steps of the run's model on a batch of ``batch_size / world`` rows on this
  device, under DDP over a group of this rank alone (so there is no communication), with
  each compressor in turn: the plain step is the compute time, the difference is the
  compressor's encode/decode time; for compressors that all-gather, each further rank
  adds the decode time of one more payload. The ranks start each timed step together and
  a step counts at its slowest rank's time, as a synchronous step does: ranks that share a
  machine then compete for its cores as in training (on the 2-core VM this raised the
  compute estimate of mlp:1024x4 from 34 to 41 ms and brought the prediction of plain ddp
  within 5% of the measured step on loopback, from 16% below);
- with more than one rank, the own training step of every strategy whose registry entry
  says ``probed`` (:meth:`~deepjimu.strategies.base.Strategy.probe_step`), set up on a copy
  of the model and timed back to back as training runs it (:func:`strategy_step_s`), from
  which the planning layer solves the runtime costs its predictors need.

Every figure is the slowest rank's, so that all ranks hold the same probe and the cost
model (:mod:`deepjimu.cost.compress`) makes the same choice on each. The probe also records
DDP's bucket layout (the gradient shapes of each bucket), from which the cost model derives
every option's messages.
"""

from __future__ import annotations

import copy
import statistics
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from deepjimu.comm import Comm, CommStats
from deepjimu.compress.hooks import comm_hook
from deepjimu.cost.compress import PROBED, CostModel
from deepjimu.cost.probe import Probe, TimedStep, fit_alpha_beta
from deepjimu.counters import Counters
from deepjimu.data import DataSplits
from deepjimu.measure.links import measure_links, time_messages
from deepjimu.measure.timing import slowest, timed_s
from deepjimu.options import DdpOptions
from deepjimu.options.compress import parse_compress
from deepjimu.run import Run
from deepjimu.strategies.base import GradientStrategy, make_optimizer
from deepjimu.strategies.registry import ENTRIES

__all__ = ["measure", "strategy_step_s"]


def strategy_step_s(
    strategy: GradientStrategy,
    model: nn.Sequential,
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
        times.append(
            timed_s(lambda: [strategy.train_step(x, y) for _ in range(steps)], run.device) / steps
        )
    return slowest([statistics.median(times)], run.device)[0]


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
) -> tuple[dict[str, float], dict[str, float], list[list[list[int]]], list[float]]:
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
        time per step, DDP's bucket layout, and the first option's step of each round (the
        slowest rank's), whose spread says how noisy the medians are.
    """
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

            def step(ddp: nn.Module = ddp, opt: torch.optim.Optimizer = opt) -> None:
                opt.zero_grad(set_to_none=True)
                with run.autocast():
                    loss = F.cross_entropy(ddp(x), y)
                loss.backward()
                opt.step()

            times[option].append(timed_s(step, run.device))
            decodes[option].append(state.decode_s - decoded)
    state = setups[options[0]][1]
    layout = [[list(s) for s in state.layout[i]] for i in sorted(state.layout)]
    # a synchronous DDP step waits for its slowest rank: each step's time is the maximum
    # over the ranks (they started it together), then the median over the rounds
    per_step = torch.tensor(
        [t[warm:] for t in times.values()], dtype=torch.float64, device=run.device
    )
    dist.all_reduce(per_step, op=dist.ReduceOp.MAX)
    by_round = per_step.tolist()
    medians = {o: statistics.median(row) for o, row in zip(times, by_round, strict=True)}
    # the median, not the mean: a memory-bound decode that shares the cores with the other
    # rank's backward pass has rare slow steps (QSGD's: 46 to 273 ms), which a mean over the
    # rounds let into the prediction (+44% to +78%, BENCHMARKS.md section 6)
    decode = {o: statistics.median(d[warm:]) for o, d in decodes.items()}
    return medians, decode, layout, by_round[0]


def measure(
    model: nn.Sequential, data: DataSplits, cfg: DdpOptions, run: Run, max_op_s: float = 0.25
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
    world = run.world
    batch = max(1, cfg.batch_size // world)
    x, y = data.train_x[:batch].to(run.device), data.train_y[:batch].to(run.device)
    points = measure_links(run.device, max_op_s)
    links = {k: fit_alpha_beta([n for n, _ in v], [t for _, t in v]) for k, v in points.items()}
    wanted = str(parse_compress(cfg.compress))  # the run's own option, if not a candidate
    extra = [wanted] if wanted not in ("auto", *PROBED) else []
    options = ["none", *(o for o in [*PROBED, *extra] if o != "none")]
    solo, _ = dist.new_subgroups(group_size=1)
    steps, decode, layout, plain = _time_options(options, model, x, y, cfg, run, solo)
    dist.destroy_process_group(solo)
    decode = dict(zip(decode, slowest(list(decode.values()), run.device), strict=True))
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
        compute_rounds_s=plain,
    )
    if world > 1:  # every rank derives the same messages from the same layout
        probe.steps = _time_strategies(model, data, cfg, run, batch)
        cost = CostModel(probe)
        probe.message_s = time_messages([m for o in options for m in cost.messages(o)], run.device)
    return probe


def _time_strategies(
    model: nn.Sequential, data: DataSplits, cfg: DdpOptions, run: Run, rows: int, **timing: int
) -> dict[str, TimedStep]:
    """Collective: the own step of every strategy whose registry entry says ``probed``
    (:meth:`~deepjimu.strategies.base.Strategy.probe_step`) over the group's ranks, in
    registry order, where it runs on this group (``timing``: :func:`strategy_step_s`'s
    rounds and steps)."""
    n_blocks = len(model) if isinstance(model, nn.Sequential) else 0
    out = {}
    for entry in ENTRIES:
        hook = (
            entry.load().probe_step(cfg, run.world, data, n_blocks, rows) if entry.probed else None
        )
        if hook is not None:
            step_s = strategy_step_s(hook.strategy, model, data, run, hook.rows, **timing)
            sizes, micro_rows, microbatches = hook.record()
            out[entry.name] = TimedStep(step_s, sizes, micro_rows, microbatches)
    return out
