"""--precision: the process-wide TF32 switches, bf16 autocast in the strategies that support it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from deepjimu.config import RunConfig
from deepjimu.errors import JimuError
from deepjimu.launch import train
from deepjimu.precision import autocast, matmul_precision

FAST = {"model": "mlp:64x2", "epochs": 8, "quiet": True, "lr": 3e-3}


def _switches() -> tuple[str, str]:
    return torch.backends.cuda.matmul.fp32_precision, torch.backends.cudnn.conv.fp32_precision


@pytest.mark.parametrize(("precision", "inside"), [("tf32", "tf32"), ("fp32", "ieee")])
def test_cuda_switches_are_set_for_the_run_and_restored(precision: str, inside: str) -> None:
    before = _switches()
    with matmul_precision(precision, torch.device("cuda")):
        assert _switches() == (inside, inside)
    assert _switches() == before


def test_cpu_runs_leave_the_switches_alone_and_refuse_tf32() -> None:
    before = _switches()
    with matmul_precision("bf16", torch.device("cpu")):
        assert _switches() == before
    refused = matmul_precision("tf32", torch.device("cpu"))
    with pytest.raises(JimuError, match="--precision tf32 needs a CUDA device"), refused:
        pass


def test_autocast_makes_only_bf16_matmuls_bfloat16() -> None:
    a = torch.ones(4, 4)
    with autocast("bf16", torch.device("cpu")):
        assert (a @ a).dtype == torch.bfloat16
    with autocast("fp32", torch.device("cpu")):
        assert (a @ a).dtype == torch.float32


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusals of a CPU-only machine")
@pytest.mark.parametrize(
    ("changes", "expected"),
    [
        ({"precision": "tf32"}, "--precision tf32 needs a CUDA device"),
        ({"device": "cuda"}, "--device cuda needs one GPU per worker (GPUs: 0"),
    ],
)
def test_a_device_this_machine_lacks_is_one_line_before_the_run_folder(
    tmp_path: Path, changes: dict, expected: str
) -> None:
    for workers in (1, 2):
        cfg = RunConfig(strategy="admm", workers=workers, runs_dir=str(tmp_path), **changes)
        with pytest.raises(JimuError, match=re.escape(expected)) as e:
            train(cfg)
        assert "\n" not in str(e.value)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
@pytest.mark.parametrize(("strategy", "workers"), [("local", 1), ("ddp", 2)])
def test_bf16_training_matches_fp32_accuracy(tmp_path: Path, strategy: str, workers: int) -> None:
    # rows split evenly: --balance auto splits them by speeds measured on a loaded machine,
    # which would make the two runs differ in more than their precision
    split = {"balance": "even"} if workers > 1 else {}
    runs = {
        p: train(
            RunConfig(
                strategy=strategy,
                workers=workers,
                precision=p,
                runs_dir=str(tmp_path),
                name=p,
                **split,
                **FAST,
            )
        )
        for p in ("fp32", "bf16")
    }
    fp32, bf16 = runs["fp32"], runs["bf16"]
    assert fp32 is not None and bf16 is not None
    assert bf16["test_acc"] >= 0.9
    assert abs(bf16["test_acc"] - fp32["test_acc"]) <= 0.02, (bf16["test_acc"], fp32["test_acc"])
    assert bf16["loss"] != fp32["loss"]  # the bf16 run really computed in bfloat16
