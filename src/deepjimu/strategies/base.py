"""The Strategy interface, and the epoch loop shared by the gradient-based strategies."""

from __future__ import annotations

import dataclasses
import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from deepjimu.balance import SPEED_BALANCES, shard_counts
from deepjimu.choices import Optimizer
from deepjimu.comm import Comm
from deepjimu.data import DataSplits, GraphData, epoch_seed
from deepjimu.defaults import DEFAULT_LR
from deepjimu.errors import JimuError
from deepjimu.kfac.optimizer import KFAC
from deepjimu.kfac.preconditioner import KFACSettings
from deepjimu.models.parts import Place, keeping
from deepjimu.options import DdpOptions, GradientOptions, KfacGroup, OptimGroup, RunGroup, narrow
from deepjimu.run import Run
from deepjimu.strategies.registry import entry
from deepjimu.strategies.schedule import attach_schedule

__all__ = [
    "DataParallel",
    "FitResult",
    "GradientStrategy",
    "ProbeStep",
    "Strategy",
    "accuracies",
    "count_correct",
    "epoch_order",
    "log_grid",
    "make_optimizer",
    "node_accuracies",
    "probed_options",
    "split_steps",
]


@dataclass
class ProbeStep:
    """How the probe times a strategy's own step (:meth:`Strategy.probe_step`): the
    strategy, not yet set up; once it is set up, the rows of the timed batch (``rows()``)
    and what the probe's record keeps of it (``record()``: its stage sizes, the rows of a
    micro-batch and the micro-batches per step, :class:`~deepjimu.cost.probe.TimedStep`)."""

    strategy: GradientStrategy
    rows: Callable[[], int]
    record: Callable[[], tuple[list[int], int, int]]


def probed_options(cfg: DdpOptions, name: str, world: int) -> dict[str, Any]:
    """The gradient options of the probed run ``cfg``, for strategy ``name`` on ``world``
    ranks (quiet: the probe prints nothing of the strategies it times)."""
    own = {f.name: getattr(cfg, f.name) for f in dataclasses.fields(GradientOptions)}
    return {**own, "strategy": name, "workers": world, "quiet": True}


@dataclass
class FitResult:
    """What ``fit`` reports back: progress counters and strategy-specific figures."""

    epochs: int
    steps: int
    extra: dict[str, Any] = field(default_factory=dict)


class Strategy(ABC):
    """One way of training an ``nn.Sequential`` over ``run.world`` workers.

    A strategy trains ``model`` in place: when :meth:`fit` returns, rank 0's ``model``
    holds the trained weights (strategies that split the model gather it there), so
    evaluation, reports and checkpoints are the engine's, not the strategy's.

    What the engine needs to know of a strategy before it runs (its traits: workers,
    epochs, whether it splits the model or shards the data, its precisions) and the
    option groups it takes are its registry entry's
    (:mod:`deepjimu.strategies.registry`, found by :attr:`name`); the strategy is handed
    only its groups' options (``self.cfg``), and its class hooks (:meth:`problems`,
    :meth:`tune_space`, :meth:`probe_step`) are called with them.
    """

    name: ClassVar[str]
    cfg: RunGroup

    def __init__(self, cfg: RunGroup) -> None:
        self.cfg = narrow(cfg, entry(self.name).options)

    @classmethod
    def problems(cls, cfg: Any, n_blocks: int) -> list[str]:
        """Strategy-specific config problems, one line each (checked before workers start,
        on a config whose defaults are resolved: ``cfg.workers`` is set)."""
        return []

    @classmethod
    def probe_step(
        cls, cfg: DdpOptions, world: int, data: DataSplits, n_blocks: int, rows: int
    ) -> ProbeStep | None:
        """What the probe times of this strategy on ``world`` ranks (its entry says
        ``probed``): the strategy made from the probed run's options ``cfg`` (ddp's, whose
        ``--compress auto`` and ``jimu probe`` it serves), on a model of ``n_blocks`` blocks
        (0: not a Sequential), ``rows`` the probe's own rows per rank; None where it does
        not run there."""
        return None

    @classmethod
    def model_blocks(cls, model: nn.Sequential) -> int:
        """How many blocks the strategy cuts ``model``, a Python factory's, into (checked
        before workers start, as a spec's ``count_blocks``; default: its children).

        Raises:
            JimuError: a model the strategy cannot train, in one line naming the module.
        """
        return len(model)

    def data_device(self, device: torch.device) -> torch.device:
        """Where the engine puts the data splits (default: the compute device)."""
        return device

    def own_blocks(self, model: nn.Sequential, data: DataSplits, run: Run) -> set[int] | None:
        """Collective: the blocks of ``model`` (its shapes: every block on the meta device)
        this rank holds, where the strategy splits the model: the worker then builds those
        alone, each as the whole model would have (default None: the whole model)."""
        return None

    def placer(self, model: nn.Sequential, data: DataSplits, run: Run) -> Place:
        """Collective: what this rank does with each block of ``model`` (its shapes: every
        block on the meta device) as the worker builds it, where the strategy builds in parts
        (``registry.builds_in_parts``; default: keeps its :meth:`own_blocks`, frees the
        others; a sharding strategy loads each into its shards)."""
        own = self.own_blocks(model, data, run)
        return None if own is None else keeping(own)

    @classmethod
    def tune_space(cls, cfg: Any, trials: int) -> list[dict[str, Any]]:
        """``trials`` settings to try for ``jimu bench --tune``, the strategy's default first.

        Every strategy gets the same number of trials; the bench keeps the setting with the
        best validation accuracy. Default: nothing to tune (one trial, the defaults).
        """
        return [{}]

    @abstractmethod
    def fit(self, model: nn.Sequential, data: DataSplits, run: Run) -> FitResult:
        """Train ``model`` on ``data``; log events and checkpoints through ``run``."""


