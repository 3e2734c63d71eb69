"""The claims harness: re-measure every headline figure of README.md, docs/ and BENCHMARKS.md.

Each figure the text states is a record in ``benchmarks/claims.toml``: the claim in words,
where the text states it, the command that measures it, the metric read off that command's
run, the recorded value, a tolerance from its measured spread (or a bound the text
promises), the date it was recorded, and what it needs (a data set that is not bundled,
root, a GPU). This script runs each command once, reads every metric, and prints one row
per claim: claim / recorded / now / holds. It exits 1 when a claim does not hold, 2 on a
bad record, 0 otherwise; a claim whose needs are not met is listed as skipped, with why.

    python benchmarks/claims.py               # every claim (make claims)
    python benchmarks/claims.py --quick       # the subset make test runs (<= 3 min on 2 cores)
    python benchmarks/claims.py --only digits-admm-x2-acc,cora-admm-defaults
    python benchmarks/claims.py --list        # the records, nothing run
    python benchmarks/claims.py --markdown OUT.md   # also write the dated table

Commands are written as a user types them (``jimu ...``, ``python benchmarks/...``); they
run with this interpreter from the repository root. Placeholders: ``{runs}`` (a fresh
temporary folder per command), ``{data}`` (the folder with the real data sets:
``$DEEPJIMU_DATA``, else ``../shared/data`` beside the repository when it exists),
``{seed}`` (for a claim over seeds).

Metrics:
  ``summary:KEY`` / ``summary:RUN/KEY``  a key of ``{runs}/RUN/summary.json`` (RUN: the
                                          command's id by default)
  ``stdout:REGEX`` / ``stderr:REGEX``     the first group of the first match, as a number
  ``csv:FILE:COL=VAL,...:COLUMN``         a cell of a CSV under ``{runs}``
  ``exit``                                the command's exit code
A claim over seeds (``seeds = N``) runs its command once per seed and takes the mean.

Written by hand: pytest-benchmark and asv time functions, and neither reads a figure off a
training run's files nor checks prose against it.
"""

from __future__ import annotations

import argparse
import csv
import datetime
import json
import os
import platform
import re
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

__all__ = ["Claim", "Command", "Outcome", "evaluate", "load_claims", "main", "run_claims"]

ROOT = Path(__file__).resolve().parent.parent
RECORDS = Path(__file__).resolve().with_name("claims.toml")
_NEEDS = ("data", "root", "cuda", "netns")


class RecordError(Exception):
    """A record of claims.toml that cannot be used; the message names it."""


@dataclass(frozen=True)
class Command:
    """One measuring command, run once for all the claims that read it."""

    id: str
    argv: str
    needs: tuple[str, ...] = ()
    timeout: float = 1800.0


@dataclass(frozen=True)
class Claim:
    """One figure the text states, and how to measure it again.

    Exactly one of ``tolerance`` (holds when ``|now - recorded| <= tolerance``),
    ``at_most`` or ``at_least`` (a bound the text promises) says when it holds.
    """

    id: str
    claim: str
    where: str
    run: str
    metric: str
    recorded: float
    date: str
    spread: str
    tolerance: float | None = None
    at_most: float | None = None
    at_least: float | None = None
    seeds: int = 0
    quick: bool = False

    def holds(self, now: float) -> bool:
        """Whether ``now`` keeps the claim."""
        if self.tolerance is not None:
            return abs(now - self.recorded) <= self.tolerance + 1e-12
        if self.at_most is not None:
            return now <= self.at_most
        assert self.at_least is not None
        return now >= self.at_least

    def bound_text(self) -> str:
        if self.tolerance is not None:
            return f"{_fmt(self.recorded)} ± {_fmt(self.tolerance)}"
        if self.at_most is not None:
            return f"{_fmt(self.recorded)} (<= {_fmt(self.at_most)})"
        return f"{_fmt(self.recorded)} (>= {_fmt(self.at_least)})"


@dataclass
class Outcome:
    """A claim's result: its value now, whether it holds, or why it was skipped or failed."""

    claim: Claim
    now: float | None = None
    holds: bool | None = None
    note: str = ""
    seconds: float = 0.0


@dataclass
class _Ran:
    code: int
    stdout: str
    stderr: str
    runs: Path
    seconds: float
    error: str = ""
    extra: dict[str, Any] = field(default_factory=dict)


