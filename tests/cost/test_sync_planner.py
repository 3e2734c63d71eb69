"""The sync planner on hand-made probe figures: each tensor's choice follows the predicted times."""

from __future__ import annotations

import itertools
import json
import math

import pytest

from deepjimu.cost.cluster import Cluster, Device, Link, probed_cluster
from deepjimu.cost.probe import LinkFit
from deepjimu.cost.sync import (
    METHODS,
    SyncTrial,
    TensorInfo,
    format_plan,
    fused,
    method_messages,
    plan_sync,
    plan_to_dict,
    price,
)
from deepjimu.errors import JimuError


def _bandwidth_only(p: int, bytes_per_s: float = 1e9) -> Cluster:
    """A cluster whose every hop moves bytes at one rate, with no latency."""
    return Cluster("toy", 1, p, Device("d", {"fp32": 1.0}, 0), Link(0.0, bytes_per_s), None)


@pytest.mark.parametrize("p", [2, 3, 8])
def test_sfb_is_chosen_exactly_when_poseidons_inequality_holds_on_a_bandwidth_model(p: int) -> None:
    cluster = _bandwidth_only(p)
    seen = set()
    for m, n, k in itertools.product([10, 64, 300, 1000], [10, 64, 300, 1000], [1, 4, 16, 64]):
        w = TensorInfo("w", (m, n), "linear", rows=k)
        (entry,) = plan_sync([w], "auto", cluster, p)
        sfb_faster = entry.options["sfb"].seconds < entry.options["allreduce"].seconds
        assert (entry.method == "sfb") == sfb_faster
        if p * k * (m + n) != 2 * m * n:  # on the equality the times tie (within rounding)
            assert sfb_faster == (p * k * (m + n) < 2 * m * n), (m, n, k)
        seen.add(entry.method)
    assert seen == {"sfb", "allreduce"}  # the grid has both sides


def test_the_choice_is_the_fastest_predicted_method_with_latency_and_a_probe_fit() -> None:
    # a probe's fits: all-gather slower per byte than all-reduce, with latency
    fits = {
        "all_reduce": LinkFit(2e-4, 2e-9),
        "reduce_scatter": LinkFit(1e-4, 0.8e-9),
        "all_gather": LinkFit(1.5e-4, 3e-9),
    }
    cluster = probed_cluster(fits, 2, "cpu")
    tensors = [
        TensorInfo("emb.weight", (50_000, 64), "embedding", rows=300),
        TensorInfo("fc.weight", (4096, 4096), "linear", rows=16, rebuild_s=1e-3),
        TensorInfo("fc.bias", (4096,)),
        TensorInfo("out.weight", (10, 4096), "linear", rows=16),
        TensorInfo("dense.emb", (50_000, 64), "embedding", rows=50_000),
    ]
    entries = plan_sync(tensors, "auto", cluster, 2)
    small = sum(4 * t.numel for t in tensors if fused(t))  # fc.bias, out.weight
    assert small == 4 * (4096 + 10 * 4096)
    for t, e in zip(tensors, entries, strict=True):
        best = min(e.options.values(), key=lambda o: o.seconds)
        assert e.method == best.method
        assert e.seconds == best.seconds + (best.shared_s if t.name == "fc.bias" else 0.0)
        assert e.options[e.method] == price(t, e.method, cluster, 2, None, small)
    # the small tensors' all-reduces are their marginal costs in one fused message: its
    # time beyond the latency by bytes (fc.bias 1/11 of them, out.weight 10/11), and the
    # latency once, carried by the first of them, so that the entries sum to the message
    shares = [
        e.options["allreduce"].seconds for t, e in zip(tensors, entries, strict=True) if fused(t)
    ]
    whole, latency = cluster.all_reduce_s(small, 2), cluster.all_reduce_s(0, 2)
    assert latency > 0 and shares == pytest.approx(
        [(whole - latency) / 11, (whole - latency) * 10 / 11]
    )
    assert [e.method for e in entries][2:4] == ["allreduce", "allreduce"]
    assert entries[2].seconds + entries[3].seconds == pytest.approx(whole)
    assert [e.method for e in entries][:2] == ["sparse", "sfb"]
    assert entries[4].method != "sparse"  # every row touched: the dense methods are cheaper
    # a reduce-scatter fitted apart prices the sharded server, not all-reduce's hop
    ps = entries[2].options["ps"]
    assert ps.messages == (("reduce_scatter", 4 * 4096), ("all_gather", 4 * 2048))
    assert ps.seconds == pytest.approx(
        fits["reduce_scatter"].seconds(4 * 4096) + fits["all_gather"].seconds(4 * 2048)
    )


