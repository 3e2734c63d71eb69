"""The house has one direction: every import of src/ points down the layers of docs/architecture.md.

Every import is counted, at module level, inside functions and under ``TYPE_CHECKING``,
read from the source (no import runs). Also: no cycle, the strategies import neither the
measuring layer nor the plan command, a function-level import only where ``--help`` must
stay torch-free, no module but a strategy's own and the registry names a strategy, no
package ``__init__`` over 40 lines and no file over 500 (but the two the issue exempts).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"
PACKAGE = SRC / "deepjimu"

# bottom to top; a module may import only modules of its own layer or of a layer below
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("foundation", ("errors", "units", "clocks", "atomic", "comm", "counters", "precision", "cgroups",
                    "memory", "threads", "choices", "leave", "bookkeeping", "emulate", "budget",
                    "launchers", "mesh", "starting")),
    ("options", ("applies", "defaults", "options", "config", "balance")),
    ("components", ("data", "models", "compress", "admm_math", "kfac")),
    ("cost", ("cost",)),
    ("record", ("record",)),
    ("run", ("run",)),
    ("strategies", ("strategies",)),
    ("measure", ("measure",)),
    ("validation", ("validation", "flags", "devices", "worker", "summary")),
    ("launch", ("launch", "preflight")),
    ("commands", ("bench", "plan", "report", "api", "sbatch")),
    ("cli", ("arguments", "cli", "__main__", "")),
)  # fmt: skip
"""The layers; ``""`` is the package itself (``import deepjimu``: the public API, lazily)."""

# function-level imports of deepjimu modules, each where --help must stay torch-free: the CLI
# builds its parser before torch loads, then imports the command it runs
LAZY = {"cli"}

# modules allowed to name a strategy besides the registry and the strategies' own modules
NAMING = {
    "options.run": "the run's default --strategy, an option's default value",
    "options.admm": "the admm group's TOML table and --help section: [admm]",
    "options.gradient": "the pipeline group's TOML table and --help section: [pipeline]",
}

# files allowed over 500 lines (issue 45): pdADMM's per-worker block and its updates' math
LONG = {"strategies/admm/blocks.py", "admm_math/updates.py"}


def _modules() -> dict[str, Path]:
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


MODULES = _modules()


def _target(module: str, node: ast.Import | ast.ImportFrom) -> list[str]:
    """The deepjimu modules ``node`` imports (relative to ``deepjimu``, ``""`` the package)."""
    if isinstance(node, ast.Import):
        names = [a.name for a in node.names]
    else:
        base = node.module or ""
        if node.level:  # relative: from the module's package
            pkg = (
                module.split(".")
                if MODULES[module].name == "__init__.py"
                else module.split(".")[:-1]
            )
            base = ".".join(["deepjimu", *pkg[: len(pkg) - node.level + 1], *filter(None, [base])])
        names = [f"{base}.{a.name}" for a in node.names]
    out = []
    for name in names:
        if name != "deepjimu" and not name.startswith("deepjimu."):
            continue
        rel = name.removeprefix("deepjimu").removeprefix(".")
        while rel and rel not in MODULES:  # a name in a module: the module
            rel = rel.rpartition(".")[0]
        out.append(rel)
    return list(dict.fromkeys(out))


def _imports() -> list[tuple[str, str, bool, int]]:
    """Every (importer, imported, inside a function, line) of src/deepjimu."""
    found = []
    for module, path in MODULES.items():
        tree = ast.parse(path.read_text())

        def walk(node: ast.AST, in_function: bool, module: str = module) -> None:
            for child in ast.iter_child_nodes(node):
                if isinstance(child, ast.Import | ast.ImportFrom):
                    for target in _target(module, child):
                        if target != module:
                            found.append((module, target, in_function, child.lineno))
                inner = in_function or isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef)
                walk(child, inner)

        walk(tree, False)
    return found


IMPORTS = _imports()


def layer_of(module: str) -> int:
    """The index in :data:`LAYERS` of ``module``'s layer."""
    top = module.split(".")[0]
    for i, (_, names) in enumerate(LAYERS):
        if top in names:
            return i
    raise AssertionError(f"deepjimu.{module} is in no layer: add it to LAYERS")


def test_every_module_has_a_layer() -> None:
    for module in MODULES:
        layer_of(module)


