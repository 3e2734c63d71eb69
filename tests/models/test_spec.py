"""Model specs: parsing, block counts, built shapes, one-line errors and seeded weights."""

from __future__ import annotations

import functools

import pytest
import torch

from deepjimu.errors import JimuError
from deepjimu.models import build_model, count_blocks, factory_spec, parse_spec
from deepjimu.models.parts import keeping
from deepjimu.models.spec import ModelSpec


@pytest.mark.parametrize(
    "spec, expect",
    [
        ("mlp:256x3", ModelSpec("mlp", widths=(256, 256, 256))),
        ("mlp:100-50", ModelSpec("mlp", widths=(100, 50))),
        ("mlp:7", ModelSpec("mlp", widths=(7,))),
        (" MLP:8x2 ", ModelSpec("mlp", widths=(8, 8))),
        ("lenet", ModelSpec("lenet")),
        ("resnet", ModelSpec("resnet", blocks_per_stage=1)),
        ("resnet:3", ModelSpec("resnet", blocks_per_stage=3)),
        ("cnn:16-32", ModelSpec("cnn", widths=(16, 32))),
        ("cnn:8x3", ModelSpec("cnn", widths=(8, 8, 8))),
    ],
)
def test_parse_spec(spec: str, expect: ModelSpec) -> None:
    assert parse_spec(spec) == expect


@pytest.mark.parametrize(
    "spec, feature_shape, blocks",
    [
        ("mlp:256x3", (1, 8, 8), 4),
        ("mlp:100-50", (196,), 3),
        ("lenet", (1, 8, 8), 5),
        ("lenet", (1, 28, 28), 5),
        ("resnet", (3, 32, 32), 5),
        ("resnet:2", (3, 32, 32), 8),
        ("cnn:16-32", (1, 8, 8), 3),
        ("cnn:4x8", (1, 8, 8), 9),
        ("cnn:4-6-8", (1, 28, 28), 4),
        ("cnn:4x2", (3, 32, 32), 3),
        ("cnn:3", (1, 1, 1), 2),
    ],
)
def test_build_model_shapes_and_blocks(
    spec: str, feature_shape: tuple[int, ...], blocks: int
) -> None:
    model = build_model(spec, feature_shape, num_classes=7)
    assert count_blocks(spec) == blocks == len(model)
    x = torch.rand(2, *feature_shape)
    assert model.eval()(x).shape == (2, 7)
    # blocks chain: feeding each block's output to the next gives the same result
    h = x
    for block in model:
        h = block(h)
    torch.testing.assert_close(h, model(x))


@pytest.mark.parametrize(
    ("spec", "shape", "pooled", "flat"),
    [
        ("cnn:16-32", (1, 8, 8), [True, True], 32 * 2 * 2),
        # 8 blocks, 3 halvings of an 8x8 map: pools spread over the blocks, none below 1x1
        ("cnn:4x8", (1, 8, 8), [False, False, True, False, False, True, False, True], 4),
        ("cnn:4x6", (1, 28, 28), [False, True, True, False, True, True], 4 * 1 * 1),
        ("cnn:5-6", (1, 1, 1), [False, False], 6),
    ],
)
def test_cnn_pools_down_to_one_pixel_at_most(
    spec: str, shape: tuple[int, ...], pooled: list[bool], flat: int
) -> None:
    model = build_model(spec, shape, num_classes=10)
    convs = list(model[:-1])
    assert [isinstance(b[-1], torch.nn.AvgPool2d) for b in convs] == pooled
    assert all(isinstance(b[0], torch.nn.Conv2d) and b[0].padding == (1, 1) for b in convs)
    assert model[-1][1].in_features == flat


def test_mlp_layer_widths() -> None:
    model = build_model("mlp:100-50", (1, 14, 14), num_classes=10)
    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    assert [(m.in_features, m.out_features) for m in linears] == [(196, 100), (100, 50), (50, 10)]


@pytest.mark.parametrize(
    "spec",
    [
        "mlp",
        "mlp:",
        "mlp:0x3",
        "mlp:256x0",
        "mlp:10-0",
        "mlp:axb",
        "cnn",
        "",
        "resnet:0",
        "lenet:2",
        "cnn:",
        "cnn:0",
        "cnn:16-0",
        "cnn:16x0",
        "cnn:16-",
    ],
)
def test_bad_spec_is_one_line_error(spec: str) -> None:
    with pytest.raises(JimuError) as err:
        count_blocks(spec)
    msg = str(err.value)
    assert "\n" not in msg and repr(spec) in msg
    with pytest.raises(JimuError):
        build_model(spec, (1, 8, 8), 10)


@pytest.mark.parametrize("spec", ["lenet", "resnet", "cnn:4-8"])
def test_conv_model_on_flat_features_is_an_error(spec: str) -> None:
    with pytest.raises(JimuError, match=r"needs image inputs .* \(196,\)") as err:
        build_model(spec, (196,), 10)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize(
    "spec, shape", [("mlp:32x2", (1, 8, 8)), ("resnet", (3, 32, 32)), ("cnn:4-8", (1, 8, 8))]
)
def test_same_seed_same_weights(spec: str, shape: tuple[int, ...]) -> None:
    a, b = build_model(spec, shape, 10, seed=3), build_model(spec, shape, 10, seed=3)
    c = build_model(spec, shape, 10, seed=4)
    sa, sb, sc = a.state_dict(), b.state_dict(), c.state_dict()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    assert any(not torch.equal(sa[k], sc[k]) for k in sa if sa[k].is_floating_point())


def test_build_model_leaves_global_rng_alone() -> None:
    torch.manual_seed(123)
    before = torch.rand(3)
    torch.manual_seed(123)
    build_model("mlp:16x2", (4,), 2, seed=9)
    assert torch.equal(torch.rand(3), before)


def _factory(width: int) -> torch.nn.Sequential:
    return torch.nn.Sequential(torch.nn.Linear(4, width))


class _Maker:
    def __call__(self) -> torch.nn.Sequential:
        return _factory(2)


def test_a_factory_spec_names_the_factory_and_builds_nothing() -> None:
    assert factory_spec(_factory) == f"factory:{__name__}._factory"
    assert factory_spec(functools.partial(_factory, 3)) == f"factory:{__name__}._factory"
    assert factory_spec(_Maker()) == f"factory:{__name__}._Maker"
    spec = factory_spec(_factory)
    assert parse_spec(spec).kind == "factory" and not parse_spec(spec).needs_graph
    with pytest.raises(JimuError, match="counted on the model"):
        count_blocks(spec)
    with pytest.raises(
        JimuError, match=r"built by a Python function that only deepjimu\.fit can call"
    ):
        build_model(spec, (4,), 2)


@pytest.mark.parametrize("spec", ["mlp:16x3", "cnn:4-8", "lenet"])
def test_a_worker_builds_its_own_blocks_as_the_whole_model_would(spec: str) -> None:
    whole = build_model(spec, (1, 8, 8), 10, seed=5)
    part = build_model(spec, (1, 8, 8), 10, seed=5, place=keeping({1, 2}))
    for (name, a), (name2, b) in zip(
        whole.state_dict().items(), part.state_dict().items(), strict=True
    ):
        assert name == name2
        if name.split(".")[0] in ("1", "2"):
            assert torch.equal(a, b), name  # the same random stream, block by block
        else:
            assert b.is_meta, name  # drawn and freed: another worker's
