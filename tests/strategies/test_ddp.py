"""ddp with --compress and --local-sgd on 2 gloo ranks: accuracy against plain ddp, bytes per step,
auto; on shards of uneven size (--balance speed), the same model as one process."""

from __future__ import annotations

import copy
import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
import torch

from deepjimu.comm import nbytes
from deepjimu.config import ConfigErrors, RunConfig
from deepjimu.cost.compress import CANDIDATES, PROBED
from deepjimu.data import DataOptions, load_dataset
from deepjimu.measure import links
from deepjimu.measure.measurer import ThisMachine
from deepjimu.models import build_model
from deepjimu.run import Run
from deepjimu.strategies.base import count_correct
from deepjimu.strategies.ddp import DDPStrategy
from deepjimu.validation import validate
from distributed import distributed_test, recording, run_world


def _fit(
    rank: int,
    world: int,
    variants: dict[str, dict],
    base: dict,
    tmp: str,
    sizes: tuple[int, ...] = (),
) -> dict[str, dict[str, Any]]:
    """Train ddp once per variant (config changes) in this group; rank 0 returns test accuracy and fit's extras."""
    if sizes:  # a short probe: fewer message sizes
        links.SIZES = sizes
    out = {}
    for name, changes in variants.items():
        cfg = validate(
            RunConfig(
                strategy="ddp",
                workers=world,
                quiet=True,
                runs_dir=tmp,
                name=name,
                **base,
                **changes,
            )
        )
        run = Run(cfg, Path(tmp) / name, rank, world, measurer=ThisMachine())
        data = load_dataset(cfg.dataset, DataOptions.from_config(cfg)).shard(rank, world)
        model = build_model(cfg.model, data.feature_shape, data.num_classes, seed=cfg.seed)
        result = DDPStrategy(cfg).fit(model, data, run)
        if rank == 0:
            correct, _, n = count_correct(model, data.test_x, data.test_y)
            out[name] = {"test_acc": correct / n, "extra": result.extra}
    return out


def _events(folder: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (folder / "events.jsonl").read_text().splitlines()]


VARIANTS = {
    "none": {},
    "fp16": {"compress": "fp16"},
    "bf16": {"compress": "bf16"},
    "powersgd:4": {"compress": "powersgd:4"},
    "topk:0.01": {"compress": "topk:0.01"},
    "qsgd:8": {"compress": "qsgd:8"},
    "local-sgd:4": {"local_sgd": 4},
}


@pytest.mark.slow
def test_every_compressor_and_local_sgd_end_within_a_point_of_plain_ddp(tmp_path: Path) -> None:
    # SGD: top-k with error feedback lags under Adam (see deepjimu.cost.compress). 60 epochs of
    # 11 steps: after 30, top-k 1% was 0.3 to 2.8 points behind plain ddp (seeds 0-3, so the
    # test passed or failed with the CPU's rounding); after 60, 0 to 0.6 points
    base = {
        "model": "mlp:64x2",
        "optimizer": "sgd",
        "lr": 0.1,
        "batch_size": 128,
        "epochs": 60,
        "eval_every": 60,
    }
    r = run_world(_fit, 2, VARIANTS, base, str(tmp_path), timeout=300)[0]
    plain = r["none"]["test_acc"]
    assert plain >= 0.95
    # the claim is the accuracy cost of each option: at most 1 point below plain ddp (an option
    # may end above it: local SGD at 60 epochs ended 1.1 points above, on seed 0)
    for name in VARIANTS:
        assert r[name]["test_acc"] >= plain - 0.01 - 1e-9, (name, r[name]["test_acc"], plain)
        assert r[name]["extra"]["compress"] == VARIANTS[name].get("compress", "none")
    sent = {n: sum(e["bytes_sent"] for e in _events(tmp_path / n)) for n in VARIANTS}
    assert sent["fp16"] * 2 == sent["none"] == sent["bf16"] * 2
    assert all(
        sent[n] < sent["none"] / 2 for n in ("powersgd:4", "topk:0.01", "qsgd:8", "local-sgd:4")
    )


@pytest.fixture(scope="module")
def short_runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, dict[str, Any]]]:
    """One group of 2 ranks for the short runs: mlp:1024x4 with each option, and mlp:64x2 with auto.

    mlp:1024x4: 2 epochs of 5 steps (digits 0 and 1), compression from step 3, so epoch 2 is
    all compressed. auto: a probe over two message sizes only.
    """
    tmp = tmp_path_factory.mktemp("short")
    wide = {"model": "mlp:1024x4", "classes": [0, 1]}
    start = {"compress_start": 2}  # --compress-start applies where something is compressed
    variants = {
        "none": wide,
        "powersgd:4": {**wide, **start, "compress": "powersgd:4"},
        "topk:0.01": {**wide, **start, "compress": "topk:0.01"},
        "auto": {"model": "mlp:64x2", "compress": "auto"},
    }
    results = run_world(_fit, 2, variants, {"epochs": 2}, str(tmp), (4096, 65536), timeout=300)
    return tmp, results[0]


def test_powersgd_and_topk_send_8x_fewer_bytes_per_step_on_a_wide_mlp(short_runs) -> None:
    tmp, _ = short_runs
    per_step = {}
    for name in ("none", "powersgd:4", "topk:0.01"):
        first, second = _events(tmp / name)
        per_step[name] = second["bytes_sent"] / (second["step"] - first["step"])
        assert second["step_s"] > 0
    n_params = sum(p.numel() for p in build_model("mlp:1024x4", (64,), 2, seed=0).parameters())
    assert per_step["none"] == 2 * 4 * n_params  # both ranks, float32
    for name in ("powersgd:4", "topk:0.01"):
        assert per_step["none"] >= 8 * per_step[name], (name, per_step)