def test_no_import_points_up() -> None:
    up = [
        f"deepjimu.{a} ({LAYERS[layer_of(a)][0]}) imports deepjimu.{b} ({LAYERS[layer_of(b)][0]}) "
        f"at line {line}"
        for a, b, _, line in IMPORTS
        if layer_of(b) > layer_of(a) and not a.startswith(b + ".")
    ]
    assert not up, "imports that point up:\n" + "\n".join(up)


def test_no_import_cycle() -> None:
    edges: dict[str, set[str]] = {m: set() for m in MODULES}
    for a, b, _, _ in IMPORTS:
        if not a.startswith(b + "."):  # a module's own package runs first anyway
            edges[a].add(b)
    seen: dict[str, int] = {}  # 1: on the path, 2: done
    cycles = []

    def visit(m: str, path: list[str]) -> None:
        seen[m] = 1
        for n in sorted(edges[m]):
            if seen.get(n) == 1:
                cycles.append(" -> ".join([*path[path.index(n) :], n]))
            elif n not in seen:
                visit(n, [*path, n])
        seen[m] = 2

    for m in sorted(MODULES):
        if m not in seen:
            visit(m, [m])
    assert not cycles, "import cycles:\n" + "\n".join(cycles)


def test_strategies_import_neither_the_measuring_layer_nor_the_plan_command() -> None:
    bad = [
        f"deepjimu.{a} imports deepjimu.{b} (line {line})"
        for a, b, _, line in IMPORTS
        if a.startswith("strategies") and b.split(".")[0] in ("measure", "plan")
    ]
    assert not bad, bad


def test_function_level_imports_only_where_help_must_stay_light() -> None:
    lazy = [
        f"deepjimu.{a} imports deepjimu.{b} inside a function (line {line})"
        for a, b, inside, line in IMPORTS
        if inside and a not in LAZY
    ]
    assert not lazy, "\n".join(lazy)


def _strategy_names() -> set[str]:
    tree = ast.parse((PACKAGE / "strategies" / "registry.py").read_text())
    entries = next(
        n.value
        for n in ast.walk(tree)
        if isinstance(n, ast.AnnAssign) and getattr(n.target, "id", "") == "ENTRIES"
    )
    assert isinstance(entries, ast.Tuple)
    names = set()
    for call in entries.elts:
        assert isinstance(call, ast.Call) and isinstance(call.args[0], ast.Constant)
        names.add(call.args[0].value)
    return names


def _named(path: Path, names: set[str]) -> list[int]:
    """Lines of ``path`` whose code (docstrings aside) holds a strategy name as a string, or
    as a word of one (``--strategy local``); an enum member's spelling (``Launcher.LOCAL``)
    is another option's value, not a strategy."""
    tree = ast.parse(path.read_text())
    skip = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        first = body[0] if isinstance(body, list) and body else None
        if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):  # a docstring
            skip.add(id(first.value))
        if isinstance(node, ast.ClassDef) and any(
            getattr(b, "id", "") == "Choice" for b in node.bases
        ):
            skip.update(id(c) for c in ast.walk(node))
    words = re.compile(r"--strategy (\S+)")
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip:
            said = {node.value, *words.findall(node.value)}
            if said & names:
                lines.append(node.lineno)
    return sorted(set(lines))


def test_no_module_but_a_strategys_own_and_the_registry_names_a_strategy() -> None:
    names = _strategy_names()
    assert names >= {"local", "ddp", "admm"}
    found = {}
    for module, path in MODULES.items():
        own = module.startswith("strategies.") and module != "strategies.base"
        if not own and (lines := _named(path, names)):
            found[module] = lines
    assert {m: lines for m, lines in found.items() if m not in NAMING} == {}, (
        "modules that name a strategy (a name belongs to its registry entry: read what you "
        f"need from deepjimu.strategies.registry): {found}"
    )
    stale = set(NAMING) - set(found)
    assert not stale, f"NAMING holds modules that no longer name a strategy: {stale}"


@pytest.mark.parametrize("module", sorted(m for m, p in MODULES.items() if p.name == "__init__.py"))
def test_a_package_init_is_short(module: str) -> None:
    lines = len(MODULES[module].read_text().splitlines())
    assert lines <= 40, f"deepjimu.{module}'s __init__.py has {lines} lines (at most 40)"


def test_no_file_is_over_500_lines() -> None:
    long = {
        str(p.relative_to(PACKAGE)): n
        for p in MODULES.values()
        if (n := len(p.read_text().splitlines())) > 500
    }
    assert set(long) <= LONG, f"files over 500 lines: {long}"