def test_the_fused_messages_latency_is_paid_once_by_the_plan_or_not_at_all() -> None:
    # latency-bound link: an all-reduce costs 1 ms plus 1 ns a byte, an all-gather 1.1 ms
    fits = {"all_reduce": LinkFit(1e-3, 1e-9), "all_gather": LinkFit(1.1e-3, 1e-9)}
    cluster = probed_cluster(fits, 2, "cpu")
    bias = TensorInfo("fc.bias", (64,))
    head = TensorInfo("out.weight", (10, 64), "linear", rows=1)
    # with the bias all-reduced anyway, adding the classifier costs its bytes only
    entries = plan_sync([bias, head], "auto", cluster, 2)
    assert [e.method for e in entries] == ["allreduce", "allreduce"]
    assert sum(e.seconds for e in entries) == pytest.approx(cluster.all_reduce_s(4 * 704, 2))
    # a probe's noise that makes the classifier's factors a little cheaper than a whole
    # all-reduce does not move it: its marginal cost in the fused message is far less
    noisy = probed_cluster({**fits, "all_gather": LinkFit(0.9e-3, 1e-9)}, 2, "cpu")
    entries = plan_sync([bias, head], "auto", noisy, 2)
    assert [e.method for e in entries] == ["allreduce", "allreduce"]
    # where every small tensor has a cheaper way than the whole message, none is sent
    cheap = probed_cluster({**fits, "all_gather": LinkFit(0.1e-3, 1e-9)}, 2, "cpu")
    entries = plan_sync([head], "auto", cheap, 2)
    assert [e.method for e in entries] == ["sfb"]
    assert entries[0].seconds == pytest.approx(cheap.all_gather_s(4 * 74, 2))
    # the JSON's single-method totals count the latency once as well
    d = plan_to_dict(plan_sync([bias, head], "allreduce", cluster, 2), "allreduce", 2)
    assert d["single_methods"]["allreduce"]["seconds"] == pytest.approx(d["seconds"])
    table = format_plan(plan_sync([bias, head], "auto", cluster, 2), "auto")
    assert (
        "2 small tensors in one all-reduce: its latency, 1.000 ms, counted once (on fc.bias)"
        in table
    )


def test_the_rebuild_time_can_turn_sfb_down() -> None:
    cluster = _bandwidth_only(2)
    cheap = TensorInfo("w", (1000, 1000), "linear", rows=10)
    (e,) = plan_sync([cheap], "auto", cluster, 2)
    assert e.method == "sfb"
    slow = TensorInfo("w", (1000, 1000), "linear", rows=10, rebuild_s=1.0)
    (e,) = plan_sync([slow], "auto", cluster, 2)
    assert e.method == "allreduce"


def test_a_single_method_takes_the_tensors_it_can_and_all_reduces_the_rest() -> None:
    cluster = _bandwidth_only(2)
    tensors = [
        TensorInfo("e", (100, 8), "embedding", rows=5),
        TensorInfo("w", (8, 8), "linear", rows=4),
        TensorInfo("b", (8,)),
    ]
    assert [e.method for e in plan_sync(tensors, "sfb", cluster, 2)] == [
        "allreduce",
        "sfb",
        "allreduce",
    ]
    assert [e.method for e in plan_sync(tensors, "sparse", cluster, 2)] == [
        "sparse",
        "allreduce",
        "allreduce",
    ]
    assert [e.method for e in plan_sync(tensors, "ps", cluster, 2)] == ["ps"] * 3
    with pytest.raises(JimuError, match="sync-plan must be one of"):
        plan_sync(tensors, "gossip", cluster, 2)


def test_message_bytes_follow_each_methods_formula() -> None:
    p = 3
    assert method_messages(TensorInfo("b", (10,)), "allreduce", p) == [("all_reduce", 40)]
    # padded to 12 entries: 48 bytes reduce-scattered, a 16-byte shard gathered
    assert method_messages(TensorInfo("b", (10,)), "ps", p) == [
        ("reduce_scatter", 48),
        ("all_gather", 16),
    ]
    w = TensorInfo("w", (5, 7), "linear", rows=4)
    assert method_messages(w, "sfb", p) == [("all_gather", 4 * 4 * (5 + 7))]
    e = TensorInfo("e", (100, 8), "embedding", rows=6)
    assert method_messages(e, "sparse", p) == [("all_gather", 8), ("all_gather", 4 * 6 * 9)]
    # gloo's own sparse all-reduce: the counts, then int64 indices and the values apart
    native = TensorInfo("e", (100, 8), "embedding", rows=6, native=True)
    assert method_messages(native, "sparse", p) == [
        ("all_gather", 8),
        ("all_gather", 8 * 6),
        ("all_gather", 4 * 6 * 8),
    ]
    with pytest.raises(ValueError, match="does not apply"):
        method_messages(TensorInfo("b", (10,)), "sfb", p)


