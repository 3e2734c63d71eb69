"""shakespeare-char: the text cut into windows and their next characters, 90/10, fetched and checked."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from datafiles import Server, md5

from deepjimu.data import DataOptions, load_dataset
from deepjimu.data import download as dl
from deepjimu.errors import JimuError
from texts import TEXT, put_text


def _error(opts: DataOptions) -> str:
    with pytest.raises(JimuError) as e:
        load_dataset("shakespeare-char", opts)
    return str(e.value)


def test_windows_of_the_first_90_percent_train_and_of_the_last_10_validate(tmp_path: Path) -> None:
    put_text(tmp_path, TEXT.encode())
    d = load_dataset("shakespeare-char", DataOptions(data_dir=tmp_path, block_size=16))
    vocab = sorted(set(TEXT))
    assert d.num_classes == len(vocab) and d.feature_shape == (16,)
    # 3,600 characters train: (3,600 - 1) // 16 windows; 400 validate: 399 // 16
    assert d.train_x.shape == (224, 16) and d.val_x.shape == (24, 16) and d.train_size == 224
    decode = "".join
    # each window is 16 consecutive characters, its target the same shifted by one
    assert decode(vocab[int(i)] for i in d.train_x[1]) == TEXT[16:32]
    assert decode(vocab[int(i)] for i in d.train_y[1]) == TEXT[17:33]
    assert decode(vocab[int(i)] for i in d.val_x[0]) == TEXT[3600:3616]
    # no test split of its own: the validation split; the training windows scored every 10th
    assert (d.test_x == d.val_x).all() and d.train_eval_every == 10
    assert d.eval_split("train")[0].shape == (23, 16)


def test_an_epoch_draws_its_windows_at_random_starts_seeded_and_per_shard(tmp_path: Path) -> None:
    put_text(tmp_path, TEXT.encode())
    d = load_dataset("shakespeare-char", DataOptions(data_dir=tmp_path, block_size=16))
    assert d.stream is not None and len(d.stream) == 3600  # the training 90%, as ids
    batches = d.windows(seed=0, epoch=0, steps=3)
    assert [len(y) for _, y in batches] == [75, 75, 74]  # as many windows as rows
    x = torch.cat([b[0] for b in batches])
    y = torch.cat([b[1] for b in batches])
    text = d.stream.long()
    pairs = torch.cat([text[:-1].unfold(0, 16, 1), text[1:].unfold(0, 16, 1)], 1)
    starts = []
    for row in torch.cat([x.long(), y], 1):  # each a stretch of the text and its next characters
        found = torch.nonzero((pairs == row).all(1))
        assert len(found) > 0
        starts.append(int(found[0]))
    assert len({s % 16 for s in starts}) > 8  # not the rows' fixed places
    again = d.windows(seed=0, epoch=0, steps=3)
    assert all(torch.equal(a[0], b[0]) for a, b in zip(batches, again, strict=True))
    assert not torch.equal(d.windows(seed=0, epoch=1, steps=3)[0][0], batches[0][0])
    halves = [d.shard(r, 2).windows(seed=0, epoch=0, steps=3) for r in (0, 1)]
    assert sum(len(y) for h in halves for _, y in h) == 224  # the shards' rows, each its own
    assert not torch.equal(halves[0][0][0], halves[1][0][0])


def test_synthetic_text_follows_its_rule_in_any_vocabulary_and_context() -> None:
    opts = DataOptions(synthetic_n=50, synthetic_features=50257, block_size=32, seed=3)
    d = load_dataset("synthetic-text", opts)
    assert d.num_classes == 50257 and d.feature_shape == (32,)  # GPT-2's vocabulary
    assert d.train_x.shape == (50, 32) and d.val_x.shape == (10, 32)
    x, y = d.train_x.long(), d.train_y
    assert torch.equal(x[:, 1:], y[:, :-1])  # targets: the windows shifted by one
    assert set(((y - 31 * x) % 50257).unique().tolist()) == {0, 1, 2, 3}  # the rule's steps
    again = load_dataset("synthetic-text", opts)
    assert torch.equal(again.train_x, d.train_x)  # seeded


def test_a_missing_short_or_unreadable_file_is_one_line(tmp_path: Path) -> None:
    opts = DataOptions(data_dir=tmp_path, block_size=16)
    path = tmp_path / "shakespeare" / "input.txt"
    assert _error(opts) == f"shakespeare-char: missing file {path}; run with --download to fetch it"
    put_text(tmp_path, TEXT[:100].encode())
    assert _error(opts) == (
        f"shakespeare-char: {path} holds 100 characters, too few for windows of 16 in both "
        "its training 90% and its validation 10% (block-size: 16)"
    )
    put_text(tmp_path, b"\xff\xfe" + TEXT.encode())
    assert _error(opts).startswith(f"shakespeare-char: cannot read {path} as UTF-8 text (")


def test_download_checks_the_md5_and_leaves_nothing_behind_on_a_mismatch(
    tmp_path: Path, http_server: Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    http_server.serve({"input.txt": TEXT.encode()}, prefix="/m")
    opts = DataOptions(data_dir=tmp_path, download=True, data_url=http_server.url + "/m")
    # the official MD5 refuses this text, and no file is left
    assert "checksum mismatch" in _error(opts)
    assert list((tmp_path / "shakespeare").iterdir()) == []
    source = dl.Source("http://127.0.0.1:9/unused/", {"input.txt": md5(TEXT.encode())})
    monkeypatch.setitem(dl.SOURCES, "shakespeare-char", source)
    d = load_dataset("shakespeare-char", DataOptions(**{**opts.__dict__, "block_size": 8}))
    assert d.train_size == 3599 // 8
    assert (tmp_path / "shakespeare" / "input.txt").read_text() == TEXT
