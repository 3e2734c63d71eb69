"""fit: train the user's model on the user's tensors with any strategy, through the real engine."""

from __future__ import annotations

import contextlib
import itertools
import json
import multiprocessing
import os
import pickle
import shutil
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from deepjimu.config import ConfigErrors, RunConfig, option_fields
from deepjimu.data.tensors import samples_and_labels, save_tensors, tensors_file
from deepjimu.errors import JimuError, one_line
from deepjimu.launch import train
from deepjimu.launchers import Placement, placement
from deepjimu.models import factory_spec
from deepjimu.record.checkpoint import load_file, model_state_of
from deepjimu.record.folder import check_new, latest_checkpoint, saved_config
from deepjimu.worker import ModelFactory

__all__ = ["Fitted", "fit"]

# what fit sets itself: the data travel as the run's `tensors` file, the model as the factory
_SET_BY_FIT = ("strategy", "workers", "dataset", "data_dir", "runs_dir", "name", "model", "resume")


@dataclass(frozen=True)
class Fitted:
    """What :func:`fit` returns: rank 0's summary (as ``summary.json``), the trained model
    (a fresh ``model_factory()`` holding the final weights) and the run folder (None when
    it was a temporary one, removed on return)."""

    summary: dict[str, Any]
    model: nn.Sequential
    run_dir: Path | None


def fit(
    strategy: str,
    model_factory: ModelFactory,
    x: Tensor | np.ndarray,
    y: Tensor | np.ndarray,
    *,
    test: tuple[Tensor | np.ndarray, Tensor | np.ndarray] | None = None,
    workers: int | None = None,
    run_dir: str | Path | None = None,
    resume: str | Path | None = None,
    **options: Any,
) -> Fitted:
    """Train ``model_factory()`` on ``(x, y)`` with ``strategy``, as ``jimu train`` does.

    The run is the real one: ``workers`` processes under torch's elastic launcher (or this
    process for one), the strategy's ``fit``, its events, checkpoints and summary. The
    tensors are written once into the run folder (``data/tensors/tensors.pt``, the
    ``tensors`` data set) and every worker reads them from there, so nothing needs to be
    registered in the workers; the factory is pickled to each worker, which calls it
    under ``torch.manual_seed(seed)``, so every rank starts from the same weights. The run's
    ``config.json`` names the model ``factory:<module>.<name>``: such a run is resumed
    through ``fit(..., resume=...)`` with its factory, not by ``jimu train --resume``.

    Everything that can be checked in this process is, before any worker starts: the
    factory's model runs on one sample of ``x``, and the labels must be below its number of
    outputs.

    Args:
        strategy: any of ``jimu train --strategy`` (``local``, ``ddp``, ``fsdp``, ``tp``,
            ``model-parallel``, ``pipeline``) or ``admm`` (which
            trains a factory's MLP or CNN by :class:`~deepjimu.PdADMM`'s rule,
            ``admm_maps``, one layer per block; the model's own modules, so
            ``Fitted.model`` loads its weights).
        model_factory: a picklable callable returning an ``nn.Sequential`` (a module-level
            function or a ``functools.partial`` of one; not a lambda or a local function),
            defined in a module file that the spawned workers can import: not in a
            notebook, an interactive session or a script read on stdin.
        x, y: training samples [N, ...] and class indices [N]; ``val_fraction`` of them is
            split off for validation, as for every data set. Tensors or numpy arrays: ``x``
            of any real dtype (trained in float32), ``y`` of any integer dtype.
        test: held-out ``(x, y)`` (default: none; ``test_acc`` is then None).
        workers: processes (default: the strategy's).
        run_dir: where the run folder goes (kept); default: a temporary folder, removed on
            return.
        resume: a run folder that ``fit`` wrote (with ``run_dir``): go on from its latest
            checkpoint with its options, those given here aside (``epochs``, ``lr``, ...,
            as ``jimu train --resume`` allows), on the same tensors.
        options: any other ``jimu train`` option by its field name, e.g. ``epochs=5``,
            ``lr=0.01``, ``batch_size=64``, ``seed=1``.

    Returns:
        the summary, the trained model and the run folder.

    Raises:
        ValueError: a factory that is not picklable, that the workers cannot import, or that
            does not build an ``nn.Sequential``; a model that fails on one sample of ``x``
            (4-D images into a Linear without ``Flatten``, say); labels that are not integer
            class indices below the model's outputs; an unknown option or one that fit sets
            itself, tensors that do not pair up, both ``run_dir`` and ``resume``, or tensors
            that are not the resumed run's.
        JimuError: a bad option value (one line per problem), a resume that its checkpoint
            contradicts (another strategy or factory, say), a worker failed.

    Example:
        >>> fitted = fit("ddp", make_model, x, y, workers=2, epochs=3)  # doctest: +SKIP
        >>> fitted.summary["train_acc"], fitted.model  # doctest: +SKIP
    """
    _not_in_a_worker()
    _check_picklable(model_factory)
    _check_importable(model_factory)
    x, y, test_x, test_y = samples_and_labels(x, y, test)
    model = model_factory()
    if not isinstance(model, nn.Sequential):
        raise ValueError(f"model_factory must return an nn.Sequential (got {type(model).__name__})")
    classes = _outputs(model, x)
    _check_labels(y, test_y, classes)
    _check_options(options, run_dir, resume)
    place = placement()
    with contextlib.ExitStack() as stack:
        new_folder = False
        if resume is not None:
            folder = Path(resume)
            _check_same_tensors(folder / "data", x, y, test_x, test_y)
            base = saved_config(folder)  # its options; the checkpoint refuses a contradiction
            base.update(resume=str(folder), **({"workers": workers} if workers else {}))
        elif run_dir is None and place.joined:  # one folder for the launcher's ranks
            folder = stack.enter_context(_shared_temporary(place)) / "run"
        elif run_dir is None:
            tmp = stack.enter_context(tempfile.TemporaryDirectory(prefix="deepjimu-fit-"))
            folder = Path(tmp) / "run"
        else:
            folder = Path(run_dir)
            check_new(folder)  # before the tensors go in
            new_folder = not folder.exists()
        if resume is None:
            base = {"workers": workers, "quiet": True}
        cfg = RunConfig.from_dict(  # its one-field checks before anything is written
            {
                **base,
                **options,
                "strategy": strategy,
                "model": factory_spec(model_factory),
                "dataset": "tensors",
                "data_dir": str(folder / "data"),
                "runs_dir": str(folder.parent),
                "name": folder.name,
                # refused where they do not apply: the keywords, not a resumed run's options
                "given": dict.fromkeys([*options, *(["workers"] if workers else [])], "fit"),
            }
        )
        if resume is None:  # under a launcher each rank writes the same file, atomically
            save_tensors(folder / "data", x, y, (test_x, test_y), num_classes=classes)
        try:
            summary = train(cfg, model_factory=model_factory)
        except ConfigErrors:  # refused before any worker started: leave no folder behind
            if new_folder:
                shutil.rmtree(folder, ignore_errors=True)
            raise
        found = latest_checkpoint(folder)
        if summary is None and (folder / "summary.json").exists():  # a launcher's other rank
            summary = json.loads((folder / "summary.json").read_text())
        if summary is None or found is None:
            raise JimuError(f"fit: the run in {folder} left no summary or final checkpoint")
        model.load_state_dict(model_state_of(found[0]))
        return Fitted(summary, model, folder if run_dir is not None or resume else None)