def test_auto_probes_predicts_and_logs_predicted_and_measured_steps(short_runs) -> None:
    tmp, results = short_runs
    extra = results["auto"]["extra"]
    found = json.loads((tmp / "auto" / "probe.json").read_text())
    assert extra["compress"] == found["choice"] != "auto"
    assert set(extra["compress_predictions"]) == set(PROBED)  # topk predicted, not chosen
    assert {p["option"] for p in found["predictions"]} == set(PROBED)
    assert extra["compress"] in CANDIDATES
    assert found["world"] == 2 and [n for n, _ in found["points"]["all_reduce"]] == [4096, 65536]
    assert found["compute_s"] > 0 and found["buckets"]
    chosen = extra["compress_predictions"][extra["compress"]]
    for e in _events(tmp / "auto"):
        assert e["predicted_step_s"] == chosen and e["step_s"] > 0


@pytest.mark.slow
@distributed_test(world_size=[1, 2, 3], preload=["torch._dynamo"])
def test_replicas_stay_equal_and_every_gradient_byte_is_counted(
    rank: int, world: int, tmp: str
) -> None:
    cfg = validate(RunConfig(strategy="ddp", workers=world, dataset="synthetic", synthetic_n=600,
                             synthetic_features=20, model="mlp:16x1", epochs=1, batch_size=60,
                             optimizer="sgd", quiet=True, runs_dir=tmp, name="w"))  # fmt: skip
    run = Run(cfg, Path(tmp) / "w", rank, world)
    data = load_dataset(cfg.dataset, DataOptions.from_config(cfg)).shard(rank, world)
    model = build_model(cfg.model, data.feature_shape, data.num_classes, seed=cfg.seed)
    result = DDPStrategy(cfg).fit(model, data, run)
    flat = torch.cat([p.detach().flatten() for p in model.parameters()])
    assert all(torch.equal(other, flat) for other in run.gather_objects(flat))
    # one all-reduce of every gradient per step, counted as sent and received on each rank;
    # in a group of one it sends nothing
    grads = sum(nbytes(p) for p in model.parameters()) if world > 1 else 0
    assert run.stats.bytes_sent == run.stats.bytes_recv == result.steps * grads
    if rank == 0:
        (event,) = _events(Path(tmp) / "w")
        assert event["bytes_sent_per_rank"] == [result.steps * grads] * world


_Recording = recording(DDPStrategy)  # keeps every batch it trains on


def _uneven(rank: int, world: int, tmp: str, speeds: list[float]) -> dict[str, Any]:
    """ddp in float64 on shards in proportion to ``speeds``; rank 0 replays the same steps
    in one process on each step's whole batch and returns both models' parameters."""
    cfg = validate(
        RunConfig(
            strategy="ddp", workers=world, quiet=True, runs_dir=tmp, name="uneven", epochs=2,
            optimizer="sgd", lr=0.1, momentum=0.9, batch_size=50, model="mlp:32x2",
        )
    )  # fmt: skip
    run = Run(cfg, Path(tmp) / "uneven", rank, world)
    run.balance, run.speeds = "speed", speeds
    full = load_dataset(cfg.dataset, DataOptions.from_config(cfg))
    full = dataclasses.replace(
        full, train_x=full.train_x.double(), val_x=full.val_x.double(), test_x=full.test_x.double()
    )
    data = full.shard(rank, world, speeds)
    model = build_model(cfg.model, data.feature_shape, data.num_classes, seed=cfg.seed).double()
    start = copy.deepcopy(model)
    strategy = _Recording(cfg)
    strategy.fit(model, data, run)
    steps = run.gather_objects([(x, y) for x, y in strategy.seen])
    if rank != 0:
        return {}
    alone = start
    optimizer = torch.optim.SGD(alone.parameters(), lr=0.1, momentum=0.9)
    for parts in zip(*steps, strict=True):  # step i of every rank: the whole batch
        x = torch.cat([p[0] for p in parts])
        y = torch.cat([p[1] for p in parts])
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(alone(x), y).backward()
        optimizer.step()
    rows = [len(torch.cat([p[1] for p in steps[r]])) for r in range(world)]
    return {
        "ddp": dict(model.named_parameters()),
        "alone": dict(alone.named_parameters()),
        "rows": rows,
    }


@pytest.mark.slow
def test_ddp_on_uneven_shards_equals_one_process_on_the_whole_batch(tmp_path: Path) -> None:
    out = run_world(_uneven, 2, str(tmp_path), [1.0, 0.3])[0]
    fast, slow = out["rows"]
    assert slow < fast / 2  # the shards follow the speeds (1293 rows: 995 and 298 a epoch)
    for name, p in out["ddp"].items():
        torch.testing.assert_close(p, out["alone"][name], rtol=1e-9, atol=1e-10, msg=name)


@pytest.mark.parametrize("balance", ["time", "size", "1,1"])
def test_ddp_takes_only_the_balances_of_a_batch_split(balance: str) -> None:
    with pytest.raises(ConfigErrors) as e:
        validate(RunConfig(strategy="ddp", workers=2, balance=balance))
    assert str(e.value).splitlines() == [
        f"ddp splits each batch over the workers: --balance auto, even or speed (balance: {balance})"
    ]
