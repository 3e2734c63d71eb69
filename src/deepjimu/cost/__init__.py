"""Cost models, pure and torch-free: what a step costs on a cluster, from a probe's record or FLOPs.

The cluster (:mod:`~deepjimu.cost.cluster`: devices, links, ring collectives; its TOML
file, :mod:`~deepjimu.cost.cluster_file`), a model's work (:mod:`~deepjimu.cost.profile`),
pipeline schedules as data and their replay (:mod:`~deepjimu.cost.schedule`), what ddp's
options send (:mod:`~deepjimu.cost.ddp`), the per-tensor sync planner
(:mod:`~deepjimu.cost.sync`), the probe's record (:mod:`~deepjimu.cost.probe`), the cost
model of ``--compress auto`` (:mod:`~deepjimu.cost.compress`) and a predictor per strategy
(:mod:`~deepjimu.cost.predict`). No process group, no run folder, no torch: measuring lives
in :mod:`deepjimu.measure`, above the strategies.
"""
