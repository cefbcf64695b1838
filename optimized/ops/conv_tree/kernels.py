r"""The short (depthwise, causal) convolution of a GDN layer on draft trees, and its conv-state commit.

Node i's window is the inputs of its ``W - 1`` nearest ancestors, oldest first, then its own input; past the root it
continues into the committed conv state (the root's parent is the last committed token), exactly
:func:`lumotree.reference.gdn.conv_window_index`::

    y_i[c] = act(bias[c] + sum_{t < W} weight[c, t] * window_i[t, c])

After the engine accepts node a, the request's conv state becomes the last ``W - 1`` inputs along the path to a
(continuing into the old conv state when the path is shorter): :func:`lumotree.reference.gdn.conv_state_commit`.

Layouts: ``x: [B, N, C]`` (the conv inputs, q/k/v channels side by side), ``weight: [C, W]``, ``bias: [C]`` or None,
conv-state pool ``[P, W - 1, C]`` fp32/bf16 (oldest row first, as the reference's ``conv_state: [W - 1, C]``),
``slots: [B]``, ``parents: [B, N]``, ``num_nodes: [B]``.

Ancestors are found by walking ``parents`` (a gather per tap); a negative walk position ``-e`` stands for the committed
token ``e`` steps before the root, i.e. conv-state row ``W - 1 - e``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..checks import (
    FLOAT_DTYPES,
    MAX_NODES,
    check_finite_nodes,
    check_node_index,
    check_request_rows,
    check_sizes,
    check_slots,
    check_tensor,
    check_tree_rows,
    node_mask,
)
from ..tree_meta import tree_size

__all__ = ["tree_conv", "tree_conv_commit", "ACTIVATIONS"]

ACTIVATIONS = ("silu", None)


@triton.jit
def _tree_conv_kernel(
    x_ptr, weight_ptr, bias_ptr, conv_pool_ptr, slots_ptr, parents_ptr, num_nodes_ptr, out_ptr,
    N, C, s_xb, s_xn, s_pb,
    WIDTH: tl.constexpr, BN: tl.constexpr, BC: tl.constexpr, HAS_BIAS: tl.constexpr, SILU: tl.constexpr,
    HAS_NUM: tl.constexpr,
):
    b = tl.program_id(0)
    b64 = b.to(tl.int64)
    nodes = tl.program_id(1) * BN + tl.arange(0, BN)  # [BN]
    chans = tl.program_id(2) * BC + tl.arange(0, BC)  # [BC]
    n_b = tree_size(num_nodes_ptr, b, N, HAS_NUM)
    slot = tl.load(slots_ptr + b).to(tl.int64)
    real = nodes < n_b  # [BN]
    chan_ok = chans < C  # [BC]
    state = conv_pool_ptr + slot * ((WIDTH - 1) * C)
    acc = tl.zeros([BN, BC], dtype=tl.float32)  # [BN, BC]
    if HAS_BIAS:
        acc += tl.load(bias_ptr + chans, mask=chan_ok, other=0.0).to(tl.float32)[None, :]
    # the taps in a fixed order shared with the GEMV epilogue (ops.gemv.TreeConv, the same values): first the
    # committed-state taps (d = depth + 1 .. W - 1, state row W - 1 - d + depth), then the tree taps (d = 0 .. depth)
    walk = nodes  # [BN] the node d steps up (d = 0: the node itself); -e: committed token e steps before the root
    depth = nodes * 0  # [BN] in-tree steps above the node, at most W - 1
    for d in tl.static_range(1, WIDTH):
        in_tree = walk >= 0  # [BN]
        parent = tl.load(parents_ptr + b64 * s_pb + walk, mask=real & in_tree, other=0)  # [BN]
        walk = tl.where(in_tree, parent, walk - 1)  # the root's parent -1: the newest committed token
        depth += tl.where(walk >= 0, 1, 0)
    for d in tl.static_range(1, WIDTH):
        w = tl.load(weight_ptr + chans * WIDTH + (WIDTH - 1 - d), mask=chan_ok, other=0.0).to(tl.float32)  # [BC]
        from_state = tl.load(state + (WIDTH - 1 - d + depth[:, None]) * C + chans[None, :],
                             mask=(real & (d > depth))[:, None] & chan_ok[None, :], other=0.0)  # [BN, BC]
        acc += w[None, :] * from_state.to(tl.float32)
    walk = nodes
    for d in tl.static_range(WIDTH):
        w = tl.load(weight_ptr + chans * WIDTH + (WIDTH - 1 - d), mask=chan_ok, other=0.0).to(tl.float32)  # [BC]
        in_tree = walk >= 0  # [BN]
        from_tree = tl.load(x_ptr + b64 * s_xb + walk[:, None] * s_xn + chans[None, :],
                            mask=(real & in_tree)[:, None] & chan_ok[None, :], other=0.0)  # [BN, BC]
        acc += w[None, :] * from_tree.to(tl.float32)
        if d < WIDTH - 1:
            parent = tl.load(parents_ptr + b64 * s_pb + walk, mask=real & in_tree, other=0)  # [BN]
            walk = tl.where(in_tree, parent, walk - 1)
    if SILU:
        acc = acc * tl.sigmoid(acc)
    acc = tl.where(real[:, None], acc, 0.0)  # padding rows: zeros
    tl.store(out_ptr + (b64 * N + nodes[:, None]) * C + chans[None, :], acc.to(out_ptr.dtype.element_ty),
             mask=(nodes < N)[:, None] & chan_ok[None, :])


@triton.jit
def _tree_conv_commit_kernel(
    x_ptr, conv_pool_ptr, slots_ptr, parents_ptr, accepted_ptr,
    B, C, s_xg, s_xb, s_xn, s_pb, s_pool_g,
    WIDTH: tl.constexpr, RP: tl.constexpr, BC: tl.constexpr,
):
    """One program per (layer, request, channel block): the new state rows of layer g's pool from layer g's
    inputs ``x`` (at the ``s_*g`` strides; trees, slots and accepted nodes shared by the layers)."""
    g = (tl.program_id(0) // B).to(tl.int64)
    b = tl.program_id(0) % B
    x_ptr += g * s_xg
    conv_pool_ptr += g * s_pool_g
    b64 = b.to(tl.int64)
    chans = tl.program_id(1) * BC + tl.arange(0, BC)  # [BC]
    chan_ok = chans < C
    slot = tl.load(slots_ptr + b).to(tl.int64)
    node = tl.load(accepted_ptr + b)
    rows = tl.arange(0, RP)  # [RP] new state row r holds the input W - 2 - r steps up from the accepted node
    row_ok = rows < WIDTH - 1
    steps = WIDTH - 2 - rows  # [RP]
    walk = rows * 0 + node  # [RP]
    for d in tl.static_range(WIDTH - 2):
        in_tree = walk >= 0
        parent = tl.load(parents_ptr + b64 * s_pb + walk, mask=row_ok & in_tree & (steps > d), other=0)  # [RP]
        walk = tl.where(steps > d, tl.where(in_tree, parent, walk - 1), walk)
    state = conv_pool_ptr + slot * ((WIDTH - 1) * C)
    in_tree = walk >= 0  # [RP]
    from_tree = tl.load(x_ptr + b64 * s_xb + walk[:, None] * s_xn + chans[None, :],
                        mask=(row_ok & in_tree)[:, None] & chan_ok[None, :], other=0.0)  # [RP, BC]
    from_state = tl.load(state + (WIDTH - 1 + walk[:, None]) * C + chans[None, :],
                         mask=(row_ok & ~in_tree)[:, None] & chan_ok[None, :], other=0.0)  # [RP, BC]
    new_rows = tl.where(in_tree[:, None], from_tree.to(tl.float32), from_state.to(tl.float32))  # [RP, BC]
    tl.debug_barrier()  # every old row is read before any is overwritten (in place)
    tl.store(state + rows[:, None] * C + chans[None, :], new_rows.to(conv_pool_ptr.dtype.element_ty),
             mask=row_ok[:, None] & chan_ok[None, :])


def _check_activation(activation: object) -> None:
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation = {activation!r}, expected one of {ACTIVATIONS}")


def _common(x, conv_pool, slots, parents, num_nodes, validate, *, distinct):
    device = x.device if isinstance(x, torch.Tensor) else torch.device("cpu")
    check_tensor("x", x, (None, None, None), "B, N, C", FLOAT_DTYPES, device)
    B, N, C = x.shape
    if N < 1 or N > MAX_NODES:
        raise ValueError(f"x has N = {N} nodes per request; the kernels support 1 <= N <= {MAX_NODES}")
    check_tensor("conv_pool", conv_pool, (None, None, C), "P, W - 1, C", FLOAT_DTYPES, device, contiguous=True)
    check_tensor("parents", parents, (B, N), "B, N", (torch.int32, torch.int64), device)
    check_request_rows("x", x)
    slots = check_slots(slots, B, conv_pool.shape[0], device, validate, distinct=distinct)
    num_nodes = check_sizes(num_nodes, B, N, device, validate)
    if validate:
        check_tree_rows(parents, num_nodes)
    return device, B, N, C, slots, num_nodes


def tree_conv(
    x: torch.Tensor,
    weight: torch.Tensor,
    conv_pool: torch.Tensor,
    slots: torch.Tensor,
    parents: torch.Tensor,
    *,
    bias: torch.Tensor | None = None,
    num_nodes: torch.Tensor | None = None,
    activation: str | None = "silu",
    validate: bool = True,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Tree-window depthwise convolution for every node of every request: ``[B, N, C]`` in x's dtype (or ``out``'s).

    ``x: [B, N, C]``, ``weight: [C, W]``, ``conv_pool: [P, W - 1, C]`` read at ``slots`` (not modified). Padding
    nodes (``i >= num_nodes[b]``) are written as zeros. ``activation``: ``"silu"`` or None.
    """
    has_num = num_nodes is not None  # else every tree has N nodes: the kernel reads no sizes
    device, B, N, C, slots, num_nodes = _common(x, conv_pool, slots, parents, num_nodes, validate, distinct=False)
    width = conv_pool.shape[1] + 1
    check_tensor("weight", weight, (C, width), "C, W", FLOAT_DTYPES, device, contiguous=True)
    if bias is not None:
        check_tensor("bias", bias, (C,), "C", FLOAT_DTYPES, device, contiguous=True)
    _check_activation(activation)
    if out is not None:
        check_tensor("out", out, (B, N, C), "B, N, C", FLOAT_DTYPES, device, contiguous=True)
        check_request_rows("out", out)
    if validate:
        real = node_mask(num_nodes, N)
        check_finite_nodes("x", x, real)
        check_finite_nodes("weight", weight[None], None)
        if bias is not None:
            check_finite_nodes("bias", bias[None, None], None)
        check_finite_nodes("conv_pool[slots]", conv_pool[slots.long()][None], None)
    out = torch.empty((B, N, C), dtype=x.dtype, device=device) if out is None else out  # [B, N, C]
    BN, BC = 16, min(256, triton.next_power_of_2(C))
    _tree_conv_kernel[(B, triton.cdiv(N, BN), triton.cdiv(C, BC))](
        x, weight, bias if bias is not None else weight, conv_pool, slots, parents,
        num_nodes if has_num else slots, out,  # slots: an unused int pointer without sizes
        N, C, x.stride(0), x.stride(1), parents.stride(0),
        WIDTH=width, BN=BN, BC=BC, HAS_BIAS=bias is not None, SILU=activation == "silu", HAS_NUM=has_num,
        num_warps=4,
    )
    return out


