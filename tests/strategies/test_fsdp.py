"""fsdp: torch's FSDP2 on gloo ranks equals one process on the whole batch, counts every byte, resumes exactly."""

from __future__ import annotations

import copy
import dataclasses
import json
import math
from pathlib import Path
from typing import Any

import pytest
import torch

from deepjimu.config import ConfigErrors, RunConfig
from deepjimu.data import DataOptions, load_dataset
from deepjimu.launch import train
from deepjimu.models import build_model
from deepjimu.run import Run
from deepjimu.strategies.fsdp import FSDPStrategy
from deepjimu.validation import validate
from distributed import recording, run_world
from processes import params, whole_params

pytestmark = pytest.mark.slow


_Recording = recording(FSDPStrategy)  # keeps every batch it trains on


def _shard_bytes(model: torch.nn.Module, world: int) -> list[int]:
    """Per block, the bytes of one rank's shards: every parameter cut on its first dimension
    into ``world`` pieces of ``ceil(rows / world)`` rows (FSDP pads the last)."""
    return [
        sum(math.ceil(p.shape[0] / world) * p[0].numel() * p.element_size()
            for p in block.parameters())
        for block in model
    ]  # fmt: skip


def _fsdp(
    rank: int, world: int, tmp: str, speeds: list[float] | None, replicas: int = 1
) -> dict[str, Any]:
    """fsdp in float64 on even shards (or shards by ``speeds``; HSDP with ``replicas``);
    rank 0 replays the same steps in one process on each step's whole batch and returns
    both models' parameters."""
    cfg = validate(
        RunConfig(
            strategy="fsdp", workers=world, quiet=True, runs_dir=tmp, name="f", epochs=2,
            optimizer="sgd", lr=0.1, momentum=0.9, batch_size=50, model="mlp:32x2",
            replicas=replicas,
        )
    )  # fmt: skip
    run = Run(cfg, Path(tmp) / "f", rank, world)
    if speeds is not None:
        run.balance, run.speeds = "speed", speeds
    full = load_dataset(cfg.dataset, DataOptions.from_config(cfg))
    full = dataclasses.replace(
        full, train_x=full.train_x.double(), val_x=full.val_x.double(), test_x=full.test_x.double()
    )
    model = build_model(cfg.model, full.feature_shape, full.num_classes, seed=cfg.seed).double()
    start = copy.deepcopy(model)
    strategy = _Recording(cfg)
    result = strategy.fit(model, full.shard(rank, world, speeds), run)
    steps = run.gather_objects([(x, y) for x, y in strategy.seen])
    counted = run.gather_objects((run.stats.bytes_sent, run.stats.bytes_recv))
    trained = whole_params(strategy.sharded)  # collective: every rank's shards
    if rank != 0:
        return {}
    alone = start
    optimizer = torch.optim.SGD(alone.parameters(), lr=0.1, momentum=0.9)
    for parts in zip(*steps, strict=True):  # step i of every rank: the whole batch
        optimizer.zero_grad()
        x, y = torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])
        torch.nn.functional.cross_entropy(alone(x), y).backward()
        optimizer.step()
    return {
        "fsdp": trained,
        "alone": dict(alone.named_parameters()),
        "steps": result.steps,
        "counted": counted,
        "shards": _shard_bytes(start, world // replicas),
        "rows": [len(torch.cat([p[1] for p in steps[r]])) for r in range(world)],
    }


@pytest.mark.parametrize(
    ("world", "speeds", "replicas"), [(2, None, 1), (3, None, 1), (2, [1.0, 0.3], 1), (4, None, 2)]
)
def test_fsdp_equals_one_process_on_the_whole_batch_and_counts_its_bytes(
    tmp_path: Path, world: int, speeds: list[float] | None, replicas: int
) -> None:
    out = run_world(_fsdp, world, str(tmp_path), speeds, replicas)[0]
    if speeds is not None:
        fast, slow = out["rows"]
        assert slow < fast / 2  # the shards follow the speeds
    for name, p in out["fsdp"].items():
        torch.testing.assert_close(p, out["alone"][name], rtol=1e-9, atol=1e-10, msg=name)
    # per step and block: its shards all-gathered before its forward and its backward (a
    # shard sent, world received), its gradients reduce-scattered (world shards sent, one
    # received); evaluation's all-gathers are bookkeeping, not counted, but the step after an
    # evaluation gathers the last block once more (FSDP: the unit that ran last), once here
    # evaluation, once here; with --replicas (HSDP) over the K ranks of a replica, and each
    # gradient shard all-reduced among the replicas (sent and received once)
    s, last, k = sum(out["shards"]), out["shards"][-1], world // replicas
    hsdp = s if replicas > 1 else 0
    assert out["counted"] == [(out["steps"] * (2 * s + k * s + hsdp) + last,
                               out["steps"] * (2 * k * s + s + hsdp) + k * last)] * world  # fmt: skip


def _params(run_dir: Path) -> dict[str, torch.Tensor]:
    return params(run_dir)


def test_a_resumed_fsdp_run_equals_the_uninterrupted_one(tmp_path: Path) -> None:
    common = {"strategy": "fsdp", "workers": 2, "model": "mlp:32x2", "quiet": True,
              "runs_dir": str(tmp_path), "balance": "even"}  # fmt: skip
    whole = train(RunConfig(epochs=4, name="full", **common))
    train(RunConfig(epochs=2, name="part", **common))
    halfway = _params(tmp_path / "part")
    resumed = train(RunConfig(epochs=4, resume=str(tmp_path / "part"), **common))
    full, part = _params(tmp_path / "full"), _params(tmp_path / "part")
    assert full.keys() == part.keys()
    for k in full:
        assert torch.equal(full[k], part[k]), k
    assert not torch.equal(halfway["0.1.weight"], part["0.1.weight"])
    alone = {k: v for k, v in common.items() if k != "balance"}
    local = train(RunConfig(**{**alone, "strategy": "local", "workers": 1}, epochs=4, name="l"))
    assert whole is not None and resumed is not None and local is not None
    assert resumed["test_acc"] == whole["test_acc"]
    assert abs(whole["test_acc"] - local["test_acc"]) <= 0.01  # fsdp is local's update
    events = [json.loads(x) for x in (tmp_path / "part" / "events.jsonl").read_text().splitlines()]
    assert [e["epoch"] for e in events] == [1, 2, 3, 4]


@pytest.mark.parametrize("balance", ["time", "size", "1,1"])
def test_fsdp_takes_only_the_balances_of_a_batch_split(balance: str) -> None:
    with pytest.raises(ConfigErrors) as e:
        validate(RunConfig(strategy="fsdp", workers=2, balance=balance))
    assert str(e.value) == (
        f"fsdp splits each batch over the workers: --balance auto, even or speed (balance: {balance})"
    )


def test_fsdp_refuses_a_sparse_embedding_in_one_line() -> None:
    with pytest.raises(ConfigErrors) as e:
        validate(RunConfig(strategy="fsdp", workers=2, dataset="bow", model="embed:300:12"))
    assert str(e.value) == (
        "fsdp shards dense gradients; model embed:300:12's embedding has sparse ones (use ddp, "
        "whose --sync-plan sparse sends their rows)"
    )


@pytest.mark.parametrize("strategy", ["fsdp", "tp"])
def test_a_sharding_strategy_refuses_one_worker_in_one_line(strategy: str) -> None:
    # one worker has nothing to shard; torch's DTensors on a world of one only cost time
    with pytest.raises(ConfigErrors) as e:
        validate(RunConfig(strategy=strategy, workers=1))
    assert str(e.value) == f"strategy {strategy} needs at least 2 workers (workers: 1)"
