"""The API from the top of the package: help(deepjimu) documents it, `import deepjimu` stays light."""

from __future__ import annotations

import subprocess
import sys

import pytest

from processes import env

# every test here starts processes (workers, a CLI run) or trains whole runs
pytestmark = pytest.mark.slow


def test_help_documents_fit_fitted_and_pdadmm_and_the_import_loads_no_torch() -> None:
    code = (
        "import sys, pydoc, deepjimu\n"
        "print('torch' in sys.modules)\n"
        "print(pydoc.render_doc(deepjimu, renderer=pydoc.plaintext))\n"
    )
    r = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env(), timeout=120
    )
    assert r.returncode == 0, r.stderr
    torch_loaded, text = r.stdout.split("\n", 1)
    assert torch_loaded == "False"
    for shown in (
        "fit(strategy: 'str', model_factory",  # the signature
        "Train ``model_factory()`` on ``(x, y)`` with ``strategy``",  # and the docstring
        "class Fitted",
        "What :func:`fit` returns",
        "class PdADMM",
        "pdADMM on your own ``nn.Sequential``, an MLP or a CNN",  # the package's line: both
        "pdADMM (Wang et al., ICDM 2020)",
    ):
        assert shown in text, shown