def log_grid(center: float, trials: int, span: float = 10.0) -> list[float]:
    """``trials`` values from ``center / span`` to ``center * span``, evenly spaced in log.

    Ordered by distance from ``center`` (``center`` first when ``trials`` is odd), so that
    ties in a search go to the value nearest the default.

    Example:
        >>> [round(v, 4) for v in log_grid(1e-3, 5)]
        [0.001, 0.0003, 0.0032, 0.0001, 0.01]
    """
    if trials < 1:
        raise ValueError(f"trials must be >= 1 (trials: {trials})")
    if trials == 1:
        return [center]
    exps = [-1 + 2 * i / (trials - 1) for i in range(trials)]
    exps.sort(key=lambda e: (abs(e), e))
    return [center * span**e for e in exps]


def make_optimizer(
    params: Any,
    cfg: OptimGroup,
    model: nn.Module | None = None,
    comm: Comm | None = None,
    speeds: Sequence[float] | None = None,
    foreach: bool | None = None,
) -> torch.optim.Optimizer:
    """The optimizer of ``cfg`` (Adam, SGD with momentum, or K-FAC-preconditioned SGD) over ``params``.

    ``foreach``: torch's multi-tensor kernels (None: torch's choice, on a GPU), which need
    every parameter of a group of one kind (all DTensors or none).

    ``kfac`` also needs its options (``cfg`` holds them: a strategy that takes the K-FAC
    group), the ``model`` whose layers it hooks and this rank's ``comm`` (its messages are
    collective over the ranks that hold replicas of ``model``), and assigns its
    decompositions by the ranks' ``speeds`` where given (``--balance speed``).
    """
    assert cfg.lr is not None, "config not resolved"
    opt: torch.optim.Optimizer
    if cfg.optimizer == Optimizer.KFAC:
        assert model is not None, "kfac needs the model"
        assert isinstance(cfg, KfacGroup), "kfac needs its options"
        settings = KFACSettings.from_config(cfg)
        if speeds is not None:
            settings = dataclasses.replace(settings, speeds=tuple(speeds))
        opt = KFAC(params, model, cfg.lr, cfg.momentum, cfg.weight_decay, settings, comm)
    elif cfg.optimizer == Optimizer.ADAM:
        opt = torch.optim.Adam(params, lr=cfg.lr, weight_decay=cfg.weight_decay, foreach=foreach)
    else:
        opt = torch.optim.SGD(
            params,
            lr=cfg.lr,
            momentum=cfg.momentum,
            weight_decay=cfg.weight_decay,
            foreach=foreach,
        )
    if cfg.optimizer != Optimizer.SGD or cfg.momentum or cfg.weight_decay:
        # only SGD without momentum or decay takes sparse gradients (an embed model's) as
        # they are: Adam refuses them, and SGD's momentum buffer of sparse gradients is
        # never coalesced (30 steps of 1,024 ids left 30,682 entries in it, and training
        # slowed 13x in 3 epochs); these optimizers update every row each step anyway, so a
        # dense gradient costs them nothing more
        opt.register_step_pre_hook(_dense_grads)
    return opt


