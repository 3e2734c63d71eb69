"""A predictor per strategy (its registry entry names it, :mod:`deepjimu.strategies.registry`): one run's step time, samples/s, bytes per sample and memory on a cluster.

Every predictor composes the same two inputs, a :class:`~deepjimu.cost.profile.Compute`
(seconds of the model's work on one rank) and a :class:`~deepjimu.cost.cluster.Cluster`
(its links), by the strategy's schedule:

- ``local``: the measured step, batch after batch.
- ``ddp``: each rank's step on its ``batch / P`` rows, then the collectives of each DDP
  bucket (:mod:`deepjimu.cost.ddp`: the gradients in reverse order, the first bucket
  1 MiB, the others 25 MiB, as torch's DDP fills them), not overlapped on a CPU node
  (gloo and the gradients share the cores, :mod:`deepjimu.cost.compress`), all but the
  last bucket's overlapped on a GPU. ``--compress fp16|bf16``: half the bytes, that
  dtype's fitted all-reduce; a ``--sync-plan`` prices each tensor's method instead.
- ``pipeline``: the schedule's actions (:func:`deepjimu.cost.schedule.actions`) replayed
  through the cost model (:func:`deepjimu.cost.schedule.simulate`) with each stage's
  micro-batch times and the cuts' transfers, then each rank's optimizer update of its
  own blocks.
- ``model-parallel``: the same with GPipe's order of one micro-batch: the stages one
  after the other on the whole batch, an activation and its gradient across each cut.
- ``fsdp``: ddp's plain step on each rank's rows, each block's all-gathers and
  reduce-scatter; ``tp``: the step on the whole batch with 1/P of the paired blocks' work
  and each pair's all-reduces. Both pay their DTensors' runtime per sharded unit, solved
  from the probe's step of the strategy itself (:attr:`Cluster.action_s`).
- ``admm``: per iteration the slowest rank's layers (ranks work at once), then the p and
  q exchange across each cut; per log the readout's forward chain, rank after rank.

Ranks that share a CPU node's cores slow each other down: a rank runs ``cores // P``
threads, and P ranks computing at once run :meth:`Cluster.ranks_sharing_cores` slower
(a pipeline's ranks, busy only part of the time, in proportion); ranks that synchronise on
time-shared cores lose :meth:`Cluster.sync_penalty_s` more at each synchronisation
(measured by the probe where it ran; not a model-parallel chain, whose ranks compute one at
a time), and a ddp step's all-reduce :meth:`Cluster.ddp_sync_penalty_s` beyond its fitted
time. DDP's own work comes from the compute figures
(measured here, or an estimate elsewhere); the pipelining runtime's work per action from
the probe's step of the pipeline strategy where a probe ran (:attr:`Cluster.action_s`),
else from the compute figures; a model-parallel hand-off's cost beyond the fitted send
likewise from the probe's model-parallel step. Samples per second mean what ``jimu
bench`` reports: training samples over training time (admm's start, once per run,
included over its ``--epochs``).
"""