def test_the_plan_as_table_and_json() -> None:
    cluster = _bandwidth_only(2)
    tensors = [
        TensorInfo("fc.weight", (1000, 1000), "linear", rows=10),
        TensorInfo("fc.bias", (1000,)),
    ]
    entries = plan_sync(tensors, "auto", cluster, 2)
    table = format_plan(entries, "auto")
    assert "fc.weight" in table and "1000x1000" in table and "sfb" in table
    assert table.splitlines()[-1].startswith("sync-plan auto: allreduce 1, sfb 1")
    assert "in one all-reduce" not in table  # no latency on this link
    d = plan_to_dict(entries, "auto", 2)
    assert d["bytes"] == sum(e.nbytes for e in entries)
    assert d["single_methods"]["allreduce"]["bytes"] == 4 * (1000 * 1000 + 1000)
    assert set(d["single_methods"]) == set(METHODS)
    assert d["tensors"][0]["method"] == "sfb" and d["tensors"][0]["shape"] == [1000, 1000]


def test_jimu_plan_prints_and_saves_the_sync_plan_of_ddp_rows(tmp_path, capsys) -> None:
    from deepjimu.cli import main

    argv = ["plan", "--strategies", "local,ddp", "--workers", "2", "--models", "mlp:4096x3"]
    argv += ["--batch-size", "32", "--sync-plan", "auto,allreduce", "--out", str(tmp_path / "p")]
    assert main([*argv, "--cluster", "examples/clusters/h100-2nodes.toml"]) == 0
    out = capsys.readouterr().out
    assert "ddp x2 mlp:4096x3 sync-plan=auto: sync plan" in out
    assert "sync-plan=allreduce: sync plan" not in out  # DDP's buckets: no per-tensor plan
    rows = json.loads((tmp_path / "p" / "plan.json").read_text())["rows"]
    auto = next(r for r in rows if r["options"].get("sync_plan") == "auto")
    plain = next(r for r in rows if r["options"].get("sync_plan") == "allreduce")
    # on this cluster, at 16 rows per rank, the 4096 x 4096 weights go as sufficient factors
    assert auto["sync_plan"]["methods"]["sfb"] == 2
    assert auto["predicted"]["step_s"] < plain["predicted"]["step_s"]
    assert auto["predicted"]["bytes_per_sample"] < plain["predicted"]["bytes_per_sample"]
    assert auto["sync_plan"]["kept"] == "plan"


def test_a_planned_auto_row_is_ddps_unless_its_plan_is_predicted_faster_past_the_margin(
    tmp_path, capsys
) -> None:
    # a small MLP on one H100 node: nothing a per-tensor method saves beats DDP's buckets
    # by 2%, so the row is DDP's own prediction, as the run's trial would keep DDP
    from deepjimu.cli import main

    argv = ["plan", "--strategies", "ddp", "--workers", "2", "--models", "mlp:64x1"]
    argv += ["--batch-size", "32", "--sync-plan", "auto,allreduce", "--out", str(tmp_path / "p")]
    assert main([*argv, "--cluster", "examples/clusters/h100-node.toml"]) == 0
    assert "the row is DDP's, as the run's own trial would keep DDP" in capsys.readouterr().out
    rows = json.loads((tmp_path / "p" / "plan.json").read_text())["rows"]
    auto = next(r for r in rows if r["options"].get("sync_plan") == "auto")
    plain = next(r for r in rows if r["options"].get("sync_plan") == "allreduce")
    assert auto["sync_plan"]["kept"] == "DDP"
    assert auto["predicted"] == plain["predicted"]


def test_a_trial_keeps_the_plan_only_where_it_beats_ddp_past_the_noise() -> None:
    steady = (1.0,) * 9
    assert SyncTrial((0.9,) * 9, steady).keeps_plan  # 10% faster in every round
    assert not SyncTrial((0.99,) * 9, steady).keeps_plan  # within the 2% margin
    assert not SyncTrial((1.2,) * 9, steady).keeps_plan
    # faster by 10% at the median, but in 6 rounds of 9: fewer than 9/2 + 3, noise can do it
    mixed = SyncTrial((0.8, 0.85, 0.9, 0.9, 0.9, 0.95, 1.1, 1.2, 1.3), steady)
    assert mixed.ratio == pytest.approx(0.9) and mixed.wins == 6 and not mixed.keeps_plan
    assert mixed.spread == pytest.approx(0.05)
    # the same steps with one more round the plan won: 8 of 9 is past the noise
    won = SyncTrial((0.8, 0.85, 0.9, 0.9, 0.9, 0.95, 0.97, 0.96, 1.3), steady)
    assert won.wins == 8 and won.keeps_plan and won.to_dict()["kept"] == "plan"
    # over many rounds the sign test alone would take a 63% majority (38 of 60, past
    # 30 + 7.7); a plan must win three rounds of four: 45 of 60
    tie = SyncTrial((0.9,) * 38 + (1.1,) * 22, (1.0,) * 60)
    assert tie.wins >= 30 + math.sqrt(60) and tie.ratio < 0.98 and not tie.keeps_plan
    assert SyncTrial((0.9,) * 45 + (1.1,) * 15, (1.0,) * 60).keeps_plan
    assert not SyncTrial((0.9,) * 44 + (1.1,) * 16, (1.0,) * 60).keeps_plan