_FITS = itertools.count()
"""This process's fit calls under a launcher: the n-th call of each rank is the same run."""


@contextlib.contextmanager
def _shared_temporary(place: Placement) -> Iterator[Path]:
    """The temporary folder of a fit under torchrun, srun or mpirun, the same on each rank
    (its launcher's process, their parent, and the n-th fit of the script), removed by the
    last rank to be done with it, whatever the run's end.

    Raises:
        JimuError: the ranks span machines, whose temporary folders differ.
    """
    if place.local_world < place.world:
        raise JimuError(
            f"fit under {place.command} across machines needs run_dir= on a file system "
            "every machine shares: its workers read and write one run folder"
        )
    top = Path(tempfile.gettempdir()) / f"deepjimu-fit-{os.getppid()}-{next(_FITS)}"
    top.mkdir(parents=True, exist_ok=True)
    try:
        yield top
    finally:
        (top / f".done-rank{place.rank}").touch()
        if all((top / f".done-rank{r}").exists() for r in range(place.world)):
            shutil.rmtree(top, ignore_errors=True)


def _check_picklable(model_factory: ModelFactory) -> None:
    """Refuse a factory that cannot be pickled: it must reach the spawned workers.

    Raises:
        ValueError: such a factory (one line naming pickle's complaint).
    """
    try:
        pickle.dumps(model_factory)
    except Exception as e:
        raise ValueError(
            f"model_factory must be picklable to reach the workers, e.g. a module-level "
            f"function ({type(e).__name__}: {e})"
        ) from None


def _check_labels(y: Tensor, test_y: Tensor, classes: int) -> None:
    """Refuse labels (training and test) that are not below the model's ``classes`` outputs.

    Raises:
        ValueError: a label >= ``classes``.
    """
    top = int(torch.cat([y, test_y]).max()) if len(y) + len(test_y) else -1
    if top >= classes:
        raise ValueError(
            f"labels go up to {top}, the model has {classes} outputs: class indices must be "
            f"below the model's outputs (labels: 0..{top}, outputs: {classes})"
        )


