"""Two-dimensional runs (``--replicas``): each split model replicated over data shards equals its 1-D run."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
import torch
from test_model_parallel import SMALL, WIDTH_BYTES, _double

from deepjimu.config import RunConfig
from deepjimu.data import DataOptions, load_dataset
from deepjimu.launch import train
from deepjimu.measure.measurer import ThisMachine
from deepjimu.mesh import Mesh
from deepjimu.models import build_model
from deepjimu.run import Run
from deepjimu.strategies import get_strategy
from deepjimu.strategies.local import LocalStrategy
from deepjimu.validation import validate
from distributed import run_world
from processes import params


def grid_world(
    rank: int, world: int, cases: list[dict[str, Any]], out_dir: str
) -> list[dict[str, Any]]:
    """On every rank: per case, one epoch of the strategy on 2 replicas x 2 stages and of
    ``local``, in float64; this rank's largest parameter difference and its bytes."""
    results = []
    for case in cases:
        cfg = validate(RunConfig(**{**SMALL, **case, "workers": world, "replicas": 2}))
        data = _double(load_dataset(cfg.dataset, DataOptions.from_config(cfg)))
        local_cfg = dataclasses.replace(cfg, strategy="local", workers=1, replicas=1)
        ref = build_model(cfg.model, data.feature_shape, data.num_classes, seed=cfg.seed).double()
        local = LocalStrategy(local_cfg)
        local_run = Run(local_cfg, Path(out_dir), measurer=ThisMachine())
        local.setup(ref, data, local_run)
        for x, y in local.batches(data, 0, local_run):
            local.train_step(x, y)
        model = build_model(cfg.model, data.feature_shape, data.num_classes, seed=cfg.seed).double()
        run = Run(cfg, Path(out_dir), rank, world, measurer=ThisMachine())
        strategy: Any = get_strategy(cfg.strategy)(cfg)
        strategy.setup(model, data, run)
        batches = strategy.batches(data, 0, run)
        for x, y in batches:
            strategy.train_step(x, y)
        metrics = strategy.evaluate(data, run)
        ref_state = ref.state_dict()
        held = {k: v for k, v in model.state_dict().items() if not v.is_meta}
        results.append(
            {
                "case": case,
                "mesh": run.mesh,
                "rows": sum(len(y) for _, y in batches),
                "steps": len(batches),
                "held": sorted(held),
                "param_diff": max(float((v - ref_state[k]).abs().max()) for k, v in held.items()),
                "bytes_sent": run.stats.bytes_sent,
                "own_params": sum(v.numel() for v in held.values()),
                "micro_rows": getattr(strategy, "rows", None),
                "metrics": metrics,
                "saved": strategy.full_model(run) is not None,
            }
        )
    return results


@pytest.mark.slow
def test_split_models_on_two_replicas_equal_their_one_dimensional_runs(tmp_path: Path) -> None:
    cases = [
        {"strategy": "model-parallel"},
        {"strategy": "pipeline", "microbatches": 2, "schedule": "1f1b"},
    ]
    per_rank = run_world(grid_world, 4, cases, str(tmp_path))
    for i, case in enumerate(cases):
        views = [per_rank[r][i] for r in range(4)]
        assert [v["mesh"] for v in views] == [Mesh(2, 2, r) for r in range(4)]
        # the replicas' parts of every batch cover it once: 171 rows in 6 batches
        assert views[0]["rows"] + views[2]["rows"] == 171, case
        assert all(v["param_diff"] < 1e-10 for v in views), (case, [v["param_diff"] for v in views])
        # a replica holds the model once, over its two stages
        assert sorted(views[0]["held"] + views[1]["held"]) == sorted(
            views[2]["held"] + views[3]["held"]
        )
        assert [v["saved"] for v in views] == [True, True, False, False]
        assert views[1]["metrics"]["test_acc"] is not None
        assert "test_acc" not in views[3]["metrics"]
        # bytes: the chain's activations and gradients (a row of 16 float64 a sample, each way
        # across the one boundary; pipelines pad micro-batches to equal rows), and each step
        # the stage's gradients all-reduced over its column (sent once, received once)
        m = case.get("microbatches", 1)
        assert m == 1 or views[0]["micro_rows"] == 8  # the largest batch, 29 rows: 15, then 8
        for v in views:
            rows = v["rows"] if m == 1 else v["steps"] * m * v["micro_rows"]
            want = rows * WIDTH_BYTES + v["steps"] * v["own_params"] * 8
            assert v["bytes_sent"] == want, (case, v["mesh"], v["bytes_sent"], want)


