"""topk and qsgd encode/decode, checked against torch.topk and against the vector they stand for."""

from __future__ import annotations

import pytest
import torch

from deepjimu.compress.payload import CHUNK, qsgd_payload_bytes, topk_k
from deepjimu.compress.qsgd import qsgd_decode, qsgd_encode
from deepjimu.compress.topk import topk_decode, topk_encode, topk_indices


@pytest.mark.parametrize(("n", "k"), [(3_000, 30), (200_000, 2_000), (200_000, 7), (50, 50)])
def test_topk_indices_are_torch_topk(n: int, k: int) -> None:
    a = torch.randn(n, generator=torch.Generator().manual_seed(n)).abs()
    got = topk_indices(a, k, torch.Generator().manual_seed(1))
    assert got.numel() == k
    assert set(got.tolist()) == set(a.topk(k).indices.tolist())


def test_topk_indices_with_ties_still_gives_k() -> None:
    a = torch.zeros(100_000)
    a[:5] = 1.0
    got = topk_indices(a, 1000, torch.Generator().manual_seed(0))
    assert got.numel() == 1000 and set(range(5)) <= set(got.tolist())


def test_topk_payload_selects_per_tensor_and_decodes_to_the_mean() -> None:
    g0 = torch.tensor([1.0, -5.0, 0.5, 0.2, 9.0, -0.1])  # tensors of 4 and 2 entries
    g1 = torch.tensor([-2.0, 0.1, 0.3, 0.2, 0.0, 4.0])
    p0, i0 = topk_encode(g0, [4, 2], 0.5)
    p1, _ = topk_encode(g1, [4, 2], 0.5)
    assert sorted(i0.tolist()) == [0, 1, 4]  # two of the first tensor, one of the second
    assert p0.numel() == 3 * (4 + 4) == (topk_k(4, 0.5) + topk_k(2, 0.5)) * 8
    mean = topk_decode([p0, p1], 6, torch.float32)
    torch.testing.assert_close(mean, torch.tensor([-0.5, -2.5, 0.15, 0.0, 4.5, 2.0]))


@pytest.mark.parametrize("bits", [2, 3, 4, 5, 8])
def test_qsgd_is_unbiased_with_the_promised_payload(bits: int) -> None:
    n = 1_500
    v = torch.randn(n, generator=torch.Generator().manual_seed(0))
    gen = torch.Generator().manual_seed(1)
    payload = qsgd_encode(v, bits, gen)
    assert payload.dtype == torch.uint8 and payload.numel() == qsgd_payload_bytes(n, bits)
    slot = {2: 2, 3: 4, 4: 4, 5: 8, 8: 8}[bits]
    assert payload.numel() == 3 * CHUNK * slot // 8 + 3 * 4  # codes + 3 float32 norms
    draws = torch.stack([qsgd_decode(qsgd_encode(v, bits, gen), n, bits) for _ in range(400)])
    # every decoded entry is one of the s + 1 levels of its chunk's norm, times its sign
    s = 2 ** (bits - 1) - 1
    norms = torch.nn.functional.pad(v, (0, -n % CHUNK)).view(-1, CHUNK).norm(dim=1)
    levels = draws * s / norms.repeat_interleave(CHUNK)[:n]
    torch.testing.assert_close(levels, levels.round(), atol=1e-3, rtol=0)
    assert levels.abs().max() <= s + 1e-3
    # unbiased: each entry rounds up with probability frac(s |v_i| / norm), so the mean of
    # the draws misses v by a sum of independent errors of known variance; a rounding that
    # leaned towards (or away from) zero would move sign(v) * error far from 0
    step = norms.repeat_interleave(CHUNK)[:n] / s
    frac = torch.frac(v.abs() / step)
    var = step**2 * frac * (1 - frac) / len(draws)
    z = float((torch.sign(v) * (draws.mean(0) - v)).sum() / var.sum().sqrt())
    assert abs(z) < 5, z


def test_qsgd_eight_bits_is_close_and_zero_stays_zero() -> None:
    v = torch.randn(10_000, generator=torch.Generator().manual_seed(0))
    got = qsgd_decode(qsgd_encode(v, 8, torch.Generator()), v.numel(), 8)
    assert float((got - v).norm() / v.norm()) < 0.1
    zero = torch.zeros(700)
    assert torch.equal(qsgd_decode(qsgd_encode(zero, 4, torch.Generator()), 700, 4), zero)
