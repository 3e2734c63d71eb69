"""Sharded models built in parts: each rank's shards are the whole model's, no rank holds the whole, and a checkpoint of shards reads back as the whole model."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from deepjimu.config import RunConfig
from deepjimu.data import DataOptions, load_dataset
from deepjimu.models import build_model
from deepjimu.record.checkpoint import ModelState
from deepjimu.run import Run
from deepjimu.strategies.fsdp import FSDPStrategy
from deepjimu.strategies.sharding import load_shards
from deepjimu.strategies.tp import TensorParallelStrategy
from deepjimu.validation import validate
from distributed import distributed_test
from processes import whole_params

pytestmark = pytest.mark.slow

_SPECS = {"fsdp": "mlp:33x3", "tp": "mlp:12x3"}  # fsdp: rows that do not split evenly
_STRATEGIES = {"fsdp": FSDPStrategy, "tp": TensorParallelStrategy}


def _built_in_parts(strategy: str, rank: int, world: int, tmp: str) -> tuple[Run, nn.Module]:
    """The worker's way: the model planned on the meta device, then built a block at a time
    into ``strategy``'s training copy."""
    cfg = validate(
        RunConfig(strategy=strategy, workers=world, model=_SPECS[strategy], quiet=True,
                  runs_dir=tmp, name="s", epochs=1)
    )  # fmt: skip
    run = Run(cfg, Path(tmp) / "s", rank, world)
    data = load_dataset(cfg.dataset, DataOptions.from_config(cfg))
    with torch.device("meta"):
        shapes = build_model(cfg.model, data.feature_shape, data.num_classes, seed=cfg.seed)
    chosen = _STRATEGIES[strategy](cfg)
    place = chosen.placer(shapes, data, run)
    model = build_model(cfg.model, data.feature_shape, data.num_classes, cfg.seed, place)
    assert all(t.is_meta for t in model.state_dict().values())  # every block freed once loaded
    chosen.setup(model, data, run)
    return run, chosen.sharded


@distributed_test(world_size=[2, 3])
def test_each_rank_builds_its_shards_of_the_whole_model(rank: int, world: int, tmp: str) -> None:
    for strategy in ("fsdp", "tp"):
        run, sharded = _built_in_parts(strategy, rank, world, f"{tmp}/{strategy}")
        whole = build_model(_SPECS[strategy], (1, 8, 8), 10, seed=run.cfg.seed)
        built = whole_params(sharded)
        assert built.keys() == dict(whole.named_parameters()).keys()
        for k, p in whole.named_parameters():
            assert torch.equal(built[k], p.detach()), (strategy, k)
        # a rank holds its piece of each paired or sharded weight, not the whole
        rows = whole.get_parameter("0.1.weight").shape[0]
        assert sharded.get_parameter("0.1.weight").to_local().shape[0] <= -(-rows // world)
        run.close()


@distributed_test(world_size=[2])
def test_a_checkpoint_of_shards_reads_back_as_the_whole_model(
    rank: int, world: int, tmp: str
) -> None:
    for strategy in ("fsdp", "tp"):
        run, sharded = _built_in_parts(strategy, rank, world, f"{tmp}/{strategy}")
        folder = run.save_checkpoint(1, 1, sharded, {})
        whole = build_model(_SPECS[strategy], (1, 8, 8), 10, seed=run.cfg.seed)
        state = ModelState(folder)
        assert set(state) == set(whole.state_dict())
        for k, v in whole.state_dict().items():
            assert torch.equal(state[k], v), (strategy, k)
        # each file holds a rank's pieces: rank 0's first weight is its rows alone
        mine = torch.load(folder / ("model.pt" if rank == 0 else f"model-rank{rank}.pt"))
        assert mine["0.1.weight"].shape[0] < whole.state_dict()["0.1.weight"].shape[0]
        # and the shards load back from it a tensor at a time
        with torch.no_grad():
            for p in sharded.parameters():
                p.zero_()
        load_shards(sharded, state)
        for k, p in whole_params(sharded).items():
            assert torch.equal(p, whole.state_dict()[k]), (strategy, k)
        run.close()
