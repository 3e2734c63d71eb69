"""fit: the user's tensors and model factory through the real engine, equal to ``jimu train``;
admm on a factory's flat MLP; what a PyTorch user passes; one line for what fit cannot take."""

from __future__ import annotations

import functools
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch
from user_models import flat_mlp, no_flatten, pooled_cnn, tanh_mlp

from deepjimu import fit
from deepjimu.cli import main
from deepjimu.config import RunConfig
from deepjimu.data import DataOptions
from deepjimu.data.digits import load_digits_raw
from deepjimu.devices import free_port
from deepjimu.errors import JimuError
from deepjimu.launch import train
from deepjimu.models import build_model
from deepjimu.record.checkpoint import model_state_of
from deepjimu.record.folder import latest_checkpoint
from processes import env


def _digits() -> tuple[torch.Tensor, ...]:
    raw = load_digits_raw(DataOptions())
    return tuple(torch.as_tensor(a) for a in (raw.train_x, raw.train_y, raw.test_x, raw.test_y))


def test_fit_equals_jimu_train_on_the_same_data(tmp_path: Path) -> None:
    """Transparency: digits' own arrays and build_model as the factory reproduce the CLI run."""
    x, y, xt, yt = _digits()
    factory = functools.partial(build_model, "mlp:32x2", tuple(x.shape[1:]), 10, seed=0)
    fitted = fit("local", factory, x, y, test=(xt, yt), workers=1, epochs=2, run_dir=tmp_path / "f")
    ref = train(
        RunConfig(
            strategy="local",
            model="mlp:32x2",
            epochs=2,
            quiet=True,
            runs_dir=str(tmp_path),
            name="r",
        )
    )
    assert ref is not None
    for key in ("loss", "train_acc", "val_acc", "test_acc"):
        assert fitted.summary[key] == ref[key], key
    assert fitted.summary["model"] == "factory:deepjimu.models.spec.build_model"
    assert fitted.run_dir == tmp_path / "f" and (fitted.run_dir / "summary.json").exists()
    with torch.no_grad():  # the returned model holds the trained weights
        acc = (fitted.model(xt).argmax(1) == yt).double().mean().item()
    assert acc == pytest.approx(ref["test_acc"], abs=1e-12)


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["ddp", "fsdp", "tp"])
def test_fit_with_two_workers_reaches_the_workers_tensors(strategy: str) -> None:
    """The workers are spawned processes: they read the caller's tensors from the run folder,
    and the trained weights come back whole from every rank's part of the checkpoint (fsdp's
    and tp's shards joined)."""
    x, y, xt, yt = _digits()
    factory = functools.partial(build_model, "mlp:32x1", tuple(x.shape[1:]), 10)
    fitted = fit(strategy, factory, x, y, test=(xt, yt), workers=2, epochs=3, lr=0.01)
    assert fitted.summary["workers"] == 2 and fitted.run_dir is None
    assert fitted.summary["test_acc"] > 0.85
    with torch.no_grad():
        acc = (fitted.model(xt).argmax(1) == yt).double().mean().item()
    assert acc == pytest.approx(fitted.summary["test_acc"], abs=1e-12)


def test_fit_checks_its_arguments_up_front() -> None:
    x, y = torch.randn(20, 4), torch.randint(0, 2, (20,))
    factory = functools.partial(build_model, "mlp:8x1", (4,), 2)
    with pytest.raises(ValueError, match="picklable"):
        fit("local", lambda: factory(), x, y)
    with pytest.raises(ValueError, match="unknown option 'epoch'"):
        fit("local", factory, x, y, epoch=2)
    with pytest.raises(ValueError, match="dataset is set by fit"):
        fit("local", factory, x, y, dataset="digits")
    with pytest.raises(ValueError, match="must pair up"):
        fit("local", factory, x, y[:5])
    with pytest.raises(JimuError, match="lr must be a positive number"):
        fit("local", factory, x, y, lr=-1.0)


def test_a_fit_run_is_resumed_through_fit_and_refused_by_the_cli(tmp_path: Path, capsys) -> None:
    x, y, xt, yt = _digits()
    factory = functools.partial(build_model, "mlp:16x1", tuple(x.shape[1:]), 10)
    common = {"test": (xt, yt), "workers": 1, "optimizer": "sgd"}
    full = fit("local", factory, x, y, epochs=3, run_dir=tmp_path / "full", **common)
    fit("local", factory, x, y, epochs=1, run_dir=tmp_path / "part", **common)
    saved = json.loads((tmp_path / "part" / "config.json").read_text())
    assert saved["model"] == "factory:deepjimu.models.spec.build_model"  # what built it, truthfully
    capsys.readouterr()
    assert main(["train", "--resume", str(tmp_path / "part"), "--epochs", "3"]) == 2
    assert capsys.readouterr().err.splitlines() == [
        f"error: --resume {tmp_path / 'part'}: its model comes from a Python factory "
        f"(factory:deepjimu.models.spec.build_model); resume it with "
        f"deepjimu.fit(..., resume={str(tmp_path / 'part')!r})"
    ]
    with pytest.raises(ValueError, match="train_y differs from the tensors the run in"):
        fit("local", factory, x, 9 - y, resume=tmp_path / "part", epochs=3, **common)
    with pytest.raises(ValueError, match="give run_dir or resume, not both"):
        fit("local", factory, x, y, run_dir=tmp_path / "x", resume=tmp_path / "part")
    resumed = fit("local", factory, x, y, resume=tmp_path / "part", epochs=3, **common)
    assert resumed.run_dir == tmp_path / "part" and resumed.summary["epochs"] == 3
    for a, b in zip(resumed.model.parameters(), full.model.parameters(), strict=True):
        assert torch.equal(a, b)  # as if never interrupted


