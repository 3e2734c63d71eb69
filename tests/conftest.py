"""Shared fixtures: a small config for fast runs, and a temporary runs folder."""

from __future__ import annotations

from pathlib import Path

import pytest

from deepjimu.config import RunConfig


@pytest.fixture
def small_cfg(tmp_path: Path) -> RunConfig:
    """A quick digits run writing under ``tmp_path``."""
    return RunConfig(
        strategy="local",
        model="mlp:32x2",
        epochs=2,
        quiet=True,
        runs_dir=str(tmp_path / "runs"),
        name="t",
    )
