"""jimu probe: the table, probe.json and its reading back."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from deepjimu.cli import main
from deepjimu.config import RunConfig
from deepjimu.cost.compress import PROBED, CostModel
from deepjimu.cost.probe import TimedStep, read_probe
from deepjimu.data import DataOptions, load_dataset
from deepjimu.errors import JimuError
from deepjimu.measure import links
from deepjimu.measure import probe as probe_module
from deepjimu.measure.measurer import ThisMachine
from deepjimu.models import build_model
from deepjimu.run import Run
from deepjimu.strategies.pipeline import PROBE_MICROBATCHES
from deepjimu.validation import validate
from distributed import distributed_test


def test_jimu_probe_prints_the_table_and_writes_probe_json(
    tmp_path: Path, capsys, monkeypatch
) -> None:
    monkeypatch.setattr(links, "SIZES", (4096, 16384, 65536))
    argv = [
        "probe",
        "--workers",
        "1",
        "--model",
        "mlp:16x1",
        "--runs-dir",
        str(tmp_path),
        "--name",
        "p",
    ]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "all_reduce" in out and "compute per step" in out and "compress auto: none" in out
    found = read_probe(tmp_path / "p" / "probe.json")
    assert found.world == 1 and found.model == "mlp:16x1" and found.batch_per_rank == 64
    assert set(found.links) == set(found.points) == set(links.COLLECTIVES)
    assert all([n for n, _ in pts] == [4096, 16384, 65536] for pts in found.points.values())
    assert "all_reduce_fp16" in out and "all_reduce_bf16" in out
    assert set(found.codec_s) == set(PROBED) and found.compute_s > 0
    # one bucket with the model's 4 tensors: 16 x 64, 16, 10 x 16, 10
    assert sorted(map(tuple, found.buckets[0])) == [(10,), (10, 16), (16,), (16, 64)]
    # what the file says the cost model chose is what the cost model chooses from it
    saved = json.loads((tmp_path / "p" / "probe.json").read_text())
    assert saved["choice"] == CostModel(found).choose()[0] == "none"  # one worker: nothing to save


def test_a_missing_or_damaged_probe_file_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(JimuError, match="does not exist; run jimu probe first"):
        read_probe(tmp_path / "probe.json")
    (tmp_path / "probe.json").write_text('{"world": 2}')
    with pytest.raises(JimuError, match="is damaged") as e:
        read_probe(tmp_path / "probe.json")
    assert "\n" not in str(e.value)


@pytest.mark.slow
@distributed_test(world_size=[2], preload=["torch._dynamo"])
def test_a_probed_step_counts_at_its_slowest_rank_on_every_rank(
    rank: int, world: int, tmp: str
) -> None:
    cfg = validate(RunConfig(strategy="ddp", workers=world, model="mlp:8x1", quiet=True,
                             runs_dir=tmp, name="w"))  # fmt: skip
    run = Run(cfg, Path(tmp) / "w", rank, world, measurer=ThisMachine())
    model = build_model(cfg.model, (64,), 10, seed=0)
    if rank == 1:  # only rank 1 is slow: 20 ms more per step
        model.register_forward_pre_hook(lambda *_: time.sleep(0.02))
    x, y = torch.randn(4, 64), torch.randint(0, 10, (4,))
    solo, _ = dist.new_subgroups(group_size=1)
    steps, _, _, plain = probe_module._time_options(["none", "fp16"], model, x, y, cfg, run,
                                                    solo, warm=1, rounds=3)  # fmt: skip
    dist.destroy_process_group(solo)
    assert min(steps.values()) >= 0.02  # rank 0 too reports rank 1's time
    assert len(plain) == 3 and min(plain) >= 0.02  # each round of the plain step, rank 1's
    assert run.gather_objects(steps) == [steps] * world


@pytest.mark.slow
@distributed_test(world_size=[2])
def test_each_all_gather_is_timed_once_at_its_own_size_on_every_rank(
    rank: int, world: int, tmp: str
) -> None:
    msgs = [("all_gather", 258_096), ("all_reduce", 4096), ("all_gather", 258_096),
            ("all_reduce_bf16", 6000), ("all_reduce", 0)]  # fmt: skip
    got = links.time_messages(msgs, torch.device("cpu"))
    assert set(got) == {"all_gather:258096"}  # all-reduce keeps its fit (TIMED_AT_SIZE)
    assert all(t > 0 for t in got.values())
    gathered: list[dict[str, float] | None] = [None] * world
    dist.all_gather_object(gathered, got)
    assert gathered == [got] * world  # the slowest rank's times, on every rank


@pytest.mark.slow
@distributed_test(world_size=[2, 3])
def test_reduce_scatter_is_timed_only_when_asked_and_only_up_to_the_sizes_asked(
    rank: int, world: int, tmp: str
) -> None:
    points = links.measure_links(torch.device("cpu"), 1.0, ["reduce_scatter"], 5000)
    assert list(points) == ["reduce_scatter"]
    # two sizes at least, then those up to 4 times the largest message
    assert [n for n, _ in points["reduce_scatter"]] == [4096, 16384]
    assert all(t > 0 for _, t in points["reduce_scatter"])
    assert "reduce_scatter" not in links.COLLECTIVES  # jimu probe keeps its time


@pytest.mark.slow
@distributed_test(world_size=[2])
def test_the_probes_pipeline_model_parallel_and_ddp_steps_are_the_strategies_own(
    rank: int, world: int, tmp: str
) -> None:
    cfg = validate(RunConfig(strategy="ddp", workers=world, model="mlp:8x2", quiet=True,
                             batch_size=8, runs_dir=tmp, name="w"))  # fmt: skip
    run = Run(cfg, Path(tmp) / "w", rank, world, measurer=ThisMachine())
    run.balance = "2,1"  # the pipeline cuts the model as the run's resolved --balance says
    model = build_model(cfg.model, (16,), 4, seed=0)
    assert len(model) == 3
    if rank == 1:  # the last stage, one block: 5 ms more per forward
        model[2].register_forward_pre_hook(lambda *_: time.sleep(0.005))
    data = load_dataset(
        "synthetic", DataOptions(synthetic_n=40, synthetic_features=16, synthetic_classes=4)
    )
    before = model.state_dict()
    steps = probe_module._time_strategies(model, data, cfg, run, 4, rounds=1, steps=2)
    probed = ["ddp", "fsdp", "tp", "model-parallel", "pipeline"]  # the registry's, in order
    assert list(steps) == probed
    assert run.gather_objects(steps) == [steps] * world  # the slowest rank's, on every rank
    pipe = steps["pipeline"]
    assert pipe.sizes == [2, 1]  # cut as the run's resolved --balance says
    assert pipe.rows == 2 and pipe.microbatches == PROBE_MICROBATCHES  # 8 rows in 4 of 2
    assert pipe.step_s >= PROBE_MICROBATCHES * 0.005  # each micro-batch's forward on rank 1
    # model-parallel's own step: the whole batch of 8 rows, one forward on rank 1
    chain = steps["model-parallel"]
    assert (chain.sizes, chain.rows, chain.microbatches) == ([2, 1], 8, 1)
    assert 0.005 <= chain.step_s < pipe.step_s
    # the ddp strategy's own step, its all-reduce included: rank 1's sleep on both ranks
    assert steps["ddp"] == TimedStep(steps["ddp"].step_s, [], 4, 1)
    assert steps["ddp"].step_s >= 0.005
    # fsdp on its shard of the batch (4 rows a rank, as ddp), tp on the whole batch
    assert (steps["fsdp"].rows, steps["tp"].rows) == (4, 8)
    assert steps["fsdp"].step_s > 0 and steps["tp"].step_s > 0
    # the run's own counters hold none of the probe's messages, its model is untouched
    assert run.stats.bytes_sent == 0 and run.stats.bytes_recv == 0
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in before.items())
    # fewer blocks than ranks: no split strategy runs the model, none is timed
    few = probe_module._time_strategies(model[:1], data, cfg, run, 4, rounds=1, steps=2)
    assert list(few) == ["ddp", "fsdp"]  # nor tp, which pairs Linear layers
