"""The planning layer: predict every strategy's step on any cluster from a short probe (``jimu plan``).

Pure parts, with no process group and no run folder: the cluster
(:mod:`~deepjimu.cost.cluster`: devices, links, ring collectives), the model's work
(:mod:`~deepjimu.cost.profile`), pipeline schedules as data and their replay
(:mod:`~deepjimu.cost.schedule`) and a predictor per strategy
(:mod:`~deepjimu.cost.predict`). Measuring this machine lives apart
(:mod:`~deepjimu.measure.compute`, :mod:`~deepjimu.plan.setup`), as does the command
(:mod:`~deepjimu.plan.command`).
"""
