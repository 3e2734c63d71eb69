"""Choices: str enums that keep the CLI and TOML spellings, and RunConfig fields that hold them."""

from __future__ import annotations

import json

import pytest

from deepjimu.choices import KfacMethod, Optimizer, Precision, Schedule
from deepjimu.config import RunConfig, option_fields


def test_a_member_is_its_spelling() -> None:
    assert Schedule.ONE_F_ONE_B == "1f1b" and f"{Schedule.ONE_F_ONE_B}" == "1f1b"
    assert {"1f1b": 1}[Schedule.ONE_F_ONE_B] == 1 and {Schedule.GPIPE: 2}["gpipe"] == 2
    assert json.dumps([Precision.BF16]) == '["bf16"]'
    assert KfacMethod.spellings() == ("eigen", "inverse")


def test_config_holds_members_and_names_a_bad_spelling() -> None:
    cfg = RunConfig(schedule="interleaved", optimizer="sgd")
    assert cfg.schedule is Schedule.INTERLEAVED and cfg.optimizer is Optimizer.SGD
    assert RunConfig.from_dict(json.loads(json.dumps(cfg.to_dict()))) == cfg
    bad = RunConfig(schedule="zigzag")
    assert bad.schedule == "zigzag"  # left for validation to name
    assert "schedule must be one of gpipe, 1f1b, interleaved (got 'zigzag')" in bad.problems()


@pytest.mark.parametrize(
    "f", [f for f in option_fields() if f.metadata.get("enum")], ids=lambda f: f.name
)
def test_every_choice_option_lists_its_enum_spellings(f) -> None:
    kind = f.metadata["enum"]
    assert f.metadata["choices"] == kind.spellings()
    assert isinstance(getattr(RunConfig(), f.name), kind)
