"""Where options apply: an option given for a run where it does not apply ends in one line."""

from __future__ import annotations

import argparse
import functools
import json
from pathlib import Path
from typing import Any

import pytest
import torch

from deepjimu import fit
from deepjimu.applies import Applies
from deepjimu.bench.matrix import BENCH_FLAGS
from deepjimu.choices import Family
from deepjimu.cli import main
from deepjimu.config import ConfigErrors, RunConfig, option_fields
from deepjimu.data import dataset_names
from deepjimu.errors import JimuError
from deepjimu.flags import add_options
from deepjimu.models import build_model
from deepjimu.strategies import get_strategy, strategy_names
from deepjimu.strategies.registry import applies
from deepjimu.validation import validate

GRAPHS = "graph data sets (citeseer, cora, pubmed, sbm)"
GRADIENT = "strategies local, ddp, fsdp, tp, model-parallel, pipeline"


def _given(run: dict[str, Any], options: dict[str, Any]) -> RunConfig:
    """``run`` and ``options`` as if both were given as flags."""
    return RunConfig(**run, **options, given=dict.fromkeys([*run, *options], "flag"))


# (the run, the options given, the refusal or None where they apply)
CASES: list[tuple[dict[str, Any], dict[str, Any], str | None]] = [
    ({}, {"graph_hops": 3}, f"--graph-hops applies to {GRAPHS}; dataset digits is not one"),
    ({"dataset": "cora"}, {"graph_hops": 3}, None),
    ({"dataset": "sbm"}, {"graph_features": "concat"}, None),
    ({}, {"graph_hops": 2}, f"--graph-hops applies to {GRAPHS}; dataset digits is not one"),
    (
        {},
        {"split": "random"},
        "--split applies to data sets cora, citeseer, pubmed; dataset digits is not one",
    ),
    ({"dataset": "citeseer"}, {"split": "random"}, None),
    (
        {"dataset": "sbm"},
        {"split": "random"},
        "--split applies to data sets cora, citeseer, pubmed; dataset sbm is not one",
    ),
    (
        {"dataset": "cora"},
        {"val_fraction": 0.2},
        "--val-fraction applies to data sets cifar10, digits, eurosat, eurosat-ms, "
        "fashion-mnist, kmnist, mnist, bow, indian-pines, landsat-spectra, pavia-u, synthetic, "
        "tensors, sbm; dataset cora is not one",
    ),
    ({"dataset": "sbm"}, {"val_fraction": 0.2}, None),
    (
        {},
        {"synthetic_n": 500},
        "--synthetic-n applies to data sets synthetic, sbm, bow, synthetic-text; dataset digits is not one",
    ),
    ({"dataset": "sbm"}, {"synthetic_n": 500, "sbm_degree": 5.0}, None),
    (
        {"dataset": "synthetic"},
        {"sbm_homophily": 0.5},
        "--sbm-homophily applies to data set sbm; dataset synthetic is not one",
    ),
    ({"dataset": "mnist"}, {"downsample": 2}, None),
    ({"dataset": "pavia-u"}, {"patch": 5, "train_fraction": 0.05, "download": True}, None),
    ({"dataset": "eurosat-ms"}, {"train_fraction": 0.6, "downsample": 2}, None),
    (
        {"dataset": "landsat-spectra"},
        {"patch": 3},
        "--patch applies to data sets indian-pines, pavia-u; dataset landsat-spectra is not one",
    ),
    (
        {"dataset": "landsat-spectra"},
        {"download": True},
        "--download applies to data sets mnist, fashion-mnist, kmnist, cifar10, cora, citeseer, "
        "pubmed, shakespeare-char, eurosat, eurosat-ms, indian-pines, pavia-u; dataset "
        "landsat-spectra is not one",
    ),
    (
        {},
        {"train_fraction": 0.5},
        "--train-fraction applies to data sets eurosat, eurosat-ms, indian-pines, pavia-u, "
        "landsat-spectra; dataset digits is not one",
    ),
    (
        {"dataset": "synthetic"},
        {"downsample": 2},
        "--downsample applies to image and tensor data sets (cifar10, digits, eurosat, "
        "eurosat-ms, fashion-mnist, kmnist, mnist, tensors); dataset synthetic is not one",
    ),
    (
        {"strategy": "local"},
        {"admm_batch": 512},
        "--admm-batch applies to strategy admm; strategy local is not one",
    ),
    ({"strategy": "admm"}, {"admm_batch": 512, "admm_aux": "restart"}, None),
    (
        {"strategy": "admm"},
        {"admm_memory": 0.5},
        "--admm-memory applies to strategy admm with --admm-batch > 0; this run has admm-batch 0",
    ),
    (
        {"strategy": "ddp"},
        {"quantize": 8},
        "--quantize applies to strategy admm; strategy ddp is not one",
    ),
    (
        {"strategy": "admm"},
        {"compress": "fp16"},
        "--compress applies to strategy ddp; strategy admm is not one",
    ),
    (
        {"strategy": "admm"},
        {"compress": "none"},
        "--compress applies to strategy ddp; strategy admm is not one",
    ),
    ({"strategy": "ddp"}, {"compress": "fp16"}, None),
    (
        {"strategy": "ddp"},
        {"error_feedback": False},
        "--error-feedback applies to strategy ddp with --compress powersgd, topk or auto; "
        "this run has compress none",
    ),
    ({"strategy": "ddp"}, {"compress": "topk:0.1", "error_feedback": False}, None),
    (
        {"strategy": "ddp", "compress": "topk"},
        {"warm_start": False},
        "--warm-start applies to strategy ddp with --compress powersgd or auto; "
        "this run has compress topk",
    ),
    (
        {"strategy": "ddp"},
        {"local_sgd_warmup": 3},
        "--local-sgd-warmup applies to strategy ddp with --local-sgd > 0; this run has local-sgd 0",
    ),
    (
        {"strategy": "local"},
        {"schedule": "1f1b"},
        "--schedule applies to strategy pipeline; strategy local is not one",
    ),
    ({"strategy": "pipeline"}, {"schedule": "1f1b", "microbatches": 8}, None),
    (
        {"strategy": "local"},
        {"balance": "1,2"},
        "--balance applies to strategies ddp, fsdp, model-parallel, pipeline, admm; strategy local is not one",
    ),
    (
        {"strategy": "local"},
        {"kfac_damping": 0.2},
        "--kfac-damping applies to strategies local, ddp with --optimizer kfac; "
        "this run has optimizer adam",
    ),
    ({"strategy": "local", "optimizer": "kfac"}, {"kfac_damping": 0.2}, None),
    (
        {"strategy": "pipeline"},
        {"optimizer": "kfac"},
        "--optimizer kfac applies to strategies local, ddp; strategy pipeline is not one",
    ),
    ({"strategy": "pipeline"}, {"optimizer": "sgd", "momentum": 0.5}, None),
    (
        {"strategy": "local"},
        {"momentum": 0.5},
        f"--momentum applies to {GRADIENT} with --optimizer sgd or kfac; "
        "this run has optimizer adam",
    ),
    ({"strategy": "admm"}, {"lr": 0.1}, f"--lr applies to {GRADIENT}; strategy admm is not one"),
    (
        {"strategy": "admm"},
        {"batch_size": 32},
        f"--batch-size applies to {GRADIENT}; strategy admm is not one",
    ),
    ({"strategy": "admm", "dataset": "cora"}, {"seed": 3, "epochs": 5, "normalize": True}, None),
]


