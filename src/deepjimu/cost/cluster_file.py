"""A cluster file: the TOML description of machines that are not here, read into a :class:`~deepjimu.cost.cluster.Cluster`, and a cluster as JSON.

Pure: no torch. Examples in ``examples/clusters/``.
"""

from __future__ import annotations

import dataclasses
import math
import sys
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python 3.10 only
    import tomli as tomllib

from deepjimu.cost.cluster import PRECISIONS, Cluster, Device, Link
from deepjimu.errors import JimuError, one_line

__all__ = ["cluster_to_dict", "read_cluster"]

# units of the TOML file -> SI
_TERA = 1e12
_GIGA = 1e9
_MICRO = 1e-6

_TOP_KEYS = (
    "name", "nodes", "ranks_per_node", "cores_per_node", "device", "intra", "inter", "speeds",
)  # fmt: skip
_DEVICE_KEYS = ("name", "memory_gb", "efficiency", "speed", "tflops")
_LINK_KEYS = ("latency_us", "bandwidth_gbit")


class _File:
    """One cluster file's checks; every failure is one :class:`JimuError` line naming it."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def fail(self, message: str) -> JimuError:
        return JimuError(f"{self.path}: {message}")

    def table(
        self,
        raw: dict[str, Any],
        key: str,
        label: str,
        known: tuple[str, ...],
        what: str = "key",
    ) -> Any:
        """``raw[key]`` as a table with only ``known`` keys; None when absent."""
        value = raw.get(key)
        if value is None:
            return None
        if not isinstance(value, dict):
            raise self.fail(f"{label} must be a table ([{label}]) ({label}: {value!r})")
        self.known_keys(value, f"[{label}]", known, what)
        return value

    def known_keys(
        self, table: dict[str, Any], where: str, known: tuple[str, ...], what: str = "key"
    ) -> None:
        for key in table:
            if key not in known:
                raise self.fail(f"unknown {what} {key!r} in {where} (known: {', '.join(known)})")

    def get(self, table: dict[str, Any], key: str, label: str, want: str) -> Any:
        if key not in table:
            raise self.fail(f"{label} is missing (expected {want})")
        return table[key]

    def text(self, table: dict[str, Any], key: str, label: str) -> str:
        value = self.get(table, key, label, "text")
        if not isinstance(value, str):
            raise self.fail(f"{label} must be text ({label}: {value!r})")
        return value

    def whole(self, table: dict[str, Any], key: str, label: str) -> int:
        want = "a positive whole number"
        value = self.get(table, key, label, want)
        # bool is an int in Python; `nodes = true` is a mistake, not 1
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise self.fail(f"{label} must be {want} ({label}: {value!r})")
        return value

    def speeds(self, table: dict[str, Any]) -> tuple[float, ...]:
        """``speeds``, if given: a list of numbers in (0, 1] (their count is the cluster's
        to check)."""
        value = table.get("speeds", [])
        if not isinstance(value, list):
            raise self.fail(f"speeds must be a list of numbers in (0, 1] (speeds: {value!r})")
        return tuple(
            self.number({"v": v}, "v", f"speeds[{i}]", at_most_one=True)
            for i, v in enumerate(value)
        )

    def number(
        self,
        table: dict[str, Any],
        key: str,
        label: str,
        default: float | None = None,
        zero_ok: bool = False,
        at_most_one: bool = False,
    ) -> float:
        if zero_ok:
            want = "a number >= 0"
        elif at_most_one:
            want = "a number in (0, 1]"
        else:
            want = "a positive number"
        value = (
            table.get(key, default) if default is not None else self.get(table, key, label, want)
        )
        ok = (
            isinstance(value, (int, float))
            and not isinstance(value, bool)
            and math.isfinite(value)
            and (value >= 0 if zero_ok else value > 0)
            and (value <= 1 or not at_most_one)
        )
        if not ok:
            raise self.fail(f"{label} must be {want} ({label}: {value!r})")
        return float(value)

    def link(self, raw: dict[str, Any], key: str) -> Link | None:
        t = self.table(raw, key, key, _LINK_KEYS)
        if t is None:
            return None
        alpha = self.number(t, "latency_us", f"{key}.latency_us", zero_ok=True) * _MICRO
        gbit = self.number(t, "bandwidth_gbit", f"{key}.bandwidth_gbit")
        return Link(alpha_s=alpha, bytes_per_s=gbit * _GIGA / 8)

    def device(self, raw: dict[str, Any]) -> Device:
        t = self.table(raw, "device", "device", _DEVICE_KEYS)
        if t is None:
            raise self.fail("device is missing (expected a [device] table)")
        tflops = self.table(t, "tflops", "device.tflops", PRECISIONS, "precision")
        if not tflops:
            raise self.fail(
                f"device.tflops is missing (expected a [device.tflops] table with "
                f"one or more of {', '.join(PRECISIONS)})"
            )
        return Device(
            name=self.text(t, "name", "device.name"),
            flops={k: self.number(tflops, k, f"device.tflops.{k}") * _TERA for k in tflops},
            memory_bytes=round(self.number(t, "memory_gb", "device.memory_gb") * _GIGA),
            efficiency=self.number(t, "efficiency", "device.efficiency", 0.6, at_most_one=True),
            speed=self.number(t, "speed", "device.speed", 1.0),
        )


def read_cluster(path: str | Path) -> Cluster:
    """Read a cluster TOML file (units: tflops, memory_gb = 1e9 bytes, latency_us,
    bandwidth_gbit = 1e9 bit/s) into a :class:`Cluster` in SI units.

    Required: ``name``, ``nodes``, ``ranks_per_node``, ``[device]`` (``name``,
    ``memory_gb``, ``[device.tflops]`` with one or more of fp32, tf32, bf16) and
    ``[intra]`` (``latency_us``, ``bandwidth_gbit``); ``[inter]`` too when nodes > 1.
    Optional: ``cores_per_node`` (CPU clusters), ``device.efficiency`` (0.6),
    ``device.speed`` (1), ``speeds`` (one factor in (0, 1] per rank: a mixed cluster whose
    rank r computes at ``speeds[r]`` of the device's rate).

    Args:
        path: the TOML file.

    Returns:
        The cluster, with ``source`` the path.

    Raises:
        JimuError: one line naming the file, the field, the bad value and what is expected:
            missing or unreadable file, bad TOML, unknown key, wrong type, a number out of
            range, a missing field or table.

    Example:
        >>> read_cluster("examples/clusters/h100-node.toml").world
        8
    """
    p = Path(path)
    try:
        raw = tomllib.loads(p.read_text())
    except FileNotFoundError:
        raise JimuError(f"cluster file {p} does not exist") from None
    except (OSError, UnicodeDecodeError) as e:
        raise JimuError(f"cluster file {p} cannot be read: {one_line(e)}") from None
    except tomllib.TOMLDecodeError as e:
        raise JimuError(f"cluster file {p} is not valid TOML: {one_line(e)}") from None
    f = _File(p)
    f.known_keys(raw, "the top level", _TOP_KEYS)
    name = f.text(raw, "name", "name")
    nodes = f.whole(raw, "nodes", "nodes")
    ranks_per_node = f.whole(raw, "ranks_per_node", "ranks_per_node")
    cores = f.whole(raw, "cores_per_node", "cores_per_node") if "cores_per_node" in raw else None
    device = f.device(raw)
    intra = f.link(raw, "intra")
    if intra is None:
        raise f.fail("intra is missing (expected an [intra] table: the link inside a node)")
    # inter missing for nodes > 1: Cluster says so, naming this file as its source
    return Cluster(
        name=name,
        nodes=nodes,
        ranks_per_node=ranks_per_node,
        device=device,
        intra=intra,
        inter=f.link(raw, "inter"),
        cores_per_node=cores,
        source=str(p),
        speeds=f.speeds(raw),
    )


def cluster_to_dict(c: Cluster) -> dict[str, Any]:
    """The cluster as JSON-able values in SI units (FLOP/s, bytes, seconds, bytes/s), with
    ``world`` added, for plan.json. An infinite bandwidth (a probe link whose time did not
    grow with size) becomes None: JSON has no infinity.

    Example:
        >>> c = read_cluster("examples/clusters/h100-node.toml")
        >>> d = cluster_to_dict(c)
        >>> d["world"], d["intra"]["bytes_per_s"]
        (8, 450000000000.0)
    """
    return {**_finite(dataclasses.asdict(c)), "world": c.world}


def _finite(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value