def _dense_grads(opt: torch.optim.Optimizer, *_: Any) -> None:
    for group in opt.param_groups:
        for p in group["params"]:
            if p.grad is not None and p.grad.is_sparse:
                p.grad = p.grad.to_dense()


def epoch_order(n: int, seed: int, epoch: int) -> Tensor:
    """The shuffled sample order of ``epoch``: a function of (seed, epoch) only, so resume is exact."""
    return torch.randperm(n, generator=torch.Generator().manual_seed(epoch_seed(seed, epoch)))


def split_steps(order: Tensor, steps: int) -> list[Tensor]:
    """``order`` cut into ``steps`` nearly equal consecutive batches."""
    return list(torch.tensor_split(order, steps))


@torch.no_grad()
def count_correct(
    model: nn.Module, x: Tensor, y: Tensor, batch: int = 4096, chunks: int | None = None
) -> tuple[int, float, int]:
    """Correct predictions, summed cross-entropy and count of ``model`` on ``(x, y)``, in
    batches of ``batch`` rows, or in exactly ``chunks`` nearly equal ones (some maybe
    empty: a sharded model's ranks must run as many forwards as each other). A sequence's
    targets (a language model's) count each token."""
    was_training = model.training
    model.eval()
    correct, loss = 0, 0.0
    if chunks is None:
        xs, ys = x.split(batch), y.split(batch)
    else:
        xs, ys = x.tensor_split(chunks), y.tensor_split(chunks)
    for xb, yb in zip(xs, ys, strict=True):
        out = model(xb)
        correct += int((out.argmax(1) == yb).sum())
        loss += float(F.cross_entropy(out, yb, reduction="sum"))
    model.train(was_training)
    return correct, loss, y.numel()


def accuracies(
    model: nn.Module,
    data: DataSplits,
    splits: tuple[str, ...],
    device: torch.device | None = None,
) -> dict[str, float | None]:
    """``<split>_acc`` of ``model`` for each named split that has samples, and the
    validation split's mean cross-entropy ``val_loss`` (a language model's figure).

    A graph model (``data.graph`` is set) is run once over the whole graph and scored on
    each split's nodes. With ``device`` the data is moved there split by split.
    """
    if data.graph is not None:
        return node_accuracies(
            model, data.graph if device is None else data.graph.to(device), splits
        )
    out: dict[str, float | None] = {}
    for split in splits:
        x, y = data.eval_split(split)
        if len(y):
            if device is not None:
                x, y = x.to(device), y.to(device)
            correct, loss, n = count_correct(model, x, y)
            out[f"{split}_acc"] = correct / n
            if split == "val":
                out["val_loss"] = loss / n
    return out


@torch.no_grad()
def node_accuracies(
    model: nn.Module, graph: GraphData, splits: tuple[str, ...]
) -> dict[str, float | None]:
    """``<split>_acc`` of a graph model: one forward over all nodes, scored per split's nodes."""
    was_training = model.training
    model.eval()
    pred = model(graph.x, graph.adj).argmax(1)
    model.train(was_training)
    out: dict[str, float | None] = {}
    for split in splits:
        idx = getattr(graph, f"{split}_idx")
        if len(idx):
            out[f"{split}_acc"] = int((pred[idx] == graph.y[idx]).sum()) / len(idx)
    return out


