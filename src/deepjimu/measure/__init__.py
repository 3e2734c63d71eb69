"""Measuring this machine: links, the strategies' own steps, block costs, sync plans, the ranks' speeds.

Above the strategies: a strategy that needs something measured receives it through its
``Run`` (a :class:`~deepjimu.run.Measurer` the worker makes from
:class:`~deepjimu.measure.measurer.ThisMachine`), and never imports this package.
"""
