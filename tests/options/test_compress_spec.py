"""--compress values: parsing, canonical spelling, one-line errors."""

from __future__ import annotations

import pytest

from deepjimu.errors import JimuError
from deepjimu.options.compress import CompressSpec, parse_compress


@pytest.mark.parametrize(
    ("text", "spec"),
    [
        ("none", CompressSpec("none")),
        ("FP16", CompressSpec("fp16")),
        ("powersgd", CompressSpec("powersgd", rank=4)),
        ("powersgd:1", CompressSpec("powersgd", rank=1)),
        ("topk:0.05", CompressSpec("topk", ratio=0.05)),
        ("topk:1", CompressSpec("topk", ratio=1.0)),
        ("qsgd:2", CompressSpec("qsgd", bits=2)),
        ("auto", CompressSpec("auto")),
    ],
)
def test_parse_and_round_trip(text: str, spec: CompressSpec) -> None:
    assert parse_compress(text) == spec
    assert parse_compress(str(spec)) == spec


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("zip", "unknown compressor 'zip' (compress: zip; known: none, fp16"),
        ("powersgd:0", "rank must be >= 1 (compress: powersgd:0)"),
        ("powersgd:x", "rank must be an integer (compress: powersgd:x)"),
        ("topk:0", "ratio must be in (0, 1] (compress: topk:0)"),
        ("topk:1.5", "ratio must be in (0, 1] (compress: topk:1.5)"),
        ("topk:nan", "ratio must be in (0, 1] (compress: topk:nan)"),
        ("qsgd:1", "bits must be in 2..8 (compress: qsgd:1)"),
        ("qsgd:9", "bits must be in 2..8 (compress: qsgd:9)"),
        ("fp16:3", "fp16 takes no number (compress: fp16:3)"),
        ("", "unknown compressor"),
    ],
)
def test_bad_values_are_one_line(text: str, message: str) -> None:
    with pytest.raises(JimuError) as e:
        parse_compress(text)
    assert message in str(e.value)
    assert "\n" not in str(e.value)
