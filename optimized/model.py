r"""The optimized hybrid model (Qwen3-Next layout) on the GPU: prefill, decode, batched tree verify and commit.

Same function as :mod:`lumotree.reference.model` (and HF ``Qwen3NextForCausalLM``), computed in bf16 with fp32
states, on the Triton kernels of this package. Every request owns a *slot*; all per-request state lives in pools
indexed by slot:

- GDN layer: recurrent state ``[P, HV, K, V]`` fp32 and conv state ``[P, W - 1, C]`` fp32;
- attention layer: KV cache ``[P, HKV, capacity, D]`` (capacity = ``max_seq_len + max_nodes``: a tree's K/V are
  written right after the committed ones, then compacted);
- the committed length of each slot ``[P]`` int32 (all layers advance together).

Each kind of pool is one tensor with a leading layer dimension (``state_stack: [G, P, HV, K, V]`` and so on; the
per-layer lists ``state_pools`` etc. are its views), and a tree step writes what its commit reads into stacked
buffers too (the factors, the conv inputs), so that a commit is three launches for all layers.

A *tree step* runs B requests with N nodes each through all layers: per GDN layer the tree convolution
(:func:`~lumotree.optimized.conv_tree.tree_conv`, or in the ``w_in`` GEMV's epilogue,
:class:`~lumotree.optimized.gemv.TreeConv`, when the step's B N rows run on the GEMV), the closed-form tree verify
(:func:`~lumotree.optimized.gdn_tree.gdn_tree_verify_gated`) and the gated RMSNorm
(:func:`~lumotree.optimized.gdn_decode.gated_rmsnorm`; where the fused norms run on the GEMV, split between the verify
kernel, :class:`~lumotree.optimized.gdn_tree.OutputGate`, and the ``w_out`` GEMV, a per-segment
:class:`~lumotree.optimized.gemv.RowNorm`: no launch of its own), per attention layer the fused q/k norm + RoPE + KV store
(:func:`~lumotree.optimized.tree_attention.prepare_qkv`) and tree attention; the projections and MLPs are cuBLAS
matmuls (with ``small_batch_linear``, the GPU default, the projections of steps with few token rows use the split-K
weight-streaming GEMV of :mod:`~lumotree.optimized.gemv` where :func:`~lumotree.optimized.gemv.preferred`, launched
with PDL, :mod:`~lumotree.optimized.pdl`: every step of at most 64 token rows); each residual add is fused with the
RMSNorm that follows it, and SwiGLU's ``silu(g) * u`` is computed in the gate | up GEMV's epilogue (the dense MLP's
gate and up rows interleaved, :func:`~lumotree.optimized.gemv.interleave_gate_up`; after cuBLAS, one kernel). Where both
projections around a residual add run on the GEMV (``fused_norms``: decode and tree steps up to 64 rows), the add
and the norm live in the two GEMVs (:func:`~lumotree.optimized.gemv.residual_linear` and a
:class:`~lumotree.optimized.gemv.RowNorm` factor), and the decode step's short conv in the ``w_in`` GEMV's epilogue
(:class:`~lumotree.optimized.gemv.ConvStep`): 2 add + RMSNorm launches a decode step instead of 49, no conv launch.
The *commit* advances every pool along each request's accepted path (GDN state from the factors, conv state from
the path inputs, KV compaction), one launch per kind for all layers. Then

- ``verify`` = tree step (logits of every node), caches untouched until ``commit``;
- ``speculate_greedy`` = tree step, greedy acceptance and commit in one call (one graph: the greedy engine step's
  device work in a single launch);
- ``decode`` = a *decode step*: the same layers for one token per request without tree or commit — per GDN layer
  the conv step (:func:`~lumotree.optimized.gdn_decode.conv_step`, or in the GEMV's epilogue) and
  :func:`~lumotree.optimized.gdn_decode.gdn_decode` (state read
  and written once, gated norm fused), per attention layer tree attention on a one-node tree (its K/V written in
  place at the committed length): the same function as a tree step on one-node trees plus the commit of the root;
- ``prefill`` = chunks of up to ``max_nodes`` tokens, each a chain tree + commit of its last node (the GDN core uses
  flash-linear-attention's ``chunk_gated_delta_rule`` on the chunk instead when it is importable on a GPU).

CUDA graphs (GPU, ``graphs=True``): the first call of each shape runs eagerly (compiling the kernels) and captures a
graph per ``("verify", B, N)``, ``("commit", B, N)``, ``("greedy", B, N)`` and ``("decode", B)``; later calls of that shape copy their inputs
into the graph's static buffers and replay. Returned logits of a replayed graph are its static output: valid until
the next call of the same shape (clone to keep them). The engine pads B and N to its buckets.

The MoE block is computed densely (every expert on every token, weighted by the renormalised top-k router
probabilities, zero elsewhere): exact and CUDA-graph safe, but not fast; the benchmark model uses a dense MLP.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from . import tree_attention as ta
from ._checks import MAX_NODES, check_tree_rows, interpreting, node_mask
from .conv_tree import tree_conv, tree_conv_commit
from .gdn_decode import conv_step, gated_rmsnorm, gdn_decode
from .gdn_tree import GATE_PIECE, WORD_BITS, OutputGate, TreeFactors, gdn_tree_commit, gdn_tree_verify_gated
from .gemv import gemv_config
from .gemv import preferred as gemv_preferred
from .gemv import (ConvStep, ResidualRows, RowNorm, TreeConv, interleave_gate_up, residual_linear,
                   small_batch_linear)
from .pdl import allow_dependents, pdl_supported
from .tree_attention import tree_metadata_program
from .sampling import greedy_accept

__all__ = ["OptimizedModel", "load_pretrained", "from_reference", "build_random", "HEAD_ROWS"]

#: the fused GDN verify kernel of a tree step launched with PDL where its config asks for it (its ``S0`` tiles
#: prefetched into L2 before its wait; :func:`~lumotree.optimized.gdn_tree.gdn_tree_verify`), when the model's GEMVs
#: are (an A / B knob; no default config asks for it since the fourteenth session, which moved B = 1 at N = 64 to the
#: split pipeline: an explicit ``KernelConfig(pdl=True)`` does)
GDN_VERIFY_PDL = True
#: tree attention launched with PDL (each split's committed K / V prefetched into L2 before its wait;
#: :func:`~lumotree.optimized.tree_attention.tree_attention`) in steps of at most this many requests, when the model's
#: GEMVs are. H200, bench model, L = 1024 (bench/RESULTS.md, ninth session): B = 1 decode 1353 -> 1345 us, verify
#: N = 64 unchanged; B = 16 decode 2123 -> 2165 us and verify 9713 -> 9755 us. 0: never (an A / B knob)
ATTENTION_PDL_MAX_BATCH = 1
#: a tree step's gated RMSNorm after each GDN layer split between the verify kernel (which stores ``w o silu(z)`` and
#: the pieces of each head's sum of squares, :class:`~lumotree.optimized.gdn_tree.OutputGate`) and the ``w_out``
#: GEMV (which scales each head's share of its product, a per-segment
#: :class:`~lumotree.optimized.gemv.RowNorm`) instead of a launch of its own, where the GEMV takes the step
#: (fused norms, ``tl.dot`` form: 2 to 64 rows) (an A / B knob)
GDN_GATE_IN_GEMV = True

#: rows of the LM head computed at once by a greedy step (its logits are reduced to the argmax chunk by chunk; 1024
#: rows of fp32 logits over a 151936-token vocabulary take 622 MB)
HEAD_ROWS = 1024


# ------------------------------------------------------------------------------------------- fused small kernels
@triton.jit
def _add_rmsnorm_kernel(h_ptr, delta_ptr, w_ptr, out_ptr, D, eps, HAS_DELTA: tl.constexpr, BLOCK: tl.constexpr,
                        PDL: tl.constexpr):
    """One program per token row: ``h += delta`` (rounded to h's dtype, in place), ``out = h rsqrt(mean h^2 + eps) w``."""
    allow_dependents(PDL)  # the GEMV after it may launch now (optimized.pdl)
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)  # [BLOCK]
    ok = cols < D
    h = tl.load(h_ptr + row * D + cols, mask=ok, other=0.0)  # [BLOCK]
    if HAS_DELTA:
        h = (h.to(tl.float32) + tl.load(delta_ptr + row * D + cols, mask=ok, other=0.0).to(tl.float32))
        h = h.to(h_ptr.dtype.element_ty)
        tl.store(h_ptr + row * D + cols, h, mask=ok)
    hf = h.to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(hf * hf, axis=0) / D + eps)
    w = tl.load(w_ptr + cols, mask=ok, other=0.0)
    tl.store(out_ptr + row * D + cols, (hf * rstd * w).to(out_ptr.dtype.element_ty), mask=ok)


@triton.jit
def _silu_mul_kernel(gu_ptr, out_ptr, inner, BLOCK: tl.constexpr, PDL: tl.constexpr):
    """``out[t, j] = silu(gu[t, 2j]) * gu[t, 2j + 1]`` (SwiGLU of interleaved gate / up columns), fp32 arithmetic,
    one rounding."""
    allow_dependents(PDL)  # the GEMV after it may launch now (optimized.pdl)
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)  # [BLOCK]
    ok = cols < inner
    g = tl.load(gu_ptr + row * 2 * inner + 2 * cols, mask=ok, other=0.0).to(tl.float32)
    u = tl.load(gu_ptr + row * 2 * inner + 2 * cols + 1, mask=ok, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * inner + cols, (g * tl.sigmoid(g) * u).to(out_ptr.dtype.element_ty), mask=ok)