def test_bad_shapes_end_in_one_line() -> None:
    with pytest.raises(Exception, match="workers must be a multiple of replicas"):
        validate(RunConfig(strategy="admm", workers=3, replicas=2))
    with pytest.raises(Exception, match="at least one block per stage"):
        validate(RunConfig(strategy="model-parallel", workers=8, replicas=2, model="mlp:16x2"))
    with pytest.raises(Exception, match="replicas"):
        validate(RunConfig(strategy="ddp", workers=4, replicas=2))


# admm on digits' 1,293 training rows (64 features), mlp:32x2: layers 64 -> 32 -> 32 -> 10
ADMM = {"strategy": "admm", "model": "mlp:32x2", "epochs": 4, "quiet": True}


def admm_world(
    rank: int, world: int, kw: dict[str, Any], out_dir: str, double: bool = False
) -> dict[str, Any]:
    """One admm run in these ranks (``jimu train``'s fit, its events in ``out_dir``), in
    float64 if ``double``; this rank's layers, its bytes by kind and the last event."""
    cfg = validate(RunConfig(**{**ADMM, **kw, "workers": world}))
    data = load_dataset(cfg.dataset, DataOptions.from_config(cfg))
    model = build_model(cfg.model, data.feature_shape, data.num_classes, seed=cfg.seed)
    if double:
        data, model = _double(data), model.double()
    run = Run(cfg, Path(out_dir), rank, world, measurer=ThisMachine())
    strategy: Any = get_strategy("admm")(cfg)
    run.begin_fit()
    strategy.fit(model, data, run)
    block = strategy.block
    events = (Path(out_dir) / "events.jsonl").read_text().splitlines() if rank == 0 else []
    return {
        "layers": {i: (block.W[i], block.b[i]) for i in block.layers},
        "n": len(block.p[block.lo]),
        "kinds": dict(run.stats.sent_by_kind),
        "sent": run.stats.bytes_sent,
        "event": json.loads(events[-1]) if events else None,
    }


def _close(a: torch.Tensor, b: torch.Tensor) -> float:
    """The largest difference of a and b relative to b's largest entry, at least 1e-6: a
    layer the iteration drove to zero (a CNN's second convolution's W here, 1e-13) compares
    in absolute terms."""
    return float((a - b).abs().max() / max(float(b.abs().max()), 1e-6))


@pytest.mark.slow
@pytest.mark.parametrize(
    "kw",
    [
        {},
        {"admm_batch": 500, "admm_aux": "restart", "admm_memory": 0.5},
        {"model": "cnn:8-8", "epochs": 3},
        {"quantize": 4, "epochs": 5},  # per-sample grids: nothing to pool
    ],
    ids=["full-batch", "restart-memory", "cnn", "4-bits"],
)
def test_admm_on_two_replicas_runs_the_iterations_of_two_workers(tmp_path: Path, kw: dict) -> None:
    """2 blocks x 2 replicas: every iterate, the objective and the accuracies of the 2-worker
    run, up to the order of float32 sums (1e-5 relative); each replica holds half the samples."""
    one = run_world(admm_world, 2, kw, str(tmp_path / "one"), True)
    two = run_world(admm_world, 4, {**kw, "replicas": 2}, str(tmp_path / "two"), True)
    for r in range(4):
        mine, ref = two[r]["layers"], one[r % 2]["layers"]
        assert mine.keys() == ref.keys()
        for i in ref:
            assert _close(mine[i][0], ref[i][0]) < 1e-5 and _close(mine[i][1], ref[i][1]) < 1e-5
    a, b = one[0]["event"], two[0]["event"]
    for key in ("test_acc", "train_acc", "val_acc"):
        assert a[key] == b[key], key
    if not kw:  # full batch: every sample's variables, half of them on each replica
        assert [v["n"] for v in two] == [647, 647, 646, 646] and one[0]["n"] == 1293
        assert b["admm_objective"] == pytest.approx(a["admm_objective"], rel=1e-5)
        assert b["admm_residual"] == pytest.approx(a["admm_residual"], rel=1e-5)
        assert a["admm_readout"] == b["admm_readout"] == "all"
    # the neighbours' exchange of a replica's chain is the 1-D run's on its half of the rows
    assert "replicas" not in one[0]["kinds"] and two[0]["kinds"]["replicas"] > 0


