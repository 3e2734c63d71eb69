"""SampleStore and KeptBatches: each batch's variables on disk between visits, exact (W, b) steps."""

from __future__ import annotations

import itertools
import os
import signal
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from torch import Tensor

from deepjimu.admm_math import updates as U
from deepjimu.errors import JimuError
from deepjimu.strategies.admm.blocks import AdmmParams, LayerBlock, sample_nbytes
from deepjimu.strategies.admm.driver import serial_iteration
from deepjimu.strategies.admm.kept import KeptBatches, kept_nbytes, kept_readout
from deepjimu.strategies.admm.store import SampleStore, mount_type, room
from processes import env

CPU = torch.device("cpu")


def test_store_gives_back_each_batch_as_last_saved(tmp_path: Path) -> None:
    store = SampleStore([0, 3, 5], str(tmp_path))
    a = {"z0": torch.arange(6.0).reshape(3, 2), "q_left": torch.ones(3, 2, 2)}
    b = {"z0": -torch.arange(4.0).reshape(2, 2), "q_left": torch.zeros(2, 2, 2)}
    store.save(0, a)
    store.save(1, b)
    assert store.has(0) and store.has(1)
    a["z0"] = a["z0"] + 10  # a second save of batch 0 replaces its rows only
    store.save(0, a)
    for k, want in ((0, a), (1, b)):
        got = store.load(k, CPU)
        assert got.keys() == want.keys()
        for name in want:
            assert torch.equal(got[name], want[name]), (k, name)
    assert store.nbytes() == 5 * 2 * 4 + 5 * 4 * 4  # one row per sample, float32
    assert not any(tmp_path.iterdir()), "the files have no name: nothing to leave behind"
    with pytest.raises(ValueError, match="was not saved with the earlier batches"):
        store.save(1, {**b, "u0": b["z0"]})
    store.close()
    store.close()  # idempotent
    assert store.nbytes() == 0 and not store.has(0)


@pytest.mark.slow
def test_a_killed_process_leaves_no_store_behind(tmp_path: Path) -> None:
    """SIGKILL runs no clean-up: the store's files must be freed by the system alone."""
    code = (
        "import os, signal, sys, torch\n"
        "from deepjimu.strategies.admm.store import SampleStore\n"
        "s = SampleStore([0, 1000], sys.argv[1])\n"
        "s.save(0, {'z0': torch.ones(1000, 100)})\n"
        "assert s.nbytes() == 400000\n"
        "os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path)], capture_output=True, env=env()
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    assert not any(tmp_path.iterdir())


def test_will_need_hints_every_file_at_the_rows_of_a_saved_batch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    hints: list[tuple[int, int, int]] = []
    monkeypatch.setattr(
        os, "posix_fadvise", lambda fd, at, n, advice: hints.append((at, n, advice))
    )
    store = SampleStore([0, 3, 5], str(tmp_path))
    store.will_need(1)  # never saved: nothing to read
    assert hints == []
    for k, rows in ((0, 3), (1, 2)):
        store.save(k, {"z0": torch.ones(rows, 2), "q_left": torch.ones(rows, 2, 2)})
    store.will_need(1)
    will = os.POSIX_FADV_WILLNEED
    assert hints == [(3 * 8, 2 * 8, will), (3 * 16, 2 * 16, will)]  # rows 3-4, float32
    store.close()


def test_store_refuses_short_files_and_failed_writes_in_one_line(
    tmp_path: Path, monkeypatch
) -> None:
    store = SampleStore([0, 2, 4], str(tmp_path))
    store.save(0, {"z0": torch.ones(2, 3)})
    store.save(1, {"z0": torch.ones(2, 3)})
    os.ftruncate(store._files["z0"][0].fileno(), 30)  # batch 1's rows cut short
    with pytest.raises(JimuError, match=r"short: z0 of batch 1 read 6 of 24 bytes"):
        store.load(1, CPU)

    def full(*args: object) -> int:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "pwrite", full)
    with pytest.raises(JimuError) as e:
        store.save(0, {"z0": torch.ones(2, 3)})
    assert "\n" not in str(e.value) and "No space left on device" in str(e.value)
    assert "set TMPDIR to a disk with room" in str(e.value)
    store.close()


