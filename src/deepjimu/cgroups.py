"""Control groups of the kernel, one per worker: found, created, joined and removed.

``--emulate-speeds`` gives each worker a CPU quota (:mod:`deepjimu.emulate`) and
``--memory-limit`` a memory budget (:mod:`deepjimu.budget`), each in a group of its own that
the launcher creates before the workers start (``<folder>/rank<r>``) and removes when they
have ended. The kernel's files are the whole interface (v1: one hierarchy per controller;
v2: one hierarchy whose ``cgroup.controllers`` lists them) and no maintained Python package
wraps them for one process, so they are written here.
"""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from deepjimu.errors import JimuError

__all__ = [
    "Controller",
    "find_controller",
    "join",
    "own_group",
    "remove_groups",
    "require",
    "worker_groups",
    "write",
]


@dataclass(frozen=True)
class Controller:
    """Where a controller (``cpu``, ``memory``) is mounted, and its cgroup version (1 or 2)."""

    root: Path
    version: int


def find_controller(name: str, mounts: str | None = None) -> Controller | None:
    """The ``name`` controller's mount, from ``/proc/self/mounts`` (or ``mounts``' text).

    A v1 hierarchy with the ``name`` option wins; else a v2 (``cgroup2``) mount whose
    ``cgroup.controllers`` lists ``name``. None where neither is mounted.

    Example:
        >>> find_controller("memory", "cgroup /sys/fs/cgroup/memory cgroup rw,memory 0 0")
        Controller(root=PosixPath('/sys/fs/cgroup/memory'), version=1)
    """
    if mounts is None:
        try:
            mounts = Path("/proc/self/mounts").read_text()
        except OSError:
            return None
    v2 = None
    for line in mounts.splitlines():
        parts = line.split()
        if len(parts) < 4:
            continue
        _, where, kind, options = parts[:4]
        if kind == "cgroup" and name in options.split(","):
            return Controller(Path(where), 1)
        if kind == "cgroup2" and v2 is None:
            with contextlib.suppress(OSError):
                if name in (Path(where) / "cgroup.controllers").read_text().split():
                    v2 = Controller(Path(where), 2)
    return v2


def own_group(controller: Controller, name: str, cgroup_file: str | None = None) -> Path:
    """The group this process is in under ``controller`` (``/proc/self/cgroup``, or its
    text): the job's own group where a scheduler made one, else the root."""
    if cgroup_file is None:
        try:
            cgroup_file = Path("/proc/self/cgroup").read_text()
        except OSError:
            return controller.root
    for line in cgroup_file.splitlines():
        _, names, path = [*line.split(":", 2), "", ""][:3]
        mine = names == "" if controller.version == 2 else name in names.split(",")
        if mine:
            group = controller.root / path.lstrip("/")
            return group if group.is_dir() else controller.root
    return controller.root


def write(path: Path, text: str) -> None:
    path.write_text(text)


def remove_groups(controller: Controller, folder: Path) -> None:
    """Remove ``folder`` and its groups (their processes have ended; any left go back to
    ``folder``'s parent)."""
    if not folder.exists():
        return
    for group in sorted(p for p in folder.iterdir() if p.is_dir()):
        with contextlib.suppress(OSError):
            for pid in (group / "cgroup.procs").read_text().split():
                with contextlib.suppress(OSError):
                    write(folder.parent / "cgroup.procs", pid)
        with contextlib.suppress(OSError):
            group.rmdir()
    with contextlib.suppress(OSError):
        folder.rmdir()


def _create(
    controller: Controller,
    name: str,
    folder: Path,
    workers: int,
    configure: Callable[[Path, int], None],
    plain: Sequence[str] = (),
) -> None:
    """``folder`` with a group ``rank<r>`` per worker, each set by ``configure(group, r)``,
    and the ``plain`` groups beside them, left as made; under v2 the ``name`` controller
    handed down from ``folder``'s parent."""
    if controller.version == 2:  # the parent must hand the controller down to its children
        control = folder.parent / "cgroup.subtree_control"
        if name not in control.read_text().split():
            write(control, f"+{name}")
    folder.mkdir()
    if controller.version == 2:
        write(folder / "cgroup.subtree_control", f"+{name}")
    for other in plain:
        (folder / other).mkdir()
    for rank in range(workers):
        group = folder / f"rank{rank}"
        group.mkdir()
        configure(group, rank)


def require(controller: Controller | None, name: str, option: str) -> Controller:
    """``controller``, found mounted.

    Raises:
        JimuError: it is None: no ``name`` controller is mounted, in one line naming ``option``.
    """
    if controller is None:
        raise JimuError(
            f"{option} needs the kernel's {name} cgroup controller, and this machine has "
            f"none mounted (no v1 {name} hierarchy, no cgroup2 with {name})"
        )
    return controller


@contextlib.contextmanager
def worker_groups(
    controller: Controller,
    name: str,
    parents: Sequence[Path],
    workers: int,
    configure: Callable[[Path, int], None],
    option: str,
    kind: str,
    plain: Sequence[str] = (),
) -> Iterator[Path]:
    """Create a folder of one ``name`` group per worker (and the ``plain`` ones:
    :func:`_create`) under the first of ``parents`` that takes it, for the block; yields
    the folder and removes it afterwards, whatever happened.

    Raises:
        JimuError: no parent takes the groups (not root), in one line naming ``option`` and
            ``kind``.
    """
    tried: OSError | None = None
    for parent in dict.fromkeys(parents):
        folder = parent / f"deepjimu-{uuid.uuid4().hex[:12]}"
        try:
            _create(controller, name, folder, workers, configure, plain)
        except OSError as e:
            remove_groups(controller, folder)
            tried = e
            continue
        try:
            yield folder
        finally:
            remove_groups(controller, folder)
        return
    assert tried is not None, "no parent to create the groups under"
    why = "run as root" if isinstance(tried, PermissionError) else "check the cgroup mount"
    raise JimuError(
        f"{option} cannot create {kind} cgroups under {controller.root} "
        f"({tried.strerror or tried}); {why}"
    )


def join(env: str, rank: int, option: str, kind: str) -> None:
    """Move this process into ``<folder>/rank<rank>``, the folder named by environment
    variable ``env`` where the launcher made one (else nothing to join).

    Raises:
        JimuError: the group cannot be joined, in one line naming ``option`` and ``kind``.
    """
    folder = os.environ.get(env)
    if not folder:
        return
    group = Path(folder) / f"rank{rank}"
    try:
        write(group / "cgroup.procs", str(os.getpid()))
    except OSError as e:
        raise JimuError(
            f"{option}: worker {rank} cannot join its {kind} cgroup {group} ({e.strerror or e})"
        ) from None