@pytest.mark.parametrize(("run", "options", "refusal"), CASES)
def test_an_option_given_where_it_does_not_apply_is_one_line(
    run: dict[str, Any], options: dict[str, Any], refusal: str | None
) -> None:
    cfg = _given(run, options)
    if refusal is None:
        validate(cfg)
        return
    with pytest.raises(ConfigErrors) as e:
        validate(cfg)
    assert e.value.problems == [refusal]


def test_only_given_options_are_checked_never_defaults() -> None:
    # an admm run's lr, filled by validation, is no refusal when nobody gave it
    cfg = validate(RunConfig(strategy="admm", epochs=2, given={"epochs": "flag"}))
    assert cfg.lr is not None and cfg.given == {"epochs": "flag"}
    assert validate(cfg).lr == cfg.lr  # and a validated config validates again
    # a RunConfig built in Python without `given`: what differs from the defaults was given
    with pytest.raises(ConfigErrors, match="--graph-hops applies to graph data sets"):
        validate(RunConfig(graph_hops=3))
    assert validate(RunConfig(graph_hops=2)).given == {}


def test_a_value_out_of_range_where_the_option_does_not_apply_is_one_line() -> None:
    with pytest.raises(ConfigErrors) as e:
        validate(_given({"strategy": "local"}, {"quantize": 3}))
    assert e.value.problems == ["--quantize applies to strategy admm; strategy local is not one"]


