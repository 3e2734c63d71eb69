"""README.md and docs/ as a user reads them: every command block runs, and the error lines
they show are the ones the program prints.

The blocks come from pytest-codeblocks' Markdown reader (``extract_from_file``). Each block
is one test, its commands run in order in a folder of its own, the way a user runs them
from a fresh checkout: ``data/`` holds small generated MNIST, Planetoid, hyperspectral and
EuroSAT files (nothing is downloaded), ``examples/`` is the repository's; every command that
fails is named. A multi-machine launch (``torchrun --nnodes 2``) is not run: it needs the
machines it names; nor are ``srun``, ``mpirun`` and ``jimu sbatch --submit``, which need a
cluster (they run for real in tests/test_hpc.py); nor is ``--emulate-speeds`` where there
is no root or no cpu cgroup controller.

- ``bash`` blocks: each command (continuation lines joined, comments dropped) must exit 0.
  Training is shortened to run in the suite (``--epochs`` capped at 2, ``--steps`` at 20,
  ``--quiet``;
  ``--synthetic-n`` at 5,000; a bench runs 1 epoch (20 steps where it gives steps), 2
  workers and, unless named, local and
  admm; a plan 1 and 2 workers and, unless named, local and admm, one check of 1 epoch);
  nothing else changes.
- ``python`` blocks: run as a script after :data:`PRELUDE`, which defines the ``model``,
  ``x``, ``y``, ``x_test``, ``y_test`` that the pages' snippets take as given.
- ``text`` blocks with ``$`` lines are transcripts: each command runs exactly as shown and
  its ``error:`` lines must equal the transcript's, with exit code 2 when it shows errors
  (130 for "then Ctrl-C", where the checkpoint's step depends on the moment of the key).

pytest-codeblocks' own runner is not used for the shell blocks: it runs a block as one
script and compares stdout, while these need a shortened run per command and a check of
stderr's error lines.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from pytest_codeblocks import extract_from_file

from data.datafiles import make_idx_set
from data.geofiles import MS_ROOT, eurosat_zip, make_scene, ms_tiff, rgb_jpeg
from data.graphfiles import make_planetoid_set
from deepjimu.data.eurosat import CLASSES
from deepjimu.data.hyperspectral import SCENES
from deepjimu.emulate import find_cpu_controller
from processes import env, run_warm
from texts import TEXT, put_text

# every command of the pages runs as a process of its own
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
TIMEOUT = 600

PRELUDE = """\
import torch
from sklearn.datasets import load_digits
from torch import nn

_digits = load_digits()
x = torch.tensor(_digits.data[:1400] / 16, dtype=torch.float32)
y = torch.tensor(_digits.target[:1400])
x_test = torch.tensor(_digits.data[1400:] / 16, dtype=torch.float32)
y_test = torch.tensor(_digits.target[1400:])
model = nn.Sequential(nn.Flatten(), nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10))
"""


@dataclass(frozen=True)
class Step:
    """One command of a block of README.md or docs/: where it is, how it runs, what it must
    print."""

    page: str  # README.md, docs/admm.md, ...
    line: int  # the block's first line in its page
    block: int  # the block's index, over every page
    kind: str  # "shell", "python" or "transcript"
    text: str  # the command as written (a python block: its code)
    errors: tuple[str, ...] = ()  # a transcript's error lines

    @property
    def id(self) -> str:
        first = self.text.splitlines()[0] if self.kind == "python" else self.text
        return f"{self.page}:L{self.line}:{first[:60]}"


def _shell_commands(code: str) -> list[str]:
    """The commands of a bash block: continuation lines joined, comments and blank lines dropped."""
    out = []
    for line in code.replace("\\\n", " ").splitlines():
        words = shlex.split(line, comments=True)
        if words:
            out.append(shlex.join(words))
    return out


def _transcript(code: str) -> list[tuple[str, tuple[str, ...]]]:
    """The ``$`` commands of a text block and the error lines shown after each."""
    steps: list[tuple[str, list[str]]] = []
    for line in code.splitlines():
        if line.startswith("$ "):
            steps.append((line[2:].strip(), []))
        elif steps and line.startswith("error: "):
            steps[-1][1].append(line)
    return [(cmd, tuple(errs)) for cmd, errs in steps]


def _steps() -> list[Step]:
    steps, seen = [], set()
    blocks = [(path, b) for path in PAGES for b in extract_from_file(path)]
    for i, (path, block) in enumerate(blocks):
        at = (path.relative_to(ROOT).as_posix(), block.lineno, i)
        if block.code in seen:  # a block shown on two pages (the README's and its page) runs once
            continue
        seen.add(block.code)
        if block.syntax == "bash":
            steps += [Step(*at, "shell", c) for c in _shell_commands(block.code)]
        elif block.syntax == "python":
            steps.append(Step(*at, "python", block.code))
        elif block.syntax == "text" and "\n$ " in "\n" + block.code:
            steps += [Step(*at, "transcript", c, e) for c, e in _transcript(block.code)]
    return steps


def _chains(steps: list[Step]) -> list[tuple[Step, ...]]:
    """The steps in groups that run apart, each in order in a folder of its own: a command
    that names a folder path ending in NAME (``runs/NAME``, ``--resume runs/NAME``) joins
    the group of the command that made it (``--name NAME``, ``--out NAME``); a
    python block and a transcript's commands stay together. Apart, the long tour is many
    short tests that the suite's two processes share, instead of one of four minutes."""
    groups: list[list[Step]] = []
    made: dict[str, list[Step]] = {}  # folder name -> the group of the command that made it
    for step in steps:
        if step.kind != "shell":
            if groups and groups[-1][0].block == step.block and groups[-1][0].kind != "shell":
                groups[-1].append(step)
            else:
                groups.append([step])
            continue
        words = shlex.split(step.text, comments=True)
        named = [words[i + 1] for i, w in enumerate(words[:-1]) if w in ("--name", "--out")]
        used = [made[Path(w).name] for w in words if "/" in w and Path(w).name in made]
        group = used[0] if used else None
        if group is None or group[0].block != step.block:
            group = []
            groups.append(group)
        group.append(step)
        for n in named:
            made[n] = group
    return [tuple(g) for g in groups]