def tree_conv_commit(
    conv_pool: torch.Tensor,
    slots: torch.Tensor,
    x: torch.Tensor,
    parents: torch.Tensor,
    accepted: torch.Tensor,
    *,
    num_nodes: torch.Tensor | None = None,
    validate: bool = True,
) -> torch.Tensor:
    """In place: ``conv_pool[slots[b]]`` becomes the last ``W - 1`` conv inputs along the path to ``accepted[b]``
    (oldest first), continuing into the old conv state when the path is shorter. All requests in one launch; slots
    must be distinct. ``x: [B, N, C]`` are the tree's conv inputs (as given to :func:`tree_conv`). Layers run on the
    same trees commit in one launch: ``conv_pool: [G, P, W - 1, C]`` and ``x: [G, B, N, C]`` (layer g's inputs into
    layer g's pool; each layer's block laid out as for one layer). Returns the pool.
    """
    layered = isinstance(conv_pool, torch.Tensor) and conv_pool.ndim == 4
    if layered:
        device = conv_pool.device
        check_tensor("conv_pool", conv_pool, (None, None, None, None), "G, P, W - 1, C", FLOAT_DTYPES, device,
                     contiguous=True)
        check_tensor("x", x, (conv_pool.shape[0], None, None, conv_pool.shape[3]), "G, B, N, C", FLOAT_DTYPES,
                     device)
        pools, xs = conv_pool, x
        x, conv_pool = x[0], conv_pool[0]  # layer 0 stands for the shared checks
    device, B, N, C, slots, num_nodes = _common(x, conv_pool, slots, parents, num_nodes, validate, distinct=True)
    if not layered:
        pools, xs = conv_pool[None], x[None]
    accepted = check_node_index("accepted", accepted, B, num_nodes, device, validate)
    width = conv_pool.shape[1] + 1
    if width < 2:
        raise ValueError("conv_pool has W - 1 = 0 rows: a width-1 convolution keeps no state")
    BC = min(1024, triton.next_power_of_2(C))
    _tree_conv_commit_kernel[(pools.shape[0] * B, triton.cdiv(C, BC))](
        xs, pools, slots, parents, accepted, B, C, xs.stride(0), xs.stride(1), xs.stride(2), parents.stride(0),
        pools.stride(0), WIDTH=width, RP=max(2, triton.next_power_of_2(width - 1)), BC=BC, num_warps=4,
    )
    return pools if layered else pools[0]