def _block(seed: int = 0, bits: int = 0) -> tuple[LayerBlock, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    widths = [5, 7, 6, 3]
    x = torch.rand(24, widths[0], generator=g, dtype=torch.float64)
    y = torch.randint(0, 3, (24,), generator=g)
    W = [
        torch.randn(o, i, generator=g, dtype=torch.float64) * 0.3
        for i, o in itertools.pairwise(widths)
    ]
    b = [torch.zeros(o, dtype=torch.float64) for o in widths[1:]]
    params = AdmmParams(tau=0.5, ridge=0.01, momentum=0.5, bits=bits)
    return LayerBlock(0, 3, 3, W, b, params), x, y


def test_kept_w_step_is_the_exact_step_over_every_batch(tmp_path: Path) -> None:
    """With three batches kept, each (W, b) step is update_Wb over all samples' latest (p, z)."""
    block, x, y = _block()
    kept = KeptBatches(24, 8, 0, block, str(tmp_path), "")
    latest: dict[int, dict[int, tuple[torch.Tensor, torch.Tensor]]] = {}  # batch -> layer -> (p, z)
    for epoch in range(3):
        for k in kept.order(epoch):
            idx = kept.batches[k]
            if not kept.begin(k, x[idx], CPU):
                block.init_forward(x[idx])
            others = [latest[j] for j in latest if j != k]
            W_old = dict(block.W)
            block.step_p()
            p = {l: block.p[l].clone() for l in block.layers}
            z = {l: block.z[l].clone() for l in block.layers}
            block.step_wbz(y[idx])
            for l in block.layers:  # the independent minimiser over the concatenated samples
                P = torch.cat([p[l]] + [o[l][0] for o in others])
                Z = torch.cat([z[l]] + [o[l][1] for o in others])
                W, b = U.update_Wb(P, Z, W_old[l], 1.0, tau=0.5, ridge=0.01)
                torch.testing.assert_close(block.W[l], W)
                torch.testing.assert_close(block.b[l], b)
            latest[k] = {l: (p[l], z[l]) for l in block.layers}
            block.step_qu()
            block.extrapolate()
            kept.end(k)
    on_disk = kept.store.nbytes() + kept.parts.nbytes()
    readout_scratch = 8 * 24 * 4 * 7  # float64, 24 samples, 2 stores x 2 passes of width <= 7
    assert on_disk == kept_nbytes(block.ops, 0, 3, 3, 0.5, 24, 8, itemsize=8) - readout_scratch
    kept.close()
    assert block.others is None and not any(tmp_path.iterdir())


def _kept_epochs(block: LayerBlock, kept: KeptBatches, x: Tensor, y: Tensor, epochs: int) -> None:
    """``epochs`` passes over the kept batches, one iteration per visit (as the strategy)."""
    for epoch in range(epochs):
        for k in kept.order(epoch):
            idx = kept.batches[k]
            if not kept.begin(k, x[idx], CPU):
                block.init_forward(x[idx])
            serial_iteration(block, y[idx])
            block.extrapolate()
            kept.end(k)


def test_one_kept_batch_of_every_sample_is_the_full_batch_iteration(tmp_path: Path) -> None:
    full, x, y = _block()
    one, _, _ = _block()
    kept = KeptBatches(24, 24, 0, one, str(tmp_path), "")
    full.init_forward(x)
    for _ in range(4):
        serial_iteration(full, y)
        full.extrapolate()
    _kept_epochs(one, kept, x, y, 4)
    kept.close()
    for l in full.layers:  # the same samples in another order: the same (W, b)
        torch.testing.assert_close(one.W[l], full.W[l])
        torch.testing.assert_close(one.b[l], full.b[l])


@pytest.mark.parametrize(("mode", "bits"), [("auto", 0), ("all", 0), ("last", 0), ("auto", 4)])
def test_kept_readout_is_the_full_batch_readout_of_the_stored_iterate(
    tmp_path: Path, mode: str, bits: int
) -> None:
    """Streamed over three kept batches, the readout refits and chooses as the full-batch
    readout does on every sample's stored variables at once (at 4 bits each hidden output
    is its sample's stored q plus the change, on the sample's own grid)."""
    block, x, y = _block(bits=bits)
    kept = KeptBatches(24, 8, 0, block, str(tmp_path), "")
    _kept_epochs(block, kept, x, y, 2)
    order = torch.cat([torch.as_tensor(idx) for idx in kept.batches])
    ref, _, _ = _block(bits=bits)  # the full batch: the same weights, every batch's stored z, q
    ref.W, ref.b, ref.p = dict(block.W), dict(block.b), {0: x[order]}
    stored = [kept.store.load(k, CPU) for k in range(len(kept.batches))]
    ref.z = {l: torch.cat([s[f"z{l}"] for s in stored]) for l in ref.layers}
    ref.q = {l: torch.cat([s[f"q{l}"] for s in stored]) for l in ref.layers if l < 2}
    plain, refit = ref.readout_forward(
        x[order] if mode != "all" else None, x[order] if mode != "last" else None
    )
    expected = ref.readout_choice(plain, refit, y[order], mode)

    got = kept_readout(kept, x, y, None, 0, 1, mode, CPU)  # type: ignore[arg-type]
    assert got == expected
    if mode != "last":
        for l in ref.layers:
            for a, b in zip(block.refit_Wb[l], ref.refit_Wb[l], strict=True):
                torch.testing.assert_close(a, b)
    if mode != "all":
        for a, b in zip(block.last_Wb, ref.last_Wb, strict=True):  # type: ignore[arg-type]
            torch.testing.assert_close(a, b)
    kept.close()
    assert not any(tmp_path.iterdir())  # the readout's scratch store is gone too


@pytest.mark.parametrize(
    ("lo", "hi", "momentum", "bits"),
    [(0, 3, 0.5, 0), (0, 3, 0.0, 0), (1, 2, 0.5, 0), (1, 2, 0.5, 4), (0, 3, 0.5, 2)],
)
def test_sample_nbytes_is_the_size_of_a_samples_stored_variables(
    lo: int, hi: int, momentum: float, bits: int
) -> None:
    """What the kept store writes per sample, known before the first batch (the disk check);
    at 2 and 4 bits momentum records z alone."""
    full, x, _ = _block()
    block = LayerBlock(
        lo, hi, 3, [full.W[l] for l in range(lo, hi)], [full.b[l] for l in range(lo, hi)],
        AdmmParams(momentum=momentum, bits=bits),
    )  # fmt: skip
    block.init_forward(x if lo == 0 else torch.rand(24, 7, dtype=torch.float64))
    if hi < 3:  # the copy of the right neighbour's p, set by the driver
        block.p_right = torch.rand(24, 6, dtype=torch.float64)
    if momentum:  # as the strategy does: the first call records the previous iterate
        block.extrapolate()
    state = block.sample_state()
    stored = sum(t[0].numel() * t.element_size() for t in state.values())
    assert stored == sample_nbytes(block.ops, lo, hi, 3, momentum, itemsize=8, bits=bits)


def test_mount_type_is_the_longest_mount_point_above_the_path() -> None:
    mounts = (
        "/dev/vda / ext4 rw 0 0\ntmpfs /tmp tmpfs rw 0 0\n/dev/vdb /tmp/my\\040disk xfs rw 0 0\n"
    )
    assert mount_type("/tmp/x", mounts) == "tmpfs"
    assert mount_type("/tmpx/y", mounts) == "ext4"  # a prefix of the name is not a parent
    assert mount_type("/tmp/my disk/z", mounts) == "xfs"  # /proc/mounts writes a space as \040
    assert mount_type("/x", "") is None


@pytest.mark.parametrize("kind", ["ext4", "tmpfs"])
def test_room_of_a_folder_in_memory_is_bounded_by_the_memory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: str
) -> None:
    """A store meant to keep memory flat in N may not fill a tmpfs, which is memory."""
    import deepjimu.strategies.admm.store as store

    monkeypatch.setattr(store.shutil, "disk_usage", lambda _: SimpleNamespace(free=10**15))
    monkeypatch.setattr(store, "mount_type", lambda *_: kind)
    limit, how = room(str(tmp_path))
    if kind == "ext4":
        assert (limit, how) == (int(0.8 * 10**15), "931322.6 GB free")
        return
    meminfo = Path("/proc/meminfo").read_text().splitlines()
    available = int(next(x for x in meminfo if x.startswith("MemAvailable")).split()[1]) * 1024
    assert limit <= 0.11 * available
    assert how.startswith("931322.6 GB free, a tmpfs: memory, ") and how.endswith(" available")
