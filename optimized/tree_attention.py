r"""Tree attention for the gated attention layers: a decode-style Triton kernel for a batch of draft trees.

Each request ``b`` owns a slot of the KV cache pool and a draft tree of ``N`` nodes. Its committed keys/values sit at
positions ``[0, L_b)`` of the slot, the tree's own keys/values at ``[L_b, L_b + N)`` (node ``j`` at ``L_b + j``, written
by :func:`prepare_qkv`). Query node ``i`` attends to

    every committed position ``p < L_b``   and   tree node ``j`` iff ``M[i, j] = 1`` (j an ancestor of i or i itself),

with RoPE at position ``L_b + depth(i)`` for queries and tree keys. The output is gated: ``o = softmax(q K^T * scale)
V * sigmoid(gate)``, the Qwen3-Next gated attention before ``o_proj``.

The kernel reads each committed K/V block once for all query rows of one KV head: the rows are the pairs
(node, query head of the GQA group), so a 64-node tree with 8 query heads per KV head is a 512-row query block split in
``BLOCK_M`` tiles that run next to each other over the same KV split (the KV tile comes from L2 after the first).
The committed range is split over ``num_splits`` programs (decode style); the last split also walks the tree's
own keys under the ancestor mask. Partial results ``(acc, m, l)`` are merged by a small combine kernel that also
applies the sigmoid gate; with one split the main kernel finishes the output itself.

Layouts (all tensors on one device):

- KV cache pool: ``k_cache, v_cache: [P, HKV, C, D]`` (slot, kv head, position, head dim), ``C`` = capacity per slot.
- ``q, gate: [B, N, HQ, D]`` (strided views are fine), ``slots, cache_lens: [B]`` int32.
- Tree: ``parents: [B, N]`` int32 -> :func:`tree_metadata` -> ``words: [B, N, ceil(N/32)]`` int32 ancestor bitsets
  (the layout of :func:`lumotree.reference.tree.ancestor_words`; bit ``j % 32`` of word ``j // 32``) and
  ``depth: [B, N]`` int32.

After the engine picks the accepted node of each tree, :func:`kv_commit` moves the K/V of the accepted path to
positions ``L_b, L_b + 1, ...`` in path order, in place (the rest of the tree's K/V is dropped by the length update).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
import triton
import triton.language as tl

from ._checks import check_num_nodes, check_tree_rows
from .pdl import allow_dependents, pdl_supported, prefetch_l2

__all__ = [
    "TreeMeta",
    "tree_metadata",
    "rope_inv_freq",
    "prepare_qkv",
    "tree_attention",
    "kv_commit",
    "choose_num_splits",
    "default_launch",
    "default_tree_slack",
    "check_tree_batch",
]

WORD_BITS = 32
PATH_BLOCK = 16  # commits: accepted-path nodes gathered per chunk (path_chunk; a tl.dot in the GDN commit)
_LOG2E = 1.4426950408889634


# ----------------------------------------------------------------------------------------------------------- checks
def _is_interpreter() -> bool:
    import os

    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def _check_tensor(name: str, t: object, ndim: int, dtypes: tuple[torch.dtype, ...], device: torch.device) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.ndim != ndim:
        raise ValueError(f"{name} must have {ndim} dimensions, got shape {tuple(t.shape)}")
    if t.dtype not in dtypes:
        raise TypeError(f"{name} has dtype {t.dtype}, expected one of {[str(d) for d in dtypes]}")
    if t.device != device:
        raise ValueError(f"{name} is on {t.device} but the other inputs are on {device}")


def _check_finite(name: str, t: torch.Tensor) -> None:
    if not bool(torch.isfinite(t).all()):
        bad = torch.nonzero(~torch.isfinite(t))[0].tolist()
        raise ValueError(f"{name} contains NaN or inf (first at index {bad})")


def check_tree_batch(parents: torch.Tensor, name: str = "parents") -> None:
    """Raise ``ValueError`` unless every row of ``parents: [B, N]`` is a tree in topological order.

    Row ``b`` must have ``parents[b, 0] == -1`` and ``0 <= parents[b, i] < i`` (the rule of
    :func:`lumotree.reference.tree.validate_parents`), checked vectorised and naming the first bad entry.
    """
    if parents.ndim != 2 or parents.shape[1] == 0:
        raise ValueError(f"{name} must have shape [B, N] with N >= 1, got {tuple(parents.shape)}")
    if parents.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"{name} has dtype {parents.dtype}, expected int32 or int64")
    p = parents.to(torch.int64).cpu()
    idx = torch.arange(p.shape[1])
    ok = torch.where(idx == 0, p == -1, (p >= 0) & (p < idx))  # [B, N]
    if not bool(ok.all()):
        b, i = torch.nonzero(~ok)[0].tolist()
        rule = "the root's parent must be -1" if i == 0 else f"must satisfy 0 <= parent < {i}"
        raise ValueError(f"{name}[{b}, {i}] = {int(p[b, i])}: {rule} (topological order, one root at index 0)")


# ----------------------------------------------------------------------------------------------------- tree metadata
class TreeMeta(NamedTuple):
    """Per-step tree metadata shared by every layer: ``words [B, N, W]`` int32 inclusive ancestor bitsets
    (``W = ceil(N / 32)``) and ``depth [B, N]`` int32 (root 0)."""

    words: torch.Tensor
    depth: torch.Tensor


@triton.jit
def tree_metadata_program(b, Parents, NumNodes, Words, Depth, N, s_pb, s_pn, W, NP: tl.constexpr,
                          BLOCK_W: tl.constexpr, ROUNDS: tl.constexpr, HAS_NUM: tl.constexpr):
    """Request ``b``'s tree, every node at once by pointer jumping (``ROUNDS = ceil(log2 N)`` rounds, all in
    registers): ``words[i] = bit(i) | words[parent(i)] | ...`` and ``depth[i]`` = the number of ancestors. Round r
    ORs in (adds) the words (depth) of the ancestor ``jump[i]`` at distance ``2^r`` and doubles the jump, so after it
    ``words[i]`` holds the path up to distance ``2^(r+1) - 1``. Nodes past ``num_nodes[b]`` (``HAS_NUM``) are read as
    a chain below the last real node (their parents are not read; their rows are never used). Called by
    :func:`_tree_metadata_kernel` and by the model's step prologue (one launch less a tree step)."""
    node = tl.arange(0, NP)  # [NP]
    node_ok = node < N
    real = node_ok
    if HAS_NUM:
        real = node_ok & (node < tl.load(NumNodes + b))
    parent = tl.load(Parents + b * s_pb + node * s_pn, mask=real, other=0).to(tl.int32)  # [NP]
    jump = tl.where(real, parent, node - 1)  # [NP] the ancestor 2^r steps up (-1: none)
    offs_w = tl.arange(0, BLOCK_W)  # [BLOCK_W]
    bit = tl.full([NP, BLOCK_W], 1, tl.int32) << (node % 32)[:, None]  # [NP, BLOCK_W] bit 31 -> sign bit
    words = tl.where(offs_w[None, :] == (node // 32)[:, None], bit, 0)  # [NP, BLOCK_W]
    depth = tl.where(jump >= 0, 1, 0)  # [NP]
    for _ in tl.static_range(ROUNDS):
        up = jump >= 0  # [NP]
        src = tl.maximum(jump, 0)  # [NP]
        words = words | tl.where(up[:, None], tl.gather(words, tl.broadcast_to(src[:, None], [NP, BLOCK_W]), 0), 0)
        depth = depth + tl.where(up, tl.gather(depth, src, 0), 0)
        jump = tl.where(up, tl.gather(jump, src, 0), -1)
    tl.store(Words + (b * N + node[:, None]) * W + offs_w[None, :], words,
             mask=node_ok[:, None] & (offs_w < W)[None, :])
    tl.store(Depth + b * N + node, depth, mask=node_ok)


@triton.jit
def _tree_metadata_kernel(Parents, NumNodes, Words, Depth, N, s_pb, s_pn, W, NP: tl.constexpr, BLOCK_W: tl.constexpr,
                          ROUNDS: tl.constexpr, HAS_NUM: tl.constexpr):
    """One program per request: :func:`tree_metadata_program`."""
    tree_metadata_program(tl.program_id(0).to(tl.int64), Parents, NumNodes, Words, Depth, N, s_pb, s_pn, W, NP,
                          BLOCK_W, ROUNDS, HAS_NUM)


def tree_metadata_buffers(B: int, N: int, device: torch.device) -> tuple[TreeMeta, dict]:
    """The outputs ``words [B, N, W]`` and ``depth [B, N]`` of :func:`tree_metadata_program` and its constexprs."""
    W = (N + WORD_BITS - 1) // WORD_BITS
    words = torch.empty((B, N, W), dtype=torch.int32, device=device)  # [B, N, W]
    depth = torch.empty((B, N), dtype=torch.int32, device=device)  # [B, N]
    consts = dict(NP=triton.next_power_of_2(N), BLOCK_W=max(2, triton.next_power_of_2(W)),
                  ROUNDS=max(1, (N - 1).bit_length()))
    return TreeMeta(words, depth), consts


def tree_metadata(parents: torch.Tensor, *, num_nodes: torch.Tensor | None = None, validate: bool = True
                  ) -> TreeMeta:
    """Ancestor bitsets and depths for a batch of trees ``parents: [B, N]`` (int32/int64, any strides, each row a
    valid tree; with ``num_nodes: [B]`` int32 only its first ``num_nodes[b]`` entries, the rest read as a chain).

    Mirrors :func:`lumotree.reference.tree.ancestor_words` word for word, in one launch. ``validate`` checks the
    trees first (one device-to-host copy; switch it off inside CUDA-graph capture, after checking the same trees
    once).
    """
    if validate:
        if num_nodes is None:
            check_tree_batch(parents)
        else:
            num_nodes = check_num_nodes(num_nodes, parents.shape[0], parents.shape[1], parents.device, True)
            check_tree_rows(parents, num_nodes)
    B, N = parents.shape
    meta, consts = tree_metadata_buffers(B, N, parents.device)
    _tree_metadata_kernel[(B,)](parents, num_nodes if num_nodes is not None else parents, meta.words, meta.depth, N,
                                parents.stride(0), parents.stride(1), meta.words.shape[2],
                                HAS_NUM=num_nodes is not None, **consts)
    return meta


# --------------------------------------------------------------------------------------- q/k norm + RoPE + KV write
def rope_inv_freq(rotary_dim: int, theta: float, device: torch.device | str = "cpu") -> torch.Tensor:
    """RoPE inverse frequencies ``theta ** (-2i / rotary_dim)``, ``i < rotary_dim / 2``, as float32 ``[rotary_dim/2]``
    (computed as transformers does, so positions rotate identically)."""
    if rotary_dim <= 0 or rotary_dim % 2:
        raise ValueError(f"rotary_dim = {rotary_dim} must be a positive even number")
    exponent = torch.arange(0, rotary_dim, 2, dtype=torch.int64).to(torch.float32) / rotary_dim  # [R/2]
    return (1.0 / (theta**exponent)).to(device)


@triton.jit
def _prepare_qkv_kernel(
    Q, K, V, QW, KW, InvFreq, Pos, Slots, Lens, QOut, KC, VC,
    sqb, sqn, sqh, skb, skn, skh, svb, svn, svh,
    sob, son, soh, skcp, skch, skcc, svcp, svch, svcc,
    N, HQ, HKV, D, eps,
    ROT_HALF: tl.constexpr, BLOCK_D: tl.constexpr, PDL: tl.constexpr,
):  # fmt: skip
    """One program per (request, node, head among HQ + HKV): zero-centred RMSNorm, partial RoPE, store.

    Heads ``h < HQ`` are query heads (written to QOut); heads ``HQ <= h < HQ + HKV`` are key heads, written with the
    matching value head into the cache slot at position ``L_b + node``.
    """
    allow_dependents(PDL)  # a PDL-launched tree attention may launch now and prefetch the committed K / V
    b = tl.program_id(0)
    n = tl.program_id(1)
    h = tl.program_id(2)
    offs_d = tl.arange(0, BLOCK_D)  # [BLOCK_D]
    mask_d = offs_d < D
    pos = (tl.load(Lens + b) + tl.load(Pos + b * N + n)).to(tl.float32)
    # rotation partner of dim d < 2*ROT_HALF: d + ROT_HALF (first half, sign -) or d - ROT_HALF (second half, sign +)
    in_rot = offs_d < 2 * ROT_HALF
    first_half = offs_d < ROT_HALF
    partner = tl.where(first_half, offs_d + ROT_HALF, offs_d - ROT_HALF)
    freq_idx = tl.where(first_half, offs_d, offs_d - ROT_HALF)
    inv_freq = tl.load(InvFreq + freq_idx, mask=in_rot, other=0.0)  # [BLOCK_D]
    angle = pos * inv_freq
    cos = tl.where(in_rot, tl.cos(angle), 1.0)
    sin = tl.where(in_rot, tl.where(first_half, -tl.sin(angle), tl.sin(angle)), 0.0)
    if h < HQ:
        base = Q + b * sqb + n * sqn + h * sqh
        w_ptr = QW
    else:
        base = K + b * skb + n * skn + (h - HQ) * skh
        w_ptr = KW
    x = tl.load(base + offs_d, mask=mask_d, other=0.0).to(tl.float32)  # [BLOCK_D]
    x_partner = tl.load(base + partner, mask=mask_d & in_rot, other=0.0).to(tl.float32)
    w = tl.load(w_ptr + offs_d, mask=mask_d, other=0.0).to(tl.float32)
    w_partner = tl.load(w_ptr + partner, mask=mask_d & in_rot, other=0.0).to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / D + eps)
    y = x * rstd * (1.0 + w)
    y_partner = x_partner * rstd * (1.0 + w_partner)
    out = y * cos + y_partner * sin
    if h < HQ:
        tl.store(QOut + b * sob + n * son + h * soh + offs_d, out.to(QOut.dtype.element_ty), mask=mask_d)
    else:
        hk = h - HQ
        slot = tl.load(Slots + b).to(tl.int64)
        c = (tl.load(Lens + b) + n).to(tl.int64)
        tl.store(KC + slot * skcp + hk * skch + c * skcc + offs_d, out.to(KC.dtype.element_ty), mask=mask_d)
        vv = tl.load(V + b * svb + n * svn + hk * svh + offs_d, mask=mask_d, other=0.0)
        tl.store(VC + slot * svcp + hk * svch + c * svcc + offs_d, vv.to(VC.dtype.element_ty), mask=mask_d)


def prepare_qkv(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    q_norm_weight: torch.Tensor,
    k_norm_weight: torch.Tensor,
    inv_freq: torch.Tensor,
    offsets: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slots: torch.Tensor,
    cache_lens: torch.Tensor,
    *,
    eps: float = 1e-6,
    out: torch.Tensor | None = None,
    validate: bool = True,
) -> torch.Tensor:
    """Fused pre-kernel of the attention layer: ``x_hat * (1 + w)`` RMSNorm on q and k heads, RoPE on the first
    ``2 * len(inv_freq)`` dims at position ``cache_lens[b] + offsets[b, n]`` (rotate-half convention), then

    - rotated queries -> returned ``[B, N, HQ, D]`` (or ``out``),
    - rotated keys and the values -> cache slot ``slots[b]`` at position ``cache_lens[b] + n``.

    ``q: [B, N, HQ, D]``, ``k, v: [B, N, HKV, D]`` (strided views allowed, last dim contiguous), ``offsets: [B, N]``
    int32: ``depth`` for a tree, ``n`` for a chunk of consecutive tokens.
    """
    device = q.device
    float_types = (torch.float32, torch.bfloat16, torch.float16)
    _check_tensor("q", q, 4, float_types, device)
    B, N, HQ, D = q.shape
    _check_tensor("k", k, 4, float_types, device)
    _check_tensor("v", v, 4, float_types, device)
    if k.dtype != q.dtype or v.dtype != q.dtype:
        raise TypeError(f"q, k, v must share one dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if k.shape[:2] != (B, N) or k.shape[3] != D or v.shape != k.shape:
        raise ValueError(f"k {tuple(k.shape)} and v {tuple(v.shape)} must both be [B, N, HKV, D] = [{B}, {N}, *, {D}]")
    HKV = k.shape[2]
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.stride(-1) != 1:
            raise ValueError(f"{name} must have a contiguous last dimension")
    _check_tensor("q_norm_weight", q_norm_weight, 1, float_types, device)
    _check_tensor("k_norm_weight", k_norm_weight, 1, float_types, device)
    if q_norm_weight.shape[0] != D or k_norm_weight.shape[0] != D:
        raise ValueError(f"q_norm_weight and k_norm_weight must have shape [D] = [{D}]")
    _check_tensor("inv_freq", inv_freq, 1, (torch.float32,), device)
    if 2 * inv_freq.shape[0] > D:
        raise ValueError(f"inv_freq has {inv_freq.shape[0]} entries: rotary dim {2 * inv_freq.shape[0]} > D = {D}")
    _check_tensor("offsets", offsets, 2, (torch.int32,), device)
    if offsets.shape != (B, N):
        raise ValueError(f"offsets has shape {tuple(offsets.shape)}, expected [B, N] = [{B}, {N}]")
    _check_cache(k_cache, v_cache, HKV, D, device)
    _check_slots(slots, cache_lens, B, k_cache.shape[0], device)
    if validate:
        _check_lens_fit(cache_lens, offsets, N, k_cache.shape[2])
    if out is None:
        out = torch.empty((B, N, HQ, D), dtype=q.dtype, device=device)  # [B, N, HQ, D]
    elif out.shape != (B, N, HQ, D) or out.stride(-1) != 1:
        raise ValueError(f"out must be [B, N, HQ, D] = {(B, N, HQ, D)} with a contiguous last dim")
    qw = q_norm_weight.to(torch.float32).contiguous()  # [D]
    kw = k_norm_weight.to(torch.float32).contiguous()  # [D]
    _prepare_qkv_kernel[(B, N, HQ + HKV)](
        q, k, v, qw, kw, inv_freq.contiguous(), offsets.contiguous(), slots, cache_lens, out, k_cache, v_cache,
        q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2), v.stride(0), v.stride(1),
        v.stride(2), out.stride(0), out.stride(1), out.stride(2), k_cache.stride(0), k_cache.stride(1),
        k_cache.stride(2), v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        N, HQ, HKV, D, float(eps),
        ROT_HALF=inv_freq.shape[0], BLOCK_D=triton.next_power_of_2(D), PDL=pdl_supported(device),
    )  # fmt: skip
    return out


def _check_cache(k_cache: torch.Tensor, v_cache: torch.Tensor, HKV: int, D: int, device: torch.device) -> None:
    _check_tensor("k_cache", k_cache, 4, (torch.float32, torch.bfloat16, torch.float16), device)
    if v_cache.shape != k_cache.shape or v_cache.dtype != k_cache.dtype or v_cache.device != device:
        raise ValueError(f"v_cache {tuple(v_cache.shape)} must match k_cache {tuple(k_cache.shape)} in shape/dtype")
    if k_cache.shape[1] != HKV or k_cache.shape[3] != D:
        raise ValueError(f"k_cache has shape {tuple(k_cache.shape)}, expected [P, HKV, C, D] with HKV={HKV}, D={D}")
    if k_cache.stride(-1) != 1 or v_cache.stride(-1) != 1:
        raise ValueError("k_cache and v_cache must have a contiguous last dimension")


def _check_slots(slots: torch.Tensor, cache_lens: torch.Tensor, B: int, P: int, device: torch.device) -> None:
    _check_tensor("slots", slots, 1, (torch.int32,), device)
    _check_tensor("cache_lens", cache_lens, 1, (torch.int32,), device)
    if slots.shape[0] != B or cache_lens.shape[0] != B:
        raise ValueError(f"slots {tuple(slots.shape)} and cache_lens {tuple(cache_lens.shape)} must be [B] = [{B}]")
    if not slots.is_contiguous() or not cache_lens.is_contiguous():
        raise ValueError("slots and cache_lens must be contiguous")


def _check_lens_fit(cache_lens: torch.Tensor, offsets_or_none: torch.Tensor | None, N: int, C: int) -> None:
    lens = cache_lens.cpu()
    if bool((lens < 0).any()):
        raise ValueError(f"cache_lens has a negative entry: {lens.tolist()}")
    if bool((lens + N > C).any()):
        b = int(torch.nonzero(lens + N > C)[0, 0])
        raise ValueError(f"cache_lens[{b}] = {int(lens[b])} + N = {N} tokens exceeds the cache capacity C = {C}")
    if offsets_or_none is not None and bool((offsets_or_none.cpu() < 0).any()):
        raise ValueError("offsets has a negative entry")


def _check_slot_range(slots: torch.Tensor, P: int) -> None:
    s = slots.cpu()
    if bool(((s < 0) | (s >= P)).any()):
        b = int(torch.nonzero((s < 0) | (s >= P))[0, 0])
        raise ValueError(f"slots[{b}] = {int(s[b])} is outside the pool [0, {P})")
    if len(set(s.tolist())) != s.numel():
        raise ValueError(f"slots has repeated entries {s.tolist()}: each request needs its own slot")


# --------------------------------------------------------------------------------------------------- attention
@triton.jit
def _attend_tile(q, k_ptrs, v_ptrs, load_mask, score_mask, m_i, l_i, acc, qk_scale,
                 MASKED: tl.constexpr, IEEE: tl.constexpr):
    """One online-softmax step of ``BLOCK_M`` query rows over one key tile: returns the updated ``(m, l, acc)``.

    ``k_ptrs, v_ptrs: [BLOCK_N, BLOCK_D]``; ``load_mask`` guards the loads, ``score_mask [BLOCK_M, BLOCK_N]`` hides
    scores when ``MASKED`` (a full tile of committed keys needs neither: every row sees every key)."""
    k = tl.load(k_ptrs, mask=load_mask, other=0.0)  # [BLOCK_N, BLOCK_D]
    if IEEE:
        s = tl.dot(q, tl.trans(k), input_precision="ieee")
    else:
        s = tl.dot(q, tl.trans(k))  # [BLOCK_M, BLOCK_N]
    s = s * qk_scale
    if MASKED:
        s = tl.where(score_mask, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)  # a row with nothing visible yet
    else:
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        m_use = m_new
    p = tl.math.exp2(s - m_use[:, None])  # [BLOCK_M, BLOCK_N]
    alpha = tl.math.exp2(m_i - m_use)  # [BLOCK_M]
    v = tl.load(v_ptrs, mask=load_mask, other=0.0)  # [BLOCK_N, BLOCK_D]
    l_i = l_i * alpha + tl.sum(p, axis=1)
    if IEEE:
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision="ieee")
    else:
        acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None])
    return m_new, l_i, acc