STEPS = _steps()
CHAINS = _chains(STEPS)


def _make_folder(folder: Path) -> Path:
    """A user's folder: generated data under ``data/``, the repository's ``examples/``."""
    make_idx_set(n_train=60, n_test=30).write(folder / "data" / "mnist")
    make_planetoid_set("cora").write(folder / "data")
    make_planetoid_set("citeseer").write(folder / "data")
    put_text(folder / "data", (TEXT * 3).encode())  # Tiny Shakespeare's stand-in
    _remote_sensing(folder / "data")
    shutil.copytree(ROOT / "examples", folder / "examples")
    return folder


def _remote_sensing(data: Path) -> None:
    """Small generated stand-ins for the remote-sensing files (not downloadable here)."""
    for name in SCENES:
        s = SCENES[name]
        scene = make_scene({1: 30, 2: 20, s.num_classes: 10})
        scene.write(data / name, (s.cube_file, s.cube_key, s.gt_file, s.gt_key))
    rgb, ms = {}, {}
    for c, cls in enumerate(CLASSES):
        for i in range(3):
            rgb[f"2750/{cls}/{cls}_{i + 1}.jpg"] = rgb_jpeg((20 * c, 40 * i, 100))
            pixels = np.full((64, 64, 13), 100 * c + i, np.uint16)
            ms[f"{MS_ROOT}/{cls}/{cls}_{i + 1}.tif"] = ms_tiff(pixels)
    for name, archive, members in (
        ("eurosat", "EuroSAT.zip", rgb),
        ("eurosat-ms", "EuroSATallBands.zip", ms),
    ):
        (data / name).mkdir(parents=True)
        (data / name / archive).write_bytes(eurosat_zip(members))


def _argv(words: list[str]) -> list[str]:
    """A command's program as this test's interpreter runs it."""
    head = {
        "jimu": [sys.executable, "-m", "deepjimu"],
        "python": [sys.executable],
        "torchrun": [sys.executable, "-m", "torch.distributed.run"],
    }
    return head.get(words[0], [words[0]]) + words[1:]


def shorten(words: list[str]) -> list[str]:
    """A tour command made short enough for the suite: fewer epochs, a smaller bench."""
    sub = next((w for w in words if w in ("train", "bench", "probe", "report", "plan")), None)
    if "--help" in words or sub not in ("train", "bench", "plan"):
        return words
    out = list(words)

    def cap(flag: str, value: int) -> None:
        if flag in out:
            i = out.index(flag) + 1
            out[i] = str(min(int(out[i]), value))
        else:
            out.extend([flag, str(value)])

    if "--synthetic-n" in out:  # a generated data set: a smaller one of the same kind
        cap("--synthetic-n", 5000)
    if sub == "train":
        cap("--steps", 20) if "--steps" in out else cap("--epochs", 2)
        out.append("--quiet")
    elif sub == "plan":  # its --check trains
        cap("--epochs", 1)
        after = out[out.index("--check") + 1 :] if "--check" in out else []
        if after and after[0].isdigit():  # --check N: one run is enough to check
            cap("--check", 1)
        if "--workers" not in out:
            out += ["--workers", "1,2"]
        if "--strategies" not in out:
            out += ["--strategies", "local,admm"]
    else:
        cap("--steps", 20) if "--steps" in out else cap("--epochs", 1)
        if "--workers" not in out:
            out += ["--workers", "2"]
        if "--strategies" not in out:
            out += ["--strategies", "local,admm"]
        if "--tune" in out:
            out += ["--tune-trials", "2"]
    return out


