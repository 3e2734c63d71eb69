"""gpt:LAYERSxWIDTH:HEADS: its spec, a causal mask, and every split of it training as one process does."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from deepjimu.config import ConfigErrors, RunConfig
from deepjimu.errors import JimuError
from deepjimu.launch import train
from deepjimu.models import build_model, count_blocks, parse_spec
from deepjimu.strategies.tp import tp_plan
from deepjimu.validation import validate
from processes import params
from texts import TEXT, put_text


def test_the_spec_builds_embeddings_blocks_and_a_head_whose_logits_are_batch_vocab_time() -> None:
    assert parse_spec("gpt:4x128:4").heads == 4
    assert count_blocks("gpt:3x32:4") == 5
    model = build_model("gpt:3x32:4", (16,), 65)
    assert len(model) == 5
    out = model(torch.randint(0, 65, (2, 16)).float())  # ids as data sets hold them
    assert out.shape == (2, 65, 16)
    for bad, says in [
        ("gpt:2x30:4", "the width a multiple of the heads"),
        ("gpt:0x32:4", "layers, width and heads >= 1"),
        ("gpt:2x32", "a gpt spec is gpt:LAYERSxWIDTH:HEADS"),
    ]:
        with pytest.raises(JimuError, match=says):
            parse_spec(bad)


def test_a_token_never_sees_the_future() -> None:
    model = build_model("gpt:2x32:4", (12,), 20, seed=1).eval()
    x = torch.randint(0, 20, (1, 12))
    later = x.clone()
    later[0, 7:] = (later[0, 7:] + 1) % 20  # change every token from position 7 on
    a, b = model(x), model(later)
    assert torch.equal(a[..., :7], b[..., :7])  # the first 7 positions' logits are untouched
    assert not torch.allclose(a[..., 7:], b[..., 7:])


def test_dropout_acts_in_training_only_and_at_its_given_rate() -> None:
    model = build_model("gpt:2x32:4", (12,), 20, seed=1, dropout=0.5)
    rates = {m.p for m in model.modules() if isinstance(m, torch.nn.Dropout)}
    assert rates == {0.5} and model[1].attn.dropout == 0.5  # blocks' and attention's own
    x = torch.randint(0, 20, (2, 12))
    assert not torch.equal(model(x), model(x))  # masks drawn afresh at each step
    model.eval()
    assert torch.equal(model(x), model(x))
    plain = build_model("gpt:2x32:4", (12,), 20, seed=1)
    assert torch.equal(model(x), plain.eval()(x))  # the same weights; eval drops nothing


def test_tp_cuts_attention_by_heads_and_the_mlp_in_megatrons_layout() -> None:
    plan = tp_plan(build_model("gpt:1x16:2", (8,), 5))
    assert {k: type(v).__name__ for k, v in plan.items()} == {
        "1.attn.q": "ColwiseParallel", "1.attn.k": "ColwiseParallel",
        "1.attn.v": "ColwiseParallel", "1.mlp.fc": "ColwiseParallel",
        "1.attn.proj": "RowwiseParallel", "1.mlp.proj": "RowwiseParallel",
    }  # fmt: skip


@pytest.mark.parametrize(
    ("kw", "says"),
    [
        ({"strategy": "tp", "workers": 3}, "tp splits attention by heads, an equal share a rank: "
         "heads 4 and 3 ranks to split them over (model: gpt:2x32:4)"),
        ({"strategy": "admm"}, "admm solves each layer's subproblem in closed form"),
        ({"optimizer": "kfac"}, "optimizer kfac preconditions the Linear and conv layers"),
        ({"dataset": "digits"}, "model gpt:2x32:4 is a language model: it trains on text data"),
        ({"model": "mlp:32x2"}, "dataset shakespeare-char is text, whose targets are each next"),
        ({"steps": 5, "epochs": 2}, "give the run's length once: --epochs or --steps, not both"),
        ({"dropout": 1.0}, "dropout must be in [0, 1) (dropout: 1.0)"),
        ({"dataset": "digits", "model": "mlp:32x2", "dropout": 0.1},
         "--dropout applies to"),
    ],
)  # fmt: skip
def test_what_cannot_train_a_gpt_is_one_line(tmp_path: Path, kw: dict, says: str) -> None:
    _text(tmp_path)
    base = {"strategy": "local", "dataset": "shakespeare-char", "model": "gpt:2x32:4",
            "data_dir": str(tmp_path)}  # fmt: skip
    with pytest.raises(ConfigErrors) as e:
        validate(RunConfig(**{**base, **kw}))
    assert says in str(e.value)


def _text(root: Path) -> None:
    put_text(root, (TEXT * 3).encode())


@pytest.mark.slow
def test_tp_and_the_pipeline_train_a_gpt_as_one_process_does(tmp_path: Path) -> None:
    """tp x2 (heads split) and pipeline x2 (1F1B, 2 micro-batches) on the same steps as
    local: the same validation loss and weights, up to float32 sums."""
    _text(tmp_path)
    common = {"dataset": "shakespeare-char", "data_dir": str(tmp_path), "model": "gpt:2x16:2",
              "block_size": 16, "batch_size": 8, "steps": 12, "lr_schedule": "constant", "quiet": True,
              "runs_dir": str(tmp_path / "runs")}  # fmt: skip

    def run(**kw: object) -> dict:
        given = {**common, **kw}  # as flags: a constant rate, not text data's default schedule
        out = train(RunConfig(**given, given=dict.fromkeys(given, "flag")))  # type: ignore[arg-type]
        assert out is not None
        return out

    local = run(strategy="local", name="local")
    tp = run(strategy="tp", workers=2, name="tp")
    pipe = run(strategy="pipeline", workers=2, microbatches=2, schedule="1f1b", name="pipe")
    # learnt: below a uniform guess's loss, ln(vocabulary)
    assert local["steps"] == 12 and local["val_loss"] < math.log(len(set(TEXT))) - 0.1
    for other in (tp, pipe):
        assert other["steps"] == 12
        assert other["val_loss"] == pytest.approx(local["val_loss"], abs=1e-4)
    want = params(tmp_path / "runs" / "local")
    for name in ("tp", "pipe"):
        got = params(tmp_path / "runs" / name)
        assert got.keys() == want.keys()
        for k in want:
            torch.testing.assert_close(got[k], want[k], rtol=1e-4, atol=1e-5, msg=f"{name} {k}")
