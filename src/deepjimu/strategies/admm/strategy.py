"""``admm``: gradient-free layer-parallel training (pdADMM), each worker solving its layer block."""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor, nn

from deepjimu.admm_math.conv import PSolver
from deepjimu.balance import listed_balance, parse_balance, partition
from deepjimu.data import DataSplits
from deepjimu.errors import JimuError
from deepjimu.options import AdmmOptions
from deepjimu.run import Run
from deepjimu.strategies.admm.blocks import (
    AdmmParams,
    auto_init,
    auto_inner,
)
from deepjimu.strategies.admm.driver import Exchange
from deepjimu.strategies.admm.health import (
    Learning,
    chance_accuracy,
    hint,
    readout_failed,
    solve_failed,
)
from deepjimu.strategies.admm.kept import KeptBatches, kept_readout
from deepjimu.strategies.admm.layers import ConvOp, LayerOp
from deepjimu.strategies.admm.model import admm_layers, admm_maps, new_block, write_weights
from deepjimu.strategies.admm.pooled import Pool
from deepjimu.strategies.admm.settings import admm_settings, keeps, problems
from deepjimu.strategies.admm.solver import Solver
from deepjimu.strategies.base import FitResult, Strategy, epoch_order, log_grid, split_steps
from deepjimu.strategies.partition import StagePlan, block_shapes, staged_metrics

__all__ = ["AdmmStrategy"]


