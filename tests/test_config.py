"""Config: flags, TOML, validation with one line per bad field."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from deepjimu.cli import main
from deepjimu.config import ConfigErrors, RunConfig, coerce, load_config, read_toml
from deepjimu.errors import JimuError
from deepjimu.validation import validate


def test_validate_fills_strategy_defaults() -> None:
    cfg = validate(RunConfig(strategy="local"))
    assert (cfg.workers, cfg.epochs, cfg.lr) == (1, 30, 1e-3)
    assert validate(RunConfig(strategy="ddp", optimizer="sgd")).lr == 0.05
    assert validate(RunConfig(strategy="ddp")).workers == 2
    assert validate(RunConfig(strategy="local", optimizer="kfac")).lr == 0.05
    ok = RunConfig(strategy="ddp", workers=3, optimizer="kfac", kfac_grad_workers=0.33)
    assert validate(ok).kfac_grad_workers == 0.33  # 1 of 3 workers


@pytest.mark.parametrize(
    ("changes", "expected"),
    [
        ({"strategy": "nope"}, "unknown strategy 'nope'"),
        ({"dataset": "nope"}, "unknown dataset 'nope'"),
        ({"workers": 0}, "workers must be >= 1 (workers: 0)"),
        ({"lr": -0.1}, "lr must be a positive number (lr: -0.1)"),
        ({"lr": float("nan")}, "lr must be a positive number"),
        ({"epochs": 0}, "epochs must be >= 1"),
        ({"batch_size": 0}, "batch-size must be >= 1"),
        ({"model": "mlp:abc"}, "unknown model spec 'mlp:abc'"),
        ({"strategy": "admm", "quantize": 3}, "quantize must be 0, 2, 4, 8 or 16 (quantize: 3)"),
        ({"strategy": "admm", "rho": 0.0}, "rho must be a positive number"),
        (
            {"strategy": "local", "workers": 2},
            "strategy local runs on at most 1 worker(s) (workers: 2)",
        ),
        (
            {"strategy": "ddp", "workers": 4, "batch_size": 2},
            "batch-size must be >= workers for ddp",
        ),
        ({"name": "a/b"}, "name must be a plain folder name"),
        ({"classes": [1]}, "classes must name at least 2 classes"),
        ({"device": "tpu"}, "device must be one of auto, cpu, cuda"),
        ({"precision": "fp16"}, "precision must be one of fp32, tf32, bf16"),
        ({"precision": "tf32", "device": "cpu"}, "precision tf32 needs --device cuda"),
        (
            {"strategy": "pipeline", "workers": 2, "precision": "bf16"},
            "strategy pipeline does not support --precision bf16 (supported: fp32, tf32)",
        ),
        # kfac (issue 12)
        (
            {"optimizer": "kfac", "kfac_damping": 0.0},
            "kfac-damping must be a positive number (kfac-damping: 0.0)",
        ),
        (
            {"optimizer": "kfac", "kfac_inv_every": 0},
            "kfac-inv-every must be >= 1 (kfac-inv-every: 0)",
        ),
        (
            {"optimizer": "kfac", "kfac_factor_every": 0},
            "kfac-factor-every must be >= 1 (kfac-factor-every: 0)",
        ),
        ({"optimizer": "kfac", "kfac_kl_clip": -1.0}, "kfac-kl-clip must be >= 0"),
        ({"optimizer": "kfac", "kfac_factor_decay": 1.0}, "kfac-factor-decay must be in [0, 1)"),
        (
            {"strategy": "admm", "optimizer": "kfac"},
            "--optimizer applies to strategies local, ddp, fsdp, tp, model-parallel, pipeline; "
            "strategy admm is not one",
        ),
        (
            {"strategy": "pipeline", "workers": 2, "optimizer": "kfac"},
            "--optimizer kfac applies to strategies local, ddp; strategy pipeline is not one",
        ),
        (
            {"strategy": "ddp", "workers": 2, "optimizer": "kfac", "kfac_grad_workers": 0.25},
            "kfac-grad-workers must be in [1/workers, 1] = [0.5, 1] (kfac-grad-workers: 0.25, workers: 2)",
        ),
        (
            {"optimizer": "kfac", "kfac_grad_workers": 0.5},
            "kfac-grad-workers must be in [1/workers, 1] = [1, 1]",
        ),
        (
            {"strategy": "ddp", "workers": 3, "optimizer": "kfac", "kfac_grad_workers": 2 / 3},
            "kfac-grad-workers times workers must be a whole divisor of workers",
        ),
        ({"dataset": "cora", "split": "full"}, "split must be one of public, random (got 'full')"),
        ({"dataset": "cora", "graph_hops": -1}, "graph-hops must be >= 0 (graph-hops: -1)"),
        (
            {"dataset": "indian-pines", "train_fraction": 1.0},
            "train-fraction must be in (0, 1) (train-fraction: 1.0)",
        ),
        (
            {"dataset": "pavia-u", "patch": 4},
            "patch must be 0 or an odd window size (patch: 4)",
        ),
        ({"dataset": "sbm", "sbm_degree": 0.0}, "sbm-degree must be > 0 and below synthetic-n - 1"),
        (
            {"dataset": "sbm", "sbm_homophily": 1.5},
            "sbm-homophily must be in [0, 1] (sbm-homophily: 1.5)",
        ),
        (
            {"model": "gcn"},
            "model gcn needs a graph data set (citeseer, cora, pubmed, sbm; dataset: digits)",
        ),
        (
            {"strategy": "ddp", "model": "gcn:8", "dataset": "cora"},
            "model gcn:8 trains on the whole graph: only --strategy local runs it (strategy: ddp)",
        ),
        (
            {"strategy": "admm", "model": "gcn", "dataset": "sbm"},
            "only --strategy local runs it (strategy: admm)",
        ),
    ],
)
def test_each_bad_field_gives_one_line(changes: dict, expected: str) -> None:
    base = {"strategy": "local"} | changes
    with pytest.raises(ConfigErrors) as e:
        validate(RunConfig(**base))
    assert len(e.value.problems) == 1, e.value.problems
    assert expected in e.value.problems[0]
    assert "\n" not in e.value.problems[0]


def test_several_bad_fields_are_all_reported() -> None:
    with pytest.raises(ConfigErrors) as e:
        validate(RunConfig(strategy="local", workers=0, lr=-1.0, epochs=0))
    assert len(e.value.problems) == 3


def test_coerce_types_and_errors() -> None:
    assert coerce("workers", "3", "flag") == 3
    assert coerce("lr", "1e-3", "flag") == 1e-3
    assert coerce("classes", "0,1,7", "flag") == [0, 1, 7]
    assert coerce("quiet", "yes", "flag") is True
    with pytest.raises(JimuError, match=r"flag: workers must be a whole number \(got 'two'\)"):
        coerce("workers", "two", "flag")
    with pytest.raises(JimuError, match="epochs must be a whole number"):
        coerce("epochs", 2.5, "run.toml")
    with pytest.raises(JimuError, match="lr must be a number"):
        coerce("lr", "fast", "flag")
    with pytest.raises(JimuError, match="quiet must be true or false"):
        coerce("quiet", "maybe", "flag")
    with pytest.raises(JimuError, match="classes must be a list of whole numbers"):
        coerce("classes", "a,b", "flag")


def test_toml_flat_and_tables(tmp_path: Path) -> None:
    p = tmp_path / "run.toml"
    p.write_text('strategy = "ddp"\nbatch-size = 32\n[admm]\nrho = 0.5\nquantize = 8\n')
    cfg = load_config({"batch_size": 16}, str(p))
    assert (cfg.strategy, cfg.batch_size, cfg.rho, cfg.quantize) == ("ddp", 16, 0.5, 8)


def test_toml_errors_name_the_file_and_key(tmp_path: Path) -> None:
    p = tmp_path / "bad.toml"
    p.write_text('strategy = "ddp"\nwidth = 3\nworkers = "two"\n')
    with pytest.raises(ConfigErrors) as e:
        read_toml(p)
    assert e.value.problems == [
        f"{p}: unknown option 'width'",
        f"{p}: workers must be a whole number (got 'two')",
    ]
    p.write_text("strategy = \n")
    with pytest.raises(JimuError, match="is not valid TOML"):
        read_toml(p)
    with pytest.raises(JimuError, match="does not exist"):
        read_toml(tmp_path / "missing.toml")


# ddp: gradient compression and local SGD
@pytest.mark.parametrize(
    ("changes", "expected"),
    [
        ({"compress": "zip"}, "unknown compressor 'zip' (compress: zip; known:"),
        ({"compress": "powersgd:0"}, "rank must be >= 1 (compress: powersgd:0)"),
        ({"compress": "topk:0"}, "ratio must be in (0, 1] (compress: topk:0)"),
        ({"compress": "topk:2"}, "ratio must be in (0, 1] (compress: topk:2)"),
        ({"compress": "qsgd:1"}, "bits must be in 2..8 (compress: qsgd:1)"),
        ({"compress": "qsgd:16"}, "bits must be in 2..8 (compress: qsgd:16)"),
        (
            {"strategy": "admm", "compress": "fp16"},
            "--compress applies to strategy ddp; strategy admm is not one",
        ),
        (
            {"strategy": "pipeline", "local_sgd": 4},
            "--local-sgd applies to strategy ddp; strategy pipeline is not one",
        ),
        ({"strategy": "local", "compress": "auto"}, "--compress applies to strategy ddp;"),
        ({"compress": "fp16", "local_sgd": 4}, "local-sgd and compress cannot be combined"),
        ({"compress": "powersgd", "compress_start": 1}, "compress-start must be >= 2 for powersgd"),
        (
            {"compress": "topk", "compress_start": -1},
            "compress-start must be >= 0 (compress-start: -1)",
        ),
        ({"local_sgd": -2}, "local-sgd must be >= 0 (local-sgd: -2)"),
    ],
)
def test_each_bad_compress_option_gives_one_line(changes: dict, expected: str) -> None:
    with pytest.raises(ConfigErrors) as e:
        validate(RunConfig(**{"strategy": "ddp", **changes}))
    assert len(e.value.problems) == 1, e.value.problems
    assert expected in e.value.problems[0]
    assert "\n" not in e.value.problems[0]


def test_compress_options_that_are_fine() -> None:
    for changes in (
        {
            "compress": "powersgd:1",
            "compress_start": 1,
            "error_feedback": False,
            "warm_start": False,
        },
        {"compress": "topk:1", "compress_start": 0},
        {"compress": "auto"},
        {"local_sgd": 8, "local_sgd_warmup": 0},
    ):
        assert validate(RunConfig(strategy="ddp", **changes)).compress == changes.get(
            "compress", "none"
        )


def test_the_sample_toml_loads_and_runs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """examples/run.toml (the README's --config line) is a valid config that trains."""
    sample = Path(__file__).parents[1] / "examples" / "run.toml"
    values = read_toml(sample)
    assert values["strategy"] == "admm" and values["val_fraction"] == 0.1  # tables flattened
    argv = ["train", "--config", str(sample), "--epochs", "1", "--workers", "1"]
    assert main([*argv, "--quiet", "--runs-dir", str(tmp_path)]) == 0
    saved = json.loads((tmp_path / "sample" / "config.json").read_text())
    assert (saved["model"], saved["epochs"], saved["workers"]) == ("mlp:128x2", 1, 1)
    assert saved["given"]["rho"] == str(sample) and saved["given"]["epochs"] == "flag"
    assert "admm x1 on digits (mlp:128x2)" in capsys.readouterr().out
