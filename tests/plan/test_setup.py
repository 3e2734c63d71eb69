"""deepjimu.plan.setup: what a probe's figures become in the cluster."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from deepjimu.compress.probe import PIPELINE_M
from deepjimu.plan.cluster import Cluster, Device, Link
from deepjimu.plan.schedule import actions, simulate, stage_ranks
from deepjimu.plan.setup import _action_s


def test_the_pipeline_runtime_per_action_reproduces_the_probed_step() -> None:
    cluster = Cluster("c", 1, 3, Device("cpu", {"fp32": 1.0}, 0), Link(2e-4, 1e9), None)
    found = SimpleNamespace(world=3, pipeline_step_s=0.02)
    a = _action_s(cluster, found)
    assert a is not None and a > 0
    ranks = stage_ranks(3)
    sim = simulate(
        actions("gpipe", 3, PIPELINE_M), [a] * 3, [a] * 3,
        lambda i, j: cluster.p2p_s(64, ranks[i], ranks[j]), ranks,
    )  # fmt: skip
    assert sim.makespan_s == pytest.approx(0.02)


def test_a_probe_without_a_pipeline_step_gives_no_runtime_figure() -> None:
    cluster = Cluster("c", 1, 2, Device("cpu", {"fp32": 1.0}, 0), Link(2e-4, 1e9), None)
    assert _action_s(cluster, SimpleNamespace(world=2, pipeline_step_s=None)) is None
