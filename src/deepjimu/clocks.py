"""The run's four clocks: one definition for events, summary.json, the progress line and reports."""

from __future__ import annotations

__all__ = ["CLOCKS"]

CLOCKS = ("time_s", "fit_s", "train_s", "eval_s")
"""The run's four clocks, in seconds, each a reading since the run began (resumed segments
included), so that ``train_s + eval_s <= fit_s <= time_s`` at every moment:

- ``time_s``: since the run started (a worker's set-up, data loading and model building
  included);
- ``fit_s``: in training proper, ``Strategy.fit`` (its steps, evaluations, logging and
  checkpoints);
- ``train_s``: in training steps (:meth:`~deepjimu.counters.Counters.training` blocks: compute and the
  messages that training waits for);
- ``eval_s``: in evaluation (:meth:`~deepjimu.counters.Counters.evaluation` blocks).

Events carry rank 0's readings; ``summary.json`` carries the last event's."""
