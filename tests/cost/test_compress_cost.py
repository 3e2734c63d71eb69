"""The cost model's predictions and choices on made-up probes, and the alpha-beta fit on made-up timings."""

from __future__ import annotations

import math

import numpy as np
import pytest

from deepjimu.cost.compress import CANDIDATES, PROBED, TIE, CostModel, format_predictions
from deepjimu.cost.probe import (
    LinkFit,
    Probe,
    fit_alpha_beta,
    format_probe,
    message_key,
    noisy_points,
    noisy_repeats,
)
from deepjimu.errors import JimuError
from deepjimu.measure.links import COLLECTIVES, SIZES

# DDP's layout of mlp:1024x4 on 64 features, 10 classes (1 MB first bucket, then the rest)
MLP_1024x4 = [
    [[10], [10, 1024], [1024]],
    [[1024, 1024], [1024], [1024, 1024], [1024], [1024, 1024], [1024], [1024, 64]],
]
N_PARAMS = 10 + 10 * 1024 + 4 * 1024 + 3 * 1024 * 1024 + 1024 * 64


def _probe(
    alpha: float, gbit: float, codec: dict[str, float], world: int = 2, **links: LinkFit
) -> Probe:
    link = LinkFit(alpha, 8e-9 / gbit)
    return Probe(
        world=world,
        device="cpu",
        model="mlp:1024x4",
        batch_per_rank=32,
        compute_s=0.040,
        codec_s={"none": 0.0, **codec},
        links={**dict.fromkeys(COLLECTIVES, link), **links},
        buckets=MLP_1024x4,
    )


CODEC = {"fp16": 0.002, "bf16": 0.002, "qsgd:8": 0.030, "powersgd:4": 0.010, "topk:0.01": 0.015}


def test_the_layout_has_every_parameter() -> None:
    assert sum(math.prod(s) for b in MLP_1024x4 for s in b) == N_PARAMS


def test_prediction_of_plain_all_reduce_is_compute_plus_alpha_beta_per_bucket() -> None:
    model = CostModel(_probe(1e-3, 0.1, CODEC))
    p = model.predict("none")
    beta = 8e-9 / 0.1
    sizes = [4 * sum(math.prod(s) for s in b) for b in MLP_1024x4]
    assert p.bytes_per_step == 4 * N_PARAMS
    assert p.step_s == pytest.approx(0.040 + sum(1e-3 + beta * n for n in sizes))
    assert model.predict("fp16").bytes_per_step == 2 * N_PARAMS


def test_16_bit_floats_are_reduced_at_their_own_probed_speed() -> None:
    # gloo sums float16 at half the speed per byte of bfloat16 and float32 (as on the 2-core
    # VM over loopback: 8.5 against 6.2 ms for 6 MB): bf16 wins although fp16 comes first
    beta = 8e-9 / 5.0  # 5 Gbit/s
    codec = {**CODEC, "powersgd:4": 0.030}
    model = CostModel(_probe(5e-5, 5.0, codec, all_reduce_fp16=LinkFit(5e-5, 2 * beta)))
    assert [c for c, _ in model.messages("fp16")] == ["all_reduce_fp16"] * 2
    assert [c for c, _ in model.messages("bf16")] == ["all_reduce_bf16"] * 2
    fp16, bf16 = model.predict("fp16"), model.predict("bf16")
    assert fp16.comm_s == pytest.approx(2 * bf16.comm_s, rel=0.01)
    assert fp16.step_s > (1 + TIE) * bf16.step_s and model.choose()[0] == "bf16"
    # reduced at the same speed per byte, the two tie and the less lossy fp16 is chosen
    assert CostModel(_probe(5e-5, 5.0, codec)).choose()[0] == "fp16"


def test_a_message_timed_at_its_own_size_replaces_the_fit() -> None:
    fitted = CostModel(_probe(1e-4, 0.1, CODEC))
    msgs = fitted.messages("topk:0.01")
    timed = _probe(1e-4, 0.1, CODEC)
    timed.message_s = {message_key(*msgs[1]): 0.005}  # bucket 1's all-gather, measured fast
    model = CostModel(timed)
    expected = fitted.probe.links["all_gather"].seconds(msgs[0][1]) + 0.005
    assert model.predict("topk:0.01").comm_s == pytest.approx(expected)
    assert model.predict("topk:0.01").comm_s < fitted.predict("topk:0.01").comm_s
    assert model.predict("none").step_s == fitted.predict("none").step_s  # not timed: the fit


