"""``ddp``: data parallel with torch DistributedDataParallel; compression and local SGD in its comm hook, or a per-tensor sync plan."""

import dataclasses
import json
import math
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.parallel import DistributedDataParallel

from deepjimu.atomic import atomic_write_text
from deepjimu.comm import Comm, CommStats
from deepjimu.compress.base import HookState
from deepjimu.compress.hooks import Averaging, LocalSGDState, comm_hook, local_sgd_hook
from deepjimu.compress.sync import SyncExecutor
from deepjimu.cost.compress import CostModel, save_choice
from deepjimu.cost.sync import SyncTrial, format_plan, plan_to_dict
from deepjimu.data import DataSplits
from deepjimu.errors import JimuError, one_line
from deepjimu.models import parse_spec
from deepjimu.options import DdpOptions
from deepjimu.options.compress import CompressSpec, parse_compress
from deepjimu.run import Run
from deepjimu.strategies.base import (
    DataParallel,
    FitResult,
    ProbeStep,
    accuracies,
    count_correct,
    make_optimizer,
)

__all__ = ["DDPStrategy"]


class DDPStrategy(DataParallel):
    """Each rank trains a replica on its shard (rows ``rank::world``); gradients are averaged.

    ``--batch-size`` is the global batch: every step, each rank takes about
    ``batch_size / world`` of its shard, so the hyper-parameters mean what they mean for
    ``local``. The gradients go through a comm hook (:mod:`deepjimu.compress.hooks`) that
    counts every payload: plain all-reduce, a ``--compress`` option (``auto``: chosen by the
    cost model from a probe of the link at the start), or local SGD (``--local-sgd H``:
    no gradient all-reduce after the warm-up; the models are averaged every H steps, before
    every checkpoint and at the end). ``--sync-plan`` other than allreduce replaces DDP by
    a per-tensor plan (:mod:`deepjimu.compress.sync`: sharded parameter server, sufficient
    factors, sparse rows, or each tensor's fastest predicted method, which is kept only if
    it beats DDP stepped beside it in these processes), printed at the start and saved as
    ``sync_plan.json``.

    Events carry ``step_s``, the mean time of the interval's steps past the warm-up, and
    with ``auto`` the cost model's ``predicted_step_s``.
    """

    name = "ddp"
    cfg: DdpOptions

    @classmethod
    def probe_step(
        cls, cfg: DdpOptions, world: int, data: DataSplits, n_blocks: int, rows: int
    ) -> ProbeStep | None:
        """A plain ddp step over the probed ranks, its all-reduce included, on the probe's
        own ``rows`` a rank (so that it compares with the probe's step without
        communication): no compressor, local SGD or sync plan, the run's optimizer. From it
        the planner measures what a step's all-reduce costs beyond its fitted time."""
        plain = dataclasses.replace(
            cfg, strategy=cls.name, workers=world, quiet=True, compress="none", local_sgd=0,
            sync_plan="allreduce",
        )  # fmt: skip
        return ProbeStep(cls(plain), lambda: rows, lambda: ([], rows, 1))

    @classmethod
    def problems(cls, cfg: DdpOptions, n_blocks: int) -> list[str]:
        w = cfg.workers
        assert w is not None, "defaults not resolved"
        if cfg.batch_size < w:
            return [
                f"batch-size must be >= workers for ddp (batch-size: {cfg.batch_size}, workers: {w})"
            ]
        if cfg.sync_plan == "sparse" and parse_spec(cfg.model).kind not in ("embed", "factory"):
            return [
                f"sync-plan sparse sends the touched rows of sparse embedding gradients; model "
                f"{cfg.model} has none (use --model embed:VOCAB:DIM, or another --sync-plan)"
            ]
        return cls.balance_problems(str(cfg.balance))

    def setup(self, model: nn.Sequential, data: DataSplits, run: Run) -> None:
        cfg = self.cfg
        self.run = run
        self.model = model.to(run.device)
        self.setup_shards(data, run)
        # warm-up default: a tenth of the run, at least the 2 steps DDP needs to settle its buckets
        tenth = max(2, math.ceil(self.total_steps(data) / 10))
        self.spec = parse_compress(cfg.compress)
        self.predictions: dict[str, float] = {}
        self.averaging: Averaging | None = None
        self.sync: SyncExecutor | None = None
        self.sync_methods: dict[str, str] = {}  # each tensor's method under a sync plan
        self.ddp: nn.Module
        self.hook: HookState | SyncExecutor
        self.trial: SyncTrial | None = None
        # config: no compressor, local SGD or K-FAC with a sync plan; one worker has nothing
        # to synchronise (and no link to probe), so it keeps DDP's path
        if cfg.sync_plan != "allreduce" and run.world > 1:
            self.sync = self._plan_sync(data, run)  # None: auto's plan lost to DDP
        if self.sync is not None:
            self.hook = self.sync
            self.ddp = self.model  # the executor's hooks are on the model's parameters
        elif self.trial is None:  # (a trial wrapped the model in DDP already)
            self._wrap(data, run, tenth)
        self.optimizer = make_optimizer(
            self.ddp.parameters(), cfg, self.model, run.comm, speeds=run.speeds
        )
        self._steps = [0.0, 0]  # steps past the warm-up since the last event: seconds, count
        self._all_steps = [0.0, 0]  # the same over the run

    @property
    def kept_ddp(self) -> bool:
        """Whether a sync plan lost to DDP (in its trial, or in the run this one resumes)."""
        return self.cfg.sync_plan != "allreduce" and self.run.world > 1 and self.sync is None

    def _wrap(self, data: DataSplits, run: Run, tenth: int) -> None:
        """Wrap the model in torch's DDP, with the comm hook of ``--compress`` (``auto``:
        chosen by the cost model first) or of local SGD; ``tenth``: a tenth of the run's
        steps, the warm-up that neither sets."""
        cfg = self.cfg
        ids = [run.device.index] if run.device.type == "cuda" else None
        ddp = self.ddp = DistributedDataParallel(self.model, device_ids=ids)
        if self.spec.kind == "auto":
            self.spec = self._choose(data, run)
        if cfg.local_sgd:
            warmup = cfg.local_sgd_warmup if cfg.local_sgd_warmup is not None else tenth
            self.hook = LocalSGDState(run.comm, warmup)
            ddp.register_comm_hook(self.hook, local_sgd_hook)
            self.averaging = Averaging(run.comm, cfg.local_sgd, warmup)
        else:
            self.hook, hook = comm_hook(
                self.spec,
                run.comm,
                cfg.compress_start if cfg.compress_start is not None else tenth,
                run.device,
                error_feedback=cfg.error_feedback,
                warm_start=cfg.warm_start,
                seed=cfg.seed,
            )
            ddp.register_comm_hook(self.hook, hook)

    def _choose(self, data: DataSplits, run: Run) -> CompressSpec:
        """Collective: probe the link and this device (the run's measurer), and let the cost
        model pick the option."""
        probe = run.measurer.probe(self.model, data, self.cfg, run)
        model = CostModel(probe)
        choice, predictions = model.choose()
        self.predictions = {p.option: p.step_s for p in predictions}
        if run.is_main:
            print(save_choice(probe, choice, predictions, run.out_dir / "probe.json"), flush=True)
        return parse_compress(choice)

    def _plan_sync(self, data: DataSplits, run: Run) -> SyncExecutor | None:
        """Collective: measure and plan (``--sync-plan``, the run's measurer), print and save
        the plan; its executor. ``auto``'s plan must then beat torch's DDP, stepped beside it
        in these processes (:meth:`_hold_to_ddp`); where it does not, None: the run keeps
        DDP. A resumed run keeps what its run folder holds: planned again, a plan measured
        on a noisy machine could differ, and the run would change its method halfway."""
        kept = self._kept_plan(run)
        if isinstance(kept, SyncExecutor):
            return kept
        if kept is False:
            if run.is_main and not self.cfg.quiet:
                print("sync plan: DDP kept, as the run it resumes kept it", flush=True)
            return None
        rows = self.step_rows(data)
        # this rank's first rows, in batches of a step's size: what the plan measures
        batches = [
            (data.train_x[i : i + rows], data.train_y[i : i + rows])
            for i in range(0, min(len(data.train_y), 3 * rows), rows)
        ]
        plan = run.measurer.sync_plan(self.model, batches, rows, self.cfg.sync_plan, run)
        self.sync_plan = plan
        executor = self._executor([(e.name, e.method, e.rows) for e in plan.entries], run)
        if self.cfg.sync_plan == "auto":
            self.trial = self._hold_to_ddp(executor, batches, data, run)
        out = {**plan_to_dict(plan.entries, self.cfg.sync_plan, run.world), "links": plan.links}
        if self.trial is not None:
            out["trial"] = self.trial.to_dict()
        if run.is_main:
            atomic_write_text(run.out_dir / "sync_plan.json", json.dumps(out, indent=2))
            if not self.cfg.quiet:
                print(format_plan(plan.entries, self.cfg.sync_plan), flush=True)
                if self.trial is not None:
                    print(_trial_line(self.trial), flush=True)
        if self.trial is not None and not self.trial.keeps_plan:
            executor.close()
            return None
        return executor

    def _hold_to_ddp(
        self, executor: SyncExecutor, batches: list[tuple[Tensor, Tensor]], data: DataSplits,
        run: Run,
    ) -> SyncTrial:  # fmt: skip
        """Collective: ``executor``'s plan and torch's DDP as this run would wrap the model
        (:meth:`_wrap`), stepped alternately on ``batches`` (the run's measurer); neither's
        messages are counted as the run's. DDP stays wrapped, for the run if it wins."""
        self._wrap(data, run, tenth=0)
        hook = self.hook
        assert isinstance(hook, HookState), "a sync plan runs without a compressor or local SGD"
        hook.comm = executor.comm = Comm(CommStats())  # the trial's messages: not training's
        try:
            trial = run.measurer.sync_trial(self.model, self.ddp, executor, batches, run)
        finally:
            hook.comm = executor.comm = run.comm
        executor.iter = hook.iter = 0
        return trial

    def _executor(self, tensors: list[tuple[str, str, float]], run: Run) -> SyncExecutor:
        """The executor of a plan's (tensor, method, rows); the methods go into the summary."""
        methods = {name: method for name, method, _ in tensors}
        factor_rows = {name: math.ceil(rows) for name, method, rows in tensors if method == "sfb"}
        self.sync_methods = methods
        return SyncExecutor(self.model, methods, run.comm, factor_rows)

    def _kept_plan(self, run: Run) -> SyncExecutor | bool | None:
        """A resumed run's executor of the plan in its folder's ``sync_plan.json`` (every rank
        reads the one run folder, as it reads the checkpoint), or False where the run kept
        DDP instead (its plan lost the trial); None for a new run."""
        saved = run.out_dir / "sync_plan.json"
        if run.resumed is None or not saved.exists():
            return None
        try:
            held = json.loads(saved.read_text())
            tensors = [(t["name"], t["method"], t["rows"]) for t in held["tensors"]]
            kept = held.get("trial", {}).get("kept", "plan")
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
            raise JimuError(
                f"{saved} is damaged ({one_line(e)}); the resumed run cannot keep its sync plan"
            ) from None
        if kept == "DDP":
            return False
        if run.is_main and not self.cfg.quiet:
            print(f"sync plan: kept from {saved}, as the run it resumes planned it", flush=True)
        return self._executor(tensors, run)

    def train_step(self, x: Tensor, y: Tensor) -> Tensor:
        t0 = time.perf_counter()
        self.optimizer.zero_grad(set_to_none=True)
        with self.run.autocast():
            loss = F.cross_entropy(self.ddp(x), y)
        scale = self.next_scale()
        # local SGD steps each replica on its own gradient between averagings: unweighted
        (loss if self.averaging is not None else loss * scale).backward()
        if self.sync is not None:
            self.sync.finish()
        self.run.synchronize()
        self.run.stats.wait_s += max(0.0, time.perf_counter() - self.hook.last_call)
        self.optimizer.step()
        if self.averaging is not None:
            self.averaging.after_step(self.model.parameters())
        self.run.synchronize()
        if self.hook.compressing:
            dt = time.perf_counter() - t0
            for acc in (self._steps, self._all_steps):
                acc[0] += dt
                acc[1] += 1
        return loss

    def full_model(self, run: Run) -> nn.Module | None:
        if self.averaging is not None:  # local SGD: the replicas differ between averagings
            self.averaging.average_now(self.model.parameters())
        return super().full_model(run)

    def evaluate(self, data: DataSplits, run: Run) -> dict[str, float | None]:
        # the training split is sharded: sum correct / count over ranks (bookkeeping, not counted)
        correct, _, n = count_correct(self.model, *data.eval_split("train"))
        totals = torch.tensor([correct, n], dtype=torch.float64, device=run.device)  # NCCL: on GPU
        dist.all_reduce(totals)
        seconds, steps = self._steps
        self._steps = [0.0, 0]
        if not run.is_main:
            return {}
        return {
            "train_acc": float(totals[0] / totals[1]),
            **accuracies(self.model, data, ("val", "test")),
            "step_s": seconds / steps if steps else None,
            "predicted_step_s": self.predictions.get(str(self.spec)),
        }

    def fit(self, model: nn.Sequential, data: DataSplits, run: Run) -> FitResult:
        result = super().fit(model, data, run)
        seconds, steps = self._all_steps
        result.extra.update(
            compress=str(self.spec),
            step_s=seconds / steps if steps else None,
            predicted_step_s=self.predictions.get(str(self.spec)),
        )
        if self.predictions:
            result.extra["compress_predictions"] = self.predictions
        if self.sync is not None:  # which method each tensor was synchronised by
            result.extra["sync_plan"] = {"plan": self.cfg.sync_plan, "tensors": self.sync_methods}
        elif self.kept_ddp:  # auto's plan lost to DDP
            result.extra["sync_plan"] = {"plan": self.cfg.sync_plan, "kept": "DDP"}
        return result


def _trial_line(trial: SyncTrial) -> str:
    """What ``--sync-plan auto``'s trial found, in one line."""
    kept = "the plan kept" if trial.keeps_plan else "DDP kept"
    n = len(trial.ddp_s)
    return (
        f"sync plan against DDP, stepped alternately: {trial.ratio:.3f}x DDP's step (median "
        f"of {n} rounds, spread {trial.spread:.3f}), faster in {trial.wins} of {n}; {kept}"
    )
