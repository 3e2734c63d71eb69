"""Checkpoints: atomic step folders, the ``latest`` pointer, and a resumed run's one history."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sys
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from deepjimu.atomic import atomic_write_text, no_space, space_error
from deepjimu.bookkeeping import Bookkeeping
from deepjimu.config import RunConfig
from deepjimu.counters import Counters
from deepjimu.errors import JimuError
from deepjimu.record.events import EventLog
from deepjimu.record.folder import MORE_ROOM, latest_checkpoint

__all__ = ["Checkpoint", "Checkpointer", "ModelState", "load_file", "model_state_of"]

# every rank reads and writes the one run folder: across machines it must be shared
_SHARED = (
    "every worker reads and writes the one run folder, so across machines it must be on a "
    "file system they all share (see Multi-node launch in the README)"
)


@dataclass
class Checkpoint:
    """A loaded checkpoint: progress counters, the full model state (read from disk a tensor
    at a time, as it is asked: :class:`ModelState`) and this rank's own state.

    ``time_s`` and ``fit_s`` are the run's clocks when it was written, and ``counters`` this
    rank's byte and time counters (see :meth:`Checkpointer.continue_history`).
    """

    step: int
    epoch: int
    model_state: Mapping[str, Tensor]
    rank_state: dict[str, Any]
    extra: dict[str, Any] = field(default_factory=dict)
    time_s: float = 0.0
    fit_s: float = 0.0
    counters: dict[str, Any] | None = None


class Checkpointer:
    """Writes and reads ``<run folder>/checkpoint``; :meth:`save` and :meth:`load` are collective.

    A checkpoint is a folder ``step-<step>`` holding the model (``model.pt``, rank 0's
    entries of its ``state_dict``, and ``model-rank<r>.pt``, those of another rank that holds
    a part: a split model's rank writes its own blocks, a sharded model's its shards, so no
    rank gathers the whole model; :func:`model_state_of` reads them back as one),
    ``rank<r>.pt`` (each rank's own state: optimizer, ADMM variables, ...) and
    ``meta.json`` (progress, the clocks, every rank's counters, the dimension each sharded
    entry is cut on, the config); ``latest``
    names the complete one. Every rank writes its state into the same folder, so a run on
    several machines needs the run folder on a shared file system: both methods check that
    every rank's file is where rank 0 looks, and refuse in one line naming the missing file.

    Args:
        cfg: the run's config (saved in ``meta.json``).
        out_dir: the run folder.
        rank, world: this process in the default process group.
        counters: this rank's counters and clocks (saved, and restored on resume).
        events: the event log (a resumed run drops the events after its checkpoint).
        bookkeeping: the collectives between ranks.
    """

    def __init__(
        self,
        cfg: RunConfig,
        out_dir: Path,
        rank: int,
        world: int,
        counters: Counters,
        events: EventLog,
        bookkeeping: Bookkeeping,
    ) -> None:
        self.cfg, self.out_dir = cfg, out_dir
        self.rank, self.world, self.is_main = rank, world, rank == 0
        self.counters, self.events, self.bookkeeping = counters, events, bookkeeping
        self.resumed: Checkpoint | None = None

    @property
    def dir(self) -> Path:
        """``<run folder>/checkpoint``."""
        return self.out_dir / "checkpoint"

    def last_text(self) -> str:
        """Where the latest checkpoint is, or "none" (for error messages)."""
        try:
            return str(self.dir / (self.dir / "latest").read_text().strip())
        except OSError:  # none yet, or the run folder is gone
            return "none"

    def save(
        self,
        step: int,
        epoch: int,
        model: nn.Module | None,
        rank_state: dict[str, Any],
        extra: dict[str, Any] | None = None,
    ) -> Path:
        """Collective: write a checkpoint atomically; the previous one stays until this is whole.

        Each rank passes the model it holds (None: nothing to save; a replicated model's
        copies are passed by rank 0 alone): the entries it holds, those not on the meta
        device, are its part; of a sharded model (torch's DTensors), its shards. Every rank passes its own ``rank_state``. Files go into a temporary folder that is renamed into place once
        every rank has written, then ``latest`` is switched. A run resumed at the step of
        its checkpoint keeps that checkpoint: it holds this very state.

        Returns:
            the checkpoint's folder.

        Raises:
            JimuError: a rank's state file is not in rank 0's folder (no shared file system).
        """
        final = self.dir / f"step-{step:08d}"
        tmp = self.dir / f".tmp-step-{step:08d}"
        if self.resumed is not None and self.resumed.step == step:
            return final
        counters = self.bookkeeping.gather_objects(self.counters.state())
        held, cuts = _held_state(model, self.rank) if model is not None else ({}, {})
        parts = [
            r for r, has in enumerate(self.bookkeeping.gather_objects(model is not None)) if has
        ]

        def start() -> None:
            if self.is_main:
                shutil.rmtree(tmp, ignore_errors=True)
                # not parents=True: a run folder removed under the run must stay removed
                self.dir.mkdir(exist_ok=True)
                tmp.mkdir()

        def states() -> None:
            if not self.is_main:  # on a machine without the shared folder: a copy of its
                tmp.mkdir(parents=True, exist_ok=True)  # own, which rank 0 finds missing below
            _torch_save(rank_state, tmp / f"rank{self.rank}.pt")
            if model is not None:
                _torch_save(held, tmp / _model_file(self.rank))

        self._each(start, step, tmp, final)
        self._each(states, step, tmp, final)
        self._check_written(tmp, parts)

        def publish() -> None:
            if not self.is_main:
                return
            meta = {
                "step": step,
                "epoch": epoch,
                "world": self.world,
                "extra": extra or {},
                "time_s": self.counters.elapsed(),
                "fit_s": self.counters.fit_s(),
                "counters": counters,
                "model_parts": parts,
                "model_cuts": cuts,
                "config": self.cfg.to_saved(),
            }
            (tmp / "meta.json").write_text(json.dumps(meta))
            shutil.rmtree(final, ignore_errors=True)
            os.replace(tmp, final)
            atomic_write_text(self.dir / "latest", final.name)
            # older checkpoints, and the partial folders of writes a kill cut short
            for old in [*self.dir.glob("step-*"), *self.dir.glob(".tmp-step-*")]:
                if old.name != final.name:
                    shutil.rmtree(old, ignore_errors=True)

        self._each(publish, step, tmp, final)
        return final

    def _check_written(self, tmp: Path, parts: list[int]) -> None:
        """Collective: refuse, in one line, a checkpoint where a rank's file is not in rank 0's
        folder (``parts``: the ranks that wrote a part of the model)."""
        lost = None  # (rank, path) of a state file missing where rank 0 looks
        if self.is_main:
            files = [(r, tmp / f"rank{r}.pt") for r in range(self.world)]
            files += [(r, tmp / _model_file(r)) for r in parts]
            lost = next(((r, str(f)) for r, f in files if not f.exists()), None)
        lost = self.bookkeeping.broadcast_object(lost)
        if lost is not None:
            if self.is_main:
                shutil.rmtree(tmp, ignore_errors=True)
            raise JimuError(
                f"checkpoint: {lost[1]} is missing after worker {lost[0]} wrote it; {_SHARED}"
            )

    def _each(self, write: Callable[[], None], step: int, tmp: Path, final: Path) -> None:
        """Collective: this rank's part of writing checkpoint ``step``; if a rank's part
        failed, every rank raises that rank's line, once rank 0 has removed what the
        unfinished checkpoint left (``tmp``, or ``final`` where ``latest`` does not name it).

        The files inside ``tmp`` need no atomic writes of their own: the folder is renamed
        into place whole. So a full disk shows here as the OSError of the write itself.
        """
        failed = None
        try:
            write()
        except KeyboardInterrupt:  # a signal mid-write: the run stops; no half-written folder
            if self.is_main:
                self._drop_unfinished(tmp, final)
            raise
        except OSError as e:
            what = f"checkpoint at step {step} not written"
            if no_space(e):
                failed = str(space_error(self.dir, e, what, MORE_ROOM))
            else:
                failed = f"{what}: {e.filename or tmp}: {e.strerror or e}"
        except JimuError as e:  # atomic_write_text of `latest`: no room for it
            failed = f"checkpoint at step {step} not written: {e}"
        failures = [f for f in self.bookkeeping.gather_objects(failed) if f is not None]
        if not failures:
            return
        if self.is_main:
            self._drop_unfinished(tmp, final)
        last = self.last_text()
        kept = (
            f"the last complete one, {last}, is kept" if last != "none" else "no earlier checkpoint"
        )
        raise JimuError(f"{failures[0]} ({kept})")

    def _drop_unfinished(self, tmp: Path, final: Path) -> None:
        """Rank 0: remove what a checkpoint that failed left behind (no debris)."""
        shutil.rmtree(tmp, ignore_errors=True)
        latest = self.dir / "latest"
        with contextlib.suppress(OSError):
            named = latest.read_text().strip() if latest.exists() else None
            if named != final.name:
                shutil.rmtree(final, ignore_errors=True)
            if not any(self.dir.iterdir()):  # the run's first checkpoint failed
                self.dir.rmdir()

    def load(self, run_dir: Path | None = None) -> Checkpoint | None:
        """Collective: the latest complete checkpoint of ``run_dir`` (default: this run), or None.

        Every rank must find the same ``latest`` checkpoint and the files it reads
        (``model.pt`` and its own ``rank<r>.pt``); where one cannot, every rank refuses.

        Raises:
            JimuError: a rank cannot find the checkpoint or one of its files (the path is
                named), the checkpoint is damaged, or it was written with another worker
                count.
        """
        root = Path(run_dir or self.out_dir) / "checkpoint"
        latest = root / "latest"
        # each rank's view, with its own paths: the message names the file where it is missing
        seen = self.bookkeeping.gather_objects(
            (latest.read_text().strip() if latest.exists() else None, str(root))
        )
        names = [name for name, _ in seen]
        if all(name is None for name in names):
            return None
        if None in names:
            r = names.index(None)
            raise JimuError(f"checkpoint: worker {r} cannot find {seen[r][1]}/latest; {_SHARED}")
        if len(set(names)) > 1:
            r = next(r for r, name in enumerate(names) if name != names[0])
            raise JimuError(
                f"checkpoint: worker {r} finds {seen[r][1]}/{names[r]}, worker 0 "
                f"{seen[0][1]}/{names[0]}; {_SHARED}"
            )
        found = latest_checkpoint(root.parent)
        assert found is not None  # every rank read `latest` above
        folder, meta = found
        if meta["world"] != self.world:
            raise JimuError(
                f"checkpoint {folder} was written by {meta['world']} "
                f"worker{'s' if meta['world'] != 1 else ''}; "
                f"resume with --workers {meta['world']} (workers: {self.world})"
            )
        needs = (*_model_files(folder), folder / f"rank{self.rank}.pt")
        missing = self.bookkeeping.gather_objects(
            next((str(p) for p in needs if not p.exists()), None)
        )
        for r, path in enumerate(missing):
            if path is not None:
                raise JimuError(f"checkpoint: worker {r} cannot find {path}; {_SHARED}")
        loaded = None
        try:
            model_state = model_state_of(folder)
            rank_state = load_file(folder / f"rank{self.rank}.pt")
        except JimuError as e:
            loaded = str(e)
        damaged = [d for d in self.bookkeeping.gather_objects(loaded) if d is not None]
        if damaged:  # every rank refuses, with the first damaged file's line
            raise JimuError(damaged[0])
        counters = meta.get("counters")
        return Checkpoint(
            meta["step"],
            meta["epoch"],
            model_state,
            rank_state,
            meta.get("extra", {}),
            meta.get("time_s", 0.0),
            meta.get("fit_s", 0.0),
            counters[self.rank] if counters else None,
        )

    def continue_history(self, ckpt: Checkpoint | None, how: str) -> None:
        """Go on with this run folder's history from ``ckpt`` (None: from the start).

        One history per run: rank 0 drops the events logged after the checkpoint's step
        (the work they record is done again) and rewrites ``events.jsonl`` atomically; the
        clocks (``time_s``, the fit time) and this rank's byte and time counters go on from
        the checkpoint's, so events and summary read as one uninterrupted run. The next
        event carries ``resumed``: the step it went on from, how (``--resume`` or the
        elastic restart), and the events dropped.
        """
        self.resumed = ckpt
        step = ckpt.step if ckpt is not None else 0
        if ckpt is not None:
            self.counters.go_on(ckpt.counters, ckpt.time_s, ckpt.fit_s)
        if not self.is_main:
            return
        dropped, torn = self.events.drop_after(step)
        self.events.note_resumed(
            {
                "step": step,
                "epoch": ckpt.epoch if ckpt is not None else 0,
                "by": how,
                "events_dropped": dropped,
            }
        )
        where = (
            f"its checkpoint at step {step}" if ckpt is not None else "the start (no checkpoint)"
        )
        cut = " and a last line cut short" if torn else ""
        print(
            f"{how}: {self.out_dir} goes on from {where}; "
            f"{dropped} later event(s){cut} dropped from events.jsonl",
            flush=True,
        )


def load_file(path: Path, what: str = "checkpoint file", mmap: bool = False) -> Any:
    """``torch.load`` of a file deepjimu wrote (``model.pt``, ``rank<r>.pt``, ``what`` in
    the message): tensors and plain containers only (``weights_only``), on the CPU.

    torch's own message for a file it cannot read advises ``weights_only=False``, which
    would run whatever code a damaged or tampered file holds: it is never passed on.

    Raises:
        JimuError: the file is missing or damaged (named, with what to do).
    """
    try:
        return torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
    except FileNotFoundError:
        raise JimuError(f"{what} {path} is missing") from None
    except Exception:  # random bytes, a cut-short zip, a foreign pickle: all the same to the user
        raise JimuError(
            f"{what} {path} is damaged (torch cannot read it); restore it from a copy, or "
            "start the run again in a new folder"
        ) from None


def _torch_save(obj: Any, path: Path) -> None:
    """``torch.save`` into a new file, a failed write raised as the OSError that says why."""
    with open(path, "wb") as f:
        try:
            torch.save(obj, f)
        except RuntimeError as e:
            # torch's writer reports a write cut short as "unexpected pos ..." while it
            # closes the zip; what cut it short is the context it was raised in: the
            # OSError that says why (no space left, ...), or a signal's Interrupted that
            # arrived mid-write (which must still stop the run, with its own line)
            if isinstance(e.__context__, (OSError, KeyboardInterrupt)):
                raise e.__context__ from None
            raise


def _held_state(model: nn.Module, rank: int) -> tuple[dict[str, Tensor], dict[str, int]]:
    """Collective where a tensor is sharded over replicas: the entries of ``model``'s state
    that this rank writes, on the CPU, and the dimension each sharded one is cut on. Not a
    split model's other blocks (on the meta device); of a sharded model (torch's DTensors),
    this rank's piece of each entry sharded within a replica (:func:`_own_piece`), the
    replicated ones and the plain ones beside them by rank 0 alone."""
    # only a run that shards has loaded DTensor; importing it here would load it for every run
    dtensor_module = sys.modules.get("torch.distributed.tensor")
    dtensor = dtensor_module.DTensor if dtensor_module is not None else None
    state = model.state_dict()
    sharded = dtensor is not None and any(isinstance(v, dtensor) for v in state.values())
    out: dict[str, Tensor] = {}
    cuts: dict[str, int] = {}
    for k, v in state.items():
        if dtensor is not None and isinstance(v, dtensor):
            piece, cut = _own_piece(v, rank)
            if piece is None:
                continue
            if cut is not None:
                cuts[k] = cut
            v = piece
        elif v.is_meta or (sharded and rank):
            continue
        out[k] = v.detach().cpu()
    return out, cuts


def _own_piece(v: Any, rank: int) -> tuple[Tensor | None, int | None]:
    """Of DTensor ``v``: the piece this rank writes (None: another rank writes it) and the
    dimension it is cut on (None: whole). A mesh's ``replica`` dimension (``--replicas``)
    holds copies: only the first replica's ranks write, and a tensor sharded over the
    replicas (tp's FSDP) is first gathered among them, a replica's piece at a time (no rank
    holds the whole). On the other dimension (at most one) each rank its shard; a tensor
    replicated everywhere is rank 0's to write."""
    from torch.distributed.tensor import Replicate

    names = v.device_mesh.mesh_dim_names or (None,) * v.device_mesh.ndim
    over_replicas = [n == "replica" for n in names]
    if any(r and not p.is_replicate() for r, p in zip(over_replicas, v.placements, strict=True)):
        v = v.redistribute(
            placements=[
                Replicate() if r else p for r, p in zip(over_replicas, v.placements, strict=True)
            ]
        )
    coordinate = v.device_mesh.get_coordinate() or [rank] * v.device_mesh.ndim
    inner = [
        (c, p) for r, c, p in zip(over_replicas, coordinate, v.placements, strict=True) if not r
    ]
    assert len(inner) <= 1, "sharded on one mesh dimension besides the replicas' only"
    first = not any(c for r, c in zip(over_replicas, coordinate, strict=True) if r)
    cut = next((p.dim for _, p in inner if p.is_shard()), None)
    if not first or (cut is None and rank):
        return None, None
    return v.to_local(), cut


def _model_file(rank: int) -> str:
    return "model.pt" if rank == 0 else f"model-rank{rank}.pt"


def _meta(folder: Path) -> dict[str, Any]:
    """Checkpoint ``folder``'s ``meta.json`` (none: empty)."""
    path = folder / "meta.json"
    return json.loads(path.read_text()) if path.exists() else {}


def _model_files(folder: Path) -> list[Path]:
    """The model's files in checkpoint ``folder``: ``model.pt`` and each other rank's part."""
    return [folder / _model_file(r) for r in _meta(folder).get("model_parts", [0])]


class ModelState(Mapping[str, Tensor]):
    """The whole model's state in checkpoint ``folder``: every rank's part read as one, each
    file memory mapped and each entry made as it is asked (a sharded entry's pieces joined on
    the dimension they were cut on): a rank that loads only its own blocks reads only theirs
    from disk, and one that loads its shards a tensor at a time holds one whole at a time.

    Raises:
        JimuError: a part is missing or damaged (named).
    """

    def __init__(self, folder: Path) -> None:
        meta = _meta(folder)
        self._parts = [load_file(path, mmap=True) for path in _model_files(folder)]
        self._cuts: dict[str, int] = meta.get("model_cuts", {})
        self._keys = list(dict.fromkeys(k for part in self._parts for k in part))

    def __getitem__(self, key: str) -> Tensor:
        pieces = [part[key] for part in self._parts if key in part]
        if not pieces:
            raise KeyError(key)
        return torch.cat(pieces, self._cuts[key]) if key in self._cuts else pieces[0]

    def __iter__(self) -> Iterator[str]:
        return iter(self._keys)

    def __len__(self) -> int:
        return len(self._keys)


def model_state_of(folder: Path) -> ModelState:
    """The whole model's state in checkpoint ``folder`` (:class:`ModelState`).

    Raises:
        JimuError: a part is missing or damaged (named).
    """
    return ModelState(folder)
