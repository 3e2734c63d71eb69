"""``--lr-schedule``: the learning rate over a run, set on the optimizer after each of its steps.

``cosine`` is nanoGPT's: a linear warm-up from 0 to ``--lr`` over ``--warmup-steps``, then a
cosine decay to ``--min-lr`` at the run's last step (nanoGPT's ``get_lr``, with its
``lr_decay_iters`` the run's length). Written here rather than with torch's
``LambdaLR``: the step it has reached lives in the optimizer's own param groups, which every
strategy already checkpoints with the optimizer, so a resumed run goes on at the rate it
stopped at with no other state to save; and an optimizer post-hook sets it, so every
strategy's step, whatever its own loop, moves the schedule.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from deepjimu.choices import LrSchedule
from deepjimu.options import OptimGroup

__all__ = ["attach_schedule", "cosine_factor"]

_KEY = "schedule_step"


def cosine_factor(step: int, warmup: int, total: int, floor: float) -> float:
    """The rate at ``step`` (from 0) as a fraction of the peak: ``(step + 1) / warmup``
    during the warm-up, then from 1 down to ``floor`` along half a cosine by step
    ``total``, ``floor`` after.

    Example:
        >>> [round(cosine_factor(s, 2, 10, 0.1), 3) for s in (0, 1, 2, 6, 10, 12)]
        [0.5, 1.0, 1.0, 0.55, 0.1, 0.1]
    """
    if step < warmup:
        return (step + 1) / warmup
    if step >= total:
        return floor
    progress = (step - warmup) / max(1, total - warmup)
    return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress))


def attach_schedule(optimizer: torch.optim.Optimizer, cfg: OptimGroup, total: int) -> None:
    """Drive ``optimizer``'s rate by ``cfg``'s schedule over a run of ``total`` steps (a
    constant rate: nothing to do)."""
    if cfg.lr_schedule != LrSchedule.COSINE:
        return
    assert cfg.lr is not None, "config not resolved"
    peak = cfg.lr
    floor = (cfg.min_lr if cfg.min_lr is not None else peak / 10) / peak

    def set_rate(group: dict[str, Any]) -> None:
        group["lr"] = peak * cosine_factor(group[_KEY], cfg.warmup_steps, total, floor)

    for group in optimizer.param_groups:
        group.setdefault(_KEY, 0)
        set_rate(group)

    def after_step(opt: torch.optim.Optimizer, *_: Any) -> None:
        for group in opt.param_groups:
            group[_KEY] += 1
            set_rate(group)

    optimizer.register_step_post_hook(after_step)
