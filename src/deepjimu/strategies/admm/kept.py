"""KeptBatches: mini-batches whose auxiliary variables persist between visits (``--admm-aux keep``)."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping

import torch
import torch.nn.functional as F
from torch import Tensor

from deepjimu.admm_math import updates as U
from deepjimu.admm_math.wire import per_row
from deepjimu.strategies.admm.blocks import LayerBlock, sample_nbytes
from deepjimu.strategies.admm.driver import Exchange
from deepjimu.strategies.admm.layers import LayerOp
from deepjimu.strategies.admm.store import SampleStore
from deepjimu.strategies.base import epoch_order, split_steps

__all__ = ["KeptBatches", "kept_nbytes", "kept_readout"]


class KeptBatches:
    """Fixed batches of one worker's block, each resumed where its last visit left it.

    The samples are shuffled once (by the seed) and cut into fixed batches; every epoch
    visits each batch once, in a shuffled order. A batch's first visit starts its variables
    from a forward pass of the current weights; at every later one they are read back from
    a :class:`SampleStore` on disk, so the iteration continues instead of restarting.

    Every (W, b) step then solves the (W, b) problem over all N samples exactly: this
    batch's current (p, z) plus ``block.others``, the statistics (``updates.WbStats``,
    O(n^2) per layer whatever N) of every other batch's (p, z) at that batch's last (W, b)
    step. They are kept as a running total: a visit removes the batch's contribution from
    its last visit (kept on disk too, so it is not computed twice) and adds the one of its
    last (W, b) step now. So that rounding cannot build up over many epochs, the total is
    rebuilt each epoch from the new contributions alone, which hold every batch once when
    the epoch ends. With one batch of all N samples, an epoch is exactly one full-batch
    iteration.

    Args:
        n: samples.
        batch: samples per batch (the last batches may hold one fewer).
        seed: the run's seed (the fixed order).
        block: the worker's block; its ``others`` is set for each visit.
        directory, tag: where the store's folder goes and part of its name.
        part: with ``--replicas``, this replica's part of each batch's rows (the block pools
            its statistics with the other replicas', ``block.pooled``).
    """

    def __init__(
        self,
        n: int,
        batch: int,
        seed: int,
        block: LayerBlock,
        directory: str | None,
        tag: str,
        part: Callable[[Tensor], Tensor] | None = None,
    ) -> None:
        self.batches = split_steps(epoch_order(n, seed, 0), max(1, math.ceil(n / batch)))
        if part is not None:
            self.batches = [part(idx) for idx in self.batches]
        bounds = [0]
        for idx in self.batches:
            bounds.append(bounds[-1] + len(idx))
        self.block, self.seed = block, seed
        self.directory, self.tag = directory, tag
        self.store = SampleStore(bounds, directory, tag)
        # each batch's contribution to the statistics, as a one-row "sample" per batch
        self.parts = SampleStore(list(range(len(self.batches) + 1)), directory, tag + "-stats")
        self._total: dict[int, U.WbStats | None] = dict.fromkeys(block.layers)
        self._fresh: dict[int, U.WbStats | None] = dict.fromkeys(block.layers)
        self._visited = 0

    def order(self, epoch: int) -> list[int]:
        """The batches in the order ``epoch`` visits them."""
        return [int(k) for k in epoch_order(len(self.batches), self.seed, epoch + 1)]

    def begin(self, k: int, p0: Tensor | None, device: torch.device) -> bool:
        """Load batch k's variables if it was visited before and set the block's ``others``.

        Returns:
            whether the batch was loaded (else the caller starts it by a forward pass).
        """
        block = self.block
        if not self.store.has(k):
            block.others = dict(self._total)
            return False
        block.load_sample_state(self.store.load(k, device), p0)
        old = _unpack(self.parts.load(k, device), block.layers)
        block.others = {l: _without(self._total[l], old[l]) for l in block.layers}
        return True

    def will_need(self, k: int) -> None:
        """Batch k is visited next: its files may be read ahead (:meth:`SampleStore.will_need`)."""
        self.store.will_need(k)
        self.parts.will_need(k)

    def end(self, k: int) -> None:
        """Batch k is done: add its new statistics to the total and store its variables."""
        block = self.block
        assert block.others is not None, "begin() first"
        new = block.batch_part
        self._total = {l: U.merge_stats(block.others[l], new[l]) for l in block.layers}
        self._fresh = {l: U.merge_stats(self._fresh[l], new[l]) for l in block.layers}
        self._visited += 1
        if self._visited == len(self.batches):  # every batch once: rebuilt from the new parts
            self._total, self._visited = self._fresh, 0
            self._fresh = dict.fromkeys(block.layers)
        self.store.save(k, block.sample_state())
        self.parts.save(k, _pack(new))

    def close(self) -> None:
        self.block.others = None
        self.store.close()
        self.parts.close()


def kept_nbytes(
    ops: Mapping[int, LayerOp],
    lo: int,
    hi: int,
    L: int,
    momentum: float,
    n: int,
    batch: int,
    itemsize: int = 4,
    bits: int = 0,
) -> int:
    """Bytes on disk that :class:`KeptBatches` of the dense block lo..hi-1 of L needs at most
    for ``n`` samples in batches of ``batch``, ``itemsize`` bytes per number (float32: 4),
    exchanging at ``bits`` (``--quantize``).

    Every sample's variables (:func:`~deepjimu.strategies.admm.blocks.sample_nbytes`), each
    batch's (W, b) statistics (O(n_l n_{l-1}) per layer) and the two scratch stores that
    :func:`kept_readout` holds at once (two passes' inputs and outputs of one layer).
    """
    stats = widest = 0
    for l in range(lo, hi):
        n_in, n_out = math.prod(ops[l].in_shape), math.prod(ops[l].out_shape)
        stats += 1 + n_in + n_out + n_in * n_in + n_out * n_in
        widest = max(widest, n_in, n_out)
    batches = max(1, math.ceil(n / batch))
    scratch = n * 4 * widest  # kept_readout: two stores of two passes' activations
    return n * sample_nbytes(ops, lo, hi, L, momentum, itemsize, bits) + itemsize * (
        batches * stats + scratch
    )


@torch.no_grad()
def kept_readout(
    kept: KeptBatches,
    x: Tensor | None,
    y: Tensor | None,
    ex: Exchange,
    rank: int,
    world: int,
    mode: str,
    device: torch.device,
) -> str | None:
    """Collective over the chain: the readout ``mode`` of kept batches, one batch in memory.

    The same readout as full batch's (``driver.choose_readout``: :meth:`LayerBlock.readout_forward`,
    then :meth:`LayerBlock.readout_choice`) of every sample's variables as the store holds
    them, streamed: a refit is :func:`updates.update_Wb_stats` over the statistics of every
    batch, the exact least squares that the full-batch refit solves, and the losses that
    ``auto`` compares are sums over the batches. The activations between layers go
    through a temporary :class:`SampleStore`, so memory holds one batch whatever N is. Rank
    r takes every batch's inputs from rank r-1 first, then passes over the batches once per
    owned layer (twice where it refits), then sends its outputs on, as the full-batch chain
    does with all samples at once.

    Called after an epoch, when every batch has its variables stored.

    Returns:
        the choice on the last rank (``mode`` unless it is ``auto``), None elsewhere.

    Raises:
        torch.linalg.LinAlgError: a refit's least squares failed.
    """
    block, batches = kept.block, kept.batches
    if mode == "iterate":
        return mode
    assert all(kept.store.has(k) for k in range(len(batches))), "an epoch first"
    wanted = [n for n, on in (("plain", mode != "all"), ("refit", mode != "last")) if on]
    block.refit_Wb = {}
    # the inputs of the current layer, batch by batch; None: the data, rank 0's first layer
    acts: SampleStore | None = None

    def inputs(k: int) -> dict[str, Tensor]:
        if acts is None:
            assert x is not None
            return dict.fromkeys(wanted, x[batches[k]].to(device))
        return acts.load(k, device)

    try:
        if rank > 0:  # this block's inputs, from the previous one
            acts = _received(kept, ex, rank, wanted, device)
        for l in block.layers:
            last = l == block.L - 1
            fits = [n for n in wanted if n == "refit" or last]  # plain: the classifier alone
            stats: dict[str, U.WbStats | None] = dict.fromkeys(fits)
            for k in range(len(batches) if fits else 0):
                a, z = inputs(k), kept.store.load(k, device, (f"z{l}",))[f"z{l}"]
                for n in fits:
                    stats[n] = U.merge_stats(stats[n], U.batch_stats(a[n], z))
            solved = {n: _refit(block, l, st) for n, st in stats.items() if st is not None}
            weights = {"plain": (block.W[l], block.b[l])}
            if "refit" in solved:
                block.refit_Wb[l] = weights["refit"] = solved["refit"]
            if last:
                if "plain" in solved:
                    block.last_Wb = solved["plain"]
                assert y is not None
                return _choose(kept, inputs, y, mode, device)
            out = _pass_on(kept, l, inputs, weights, wanted, (ex, rank + 1), device)
            if acts is not None:
                acts.close()
            acts = out
        return None
    finally:
        if acts is not None:
            acts.close()


def _received(
    kept: KeptBatches, ex: Exchange, rank: int, wanted: list[str], device: torch.device
) -> SampleStore:
    """Every batch's readout inputs from rank ``rank - 1`` (at 2 and 4 bits, changes from
    the batch's q_{lo-1}: :meth:`LayerBlock.output`), in a temporary store."""
    block = kept.block
    acts = SampleStore(kept.store.bounds, kept.directory, kept.tag + "-readout")
    for k, idx in enumerate(kept.batches):
        shape = (len(idx), *block.ops[block.lo].in_shape)
        ref = _stored(kept, k, "q_left", device)
        incoming = {n: ex.irecv(shape, rank - 1, ref) for n in wanted}
        acts.save(k, {n: i.wait() for n, i in incoming.items()})
    return acts


def _pass_on(
    kept: KeptBatches,
    l: int,
    inputs: Callable[[int], dict[str, Tensor]],
    weights: dict[str, tuple[Tensor, Tensor]],
    wanted: list[str],
    to: tuple[Exchange, int],
    device: torch.device,
) -> SampleStore | None:
    """Layer l's readout outputs of every batch under each pass's ``weights``: kept in a
    temporary store for the next owned layer, or, from the last owned layer, sent batch by
    batch to the next block (``to``: the exchange and the rank; then None)."""
    block = kept.block
    edge = l == block.hi - 1
    out = None if edge else SampleStore(kept.store.bounds, kept.directory, kept.tag + "-readout")
    for k in range(len(kept.batches)):
        a, q = inputs(k), _stored(kept, k, f"q{l}", device)
        outs = {n: block.output(l, a[n], *weights[n], q, n if edge else None) for n in wanted}
        if out is not None:
            out.save(k, outs)
            continue
        ex, dst = to
        for pending in [s for n in wanted for s in ex.isend(block.message(n, outs[n]), dst)]:
            pending.wait()
    return out


def _stored(kept: KeptBatches, k: int, name: str, device: torch.device) -> Tensor | None:
    """At 2 and 4 bits, batch k's variable ``name`` as stored (q_l, q_left: what the
    readout's outputs are changes from); None at other widths, whose outputs need none."""
    if not per_row(kept.block.params.bits):
        return None
    return kept.store.load(k, device, (name,))[name]


def _refit(block: LayerBlock, l: int, stats: U.WbStats) -> tuple[Tensor, Tensor]:
    """Layer l's readout least squares over the samples ``stats`` summarises (with
    ``--replicas``, pooled over every replica's first)."""
    pool = block.pooled
    pooled = stats if pool is None else U.pool_stats([stats], pool.sum)[0]
    return U.update_Wb_stats(pooled, block.W[l], block.params.nu, ridge=block.readout_ridge)


def _choose(
    kept: KeptBatches,
    inputs: Callable[[int], dict[str, Tensor]],
    y: Tensor,
    mode: str,
    device: torch.device,
) -> str:
    """On the last block, the last layer's ``inputs`` of each batch given:
    :meth:`LayerBlock.readout_choice`, streamed."""
    if mode != "auto":
        return mode
    block = kept.block
    last = block.L - 1
    losses: dict[str, float] = {}
    for k, idx in enumerate(kept.batches):
        a, yb = inputs(k), y[idx].to(device)
        logits = {}
        if "plain" in a:
            assert block.last_Wb is not None
            logits["iterate"] = block.output(last, a["plain"], block.W[last], block.b[last])
            logits["last"] = block.output(last, a["plain"], *block.last_Wb)
        if "refit" in a:
            logits["all"] = block.output(last, a["refit"], *block.refit_Wb[last])
        for n, v in logits.items():
            losses[n] = losses.get(n, 0.0) + float(F.cross_entropy(v, yb, reduction="sum"))
    if block.pooled is not None:  # the sums over every replica's samples
        pooled = block.pooled.sum(torch.tensor(list(losses.values()), dtype=torch.float64))
        losses = dict(zip(losses, pooled.tolist(), strict=True))
    return min(losses, key=lambda n: losses[n])


def _without(total: U.WbStats | None, part: U.WbStats) -> U.WbStats | None:
    return None if total is None else U.remove_stats(total, part)


_FIELDS = ("p_mean", "z_mean", "C_pp", "C_zp")


def _pack(stats: dict[int, U.WbStats]) -> dict[str, Tensor]:
    """Statistics per layer as one-row tensors (:class:`SampleStore` rows), by flat name."""
    out = {}
    for l, st in stats.items():
        out[f"n{l}"] = torch.tensor([[st.n]], dtype=st.p_mean.dtype, device=st.p_mean.device)
        out |= {f"{f}{l}": getattr(st, f)[None] for f in _FIELDS}
    return out


def _unpack(flat: dict[str, Tensor], layers: range) -> dict[int, U.WbStats]:
    return {
        l: U.WbStats(float(flat[f"n{l}"]), *(flat[f"{f}{l}"][0] for f in _FIELDS)) for l in layers
    }
