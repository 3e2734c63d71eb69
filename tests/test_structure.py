"""Functions that fit on a screen: no function or method under src/ is longer than 60 lines."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src"
MAX_LINES = 60


def _body_lines(node: ast.FunctionDef | ast.AsyncFunctionDef) -> int | None:
    """Lines from the first statement after the docstring to the function's last line; None
    for a function that is only a docstring."""
    body = node.body
    first = body[0]
    if (
        isinstance(first, ast.Expr)
        and isinstance(first.value, ast.Constant)
        and isinstance(first.value.value, str)
    ):
        if len(body) == 1:
            return None
        first = body[1]
    assert node.end_lineno is not None
    return node.end_lineno - first.lineno + 1


def _too_long(path: Path) -> list[str]:
    """``file:line name length`` of every function in ``path`` over :data:`MAX_LINES`."""
    tree = ast.parse(path.read_text(), filename=str(path))
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            length = _body_lines(node)
            if length is not None and length > MAX_LINES:
                out.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name} {length}")
    return out


def test_body_lines_skip_the_docstring() -> None:
    tree = ast.parse(
        'def f():\n    """Doc."""\n    a = 1\n    return a\n\ndef g():\n    """Doc."""\n'
    )
    f, g = tree.body
    assert isinstance(f, ast.FunctionDef) and isinstance(g, ast.FunctionDef)
    assert _body_lines(f) == 2
    assert _body_lines(g) is None


def test_no_function_is_longer_than_a_screen() -> None:
    paths = sorted(SRC.rglob("*.py"))
    assert paths, f"no Python files under {SRC}"
    long = [line for path in paths for line in _too_long(path)]
    assert not long, (
        f"functions longer than {MAX_LINES} lines (first statement after the docstring to "
        "the last line); split them into helpers:\n" + "\n".join(long)
    )


def test_the_math_packages_import_nothing_else_of_deepjimu() -> None:
    """pdADMM's updates are pure functions of tensors: the strategy and the API drive them,
    so importing them must not load the run, checkpoint or event machinery."""
    package = SRC / "deepjimu" / "admm_math"
    outside = []
    for path in sorted(package.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            outside += [
                f"{path.name} imports {n}"
                for n in names
                if n.startswith("deepjimu") and not n.startswith("deepjimu.admm_math")
            ]
    assert len(list(package.glob("*.py"))) >= 5
    assert not outside, outside
