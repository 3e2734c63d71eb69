"""validate against the registries, for a model a factory builds (its blocks counted on the model)."""

from __future__ import annotations

import pytest
from torch import nn

from deepjimu.config import ConfigErrors, RunConfig
from deepjimu.validation import validate

FACTORY = "factory:my_script.make_model"


def test_a_factory_model_is_checked_on_its_own_block_count() -> None:
    cfg = RunConfig(strategy="pipeline", workers=4, model=FACTORY, schedule="interleaved",
                    microbatches=8)  # fmt: skip
    assert validate(cfg, nn.Sequential(*[nn.ReLU()] * 8)).workers == 4
    with pytest.raises(
        ConfigErrors,
        match=r"at least 2 blocks per worker \(workers: 4, blocks in factory:my_script.make_model: 6\)",
    ):
        validate(cfg, nn.Sequential(*[nn.ReLU()] * 6))


def test_a_factory_model_without_its_factory_is_refused_in_one_line() -> None:
    with pytest.raises(ConfigErrors) as e:
        validate(RunConfig(model=FACTORY, resume="runs/f"))
    assert e.value.problems == [
        f"--resume runs/f: its model comes from a Python factory ({FACTORY}); "
        "resume it with deepjimu.fit(..., resume='runs/f')"
    ]
    with pytest.raises(
        ConfigErrors, match=r"comes from a Python factory: train it with deepjimu\.fit"
    ):
        validate(RunConfig(model=FACTORY))


def test_admm_counts_a_factory_models_layers_and_refuses_what_it_cannot_train() -> None:
    """The blocks are the strategy's cut of the model (one per Linear for admm), not its children."""
    flat = nn.Sequential(nn.Flatten(), nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))
    assert validate(RunConfig(strategy="admm", workers=2, model=FACTORY), flat).workers == 2
    with pytest.raises(
        ConfigErrors, match=r"\(workers: 3, blocks in factory:my_script.make_model: 2\)"
    ):
        validate(RunConfig(strategy="admm", workers=3, model=FACTORY), flat)
    with pytest.raises(ConfigErrors) as e:
        validate(
            RunConfig(strategy="admm", model=FACTORY), nn.Sequential(nn.Linear(4, 3), nn.Tanh())
        )
    assert e.value.problems == [
        f"model {FACTORY}: admm needs [Conv2d, ReLU[, AvgPool2d], ...] [Flatten,] Linear, "
        "ReLU, ..., Linear; module 1 is Tanh() (expected ReLU)"
    ]
