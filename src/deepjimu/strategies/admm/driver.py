"""pdADMM drivers: one iteration serially (one block) or across workers (neighbours exchange p, q)."""

from __future__ import annotations

import math

import torch
from torch import Tensor

from deepjimu.admm_math.quantize import Change, dequantize, pack, quantize, unpack
from deepjimu.admm_math.wire import per_row
from deepjimu.comm import Comm, Pending
from deepjimu.strategies.admm.blocks import LayerBlock
from deepjimu.strategies.admm.pooled import Pool, span

__all__ = [
    "Exchange",
    "backward_sweep",
    "choose_readout",
    "distributed_iteration",
    "init_blocks_forward",
    "readout_chain",
    "serial_iteration",
]


class Exchange:
    """Sends and receives boundary tensors between neighbour ranks, as integer codes if asked.

    With ``bits`` = 8 or 16 a tensor goes on the wire as its grid codes (uint8, or int16
    viewed as bytes, which every backend carries) plus an 8-byte (scale, offset) header; the
    tensors exchanged are already on the grid, so the receiver recovers them bit-exactly.
    With 2 or 4, what goes is a tensor's change (``quantize.Change``, from
    :attr:`LayerBlock.sent`): its codes packed 4 or 2 to a byte (``quantize.pack``) plus a
    header of 8 bytes per row, one grid per sample; the receiver applies it to its copy of
    the value the sender changed, and so holds what the sender holds, bit for bit. The bytes
    are ``wire.wire_bytes``'s, which the planner counts.
    """

    def __init__(
        self,
        comm: Comm,
        bits: int,
        device: torch.device,
        pool: Pool | None = None,
        dtype: torch.dtype = torch.float32,
    ) -> None:
        self.comm, self.bits, self.device, self.pool = comm, bits, device, pool
        self.dtype = dtype  # of what goes unquantized (the blocks' variables)

    def isend(self, t: Tensor | Change, dst: int) -> list[Pending]:
        """Start sending ``t`` (float32; at 2 and 4 bits, a change) to ``dst``; at 8 or 16 bits
        with ``--replicas``, its codes on the grid of the whole tensor's range, pooled over
        the replicas, where ``t`` lies."""
        if not self.bits:
            assert isinstance(t, Tensor)
            return [self.comm.isend(t.contiguous(), dst)]
        if per_row(self.bits):
            if not isinstance(t, Change):
                raise TypeError(f"at {self.bits} bits a change crosses, not a value")
            header, payload = torch.stack([t.scale, t.offset], dim=1), pack(t.codes, self.bits)
        else:
            assert isinstance(t, Tensor)
            codes, scale, offset = quantize(t, self.bits, span(t, self.pool, self.bits))
            header = torch.stack([scale, offset]).to(torch.float32)
            payload = codes.contiguous().view(torch.uint8)
        return [self.comm.isend(header, dst), self.comm.isend(payload, dst)]

    def irecv(self, shape: tuple[int, ...], src: int, ref: Tensor | None = None) -> _Incoming:
        """Start receiving a float32 tensor of ``shape`` from ``src``; at 2 and 4 bits, a
        change, applied to ``ref``: this rank's copy of the value the sender changed."""
        if not self.bits:
            buf = torch.empty(shape, dtype=self.dtype, device=self.device)
            return _Incoming([self.comm.irecv(buf, src)], lambda: buf)
        bits, device = self.bits, self.device
        if per_row(bits):
            if ref is None:
                raise TypeError(f"at {bits} bits a change arrives: it needs the value it changes")
            base = ref  # not None, also inside finish()
            header = torch.empty((shape[0], 2), device=device)
            raw = torch.empty(-(-math.prod(shape) * bits // 8), dtype=torch.uint8, device=device)

            def finish() -> Tensor:
                codes = unpack(raw, bits, shape)
                return Change(codes, header[:, 0], header[:, 1]).apply(base)
        else:
            header = torch.empty(2, device=device)
            raw = torch.empty(
                (*shape[:-1], shape[-1] * bits // 8), dtype=torch.uint8, device=device
            )

            def finish() -> Tensor:
                code_dtype = torch.uint8 if bits == 8 else torch.int16
                return dequantize(raw.view(code_dtype), header[0], header[1])

        return _Incoming([self.comm.irecv(header, src), self.comm.irecv(raw, src)], finish)


class _Incoming:
    """A tensor on its way in; :meth:`wait` returns it."""

    def __init__(self, pending: list[Pending], finish: object) -> None:
        self._pending, self._finish = pending, finish

    def wait(self) -> Tensor:
        for p in self._pending:
            p.wait()
        return self._finish()  # type: ignore[operator]


def serial_iteration(block: LayerBlock, y: Tensor) -> None:
    """One pdADMM iteration of a block that owns every layer: p -> W, b -> z -> q -> u."""
    assert block.lo == 0 and block.hi == block.L
    block.step_p()
    block.step_wbz(y)
    block.step_qu()


def distributed_iteration(
    block: LayerBlock, y: Tensor | None, ex: Exchange, rank: int, world: int
) -> None:
    """One pdADMM iteration on ``rank``, whose block sits between ranks ``rank-1`` and ``rank+1``.

    The paper's schedule, with the messages overlapped where the update order allows:
    p step -> send p_lo left while (W, b, z) run -> receive p_hi from the right -> q, u ->
    send q_{hi-1} right -> receive q_{lo-1} from the left and keep u_{lo-1} in step. Every
    layer uses the previous iterate of its neighbours exactly as :func:`serial_iteration`
    does, so the iterates equal the serial ones.
    """
    left, right = _neighbours(rank, world)
    sends: list[Pending] = []
    block.step_p()
    if left is not None:
        sends += ex.isend(block.message("p", block.first_p()), left)
    incoming_p = (
        ex.irecv(tuple(block.last_q().shape), right, block.p_right) if right is not None else None
    )
    block.step_wbz(y)
    if incoming_p is not None:
        block.p_right = incoming_p.wait()
    block.step_qu()
    _pass_q_right(block, ex, left, right, sends)


def _neighbours(rank: int, world: int) -> tuple[int | None, int | None]:
    return rank - 1 if rank > 0 else None, rank + 1 if rank < world - 1 else None


def _pass_q_right(
    block: LayerBlock, ex: Exchange, left: int | None, right: int | None, sends: list[Pending]
) -> None:
    """Send q_{hi-1} right, receive q_{lo-1} from the left and keep u_{lo-1} in step; finish ``sends``."""
    if right is not None:
        sends += ex.isend(block.message("q", block.last_q()), right)
    if left is not None:
        block.q_left = ex.irecv(tuple(block.first_p().shape), left, block.q_left).wait()
        block.step_left_dual()
    for pending in sends:
        pending.wait()


def backward_sweep(
    block: LayerBlock, y: Tensor | None, ex: Exchange | None = None, rank: int = 0, world: int = 1
) -> None:
    """One Gauss-Seidel sweep from the last layer to the first (:meth:`LayerBlock.sweep_backward`).

    Across workers it runs right to left: rank r waits for the p_hi that rank r+1 has just
    updated, sweeps its block and sends its p_lo left; then every rank sends its new q_{hi-1}
    right, and the receiver keeps u_{lo-1} in step, as after an iteration. So the iterates
    equal one serial sweep over all layers. Like the forward start, this is a sequential
    chain (each rank waits for the one on its right): it belongs at the start, not in the loop.
    """
    if world == 1:
        block.sweep_backward(y)
        return
    assert ex is not None
    left, right = _neighbours(rank, world)
    if right is not None:
        block.p_right = ex.irecv(tuple(block.last_q().shape), right, block.p_right).wait()
    block.sweep_backward(y)
    sends = ex.isend(block.message("p", block.first_p()), left) if left is not None else []
    _pass_q_right(block, ex, left, right, sends)


def init_blocks_forward(
    block: LayerBlock,
    x: Tensor | None,
    n_samples: int,
    ex: Exchange,
    rank: int,
    world: int,
    scale: bool = False,
    unit: bool = False,
) -> None:
    """Initialise every block by one forward pass: rank r waits for rank r-1's output.

    The activations travel at full precision (the block projects them onto its grid), and
    this start-up sweep is the only sequential chain in pdADMM. With ``scale`` every layer
    is rescaled to the first layer's pre-activation RMS on the way, with ``unit`` too every
    hidden layer to unit-RMS activations (:meth:`LayerBlock.init_forward`); the factor
    accumulated so far and that RMS travel with the activations. Their shape is read off
    the first owned layer's operator, so feature maps cross as [N, C, H, W].
    """
    plain = Exchange(ex.comm, 0, ex.device, dtype=ex.dtype)
    s: tuple[float, float] | None = (1.0, 0.0) if scale else None
    if rank == 0:
        assert x is not None
        p_in = x
    else:
        shape = (n_samples, *block.ops[block.lo].in_shape)
        incoming = plain.irecv(shape, rank - 1)
        if scale:
            factor, rms = plain.irecv((2,), rank - 1).wait().tolist()
            s = (factor, rms)
        p_in = incoming.wait()
    out, s = block.init_forward(p_in, s, unit=unit)
    if rank < world - 1:
        sends = plain.isend(out, rank + 1)
        if s is not None:
            sends += plain.isend(torch.tensor(s, device=ex.device), rank + 1)
        for pending in sends:
            pending.wait()


def readout_chain(
    block: LayerBlock,
    x: Tensor | None,
    n_samples: int,
    ex: Exchange,
    rank: int,
    world: int,
    *,
    plain: bool,
    refit: bool,
) -> tuple[Tensor | None, Tensor | None]:
    """The readout's forward passes (:meth:`LayerBlock.readout_forward`) across workers.

    Like the forward start, a sequential chain: rank r waits for rank r-1's two outputs (the
    ``plain`` pass through the iterate's weights and the ``refit`` pass, each only if asked),
    which travel through ``ex``, as integer codes when the run quantizes (they are on the
    grid). The result equals the serial readout's.

    Returns:
        the logits of the two passes on the last rank, (None, None) elsewhere.
    """
    wanted = (plain, refit)
    if rank == 0:
        assert x is not None
        ins = tuple(x if w else None for w in wanted)
    else:
        shape = (n_samples, *block.ops[block.lo].in_shape)
        # at 2 and 4 bits each output is a change from q_{lo-1} (LayerBlock.output)
        incoming = [ex.irecv(shape, rank - 1, block.q_left) if w else None for w in wanted]
        ins = tuple(i.wait() if i is not None else None for i in incoming)
    outs = block.readout_forward(*ins)
    if rank == world - 1:
        return outs
    sends = [
        s
        for name, t in zip(("plain", "refit"), outs, strict=True)
        if t is not None
        for s in ex.isend(block.message(name, t), rank + 1)
    ]
    for pending in sends:
        pending.wait()
    return None, None


def choose_readout(
    block: LayerBlock,
    x: Tensor | None,
    y: Tensor | None,
    n_samples: int,
    ex: Exchange,
    rank: int,
    world: int,
    mode: str,
) -> str | None:
    """Collective over the chain: the readout ``mode`` of the current iterate (``--admm-readout``).

    Runs the forward passes that ``mode`` needs (:func:`readout_chain`; none for
    ``iterate``) and, on the last rank, :meth:`LayerBlock.readout_choice`; every rank then
    holds its layers' readout weights (:meth:`LayerBlock.readout_weights`) once it knows the
    choice, which the caller broadcasts from the last rank.

    Returns:
        the choice on the last rank (``mode`` itself unless it is ``auto``), None elsewhere.

    Raises:
        torch.linalg.LinAlgError: a refit's least squares failed.
    """
    if mode == "iterate":
        return mode
    plain, refit = readout_chain(
        block, x, n_samples, ex, rank, world,
        plain=mode in ("auto", "last"), refit=mode in ("auto", "all"),
    )  # fmt: skip
    if block.hi != block.L:
        return None
    assert y is not None
    return block.readout_choice(plain, refit, y, mode)