@triton.jit
def _tiles_per_split(L, node_hi, NUM_SPLITS, TREE_SLACK, BLOCK_N: tl.constexpr):
    """Committed key tiles per split of a row block that sees tree nodes ``[0, node_hi)`` (every split but the last
    takes this many of ``[0, L)``, the last the rest plus the tree's tiles; :func:`_tree_attn_kernel`)."""
    return tl.cdiv(tl.cdiv(L, BLOCK_N) + TREE_SLACK * tl.cdiv(node_hi, BLOCK_N), NUM_SPLITS)


@triton.jit
def _split_holds_keys(s, per, L, NUM_SPLITS, BLOCK_N: tl.constexpr):
    """Whether split ``s`` sees any key: its committed range starts before ``L``, or it is the last (the tree's
    keys). The kernel writes the partials of these splits only, and the combine reads only these."""
    return (s * per * BLOCK_N < L) | (s == NUM_SPLITS - 1)


@triton.jit
def _tree_attn_kernel(
    Q, KC, VC, Gate, Words, Slots, Lens, Out, PartAcc, PartML,
    sqb, sqn, sqh, sgb, sgn, sgh, sob, son, soh,
    skcp, skch, skcc, svcp, svch, svcc, swb, swn,
    spa_s, spa_b, spa_n, spa_h, spm_s, spm_b, spm_n, spm_h,
    N, NW, HQ, D, qk_scale, NUM_SPLITS, TREE_SLACK,
    G: tl.constexpr, FINALIZE: tl.constexpr, HAS_GATE: tl.constexpr, IEEE: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, EVEN_D: tl.constexpr,
    SKIP_EMPTY: tl.constexpr, PDL: tl.constexpr, KV_LINES: tl.constexpr, LINE_ELEMS: tl.constexpr,
):  # fmt: skip
    """Grid ``(row blocks, B * HKV, NUM_SPLITS)``. Rows are (node, query head in the GQA group) pairs. ``NW``: ancestor
    words per node. Split partials are stored normalised (``acc / l``) with ``(m, l)``.

    Work split: the committed range ``[0, L)`` is cut into ``Tc = cdiv(L, BLOCK_N)`` key tiles; every split but the
    last takes ``per = cdiv(Tc + TREE_SLACK * Tt, NUM_SPLITS)`` consecutive tiles, the last split the remaining ones
    plus the ``Tt`` tiles of the tree's own keys that this row block can see. ``TREE_SLACK`` (committed tiles the
    last split gives up per tree tile) takes the tree off the critical path; 0 is the even split. ``SKIP_EMPTY``
    (split partials only): a split without keys (:func:`_split_holds_keys`) stores nothing. ``PDL``: launched as a
    programmatic dependent launch (:mod:`~lumotree.optimized.pdl`): the program prefetches its split's committed K
    and V rows into L2 (``KV_LINES`` lines of ``LINE_ELEMS`` elements per row) before it waits for the previous
    kernel (:func:`prepare_qkv`, which writes q and the tree's K / V, not the committed ones)."""
    pid_m = tl.program_id(0)
    pid_bh = tl.program_id(1)
    pid_s = tl.program_id(2)
    HKV = HQ // G
    b = pid_bh // HKV
    kvh = pid_bh % HKV
    NODES: tl.constexpr = BLOCK_M // G  # nodes per row block
    offs_r = tl.arange(0, BLOCK_M)  # [BLOCK_M]
    node = pid_m * NODES + offs_r // G  # [BLOCK_M]
    head = kvh * G + offs_r % G  # [BLOCK_M]
    row_ok = (offs_r < NODES * G) & (node < N)
    offs_d = tl.arange(0, BLOCK_D)  # [BLOCK_D]
    if EVEN_D:  # a mask constant along the contiguous dim keeps the loads 16 bytes wide
        mask_d = tl.full([BLOCK_D], 1, tl.int1)
    else:
        mask_d = offs_d < D
    offs_n = tl.arange(0, BLOCK_N)  # [BLOCK_N]

    slot = tl.load(Slots + b).to(tl.int64)
    L = tl.load(Lens + b)
    node_hi = tl.minimum((pid_m + 1) * NODES, N)  # this row block sees tree nodes [0, node_hi)
    per = _tiles_per_split(L, node_hi, NUM_SPLITS, TREE_SLACK, BLOCK_N)  # key tiles per split
    k_base = KC + slot * skcp + kvh * skch
    v_base = VC + slot * svcp + kvh * svch
    start = tl.minimum(pid_s * per * BLOCK_N, L)
    end = tl.minimum(start + per * BLOCK_N, L)
    if PDL:
        lines = tl.arange(0, KV_LINES) * LINE_ELEMS  # [KV_LINES] first element of each line of a row
        for t0 in range(start, end, BLOCK_N):
            rows_kv = tl.minimum(t0 + offs_n, end - 1).to(tl.int64)  # [BLOCK_N] (the last row again past the end)
            prefetch_l2(k_base + rows_kv[:, None] * skcc + lines[None, :])  # [BLOCK_N, KV_LINES]
            prefetch_l2(v_base + rows_kv[:, None] * svcc + lines[None, :])
        tl.extra.cuda.gdc_wait()  # from here on the previous kernel's writes (q, the tree's K / V) are visible
    q = tl.load(
        Q + b * sqb + node[:, None] * sqn + head[:, None] * sqh + offs_d[None, :],
        mask=row_ok[:, None] & mask_d[None, :], other=0.0,
    )  # [BLOCK_M, BLOCK_D]

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)

    # committed keys: this split's tiles of [0, L) (NUM_SPLITS * per >= cdiv(L, BLOCK_N): the last split ends at L
    # and holds what the others leave); full tiles first, without masks
    full_end = start + tl.maximum(end - start, 0) // BLOCK_N * BLOCK_N
    pos = start + offs_n  # [BLOCK_N]
    k_ptrs = k_base + pos[:, None].to(tl.int64) * skcc + offs_d[None, :]  # [BLOCK_N, BLOCK_D]
    v_ptrs = v_base + pos[:, None].to(tl.int64) * svcc + offs_d[None, :]
    d_only = mask_d[None, :]  # [1, BLOCK_D]
    for _ in range(start, full_end, BLOCK_N):
        m_i, l_i, acc = _attend_tile(q, k_ptrs, v_ptrs, d_only, d_only, m_i, l_i, acc, qk_scale,
                                     MASKED=False, IEEE=IEEE)
        k_ptrs += BLOCK_N * skcc
        v_ptrs += BLOCK_N * svcc
    if full_end < end:  # the ragged last tile of the committed range
        kv_ok = (full_end + offs_n) < end  # [BLOCK_N]
        m_i, l_i, acc = _attend_tile(q, k_ptrs, v_ptrs, kv_ok[:, None] & d_only, kv_ok[None, :], m_i, l_i, acc,
                                     qk_scale, MASKED=True, IEEE=IEEE)

    # the tree's own keys (last split only): node j at position L + j, visible iff bit j of words[node]
    tree_end = tl.where(pid_s == NUM_SPLITS - 1, node_hi, 0)
    words_row = Words + b * swb + node * swn  # [BLOCK_M] each row's ancestor words
    for j0 in range(0, tree_end, BLOCK_N):
        j = j0 + offs_n  # [BLOCK_N]
        j_ok = j < node_hi
        pos = L + j
        # a tile of BLOCK_N <= 64 aligned keys spans words j0 // 32 and (BLOCK_N = 64) the next: two per row
        w0 = j0 // 32
        word_lo = tl.load(words_row + w0, mask=row_ok, other=0)  # [BLOCK_M]
        word_hi = tl.load(words_row + w0 + 1, mask=row_ok & (node * 0 + w0 + 1 < NW), other=0)  # [BLOCK_M]
        # [BLOCK_M, BLOCK_N] words[i][j // 32]
        word = tl.where((j // 32 == w0)[None, :], word_lo[:, None], word_hi[:, None])
        visible = ((word >> (j % 32)[None, :]) & 1) != 0
        m_i, l_i, acc = _attend_tile(
            q, k_base + pos[:, None].to(tl.int64) * skcc + offs_d[None, :],
            v_base + pos[:, None].to(tl.int64) * svcc + offs_d[None, :], j_ok[:, None] & d_only, visible,
            m_i, l_i, acc, qk_scale, MASKED=True, IEEE=IEEE)

    io_mask = row_ok[:, None] & mask_d[None, :]
    if SKIP_EMPTY:  # a split past the committed keys (not the last) stores nothing: the combine skips it (q is
        # loaded regardless: masking it on L would put the length's load before it; the flag as a vector: the
        # interpreter mistypes a scalar bool broadcast into a vector mask)
        row_ok = row_ok & _split_holds_keys(pid_s + 0 * offs_r, per, L, NUM_SPLITS, BLOCK_N)  # [BLOCK_M]
        io_mask = row_ok[:, None] & mask_d[None, :]
    if FINALIZE:  # one split: normalise and gate here
        o = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]  # l == 0 only on padding rows
        if HAS_GATE:
            gate = tl.load(Gate + b * sgb + node[:, None] * sgn + head[:, None] * sgh + offs_d[None, :],
                           mask=io_mask, other=0.0).to(tl.float32)
            o = o * tl.sigmoid(gate)
        tl.store(Out + b * sob + node[:, None] * son + head[:, None] * soh + offs_d[None, :],
                 o.to(Out.dtype.element_ty), mask=io_mask)
    else:  # normalised partial
        part = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]
        tl.store(PartAcc + pid_s * spa_s + b * spa_b + node[:, None] * spa_n + head[:, None] * spa_h + offs_d[None, :],
                 part, mask=io_mask)
        ml = PartML + pid_s * spm_s + b * spm_b + node * spm_n + head * spm_h
        tl.store(ml, m_i, mask=row_ok)
        tl.store(ml + 1, l_i, mask=row_ok)


