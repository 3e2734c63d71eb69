"""``jimu bench``: strategies x worker counts on the same data and seed (work in progress)."""

from __future__ import annotations

import argparse

from deepjimu.errors import JimuError


def add_bench_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--name", default=None)


def bench_from_args(args: argparse.Namespace) -> None:
    raise JimuError("jimu bench is not built yet")
