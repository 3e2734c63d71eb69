"""deepjimu.cost.cluster: ring costs, probe links, and reading cluster TOML files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from deepjimu.cost.cluster import Cluster, Device, Link, links_from_probe
from deepjimu.cost.cluster_file import cluster_to_dict, read_cluster
from deepjimu.cost.probe import LinkFit
from deepjimu.errors import JimuError

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "clusters"

GPU = Device("g", {"fp32": 1e12, "bf16": 4e12}, 2**30, efficiency=0.5)
INTRA = Link(alpha_s=1e-5, bytes_per_s=1e9)
INTER = Link(alpha_s=1e-4, bytes_per_s=1e8)


def two_by_two(collectives: dict[str, Link] | None = None) -> Cluster:
    """2 nodes of 2 ranks: p = 2 stays on node 0, p = 4 crosses to node 1."""
    return Cluster("t", 2, 2, GPU, INTRA, INTER, collectives=collectives or {})


def test_world_and_placement_node_by_node() -> None:
    c = two_by_two()
    assert c.world == 4
    assert [c.node_of(r) for r in range(4)] == [0, 0, 1, 1]
    with pytest.raises(JimuError, match=r"rank must be in 0\.\.3 .*\(rank: 4\)"):
        c.node_of(4)


def test_one_rank_communicates_nothing() -> None:
    c = two_by_two()
    assert c.all_reduce_s(10**6, 1) == 0.0
    assert c.all_gather_s(10**6, 1) == 0.0
    assert c.reduce_scatter_s(10**6, 1) == 0.0
    assert c.p2p_s(10**6, 3, 3) == 0.0


def test_ring_on_one_node_uses_intra() -> None:
    c = two_by_two()
    n = 10**6
    # p = 2: 2(p-1) = 2 hops, 2(p-1)/p = 1 of the message over 1 GB/s
    assert c.all_reduce_s(n, 2) == pytest.approx(2e-5 + 1e-3)
    assert c.all_gather_s(n, 2) == pytest.approx(1e-5 + 1e-3)
    assert c.reduce_scatter_s(n, 2) == pytest.approx(1e-5 + 0.5e-3)


def test_ring_across_nodes_uses_inter() -> None:
    c = two_by_two()
    n = 10**6
    # p = 4 spans both nodes: the slowest hop is inter (100 us, 0.1 GB/s)
    assert c.hop("all_reduce", 4) == INTER
    assert c.all_reduce_s(n, 4) == pytest.approx(6 * 1e-4 + 1.5 * 1e-2)
    assert c.all_gather_s(n, 4) == pytest.approx(3 * 1e-4 + 3 * 1e-2)
    assert c.reduce_scatter_s(n, 4) == pytest.approx(3 * 1e-4 + 0.75 * 1e-2)


def test_a_probed_collective_overrides_intra_only() -> None:
    fast = Link(0.0, 1e12)
    c = two_by_two(collectives={"all_reduce_bf16": fast})
    assert c.hop("all_reduce_bf16", 2) == fast
    assert c.hop("all_reduce", 2) == INTRA
    assert c.hop("all_reduce_bf16", 4) == INTER


def test_p2p_by_placement() -> None:
    c = two_by_two()
    assert c.p2p_s(1000, 0, 1) == pytest.approx(1e-5 + 1e-6)
    assert c.p2p_s(1000, 1, 2) == pytest.approx(1e-4 + 1e-5)


def test_p_outside_the_cluster_is_refused() -> None:
    c = two_by_two()
    for p in (0, 5):
        with pytest.raises(JimuError, match=rf"must be 1\.\.4 on cluster 't' \(p: {p}\)"):
            c.all_reduce_s(100, p)


def test_more_than_one_node_needs_inter() -> None:
    with pytest.raises(JimuError, match=r"inter is missing.*\(nodes: 2\)"):
        Cluster("t", 2, 2, GPU, INTRA, None)


def test_matmul_seconds_and_unknown_precision() -> None:
    assert GPU.matmul_s(1e12) == pytest.approx(2.0)
    assert GPU.matmul_s(4e12, "bf16") == pytest.approx(2.0)
    with pytest.raises(JimuError) as e:
        GPU.matmul_s(1.0, "tf32")
    assert "\n" not in str(e.value)
    assert "'tf32'" in str(e.value) and "known: fp32, bf16" in str(e.value)


def test_cores_shared_by_ranks_on_a_cpu_cluster() -> None:
    cpu = Device("c", {"fp32": 1e11}, 2**30)
    c = Cluster("vm", 2, 3, cpu, INTRA, INTER, cores_per_node=2)
    # ranks fill node 0 first: 1, 2 or 3 ranks there, never more
    assert [c.ranks_sharing_cores(p) for p in (1, 2, 3, 6)] == [1.0, 1.0, 1.5, 1.5]
    assert [c.threads_per_rank(p) for p in (1, 2, 3, 6)] == [2, 1, 1, 1]
    gpus = two_by_two()
    assert gpus.ranks_sharing_cores(4) == 1.0
    assert gpus.threads_per_rank(4) is None


@pytest.mark.parametrize("p", [2, 4])
def test_probe_links_give_back_the_fit_at_the_probes_world(p: int) -> None:
    fits = {
        "all_reduce": LinkFit(3e-4, 2e-9),
        "all_reduce_fp16": LinkFit(2e-4, 1e-9),
        "all_reduce_bf16": LinkFit(2e-4, 1.1e-9),
        "all_gather": LinkFit(1e-4, 5e-10),
        "reduce_scatter": LinkFit(2e-4, 8e-10),
    }
    c = Cluster("probe", 1, 4, GPU, INTRA, None, collectives=links_from_probe(fits, p))
    for n in (4096, 10**6, 64 * 2**20):
        for name in ("all_reduce", "all_reduce_fp16", "all_reduce_bf16"):
            assert c.all_reduce_s(n, p, name) == pytest.approx(fits[name].seconds(n))
        assert c.all_gather_s(n, p) == pytest.approx(fits["all_gather"].seconds(n))
        rs = c.reduce_scatter_s(n, p, "reduce_scatter")
        assert rs == pytest.approx(fits["reduce_scatter"].seconds(n))


def test_probe_links_follow_the_ring_at_another_world() -> None:
    alpha, beta, n = 3e-4, 2e-9, 10**6
    links = links_from_probe(
        {"all_reduce": LinkFit(alpha, beta), "all_gather": LinkFit(alpha, beta)}, 4
    )
    c = Cluster("probe", 1, 8, GPU, INTRA, None, collectives=links)
    # all-reduce at p = 4: 6 hops, B = 1.5 / beta; at p = 8: 14 hops, 7/4 of n
    assert c.all_reduce_s(n, 8) == pytest.approx(14 * alpha / 6 + 7 / 4 * n * beta / 1.5)
    assert c.all_reduce_s(n, 2) == pytest.approx(2 * alpha / 6 + n * beta / 1.5)
    # all-gather at p = 4: 3 hops, B = 3 / beta; at p = 8: 7 hops, 7 n
    assert c.all_gather_s(n, 8) == pytest.approx(7 * alpha / 3 + 7 * n * beta / 3)


def test_probe_links_need_two_ranks_and_known_collectives() -> None:
    with pytest.raises(JimuError, match=r"\(world: 1\)"):
        links_from_probe({"all_reduce": LinkFit(1e-4, 1e-9)}, 1)
    with pytest.raises(JimuError, match=r"'broadcast'"):
        links_from_probe({"broadcast": LinkFit(1e-4, 1e-9)}, 2)


def test_read_h100_node() -> None:
    c = read_cluster(EXAMPLES / "h100-node.toml")
    assert (c.nodes, c.ranks_per_node, c.world) == (1, 8, 8)
    assert c.device.flops == {"fp32": 67e12, "tf32": 494.7e12, "bf16": 989.4e12}
    assert c.device.memory_bytes == 80 * 10**9
    assert c.device.efficiency == 0.6
    assert (c.intra.alpha_s, c.intra.bytes_per_s) == (pytest.approx(3e-6), 450e9)
    assert c.inter is None and c.cores_per_node is None
    assert c.source == str(EXAMPLES / "h100-node.toml")


def test_read_h100_two_nodes() -> None:
    c = read_cluster(EXAMPLES / "h100-2nodes.toml")
    assert (c.nodes, c.world) == (2, 16)
    assert c.inter is not None
    assert (c.inter.alpha_s, c.inter.bytes_per_s) == (pytest.approx(5e-6), 50e9)
    assert c.hop("all_reduce", 8) == c.intra
    assert c.hop("all_reduce", 9) == c.inter


def test_read_here_2cores() -> None:
    c = read_cluster(EXAMPLES / "here-2cores.toml")
    assert (c.world, c.cores_per_node) == (3, 2)
    assert c.device.flops == {"fp32": pytest.approx(1e11)}
    assert (c.intra.alpha_s, c.intra.bytes_per_s) == (pytest.approx(5e-5), 2.5e9)
    assert c.ranks_sharing_cores(3) == 1.5


def test_cluster_to_dict_is_json_in_si_units() -> None:
    c = read_cluster(EXAMPLES / "h100-2nodes.toml")
    d = json.loads(json.dumps(cluster_to_dict(c), allow_nan=False))
    assert d["world"] == 16
    assert d["device"]["flops"]["bf16"] == 989.4e12
    assert d["inter"] == {"alpha_s": pytest.approx(5e-6), "bytes_per_s": 50e9}
    # a probe fit whose time did not grow with size: infinite bandwidth, no JSON infinity
    probed = two_by_two(collectives=links_from_probe({"all_gather": LinkFit(1e-4, 0.0)}, 2))
    d = json.loads(json.dumps(cluster_to_dict(probed), allow_nan=False))
    assert d["collectives"]["all_gather"] == {"alpha_s": 1e-4, "bytes_per_s": None}


BASE = """\
name = "t"
nodes = 1
ranks_per_node = 2
[device]
name = "d"
memory_gb = 1
[device.tflops]
fp32 = 1
[intra]
latency_us = 1
bandwidth_gbit = 8
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "c.toml"
    path.write_text(text)
    return path


