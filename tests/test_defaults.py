"""Defaults per data family: applied where the user gave nothing, printed, recorded, kept on resume."""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path
from typing import Any

import pytest

from deepjimu.choices import Family
from deepjimu.cli import main
from deepjimu.config import RunConfig
from deepjimu.data import datasets_of
from deepjimu.defaults import FAMILY_DEFAULTS, table_defaults
from deepjimu.flags import add_options
from deepjimu.strategies import strategy_names
from deepjimu.strategies.registry import ENTRIES, entry
from deepjimu.validation import defaults_line, does_not_apply, gather, resolve_defaults, validate

# an sbm graph small enough for a run of a few seconds (the graph family, no files)
SBM = ["--dataset", "sbm", "--synthetic-n", "200", "--synthetic-features", "8"]
SBM += ["--synthetic-classes", "3", "--model", "mlp:8x1", "--strategy", "local"]


@pytest.fixture
def graph_table(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """A graph row for every strategy, and admm's own (its registry entry's); the row for
    every strategy is returned, for a test to change."""
    row = {"epochs": 2, "graph_hops": 1}
    monkeypatch.setitem(FAMILY_DEFAULTS, Family.GRAPH, row)
    own = entry("admm").family_defaults
    monkeypatch.setitem(own, Family.GRAPH, {"admm_momentum": 0.5, "epochs": 3})  # type: ignore[index]
    return row


def test_every_entry_of_the_table_is_an_option_that_applies() -> None:
    """A misspelt or misplaced entry would be dropped silently; none is (an entry may apply
    by another of its row, as text data's --warmup-steps by its --lr-schedule cosine)."""
    rows = [(f, strategy_names(), row) for f, row in FAMILY_DEFAULTS.items()]
    rows += [(f, [e.name], row) for e in ENTRIES for f, row in e.family_defaults.items()]
    for family, runs, row in rows:
        dataset = datasets_of(family)[0]
        cfgs = [RunConfig(strategy=s, dataset=dataset, **row) for s in runs]
        for name in row:
            assert any(does_not_apply(name, c) is None for c in cfgs), (family, runs, name)


def test_the_family_default_is_applied_where_nothing_was_given(graph_table: dict) -> None:
    admm = validate(RunConfig(dataset="sbm", strategy="admm", given={}))
    assert (admm.epochs, admm.graph_hops, admm.admm_momentum) == (3, 1, 0.5)
    local = validate(RunConfig(dataset="cora", strategy="local", given={}))
    # the admm row is admm's only, and admm's options never reach a gradient strategy
    assert (local.epochs, local.graph_hops, local.admm_momentum) == (2, 1, None)
    cfg = RunConfig(dataset="cora", strategy="local", given={})
    assert resolve_defaults(cfg, gather(cfg))[1] == {"epochs": 2, "graph_hops": 1}


def test_the_user_wins_over_the_table_and_the_table_over_the_rest(graph_table: dict) -> None:
    given = {"graph_hops": "flag", "epochs": "flag"}
    cfg = validate(RunConfig(dataset="sbm", strategy="admm", graph_hops=2, epochs=5, given=given))
    # a flag wins, also one that repeats the option's own default
    assert (cfg.graph_hops, cfg.epochs, cfg.admm_momentum) == (2, 5, 0.5)
    # in Python without `given`: a value set is the user's
    assert validate(RunConfig(dataset="sbm", graph_hops=4)).graph_hops == 4
    # other families: the model kind's auto (None) and the strategy's defaults, as before
    digits = validate(RunConfig(strategy="admm", given={}))
    assert (digits.epochs, digits.admm_momentum, digits.graph_hops) == (30, None, 2)


def test_the_tables_keep_the_other_families_as_they_were() -> None:
    """Only graph data (issue 27: once the graph study fills its row) and text data (the
    GPT of nanoGPT's CPU example) change defaults."""
    for family in set(Family) - {Family.GRAPH, Family.TEXT}:
        for strategy in strategy_names():
            assert table_defaults(family, entry(strategy).family_defaults) == {}, (family, strategy)


def test_the_line_is_printed_recorded_and_kept_by_a_resume(
    graph_table: dict, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = tmp_path / "g"
    assert main(["train", *SBM, "--runs-dir", str(tmp_path), "--name", "g"]) == 0
    out = capsys.readouterr().out
    assert out.count("defaults for graph data: epochs 2, graph-hops 1\n") == 1
    saved = json.loads((run / "config.json").read_text())
    assert (saved["epochs"], saved["graph_hops"]) == (2, 1)
    assert "epochs" not in saved["given"] and "graph_hops" not in saved["given"]
    # the table changes; the resumed run keeps what it ran with, and says nothing of it
    graph_table.clear()
    graph_table["graph_hops"] = 3
    assert main(["train", "--resume", str(run), "--epochs", "3"]) == 0
    assert "defaults for" not in capsys.readouterr().out
    saved = json.loads((run / "config.json").read_text())
    assert (saved["epochs"], saved["graph_hops"]) == (3, 1)


def test_the_line_is_not_printed_quiet_or_before_an_error(
    graph_table: dict, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["train", *SBM, "--runs-dir", str(tmp_path)]
    assert main([*argv, "--lr", "-1"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1
    assert main([*argv, "--quiet", "--name", "q"]) == 0
    assert "defaults for" not in capsys.readouterr().out
    assert defaults_line(RunConfig(dataset="sbm", given={})) == (
        "defaults for graph data: epochs 3, graph-hops 1, admm-momentum 0.5"
    )
    assert defaults_line(RunConfig(dataset="digits", given={})) is None


def test_help_names_the_table_values(graph_table: dict[str, Any]) -> None:
    parser = argparse.ArgumentParser()
    add_options(parser)
    helps = {a.dest: a.help or "" for a in parser._actions}
    assert helps["epochs"].endswith("(default: 30; graph data: 2, graph data with admm: 3)")
    assert helps["admm_momentum"].endswith(
        "default: 0.7 for MLPs, 0.5 for CNNs; graph data with admm: 0.5)"
    )
    assert helps["seed"].endswith("(default: 0)")


def test_help_names_each_default_once_and_every_model_kind() -> None:
    from deepjimu.models.spec import _SPEC_HELP

    parser = argparse.ArgumentParser()
    add_options(parser)
    helps = {a.dest: a.help or "" for a in parser._actions}
    # a None that the run fills in names what fills it, once
    assert helps["workers"] == "number of worker processes (default: 2; strategy local: 1)"
    assert helps["name"] == "run folder name under --runs-dir (default: strategy-dataset-time)"
    assert "(default: 30; graph data: " in helps["epochs"]
    kinds = r"\b(mlp|cnn|lenet|resnet|gcn|embed)\b"
    assert set(re.findall(kinds, helps["model"])) == set(re.findall(kinds, _SPEC_HELP)), helps