def load_claims(path: Path = RECORDS) -> tuple[dict[str, Command], list[Claim]]:
    """The commands and claims of ``path``.

    Raises:
        RecordError: a record misses a field, names an unknown command, states no bound or
            two, or repeats an id.
    """
    try:
        raw = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as e:
        raise RecordError(f"{path}: {e}") from None
    commands: dict[str, Command] = {}
    for cid, c in raw.get("command", {}).items():
        needs = tuple(c.get("needs", ()))
        bad = [n for n in needs if n.split(":")[0] not in _NEEDS]
        if bad or "argv" not in c:
            raise RecordError(f"{path}: command {cid}: needs argv and needs from {_NEEDS}")
        commands[cid] = Command(cid, c["argv"], needs, float(c.get("timeout", 1800)))
    claims: list[Claim] = []
    for i, c in enumerate(raw.get("claim", [])):
        name = c.get("id", f"#{i + 1}")
        missing = [k for k in ("id", "claim", "where", "run", "metric", "recorded", "date",
                               "spread") if k not in c]  # fmt: skip
        if missing:
            raise RecordError(f"{path}: claim {name} misses {', '.join(missing)}")
        bounds = [k for k in ("tolerance", "at_most", "at_least") if k in c]
        if len(bounds) != 1:
            raise RecordError(f"{path}: claim {name} needs one of tolerance, at_most, at_least")
        if c["run"] not in commands:
            raise RecordError(f"{path}: claim {name} runs unknown command {c['run']!r}")
        if c["metric"].startswith("summary:") and "/" not in c["metric"]:
            argv = shlex.split(commands[c["run"]].argv)
            if "--name" not in argv or argv[argv.index("--name") + 1] != c["run"]:
                raise RecordError(
                    f"{path}: claim {name} reads {c['run']}'s summary: its command needs "
                    f"--name {c['run']}"
                )
        known = {f for f in Claim.__dataclass_fields__}
        unknown = set(c) - known
        if unknown:
            raise RecordError(
                f"{path}: claim {name}: unknown field(s) {', '.join(sorted(unknown))}"
            )
        claims.append(Claim(**c))
    ids = [c.id for c in claims]
    if len(set(ids)) != len(ids):
        raise RecordError(
            f"{path}: repeated claim id(s): {sorted({i for i in ids if ids.count(i) > 1})}"
        )
    return commands, claims


def data_dir() -> Path | None:
    """Where the real data sets are: ``$DEEPJIMU_DATA``, else ``../shared/data``, else None."""
    env = os.environ.get("DEEPJIMU_DATA")
    for candidate in ([Path(env)] if env else []) + [ROOT.parent / "shared" / "data"]:
        if candidate.is_dir():
            return candidate
    return None


def unmet(needs: Sequence[str]) -> str | None:
    """Why this machine cannot run a command with ``needs``, or None."""
    for need in needs:
        kind, _, arg = need.partition(":")
        if kind == "data":
            d = data_dir()
            if d is None or not (d / arg).exists():
                return f"needs the {arg} data set under $DEEPJIMU_DATA or ../shared/data"
        if kind in ("root", "netns") and os.geteuid() != 0:
            return "needs root (network namespaces and rate caps)"
        if kind == "cuda":
            try:
                import torch
            except ImportError:
                return "needs torch"
            if not torch.cuda.is_available():
                return "needs a CUDA GPU"
    return None


def _argv(text: str, runs: Path, seed: int | None) -> list[str]:
    d = data_dir()
    values = {"runs": str(runs), "data": str(d) if d else "data", "seed": str(seed or 0)}
    words = [w.format(**values) for w in shlex.split(text)]
    if words[0] == "jimu":
        return [sys.executable, "-m", "deepjimu", *words[1:]]
    if words[0] == "python":
        return [sys.executable, *words[1:]]
    return words


def _run(command: Command, seed: int | None) -> _Ran:
    runs = Path(tempfile.mkdtemp(prefix=f"claims-{command.id}-"))
    argv = _argv(command.argv, runs, seed)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT / "benchmarks")]),
    }
    t0 = time.perf_counter()
    try:
        p = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True,
                           timeout=command.timeout)  # fmt: skip
    except subprocess.TimeoutExpired:
        return _Ran(
            -1, "", "", runs, time.perf_counter() - t0, f"timed out after {command.timeout:.0f} s"
        )
    return _Ran(p.returncode, p.stdout, p.stderr, runs, time.perf_counter() - t0)


def evaluate(metric: str, ran: _Ran, run_name: str) -> float:
    """The value of ``metric`` in a finished command.

    Raises:
        ValueError: the metric is not where it says (the message says what is missing).
    """
    kind, _, spec = metric.partition(":")
    if kind == "exit":
        return float(ran.code)
    if kind in ("stdout", "stderr"):
        text = ran.stdout if kind == "stdout" else ran.stderr
        m = re.search(spec, text, re.MULTILINE)
        if m is None:
            raise ValueError(f"{kind} has no match for {spec!r}")
        return float(m.group(1).replace(",", "")) if m.groups() else 1.0
    if kind == "summary":
        name, _, key = spec.rpartition("/")
        path = ran.runs / (name or run_name) / "summary.json"
        try:
            value = json.loads(path.read_text())[key]
        except (OSError, ValueError, KeyError) as e:
            raise ValueError(f"{path}: no {key} ({type(e).__name__})") from None
        return float(value)
    if kind == "csv":
        file, where, column = spec.split(":")
        wanted = dict(kv.split("=", 1) for kv in where.split(",") if kv)
        with open(ran.runs / file, newline="") as f:
            rows = [r for r in csv.DictReader(f) if all(r.get(k) == v for k, v in wanted.items())]
        if len(rows) != 1:
            raise ValueError(f"{file}: {len(rows)} rows match {where!r}")
        return float(rows[0][column])
    raise ValueError(f"unknown metric kind {kind!r}")


