"""Layering: every module imports alone (no cycle), and the light entry points stay light."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from processes import env

# every test here starts processes (workers, a CLI run) or trains whole runs
pytestmark = pytest.mark.slow

SRC = Path(__file__).resolve().parents[1] / "src"


def _modules() -> list[str]:
    out = []
    for path in sorted((SRC / "deepjimu").rglob("*.py")):
        parts = path.relative_to(SRC).with_suffix("").parts
        out.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return out


def _python(code: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code), *args],
        capture_output=True,
        text=True,
        env=env(),
        timeout=600,
    )


def test_every_module_imports_alone() -> None:
    # One interpreter loads the third-party libraries once; each module is then imported in
    # a fork of it that holds no deepjimu module yet, as `python -c "import deepjimu.X"` would.
    r = _python(
        """
        import importlib, os, sys, traceback
        import matplotlib.pyplot, numpy, scipy.sparse, sklearn.datasets, torch, tqdm.auto
        import torch.distributed.pipelining  # seconds to load; every fork would pay it
        import torch._dynamo, torch.distributed.checkpoint.state_dict  # likewise
        import torch.distributed.fsdp, torch.distributed.tensor.parallel

        def child(name):
            try:
                importlib.import_module(name)
                code = 0
            except BaseException:
                traceback.print_exc()
                code = 1
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)

        running, failed = {}, []
        for name in sys.argv[1:] + [None]:
            while running and (name is None or len(running) == 2):
                pid, status = os.wait()
                if status:
                    failed.append(running[pid])
                del running[pid]
            if name is not None:
                pid = os.fork()
                if pid == 0:
                    child(name)
                running[pid] = name
        print("failed:", " ".join(sorted(failed)))
        """,
        *_modules(),
    )
    assert r.returncode == 0 and r.stdout.strip() == "failed:", r.stdout + r.stderr[-3000:]


def test_light_entry_points_load_no_more_than_they_need() -> None:
    r = _python(
        """
        import ast, sys
        import deepjimu
        assert "torch" not in sys.modules, "import deepjimu loaded torch"
        from deepjimu.cli import build_parser
        build_parser()
        assert "torch" not in sys.modules, "the CLI's parser loaded torch (torchrun's thread plan must come first)"

        # the cost models are pure: every module of deepjimu.cost, and the strategy registry
        # that names their predictors, loads without torch
        import importlib, pkgutil
        import deepjimu.cost, deepjimu.cost.predict
        for package in (deepjimu.cost, deepjimu.cost.predict):
            for found in pkgutil.iter_modules(package.__path__, package.__name__ + "."):
                importlib.import_module(found.name)
        import deepjimu.strategies.registry
        assert "torch" not in sys.modules, "deepjimu.cost or the strategy registry loaded torch"

        # torch itself loads torch.distributed (2.13), so the data layer must add none of it
        # and load no deepjimu module that uses it
        import torch
        before = {m for m in sys.modules if m.startswith("torch.distributed")}
        import deepjimu.data
        added = {m for m in sys.modules if m.startswith("torch.distributed")} - before
        assert not added, f"import deepjimu.data loaded {sorted(added)}"
        for name, module in list(sys.modules.items()):
            if name.startswith("deepjimu") and getattr(module, "__file__", None):
                tree = ast.parse(open(module.__file__).read())
                for node in ast.walk(tree):
                    names = []
                    if isinstance(node, ast.Import):
                        names = [a.name for a in node.names]
                    elif isinstance(node, ast.ImportFrom) and node.module:
                        names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
                    bad = [n for n in names if n.startswith("torch.distributed")]
                    assert not bad, f"import deepjimu.data loaded {name}, which imports {bad[0]}"

        from deepjimu import PdADMM, fit
        print(PdADMM.__name__, fit.__name__)
        """
    )
    assert r.returncode == 0 and r.stdout.strip() == "PdADMM fit", r.stderr[-2000:]