def test_the_base_file_reads(tmp_path: Path) -> None:
    # the file that each bad-field case below breaks in one place
    c = read_cluster(write(tmp_path, BASE))
    assert (c.world, c.device.flops, c.intra) == (2, {"fp32": 1e12}, Link(1e-6, 1e9))
    assert c.rank_speeds(2) == [1.0, 1.0]
    mixed = read_cluster(write(tmp_path, BASE.replace("nodes = 1", "nodes = 1\nspeeds = [1, 0.5]")))
    assert mixed.rank_speeds(2) == [1.0, 0.5]


@pytest.mark.parametrize(
    ("old", "new", "expected"),
    [
        # unknown keys, with the known ones listed
        ("nodes = 1", "nodse = 1", ["unknown key 'nodse'", "(known: name, nodes, ranks_per_node"]),
        ('name = "d"', 'name = "d"\ncolour = 1', ["unknown key 'colour' in [device]", "memory_gb"]),
        (
            "fp32 = 1",
            "fp16 = 1",
            ["unknown precision 'fp16' in [device.tflops]", "fp32, tf32, bf16"],
        ),
        # wrong types
        ("nodes = 1", 'nodes = "two"', ["nodes must be a positive whole number (nodes: 'two')"]),
        ("nodes = 1", "nodes = 1.5", ["nodes must be a positive whole number (nodes: 1.5)"]),
        ("nodes = 1", "nodes = true", ["nodes must be a positive whole number (nodes: True)"]),
        ('name = "t"', "name = 3", ["name must be text (name: 3)"]),
        (
            "memory_gb = 1",
            'memory_gb = "1"',
            ["device.memory_gb must be a positive number (device.memory_gb: '1')"],
        ),
        (
            '[device]\nname = "d"\nmemory_gb = 1\n[device.tflops]\nfp32 = 1\n',
            "device = 3\n",
            ["device must be a table ([device]) (device: 3)"],
        ),
        # a mixed cluster's speeds: one in (0, 1] per rank
        (
            "nodes = 1",
            "nodes = 1\nspeeds = [1, 2]",
            ["speeds[1] must be a number in (0, 1] (speeds[1]: 2)"],
        ),
        (
            "nodes = 1",
            "nodes = 1\nspeeds = 0.5",
            ["speeds must be a list of numbers in (0, 1] (speeds: 0.5)"],
        ),
        (
            "nodes = 1",
            "nodes = 1\nspeeds = [1]",
            ["speeds must give one factor in (0, 1] per rank, 2 in all (speeds: [1.0])"],
        ),
        # numbers out of range
        (
            "ranks_per_node = 2",
            "ranks_per_node = 0",
            ["ranks_per_node must be a positive whole number (ranks_per_node: 0)"],
        ),
        (
            "nodes = 1",
            "nodes = 1\ncores_per_node = -2",
            ["cores_per_node must be a positive whole number (cores_per_node: -2)"],
        ),
        (
            "memory_gb = 1",
            "memory_gb = -1",
            ["device.memory_gb must be a positive number (device.memory_gb: -1)"],
        ),
        (
            "fp32 = 1",
            "fp32 = 0",
            ["device.tflops.fp32 must be a positive number (device.tflops.fp32: 0)"],
        ),
        (
            "memory_gb = 1",
            "memory_gb = 1\nefficiency = 1.5",
            ["device.efficiency must be a number in (0, 1] (device.efficiency: 1.5)"],
        ),
        (
            "memory_gb = 1",
            "memory_gb = 1\nspeed = 0",
            ["device.speed must be a positive number (device.speed: 0)"],
        ),
        (
            "latency_us = 1",
            "latency_us = -1",
            ["intra.latency_us must be a number >= 0 (intra.latency_us: -1)"],
        ),
        (
            "bandwidth_gbit = 8",
            "bandwidth_gbit = 0",
            ["intra.bandwidth_gbit must be a positive number (intra.bandwidth_gbit: 0)"],
        ),
        (
            "bandwidth_gbit = 8",
            "bandwidth_gbit = inf",
            ["intra.bandwidth_gbit must be a positive number (intra.bandwidth_gbit: inf)"],
        ),
        # missing fields and tables
        ('name = "t"\n', "", ["name is missing (expected text)"]),
        ("memory_gb = 1\n", "", ["device.memory_gb is missing (expected a positive number)"]),
        ("[device.tflops]\nfp32 = 1\n", "", ["device.tflops is missing"]),
        ("[intra]\nlatency_us = 1\nbandwidth_gbit = 8\n", "", ["intra is missing"]),
        ("nodes = 1", "nodes = 2", ["inter is missing", "(nodes: 2)"]),
    ],
)
def test_a_bad_field_is_one_line_naming_file_field_and_value(
    tmp_path: Path, old: str, new: str, expected: list[str]
) -> None:
    assert old in BASE
    path = write(tmp_path, BASE.replace(old, new, 1))
    with pytest.raises(JimuError) as e:
        read_cluster(path)
    message = str(e.value)
    assert "\n" not in message
    assert message.startswith(f"{path}: ")
    for part in expected:
        assert part in message


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(JimuError, match=r"cluster file .*nope\.toml does not exist"):
        read_cluster(tmp_path / "nope.toml")


def test_broken_toml(tmp_path: Path) -> None:
    path = write(tmp_path, "nodes = \n")
    with pytest.raises(JimuError) as e:
        read_cluster(path)
    assert "\n" not in str(e.value)
    assert str(e.value).startswith(f"cluster file {path} is not valid TOML: ")
    assert "line 1" in str(e.value)  # tomllib's own message