class GradientStrategy(Strategy):
    """Mini-batch backprop training: one epoch loop for local, ddp, model-parallel, pipeline.

    Subclasses say how one step runs (:meth:`train_step`), which samples this rank sees
    (:meth:`batches`), how accuracy is measured (:meth:`evaluate`) and what per-rank state
    a checkpoint holds; the loop, logging, divergence check and checkpoints live here.
    """

    cfg: GradientOptions

    @classmethod
    def tune_space(cls, cfg: GradientOptions, trials: int) -> list[dict[str, Any]]:
        """The learning rate on a log grid over 0.1x..10x the optimizer's default."""
        center = cfg.lr if cfg.lr is not None else DEFAULT_LR[cfg.optimizer]
        return [{"lr": lr} for lr in log_grid(center, trials)]

    def setup(self, model: nn.Sequential, data: DataSplits, run: Run) -> None:
        """Keep ``run``, prepare modules and optimizer (default: whole model on this rank)."""
        self.run = run
        self.model = model.to(run.device)
        self.optimizer = make_optimizer(self.model.parameters(), self.cfg, self.model, run.comm)

    def steps_per_epoch(self, data: DataSplits) -> int:
        return max(1, math.ceil(data.train_size / self.cfg.batch_size))

    def batches(self, data: DataSplits, epoch: int, run: Run) -> list[tuple[Tensor, Tensor]]:
        """This rank's (x, y) batches of ``epoch``: its rows (all, or its shard), shuffled;
        of a token stream, as many windows drawn at random starts (:meth:`DataSplits.windows`).

        The step count comes from the global ``train_size``, so every rank of a sharded
        strategy takes the same number of steps (DDP's all-reduces must pair up).
        """
        if data.stream is not None:  # text: windows at random starts, as nanoGPT draws them
            return data.windows(self.cfg.seed, epoch, self.steps_per_epoch(data))
        order = epoch_order(len(data.train_y), self.cfg.seed, epoch).to(data.train_x.device)
        return [
            (data.train_x[i], data.train_y[i])
            for i in split_steps(order, self.steps_per_epoch(data))
        ]

    @abstractmethod
    def train_step(self, x: Tensor, y: Tensor) -> Tensor | None:
        """One optimisation step; returns the batch loss where this rank knows it."""

    def evaluate(self, data: DataSplits, run: Run) -> dict[str, float | None]:
        """Accuracies of the current model (default: rank 0 runs the whole model)."""
        return accuracies(self.model, data, ("train", "val", "test")) if run.is_main else {}

    def rank_state(self) -> dict[str, Any]:
        """This rank's state for a checkpoint besides the model (default: the optimizer)."""
        return {"optimizer": self.optimizer.state_dict()}

    def load_rank_state(self, state: dict[str, Any]) -> None:
        self.optimizer.load_state_dict(state["optimizer"])

    def full_model(self, run: Run) -> nn.Module | None:
        """Collective: the model this rank checkpoints, its entries not on the meta device
        (default: rank 0's whole model, the others' copies being the same)."""
        return self.model if run.is_main else None

    def epochs_of(self, data: DataSplits) -> int:
        """The run's epochs: ``--epochs``, or with ``--steps`` as many as its steps need
        (the last one cut short)."""
        assert self.cfg.epochs is not None, "config not resolved"
        if self.cfg.steps is None:
            return self.cfg.epochs
        return math.ceil(self.cfg.steps / self.steps_per_epoch(data))

    def total_steps(self, data: DataSplits) -> int:
        """The run's optimizer steps: ``--steps``, or its epochs' steps."""
        return self.cfg.steps or self.epochs_of(data) * self.steps_per_epoch(data)

    def fit(self, model: nn.Sequential, data: DataSplits, run: Run) -> FitResult:
        cfg = self.cfg
        epochs = self.epochs_of(data)
        self.setup(model, data, run)
        if getattr(self, "optimizer", None) is not None:  # a stage without parameters has none
            attach_schedule(self.optimizer, cfg, self.total_steps(data))
        start, step, samples = 0, 0, 0  # samples: trained on since the last event
        if run.resumed is not None:
            self.load_rank_state(run.resumed.rank_state)
            start, step = run.resumed.epoch, run.resumed.step
            samples = run.resumed.extra.get("samples", 0)
        # the ranks start training together: what one rank still sets up (another's
        # balance profiling, building its stages) is set-up, not the first step's training
        run.barrier()
        run.progress(epochs, self.name)
        run.progress_at(start)
        for epoch in range(start, epochs):
            batches = self.batches(data, epoch, run)
            whole = len(batches)
            if cfg.steps is not None:
                batches = batches[: max(0, cfg.steps - step)]
            losses: list[Tensor] = []
            with run.training():
                for x, y in batches:
                    loss = self.train_step(x, y)
                    if loss is not None:
                        losses.append(loss.detach())
            step += len(batches)
            samples += round(data.train_size * len(batches) / whole)
            done = epoch + 1
            if done % cfg.eval_every == 0 or done == epochs:
                mean_loss = float(torch.stack(losses).mean()) if losses else None
                with run.evaluation():
                    metrics = self.evaluate(data, run)
                event = run.log(step, done, samples=samples, loss=mean_loss, **metrics)
                samples = 0
                if event["loss"] is not None and not math.isfinite(float(event["loss"])):
                    raise JimuError(
                        f"training diverged at epoch {done}: loss is {event['loss']}; "
                        f"lower --lr (lr: {cfg.lr}); last good checkpoint: {run.last_checkpoint_text()}"
                    )
            if cfg.checkpoint_every and done % cfg.checkpoint_every == 0 and done < epochs:
                run.save_checkpoint(
                    step, done, self.full_model(run), self.rank_state(), {"samples": samples}
                )
        run.close()
        run.save_checkpoint(step, epochs, self.full_model(run), self.rank_state())
        return FitResult(epochs=epochs, steps=step)


