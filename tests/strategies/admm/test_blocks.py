"""LayerBlock: the scaled and identity starts, the backward sweep, momentum, safe checkpoints."""

from __future__ import annotations

import io
import itertools

import torch

from deepjimu.admm_math import updates as U
from deepjimu.strategies.admm.blocks import AdmmParams, LayerBlock, auto_init, auto_inner
from deepjimu.strategies.admm.driver import serial_iteration
from deepjimu.strategies.admm.layers import ConvOp, DenseOp

WIDTHS = [6, 8, 8, 3]


def _block(params: AdmmParams, seed: int = 0) -> tuple[LayerBlock, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(30, WIDTHS[0], generator=g)
    y = torch.randint(0, WIDTHS[-1], (30,), generator=g)
    W = [torch.randn(o, i, generator=g) * 0.05 for i, o in itertools.pairwise(WIDTHS)]
    b = [torch.randn(o, generator=g) * 0.01 for o in WIDTHS[1:]]
    return LayerBlock(0, 3, 3, W, b, params), x, y


def test_scaled_start_gives_every_layer_the_first_rms_and_keeps_the_predictions() -> None:
    block, x, _ = _block(AdmmParams())
    before = block.forward(x)
    W0 = block.W[0].clone()
    block.init_forward(x, scale=(1.0, 0.0))
    assert torch.equal(block.W[0], W0)  # the first layer keeps its weights
    first = float(block.z[0].square().mean().sqrt())
    for l in block.layers:
        rms = float(block.z[l].square().mean().sqrt())
        assert abs(rms / first - 1) < 1e-5, (l, rms, first)
    after = block.forward(x)
    ratio = after / before  # ReLU is positively homogeneous: one positive factor overall
    assert float(ratio.min()) > 0
    torch.testing.assert_close(
        ratio, torch.full_like(ratio, float(ratio.mean())), rtol=1e-4, atol=0
    )
    assert torch.equal(after.argmax(1), before.argmax(1))


def test_identity_start_makes_the_square_hidden_layers_pass_their_input_on() -> None:
    g = torch.Generator().manual_seed(3)
    widths = [8, 8, 8, 6, 6, 3]  # layer 0 is square but takes the data; layer 2 is 8 -> 6
    W = [torch.randn(o, i, generator=g) for i, o in itertools.pairwise(widths)]
    b = [torch.randn(o, generator=g) for o in widths[1:]]
    block = LayerBlock(0, 5, 5, [w.clone() for w in W], [v.clone() for v in b], AdmmParams())
    block.identity_start()
    for l in (1, 3):
        assert torch.equal(block.W[l], torch.eye(widths[l])) and not block.b[l].any()
    for l in (0, 2, 4):
        assert torch.equal(block.W[l], W[l]) and torch.equal(block.b[l], b[l])
    x = torch.randn(20, 8, generator=g)
    # ReLU outputs pass the identities unchanged: the net is layers 0, 2 and 4 alone
    h = torch.relu(torch.relu(x @ W[0].T + b[0]) @ W[2].T + b[2])
    torch.testing.assert_close(block.forward(x), h @ W[4].T + b[4])


def test_backward_sweep_is_the_exact_updates_from_the_last_layer_to_the_first() -> None:
    """Independent path: the pure updates of updates.py in Gauss-Seidel order, layer 2 to 0."""
    params = AdmmParams(rho=0.7, nu=1.3, tau=0.5, ridge=0.01)
    block, x, y = _block(params)
    block.init_forward(x)
    p = {l: t.clone() for l, t in block.p.items()}
    W, b, z = dict(block.W), dict(block.b), dict(block.z)
    q, u = dict(block.q), dict(block.u)
    rho, nu, tau, ridge = params.rho, params.nu, params.tau, params.ridge
    for l in (2, 1, 0):
        if l < 2:
            q[l] = U.update_q(p[l + 1], u[l], z[l], rho, nu)
            u[l] = U.update_u(u[l], p[l + 1], q[l], rho)
        W[l], b[l] = U.update_Wb(p[l], z[l], W[l], nu, tau=tau, ridge=ridge)
        a = p[l] @ W[l].T + b[l]
        z[l] = U.update_z_last(a, y, z[l], nu).z if l == 2 else U.update_z_hidden(a, q[l], z[l])
        if l > 0:
            p[l] = U.update_p(W[l], b[l], z[l], q[l - 1], u[l - 1], rho, nu)
    block.sweep_backward(y)
    for name, want in (("W", W), ("b", b), ("z", z), ("q", q), ("u", u), ("p", p)):
        for l, t in want.items():
            torch.testing.assert_close(getattr(block, name)[l], t, msg=f"{name}{l}")


def test_one_sweep_carries_the_labels_to_the_first_layer_one_iteration_does_not() -> None:
    """From a forward start (u = 0, z = a), a Jacobi p-step returns p_1 = q_0: the first layer
    sees the labels only after L - 1 iterations. A sweep moves p_1 and the first layer's z."""
    jacobi, x, y = _block(AdmmParams())
    sweep, _, _ = _block(AdmmParams())
    for blk in (jacobi, sweep):
        blk.init_forward(x)
    p1, z0 = jacobi.p[1].clone(), jacobi.z[0].clone()
    serial_iteration(jacobi, y)
    torch.testing.assert_close(jacobi.p[1], p1)
    torch.testing.assert_close(jacobi.z[0], z0, rtol=1e-4, atol=1e-6)
    sweep.sweep_backward(y)
    assert float((sweep.p[1] - p1).abs().max()) > 1e-4
    assert float((sweep.z[0] - z0).abs().max()) > 1e-4


def test_auto_init_is_unit_for_cnns_identity_for_deep_mlps() -> None:
    dense = [DenseOp((8,), 8)] * 7
    assert auto_init(dense) == "forward"
    assert auto_init([*dense, DenseOp((8,), 3)]) == "identity"
    assert auto_init([ConvOp((1, 8, 8), 4), DenseOp((4, 8, 8), 3)]) == "unit"


def test_auto_inner_is_4_per_layer_for_deep_mlps_else_2() -> None:
    dense = [DenseOp((8,), 8)] * 7
    assert auto_inner(dense) == 14
    assert auto_inner([*dense, DenseOp((8,), 3)]) == 32
    conv = [ConvOp((1, 8, 8), 4)] * 8
    assert auto_inner([*conv, DenseOp((4, 8, 8), 3)]) == 18


def test_momentum_zero_changes_nothing_and_first_call_only_records() -> None:
    plain, x, y = _block(AdmmParams())
    moved, _, _ = _block(AdmmParams(momentum=0.0))
    for blk in (plain, moved):
        blk.init_forward(x)
    for _ in range(3):
        serial_iteration(plain, y)
        serial_iteration(moved, y)
        moved.extrapolate()
    for l in plain.layers:
        torch.testing.assert_close(moved.W[l], plain.W[l])
    fresh, _, _ = _block(AdmmParams(momentum=0.9))
    fresh.init_forward(x)
    serial_iteration(fresh, y)
    W = {l: w.clone() for l, w in fresh.W.items()}
    fresh.extrapolate()  # nothing to extrapolate from yet
    assert all(torch.equal(fresh.W[l], W[l]) for l in fresh.layers)


def test_state_dict_round_trips_through_weights_only_load() -> None:
    block, x, y = _block(AdmmParams(momentum=0.5, memory=0.9))
    block.init_forward(x)
    for _ in range(2):
        serial_iteration(block, y)
        block.extrapolate()
    block.commit_batch()
    buf = io.BytesIO()
    torch.save(block.state_dict(), buf)
    buf.seek(0)
    state = torch.load(buf, weights_only=True)
    other, _, _ = _block(AdmmParams(momentum=0.5, memory=0.9), seed=1)
    other.load_state_dict(state, torch.device("cpu"))
    for a, b in ((block, other),):
        serial_iteration(a, y)
        serial_iteration(b, y)
        a.extrapolate()
        b.extrapolate()
        for l in a.layers:
            torch.testing.assert_close(a.W[l], b.W[l])
            torch.testing.assert_close(a.z[l], b.z[l])
    assert other.stats[0] is not None and other.stats[0].n == block.stats[0].n


def test_fewer_samples_than_inputs_iterate_as_the_inputs_side_solve_with_momentum() -> None:
    """30 samples, 40-50 inputs per layer: every full-batch (W, b) step solves the 30 x 30 kernel
    system. A block whose steps go through the O(n^2) statistics instead (mini-batch memory
    before its first commit: the batch alone, on the inputs' side) follows the same iterates,
    momentum's extrapolation of W, b, z, q and u included."""
    widths, n = [40, 50, 50, 3], 30
    blocks = []
    for memory in (0.0, 0.5):
        g = torch.Generator().manual_seed(3)
        x = torch.rand(n, widths[0], generator=g, dtype=torch.float64)
        y = torch.randint(0, widths[-1], (n,), generator=g)
        W = [
            torch.randn(o, i, generator=g, dtype=x.dtype) * 0.2
            for i, o in itertools.pairwise(widths)
        ]
        b = [torch.zeros(o, dtype=x.dtype) for o in widths[1:]]
        params = AdmmParams(tau=1.0, ridge=0.01, momentum=0.7, memory=memory)
        block = LayerBlock(0, 3, 3, W, b, params)
        block.init_forward(x)
        for _ in range(5):
            serial_iteration(block, y)
            block.extrapolate()
        blocks.append(block)
    kernel, inputs = blocks
    for name in ("W", "b", "z", "q", "u"):
        for l, t in getattr(inputs, name).items():
            torch.testing.assert_close(getattr(kernel, name)[l], t, msg=f"{name}{l}")


def test_layer_updates_in_order_are_one_serial_iteration() -> None:
    """The per-layer updates a profiler times give exactly the iterate of serial_iteration."""
    params = AdmmParams(rho=0.7, nu=1.3, tau=0.5, ridge=0.01)
    one, x, y = _block(params)
    two, _, _ = _block(params)
    one.init_forward(x)
    two.init_forward(x)
    serial_iteration(one, y)
    with torch.no_grad():
        for _, update in two.layer_updates(y):
            update()
    for name in ("p", "W", "b", "z", "q", "u"):
        for l, t in getattr(one, name).items():
            assert torch.equal(t, getattr(two, name)[l]), (name, l)
    assert [l for l, _ in two.layer_updates(y)] == [1, 2, 0, 1, 2, 0, 1]