def _run(
    argv: list[str], cwd: Path, ctrl_c_after: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """Run ``argv`` in ``cwd``; with ``ctrl_c_after``, press Ctrl-C once that file exists."""
    if ctrl_c_after is None:
        return run_warm(argv, cwd, TIMEOUT)
    proc = subprocess.Popen(argv, cwd=cwd, env=env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)  # fmt: skip
    deadline = time.time() + TIMEOUT
    while not ctrl_c_after.exists() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGINT)  # what a terminal sends to its foreground group
    out, err = proc.communicate(timeout=TIMEOUT)
    return subprocess.CompletedProcess(argv, proc.returncode, out, err)


def _digits_apart(lines: list[str]) -> list[str]:
    return [re.sub(r"\d+", "#", line) for line in lines]


def _measures_apart(lines: list[str]) -> list[str]:
    """Lines with their decimal figures (an accuracy, a loss) as ``#.#``: an ill-conditioned
    run's figures move in the last digits with the BLAS threads' summation order (CI saw
    0.098 where the page says 0.088), its words and every whole number must not."""
    return [re.sub(r"\d+\.\d+", "#.#", line) for line in lines]


def _chain_id(chain: tuple[Step, ...]) -> str:
    first = chain[0]
    if first.kind != "shell":
        return f"{first.page}:L{first.line}:{first.kind}"
    return f"{first.page}:L{first.line}:{first.text[:50]}"


@pytest.mark.parametrize("chain", CHAINS, ids=[_chain_id(c) for c in CHAINS])
def test_readme_commands(chain: tuple[Step, ...], tmp_path: Path) -> None:
    """Commands of one block, in order, in one folder; every failing command is named."""
    cwd = _make_folder(tmp_path)
    failures, skipped = [], []
    for step in chain:
        try:
            why = _check(step, cwd)
        except AssertionError as e:
            failures.append(f"{step.id}: {e}")
            continue
        if why:
            skipped.append(why)
    assert not failures, "\n\n".join(failures)
    if skipped and len(skipped) == len(chain):
        pytest.skip("; ".join(skipped))


def _check(step: Step, cwd: Path) -> str | None:
    """Run one step; an AssertionError says what went wrong, a string why it cannot run here."""
    if step.kind == "python":
        script = cwd / f"readme_L{step.line}.py"
        script.write_text(PRELUDE + "\n" + step.text)
        r = _run([sys.executable, script.name], cwd)
        assert r.returncode == 0, r.stderr[-3000:]
        return None
    command, _, comment = step.text.partition(" #")
    words = shlex.split(command)
    if words[0] == "make":  # the suite itself (make test), or the tour's jimu train (make demo)
        r = subprocess.run(["make", "-n", *words[1:]], cwd=ROOT, capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        assert {"demo": "jimu train", "test": "pytest"}[words[1]] in r.stdout
        return None
    if "--nnodes" in words and words[words.index("--nnodes") + 1] != "1":
        return "a multi-machine launch: needs the machines it names"
    if words[0] in ("srun", "mpirun") or "--submit" in words:
        return "a Slurm or MPI launch: needs a cluster (tests/test_hpc.py runs them for real)"
    if "--emulate-speeds" in words and (os.geteuid() != 0 or find_cpu_controller() is None):
        return "--emulate-speeds needs root and a mounted cpu cgroup controller"
    if step.kind == "shell":
        r = _run(_argv(shorten(words)), cwd)
        assert r.returncode == 0, r.stderr[-3000:]
        return None
    ctrl_c = "Ctrl-C" in comment
    name = words[words.index("--name") + 1] if "--name" in words else ""
    latest = cwd / "runs" / name / "checkpoint" / "latest" if ctrl_c else None
    r = _run(_argv(words), cwd, ctrl_c_after=latest)
    printed = [line for line in r.stderr.splitlines() if line.startswith("error: ")]
    expected = list(step.errors)
    if ctrl_c:  # the step of the last checkpoint is wherever the key came
        assert r.returncode == 130, r.stderr[-3000:]
        assert _digits_apart(printed) == _digits_apart(expected), r.stderr[-3000:]
        return None
    assert r.returncode == (2 if expected else 0), r.stderr[-3000:]
    assert _measures_apart(printed) == _measures_apart(expected), r.stderr[-3000:]
    return None
