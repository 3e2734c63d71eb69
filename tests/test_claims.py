"""The claims harness: its records are sound, a claim that no longer holds fails. (The quick
subset runs after the suite in `make test`, alone: one of its claims is a speed ratio.)"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
import claims


def test_the_records_cover_every_section_that_states_a_figure() -> None:
    commands, records = claims.load_claims()
    assert len(records) >= 25
    assert {c.run for c in records} == set(commands), "a command no claim reads"
    where = " ".join(c.where for c in records)
    for section in ("README", "BENCHMARKS 1", "BENCHMARKS 2", "BENCHMARKS 3", "BENCHMARKS 4",
                    "BENCHMARKS 5", "BENCHMARKS 6", "BENCHMARKS 7", "BENCHMARKS 8",
                    "BENCHMARKS 9", "BENCHMARKS 10", "BENCHMARKS 11", "BENCHMARKS 12"):  # fmt: skip
        assert section in where, section
    quick = [c for c in records if c.quick]
    assert quick and all(commands[c.run].timeout > 0 for c in quick)


def _records(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "claims.toml"
    path.write_text(
        '[command.echo]\nargv = "python -c \\"print(\'value 5\')\\""\n\n[[claim]]\nid = "c"\n'
        'claim = "x"\nwhere = "README"\nrun = "echo"\nmetric = "stdout:value ([\\\\d.]+)"\n'
        'date = "2026-11-26"\nspread = "exact"\n' + body
    )
    return path


@pytest.mark.slow
@pytest.mark.parametrize(
    ("bound", "code", "verdict"),
    [
        ("recorded = 5\ntolerance = 0\n", 0, "yes"),
        ("recorded = 4\ntolerance = 0.5\n", 1, "NO"),  # the figure moved: the claim fails
        ("recorded = 5\nat_most = 4\n", 1, "NO"),
        ("recorded = 5\nat_least = 5\n", 0, "yes"),
    ],
)
def test_a_claim_holds_or_fails_on_what_the_command_measures(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], bound: str, code: int, verdict: str
) -> None:
    assert claims.main(["--records", str(_records(tmp_path, bound))]) == code
    row = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("c "))
    assert row.split()[-1] == verdict and " 5 " in row


def test_a_bad_record_is_refused_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _records(tmp_path, "recorded = 5\n")  # no tolerance nor bound
    assert claims.main(["--records", str(path)]) == 2
    assert capsys.readouterr().err.strip().endswith("needs one of tolerance, at_most, at_least")


def test_a_missing_data_set_is_skipped_and_says_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(claims, "data_dir", lambda: None)
    assert claims.unmet(["data:planetoid"]) == (
        "needs the planetoid data set under $DEEPJIMU_DATA or ../shared/data"
    )
