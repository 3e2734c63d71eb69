"""``gpt:LAYERSxWIDTH:HEADS``: a GPT (nanoGPT's layout) as an ``nn.Sequential`` of blocks.

Blocks: the token and position embeddings, then one pre-norm transformer block a layer
(causal self-attention by ``torch.nn.functional.scaled_dot_product_attention``, then an MLP
of 4 x the width), then the final norm and the language-model head. So model-parallel and
pipeline cut it between transformer blocks, and ``--balance`` weighs them as any block.

The head returns the logits as (batch, vocabulary, time), the layout in which
``torch.nn.functional.cross_entropy`` takes a sequence's targets (batch, time): every
strategy's loss, and its accuracy (``argmax(1)``, per token), work on it unchanged.

Written here (no maintained package ships a GPT as blocks a pipeline can cut); nanoGPT's
choices are kept where they move the anchor figures: no biases, GELU, weights drawn from
N(0, 0.02), each residual projection's from N(0, 0.02 / sqrt(2 L)). One departure: the
embedding and the head do not share their weights (nanoGPT ties them), as tied weights
would sit on the first and last stage of a split model.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

__all__ = ["Attention", "Embed", "Head", "TransformerBlock", "gpt"]


class Embed(nn.Module):
    """Token ids (batch, time; any dtype, as data sets hold them in float32) to the sum of
    their token and position embeddings."""

    def __init__(self, vocab: int, width: int, block_size: int, dropout: float) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab, width)
        self.pos = nn.Embedding(block_size, width)
        self.drop = nn.Dropout(dropout)

    def forward(self, idx: Tensor) -> Tensor:
        pos = torch.arange(idx.shape[1], device=idx.device)
        return self.drop(self.tok(idx.long()) + self.pos(pos))


class Attention(nn.Module):
    """Causal multi-head self-attention; q, k and v are separate Linear layers, so that
    tensor parallelism cuts each by columns (a rank's heads) and ``proj`` by rows. The
    heads are counted from q's output width, so a rank holding some of them runs those."""

    def __init__(self, width: int, heads: int, dropout: float) -> None:
        super().__init__()
        self.q = nn.Linear(width, width, bias=False)
        self.k = nn.Linear(width, width, bias=False)
        self.v = nn.Linear(width, width, bias=False)
        self.proj = nn.Linear(width, width, bias=False)
        self.head_dim, self.dropout = width // heads, dropout
        self.drop = nn.Dropout(dropout)

    def forward(self, x: Tensor) -> Tensor:
        b, t, _ = x.shape

        def heads(y: Tensor) -> Tensor:
            return y.view(b, t, -1, self.head_dim).transpose(1, 2)

        y = F.scaled_dot_product_attention(
            heads(self.q(x)), heads(self.k(x)), heads(self.v(x)),
            dropout_p=self.dropout if self.training else 0.0, is_causal=True,
        )  # fmt: skip
        return self.drop(self.proj(y.transpose(1, 2).reshape(b, t, -1)))


class MLP(nn.Module):
    """Linear to 4 x the width, GELU, Linear back (``fc`` cut by columns, ``proj`` by rows)."""

    def __init__(self, width: int, dropout: float) -> None:
        super().__init__()
        self.fc = nn.Linear(width, 4 * width, bias=False)
        self.proj = nn.Linear(4 * width, width, bias=False)
        self.drop = nn.Dropout(dropout)

    def forward(self, x: Tensor) -> Tensor:
        return self.drop(self.proj(F.gelu(self.fc(x))))


class TransformerBlock(nn.Module):
    """x + attention(norm(x)), then x + mlp(norm(x))."""

    def __init__(self, width: int, heads: int, dropout: float) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(width, bias=False)
        self.attn = Attention(width, heads, dropout)
        self.ln2 = nn.LayerNorm(width, bias=False)
        self.mlp = MLP(width, dropout)

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class Head(nn.Module):
    """The final norm and the language-model head; logits as (batch, vocabulary, time)."""

    def __init__(self, width: int, vocab: int) -> None:
        super().__init__()
        self.ln = nn.LayerNorm(width, bias=False)
        self.out = nn.Linear(width, vocab, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.out(self.ln(x)).transpose(1, 2)


def gpt(
    block_size: int, vocab: int, layers: int, width: int, heads: int, dropout: float = 0.0
) -> nn.Sequential:
    """The GPT of ``layers`` transformer blocks of ``width`` and ``heads`` heads, for
    contexts of up to ``block_size`` tokens over a vocabulary of ``vocab``."""
    model = nn.Sequential(
        Embed(vocab, width, block_size, dropout),
        *(TransformerBlock(width, heads, dropout) for _ in range(layers)),
        Head(width, vocab),
    )
    for name, p in model.named_parameters():
        if p.dim() == 2:  # every Linear and Embedding; LayerNorm's weights stay ones
            std = 0.02 / math.sqrt(2 * layers) if name.endswith("proj.weight") else 0.02
            nn.init.normal_(p, mean=0.0, std=std)
    return model