@triton.jit
def _step_prologue_kernel(tokens_ptr, slots_ptr, s_tok_b, s_tok_n, s_slot, embed_ptr, lens_ptr, h_ptr,
                          slots_out_ptr, lens_out_ptr, N, D, parents_ptr, num_nodes_ptr, words_ptr, depth_ptr,
                          s_par_b, s_par_n, W, BLOCK: tl.constexpr, ADVANCE: tl.constexpr, TREE: tl.constexpr,
                          NP: tl.constexpr, BLOCK_W: tl.constexpr, ROUNDS: tl.constexpr, PDL: tl.constexpr):
    """Program ``(b, n)``, ``n < N``, of a step with ``N`` tokens per request: ``h[b N + n] = embed[tokens[b, n]]``;
    program ``(b, 0)`` also stores ``slots_out[b] = slots[b]`` (int32, contiguous) and ``lens_out[b] =
    lens[slots[b]]`` (the committed length the step's attention reads) and (``ADVANCE``, a decode step: one token,
    distinct slots) then ``lens[slots[b]] += 1``, in place of the small torch ops of a gather, a cast and an index.
    With ``TREE`` (a tree step) program ``(b, N)`` builds request ``b``'s tree metadata
    (:func:`~lumotree.optimized.tree_attention.tree_metadata_program`) next to the others."""
    allow_dependents(PDL)  # the first GEMV may launch now (optimized.pdl)
    b = tl.program_id(0).to(tl.int64)
    n = tl.program_id(1)
    if TREE and n == N:
        tree_metadata_program(b, parents_ptr, num_nodes_ptr, words_ptr, depth_ptr, N, s_par_b, s_par_n, W, NP,
                              BLOCK_W, ROUNDS, True)
    else:
        tok = tl.load(tokens_ptr + b * s_tok_b + n * s_tok_n).to(tl.int64)
        cols = tl.arange(0, BLOCK)  # [BLOCK]
        row = b * N + n
        for d0 in range(0, D, BLOCK):
            ok = d0 + cols < D
            tl.store(h_ptr + row * D + d0 + cols, tl.load(embed_ptr + tok * D + d0 + cols, mask=ok), mask=ok)
        if n == 0:
            slot = tl.load(slots_ptr + b * s_slot).to(tl.int64)
            length = tl.load(lens_ptr + slot)
            tl.store(lens_out_ptr + b, length)
            tl.store(slots_out_ptr + b, slot.to(tl.int32))
            if ADVANCE:
                tl.store(lens_ptr + slot, length + 1)


def _step_prologue(tokens: torch.Tensor, slots: torch.Tensor, embed: torch.Tensor, lens: torch.Tensor,
                   advance: bool, tree: tuple[torch.Tensor, torch.Tensor] | None = None
                   ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, ta.TreeMeta | None]:
    """A step's inputs in one launch (:func:`_step_prologue_kernel`): ``tokens: [B, N]`` (a decode step: ``[B]``)
    and ``slots: [B]`` integer (any strides) -> the residual stream ``[B N, Dm]`` (the tokens' embeddings), the
    slots ``[B]`` int32 and their committed lengths ``[B]`` before the step; with ``advance`` (a decode step,
    distinct slots) ``lens [P]`` then advances by one at those slots. ``tree = (parents [B, N], num_nodes [B])``
    (checked trees) also gives the step's :func:`~lumotree.optimized.gdn_tree.tree_meta` (else None)."""
    tokens2 = tokens[:, None] if tokens.ndim == 1 else tokens  # [B, N]
    B, N = tokens2.shape
    D = embed.shape[1]
    h = torch.empty((B * N, D), dtype=embed.dtype, device=embed.device)  # [B N, Dm]
    slots_out = torch.empty((B,), dtype=torch.int32, device=embed.device)  # [B]
    lens_out = torch.empty((B,), dtype=lens.dtype, device=embed.device)  # [B]
    meta = None
    if tree is None:
        parents = num_nodes = words = depth = tokens2  # unread
        consts = dict(NP=1, BLOCK_W=1, ROUNDS=1)
    else:
        parents, num_nodes = tree  # [B, N], [B]
        meta, consts = ta.tree_metadata_buffers(B, N, embed.device)
        words, depth = meta
    _step_prologue_kernel[(B, N + (tree is not None))](
        tokens2, slots, tokens2.stride(0), tokens2.stride(1), slots.stride(0), embed, lens, h, slots_out, lens_out,
        N, D, parents, num_nodes, words, depth, parents.stride(0), parents.stride(1), words.shape[-1],
        BLOCK=min(4096, triton.next_power_of_2(D)), ADVANCE=bool(advance), TREE=tree is not None,
        PDL=pdl_supported(embed.device), **consts, **_launch_opts(4))
    return h, slots_out, lens_out, meta


def _launch_opts(num_warps: int) -> dict:
    return {} if interpreting() else {"num_warps": num_warps}


def _add_rmsnorm(h: torch.Tensor, delta: torch.Tensor | None, weight1p: torch.Tensor, eps: float) -> torch.Tensor:
    """Zero-centred RMSNorm ``x * rsqrt(mean(x^2) + eps) * (1 + w)`` of the residual stream ``h: [T, Dm]`` after
    ``h += delta`` in place (``delta: [T, Dm]`` or None; ``weight1p = 1 + w`` fp32). Returns ``[T, Dm]``."""
    T, D = h.shape
    out = torch.empty_like(h)  # [T, Dm]
    has_delta = delta is not None
    _add_rmsnorm_kernel[(T,)](h, delta if has_delta else h, weight1p, out, D, float(eps), HAS_DELTA=has_delta,
                              BLOCK=triton.next_power_of_2(D), PDL=pdl_supported(h.device),
                              **_launch_opts(8 if D >= 2048 else 4))
    return out


def _silu_mul(gu: torch.Tensor) -> torch.Tensor:
    """SwiGLU activation of the fused gate | up projection ``gu: [T, 2I]`` (columns interleaved,
    :func:`~lumotree.optimized.gemv.interleave_gate_up`) -> ``[T, I]``."""
    T, two_i = gu.shape
    inner = two_i // 2
    out = torch.empty((T, inner), dtype=gu.dtype, device=gu.device)  # [T, I]
    block = min(1024, triton.next_power_of_2(inner))
    _silu_mul_kernel[(T, triton.cdiv(inner, block))](gu, out, inner, BLOCK=block, PDL=pdl_supported(gu.device),
                                                     **_launch_opts(4))
    return out


@dataclass
class _GDNLayer:
    in_norm: torch.Tensor  # [Dm] fp32, 1 + w
    w_in: torch.Tensor  # [C + HV V + 2 HV, Dm]: rows q | k | v | z | b | a (head-major each)
    conv_w: torch.Tensor  # [C, W]
    A_log: torch.Tensor  # [HV] fp32
    dt_bias: torch.Tensor  # [HV] fp32
    norm_w: torch.Tensor  # [V] fp32 (plain weight of the gated RMSNorm)
    w_out: torch.Tensor  # [Dm, HV V]


@dataclass
class _AttnLayer:
    in_norm: torch.Tensor  # [Dm] fp32, 1 + w
    w_qkv: torch.Tensor  # [2 HQ D + 2 HKV D, Dm]: HF q_proj rows (query_h | gate_h per head), k_proj, v_proj
    q_norm: torch.Tensor  # [D] fp32 zero-centred weight w
    k_norm: torch.Tensor  # [D] fp32
    w_o: torch.Tensor  # [Dm, HQ D]


@dataclass
class _MLP:
    post_norm: torch.Tensor  # [Dm] fp32, 1 + w
    w_gate_up: torch.Tensor  # dense: [2 I, Dm] gate / up rows interleaved (gemv.interleave_gate_up); MoE: [E, 2 I, Dm]
    w_down: torch.Tensor  # dense: [Dm, I]; MoE: [E, Dm, I]
    router: torch.Tensor | None = None  # MoE: [E, Dm]
    shared_gate_up: torch.Tensor | None = None  # [2 Is, Dm]
    shared_down: torch.Tensor | None = None  # [Dm, Is]
    shared_gate: torch.Tensor | None = None  # [1, Dm]


@dataclass
class _StepRecord:
    """What a tree step leaves for its commit (all tensors stay alive and unmodified until the commit)."""

    B: int
    N: int
    slots: torch.Tensor  # [B] int32
    parents: torch.Tensor  # [B, N] int32
    num_nodes: torch.Tensor  # [B] int32
    meta: ta.TreeMeta
    lens: torch.Tensor  # [B] int32 committed lengths at the step
    factors: TreeFactors | None  # every GDN layer's, stacked [G, ...] (None: the states were already advanced)
    conv_inputs: torch.Tensor | None  # [G, B, N, C] every GDN layer's conv inputs (strided: projection rows)
    logits: torch.Tensor  # [B, N, V] fp32 (or [B, 1, V] for prefill chunks); greedy steps: argmax [B, N] int64