@pytest.mark.slow
@pytest.mark.parametrize("bits", [0, 4])
def test_admm_replica_bytes_are_the_pooled_sums(tmp_path: Path, bits: int) -> None:
    """Bytes of the replicas' all-reduces, counted where they are sent, against their count:
    per iteration and layer, the (W, b) statistics (means, n, C_pp, C_zp; the data's mean,
    n and C_pp once, then z's mean and C_zp), without the readout (``--admm-readout iterate``) or the sweeps.
    At 4 bits as at full precision: each sample's grid is its own, no range is pooled."""
    kw = {"replicas": 2, "admm_readout": "iterate", "admm_sweeps": 0, "epochs": 3, "quantize": bits}
    two = run_world(admm_world, 4, kw, str(tmp_path))
    dims = [64, 32, 32, 10]  # layer i maps dims[i] -> dims[i + 1]

    def stats_floats(i: int, first: bool) -> int:
        n_in, n_out = dims[i], dims[i + 1]
        if i == 0:  # the data's pooled statistics are made once and kept: then z's alone
            return (n_in + 1 + n_in * n_in) * first + n_out + n_out * n_in
        return (n_in + n_out + 1) + (n_in * n_in + n_out * n_in)

    for r, view in enumerate(two):
        layers = view["layers"]
        want = sum(stats_floats(i, it == 0) for it in range(3) for i in layers) * 4
        assert view["kinds"]["replicas"] == want, r


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["admm", "pipeline", "tp"])
def test_two_dimensional_run_resumes_as_uninterrupted(tmp_path: Path, strategy: str) -> None:
    """``jimu train --workers 4 --replicas 2``: the checkpoint holds replica 0's blocks once
    and every rank's own state, and a resumed run ends with the uninterrupted run's weights."""
    common = {"strategy": strategy, "model": "mlp:32x3", "quiet": True, "runs_dir": str(tmp_path)}
    grid = {**common, "workers": 4, "replicas": 2}
    full = train(RunConfig(epochs=3, name="full", **grid))
    train(RunConfig(epochs=1, name="part", **grid))
    train(RunConfig(epochs=3, resume=str(tmp_path / "part"), **grid))
    a, b = params(tmp_path / "full"), params(tmp_path / "part")
    assert a.keys() == b.keys() and len(a) == 8  # 4 Linear layers, each held once
    for k in a:
        assert torch.equal(a[k], b[k]), k
    assert full is not None and full["workers"] == 4


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["admm", "model-parallel"])
def test_a_speed_balance_over_replicas_weighs_each_stage_by_its_slowest_replica(
    tmp_path: Path, strategy: str
) -> None:
    """``--balance speed`` on 2 replicas of 2 stages: a chain is cut by its stages' speeds,
    each its column's slowest (Run.chain), not by the 4 ranks' (which ended the run)."""
    common = {"strategy": strategy, "model": "mlp:32x3", "quiet": True, "epochs": 1,
              "runs_dir": str(tmp_path)}  # fmt: skip
    summary = train(RunConfig(workers=4, replicas=2, balance="speed", name="speed", **common))
    assert summary is not None and summary["balance"] == "speed"
    speeds = json.loads((tmp_path / "speed" / "speeds.json").read_text())["speeds"]
    assert len(speeds) == 4 and min(speeds) > 0
