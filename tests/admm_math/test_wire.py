"""Bytes of an exchanged tensor on the wire: float32, or codes plus grid headers (per row at 2 and 4 bits)."""

from __future__ import annotations

import pytest

from deepjimu.admm_math.wire import BITS, ROW_BITS, per_row, wire_bytes


def test_the_formula_by_hand() -> None:
    # 1293 samples x 256 values (digits, mlp:256x3): the exchange's messages of BENCHMARKS 7
    assert wire_bytes(1293, 256, 0) == 1293 * 256 * 4
    assert wire_bytes(1293, 256, 16) == 1293 * 256 * 2 + 8
    assert wire_bytes(1293, 256, 8) == 1293 * 256 + 8
    assert wire_bytes(1293, 256, 4) == 1293 * 128 + 8 * 1293
    assert wire_bytes(1293, 256, 2) == 1293 * 64 + 8 * 1293
    # codes of a tensor that does not fill whole bytes: the last byte is padded
    assert wire_bytes(3, 5, 4) == 8 + 3 * 8 and wire_bytes(3, 5, 2) == 4 + 3 * 8


def test_the_widths() -> None:
    assert BITS == (0, 2, 4, 8, 16) and ROW_BITS == (2, 4)
    assert [per_row(b) for b in BITS] == [False, True, True, False, False]
    with pytest.raises(ValueError, match=r"bits must be 0, 2, 4, 8 or 16 \(bits: 3\)"):
        wire_bytes(1, 1, 3)
