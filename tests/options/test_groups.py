"""The option groups: each option declared once, checked by its group, read only by the strategies that take it."""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

import pytest

from deepjimu.config import ConfigErrors, RunConfig, option_fields, read_toml
from deepjimu.flags import add_options
from deepjimu.options import (
    GROUPS,
    AdmmGroup,
    AdmmOptions,
    DataGroup,
    KfacGroup,
    OptimGroup,
    RunGroup,
    SyncGroup,
    group_of,
    narrow,
)
from deepjimu.strategies import get_strategy, strategy_names
from deepjimu.strategies.registry import applies, entry


def test_every_option_is_declared_by_exactly_one_group() -> None:
    declared = [f.name for g in GROUPS for f in g.options()]
    assert len(declared) == len(set(declared))
    assert declared == [f.name for f in option_fields()]  # RunConfig is the groups, in order


@pytest.mark.parametrize("name", strategy_names())
def test_a_strategy_takes_exactly_the_groups_whose_options_apply_to_it(name: str) -> None:
    taken = {f.name for f in dataclasses.fields(entry(name).options)}
    for f in option_fields():
        strategies = applies(f.name).strategies
        if group_of(f.name) is DataGroup:
            continue  # the engine reads the data options; no strategy does
        may_apply = not strategies or name in strategies
        # every option that may apply to it is handed to it (by value, equal to the run's)
        assert (f.name in taken) == may_apply or (f.name in taken and group_of(f.name).universal), (
            f.name
        )


def test_a_strategy_is_handed_only_its_groups() -> None:
    cfg = RunConfig(strategy="admm", rho=2.0, lr=0.5, kfac_damping=0.3)
    strategy = get_strategy("admm")(cfg)
    assert type(strategy.cfg) is AdmmOptions and strategy.cfg.rho == 2.0
    for other in ("lr", "kfac_damping", "compress", "dataset"):
        with pytest.raises(AttributeError):
            getattr(strategy.cfg, other)
    ddp = get_strategy("ddp")(RunConfig(strategy="ddp", lr=0.5, sync_plan="sfb"))
    assert (ddp.cfg.lr, ddp.cfg.sync_plan) == (0.5, "sfb")
    assert isinstance(ddp.cfg, SyncGroup) and isinstance(ddp.cfg, KfacGroup)
    assert not isinstance(ddp.cfg, AdmmGroup)
    with pytest.raises(dataclasses.FrozenInstanceError):
        ddp.cfg.lr = 1.0  # type: ignore[misc]


@pytest.mark.parametrize("group", GROUPS, ids=lambda g: g.__name__)
def test_each_group_checks_its_own_values_alone(group: type) -> None:
    # a group built alone has only its own options: its checks read nothing else
    assert group().problems() == []
    bad = {
        RunGroup: {"workers": 0, "eval_every": 0},
        DataGroup: {"val_fraction": 1.5, "patch": 2},
        OptimGroup: {"lr": -1.0, "momentum": 1.0},
        AdmmGroup: {"rho": 0.0, "admm_init": "zeros"},
        KfacGroup: {"kfac_damping": 0.0},
        SyncGroup: {"local_sgd": -1, "compress_start": -1},
    }.get(group, {"microbatches": 0})
    problems = group(**bad).problems()
    assert len(problems) == len(bad), problems
    for name in bad:
        assert any(p.startswith(name.replace("_", "-")) or name in p for p in problems), name


def test_the_run_config_adds_the_checks_between_groups() -> None:
    cfg = RunConfig(strategy="ddp", optimizer="kfac", sync_plan="ps")
    assert all(g.problems(cfg) == [] for g in GROUPS)
    (line,) = cfg.problems()
    assert line.startswith("sync-plan ps synchronises each tensor its own way")


def test_narrow_keeps_values_and_enum_members() -> None:
    cfg = RunConfig(strategy="admm", rho=0.3, precision="bf16", seed=4)
    opts = narrow(cfg, AdmmOptions)
    assert (opts.rho, opts.seed, opts.precision) == (0.3, 4, cfg.precision)
    assert narrow(opts, AdmmGroup) == AdmmGroup(rho=0.3)


def test_help_has_a_section_per_group() -> None:
    parser = argparse.ArgumentParser()
    add_options(parser, note="any option")
    sections = {g.title: {a.dest for a in g._group_actions} for g in parser._action_groups}
    for group in GROUPS:
        assert sections[f"{group.title} options"] == {f.name for f in group.options()}


def _toml(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "run.toml"
    path.write_text(text)
    return path


def test_a_toml_table_holds_its_groups_options(tmp_path: Path) -> None:
    path = _toml(tmp_path, "epochs = 3\n[admm]\nrho = 0.5\n[optim]\nlr = 0.1\n[run]\nseed = 2\n")
    assert read_toml(path) == {"epochs": 3, "rho": 0.5, "lr": 0.1, "seed": 2}
    with pytest.raises(ConfigErrors) as e:
        read_toml(_toml(tmp_path, "[admm]\nlr = 0.1\nrho = 1\n[logging]\nseed = 1\n"))
    assert e.value.problems == [
        f"{path}: [admm] has no option 'lr' (it belongs in [optim])",
        f"{path}: unknown table [logging] (the option groups: [run], [data], [optim], "
        "[pipeline], [admm], [kfac], [sync])",
    ]
    with pytest.raises(ConfigErrors, match="unknown option 'rhoo'"):
        read_toml(_toml(tmp_path, "[admm]\nrhoo = 1\n"))


def test_the_sample_config_reads() -> None:
    values = read_toml(Path(__file__).resolve().parents[2] / "examples" / "run.toml")
    assert values["strategy"] == "admm" and values["checkpoint_every"] == 10
