"""admm's health checks: a run that is not learning, and a failed factorisation, end in one line."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from deepjimu.config import RunConfig
from deepjimu.errors import JimuError
from deepjimu.launch import train
from deepjimu.strategies.admm.health import Learning, chance_accuracy, hint, solve_failed


def test_a_stuck_run_is_named_and_a_slow_one_left_alone() -> None:
    stuck, slow, good = Learning(0.1), Learning(0.1), Learning(0.1)
    found = {}
    for i in range(1, 13):
        found[i] = (
            stuck.check(i, 2.30 - 1e-5 * i, 0.11),  # at chance, loss flat
            slow.check(i, 2.30 * 0.998**i, 0.11),  # at chance, loss falling 1% per 5
            good.check(i, 2.30 - 1e-5 * i, 0.9),  # converged far above chance
        )
    assert all(f == (None, None, None) for i, f in found.items() if i < 10), "judged early"
    assert found[10][0] == (
        "not learning: train accuracy 0.110 at iteration 10 is near chance (0.100) and the "
        "loss barely moved since iteration 5 (2.2999 -> 2.2999)"
    )
    assert found[10][1:] == (None, None)
    # after a resume the window must fill again before the run is judged
    resumed = Learning(0.1)
    assert resumed.check(20, 2.3, 0.1) is None and resumed.check(25, 2.3, 0.1) is not None
    assert chance_accuracy(torch.tensor([0, 1, 1, 2])) == 0.5


def test_solve_failed_names_rho_nu_and_what_to_try() -> None:
    line = solve_failed(RuntimeError("linalg.cholesky: not\npositive-definite"), 3, 1e-12, 1e12)
    assert line.startswith(
        "admm: a factorisation failed in iteration 3 (rho: 1e-12, nu: 1e+12, nu/rho: 1e+24): "
        "linalg.cholesky: not positive-definite; lower nu/rho"
    )
    assert "\n" not in line and "--rho 1 --nu 1" in line


def test_the_hint_does_not_repeat_the_penalties_a_run_has() -> None:
    assert hint(1e12, 1e-12).endswith("try --rho 1 --nu 1")
    assert hint(1e-4, 1.0).endswith("try --rho 1 --nu 1")  # rho < nu
    for rho, nu in ((1.0, 1.0), (0.5, 0.01)):  # where pdADMM learned: no --rho 1 --nu 1
        assert "--rho" not in hint(rho, nu) and "already lie" in hint(rho, nu)


@pytest.mark.parametrize(
    ("model", "rho", "nu", "expected"),
    [
        (
            "mlp:16x2",
            1e12,
            1e-12,
            r"admm is not learning: the iterate's train accuracy .* at iteration 10 is near chance",
        ),
        ("mlp:64x2", 1e-12, 1e12, r"admm: a factorisation failed in iteration \d \(rho: 1e-12"),
    ],
)
def test_admm_extremes_end_in_one_line(
    tmp_path: Path, model: str, rho: float, nu: float, expected: str
) -> None:
    # at the default readout: a refitted readout of the frozen iterate classifies 57% of
    # the digits (one z_L step towards the labels), so the check judges the iterate itself
    cfg = RunConfig(workers=1, model=model, rho=rho, nu=nu, quiet=True, threads=1,
                    runs_dir=str(tmp_path), name="x")  # fmt: skip
    with pytest.raises(JimuError, match=expected) as e:
        train(cfg)
    assert "\n" not in str(e.value) and "--rho 1 --nu 1" in str(e.value)
    assert not (tmp_path / "x" / "summary.json").exists()
