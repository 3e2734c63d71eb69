"""tp: Megatron's Linear pairs with torch's tensor parallel on gloo ranks equal one process, count their all-reduces, resume exactly."""

from __future__ import annotations

import copy
import dataclasses
import json
import math
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from deepjimu.config import ConfigErrors, RunConfig
from deepjimu.data import DataOptions, load_dataset
from deepjimu.errors import JimuError
from deepjimu.launch import train
from deepjimu.models import build_model
from deepjimu.run import Run
from deepjimu.strategies.tp import TensorParallelStrategy, tp_plan
from deepjimu.validation import validate
from distributed import recording, run_world
from processes import params, whole_params

_Recording = recording(TensorParallelStrategy)  # keeps every batch it trains on


def _tp(rank: int, world: int, tmp: str, model_spec: str, replicas: int = 1) -> dict[str, Any]:
    """tp in float64 (with ``replicas``: over a replica's ranks, FSDP among the replicas);
    rank 0 replays the same steps in one process, each on the replicas' parts together."""
    cfg = validate(
        RunConfig(
            strategy="tp", workers=world, quiet=True, runs_dir=tmp, name="t", epochs=2,
            optimizer="adam", lr=0.01, batch_size=50, model=model_spec, replicas=replicas,
        )
    )  # fmt: skip
    run = Run(cfg, Path(tmp) / "t", rank, world)
    data = load_dataset(cfg.dataset, DataOptions.from_config(cfg))
    data = dataclasses.replace(
        data, train_x=data.train_x.double(), val_x=data.val_x.double(), test_x=data.test_x.double()
    )
    model = build_model(cfg.model, data.feature_shape, data.num_classes, seed=cfg.seed).double()
    start = copy.deepcopy(model)
    strategy = _Recording(cfg)
    result = strategy.fit(model, data, run)
    steps = run.gather_objects(strategy.seen)
    counted = run.gather_objects((run.stats.bytes_sent, run.stats.bytes_recv))
    trained = whole_params(strategy.sharded)  # collective: every rank's shards
    if rank != 0:
        return {}
    alone = start
    optimizer = torch.optim.Adam(alone.parameters(), lr=0.01)
    firsts = steps[:: world // replicas]  # the first rank of each replica, in replica order
    for parts in zip(*firsts, strict=True):
        optimizer.zero_grad()
        x, y = torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])
        torch.nn.functional.cross_entropy(alone(x), y).backward()
        optimizer.step()
    return {
        "tp": trained,
        "alone": dict(alone.named_parameters()),
        "steps": result.steps,
        "rows": [sum(len(y) for _, y in seen) for seen in steps],  # each rank's
        "counted": counted,
        "same_in_replica": all(
            torch.equal(a[1], b[1]) for a, b in zip(steps[0], steps[1], strict=True)
        ),
    }


@pytest.mark.slow
@pytest.mark.parametrize(("world", "width", "replicas"), [(2, 32, 1), (3, 33, 1), (4, 32, 2)])
def test_tp_equals_one_process_and_counts_each_pairs_all_reduces(
    tmp_path: Path, world: int, width: int, replicas: int
) -> None:
    out = run_world(_tp, world, str(tmp_path), f"mlp:{width}x3", replicas)[0]
    for name, p in out["tp"].items():
        torch.testing.assert_close(p, out["alone"][name], rtol=1e-9, atol=1e-10, msg=name)
    assert out["same_in_replica"]  # a replica's ranks step on the same rows
    # mlp:Wx3 is Linear 64-W, W-W, W-W, W-10: pairs (0, 1) and (2, 3). Each step all-reduces
    # the row layers' outputs (W and 10 per row) and the second pair's input gradient (W per
    # row; the first pair's input is the data): float64, sent and received
    per_row = (width + 10 + width) * 8
    totals = [rows * per_row for rows in out["rows"]]
    if replicas == 1:
        assert out["counted"] == [(t, t) for t in totals]
        return
    # and FSDP among the replicas, per step and block: its shards of this rank's part (a
    # column layer's W/K rows, a row layer's W/K columns with its bias whole) all-gathered
    # before its forward and its backward, its gradient reduce-scattered; the step after an
    # evaluation gathers the last block once more (as fsdp's test counts it)
    k = world // replicas
    part = [[(width // k, 64), (width // k,)], [(width, width // k), (width,)],
            [(width // k, width), (width // k,)], [(10, width // k), (10,)]]  # fmt: skip
    shards = [sum(math.ceil(s[0] / replicas) * math.prod(s[1:]) * 8 for s in b) for b in part]
    s, last, r = sum(shards), shards[-1], replicas
    fsdp = (out["steps"] * (2 * s + r * s) + last, out["steps"] * (2 * r * s + s) + r * last)
    assert out["counted"] == [(t + fsdp[0], t + fsdp[1]) for t in totals]


@pytest.mark.slow
def test_a_resumed_tp_run_equals_the_uninterrupted_one(tmp_path: Path) -> None:
    common = {"strategy": "tp", "workers": 2, "model": "mlp:32x3", "quiet": True,
              "runs_dir": str(tmp_path)}  # fmt: skip
    whole = train(RunConfig(epochs=4, name="full", **common))
    train(RunConfig(epochs=2, name="part", **common))
    resumed = train(RunConfig(epochs=4, resume=str(tmp_path / "part"), **common))
    full, part = (params(tmp_path / n) for n in ("full", "part"))
    for k in full:
        assert torch.equal(full[k], part[k]), k
    local = train(RunConfig(**{**common, "strategy": "local", "workers": 1}, epochs=4, name="l"))
    assert whole is not None and resumed is not None and local is not None
    assert resumed["test_acc"] == whole["test_acc"]
    assert abs(whole["test_acc"] - local["test_acc"]) <= 0.01  # tp is local's update
    events = [json.loads(x) for x in (tmp_path / "part" / "events.jsonl").read_text().splitlines()]
    assert [e["epoch"] for e in events] == [1, 2, 3, 4]


def test_the_plan_pairs_linear_layers_and_names_what_it_cannot_split() -> None:
    plan = tp_plan(build_model("mlp:16x2", (4,), 3))
    assert [type(s).__name__ for s in plan.values()] == ["ColwiseParallel", "RowwiseParallel"]
    with pytest.raises(JimuError, match=r"module 0\.1 is Tanh"):
        tp_plan(nn.Sequential(nn.Sequential(nn.Linear(4, 4), nn.Tanh()), nn.Linear(4, 2)))
    with pytest.raises(ConfigErrors) as e:
        validate(RunConfig(strategy="tp", workers=2, model="cnn:8"))
    assert str(e.value) == (
        "tp splits mlp:... models into Linear pairs and gpt:... models by heads; model cnn:8 "
        "is neither"
    )
    with pytest.raises(ConfigErrors) as e:
        validate(RunConfig(strategy="tp", workers=3, model="mlp:32x3"))
    assert str(e.value) == (
        "tp cuts each pair's hidden width into workers equal parts: widths 32, 32 and "
        "workers 3 (model: mlp:32x3)"
    )
    with pytest.raises(ConfigErrors) as e:
        validate(RunConfig(strategy="tp", workers=6, replicas=2, model="mlp:32x3"))
    assert str(e.value) == (
        "tp cuts each pair's hidden width into equal parts, one per rank of a replica: widths "
        "32, 32 and 3 ranks a replica (workers: 6, replicas: 2, model: mlp:32x3)"
    )
    with pytest.raises(ConfigErrors, match=r"batch-size must be >= replicas"):
        validate(RunConfig(strategy="tp", workers=4, replicas=2, batch_size=1))