class AdmmStrategy(Strategy):
    """pdADMM (Wang et al., ICDM 2020): the p = q links between layers are dualised, so every
    layer's subproblems are solved in parallel from the previous iterate of its neighbours.
    MLPs and CNNs (``cnn:C1-C2-...``: conv layers with their average pooling folded into the
    next layer's operator, p-steps by conjugate gradients or an explicit matrix; layers.py).

    Worker r owns a contiguous block of layers chosen to balance the estimated cost (or as
    many layers as ``--balance N,N,...`` gives it), and exchanges only p (to the left) and q
    (to the right) with its neighbours each iteration; the duals u are kept in step on both
    sides. With ``--quantize 8|16`` every p and q lies on a grid (pdADMM-G-Q) and crosses the
    wire as integer codes; with ``--quantize 4|2`` every change of p and q does, on a grid
    per sample. ``--admm-batch B`` trains on mini-batches, kept on disk between
    visits (:meth:`_kept_epoch`; by default for MLPs where the disk has room, :func:`~deepjimu.strategies.admm.settings.keeps`)
    or restarted at every visit (:meth:`_minibatch_epoch`); the default is the paper's full
    batch, where one epoch is one iteration over all N samples.

    The model that is evaluated and saved is a readout of the iterate (``--admm-readout``,
    :meth:`LayerBlock.readout_choice`): by default, of the iterate's own weights, its
    classifier refitted and every layer refitted by exact least squares on the inputs the
    network's forward pass produces, the one with the lowest training loss. It costs one
    forward chain across the workers per evaluation, timed and counted as training (kept
    mini-batches stream it from their files: :func:`kept_readout`); the iterate itself, and
    so the iterations, do not change.
    """

    name = "admm"
    cfg: AdmmOptions

    @classmethod
    def tune_space(cls, cfg: AdmmOptions, trials: int) -> list[dict[str, Any]]:
        """rho and nu scaled together on a log grid over 0.1x..10x their defaults.

        Their common scale sets how strongly the layer equations are enforced against the
        loss (the quantity the results are most sensitive to; admm.md); their ratio is kept.
        """
        return [{"rho": cfg.rho * f, "nu": cfg.nu * f} for f in log_grid(1.0, trials)]

    @classmethod
    def model_blocks(cls, model: nn.Sequential) -> int:
        """A factory's model is trained by the rule :class:`deepjimu.PdADMM` follows
        (:func:`admm_maps`): one block per Linear or Conv2d."""
        try:
            return len(admm_maps(model, who="admm"))
        except ValueError as e:
            raise JimuError(str(e)) from None

    @classmethod
    def problems(cls, cfg: AdmmOptions, n_blocks: int) -> list[str]:
        return problems(cfg, n_blocks)

    def data_device(self, device: torch.device) -> torch.device:
        # mini-batch mode streams batches to the device, so device memory does not grow with N
        return torch.device("cpu") if self.cfg.admm_batch else device

    def fit(self, model: nn.Sequential, data: DataSplits, run: Run) -> FitResult:
        cfg = self.cfg
        assert cfg.epochs is not None
        run = run.chain()  # --replicas: this replica's chain of blocks, on 1/R of the samples
        # one linear map per block, the model's own modules: a factory's flat Sequential too
        blocks, maps, ops = admm_layers(model, data.feature_shape, cg_max_iter=cfg.admm_cg_iters)
        L = len(maps)
        self.own_blocks(model, data, run)  # planned already where the worker built our part
        sizes = list(self.plan.sizes)
        lo, hi = self.plan.bounds(run.rank)
        self.shapes = block_shapes(blocks, data.train_x[:1].cpu())
        # this rank's blocks' W, b live on the device, where its model holds them for evaluation
        # and checkpoints; another rank's blocks are freed (each rank holds only its own)
        for l, block in enumerate(blocks):
            block.to(run.device if lo <= l < hi else "meta")
        self.model, self.blocks, self.run, self.maps = model, blocks, run, maps
        # conv p-steps solved by CG: their iterations and cap hits go into the events
        self._cg = any(isinstance(op, ConvOp) and op.solver is PSolver.CG for op in ops)
        momentum = admm_settings(cfg, ops, keep=False)["momentum"]
        keep = keeps(self.cfg, ops, lo, hi, momentum, len(data.train_y), run)
        chosen = admm_settings(cfg, ops, keep)
        self.block = new_block(
            maps, ops, lo, hi, AdmmParams.of(cfg.rho, cfg.nu, cfg.quantize, cfg.admm_tau, chosen)
        )  # maps on run.device
        self.exchange = self._exchange(data, run)
        # a scaled, unit or identity start sets the weights once, on the first (mini-)batch of
        # the run; by default CNNs start with unit scales (they stall near 0.87 on digits
        # without), MLPs of DEEP_MLP layers or more as the identity (blocks.auto_init)
        init = auto_init(ops) if cfg.admm_init == "auto" else cfg.admm_init
        self.solver = Solver(
            self.block, self.exchange, run.rank, run.world, run.bookkeeping,
            sweeps=int(chosen["sweeps"]), init=init,
            rho_growth=1.0 if cfg.admm_batch else cfg.rho_growth,  # full batch only
        )  # fmt: skip
        self.solver.aside = run.aside  # the objective it measures is evaluation time
        x, y = self._samples(data, ops, hi == L)
        self.learning = Learning(chance_accuracy(data.train_y), patience=max(10, 2 * L))
        self._readout_state(keep, run)
        self._x, self._y, self._n = (x if lo == 0 else None), y, len(x)
        self._choose_settings(init, keep, chosen, ops, run)
        start, steps, samples = self._resume_point(run)
        fresh = run.resumed is None and not cfg.admm_batch  # full batch starts once, here
        steps = self._run_epochs(x, y, data, keep, start, steps, samples, fresh)
        run.close()
        self._checkpoint(steps, cfg.epochs)
        # what each rank's block holds of per-sample variables (p, z, q, u, momentum's
        # records), measured on the tensors: 1/R of the 1-D run's with --replicas R
        held = sum(t.numel() * t.element_size() for t in self.block.sample_state().values())
        sample_mb = [round(b / 2**20, 3) for b in run.gather_objects(held)]
        return FitResult(
            epochs=cfg.epochs,
            steps=steps,
            extra={
                "admm_blocks": sizes,
                "admm_settings": self.settings,
                "admm_readout": self._readout_choice,
                "zlast_cap_hits": self.block.zlast_hits,
                "admm_sample_mb_per_rank": sample_mb,
            }
            | ({"cg_cap_hits": self._cg_counts()[1]} if self._cg else {}),
        )

    def own_blocks(self, model: nn.Sequential, data: DataSplits, run: Run) -> set[int]:
        """This rank's layers (an ``mlp:``/``cnn:`` model's blocks are its layers), the plan
        made once from ``model``'s shapes (:meth:`_plan_stages`), on its replica's chain
        (:meth:`Run.chain`) and for the samples a replica holds."""
        run = run.chain()
        if getattr(self, "plan", None) is None:
            ops = admm_layers(model, data.feature_shape, cg_max_iter=self.cfg.admm_cg_iters).ops
            rows = math.ceil((self.cfg.admm_batch or len(data.train_y)) / self.cfg.replicas)
            self._plan_stages(ops, len(ops), rows, run)
        return set(range(*self.plan.bounds(run.rank)))

    def _exchange(self, data: DataSplits, run: Run) -> Exchange:
        """The block's messages to its neighbours; with ``--replicas``, its sums over samples
        pooled over its column of replicas (:mod:`~deepjimu.strategies.admm.pooled`)."""
        pool = Pool(run.replicas) if run.replicas is not None else None
        self.block.pooled = pool
        # the variables' dtype: float32 from every data set (a float64 test's data: float64)
        dtype = data.train_x.dtype if data.train_x.is_floating_point() else torch.float32
        return Exchange(run.comm, self.cfg.quantize, run.device, pool, dtype)

    def _samples(
        self, data: DataSplits, ops: list[LayerOp], last: bool
    ) -> tuple[Tensor, Tensor | None]:
        """The training rows this rank's block sees (dense layers take flat rows, conv layers
        [N, C, H, W] maps) and, for the last block, their labels: full batch, this replica's
        part; mini-batches, all of them (each batch is cut into the replicas' parts)."""
        x = data.train_x if isinstance(ops[0], ConvOp) else data.train_x.flatten(1)
        whole = bool(self.cfg.admm_batch)
        x = x if whole else self._part(x)
        y = (data.train_y if whole else self._part(data.train_y)) if last else None
        return x, y

    @property
    def _first_replica(self) -> bool:
        """Whether this rank is in replica 0 (every rank of a 1-D run)."""
        return self.run.mesh is None or self.run.mesh.replica == 0

    def _part(self, t: Tensor) -> Tensor:
        """This replica's part of ``t``'s rows: the r-th of R nearly equal consecutive parts
        (all of them in a 1-D run)."""
        mesh = self.run.mesh
        return t if mesh is None else t.tensor_split(mesh.replicas)[mesh.replica]

    def _plan_stages(self, ops: list[LayerOp], L: int, batch: int, run: Run) -> list[int]:
        """Each rank's layers (``self.plan``), balanced by their estimated cost on ``batch``
        samples (over the ranks' speeds where the run balances by them) or as listed."""
        cfg = self.cfg
        # one iteration's flops per layer (a conv layer's (W, b) step N H W m (2 C_out + m),
        # m = C_in s^2, and 4 N H W C_in C_out s^2 per CG iteration of its p-step; ConvOp.flops)
        costs = [op.flops(batch, with_p=l > 0) for l, op in enumerate(ops)]
        if listed_balance(cfg.balance):  # layers per worker, as given (checked before the start)
            sizes, how = parse_balance(cfg.balance, L, run.world), "list"
        elif run.balance == "speed":  # each rank's share of the cost over its measured speed
            sizes, how = partition(costs, run.world, run.speeds), "estimated cost over speed"
        else:
            sizes, how = partition(costs, run.world), "estimated cost"
        self.plan = StagePlan(tuple(sizes), run.world, how=how)
        if run.is_main and not cfg.quiet:
            self._print_plan(ops, costs, batch, run)
        return sizes

    def _print_plan(self, ops: list[LayerOp], costs: list[float], batch: int, run: Run) -> None:
        """The plan's line: the mode, and each worker's share of the cost and its variables."""
        cfg = self.cfg
        memory = [op.nbytes(batch) for op in ops]
        share = [sum(costs[slice(*self.plan.bounds(r))]) / sum(costs) for r in range(run.world)]
        mib = [sum(memory[slice(*self.plan.bounds(r))]) / 2**20 for r in range(run.world)]
        mode = f"mini-batch {cfg.admm_batch}" if cfg.admm_batch else "full batch"
        print(
            f"{self.plan.summary('admm')}, {mode}; per worker: cost share "
            f"{[round(c, 2) for c in share]}, variables {[round(m, 1) for m in mib]} MiB"
        )

    def _readout_state(self, keep: bool, run: Run) -> None:
        """Which readout the run makes, and where the readout stands at the start (a resumed
        run's model is the checkpoint's readout)."""
        cfg = self.cfg
        # the readout needs every sample's targets z: full batch holds them, kept batches
        # store them (streamed: kept_readout); restarted batches have them only for a visit
        self._readout_mode = "iterate" if cfg.admm_batch and not keep else cfg.admm_readout
        # a resumed run's model is the checkpoint's readout of the checkpointed iterate
        resumed = run.resumed.rank_state if run.resumed is not None else None
        self._readout_choice = resumed.get("readout", "iterate") if resumed else "iterate"
        self._iterate_fit: tuple[float, float] | None = None  # what the health check judges
        self._readout_stale = resumed is None  # the iterate moved since the last readout
        self._written = resumed is not None  # the model holds the current readout

    def _choose_settings(
        self, init: str, keep: bool, chosen: dict[str, float], ops: list[LayerOp], run: Run
    ) -> None:
        """The run's settings (``self.settings``, in its summary) and inner iterations per
        mini-batch; printed by the main rank."""
        cfg = self.cfg
        self.settings = {"init": init, "readout": self._readout_mode, **chosen}
        # a kept batch goes on where it stopped: one iteration per visit, as full batch per epoch
        self._inner = cfg.admm_inner or (1 if keep else auto_inner(ops))
        if cfg.admm_batch:
            self.settings |= {"aux": "keep" if keep else "restart", "inner": self._inner}
        if run.is_main and not cfg.quiet:
            print(
                "admm settings: "
                + ", ".join(
                    f"{k} {v:g}" if not isinstance(v, str) else f"{k} {v}"
                    for k, v in self.settings.items()
                )
            )

    def _resume_point(self, run: Run) -> tuple[int, int, int]:
        """The epoch, step and unlogged samples to go on from: a resumed run's, its block
        and history loaded from the checkpoint; zeros for a new run."""
        if run.resumed is None:
            return 0, 0, 0
        self.solver.load_state_dict(run.resumed.rank_state, run.device)
        return run.resumed.epoch, run.resumed.step, run.resumed.extra.get("samples", 0)

    def _run_epochs(
        self, x: Tensor, y: Tensor | None, data: DataSplits, keep: bool, start: int, steps: int,
        samples: int, fresh: bool,
    ) -> int:  # fmt: skip
        """:meth:`_epochs` with the kept mini-batches' store open (where they keep their
        auxiliary variables), closed however the epochs end; returns the steps so far."""
        cfg, run = self.cfg, self.run
        rank = run.mesh.rank if run.mesh is not None else run.rank  # the store's name: global
        self._kept = (
            KeptBatches(len(x), cfg.admm_batch, cfg.seed, self.block, None, f"-r{rank}", self._part)
            if keep
            else None
        )
        try:
            return self._epochs(x, y, data, start, steps, samples, fresh)
        finally:
            if self._kept is not None:
                self._kept.close()

    def _epochs(
        self, x: Tensor, y: Tensor | None, data: DataSplits, start: int, steps: int,
        samples: int, fresh: bool,
    ) -> int:  # fmt: skip
        """Epochs ``start`` .. the last, with their logs and checkpoints; returns the steps so far."""
        cfg, run, lo = self.cfg, self.run, self.block.lo
        assert cfg.epochs is not None
        # the ranks start training together: what one rank still sets up (another's
        # balance profiling, building its stages) is set-up, not the first step's training
        run.barrier()
        run.progress(cfg.epochs, self.name)
        run.progress_at(start)
        for epoch in range(start, cfg.epochs):
            self._readout_stale, self._written = True, False  # the iterate moves
            done = epoch + 1
            logged = done % cfg.eval_every == 0 or done == cfg.epochs
            with run.training(), run.autocast():
                try:
                    if self._kept is not None:
                        steps += self._kept_epoch(x, data.train_y, epoch)
                    elif cfg.admm_batch:
                        steps += self._minibatch_epoch(x, data.train_y, epoch)
                    else:
                        if fresh:  # in the try: the sweeps after it factorise too
                            self.solver.start(x if lo == 0 else None, len(x))
                            fresh = False
                        self.solver.iterate(y, measure=logged)  # the objective, when logged
                        steps += 1
                except torch.linalg.LinAlgError as e:  # the p and W solves factorise
                    raise JimuError(
                        solve_failed(e, epoch + 1, self.block.params.rho, cfg.nu)
                    ) from None
            samples += len(data.train_y)
            if logged:
                self._log(steps, done, data, samples)
                samples = 0
            if cfg.checkpoint_every and done % cfg.checkpoint_every == 0 and done < cfg.epochs:
                self._checkpoint(steps, done, samples)
        return steps

    # ---- iterations (the solver's), batch by batch --------------------------------------------------
    def _minibatch_epoch(self, x: Tensor, y: Tensor, epoch: int) -> int:
        """One pass over mini-batches; the auxiliary variables live only for their batch.

        For each batch (moved from host memory to the device): a forward pass sets p, z, q
        (u = 0) from the current weights, then ``--admm-inner`` pdADMM iterations (default
        2 per layer, 4 for deep MLPs: ``blocks.auto_inner``) update every variable, W
        included. W carries what earlier batches taught it: each W step is the exact
        minimiser for this batch plus the proximal term (tau/2)||W - W_old||^2, so
        directions this batch does not constrain keep their old values; with
        ``--admm-memory D`` it is the exact minimiser over every batch seen so far, older
        ones weighted by D per batch, from O(n^2) statistics per layer. Device memory holds
        one batch of auxiliary variables, whatever N is; only the data set grows with N, in
        host memory.
        """
        cfg, run, block = self.cfg, self.run, self.block
        order = epoch_order(len(y), cfg.seed, epoch)
        batches = split_steps(order, max(1, math.ceil(len(y) / cfg.admm_batch)))
        for idx in map(self._part, batches):
            xb = x[idx].to(run.device) if block.lo == 0 else None
            yb = y[idx].to(run.device) if block.hi == block.L else None
            self.solver.restarted_batch(xb, yb, len(idx), self._inner)
        return len(batches)

    def _kept_epoch(self, x: Tensor, y: Tensor, epoch: int) -> int:
        """One pass over fixed mini-batches whose auxiliary variables persist (``--admm-aux keep``).

        Each batch goes on from where its last visit left it (:class:`KeptBatches`): its
        variables are read back from disk, ``--admm-inner`` iterations update them, and
        every (W, b) step is exact over all N samples (each other batch as its last visit
        left it). A batch's first
        visit starts it by a forward pass (and the sweeps), as a full-batch run starts. The
        store does not go into checkpoints (it is O(N)): a resumed run starts every batch
        again from a forward pass of the checkpointed weights.
        """
        kept, run, block = self._kept, self.run, self.block
        assert kept is not None
        order = kept.order(epoch)
        upcoming = [*order[1:], kept.order(epoch + 1)[0]]
        for k, after in zip(order, upcoming, strict=True):
            idx = kept.batches[k]
            xb = x[idx].to(run.device) if block.lo == 0 else None
            yb = y[idx].to(run.device) if block.hi == block.L else None
            loaded = kept.begin(k, xb, run.device)
            kept.will_need(after)  # read from disk while this batch computes
            if not loaded:
                self.solver.start(xb, len(idx))
            for _ in range(self._inner):
                self.solver.iterate(yb)
            kept.end(k)
        return len(kept.batches)

    # ---- logging, divergence, rho schedule ----------------------------------------------------------
    def _readout(self, y: Tensor | None) -> None:
        """Collective: choose the readout of the current iterate (``--admm-readout``), once.

        Its forward chain and solves are training work: timed and counted as such.
        """
        if not self._readout_stale:
            return
        self._readout_stale = False
        mode, run = self._readout_mode, self.run
        self._iterate_fit = None
        if mode == "iterate":
            self._readout_choice = "iterate"
            return
        kept = self._kept

        def streamed(m: str) -> str | None:  # kept batches: their variables stream from files
            assert kept is not None
            return kept_readout(kept, self._x, y, self.exchange, run.rank, run.world, m, run.device)

        # the other ranks' wait for the choice is the readout's time on their clocks too
        with run.training(), run.autocast():
            try:
                self._readout_choice, self._iterate_fit = self.solver.readout(
                    self._x, y, self._n, mode, streamed if kept is not None else None
                )
            except torch.linalg.LinAlgError as e:
                raise JimuError(readout_failed(e, "--admm-readout iterate")) from None

    def _write_back(self) -> None:
        """The readout's weights into the model, for evaluation and checkpoints (once per
        iterate: a resumed run's model already holds its checkpoint's, which a kept run's
        store, not checkpointed, could not compute again)."""
        if self._written:
            return
        self._readout(self._y)
        write_weights(self.maps, self.block.readout_weights(self._readout_choice))
        self._written = True

    def _log(self, step: int, done: int, data: DataSplits, samples: int) -> None:
        cfg, run = self.cfg, self.run
        self._readout(self._y)  # training work, timed as such (before the evaluation)
        with run.evaluation():
            self._write_back()
            # one replica's chain scores the readout (the others hold the same weights)
            metrics: dict[str, Any] = (
                staged_metrics(self.blocks, self.plan, run, self.shapes, data)
                if self._first_replica
                else {}
            )
            objective, residual = 0.0, 0.0
            if not cfg.admm_batch:
                objective, residual = self.solver.objective_and_residual(self.block_labels(data))
                metrics |= {"admm_objective": objective, "admm_residual": residual}
            if self._cg:
                per_solve, hits = self._cg_counts()
                metrics |= {"admm_cg_iters": per_solve, "admm_cg_cap_hits": hits}
        metrics |= {"rho": self.block.params.rho, "nu": self.block.params.nu}
        metrics["admm_readout"] = self._readout_choice
        event = run.log(step, done, samples=samples, **metrics)
        bad = [
            k
            for k in ("loss", "admm_objective")
            if event.get(k) is not None and not _finite(event[k])
        ]
        if not cfg.admm_batch and objective > 1e30:
            bad.append("admm_objective")
        if bad:
            raise JimuError(
                f"admm diverged at iteration {done}: {bad[0]} is {event[bad[0]]} "
                f"(rho: {self.block.params.rho}, nu: {self.block.params.nu}); "
                f"last good checkpoint: {run.last_checkpoint_text()}"
            )
        # the health of the iteration itself: a readout refitted on a stuck iterate can fit
        # the training set well above chance while nothing learns
        loss, acc, whose = event.get("loss"), event.get("train_acc"), ""
        if self._iterate_fit is not None:
            (loss, acc), whose = self._iterate_fit, "the iterate's "
        stuck = self.learning.check(done, loss, acc, whose)
        if stuck:
            rho, nu = self.block.params.rho, cfg.nu
            raise JimuError(f"admm is {stuck} (rho: {rho:g}, nu: {nu:g}); {hint(rho, nu)}")
        self.solver.schedule(residual)  # rho grows where the residual stalls (full batch)

    def _cg_counts(self) -> tuple[float, int]:
        """Collective: CG iterations per conv p-step and the p-steps that hit the cap, all ranks, so far."""
        mine = (self.block.cg_iters, self.block.cg_solves, self.block.cg_hits)
        counts = self.run.gather_objects(mine if self._first_replica else (0, 0, 0))
        iters, solves, hits = (sum(c[i] for c in counts) for i in range(3))
        return iters / max(solves, 1), hits

    def block_labels(self, data: DataSplits) -> Tensor | None:
        """The labels of the samples this block's iterate holds (full batch: its replica's)."""
        return self._y if self.block.hi == self.block.L else None

    def _checkpoint(self, step: int, done: int, samples: int = 0) -> None:
        self._write_back()
        # each rank's blocks are its model's modules: saved under the model's own keys
        state = self.solver.state_dict() | {"readout": self._readout_choice}
        # the blocks' weights once (replica 0's), every rank's own sample variables
        model = self.model if self._first_replica else None
        self.run.save_checkpoint(step, done, model, state, {"samples": samples})


def _finite(v: Any) -> bool:
    try:
        return math.isfinite(float(v))
    except (TypeError, ValueError):
        return False