@pytest.mark.slow
def test_fit_admm_trains_the_users_flat_mlp_alike_on_one_and_two_workers(tmp_path: Path) -> None:
    """Transparency: 2 workers give 1 worker's weights; the model returned holds them, under
    the model's own keys (admm groups the flat Sequential's own modules into layers)."""
    x, y, xt, yt = _digits()
    common = {"test": (xt, yt), "epochs": 4, "threads": 1}  # one thread each: same rounding
    fitted = {
        w: fit("admm", flat_mlp, x, y, workers=w, run_dir=tmp_path / f"w{w}", **common)
        for w in (1, 2)
    }
    one, two = fitted[1], fitted[2]
    assert one.summary["train_acc"] > 0.8 and one.summary["test_acc"] > 0.8  # chance: 0.1
    assert one.summary["admm_blocks"] == [2] and two.summary["admm_blocks"] == [1, 1]
    for key in ("loss", "train_acc", "test_acc"):
        assert two.summary[key] == pytest.approx(one.summary[key], rel=1e-5), key
    for (k1, a), (k2, b) in zip(
        one.model.state_dict().items(), two.model.state_dict().items(), strict=True
    ):
        assert k1 == k2 and torch.allclose(a, b, rtol=1e-4, atol=1e-5), k1
    saved = model_state_of(latest_checkpoint(tmp_path / "w2")[0])
    assert list(saved) == ["1.weight", "1.bias", "3.weight", "3.bias"]
    torch.manual_seed(0)  # the start every worker drew (seed 0)
    start = flat_mlp()
    assert not torch.allclose(start[1].weight, two.model[1].weight)  # trained, not the start
    with torch.no_grad():
        acc = (two.model(xt).argmax(1) == yt).double().mean().item()
    assert acc == pytest.approx(two.summary["test_acc"], abs=1e-12)


@pytest.mark.parametrize(
    ("factory", "message"),
    [
        (
            tanh_mlp,
            "model factory:user_models.tanh_mlp: admm needs [Conv2d, ReLU[, AvgPool2d], ...] "
            "[Flatten,] Linear, ReLU, ..., Linear; module 2 is Tanh() (expected ReLU)",
        ),
        (
            pooled_cnn,
            "model factory:user_models.pooled_cnn: admm cannot train max pooling (module 2: "
            "MaxPool2d(kernel_size=2, stride=2, padding=0, dilation=1, ceil_mode=False)): it is "
            "not linear; use average pooling (nn.AvgPool2d, as cnn:C1-C2-... models do)",
        ),
    ],
)
def test_fit_admm_refuses_a_model_it_cannot_train_in_one_line(
    factory, message: str, tmp_path: Path
) -> None:
    x, y = torch.rand(20, 1, 8, 8), torch.randint(0, 10, (20,))
    with pytest.raises(JimuError) as e:
        fit("admm", factory, x, y, workers=1, run_dir=tmp_path / "r")
    assert str(e.value) == message
    assert not (tmp_path / "r").exists()  # refused before any worker started: nothing left


def test_fit_takes_numpy_arrays_and_float64_tensors_as_their_float32_tensors() -> None:
    x, y, xt, yt = _digits()
    factory = functools.partial(build_model, "mlp:16x1", tuple(x.shape[1:]), 10)
    common = {"workers": 1, "epochs": 1}
    ref = fit("local", factory, x, y, test=(xt, yt), **common)
    got = fit(
        "local",
        factory,
        x.double().numpy(),
        y.numpy().astype(np.uint8),
        test=(xt.double(), yt.int()),
        **common,
    )
    for key in ("loss", "train_acc", "test_acc"):
        assert got.summary[key] == ref.summary[key], key