def test_the_cli_names_the_flag_and_the_toml_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(["train", "--graph-hops", "3"]) == 2
    err = capsys.readouterr().err
    assert err == f"error: --graph-hops applies to {GRAPHS}; dataset digits is not one\n"
    toml = tmp_path / "run.toml"
    toml.write_text('strategy = "local"\n[admm]\nadmm-batch = 512\n')
    assert main(["train", "--config", str(toml)]) == 2
    err = capsys.readouterr().err
    assert err == f"error: {toml}: admm-batch applies to strategy admm; strategy local is not one\n"
    assert not (tmp_path / "runs").exists()


def test_a_resume_is_not_refused_for_its_saved_options(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = tmp_path / "r"
    common = ["--quiet", "--runs-dir", str(tmp_path)]
    argv = ["train", "--strategy", "admm", "--workers", "1", "--model", "mlp:16x1"]
    assert main([*argv, "--epochs", "1", "--name", "r", *common]) == 0
    saved = json.loads((run / "config.json").read_text())
    assert saved["lr"] is not None  # every option is saved, lr too, which admm does not read
    assert main(["train", "--resume", str(run), "--epochs", "2", "--quiet"]) == 0
    assert json.loads((run / "config.json").read_text())["epochs"] == 2
    capsys.readouterr()
    # what this command line gives is checked as ever
    assert main(["train", "--resume", str(run), "--epochs", "3", "--lr", "0.1"]) == 2
    assert (
        capsys.readouterr().err == f"error: --lr applies to {GRADIENT}; strategy admm is not one\n"
    )


def _tensors() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return torch.rand(120, 8, generator=g), torch.randint(0, 3, (120,), generator=g)


def test_fit_names_the_keyword(tmp_path: Path) -> None:
    x, y = _tensors()
    factory = functools.partial(build_model, "mlp:8x1", (8,), 3, seed=0)
    with pytest.raises(JimuError) as e:
        fit("local", factory, x, y, graph_hops=3)
    assert str(e.value) == (
        f"fit keyword graph_hops applies to {GRAPHS}; dataset tensors is not one"
    )
    with pytest.raises(JimuError, match="fit keyword rho applies to strategy admm"):
        fit("ddp", factory, x, y, workers=2, rho=0.5)
    fitted = fit("local", factory, x, y, epochs=1, lr=0.01, run_dir=tmp_path / "f")
    saved = json.loads((tmp_path / "f" / "config.json").read_text())
    assert saved["given"] == {"epochs": "fit", "lr": "fit"}
    assert fitted.summary["epochs"] == 1


def test_bench_flags_and_tuned_values_apply_to_every_strategy() -> None:
    for name in BENCH_FLAGS:  # every run of a bench gets them
        assert applies(name).everywhere, name
    for strategy in strategy_names():
        for setting in get_strategy(strategy).tune_space(RunConfig(strategy=strategy), 3):
            validate(_given({"strategy": strategy}, setting))


def test_every_declaration_names_what_exists() -> None:
    datasets = set(dataset_names()) | set(Family.spellings())
    for f in option_fields():
        where: Applies = applies(f.name)
        assert set(where.strategies) <= set(strategy_names()), f.name
        assert set(where.data) <= datasets, f.name
        for value, stricter in where.values:
            assert value in (f.metadata["choices"] or ()), f.name
            assert set(stricter.strategies) <= set(strategy_names()), f.name


def test_help_says_where_each_flag_applies() -> None:
    parser = argparse.ArgumentParser()
    add_options(parser)
    helps = {a.dest: a.help or "" for a in parser._actions}
    assert helps["graph_hops"].endswith("(for graph data; default: 2)")
    assert helps["admm_memory"].endswith(
        "(for strategy admm with --admm-batch > 0; default: 0.8 for MLPs, 0 for CNNs)"
    )
    assert (
        "(for strategies local, ddp with --optimizer kfac; default: 0.1)" in helps["kfac_damping"]
    )
    assert "kfac: strategies local, ddp" in helps["optimizer"]
    assert helps["seed"].endswith("(default: 0)")  # everywhere: nothing to say