@dataclass
class _Residual:
    """A step's residual stream ``h: [T, Dm]`` (updated in place) and what is pending on it: ``delta: [T, Dm]``, a
    layer output not yet added (the next add + RMSNorm kernel adds it), or ``rows``, left by a GEMV that added its
    product into ``h`` (:func:`~lumotree.optimized.gemv.residual_linear`): the rows' sums of squares in pieces and
    ``h`` scaled by the next norm's weight ``norm_for``, from which the next GEMV computes ``RMSNorm(h) @ w^T``."""

    h: torch.Tensor
    delta: torch.Tensor | None = None
    rows: ResidualRows | None = None
    norm_for: torch.Tensor | None = None


class OptimizedModel:
    """Qwen3-Next hybrid model on the optimized kernels, with slot-addressed pools (see the module docstring).

    API (the engine builds on these):

    - ``prefill(slot, tokens) -> [V]`` fp32 logits after the last token; resets the slot first.
    - ``decode(slots [B], tokens [B]) -> [B, V]``: one token per slot; caches advance by one.
    - ``verify(slots [B], tokens [B, N], parents [B, N], num_nodes [B] | None) -> [B, N, V]``: logits of every
      node (node i at position ``length + depth(i)``); caches untouched.
    - ``commit(slots [B], accepted [B])``: advance every cache of the last ``verify`` along root..accepted.
    - ``release(slot)``; ``cache_length(slot)``; attributes ``vocab_size, num_slots, max_seq_len, max_nodes,
      device, dtype, config``.

    ``small_batch_linear`` (or :meth:`set_small_batch_linear`): projections of few token rows (where
    :func:`~lumotree.optimized.gemv.preferred`) on :func:`~lumotree.optimized.gemv.small_batch_linear` instead of
    cuBLAS (GPU only; default: on for a CUDA model in bf16/fp16, where it measured 1.03-1.20x faster than cuBLAS per
    projection at one row on the H200, bench/RESULTS.md); ``pdl`` (default: where supported): the GEMV as a
    programmatic dependent launch (:mod:`~lumotree.optimized.pdl`).
    """

    def __init__(
        self,
        config: Any,
        tensors: Mapping[str, Any],
        *,
        num_slots: int = 8,
        max_seq_len: int = 4096,
        max_nodes: int = 64,
        device: str | torch.device | None = None,
        dtype: torch.dtype | None = None,
        graphs: bool | None = None,
        gdn_precision: str | None = None,
        use_fla: bool | None = None,
        small_batch_linear: bool | None = None,
        pdl: bool | None = None,
    ):
        from lumotree.reference.config import HybridConfig
        from lumotree.reference.model import IGNORED_TENSOR_PREFIXES, hf_tensor_shapes

        if not isinstance(config, HybridConfig):
            raise TypeError(f"config must be a lumotree.reference.config.HybridConfig, got {type(config).__name__}")
        for name, value, low, high in (("num_slots", num_slots, 1, 1 << 20), ("max_seq_len", max_seq_len, 1, 1 << 24),
                                       ("max_nodes", max_nodes, 1, MAX_NODES)):
            if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
                raise ValueError(f"{name} = {value!r} must be an integer in [{low}, {high}]")
        self.config = config
        self.device = torch.device(device if device is not None else ("cuda" if torch.cuda.is_available() else "cpu"))
        self.dtype = dtype or (torch.bfloat16 if self.device.type == "cuda" else torch.float32)
        if self.dtype not in (torch.float32, torch.bfloat16, torch.float16):
            raise ValueError(f"dtype = {self.dtype} must be float32, bfloat16 or float16")
        self.num_slots, self.max_seq_len, self.max_nodes = num_slots, max_seq_len, max_nodes
        self.capacity = max_seq_len + max_nodes
        self.graphs = bool(graphs if graphs is not None else self.device.type == "cuda")
        if self.graphs and self.device.type != "cuda":
            raise ValueError("graphs=True needs a CUDA device")
        # tf32 tensor cores for bf16/fp16 models (GDN error ~4e-4, far below the model's own rounding), fp32 FMA
        # (ieee, ~3e-7) for fp32 models
        self.gdn_precision = gdn_precision or ("ieee" if self.dtype == torch.float32 else "tf32")
        self.use_fla = _fla_available() if use_fla is None else bool(use_fla)
        if self.use_fla and not _fla_available():
            raise ValueError("use_fla=True but flash-linear-attention is not importable on a CUDA device")
        self.eps = float(config.rms_norm_eps)
        if small_batch_linear is None:  # decode projections on optimized.gemv (see _linear)
            small_batch_linear = self.device.type == "cuda" and self.dtype != torch.float32
        self.small_batch_linear = bool(small_batch_linear)
        # residual add + RMSNorm inside the GEMVs around them wherever both run on the GEMV (see _add_linear)
        self.fused_norms = True
        # the GEMV as a programmatic dependent launch (resident when the previous kernel ends; optimized.pdl)
        self.pdl = pdl_supported(self.device) if pdl is None else bool(pdl) and pdl_supported(self.device)

        # ---- weights: validate names and shapes (HF layout), then fuse / reorder once
        expected = hf_tensor_shapes(config)
        for name in tensors:
            if name not in expected and not name.startswith(IGNORED_TENSOR_PREFIXES) and not (
                name == "lm_head.weight" and config.tie_word_embeddings
            ):
                raise ValueError(f"unexpected tensor {name!r} (not part of this config's model)")
        for name, shape in expected.items():
            if name not in tensors:
                raise ValueError(f"missing tensor {name!r} (expected shape {list(shape)})")
            if tuple(tensors[name].shape) != tuple(shape):
                raise ValueError(f"tensor {name!r} has shape {list(tensors[name].shape)}, expected {list(shape)}")

        def get(name: str, dtype: torch.dtype | None = None) -> torch.Tensor:
            t = tensors[name]
            t = torch.from_numpy(np.ascontiguousarray(t)) if isinstance(t, np.ndarray) else t
            if not bool(torch.isfinite(t).all()):
                raise ValueError(f"tensor {name!r} contains NaN or inf")
            return t.to(device=self.device, dtype=dtype or self.dtype).contiguous()

        f32 = torch.float32
        self.embed = get("model.embed_tokens.weight")  # [Vocab, Dm]
        self.final_norm = 1.0 + get("model.norm.weight", f32)  # [Dm]
        self.lm_head = self.embed if config.tie_word_embeddings else get("lm_head.weight")  # [Vocab, Dm]
        self.layers: list[_GDNLayer | _AttnLayer] = []
        self.mlps: list[_MLP] = []
        if "linear_attention" in config.layer_types:
            gs = config.gdn_spec()
            self._gdn_dims = (gs.num_k_heads, gs.num_v_heads, gs.head_k_dim, gs.head_v_dim, gs.conv_kernel)
            qkvz_perm, ba_perm = _gdn_row_orders(gs.num_k_heads, gs.num_v_heads, gs.head_k_dim, gs.head_v_dim)
        if "full_attention" in config.layer_types:
            spec = config.attention_spec()
            self._attn_dims = (spec.num_heads, spec.num_kv_heads, spec.head_dim)
            self.inv_freq = ta.rope_inv_freq(spec.rotary_dim, spec.rope_theta, self.device)  # [rd / 2]
            if spec.rotary_dim == 0:
                raise ValueError("rotary_dim = 0 is not supported by the fused RoPE kernel")
        for i, kind in enumerate(config.layer_types):
            p = f"model.layers.{i}"
            in_norm = 1.0 + get(f"{p}.input_layernorm.weight", f32)
            if kind == "linear_attention":
                a = f"{p}.linear_attn"
                w_in = torch.cat([get(f"{a}.in_proj_qkvz.weight")[qkvz_perm], get(f"{a}.in_proj_ba.weight")[ba_perm]])
                self.layers.append(_GDNLayer(
                    in_norm, w_in.contiguous(), get(f"{a}.conv1d.weight")[:, 0, :].contiguous(),
                    get(f"{a}.A_log", f32), get(f"{a}.dt_bias", f32), get(f"{a}.norm.weight", f32),
                    get(f"{a}.out_proj.weight")))
            else:
                s = f"{p}.self_attn"
                w_qkv = torch.cat([get(f"{s}.q_proj.weight"), get(f"{s}.k_proj.weight"), get(f"{s}.v_proj.weight")])
                self.layers.append(_AttnLayer(in_norm, w_qkv, get(f"{s}.q_norm.weight", f32),
                                              get(f"{s}.k_norm.weight", f32), get(f"{s}.o_proj.weight")))
            post = 1.0 + get(f"{p}.post_attention_layernorm.weight", f32)
            m = f"{p}.mlp"
            if config.is_moe_layer(i):
                experts = range(config.num_experts)
                gate_up = torch.stack([torch.cat([get(f"{m}.experts.{e}.gate_proj.weight"),
                                                  get(f"{m}.experts.{e}.up_proj.weight")]) for e in experts])
                down = torch.stack([get(f"{m}.experts.{e}.down_proj.weight") for e in experts])
                self.mlps.append(_MLP(
                    post, gate_up, down, router=get(f"{m}.gate.weight"),
                    shared_gate_up=torch.cat([get(f"{m}.shared_expert.gate_proj.weight"),
                                              get(f"{m}.shared_expert.up_proj.weight")]),
                    shared_down=get(f"{m}.shared_expert.down_proj.weight"),
                    shared_gate=get(f"{m}.shared_expert_gate.weight")))
            else:
                self.mlps.append(_MLP(post, interleave_gate_up(get(f"{m}.gate_proj.weight"),
                                                               get(f"{m}.up_proj.weight")),
                                      get(f"{m}.down_proj.weight")))

        # ---- pools
        # each kind of cache is one tensor with a leading layer dimension, so that a commit advances every layer in
        # one launch; the per-layer lists are views of them
        P, dev = num_slots, self.device
        n_gdn = sum(isinstance(layer, _GDNLayer) for layer in self.layers)
        n_attn = len(self.layers) - n_gdn
        H, HV, K, V, W = self._gdn_dims if n_gdn else (1, 1, 1, 1, 2)
        HQ, HKV, D = self._attn_dims if n_attn else (1, 1, 1)
        self.state_stack = torch.zeros((n_gdn, P, HV, K, V), dtype=f32, device=dev)  # [G, P, HV, K, V] fp32
        self.conv_stack = torch.zeros((n_gdn, P, W - 1, 2 * H * K + HV * V), dtype=f32, device=dev)  # [G, P, W-1, C]
        self.k_stack = torch.zeros((n_attn, P, HKV, self.capacity, D), dtype=self.dtype,
                                   device=dev)  # [A, P, HKV, cap, D]
        self.v_stack = torch.zeros_like(self.k_stack)
        self.state_pools: list[torch.Tensor] = list(self.state_stack.unbind(0))  # per GDN layer [P, HV, K, V]
        self.conv_pools: list[torch.Tensor] = list(self.conv_stack.unbind(0))  # per GDN layer [P, W - 1, C]
        self.k_pools: list[torch.Tensor] = list(self.k_stack.unbind(0))  # per attention layer [P, HKV, capacity, D]
        self.v_pools: list[torch.Tensor] = list(self.v_stack.unbind(0))
        self.lens = torch.zeros(P, dtype=torch.int32, device=dev)  # [P] committed length per slot
        self._root_words = torch.ones((P, 1, 1), dtype=torch.int32, device=dev)  # decode: a one-node tree's bitset
        self._zero_offsets = torch.zeros((P, 1), dtype=torch.int32, device=dev)  # decode: RoPE at position lens
        self._host_lens = [0] * P  # committed lengths on the host (plus the advances below, once settled)
        self._pending_advance: list[tuple[list[int], torch.Tensor]] = []  # commits not yet read back: (slots, [B])
        self._last_slots: list[int] = []  # host copy of the last verify's slots
        self._last: _StepRecord | None = None
        self._graph_entries: dict[tuple, dict] = {}

    # ------------------------------------------------------------------------------------------------ properties
    @property
    def vocab_size(self) -> int:
        return int(self.config.vocab_size)

    def cache_length(self, slot: int) -> int:
        self._settle_lengths()
        return self._host_lens[self._check_slot(slot)]

    def release(self, slot: int) -> None:
        """Free a slot (its pools are reset by the next ``prefill``)."""
        self._settle_lengths()
        self._host_lens[self._check_slot(slot)] = 0

    def _settle_lengths(self) -> None:
        """Add the advances of earlier commits to the host lengths. A commit leaves its advance on the device (reading
        it back would wait for the commit's kernels); it is read here, when a host length is next needed."""
        for slots_host, advance in self._pending_advance:
            for s, a in zip(slots_host, advance.tolist()):
                self._host_lens[s] += a
        self._pending_advance.clear()

    def _host_slots(self, slots: torch.Tensor) -> list[int]:
        """``slots`` as a host list: free for a CPU tensor (what the engine passes), a device read otherwise."""
        return [int(s) for s in slots.tolist()]

    # ------------------------------------------------------------------------------------------------ checks
    def _check_slot(self, slot: Any) -> int:
        if isinstance(slot, bool) or not isinstance(slot, (int, np.integer)) or not 0 <= int(slot) < self.num_slots:
            raise ValueError(f"slot = {slot!r} is not a slot index in [0, {self.num_slots})")
        return int(slot)

    def _check_slots(self, slots: Any) -> torch.Tensor:
        if not isinstance(slots, torch.Tensor) or slots.ndim != 1 or slots.numel() == 0:
            raise ValueError("slots must be a non-empty 1-D integer tensor")
        if slots.dtype not in (torch.int32, torch.int64):
            raise TypeError(f"slots has dtype {slots.dtype}, expected int32 or int64")
        host = slots.cpu().tolist()
        for b, s in enumerate(host):
            if not 0 <= s < self.num_slots:
                raise ValueError(f"slots[{b}] = {s} is outside [0, {self.num_slots})")
        if len(set(host)) != len(host):
            raise ValueError(f"slots has repeated entries {host}: each request needs its own slot")
        return slots.to(device=self.device, dtype=torch.int32)

    def _check_tokens(self, name: str, tokens: Any, shape: tuple[int, ...]) -> torch.Tensor:
        if not isinstance(tokens, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(tokens).__name__}")
        if tuple(tokens.shape) != shape:
            raise ValueError(f"{name} has shape {tuple(tokens.shape)}, expected {shape}")
        if tokens.dtype not in (torch.int32, torch.int64):
            raise TypeError(f"{name} has dtype {tokens.dtype}, expected int32 or int64")
        bad = (tokens < 0) | (tokens >= self.vocab_size)
        if bool(bad.any()):
            idx = torch.nonzero(bad)[0].tolist()
            raise ValueError(f"{name}{idx} = {int(tokens[tuple(idx)])} is outside the vocabulary [0, {self.vocab_size})")
        return tokens.to(device=self.device, dtype=torch.int64)

    def _check_room(self, slots_host: list[int], n: int) -> None:
        """A step of ``n`` nodes needs the committed length below ``max_seq_len`` and ``n`` free cache rows."""
        self._settle_lengths()
        for b, s in enumerate(slots_host):
            if self._host_lens[s] >= self.max_seq_len or self._host_lens[s] + n > self.capacity:
                raise ValueError(f"slot {s} (request {b}) holds {self._host_lens[s]} tokens: no room for {n} more "
                                 f"(max_seq_len = {self.max_seq_len})")

    def _check_tree_step(self, slots, tokens, parents, num_nodes):
        """The arguments of a tree step (:meth:`verify`, :meth:`speculate_greedy`), checked and on the device."""
        slots = self._check_slots(slots)
        B = slots.shape[0]
        if not isinstance(tokens, torch.Tensor) or tokens.ndim != 2 or tokens.shape[0] != B:
            raise ValueError(f"tokens must be a [B, N] tensor with B = {B}")
        N = tokens.shape[1]
        if not 1 <= N <= self.max_nodes:
            raise ValueError(f"tokens has N = {N} nodes; this model was built for 1 <= N <= {self.max_nodes}")
        tokens = self._check_tokens("tokens", tokens, (B, N))
        if not isinstance(parents, torch.Tensor) or tuple(parents.shape) != (B, N) or \
                parents.dtype not in (torch.int32, torch.int64):
            raise ValueError(f"parents must be an int32/int64 tensor of shape [B, N] = {(B, N)}")
        parents = parents.to(device=self.device, dtype=torch.int32)
        if num_nodes is None:
            num_nodes = torch.full((B,), N, dtype=torch.int32, device=self.device)
        elif not isinstance(num_nodes, torch.Tensor) or tuple(num_nodes.shape) != (B,):
            raise ValueError(f"num_nodes must be a tensor of shape [B] = ({B},)")
        num_nodes = num_nodes.to(device=self.device, dtype=torch.int32)
        bad = (num_nodes < 1) | (num_nodes > N)
        if bool(bad.any()):
            b = int(torch.nonzero(bad)[0])
            raise ValueError(f"num_nodes[{b}] = {int(num_nodes[b])} is outside [1, N = {N}]")
        check_tree_rows(parents, num_nodes)
        self._check_room(slots.tolist(), N)
        return slots, tokens, parents, num_nodes

    # ------------------------------------------------------------------------------------------------ core
    def _num_splits(self, B: int, N: int) -> int:
        """Fixed per (B, N) (graph safe): the default split count over the whole cache capacity."""
        HQ, HKV, D = self._attn_dims
        return ta.default_launch(B, N, HQ, HKV, D, self.capacity, self.device, self.dtype)[4]

    def set_small_batch_linear(self, enabled: bool, pdl: bool | None = None, fused_norms: bool | None = None
                               ) -> None:
        """Route the projections of steps with few token rows (where :func:`~lumotree.optimized.gemv.preferred`:
        decode at small batch, the LM head of small tree steps) through
        :func:`~lumotree.optimized.gemv.small_batch_linear` (a split-K
        weight-streaming GEMV) instead of cuBLAS, launched with PDL or not (``pdl``; None: unchanged; only where
        supported), with the residual add + RMSNorm between two GEMVs done inside them or by their own kernel
        (``fused_norms``; None: unchanged); drops the captured CUDA graphs (the next call of each shape captures
        anew)."""
        self.small_batch_linear = bool(enabled)
        if pdl is not None:
            self.pdl = bool(pdl) and pdl_supported(self.device)
        if fused_norms is not None:
            self.fused_norms = bool(fused_norms)
        self._graph_entries.clear()

    def _on_gemv(self, x: torch.Tensor, n_out: int) -> bool:
        """Whether ``x [T, Din] @ w [n_out, Din]^T`` runs on the GEMV: enabled,
        :func:`~lumotree.optimized.gemv.preferred` for the shape, on a GPU or under the Triton interpreter."""
        return (self.small_batch_linear and gemv_preferred(x.shape[0], n_out) and x.stride(-1) == 1
                and (x.is_cuda or interpreting()))

    def _gate_in_gemv(self, T: int, w_out: torch.Tensor) -> bool:
        """Whether a ``T``-row tree step splits each GDN layer's gated RMSNorm between the verify kernel and the
        ``w_out`` GEMV (:data:`GDN_GATE_IN_GEMV`): the GEMV takes the fused norms in its ``tl.dot`` form."""
        return (GDN_GATE_IN_GEMV and self.fused_norms and self.small_batch_linear and gemv_preferred(T, w_out.shape[0])
                and (w_out.is_cuda or interpreting()) and gemv_config(T, *w_out.shape, w_out.device).use_dot)

    def _linear(self, x: torch.Tensor, w: torch.Tensor, out_dtype: torch.dtype | None = None,
                swiglu: bool = False, conv: ConvStep | TreeConv | None = None, out: torch.Tensor | None = None
                ) -> torch.Tensor:
        """``x [T, Din] @ w [Dout, Din]^T``: the GEMV of :mod:`~lumotree.optimized.gemv` where :meth:`_on_gemv`, else
        cuBLAS (``out_dtype``: default x's). ``swiglu``: ``w`` is the dense MLP's interleaved gate | up weight and the
        result ``silu(gate) * up: [T, Dout / 2]`` (in the GEMV's epilogue, or by the SwiGLU kernel after cuBLAS).
        ``conv``: the first ``C`` output columns through one
        decode step of the short conv (in the GEMV's epilogue, or by :func:`~lumotree.optimized.gdn_decode.conv_step`
        after cuBLAS, in place; a :class:`~lumotree.optimized.gemv.TreeConv`: the tree conv of a tree step into
        ``conv.out``, in the GEMV's epilogue or by :func:`~lumotree.optimized.conv_tree.tree_conv` after cuBLAS).
        ``out``: a contiguous ``[T, Dout]`` buffer of x's dtype to write (no ``out_dtype``)."""
        if self._on_gemv(x, w.shape[0]):
            return small_batch_linear(x, w, out_dtype=out_dtype, pdl=self.pdl, swiglu=swiglu, conv=conv,
                                      validate=False, out=out)
        if swiglu:
            return _silu_mul(torch.matmul(x, w.T))  # [T, Dout / 2]
        y = torch.matmul(x, w.T, out=out)
        y = y if out_dtype is None else y.to(out_dtype)
        if isinstance(conv, TreeConv):
            B, N = conv.parents.shape
            tree_conv(y.view(B, N, -1)[..., : conv.weight.shape[0]], conv.weight, conv.state_pool, conv.slots,
                      conv.parents, num_nodes=conv.num_nodes, activation="silu" if conv.silu else None,
                      validate=False, out=conv.out)
        elif conv is not None:
            C = conv.weight.shape[0]
            conv_step(y[:, :C], conv.weight, conv.state_pool, conv.slots, activation="silu" if conv.silu else None,
                      out=y[:, :C], validate=False)
        return y

    def _normed(self, res: _Residual, weight1p: torch.Tensor) -> torch.Tensor:
        """``RMSNorm(h + delta)`` of the residual stream (its pending add done in place first): ``[T, Dm]``."""
        x = _add_rmsnorm(res.h, res.delta, weight1p, self.eps)  # [T, Dm]
        res.delta = res.rows = res.norm_for = None
        return x

    def _norm_linear(self, res: _Residual, weight1p: torch.Tensor, w: torch.Tensor,
                     conv: ConvStep | TreeConv | None = None, out: torch.Tensor | None = None, swiglu: bool = False
                     ) -> torch.Tensor:
        """``RMSNorm(h) @ w^T`` (``weight1p = 1 + w_norm``; ``conv``, ``out``, ``swiglu`` as in :meth:`_linear`):
        from the rows the last add into ``h`` left scaled by this norm's weight when this projection runs on the GEMV
        too (the norm's factor applied to the product), else the add + RMSNorm kernel and then :meth:`_linear`."""
        rows = res.rows
        if rows is not None and res.norm_for is weight1p and self._on_gemv(rows.scaled, w.shape[0]):
            return small_batch_linear(rows.scaled, w, pdl=self.pdl, norm=RowNorm(rows.parts, self.eps), conv=conv,
                                      swiglu=swiglu, validate=False, out=out)
        return self._linear(self._normed(res, weight1p), w, conv=conv, out=out, swiglu=swiglu)

    def _add_linear(self, res: _Residual, x: torch.Tensor, w: torch.Tensor, next_norm: torch.Tensor | None,
                    norm: RowNorm | None = None) -> None:
        """``h += x @ w^T``: in the GEMV's epilogue, which also leaves what the next norm (weight ``next_norm``,
        ``1 + w``) needs (:func:`~lumotree.optimized.gemv.residual_linear`; ``fused_norms``), or as a pending
        ``delta`` that the next add + RMSNorm kernel adds. ``norm``: the product scaled first (the GEMV path only:
        :meth:`_gate_in_gemv` chose it)."""
        assert res.delta is None, "a norm settles every pending add before the next projection"
        if self.fused_norms and next_norm is not None and self._on_gemv(x, w.shape[0]):
            res.rows = residual_linear(x, w, res.h, scale=next_norm, norm=norm, pdl=self.pdl)
            res.norm_for = next_norm
        else:
            assert norm is None, "a scaled product needs the GEMV path"
            res.delta, res.rows, res.norm_for = self._linear(x, w), None, None

    def _next_in_norm(self, i: int) -> torch.Tensor | None:
        """The input norm weight (``1 + w``) of layer ``i + 1``; None after the last layer (the final norm follows)."""
        return self.layers[i + 1].in_norm if i + 1 < len(self.layers) else None

    def _mlp(self, m: _MLP, res: _Residual, next_norm: torch.Tensor | None) -> None:
        """``h += MLP(RMSNorm(h))``: SwiGLU (on the GEMVs, the norm and the add inside them, ``next_norm`` the norm
        after it, None before the final one), or the MoE block computed densely (see the module docstring)."""
        if m.router is None:
            act = self._norm_linear(res, m.post_norm, m.w_gate_up, swiglu=True)  # [T, I] silu(gate) * up
            self._add_linear(res, act, m.w_down, next_norm)
            return
        x = self._normed(res, m.post_norm)  # [T, Dm]
        probs = torch.softmax((x @ m.router.T).float(), dim=-1)  # [T, E]
        top_p, top_i = torch.topk(probs, self.config.num_experts_per_tok, dim=-1)  # [T, k]
        if self.config.norm_topk_prob:
            top_p = top_p / top_p.sum(-1, keepdim=True)
        weights = torch.zeros_like(probs).scatter(1, top_i, top_p).to(x.dtype)  # [T, E]
        gu = torch.einsum("td,efd->etf", x, m.w_gate_up)  # [E, T, 2I]
        g, u = gu.chunk(2, dim=-1)
        y = torch.einsum("eti,edi->etd", F.silu(g) * u, m.w_down)  # [E, T, Dm]
        out = torch.einsum("etd,te->td", y, weights)
        sg, su = (x @ m.shared_gate_up.T).chunk(2, dim=-1)
        shared = (F.silu(sg) * su) @ m.shared_down.T
        res.delta = out + torch.sigmoid(x @ m.shared_gate.T) * shared  # [T, Dm]

    def _step(self, tokens, slots, parents, num_nodes, *, prefill: bool = False, argmax: bool = False) -> _StepRecord:
        """A tree step (module docstring). ``tokens, parents: [B, N]``, ``slots, num_nodes: [B]`` (device tensors).
        ``argmax``: the record holds the argmax of every node's logits instead of the logits, computed over at most
        :data:`HEAD_ROWS` rows at a time (the fp32 logits of a large step never exist at once: a 64 x 64-node step's
        would take 2.5 GB of the graph's memory)."""
        B, N = tokens.shape
        T = B * N
        h, _, lens, meta = _step_prologue(tokens, slots, self.embed, self.lens, False, (parents, num_nodes))
        # h: [T, Dm], lens: [B], meta: the tree's ancestor words and depths
        res = _Residual(h)  # [T, Dm] residual stream (fresh: updated in place)
        # what the commit reads, for every GDN layer in one tensor each (one commit launch for all layers)
        n_gdn = len(self.state_pools)
        factors = conv_inputs = None
        if n_gdn:
            H, HV, K, V, W = self._gdn_dims
            C = 2 * H * K + HV * V
            proj_all = torch.empty((n_gdn, T, C + HV * V + 2 * HV), dtype=self.dtype, device=self.device)  # w_in rows
            conv_all = torch.empty((n_gdn, B, N, C), dtype=self.dtype, device=self.device)  # [G, B, N, C]
            conv_inputs = proj_all.view(n_gdn, B, N, -1)[..., :C]  # [G, B, N, C] q | k | v before the conv
            if not (prefill and self.use_fla):
                f32 = dict(dtype=torch.float32, device=self.device)
                factors = TreeFactors(torch.empty((n_gdn, B, N, HV, V), **f32),  # [G, B, N, HV, V] delta
                                      torch.empty((n_gdn, B, N, HV), **f32),  # [G, B, N, HV] log Gamma
                                      conv_all[..., H * K : 2 * H * K].unflatten(-1, (H, K)),  # [G, B, N, H, K]
                                      torch.empty((n_gdn, B, N, H), **f32))  # [G, B, N, H] k_rnorm
        gi = ai = 0
        splits = self._num_splits(B, N) if self.k_pools else 1
        for i, (layer, m) in enumerate(zip(self.layers, self.mlps)):
            if isinstance(layer, _GDNLayer):  # (H, HV, K, V, C as set above)
                conv = conv_all[gi]  # [B, N, C] the tree conv of the inputs (q | k | v), written by the projection
                proj = self._norm_linear(res, layer.in_norm, layer.w_in, out=proj_all[gi], conv=TreeConv(
                    layer.conv_w, self.conv_pools[gi], slots, parents, num_nodes, conv)).view(B, N, -1)
                z = proj[..., C : C + HV * V].unflatten(-1, (HV, V))  # [B, N, HV, V]; proj: [B, N, C + HV V + 2 HV]
                b_gate = proj[..., C + HV * V : C + HV * V + HV]  # [B, N, HV]
                a_gate = proj[..., C + HV * V + HV :]  # [B, N, HV]
                q = conv[..., : H * K].unflatten(-1, (H, K))  # [B, N, H, K]
                k = conv[..., H * K : 2 * H * K].unflatten(-1, (H, K))  # [B, N, H, K]
                v = conv[..., 2 * H * K :].unflatten(-1, (HV, V))  # [B, N, HV, V]
                gate = None
                if factors is None:  # prefill through fla
                    o = self._fla_chunk(q, k, v, a_gate, b_gate, layer, gi, slots)  # advances the state pool
                else:
                    o = torch.empty((B, N, HV, V), dtype=self.dtype, device=self.device)  # [B, N, HV, V]
                    if self._gate_in_gemv(T, layer.w_out):  # o: w o silu(z); the per-head norm factor in w_out
                        gate = OutputGate(z, layer.norm_w, torch.empty(
                            (B, N, HV, V // GATE_PIECE), dtype=torch.float32, device=self.device))  # parts
                    gdn_tree_verify_gated(
                        q, k, v, a_gate, b_gate, layer.A_log, layer.dt_bias, self.state_pools[gi], slots, parents,
                        allow_neg_eigval=self.config.allow_neg_eigval, num_nodes=num_nodes, meta=meta,
                        input_precision=self.gdn_precision, validate=False, pdl=self.pdl and GDN_VERIFY_PDL,
                        out=(o, factors.delta[gi], factors.log_gamma[gi], factors.k_rnorm[gi]), gate=gate)
                if gate is not None:
                    self._add_linear(res, o.view(T, HV * V), layer.w_out, m.post_norm,
                                     RowNorm(gate.parts.view(T, HV, -1), self.eps))  # h += [T, Dm]
                else:
                    gated = gated_rmsnorm(o.reshape(T, HV, V), z.reshape(T, HV, V), layer.norm_w, eps=self.eps)
                    self._add_linear(res, gated.view(T, HV * V), layer.w_out, m.post_norm)  # h += [T, Dm]
                gi += 1
            else:
                HQ, HKV, D = self._attn_dims
                proj = self._norm_linear(res, layer.in_norm, layer.w_qkv).view(B, N, -1)  # [B, N, 2 HQ D + 2 HKV D]
                qg = proj[..., : 2 * HQ * D].unflatten(-1, (HQ, 2 * D))  # [B, N, HQ, 2D] query_h | gate_h
                kk = proj[..., 2 * HQ * D : 2 * HQ * D + HKV * D].unflatten(-1, (HKV, D))  # [B, N, HKV, D]
                vv = proj[..., 2 * HQ * D + HKV * D :].unflatten(-1, (HKV, D))  # [B, N, HKV, D]
                q_rot = ta.prepare_qkv(qg[..., :D], kk, vv, layer.q_norm, layer.k_norm, self.inv_freq, meta.depth,
                                       self.k_pools[ai], self.v_pools[ai], slots, lens, eps=self.eps,
                                       validate=False)  # [B, N, HQ, D]; K/V stored at lens + n
                att = ta.tree_attention(q_rot, self.k_pools[ai], self.v_pools[ai], slots, lens, meta.words,
                                        gate=qg[..., D:], num_splits=splits, validate=False,
                                        pdl=self.pdl and B <= ATTENTION_PDL_MAX_BATCH)  # [B, N, HQ, D]
                self._add_linear(res, att.reshape(T, HQ * D), layer.w_o, m.post_norm)  # h += [T, Dm]
                ai += 1
            self._mlp(m, res, self._next_in_norm(i))
        x = self._normed(res, self.final_norm).view(B, N, -1)  # [B, N, Dm] final-normed
        if prefill:  # only the chunk's last real token needs logits
            last = (num_nodes.long() - 1)[:, None, None].expand(B, 1, x.shape[-1])
            x = x.gather(1, last)  # [B, 1, Dm]
        rows = x.shape[1]
        flat = x.reshape(B * rows, -1)  # [B N or B, Dm]
        if argmax:
            best = torch.cat([self._linear(flat[r : r + HEAD_ROWS], self.lm_head, torch.float32).argmax(-1)
                              for r in range(0, B * rows, HEAD_ROWS)])  # [B N]
            return _StepRecord(B, N, slots, parents, num_nodes, meta, lens, factors, conv_inputs, best.view(B, rows))
        logits = self._linear(flat, self.lm_head, torch.float32).view(B, rows, -1)  # [B, N or 1, V]
        return _StepRecord(B, N, slots, parents, num_nodes, meta, lens, factors, conv_inputs, logits)

    def _decode_step(self, tokens: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
        """One token per request (``tokens, slots: [B]`` integer device tensors, any stride; read by the fused
        prologue, :func:`_step_prologue`): every pool advances by one in place, no
        tree and no commit (:mod:`~lumotree.optimized.gdn_decode` for the GDN layers: the state is read and
        written once; tree attention on one-node trees for the attention layers). Returns logits ``[B, V]`` fp32."""
        B = slots.shape[0]
        h, slots, lens, _ = _step_prologue(tokens, slots, self.embed, self.lens, True)  # lens: [B] before; lens += 1
        res = _Residual(h)  # [B, Dm] residual stream
        if self.state_pools:
            H, HV, K, V, W = self._gdn_dims
            C = 2 * H * K + HV * V
        gi = ai = 0
        splits = self._num_splits(B, 1) if self.k_pools else 1
        for i, (layer, m) in enumerate(zip(self.layers, self.mlps)):
            if isinstance(layer, _GDNLayer):  # (H, HV, K, V, C as set above)
                proj = self._norm_linear(res, layer.in_norm, layer.w_in, conv=ConvStep(
                    layer.conv_w, self.conv_pools[gi], slots))  # [B, C + HV V + 2 HV], conv'd q | k | v
                conv = proj[:, :C]  # [B, C]
                gated = gdn_decode(
                    conv[:, : H * K].unflatten(-1, (H, K)), conv[:, H * K : 2 * H * K].unflatten(-1, (H, K)),
                    conv[:, 2 * H * K :].unflatten(-1, (HV, V)), proj[:, C + HV * V + HV :],
                    proj[:, C + HV * V : C + HV * V + HV], layer.A_log, layer.dt_bias, self.state_pools[gi], slots,
                    allow_neg_eigval=self.config.allow_neg_eigval, z=proj[:, C : C + HV * V].unflatten(-1, (HV, V)),
                    norm_weight=layer.norm_w, eps=self.eps, validate=False)  # [B, HV, V] gated-normed
                self._add_linear(res, gated.view(B, HV * V), layer.w_out, m.post_norm)  # h += [B, Dm]
                gi += 1
            else:
                HQ, HKV, D = self._attn_dims
                proj = self._norm_linear(res, layer.in_norm, layer.w_qkv)[:, None]  # [B, 1, 2 HQ D + 2 HKV D]
                qg = proj[..., : 2 * HQ * D].unflatten(-1, (HQ, 2 * D))  # [B, 1, HQ, 2D]
                kk = proj[..., 2 * HQ * D : 2 * HQ * D + HKV * D].unflatten(-1, (HKV, D))  # [B, 1, HKV, D]
                vv = proj[..., 2 * HQ * D + HKV * D :].unflatten(-1, (HKV, D))  # [B, 1, HKV, D]
                q_rot = ta.prepare_qkv(qg[..., :D], kk, vv, layer.q_norm, layer.k_norm, self.inv_freq,
                                       self._zero_offsets[:B], self.k_pools[ai], self.v_pools[ai], slots, lens,
                                       eps=self.eps, validate=False)  # [B, 1, HQ, D]; K/V stored at lens
                att = ta.tree_attention(q_rot, self.k_pools[ai], self.v_pools[ai], slots, lens, self._root_words[:B],
                                        gate=qg[..., D:], num_splits=splits, validate=False,
                                        pdl=self.pdl and B <= ATTENTION_PDL_MAX_BATCH)  # [B, 1, HQ, D]
                self._add_linear(res, att.view(B, HQ * D), layer.w_o, m.post_norm)  # h += [B, Dm]
                ai += 1
            self._mlp(m, res, self._next_in_norm(i))
        return self._linear(self._normed(res, self.final_norm), self.lm_head, torch.float32)  # [B, Vocab]

    def _commit(self, rec: _StepRecord, accepted: torch.Tensor) -> torch.Tensor:
        """Advance every pool of ``rec``'s slots along root..accepted (device tensors only: graph safe), one launch
        per kind of cache for all layers (GDN states, conv states, K/V); returns each slot's length advance ``[B]``
        (depth of the accepted node + 1) on the device."""
        if rec.factors is not None:
            gdn_tree_commit(self.state_stack, rec.slots, rec.factors, rec.parents, accepted, num_nodes=rec.num_nodes,
                            meta=rec.meta, input_precision=self.gdn_precision, validate=False)
        if rec.conv_inputs is not None:
            tree_conv_commit(self.conv_stack, rec.slots, rec.conv_inputs, rec.parents, accepted,
                             num_nodes=rec.num_nodes, validate=False)
        if rec.N > 1 and self.k_pools:  # a one-node tree is already in place
            ta.kv_commit(self.k_stack, self.v_stack, rec.slots, rec.lens, rec.meta, accepted, validate=False)
        advance = rec.meta.depth.gather(1, accepted.long()[:, None])[:, 0] + 1  # [B]
        self.lens.index_copy_(0, rec.slots.long(), rec.lens + advance)
        return advance

    def _fla_chunk(self, q, k, v, a_gate, b_gate, layer: _GDNLayer, gi: int, slots) -> torch.Tensor:
        """Prefill chunk through flash-linear-attention's chunked GDN (one request); writes the final state."""
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule

        g = -layer.A_log.exp() * F.softplus(a_gate.float() + layer.dt_bias)  # [1, T, HV]
        beta = torch.sigmoid(b_gate.float())
        if self.config.allow_neg_eigval:
            beta = 2.0 * beta
        H, HV, K, V, _ = self._gdn_dims
        group = HV // H
        qe = q.repeat_interleave(group, dim=2) if group > 1 else q  # fla expects q/k per value head here
        ke = k.repeat_interleave(group, dim=2) if group > 1 else k
        state = self.state_pools[gi].index_select(0, slots.long())  # [1, HV, K, V]
        o, final = chunk_gated_delta_rule(qe.contiguous(), ke.contiguous(), v.contiguous(), g, beta.to(q.dtype),
                                          scale=K**-0.5, initial_state=state, output_final_state=True,
                                          use_qk_l2norm_in_kernel=True)
        self.state_pools[gi].index_copy_(0, slots.long(), final.float())
        return o

    # ------------------------------------------------------------------------------------------------ graphs
    def _run_graph(self, key: tuple, inputs: dict[str, torch.Tensor], body) -> Any:
        """Eager on the first call of ``key`` (compiles), captured afterwards, replayed from then on."""
        entry = self._graph_entries.get(key)
        if entry is None:
            static = {name: t.to(self.device, copy=True) for name, t in inputs.items()}  # host inputs too
            side = torch.cuda.Stream(self.device)  # the eager run doubles as the capture warm-up (side stream)
            side.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(side):
                result = body(**static)
            torch.cuda.current_stream(self.device).wait_stream(side)
            torch.cuda.synchronize(self.device)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                captured = body(**static)
            self._graph_entries[key] = {"graph": graph, "static": static, "result": captured}
            return result
        for name, t in inputs.items():
            entry["static"][name].copy_(t)
        entry["graph"].replay()
        return entry["result"]

    # ------------------------------------------------------------------------------------------------ API
    def prefill(self, slot: int, tokens: Sequence[int] | torch.Tensor) -> torch.Tensor:
        """Reset ``slot`` and run ``tokens`` (chunks of up to ``max_nodes``); returns the last logits ``[V]`` fp32."""
        slot = self._check_slot(slot)
        ids = tokens if isinstance(tokens, torch.Tensor) else torch.tensor(list(tokens), dtype=torch.int64)
        if ids.ndim != 1 or ids.numel() == 0:
            raise ValueError("tokens must be a non-empty sequence of token ids")
        ids = self._check_tokens("tokens", ids, (ids.numel(),))
        if ids.numel() > self.max_seq_len:
            raise ValueError(f"{ids.numel()} prompt tokens exceed max_seq_len = {self.max_seq_len}")
        for pool in (*self.state_pools, *self.conv_pools):
            pool[slot].zero_()
        self._settle_lengths()
        self.lens[slot] = 0
        self._host_lens[slot] = 0
        slots = torch.tensor([slot], dtype=torch.int32, device=self.device)
        chunk = self.max_nodes
        logits = None
        for start in range(0, ids.numel(), chunk):
            part = ids[start : start + chunk][None]  # [1, T]
            T = part.shape[1]
            parents = (torch.arange(T, dtype=torch.int32, device=self.device) - 1)[None]  # chain
            num_nodes = torch.full((1,), T, dtype=torch.int32, device=self.device)
            rec = self._step(part, slots, parents, num_nodes, prefill=True)
            self._commit(rec, num_nodes - 1)
            logits = rec.logits[0, 0]
        self._host_lens[slot] = ids.numel()
        self._last = None
        return logits

    def verify(self, slots: torch.Tensor, tokens: torch.Tensor, parents: torch.Tensor,
               num_nodes: torch.Tensor | None = None, *, validate: bool = True) -> torch.Tensor:
        """Logits ``[B, N, V]`` fp32 of every node of every request's tree; caches untouched until :meth:`commit`."""
        if validate:
            slots, tokens, parents, num_nodes = self._check_tree_step(slots, tokens, parents, num_nodes)
        B, N = tokens.shape
        if num_nodes is None:  # whole trees (also without validation)
            num_nodes = torch.full((B,), N, dtype=torch.int32, device=self.device)
        self._last_slots = self._host_slots(slots)  # before the launch: a device read would wait for the step
        inputs = {"tokens": tokens, "slots": slots, "parents": parents, "num_nodes": num_nodes}
        if self.graphs:
            rec = self._run_graph(("verify", B, N), inputs, lambda **kw: self._step(**kw))
        else:
            rec = self._step(*(t.to(self.device) for t in (tokens, slots, parents, num_nodes)))
        self._last = rec
        return rec.logits

    def speculate_greedy(self, slots: torch.Tensor, tokens: torch.Tensor, parents: torch.Tensor,
                         num_nodes: torch.Tensor | None = None, *, validate: bool = True) -> torch.Tensor:
        """:meth:`verify`, greedy acceptance and :meth:`commit` of the accepted nodes in one call (one CUDA graph per
        ``("greedy", B, N)``; nothing is read back). Each request accepts its deepest node whose every inclusive
        ancestor carries the target's argmax at its parent (:func:`~lumotree.optimized.sampling.greedy_accept` on the
        step's own tree metadata; the LM head's argmax taken :data:`HEAD_ROWS` rows at a time), and its caches
        advance along root..that node. Returns the outcome
        (:meth:`~lumotree.optimized.sampling.VerifyOutcome.packed`: ``[B, 3 + N]`` int64 on the device, accepted node,
        its depth, the argmax there = the next pending token, the on-path mask)."""
        if validate:
            slots, tokens, parents, num_nodes = self._check_tree_step(slots, tokens, parents, num_nodes)
        B, N = tokens.shape
        if num_nodes is None:  # whole trees, next to the tokens (joined with them below)
            num_nodes = torch.full((B,), N, dtype=torch.int32, device=tokens.device)
        self._settle_lengths()  # one pending advance at a time: a replay overwrites its graph's static advance
        host_slots = self._host_slots(slots)
        self._last = None
        step_in = _step_input(B, tokens, parents, num_nodes, slots)  # [B, 2N + 2]
        if self.graphs:
            packed, advance = self._run_graph(("greedy", B, N), {"step_in": step_in}, self._greedy_step)
        else:
            packed, advance = self._greedy_step(step_in.to(self.device))
        self._pending_advance.append((host_slots, advance))
        return packed

    def _greedy_step(self, step_in: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The body of :meth:`speculate_greedy` on ``step_in = tokens | parents | num_nodes | slots: [B, 2N + 2]``
        (device tensors only: graph safe): ``(packed outcome [B, 3 + N], length advance [B])``."""
        N = (step_in.shape[1] - 2) // 2
        tokens = step_in[:, :N].contiguous()  # [B, N]
        parents = step_in[:, N : 2 * N].to(torch.int32).contiguous()  # [B, N]
        num_nodes = step_in[:, 2 * N].to(torch.int32).contiguous()  # [B]
        slots = step_in[:, 2 * N + 1].to(torch.int32).contiguous()  # [B]
        rec = self._step(tokens, slots, parents, num_nodes, argmax=True)
        node = torch.arange(rec.N, device=tokens.device)  # [N]
        valid = node_mask(num_nodes, rec.N)  # [B, N]
        ancestor = (rec.meta.words[:, :, node // WORD_BITS] >> (node % WORD_BITS)) & 1  # [B, N, N] bit j of row i
        outcome = greedy_accept(tokens, parents, valid, ancestor.bool(), rec.meta.depth, rec.logits)
        advance = self._commit(rec, outcome.accepted_node.to(torch.int32))  # [B]
        return outcome.packed(), advance

    def commit(self, slots: torch.Tensor, accepted: torch.Tensor, *, validate: bool = True) -> None:
        """Advance the caches of the last :meth:`verify` along root..``accepted[b]`` for every request. Nothing is
        read back to the host (the host lengths settle at their next use), so a device ``accepted`` never waits."""
        rec = self._last
        if rec is None:
            raise RuntimeError("commit() needs a verify() first (each verify can be committed once)")
        if validate:
            slots = self._check_slots(slots)
            if slots.shape != rec.slots.shape or not torch.equal(slots.to(rec.slots), rec.slots):
                raise ValueError("slots differ from the slots of the last verify()")
            if not isinstance(accepted, torch.Tensor) or tuple(accepted.shape) != (rec.B,) or \
                    accepted.dtype not in (torch.int32, torch.int64):
                raise ValueError(f"accepted must be an int32/int64 tensor of shape [B] = ({rec.B},)")
            accepted = accepted.to(device=self.device, dtype=torch.int32)
            bad = (accepted < 0) | (accepted >= rec.num_nodes)
            if bool(bad.any()):
                b = int(torch.nonzero(bad)[0])
                raise ValueError(f"accepted[{b}] = {int(accepted[b])} is not a node of tree {b}")
        # the earlier commits' advances first (done by now, unless nothing waited since; a graph's advance below is
        # its static output, which the replay overwrites): one pending advance at a time
        self._settle_lengths()
        key = ("commit", rec.B, rec.N)
        graph_rec = self.graphs and self._graph_entries.get(("verify", rec.B, rec.N), {}).get("result") is rec
        if graph_rec:  # the verify came from a graph replay: commit through a graph on its static record
            entry = self._graph_entries.get(key)
            if entry is None:
                static = {"accepted": accepted.to(self.device, copy=True)}
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph):
                    captured = self._commit(rec, static["accepted"])
                entry = self._graph_entries[key] = {"graph": graph, "static": static, "result": captured}
            entry["static"]["accepted"].copy_(accepted)
            entry["graph"].replay()
            advance = entry["result"]  # [B] on the device
        else:
            advance = self._commit(rec, accepted.to(self.device))  # [B] on the device
        self._pending_advance.append((self._last_slots, advance))
        self._last = None

    def decode(self, slots: torch.Tensor, tokens: torch.Tensor, *, validate: bool = True) -> torch.Tensor:
        """One token per slot (``tokens: [B]``); returns logits ``[B, V]`` fp32 and advances every cache by one."""
        if validate:
            slots = self._check_slots(slots)
            tokens = self._check_tokens("tokens", tokens, tuple(slots.shape))
            self._check_room(slots.tolist(), 1)
        B = slots.shape[0]
        for s in self._host_slots(slots):  # before the launch: a device read would wait for the step
            self._host_lens[s] += 1
        step_in = _step_input(B, tokens, slots)  # [B, 2] tokens | slots

        def body(step_in: torch.Tensor) -> torch.Tensor:
            return self._decode_step(step_in[:, 0], step_in[:, 1])

        if self.graphs:
            return self._run_graph(("decode", B), {"step_in": step_in}, body)
        return body(step_in.to(self.device))


def _step_input(B: int, *parts: torch.Tensor) -> torch.Tensor:
    """The inputs of a step side by side, ``[B, sum of widths]`` int64 where the first one lives: one tensor, so
    host inputs take one copy into a graph's static buffer (host parts joined in numpy: cheaper than torch's CPU
    ops)."""
    if all(t.device.type == "cpu" for t in parts):
        return torch.from_numpy(np.concatenate([t.numpy().reshape(B, -1).astype(np.int64) for t in parts], 1))
    return torch.cat([t.reshape(B, -1).to(parts[0].device, torch.int64) for t in parts], 1)


def _gdn_row_orders(H: int, HV: int, K: int, V: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Row permutations of HF ``in_proj_qkvz`` / ``in_proj_ba`` (grouped per key head: q, k, v, z / b, a) into
    ``q | k | v | z`` / ``b | a``, each head-major: the conv inputs become one contiguous slice."""
    g = HV // H
    rows = torch.arange(H * (2 * K + 2 * g * V)).view(H, 2 * K + 2 * g * V)
    qkvz = torch.cat([rows[:, :K].flatten(), rows[:, K : 2 * K].flatten(), rows[:, 2 * K : 2 * K + g * V].flatten(),
                      rows[:, 2 * K + g * V :].flatten()])
    rows_ba = torch.arange(H * 2 * g).view(H, 2 * g)
    return qkvz, torch.cat([rows_ba[:, :g].flatten(), rows_ba[:, g:].flatten()])


def _fla_available() -> bool:
    if not torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET", "0") == "1":
        return False
    try:
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule  # noqa: F401
    except Exception:
        return False
    return True


# ------------------------------------------------------------------------------------------------------ builders
def load_pretrained(path: str | os.PathLike, **kwargs: Any) -> OptimizedModel:
    """An :class:`OptimizedModel` from a HF ``Qwen3NextForCausalLM`` checkpoint directory (the reference's reader:
    config keys and tensors are validated the same way). ``kwargs`` go to :class:`OptimizedModel`."""
    from lumotree.reference.checkpoint import read_config, read_tensors
    from lumotree.reference.config import HybridConfig

    config = HybridConfig.from_dict(read_config(path))
    return OptimizedModel(config, read_tensors(path), **kwargs)


def from_reference(model: Any, **kwargs: Any) -> OptimizedModel:
    """The optimized model with the weights of a :class:`lumotree.reference.model.HybridModel`."""
    from lumotree.reference.model import weights_to_tensors

    return OptimizedModel(model.config, weights_to_tensors(model.weights, model.config), **kwargs)


def random_tensors(config: Any, seed: int, device: Any, dtype: Any = None, *,
                   successor: bool = False, residual_scale: float = 0.1) -> dict[str, torch.Tensor]:
    """HF-named random weights drawn on ``device`` (cast to ``dtype`` if given) with the distributions of
    :func:`lumotree.reference.model.build_random` (no float64 host copy; for large random models).

    ``successor=True`` builds a *greedy-stable* random model for system benchmarks: ``lm_head`` rows are the embedding
    rows under a seeded random permutation ``pi`` of the vocabulary (``lm_head[pi(t)] = embed[t]``) and every
    projection that writes the residual stream (attention ``o_proj``, GDN ``out_proj``, MLP ``down_proj``) is scaled by
    ``residual_scale``. The final hidden state then stays close to its token's embedding ``e_t``, so the greedy next
    token is ``pi(t)`` with a logit margin of about ``|e_t|^2 = hidden_size`` against a spread of about
    ``sqrt(hidden_size)`` for the other tokens: far above bf16 noise, so speculative and autoregressive greedy
    decoding agree token for token and an oracle drafter stays in sync. Every layer still runs its full computation
    (same cost as any model of this shape); only the *content* of the continuation is trivial."""
    from lumotree.reference.model import hf_tensor_shapes

    if successor and config.tie_word_embeddings:
        raise ValueError("successor=True needs tie_word_embeddings=False (lm_head is a permuted copy of the embedding)")
    gen = torch.Generator(device=device).manual_seed(seed)
    tensors: dict[str, torch.Tensor] = {}
    residual_writers = ("o_proj", "out_proj", "down_proj")
    for name, shape in hf_tensor_shapes(config).items():
        leaf = name.rsplit(".", 2)[-2] if name.endswith(".weight") else name.rsplit(".", 1)[-1]
        t = torch.empty(shape, dtype=torch.float32, device=device)
        if name == "model.embed_tokens.weight":
            t.normal_(generator=gen)
        elif name.endswith("A_log"):
            t.uniform_(0.1, 2.0, generator=gen).log_()
        elif name.endswith("dt_bias") or leaf == "conv1d":
            t.normal_(0.0, 0.5, generator=gen)
        elif name.endswith("linear_attn.norm.weight"):
            t.normal_(1.0, 0.1, generator=gen)
        elif len(shape) == 1:
            t.normal_(0.0, 0.1, generator=gen)
        else:
            t.normal_(0.0, shape[-1] ** -0.5, generator=gen)
            if successor and leaf in residual_writers:
                t.mul_(residual_scale)
        tensors[name] = t
    if successor:
        embed = tensors["model.embed_tokens.weight"]  # [Vocab, Dm]
        successor_of = successor_permutation(config.vocab_size, seed, device)  # [Vocab]
        tensors["lm_head.weight"] = torch.empty_like(embed).index_copy_(0, successor_of, embed)  # row pi(t) = e_t
    return tensors if dtype is None else {name: t.to(dtype) for name, t in tensors.items()}


def successor_permutation(vocab_size: int, seed: int, device: Any = "cpu") -> torch.Tensor:
    """``pi: [Vocab]`` int64, the seeded permutation of a ``successor=True`` random model (greedy next token of t)."""
    gen = torch.Generator(device="cpu").manual_seed(seed + 0x5EED)
    return torch.randperm(vocab_size, generator=gen).to(device)


def build_random(config: Any, seed: int = 0, **kwargs: Any) -> OptimizedModel:
    """A seeded random model generated directly on the target device (:func:`random_tensors`): for large benchmark
    models."""
    device = torch.device(kwargs.get("device") or ("cuda" if torch.cuda.is_available() else "cpu"))
    return OptimizedModel(config, random_tensors(config, seed, device), **kwargs)