def run_claims(
    commands: dict[str, Command],
    claims: Sequence[Claim],
    progress: Callable[[str], None] = lambda s: None,
) -> list[Outcome]:
    """Run every command the claims need (once, or once per seed) and judge each claim."""
    outcomes: list[Outcome] = []
    ran: dict[tuple[str, int | None], _Ran] = {}
    try:
        _judge(commands, claims, progress, outcomes, ran)
    finally:
        for r in ran.values():
            shutil.rmtree(r.runs, ignore_errors=True)
    return outcomes


def _judge(
    commands: dict[str, Command],
    claims: Sequence[Claim],
    progress: Callable[[str], None],
    outcomes: list[Outcome],
    ran: dict[tuple[str, int | None], _Ran],
) -> None:
    for claim in claims:
        command = commands[claim.run]
        why = unmet(command.needs)
        if why:
            outcomes.append(Outcome(claim, note=f"skipped: {why}"))
            continue
        values, seconds, note = [], 0.0, ""
        for seed in range(claim.seeds) if claim.seeds else [None]:
            key = (command.id, seed)
            if key not in ran:
                progress(f"running {command.id}" + (f" (seed {seed})" if seed is not None else ""))
                ran[key] = _run(command, seed)
                seconds += ran[key].seconds
            r = ran[key]
            # the exit code and stderr are judged whatever the exit (a refusal is a claim too)
            if r.error or (r.code != 0 and not claim.metric.startswith(("exit", "stderr"))):
                last = (r.stderr.strip().splitlines() or [""])[-1][:160]
                note = r.error or f"exit code {r.code}: {last}"
                break
            try:
                values.append(evaluate(claim.metric, r, command.id))
            except (ValueError, OSError) as e:
                note = str(e)
                break
        if note:
            outcomes.append(Outcome(claim, holds=False, note=note, seconds=seconds))
            continue
        now = statistics.mean(values)
        outcomes.append(Outcome(claim, now, claim.holds(now), seconds=seconds))


def _fmt(v: float | None) -> str:
    if v is None:
        return "-"
    if float(v).is_integer() and abs(v) >= 1000:  # bytes, MiB: every digit counts
        return f"{v:,.0f}"
    if v == 0 or (abs(v) >= 0.01 and abs(v) < 1e6):
        return f"{v:.4g}"
    return f"{v:.3g}"


def table(outcomes: Sequence[Outcome], markdown: bool = False) -> str:
    """One row per claim: id, recorded (with its tolerance or bound), now, holds."""
    rows = [("claim", "where", "recorded", "now", "holds")]
    for o in outcomes:
        verdict = {True: "yes", False: "NO", None: "skipped"}[o.holds]
        now = _fmt(o.now) if o.now is not None else (o.note or "-")
        if o.now is not None and o.note:
            now += f" ({o.note})"
        if o.holds is False and o.now is None:
            verdict = "NO"
        rows.append((o.claim.id, o.claim.where, o.claim.bound_text(), now, verdict))
    if markdown:
        lines = ["| " + " | ".join(rows[0]) + " |", "|" + "---|" * len(rows[0])]
        lines += ["| " + " | ".join(r) + " |" for r in rows[1:]]
        return "\n".join(lines)
    widths = [min(max(len(r[i]) for r in rows), 48) for i in range(len(rows[0]))]
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="only the claims marked quick")
    p.add_argument("--only", default="", help="comma list of claim ids")
    p.add_argument("--list", action="store_true", help="print the records and run nothing")
    p.add_argument("--markdown", metavar="FILE", help="also write the table as Markdown")
    p.add_argument("--records", type=Path, default=RECORDS, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    try:
        commands, claims = load_claims(args.records)
    except RecordError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    chosen = [c for c in claims if not args.quick or c.quick]
    if args.only:
        ids = set(args.only.split(","))
        unknown = ids - {c.id for c in claims}
        if unknown:
            print(f"error: --only: unknown claim(s) {', '.join(sorted(unknown))}", file=sys.stderr)
            return 2
        chosen = [c for c in chosen if c.id in ids]
    if args.list:
        for c in chosen:
            print(
                f"{c.id}: {c.claim} [{c.where}] {c.bound_text()}, {c.metric} of: {commands[c.run].argv}"
            )
        return 0
    t0 = time.perf_counter()
    outcomes = run_claims(
        commands, chosen, progress=lambda s: print(s, file=sys.stderr, flush=True)
    )
    print(table(outcomes))
    failed = [o for o in outcomes if o.holds is False]
    skipped = [o for o in outcomes if o.holds is None]
    minutes = (time.perf_counter() - t0) / 60
    print(
        f"\n{len(outcomes) - len(failed) - len(skipped)} hold, {len(failed)} do not, "
        f"{len(skipped)} skipped; {minutes:.1f} min"
    )
    if args.markdown:
        when = datetime.datetime.now().strftime("%Y-%m-%d %H:%M")
        host = f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}"
        Path(args.markdown).write_text(
            f"`python benchmarks/claims.py{' --quick' if args.quick else ''}`, {when}, {host}, "
            f"{minutes:.0f} min:\n\n{table(outcomes, markdown=True)}\n"
        )
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
