"""fit: train the user's model on the user's tensors with any strategy, through the real engine."""

from __future__ import annotations

import contextlib
import dataclasses
import pickle
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from deepjimu.checkpoint import load_file
from deepjimu.config import RunConfig
from deepjimu.data.tensors import save_tensors, tensors_file
from deepjimu.errors import JimuError
from deepjimu.launch import train
from deepjimu.models import factory_spec
from deepjimu.rundir import check_new, latest_checkpoint, saved_config
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
    x: Tensor,
    y: Tensor,
    *,
    test: tuple[Tensor, Tensor] | None = None,
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

    Args:
        strategy: ``local``, ``ddp``, ``model-parallel``, ``pipeline`` or ``admm``.
        model_factory: a picklable callable returning an ``nn.Sequential`` (a module-level
            function or a ``functools.partial`` of one; not a lambda or a local function).
        x, y: training samples [N, ...] and class indices [N]; ``val_fraction`` of them is
            split off for validation, as for every data set.
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
        ValueError: a factory that is not picklable or does not build an ``nn.Sequential``,
            an unknown option or one that fit sets itself, tensors that do not pair up, both
            ``run_dir`` and ``resume``, or tensors that are not the resumed run's.
        JimuError: a bad option value (one line per problem), a resume that its checkpoint
            contradicts (another strategy or factory, say), a worker failed.

    Example:
        >>> fitted = fit("ddp", make_model, x, y, workers=2, epochs=3)  # doctest: +SKIP
        >>> fitted.summary["train_acc"], fitted.model  # doctest: +SKIP
    """
    try:
        pickle.dumps(model_factory)
    except Exception as e:
        raise ValueError(
            f"model_factory must be picklable to reach the workers, e.g. a module-level "
            f"function ({type(e).__name__}: {e})"
        ) from None
    model = model_factory()
    if not isinstance(model, nn.Sequential):
        raise ValueError(f"model_factory must return an nn.Sequential (got {type(model).__name__})")
    known = {f.name for f in dataclasses.fields(RunConfig)}
    for name in options:
        if name in _SET_BY_FIT:
            raise ValueError(f"{name} is set by fit itself (option: {name})")
        if name not in known:
            raise ValueError(f"unknown option {name!r} (the jimu train options, e.g. epochs, lr)")
    if run_dir is not None and resume is not None:
        raise ValueError(f"give run_dir or resume, not both (run_dir: {run_dir}, resume: {resume})")
    with contextlib.ExitStack() as stack:
        if resume is not None:
            folder = Path(resume)
            _check_same_tensors(folder / "data", x, y, test)
            base = saved_config(folder)  # its options; the checkpoint refuses a contradiction
            base.update(resume=str(folder), **({"workers": workers} if workers else {}))
        elif run_dir is None:
            tmp = stack.enter_context(tempfile.TemporaryDirectory(prefix="deepjimu-fit-"))
            folder = Path(tmp) / "run"
        else:
            folder = Path(run_dir)
            check_new(folder)  # before the tensors go in
        if resume is None:
            save_tensors(folder / "data", x, y, test)
            base = {"workers": workers, "quiet": True}
        cfg = RunConfig.from_dict(
            {
                **base,
                **options,
                "strategy": strategy,
                "model": factory_spec(model_factory),
                "dataset": "tensors",
                "data_dir": str(folder / "data"),
                "runs_dir": str(folder.parent),
                "name": folder.name,
            }
        )
        summary = train(cfg, model_factory=model_factory)
        found = latest_checkpoint(folder)
        if summary is None or found is None:
            raise JimuError(f"fit: the run in {folder} left no summary or final checkpoint")
        model.load_state_dict(load_file(found[0] / "model.pt"))
        return Fitted(summary, model, folder if run_dir is not None or resume else None)


def _check_same_tensors(
    data_dir: Path, x: Tensor, y: Tensor, test: tuple[Tensor, Tensor] | None
) -> None:
    """Refuse to resume a run on tensors other than those it was trained on.

    Raises:
        ValueError: a tensor differs from the run's saved one (or the run has none).
    """
    path = tensors_file(data_dir)
    if not path.exists():
        raise ValueError(f"resume: {path} is missing; resume a run folder that fit wrote")
    saved = load_file(path, "tensors file")
    test_x, test_y = test if test is not None else (x[:0], y[:0])
    given = {
        "train_x": x.float(),
        "train_y": y.long(),
        "test_x": test_x.float(),
        "test_y": test_y.long(),
    }
    for name, t in given.items():
        if not torch.equal(t.detach().cpu(), saved[name]):
            raise ValueError(
                f"resume: {name} differs from the tensors the run in {data_dir.parent} trained on"
            )