class DataParallel(GradientStrategy):
    """A gradient strategy whose ranks each train on their shard of every batch, the gradients
    averaged over the ranks (``ddp``'s all-reduce, ``fsdp``'s reduce-scatter).

    ``--batch-size`` is the global batch: every step, each rank takes about
    ``batch_size / world`` of its shard (the worker's ``data.shard``, even or by the
    ranks' speeds), so the hyper-parameters mean what they mean for ``local``.
    """

    @classmethod
    def balance_problems(cls, balance: str) -> list[str]:
        """The one-line problem of a ``--balance`` that does not split rows (a list of
        blocks, ``time``, ``size``: a split model's)."""
        if balance in (*SPEED_BALANCES, "even"):
            return []
        return [
            f"{cls.name} splits each batch over the workers: --balance auto, even or speed "
            f"(balance: {balance})"
        ]

    def setup_shards(self, data: DataSplits, run: Run) -> None:
        """Every rank's shard size, as the worker's ``data.shard`` cut it, so that each rank
        knows the whole batch of every step."""
        self._shards = shard_counts(data.train_size, run.world, run.speeds)
        self._scales: list[float] = []

    def batches(self, data: DataSplits, epoch: int, run: Run) -> list[tuple[Tensor, Tensor]]:
        """This rank's batches, and the weight of each one's mean loss: the ranks' gradients
        are averaged, so a rank whose batch holds b of the step's B rows weighs its mean loss
        by world * b / B, and the average is the gradient of the whole batch's mean loss,
        shards even or not (speed-balanced shards differ)."""
        out = super().batches(data, epoch, run)
        steps = len(out)

        def rows(n: int, i: int) -> int:  # the i-th of torch.tensor_split(n rows, steps)
            return n // steps + (i < n % steps)

        self._scales = [
            run.world * len(y) / sum(rows(n, i) for n in self._shards)
            for i, (_, y) in enumerate(out)
        ]
        self._scales.reverse()  # popped in step order
        return out

    def next_scale(self) -> float:
        """The weight of this step's mean loss (:meth:`batches`; 1 outside an epoch)."""
        return self._scales.pop() if self._scales else 1.0

    def step_rows(self, data: DataSplits) -> int:
        """The most batch rows any rank takes in one step (the i-th of torch.tensor_split
        of its shard into the epoch's steps)."""
        steps = self.steps_per_epoch(data)
        return max(math.ceil(n / steps) for n in self._shards)