@pytest.mark.parametrize(
    ("factory", "x", "y", "message"),
    [
        (
            flat_mlp,
            torch.rand(20, 1, 8, 8),
            torch.randint(0, 10, (20,)).double(),
            "y: labels must be class indices of an integer dtype (dtype: torch.float64); pass "
            "whole numbers as integers, e.g. y.long() (torch) or y.astype(int) (numpy)",
        ),
        (
            flat_mlp,
            torch.rand(20, 1, 8, 8),
            torch.arange(20),
            "labels go up to 19, the model has 10 outputs: class indices must be below the "
            "model's outputs (labels: 0..19, outputs: 10)",
        ),
        (
            no_flatten,
            torch.rand(20, 1, 8, 8),
            torch.randint(0, 10, (20,)),
            "the model fails on one sample of x (shape (1, 8, 8)): RuntimeError: mat1 and mat2 "
            "shapes cannot be multiplied (8x8 and 64x32); add nn.Flatten() first in the model "
            "or pass x.flatten(1)",
        ),
        (
            flat_mlp,
            [["a"] * 64] * 20,
            torch.randint(0, 10, (20,)),
            "x must be a torch.Tensor or a numpy array of numbers (got list)",
        ),
    ],
)
def test_fit_says_in_one_line_what_it_cannot_take(
    factory, x, y, message: str, tmp_path: Path
) -> None:
    """Before any worker starts or any file is written."""
    with pytest.raises(ValueError) as e:
        fit("ddp", factory, x, y, workers=2, run_dir=tmp_path / "r")
    assert str(e.value) == message
    assert not (tmp_path / "r").exists()


_SCRIPT = """
    import torch
    from torch import nn
    import deepjimu

    def make_model():
        return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))

    x, y = torch.randn(40, 4), torch.randint(0, 2, (40,))
    fitted = deepjimu.fit("ddp", make_model, x, y, workers=2, epochs=1)
"""


@pytest.mark.slow
@pytest.mark.parametrize("how", ["stdin", "-c"])
def test_fit_refuses_a_factory_of_a_main_without_a_file_in_one_line(how: str) -> None:
    """A notebook, an interactive session, a script read on stdin: the spawned workers
    cannot import the factory; say so, not in 30 lines of the workers' tracebacks."""
    code = textwrap.dedent(_SCRIPT)
    args, stdin = (["-"], code) if how == "stdin" else (["-c", code], None)
    r = subprocess.run(
        [sys.executable, *args], input=stdin, capture_output=True, text=True, env=env(),
        timeout=120,
    )  # fmt: skip
    assert r.returncode == 1
    assert r.stderr.splitlines()[-1] == (
        "ValueError: model_factory must be importable by the worker processes: define "
        "make_model in a module file and import it from there (a function of a notebook, of "
        "an interactive session or of a script read on stdin cannot be imported)"
    )
    assert "spawn" not in r.stderr  # no worker started


@pytest.mark.slow
def test_fit_outside_a_main_guard_stops_each_worker_in_one_line(tmp_path: Path) -> None:
    """Each spawned worker runs the script again; one that reaches fit says what to do."""
    script = tmp_path / "unguarded.py"
    script.write_text(textwrap.dedent(_SCRIPT))
    r = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, env=env(), timeout=300,
        cwd=tmp_path,
    )  # fmt: skip
    assert r.returncode == 1
    line = (
        "error: deepjimu.fit was called again by a worker process as it imported your "
        'script: call fit under `if __name__ == "__main__":`'
    )
    # one per worker that reaches fit before the launcher, seeing the first one fail, ends
    # the other (on a busy machine the second may still be importing torch)
    assert 1 <= r.stderr.count(line) <= 2
    assert "spawn_main" not in r.stderr  # not multiprocessing's traceback


_TORCHRUN_SCRIPT = """
    import json, sys
    import torch
    from torch import nn
    import deepjimu

    def make_model():
        return nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 2))

    if __name__ == "__main__":
        g = torch.Generator().manual_seed(0)
        x = torch.randn(200, 4, generator=g)
        y = (x[:, 0] > 0).long()
        out = []
        for _ in range(2):  # twice in the same processes: the second run is a new one
            fitted = deepjimu.fit("ddp", make_model, x, y, test=(x, y), epochs=3, lr=0.05,
                                   balance="even")
            weights = sum(float(p.double().sum()) for p in fitted.model.parameters())
            out.append([fitted.summary["test_acc"], fitted.summary["workers"], weights])
        print("RESULT " + json.dumps(out))
"""


@pytest.mark.slow
def test_fit_under_torchrun_is_one_run_across_its_ranks(tmp_path: Path) -> None:
    script = tmp_path / "under_torchrun.py"
    script.write_text(textwrap.dedent(_TORCHRUN_SCRIPT))
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    r = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
         "--master-port", str(free_port()), str(script)],
        capture_output=True, text=True, env={**env(), "TMPDIR": str(scratch)}, timeout=300,
        cwd=tmp_path,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr[-2000:]
    results = [json.loads(line[7:]) for line in r.stdout.splitlines() if line.startswith("RESULT ")]
    assert len(results) == 2 and results[0] == results[1]  # the same result on every rank
    first, second = results[0]
    assert first == second and first[1] == 2 and first[0] > 0.8  # one 2-worker run, each time
    assert list(scratch.glob("deepjimu-*")) == []  # nothing of ours left in the temporary folder
