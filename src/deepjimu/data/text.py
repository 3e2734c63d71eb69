"""``shakespeare-char``: Tiny Shakespeare as characters (nanoGPT's ``shakespeare_char``), in windows of ``--block-size``.

The vocabulary is the sorted set of the text's characters (65); the first 90% of the
characters train, the last 10% validate, as nanoGPT splits them. A sample is a window of
``block_size`` characters and its target the same window shifted by one (the next
character at every position). An epoch draws as many windows as the training text holds
consecutive ones (15,685 of 64 characters), each at a random start, as nanoGPT samples
them (:meth:`~deepjimu.data.base.DataSplits.windows`, seeded by the run's seed and the
epoch); the consecutive windows are what an evaluation scores (every 9th, as many as the
validation windows). The data set has no test split of its own: its test split is the
validation split (the language-model figures are the validation loss). Ids are held as
float32, as every data set's samples are (exact below 2^24); the GPT's embedding casts
them back.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from deepjimu.choices import Family
from deepjimu.data.base import DataOptions, RawData, register_dataset
from deepjimu.data.download import fetch
from deepjimu.errors import JimuError

__all__ = ["encode", "load_shakespeare", "load_synthetic_text", "windows"]

_FILE = "input.txt"
TRAIN_SHARE = 0.9


def encode(text: str) -> tuple[np.ndarray, list[str]]:
    """``text``'s characters as ids into its sorted vocabulary, and the vocabulary.

    Example:
        >>> ids, vocab = encode("abba")
        >>> ids.tolist(), vocab
        ([0, 1, 1, 0], ['a', 'b'])
    """
    vocab = sorted(set(text))
    index = {c: i for i, c in enumerate(vocab)}
    return np.fromiter((index[c] for c in text), dtype=np.int64, count=len(text)), vocab


def windows(ids: np.ndarray, block_size: int) -> tuple[np.ndarray, np.ndarray]:
    """Consecutive windows of ``block_size`` ids and their targets (each shifted by one).

    Example:
        >>> x, y = windows(np.arange(7), 3)
        >>> x.tolist(), y.tolist()
        ([[0, 1, 2], [3, 4, 5]], [[1, 2, 3], [4, 5, 6]])
    """
    n = (len(ids) - 1) // block_size
    x = ids[: n * block_size].reshape(n, block_size)
    y = ids[1 : n * block_size + 1].reshape(n, block_size)
    return x.astype(np.float32), y


@register_dataset("shakespeare-char", Family.TEXT)
def load_shakespeare(opts: DataOptions) -> RawData:
    """Read ``shakespeare/input.txt`` under ``opts.data_dir`` (fetched with ``--download``,
    its MD5 checked) and cut it into windows of ``opts.block_size`` characters."""
    path = Path(opts.data_dir) / "shakespeare" / _FILE
    if not path.exists():
        if not opts.download:
            raise JimuError(
                f"shakespeare-char: missing file {path}; run with --download to fetch it"
            )
        fetch("shakespeare-char", _FILE, path, opts.data_url)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise JimuError(f"shakespeare-char: cannot read {path} as UTF-8 text ({e})") from None
    ids, vocab = encode(text)
    cut = int(TRAIN_SHARE * len(ids))
    block = opts.block_size
    if cut - 1 < block or len(ids) - cut - 1 < block:
        raise JimuError(
            f"shakespeare-char: {path} holds {len(ids):,} characters, too few for windows of "
            f"{block} in both its training 90% and its validation 10% (block-size: {block})"
        )
    train_x, train_y = windows(ids[:cut], block)
    val_x, val_y = windows(ids[cut:], block)
    info = {"characters": len(ids), "vocabulary": len(vocab), "block_size": block}
    return RawData(
        train_x, train_y, val_x, val_y, num_classes=len(vocab), val_x=val_x, val_y=val_y,
        info=info, train_eval_every=math.ceil(len(train_y) / len(val_y)),
        stream=ids[:cut].astype(np.float32),
    )  # fmt: skip


@register_dataset("synthetic-text", Family.TEXT)
def load_synthetic_text(opts: DataOptions) -> RawData:
    """``synthetic_n`` training windows of ``block_size`` tokens (a fifth as many validate)
    over a vocabulary of ``synthetic_features`` tokens, no files: a model of any vocabulary
    and context, GPT-2's (50,257 and 1,024) among them, is planned and trained.

    Each window starts at a random token and every next token is ``(31 t + r) mod V``, r
    drawn uniformly from 0..3: a rule a model learns down to ln 4 = 1.386 nats a token.
    """
    vocab, block = opts.synthetic_features, opts.block_size
    n_val = max(opts.synthetic_n // 5, 1)
    rng = np.random.default_rng(opts.seed + 7919)
    rows = opts.synthetic_n + n_val
    ids = np.empty((rows, block + 1), dtype=np.int64)
    ids[:, 0] = rng.integers(vocab, size=rows)
    steps = rng.integers(4, size=(rows, block))
    for t in range(block):
        ids[:, t + 1] = (31 * ids[:, t] + steps[:, t]) % vocab
    x, y = ids[:, :-1].astype(np.float32), ids[:, 1:]
    n = opts.synthetic_n
    return RawData(
        x[:n], y[:n], x[n:], y[n:], num_classes=vocab, val_x=x[n:], val_y=y[n:],
        info={"vocabulary": vocab, "block_size": block},
        train_eval_every=math.ceil(n / n_val),
    )  # fmt: skip