def _check_options(
    options: dict[str, Any], run_dir: str | Path | None, resume: str | Path | None
) -> None:
    """Refuse an option that fit sets itself or that ``jimu train`` does not know, and
    ``run_dir`` with ``resume``.

    Raises:
        ValueError: the first such option, or both folders.
    """
    known = {f.name for f in option_fields()}
    for name in options:
        if name in _SET_BY_FIT:
            raise ValueError(f"{name} is set by fit itself (option: {name})")
        if name not in known:
            raise ValueError(f"unknown option {name!r} (the jimu train options, e.g. epochs, lr)")
    if run_dir is not None and resume is not None:
        raise ValueError(f"give run_dir or resume, not both (run_dir: {run_dir}, resume: {resume})")


def _not_in_a_worker() -> None:
    """Stop a spawned worker that runs the user's script again, in one line.

    The local launcher spawns its workers, and each one runs the script's ``__main__`` again
    (to find a factory defined there); a script that calls fit outside ``if __name__ ==
    "__main__":`` would call it again in every worker, and multiprocessing would end each
    in a long traceback. ``_inheriting`` is the flag multiprocessing's own check of this
    mistake reads (``spawn._check_not_importing_main``); there is no public one.

    Raises:
        SystemExit: this process is a worker still importing the script (its one line).
    """
    if getattr(multiprocessing.current_process(), "_inheriting", False):
        raise SystemExit(
            "error: deepjimu.fit was called again by a worker process as it imported your "
            'script: call fit under `if __name__ == "__main__":`'
        )


def _check_importable(model_factory: ModelFactory) -> None:
    """Refuse a factory that spawned workers cannot import: one defined in a ``__main__``
    that has no file (a notebook, an interactive session, a script read on stdin).

    The pickle names the factory by module and name; a worker imports ``__main__`` again
    from its file, which such a session has not. Refused however many workers: whether one
    worker runs in this process depends on the OpenMP environment (``launch``), and a
    factory must not work on one machine and fail on the next.

    Raises:
        ValueError: such a factory.
    """
    f = getattr(model_factory, "func", model_factory)
    module = getattr(f, "__module__", None) or type(f).__module__
    main_file = getattr(sys.modules.get("__main__"), "__file__", None)
    if module == "__main__" and (main_file is None or not Path(main_file).is_file()):
        name = getattr(f, "__qualname__", type(f).__qualname__)
        raise ValueError(
            f"model_factory must be importable by the worker processes: define {name} in a "
            f"module file and import it from there (a function of a notebook, of an "
            f"interactive session or of a script read on stdin cannot be imported)"
        )


def _outputs(model: nn.Sequential, x: Tensor) -> int:
    """The model's outputs per sample, from a forward pass on one sample of ``x``, in eval
    mode and without gradients (no statistics change, no random numbers are drawn).

    Raises:
        ValueError: the forward pass fails (one line naming the sample's shape) or does not
            give class scores [1, classes].
    """
    shape = tuple(x.shape[1:])
    param = next(model.parameters(), None)
    sample = x[:1].to(param.device) if param is not None else x[:1]
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            out = model(sample)
    except Exception as e:
        flat = any(isinstance(m, nn.Flatten) for m in model.modules())
        hint = (
            "; add nn.Flatten() first in the model or pass x.flatten(1)"
            if len(shape) > 1 and not flat
            else ""
        )
        raise ValueError(
            f"the model fails on one sample of x (shape {shape}): "
            f"{type(e).__name__}: {one_line(e)[:200]}{hint}"
        ) from None
    finally:
        model.train(was_training)
    if not isinstance(out, Tensor) or out.dim() != 2:
        got = tuple(out.shape) if isinstance(out, Tensor) else type(out).__name__
        raise ValueError(
            f"the model must return class scores [N, classes]; on one sample of x "
            f"(shape {shape}) it returns {got}"
        )
    return int(out.shape[1])


def _check_same_tensors(
    data_dir: Path, x: Tensor, y: Tensor, test_x: Tensor, test_y: Tensor
) -> None:
    """Refuse to resume a run on tensors other than those it was trained on.

    Raises:
        ValueError: a tensor differs from the run's saved one (or the run has none).
    """
    path = tensors_file(data_dir)
    if not path.exists():
        raise ValueError(f"resume: {path} is missing; resume a run folder that fit wrote")
    saved = load_file(path, "tensors file")
    given = {"train_x": x, "train_y": y, "test_x": test_x, "test_y": test_y}
    for name, t in given.items():
        if not torch.equal(t.cpu(), saved[name]):
            raise ValueError(
                f"resume: {name} differs from the tensors the run in {data_dir.parent} trained on"
            )