@triton.jit
def _combine_kernel(
    PartAcc, PartML, Gate, Out, Lens,
    spa_s, spa_b, spa_n, spa_h, spm_s, spm_b, spm_n, spm_h, sgb, sgn, sgh, sob, son, soh,
    N, HQ, D, NUM_SPLITS, TREE_SLACK, NODES,
    HAS_GATE: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_S: tl.constexpr, KEY_BLOCK: tl.constexpr,
    SKIP_EMPTY: tl.constexpr, PDL: tl.constexpr,
):  # fmt: skip
    """Grid ``(B * N * HQ, D / BLOCK_D)``: one (request, node, query head) row and ``BLOCK_D`` of its columns per
    program. ``o = sum_s w_s o_s / sum_s w_s`` with ``w_s = l_s 2^(m_s - max m)`` over the normalised split partials
    ``o_s``, ``BLOCK_S`` splits per vector load (one round trip when ``BLOCK_S >= NUM_SPLITS``); then the gate.
    ``SKIP_EMPTY``: only the splits that saw keys are read (:func:`_split_holds_keys`, from the main kernel's
    ``KEY_BLOCK`` key tiles and ``NODES`` nodes per row block): less to read, one dependent load (the length)
    before the partials."""
    allow_dependents(PDL)  # the output projection's GEMV may launch now (optimized.pdl)
    pid = tl.program_id(0)
    h = pid % HQ
    n = (pid // HQ) % N
    b = pid // (HQ * N)
    if SKIP_EMPTY:
        L = tl.load(Lens + b)
        per = _tiles_per_split(L, tl.minimum((n // NODES + 1) * NODES, N), NUM_SPLITS, TREE_SLACK, KEY_BLOCK)
    offs_d = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)  # [BLOCK_D]
    mask_d = offs_d < D
    offs_s = tl.arange(0, BLOCK_S)  # [BLOCK_S]
    m_run = tl.full([1], float("-inf"), tl.float32)  # [1]
    w_run = tl.zeros([1], tl.float32)  # [1] sum of weights so far (scaled by 2^-m_run)
    acc = tl.zeros([BLOCK_D], tl.float32)
    for s0 in range(0, NUM_SPLITS, BLOCK_S):
        s = s0 + offs_s  # [BLOCK_S]
        s_ok = s < NUM_SPLITS
        if SKIP_EMPTY:
            s_ok = s_ok & _split_holds_keys(s, per, L, NUM_SPLITS, KEY_BLOCK)
        ml = PartML + s * spm_s + b * spm_b + n * spm_n + h * spm_h
        m_s = tl.load(ml, mask=s_ok, other=float("-inf"))  # [BLOCK_S] (-inf: a split that saw no key)
        l_s = tl.load(ml + 1, mask=s_ok, other=0.0)
        o_s = tl.load(PartAcc + s[:, None] * spa_s + b * spa_b + n * spa_n + h * spa_h + offs_d[None, :],
                      mask=s_ok[:, None] & mask_d[None, :], other=0.0)  # [BLOCK_S, BLOCK_D]
        m_new = tl.maximum(m_run, tl.max(m_s, axis=0))  # [1]
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
        scale_old = tl.math.exp2(m_run - m_use)  # [1]
        w_s = l_s * tl.math.exp2(m_s - m_use)  # [BLOCK_S]
        w_run = w_run * scale_old + tl.sum(w_s, axis=0)
        acc = acc * scale_old + tl.sum(o_s * w_s[:, None], axis=0)
        m_run = m_new
    o = acc / w_run
    if HAS_GATE:
        gate = tl.load(Gate + b * sgb + n * sgn + h * sgh + offs_d, mask=mask_d, other=0.0).to(tl.float32)
        o = o * tl.sigmoid(gate)
    tl.store(Out + b * sob + n * son + h * soh + offs_d, o.to(Out.dtype.element_ty), mask=mask_d)


_NUM_SMS: dict[int, int] = {}


def _num_sms(device: torch.device) -> int:
    if device.type != "cuda":
        return 4
    idx = device.index if device.index is not None else torch.cuda.current_device()
    if idx not in _NUM_SMS:
        _NUM_SMS[idx] = torch.cuda.get_device_properties(idx).multi_processor_count
    return _NUM_SMS[idx]


def _default_blocks(G: int, N: int, D: int, dtype: torch.dtype = torch.bfloat16) -> tuple[int, int, int, int]:
    """(BLOCK_M, BLOCK_N, num_warps, num_stages) of the main kernel, from the H200 sweeps in bench/RESULTS.md: decode
    (one node) 16-row x 32-key tiles with 4 stages (no register spills, two CTAs per SM), trees up to 128 rows 64 x
    32, larger trees 128 x 32 with 3 stages (the 128 x 64 tile spills registers and lost at B = 1, 16, 64)."""
    rows = G * N
    if rows <= 16:
        cfg = (16, 32, 4, 4)
    elif rows <= 128:
        cfg = (64, 32, 4, 3)
    else:
        cfg = (128, 32, 8, 3)
    block_m = max(cfg[0], triton.next_power_of_2(G))
    if dtype == torch.float32:  # fp32 tiles are twice as large: keep shared memory in bounds
        return min(block_m, max(64, triton.next_power_of_2(G))), 32, cfg[2], 2
    return block_m, cfg[1], cfg[2], cfg[3]


def choose_num_splits(batch: int, num_kv_heads: int, row_blocks: int, max_len: int, device: torch.device,
                      *, block_n: int = 64, waves: float = 1.0, min_chunk: int = 256) -> int:
    """Splits over the committed length so that at most ``waves`` waves of programs fill the GPU (rounded down: a
    partial extra wave would double the time of the split that lands in it), each split at least ``min_chunk`` keys
    long. Pass the cache capacity as ``max_len`` for CUDA graphs (the grid is fixed; the chunk length follows the
    current lengths)."""
    programs = batch * num_kv_heads * row_blocks
    want = math.floor(waves * _num_sms(device) / max(programs, 1))
    cap = max(1, math.ceil(max_len / max(min_chunk, block_n)))
    return int(max(1, min(want, cap, 128)))


def default_launch(batch: int, num_nodes: int, num_heads: int, num_kv_heads: int, head_dim: int, max_len: int,
                   device: torch.device, dtype: torch.dtype = torch.bfloat16) -> tuple[int, int, int, int, int]:
    """The default ``(block_m, block_n, num_warps, num_stages, num_splits)`` of :func:`tree_attention`: splits fill
    one wave of programs (the sweep's best at B = 1, 16 and 64), at least 128 keys each for decode-sized problems
    (one node), 256 for trees."""
    G = num_heads // num_kv_heads
    bm, bn, nw, ns = _default_blocks(G, num_nodes, head_dim, dtype)
    row_blocks = triton.cdiv(num_nodes, bm // G)
    decode = G * num_nodes <= 16
    splits = choose_num_splits(batch, num_kv_heads, row_blocks, max_len, device, block_n=bn,
                               min_chunk=128 if decode else 256)
    return bm, bn, nw, ns, splits


def default_tree_slack(batch: int, num_nodes: int, num_heads: int, num_kv_heads: int, head_dim: int,
                       num_splits: int) -> int:
    """The default ``tree_slack`` of :func:`tree_attention`: 2 when the committed keys are split (the last split,
    which also walks the tree's keys, gives up two committed tiles per tree tile), else 0. H200, cold KV
    (``bench/attention_probe.py --cold``, 2026-12-01, two sessions): at every split point of the probe 1 and 2 beat
    the even split, by 0.4-2.1 us (B = 1, N = 64: 36.2 -> 35.6 us over 8k keys, 24.5 -> 22.4 us over 1k)."""
    return 2 if num_splits > 1 else 0


def tree_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slots: torch.Tensor,
    cache_lens: torch.Tensor,
    words: torch.Tensor,
    *,
    gate: torch.Tensor | None = None,
    scale: float | None = None,
    num_splits: int | None = None,
    max_len: int | None = None,
    out: torch.Tensor | None = None,
    block_m: int | None = None,
    block_n: int | None = None,
    num_warps: int | None = None,
    num_stages: int | None = None,
    tree_slack: int | None = None,
    combine_block_d: int | None = None,
    validate: bool = True,
    pdl: bool = False,
) -> torch.Tensor:
    """Gated tree attention for a batch of trees over a slot-addressed KV cache pool.

    ``q: [B, N, HQ, D]`` rotated queries (from :func:`prepare_qkv`); ``k_cache, v_cache: [P, HKV, C, D]`` holding
    request ``b``'s committed K/V at ``[0, cache_lens[b])`` of slot ``slots[b]`` and its tree's K/V right after;
    ``words: [B, N, ceil(N/32)]`` ancestor bitsets (:func:`tree_metadata`); ``gate: [B, N, HQ, D]`` or None.
    Returns ``o [B, N, HQ, D]`` (dtype of q): ``softmax_visible(q k^T * scale) v * sigmoid(gate)``.

    ``num_splits`` (default :func:`choose_num_splits` over ``max_len``, default the longest ``cache_lens``, one
    host sync) fixes the grid; pass both for CUDA graphs. ``validate`` checks values (slot range, lengths against
    the capacity, finiteness of q and gate) with device-to-host copies: switch it off inside graph capture.
    Key tiles ``block_n`` of 16, 32 or 64. ``tree_slack`` (default :func:`default_tree_slack`): committed key tiles
    the last split gives up per tile of tree keys it walks (0: even split). ``combine_block_d``: columns per
    program of the split combine (power of two, default up to 4096 / splits). ``pdl``: a programmatic dependent
    launch where the device supports it (:mod:`~lumotree.optimized.pdl`), which prefetches each split's committed
    K / V into L2 before it waits for the previous kernel; that kernel must not write ``slots``, ``cache_lens`` or
    the committed K / V (:func:`prepare_qkv`, which signals at its start for this, writes only the tree's).
    """
    device = q.device
    float_types = (torch.float32, torch.bfloat16, torch.float16)
    _check_tensor("q", q, 4, float_types, device)
    B, N, HQ, D = q.shape
    if q.stride(-1) != 1:
        raise ValueError("q must have a contiguous last dimension")
    _check_tensor("k_cache", k_cache, 4, float_types, device)
    P, HKV, C, _ = k_cache.shape
    _check_cache(k_cache, v_cache, HKV, D, device)
    if HQ % HKV != 0:
        raise ValueError(f"q has HQ = {HQ} heads, not a multiple of the cache's HKV = {HKV} heads (GQA)")
    if q.dtype != k_cache.dtype:
        raise TypeError(f"q has dtype {q.dtype} but the cache holds {k_cache.dtype}")
    _check_slots(slots, cache_lens, B, P, device)
    W = (N + WORD_BITS - 1) // WORD_BITS
    _check_tensor("words", words, 3, (torch.int32,), device)
    if words.shape != (B, N, W) or words.stride(2) != 1:
        raise ValueError(f"words has shape {tuple(words.shape)}, expected [B, N, ceil(N/32)] = {(B, N, W)}")
    if gate is not None:
        _check_tensor("gate", gate, 4, float_types, device)
        if gate.shape != q.shape or gate.stride(-1) != 1:
            raise ValueError(f"gate has shape {tuple(gate.shape)}, expected {tuple(q.shape)} (contiguous last dim)")
    if scale is None:
        scale = D**-0.5
    if not (isinstance(scale, (int, float)) and math.isfinite(scale) and scale > 0):
        raise ValueError(f"scale = {scale!r} must be a positive finite number")
    if validate:
        _check_slot_range(slots, P)
        _check_lens_fit(cache_lens, None, N, C)
        _check_finite("q", q)
        if gate is not None:
            _check_finite("gate", gate)
    G = HQ // HKV
    if num_splits is None and max_len is None:
        max_len = int(cache_lens.max().item()) if B else 0
    bm, bn, nw, ns, splits = default_launch(B, N, HQ, HKV, D, max_len or 0, device, q.dtype)
    custom_tiles = block_m is not None or block_n is not None
    block_m = block_m or bm
    block_n = block_n or bn
    if block_m < G or block_m & (block_m - 1):
        raise ValueError(f"block_m = {block_m} must be a power of two >= the GQA group size {G}")
    if block_n not in (16, 32, 64):
        raise ValueError(f"block_n = {block_n} must be 16, 32 or 64 (a key tile spans at most two ancestor words)")
    row_blocks = triton.cdiv(N, block_m // G)
    if num_splits is None:
        num_splits = splits if not custom_tiles else choose_num_splits(B, HKV, row_blocks, max_len, device,
                                                                       block_n=block_n)
    if not (isinstance(num_splits, int) and num_splits >= 1):
        raise ValueError(f"num_splits = {num_splits!r} must be a positive integer")
    if tree_slack is None:
        tree_slack = default_tree_slack(B, N, HQ, HKV, D, num_splits)
    if not (isinstance(tree_slack, int) and 0 <= tree_slack <= 1024):
        raise ValueError(f"tree_slack = {tree_slack!r} must be an integer in [0, 1024]")
    if combine_block_d is not None and not (isinstance(combine_block_d, int) and combine_block_d >= 16
                                            and combine_block_d & (combine_block_d - 1) == 0):
        raise ValueError(f"combine_block_d = {combine_block_d!r} must be a power of two >= 16")
    if out is None:
        out = torch.empty((B, N, HQ, D), dtype=q.dtype, device=device)  # [B, N, HQ, D]
    elif out.shape != (B, N, HQ, D) or out.stride(-1) != 1 or out.dtype != q.dtype:
        raise ValueError(f"out must be [B, N, HQ, D] = {(B, N, HQ, D)} of dtype {q.dtype}, contiguous last dim")
    if num_splits > 1:
        part_acc = torch.empty((num_splits, B, N, HQ, D), dtype=torch.float32, device=device)  # [S, B, N, HQ, D]
        part_ml = torch.empty((num_splits, B, N, HQ, 2), dtype=torch.float32, device=device)  # [S, B, N, HQ, (m, l)]
    else:
        part_acc = part_ml = out  # unused
    g = gate if gate is not None else q
    block_d = max(16, triton.next_power_of_2(D))
    # tree-sized partials (more than a decode tile of rows per kv head): the splits without keys store and the
    # combine reads nothing (H200, B = 1, N = 64, L = 1024, 16 splits: -3.5 us a verify step); at decode sizes the
    # skip (its length loads ahead of q and of the partials) measured +2 us a decode step
    skip_empty = num_splits > 1 and G * N > 16
    pa_strides = part_acc.stride()[:4] if num_splits > 1 else (0, 0, 0, 0)
    pm_strides = part_ml.stride()[:4] if num_splits > 1 else (0, 0, 0, 0)
    extra = {}
    if num_warps or not _is_interpreter():
        extra["num_warps"] = num_warps or nw
        extra["num_stages"] = num_stages or ns
    pdl = bool(pdl) and pdl_supported(device)
    if pdl:
        extra["launch_pdl"] = True
    line_elems = 128 // k_cache.element_size()  # elements of one 128-byte line
    _tree_attn_kernel[(row_blocks, B * HKV, num_splits)](
        q, k_cache, v_cache, g, words, slots, cache_lens, out, part_acc, part_ml,
        q.stride(0), q.stride(1), q.stride(2), g.stride(0), g.stride(1), g.stride(2),
        out.stride(0), out.stride(1), out.stride(2),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), v_cache.stride(0), v_cache.stride(1),
        v_cache.stride(2), words.stride(0), words.stride(1), *pa_strides, *pm_strides,
        N, W, HQ, D, float(scale) * _LOG2E, num_splits, tree_slack,
        G=G, FINALIZE=num_splits == 1, HAS_GATE=gate is not None, IEEE=q.dtype == torch.float32,
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_D=block_d, EVEN_D=block_d == D, SKIP_EMPTY=skip_empty, PDL=pdl,
        KV_LINES=triton.cdiv(D, line_elems), LINE_ELEMS=line_elems, **extra,
    )  # fmt: skip
    if num_splits > 1:
        block_s = min(128, triton.next_power_of_2(num_splits))  # all splits in one load up to 128
        block_dc = min(block_d, combine_block_d or max(16, 4096 // block_s))  # [block_s, block_dc] tiles
        _combine_kernel[(B * N * HQ, triton.cdiv(D, block_dc))](
            part_acc, part_ml, g, out, cache_lens, *pa_strides, *pm_strides, g.stride(0), g.stride(1), g.stride(2),
            out.stride(0), out.stride(1), out.stride(2), N, HQ, D, num_splits, tree_slack, block_m // G,
            HAS_GATE=gate is not None, BLOCK_D=block_dc, BLOCK_S=block_s, KEY_BLOCK=block_n, SKIP_EMPTY=skip_empty,
            PDL=pdl_supported(out.device),
            **({} if _is_interpreter() else {"num_warps": 4}),
        )  # fmt: skip
    return out


# ------------------------------------------------------------------------------------------------------ kv commit
@triton.jit
def accepted_path(word_row_ptr, n_valid, NP: tl.constexpr, WORD_BITS: tl.constexpr):
    """The path root..a of one request, from row a of its inclusive ancestor bitsets (``word_row_ptr`` at
    ``words[b, a]``; nodes ``>= n_valid`` not read): ``(on_path [NP], rank [NP], path_len)`` with ``on_path[j] =
    (words[a][j // WORD_BITS] >> (j % WORD_BITS)) & 1`` (the arithmetic of ``lumotree.reference.tree.mask_bit``,
    literally) and ``rank[j]`` node j's position on the path, i.e. its depth (trees are topological)."""
    return path_of_words(ancestor_words(word_row_ptr, n_valid, NP, WORD_BITS), NP, WORD_BITS)


@triton.jit
def ancestor_words(word_row_ptr, n_valid, NP: tl.constexpr, WORD_BITS: tl.constexpr):
    """``[NP]``: the bitset word that holds node j's bit, for each node j (0 for ``j >= n_valid``): the load of
    :func:`accepted_path`, for a kernel that issues it early."""
    nodes = tl.arange(0, NP)  # [NP]
    return tl.load(word_row_ptr + nodes // WORD_BITS, mask=nodes < n_valid, other=0)  # [NP]


@triton.jit
def path_of_words(word, NP: tl.constexpr, WORD_BITS: tl.constexpr):
    """``(on_path, rank, path_len)`` of :func:`accepted_path` from its :func:`ancestor_words`."""
    nodes = tl.arange(0, NP)  # [NP]
    on_path = ((word >> (nodes % WORD_BITS)) & 1) != 0  # [NP]
    return on_path, tl.cumsum(on_path.to(tl.int32), axis=0) - 1, tl.sum(on_path.to(tl.int32), axis=0)


@triton.jit
def tree_size(num_nodes_ptr, b, N, HAS_NUM: tl.constexpr):
    """Request ``b``'s node count: ``num_nodes[b]``, or N when the caller gave no sizes (``HAS_NUM`` False: every
    tree has N nodes, and no sizes tensor is made: the kernels of the GDN verify, its commit and the tree conv)."""
    if HAS_NUM:
        n_b = tl.load(num_nodes_ptr + b)
    else:
        n_b = N
    return n_b


@triton.jit
def path_chunk(on_path, rank, p0, NP: tl.constexpr, PB: tl.constexpr):
    """``[PB]`` node indices of path entries ``p0 .. p0 + PB - 1`` (of :func:`accepted_path`; 0 past its end)."""
    nodes = tl.arange(0, NP)  # [NP]
    lanes = tl.arange(0, PB)  # [PB]
    pick = on_path[None, :] & (rank[None, :] == p0 + lanes[:, None])  # [PB, NP]
    return tl.sum(tl.where(pick, nodes[None, :], 0), axis=1)  # [PB]


@triton.jit
def _kv_commit_kernel(
    KC, VC, Slots, Lens, Words, Accepted,
    skcl, skcp, skch, skcc, svcl, svcp, svch, svcc, swb, swn,
    B, N, D, NP: tl.constexpr, PB: tl.constexpr, BLOCK_D: tl.constexpr, WORD_BITS: tl.constexpr,
):  # fmt: skip
    """One program per (layer, request, kv head): the path root..a (``a = accepted[b]``) gathered PB nodes at a
    time in path order; path entry r (the node at depth r: trees are topological, so the path's nodes sorted by
    index are sorted by depth) moves from tree position ``L + j`` to ``L + r``. In place: a chunk's sources are all
    read before its targets are written (a barrier between), and a chunk's targets ``L + r < L + p0 + PB`` lie below
    every later source (``j >= r``)."""
    layer = (tl.program_id(0) // B).to(tl.int64)
    b = tl.program_id(0) % B
    h = tl.program_id(1)
    lanes = tl.arange(0, PB)  # [PB]
    offs_d = tl.arange(0, BLOCK_D)  # [BLOCK_D]
    slot = tl.load(Slots + b).to(tl.int64)
    L = tl.load(Lens + b).to(tl.int64)
    a = tl.load(Accepted + b)
    on_path, rank, path_len = accepted_path(Words + b * swb + a * swn, N, NP, WORD_BITS)  # [NP], [NP], scalar
    k_base = KC + layer * skcl + slot * skcp + h * skch
    v_base = VC + layer * svcl + slot * svcp + h * svch
    for p0 in range(0, path_len, PB):
        src = path_chunk(on_path, rank, p0, NP, PB)  # [PB] node at depth p0 + lane
        move = (p0 + lanes < path_len) & (src != p0 + lanes)  # [PB] on the path and not already in place
        m = move[:, None] & (offs_d < D)[None, :]  # [PB, BLOCK_D]
        kj = tl.load(k_base + (L + src)[:, None] * skcc + offs_d[None, :], mask=m)  # [PB, BLOCK_D]
        vj = tl.load(v_base + (L + src)[:, None] * svcc + offs_d[None, :], mask=m)  # [PB, BLOCK_D]
        tl.debug_barrier()  # the chunk's sources are read before its targets are written
        tl.store(k_base + (L + p0 + lanes)[:, None] * skcc + offs_d[None, :], kj, mask=m)
        tl.store(v_base + (L + p0 + lanes)[:, None] * svcc + offs_d[None, :], vj, mask=m)


def kv_commit(
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slots: torch.Tensor,
    cache_lens: torch.Tensor,
    meta: TreeMeta,
    accepted: torch.Tensor,
    *,
    validate: bool = True,
) -> None:
    """Compact each request's accepted path into its cache slot, in place.

    For request b with accepted node ``a = accepted[b]`` the K/V of the path root..a (tree positions
    ``cache_lens[b] + j``) move to ``cache_lens[b] + depth(j)``, in path order (trees topological: parents first).
    The caller then advances ``cache_lens[b]`` by ``depth(a) + 1`` (the model does this once for all layers).
    Layers run on the same trees commit in one launch: caches ``[G, P, HKV, C, D]`` (each layer's block laid out
    as one layer's cache).
    """
    if not isinstance(k_cache, torch.Tensor):
        raise TypeError(f"k_cache must be a torch.Tensor, got {type(k_cache).__name__}")
    device = k_cache.device
    layered = k_cache.ndim == 5
    if layered:
        if not isinstance(v_cache, torch.Tensor) or v_cache.shape != k_cache.shape:
            raise ValueError(f"v_cache must match k_cache {tuple(k_cache.shape)} in shape")
        k_caches, v_caches = k_cache, v_cache
        k_cache, v_cache = k_cache[0], v_cache[0]  # layer 0 stands for the shared checks
    _check_tensor("k_cache", k_cache, 4, (torch.float32, torch.bfloat16, torch.float16), device)
    P, HKV, C, D = k_cache.shape
    _check_cache(k_cache, v_cache, HKV, D, device)
    if not layered:
        k_caches, v_caches = k_cache[None], v_cache[None]
    words, depth = meta
    _check_tensor("meta.words", words, 3, (torch.int32,), device)
    B, N, W = words.shape
    _check_tensor("meta.depth", depth, 2, (torch.int32,), device)
    if depth.shape != (B, N) or not depth.is_contiguous() or words.stride(2) != 1:
        raise ValueError(f"meta.depth must be a contiguous [B, N] = {(B, N)} tensor")
    _check_slots(slots, cache_lens, B, P, device)
    _check_tensor("accepted", accepted, 1, (torch.int32,), device)
    if accepted.shape[0] != B:
        raise ValueError(f"accepted has shape {tuple(accepted.shape)}, expected [B] = [{B}]")
    if validate:
        acc_cpu = accepted.cpu()
        if bool(((acc_cpu < 0) | (acc_cpu >= N)).any()):
            b = int(torch.nonzero((acc_cpu < 0) | (acc_cpu >= N))[0, 0])
            raise ValueError(f"accepted[{b}] = {int(acc_cpu[b])} is not a node index in [0, {N})")
        _check_slot_range(slots, P)
        _check_lens_fit(cache_lens, None, N, C)
    _kv_commit_kernel[(k_caches.shape[0] * B, HKV)](
        k_caches, v_caches, slots, cache_lens, words, accepted.contiguous(),
        k_caches.stride(0), k_caches.stride(1), k_caches.stride(2), k_caches.stride(3),
        v_caches.stride(0), v_caches.stride(1), v_caches.stride(2), v_caches.stride(3),
        words.stride(0), words.stride(1), B, N, D,
        NP=max(16, triton.next_power_of_2(N)), PB=PATH_BLOCK, BLOCK_D=triton.next_power_of_2(D),
        WORD_BITS=WORD_BITS,
    )  # fmt: skip