def test_a_probe_without_a_collectives_fit_is_one_line() -> None:
    old = _probe(1e-3, 1.0, CODEC)
    del old.links["all_reduce_bf16"]  # a probe.json from before the 16-bit reductions were timed
    with pytest.raises(
        JimuError, match=r"the probe has no fit for all_reduce_bf16 .*run jimu probe again"
    ) as e:
        CostModel(old).predict("bf16")
    assert "\n" not in str(e.value)
    assert CostModel(old).predict("fp16").comm_s > 0


def test_powersgd_messages_follow_torchs_split() -> None:
    msgs = CostModel(_probe(1e-3, 1.0, CODEC)).messages("powersgd:4")
    assert [c for c, _ in msgs] == ["all_reduce"] * 6  # uncompressed, P, Q per bucket
    # bucket 0: the 10 x 1024 weight is worth compressing ((10 + 1024) * 4 * 2 < 10240)
    assert [b // 4 for _, b in msgs[:3]] == [10 + 1024, 10 * 4, 1024 * 4]
    # bucket 1: three 1024 x 1024 and one 1024 x 64 compressed, the biases not
    assert [b // 4 for _, b in msgs[3:]] == [3 * 1024, 4 * 1024 * 4, (3 * 1024 + 64) * 4]


def test_topk_and_qsgd_gather_their_payloads() -> None:
    model = CostModel(_probe(1e-3, 1.0, CODEC))
    topk = model.messages("topk:0.01")
    assert {c for c, _ in topk} == {"all_gather"}
    per_tensor = sum(math.ceil(0.01 * math.prod(s)) for b in MLP_1024x4 for s in b)
    assert sum(b for _, b in topk) == 8 * per_tensor  # float32 value + int32 index
    qsgd = model.messages("qsgd:8")
    assert sum(b for _, b in qsgd) == pytest.approx(N_PARAMS * (1 + 4 / 512), rel=0.01)


def test_a_slow_link_picks_the_strongest_compression_that_pays() -> None:
    model = CostModel(_probe(1e-4, 0.1, CODEC))  # 100 Mbit/s
    choice, predictions = model.choose()
    assert [p.option for p in predictions] == list(PROBED)  # what the probe timed
    by = {p.option: p.step_s for p in predictions if p.option in CANDIDATES}
    assert choice == min(by, key=by.__getitem__) == "powersgd:4"
    assert by["none"] > 10 * by["powersgd:4"]
    assert "powersgd:4" in format_predictions(predictions, choice)


def test_a_fast_link_keeps_plain_all_reduce() -> None:
    choice, _ = CostModel(_probe(5e-5, 100.0, CODEC)).choose()  # 100 Gbit/s
    assert choice == "none"


def test_within_the_tie_margin_the_less_lossy_option_wins() -> None:
    bare = CostModel(_probe(1e-4, 0.1, {**CODEC, "powersgd:4": 0.0, "qsgd:8": 0.0}))
    psgd = bare.predict("powersgd:4").step_s + 0.001
    # qsgd (less lossy: unbiased) predicted 3% slower than powersgd, the fastest: qsgd
    near = {**CODEC, "powersgd:4": 0.001, "qsgd:8": 1.03 * psgd - bare.predict("qsgd:8").step_s}
    model = CostModel(_probe(1e-4, 0.1, near))
    assert model.predict("powersgd:4").step_s == pytest.approx(psgd)
    assert model.predict("qsgd:8").step_s == pytest.approx(1.03 * psgd)
    assert 1 + TIE > 1.03 and model.choose()[0] == "qsgd:8"
    # 8% slower: powersgd
    far = {**near, "qsgd:8": 1.08 * psgd - bare.predict("qsgd:8").step_s}
    assert CostModel(_probe(1e-4, 0.1, far)).choose()[0] == "powersgd:4"


def test_one_worker_sends_nothing_and_topk_is_predicted_not_chosen() -> None:
    assert CostModel(_probe(1e-3, 0.01, CODEC, world=1)).choose()[0] == "none"
    # topk the fastest by far: still not chosen (its accuracy cost), but predicted
    model = CostModel(_probe(1e-4, 0.1, {**CODEC, "topk:0.01": 0.0}))
    choice, predictions = model.choose()
    steps = {p.option: p.step_s for p in predictions}
    assert steps["topk:0.01"] < min(steps[o] for o in CANDIDATES)
    assert choice != "topk:0.01" and "topk:0.01" not in CANDIDATES and "topk:0.01" in PROBED
    assert "topk:0.01" in format_predictions(predictions, choice).split("(not a candidate)")[0]


def test_an_option_the_probe_did_not_time_is_one_line() -> None:
    with pytest.raises(JimuError, match=r"the probe has no encode/decode time for 'powersgd:2'"):
        CostModel(_probe(1e-3, 1.0, CODEC)).predict("powersgd:2")


def test_fit_recovers_latency_and_bandwidth_from_noisy_timings() -> None:
    rng = np.random.default_rng(0)
    alpha, beta = 2e-4, 8e-9 / 3.0  # 200 us, 3 Gbit/s
    sizes = list(SIZES)
    times = [(alpha + beta * n) * (1 + 0.03 * rng.standard_normal()) for n in sizes]
    fit = fit_alpha_beta(sizes, times)
    assert fit.alpha_s == pytest.approx(alpha, rel=0.1)
    assert fit.beta_s_per_byte == pytest.approx(beta, rel=0.05)
    assert fit.gbit_per_s == pytest.approx(3.0, rel=0.05)
    # the small sizes are fitted as well as the large ones (relative error)
    for n, t in zip(sizes, times, strict=True):
        assert fit.seconds(n) == pytest.approx(t, rel=0.1)


def test_fit_keeps_alpha_and_beta_non_negative() -> None:
    sizes = [4096, 65536, 2**20]
    no_latency = fit_alpha_beta(sizes, [1e-9 * n - 1e-6 for n in sizes])  # alpha < 0 fits best
    assert no_latency.alpha_s == 0.0 and no_latency.beta_s_per_byte > 0
    flat = fit_alpha_beta(sizes, [1.01e-3, 1.0e-3, 0.99e-3])
    assert flat.beta_s_per_byte == 0.0 and flat.alpha_s == pytest.approx(1e-3, rel=0.02)
    with pytest.raises(ValueError):
        fit_alpha_beta([4096], [1e-3])


def test_a_probe_whose_timings_contradict_themselves_says_so() -> None:
    probe = _probe(1e-4, 1.0, CODEC)
    quiet = [(4096, 1e-4), (65536, 3e-4), (1 << 20, 2e-3)]
    probe.points = dict.fromkeys(COLLECTIVES, quiet)
    assert "warning" not in format_probe(probe)
    # the all_reduce: 4 KB at 3.99 ms, 64 KB at 0.374 ms (a fitted latency of 427 us)
    probe.points["all_reduce"] = [(4096, 3.99e-3), (65536, 3.74e-4), (1 << 20, 2e-3)]
    warned = [line for line in format_probe(probe).splitlines() if line.startswith("warning")]
    assert warned == [f"warning: {noisy_points('all_reduce', probe.points['all_reduce'])}"]
    assert "3.99 ms for 4.0 KB but 0.374 ms for 64.0 KB" in warned[0]


def test_a_probe_whose_plain_step_spreads_past_its_tolerance_says_so_in_one_line() -> None:
    probe = _probe(1e-4, 1.0, CODEC)
    probe.compute_rounds_s = [0.040, 0.041, 0.039]
    assert "warning" not in format_probe(probe)
    # another task had the cores for two rounds: (0.090 - 0.039) / 0.041 = 124% > 50%
    probe.compute_rounds_s = [0.040, 0.041, 0.039, 0.090, 0.085]
    warned = [line for line in format_probe(probe).splitlines() if line.startswith("warning")]
    assert warned == [f"warning: {probe.noisy_step()}"]
    assert "the probe's plain step (2 worker(s), 32 rows each)" in warned[0]
    assert "39 to 90 ms over 5 repeats: a spread of 124% of its median" in warned[0]
    assert "\n" not in warned[0]
    assert noisy_repeats("a step", [1.0, 1.0, 1.5]) is None  # 50%: within the tolerance
    assert noisy_repeats("a step", [1.0, 1.0, 1.51]) is not None
    # a probe file of an earlier version has no rounds: nothing to say
    old = {k: v for k, v in probe.to_dict().items() if k != "compute_rounds_s"}
    assert Probe.from_dict(old).noisy_step() is None
