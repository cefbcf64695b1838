r"""The layers of the optimized model on one step: one loop over the layers for tree steps and decode steps alike.

A step holds ``B`` requests with ``N`` tokens each (a decode step: ``N = 1``, no tree, every cache advanced in place;
a tree step: every node of every request's draft tree, caches untouched until the commit). Its residual stream
``h: [B N, Dm]`` runs through every layer, ``h += mixer(norm(h)); h += mlp(norm(h))``:

- GDN layer: the ``w_in`` projection with the short conv in its epilogue or after it (a tree step: the tree-window
  conv, :func:`~lumotree.optimized.ops.conv_tree.tree_conv`; a decode step: one conv step), then the tree verify
  (:func:`~lumotree.optimized.ops.gdn_tree.gdn_tree_verify`, with the deferred commits of the fused sm_90 path where
  it is faster) or the one-token recurrence (:func:`~lumotree.optimized.ops.gdn_decode.gdn_decode`), the gated
  RMSNorm and ``w_out``;
- attention layer: ``w_qkv``, the fused q / k norm + RoPE + KV store
  (:func:`~lumotree.optimized.ops.tree_attention.prepare_qkv`) at each node's position, tree attention over the
  committed cache and the node's ancestors (a decode step: a one-node tree), ``w_o``;
- MLP: SwiGLU (dense) or the MoE block, routed (:func:`~lumotree.optimized.ops.moe.moe_routed`: each token through
  its top-k experts only, grouped by expert, float or block-FP8 experts; CUDA-graph safe).

Projections of steps with few token rows run on the split-K weight-streaming GEMV
(:func:`~lumotree.optimized.ops.gemv.small_batch_linear`, launched with PDL) where
:func:`~lumotree.optimized.ops.gemv.preferred`, else cuBLAS (block-FP8 weights,
:class:`~lumotree.optimized.ops.gemv.Fp8Weight`: the same GEMV, else :func:`~lumotree.optimized.ops.gemv.fp8_linear`;
the MoE block's FP8 experts in the routed kernels, dequantised per tile); where both projections around a residual
add run on the GEMV, the add and the RMSNorm live inside the two GEMVs (``fused_norms``), and in a tree step on the
GEMV the GDN layer's gated RMSNorm is split between the verify kernel and the ``w_out`` GEMV
(:class:`~lumotree.optimized.ops.gdn_tree.OutputGate`).

Tensor parallel (``parallel``, :class:`~lumotree.optimized.parallel.Parallel`): the weights are one rank's shard
(:func:`~lumotree.optimized.parallel.shard_weights`), so every layer runs on this rank's heads, columns and experts;
the row-parallel products (``w_out``, ``w_o``, ``w_down``, the MoE block) are all-reduced before they join the
residual stream (their adds then run in the add + RMSNorm kernel, not in a GEMV's epilogue), and :meth:`Layers.head`
combines the vocabulary-parallel head's shards.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import torch

from ..ops import tree_attention as ta
from ..ops.checks import interpreting
from ..ops.conv_tree import tree_conv
from ..ops.gdn_decode import conv_step, gated_rmsnorm, gdn_decode
from ..ops.gdn_tree import GATE_PIECE, LOG_DECAY_FLOOR, OutputGate, TreeFactors, gates, gdn_tree_verify
from ..ops.gemv import (ConvStep, Fp8Weight, ResidualRows, RowNorm, TreeConv, fp8_linear, gemv_config, preferred,
                        residual_linear, small_batch_linear)
from ..ops.moe import moe_routed
from ..ops.tree_meta import TreeMeta
from ..parallel.context import SINGLE, Parallel
from .kernels import add_rmsnorm, silu_mul
from .weights import AttentionLayerWeights, GDNLayerWeights, MLPWeights, ModelWeights

__all__ = ["Residual", "StepBuffers", "Layers", "ATTENTION_PDL_MAX_BATCH", "fla_available"]

#: tree attention is launched with PDL (each split's committed K / V prefetched into L2 before its wait) in steps of
#: at most this many requests, when the model's GEMVs are: faster at B = 1, slower at B = 16
ATTENTION_PDL_MAX_BATCH = 1


@dataclass
class Residual:
    """A step's residual stream ``h: [T, Dm]`` (updated in place) and what is pending on it: ``delta: [T, Dm]``, a
    layer output not yet added (the next add + RMSNorm kernel adds it), or ``rows``, left by a GEMV that added its
    product into ``h`` (:func:`~lumotree.optimized.ops.gemv.residual_linear`): the rows' sums of squares in pieces and
    ``h`` scaled by the next norm's weight ``norm_for``, from which the next GEMV computes ``RMSNorm(h) @ w^T``."""

    h: torch.Tensor
    delta: torch.Tensor | None = None
    rows: ResidualRows | None = None
    norm_for: torch.Tensor | None = None


@dataclass
class StepBuffers:
    """What one step's layers read besides the weights and caches: ``slots, lens: [B]`` int32 (committed lengths at
    the step); a tree step's ``meta`` (its tree metadata), ``parents: [B, N]``, ``num_nodes: [B]``, the GDN layers'
    projections ``proj_all: [G, B N, C + HV V + 2 HV]`` and tree conv outputs ``conv_all: [G, B, N, C]``, and where
    the step commits in place the stacked ``factors`` its verifies fill (else ``layer_factors`` collects each
    layer's, for deferred commits: ``fused``); ``chunk``: a prefill chunk through flash-linear-attention."""

    B: int
    N: int
    slots: torch.Tensor
    lens: torch.Tensor
    meta: TreeMeta | None = None
    parents: torch.Tensor | None = None
    num_nodes: torch.Tensor | None = None
    proj_all: torch.Tensor | None = None
    conv_all: torch.Tensor | None = None
    factors: TreeFactors | None = None
    layer_factors: list[TreeFactors] | None = None
    fused: bool = False
    max_depth: int | None = None
    chunk: bool = False

    @property
    def tree(self) -> bool:
        return self.meta is not None


class Layers:
    """The layer loop of the optimized model and the projections it is made of (module docstring). Holds the
    weights (:class:`~lumotree.optimized.model.weights.ModelWeights`), the caches
    (:class:`~lumotree.optimized.model.caches.Caches`) and the projection options."""

    config: Any
    weights: ModelWeights
    caches: Any
    dtype: torch.dtype
    device: torch.device
    eps: float
    gdn_precision: str
    small_batch_linear: bool
    fused_norms: bool
    pdl: bool
    capacity: int
    parallel: Parallel = SINGLE

    # ------------------------------------------------------------------------------------------------ projections
    def _on_gemv(self, x: torch.Tensor, n_out: int) -> bool:
        """Whether ``x [T, Din] @ w [n_out, Din]^T`` runs on the GEMV: enabled,
        :func:`~lumotree.optimized.ops.gemv.preferred` for the shape, on a GPU or under the Triton interpreter."""
        return (self.small_batch_linear and preferred(x.shape[0], n_out) and x.stride(-1) == 1
                and (x.is_cuda or interpreting()))

    def _gate_in_gemv(self, T: int, w_out: torch.Tensor) -> bool:
        """Whether a ``T``-row tree step splits each GDN layer's gated RMSNorm between the verify kernel and the
        ``w_out`` GEMV: the GEMV takes the fused norms in its ``tl.dot`` form."""
        return (self.fused_norms and self.small_batch_linear and not self.parallel.active
                and preferred(T, w_out.shape[0])
                and (w_out.is_cuda or interpreting()) and gemv_config(T, *w_out.shape, w_out.device).use_dot)

    def linear(self, x: torch.Tensor, w: torch.Tensor, out_dtype: torch.dtype | None = None, swiglu: bool = False,
               conv: ConvStep | TreeConv | None = None, out: torch.Tensor | None = None) -> torch.Tensor:
        """``x [T, Din] @ w [Dout, Din]^T``: the GEMV where :meth:`_on_gemv`, else cuBLAS (``out_dtype``: default
        x's). ``swiglu``: ``w`` is the dense MLP's interleaved gate | up weight and the result ``silu(gate) * up:
        [T, Dout / 2]``. ``conv``: the first ``C`` output columns through one decode step of the short conv
        (:class:`~lumotree.optimized.ops.gemv.ConvStep`, in place) or the tree conv of a tree step into
        ``conv.out`` (:class:`~lumotree.optimized.ops.gemv.TreeConv`), in the GEMV's epilogue or after cuBLAS.
        ``out``: a contiguous ``[T, Dout]`` buffer of x's dtype to write (no ``out_dtype``)."""
        if self._on_gemv(x, w.shape[0]) and not (isinstance(conv, TreeConv) and conv.out.dtype != x.dtype):
            return small_batch_linear(x, w, out_dtype=out_dtype, pdl=self.pdl, swiglu=swiglu, conv=conv,
                                      validate=False, out=out)
        if isinstance(w, Fp8Weight):  # block FP8: dequantised in the kernel (ops.gemv.fp8)
            y = fp8_linear(x, w, out_dtype=None if swiglu else out_dtype)  # [T, Dout]
            if swiglu:
                return silu_mul(y)  # [T, Dout / 2]
            y = y if out is None else out.copy_(y)
        elif swiglu:
            return silu_mul(torch.matmul(x, w.T))  # [T, Dout / 2]
        else:
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

    def normed(self, res: Residual, weight1p: torch.Tensor) -> torch.Tensor:
        """``RMSNorm(h + delta)`` of the residual stream (its pending add done in place first): ``[T, Dm]``."""
        x = add_rmsnorm(res.h, res.delta, weight1p, self.eps)  # [T, Dm]
        res.delta = res.rows = res.norm_for = None
        return x

    def norm_linear(self, res: Residual, weight1p: torch.Tensor, w: torch.Tensor,
                    conv: ConvStep | TreeConv | None = None, out: torch.Tensor | None = None, swiglu: bool = False
                    ) -> torch.Tensor:
        """``RMSNorm(h) @ w^T`` (``weight1p = 1 + w_norm``; ``conv``, ``out``, ``swiglu`` as in :meth:`linear`):
        from the rows the last add into ``h`` left scaled by this norm's weight when this projection runs on the GEMV
        too (the norm's factor applied to the product), else the add + RMSNorm kernel and then :meth:`linear`."""
        rows = res.rows
        if rows is not None and res.norm_for is weight1p and self._on_gemv(rows.scaled, w.shape[0]) and not (
                isinstance(conv, TreeConv) and conv.out.dtype != rows.scaled.dtype):
            return small_batch_linear(rows.scaled, w, pdl=self.pdl, norm=RowNorm(rows.parts, self.eps), conv=conv,
                                      swiglu=swiglu, validate=False, out=out)
        return self.linear(self.normed(res, weight1p), w, conv=conv, out=out, swiglu=swiglu)

    def add_linear(self, res: Residual, x: torch.Tensor, w: torch.Tensor, next_norm: torch.Tensor | None,
                   norm: RowNorm | None = None) -> None:
        """``h += x @ w^T``: in the GEMV's epilogue, which also leaves what the next norm (weight ``next_norm``,
        ``1 + w``) needs (:func:`~lumotree.optimized.ops.gemv.residual_linear`; ``fused_norms``), or as a pending
        ``delta`` that the next add + RMSNorm kernel adds. ``norm``: the product scaled first (the GEMV path only:
        :meth:`_gate_in_gemv` chose it)."""
        assert res.delta is None, "a norm settles every pending add before the next projection"
        if self.parallel.active:  # row parallel: the ranks' partial products summed first
            assert norm is None, "a scaled product needs the GEMV path"
            res.delta, res.rows, res.norm_for = self.parallel.all_reduce(self.linear(x, w)), None, None
        elif self.fused_norms and next_norm is not None and self._on_gemv(x, w.shape[0]):
            res.rows = residual_linear(x, w, res.h, scale=next_norm, norm=norm, pdl=self.pdl)
            res.norm_for = next_norm
        else:
            assert norm is None, "a scaled product needs the GEMV path"
            res.delta, res.rows, res.norm_for = self.linear(x, w), None, None

    def mlp(self, m: MLPWeights, res: Residual, next_norm: torch.Tensor | None) -> None:
        """``h += MLP(RMSNorm(h))``: SwiGLU (on the GEMVs, the norm and the add inside them, ``next_norm`` the norm
        after it, None before the final one), or the routed MoE block
        (:func:`~lumotree.optimized.ops.moe.moe_routed`)."""
        if m.router is None:
            act = self.norm_linear(res, m.post_norm, m.w_gate_up, swiglu=True)  # [T, I] silu(gate) * up
            self.add_linear(res, act, m.w_down, next_norm)
            return
        x = self.normed(res, m.post_norm)  # [T, Dm]
        res.delta = moe_routed(x, m.router, m.w_gate_up, m.w_down, top_k=self.config.num_experts_per_tok,
                               norm_topk_prob=bool(self.config.norm_topk_prob), shared_gate_up=m.shared_gate_up,
                               shared_down=m.shared_down, shared_gate=m.shared_gate, validate=False,
                               first_expert=m.first_expert)  # [T, Dm] (this rank's experts: summed over ranks)
        self.parallel.all_reduce(res.delta)

    def head(self, x: torch.Tensor, argmax: bool = False) -> torch.Tensor:
        """The LM head on ``x: [T, Dm]``: fp32 logits ``[T, V]``, or (``argmax``) the greedy token ids ``[T]``
        int64 (ties: the lowest id); over the vocabulary shards of every rank when tensor parallel."""
        local = self.linear(x, self.weights.lm_head, torch.float32)  # [T, V_r]
        vocab = int(self.config.vocab_size)
        return self.parallel.argmax(local, vocab) if argmax else self.parallel.gather_vocab(local, vocab)

    # ------------------------------------------------------------------------------------------------ the loop
    def run_layers(self, res: Residual, step: StepBuffers) -> None:
        """Every layer on the step's residual stream (module docstring), in place."""
        layers, mlps = self.weights.layers, self.weights.mlps
        gi = ai = 0
        for i, (layer, m) in enumerate(zip(layers, mlps)):
            if isinstance(layer, GDNLayerWeights):
                if step.tree:
                    self._gdn_tree(layer, gi, res, m.post_norm, step)
                else:
                    self._gdn_decode(layer, gi, res, m.post_norm, step)
                gi += 1
            else:
                self._attention(layer, ai, res, m.post_norm, step)
                ai += 1
            self.mlp(m, res, layers[i + 1].in_norm if i + 1 < len(layers) else None)

    def _gdn_tree(self, layer: GDNLayerWeights, gi: int, res: Residual, post_norm: torch.Tensor,
                  step: StepBuffers) -> None:
        """A GDN layer on a tree step (or a prefill chunk): projection + tree conv, verify, gated norm, ``w_out``."""
        H, HV, K, V, _ = self.weights.gdn_dims
        B, N, T, C = step.B, step.N, step.B * step.N, 2 * H * K + HV * V
        conv = step.conv_all[gi]  # [B, N, C] the tree conv of the inputs (q | k | v), written by the projection
        proj = self.norm_linear(res, layer.in_norm, layer.w_in, out=step.proj_all[gi], conv=TreeConv(
            layer.conv_w, self.caches.conv_pools[gi], step.slots, step.parents, step.num_nodes, conv)).view(B, N, -1)
        z = proj[..., C : C + HV * V].unflatten(-1, (HV, V))  # [B, N, HV, V]; proj: [B, N, C + HV V + 2 HV]
        b_gate = proj[..., C + HV * V : C + HV * V + HV]  # [B, N, HV]
        a_gate = proj[..., C + HV * V + HV :]  # [B, N, HV]
        q = conv[..., : H * K].unflatten(-1, (H, K))  # [B, N, H, K]
        k = conv[..., H * K : 2 * H * K].unflatten(-1, (H, K))  # [B, N, H, K]
        v = conv[..., 2 * H * K :].unflatten(-1, (HV, V))  # [B, N, HV, V]
        gate = None
        if step.chunk:  # prefill through flash-linear-attention
            o = self._fla_chunk(q, k, v, a_gate, b_gate, layer, gi, step.slots)  # advances the state pool
        else:
            common = dict(parents=step.parents, initial_state=self.caches.state_pools[gi], state_indices=step.slots,
                          num_nodes=step.num_nodes, use_qk_l2norm_in_kernel=True, A_log=layer.A_log,
                          dt_bias=layer.dt_bias, allow_neg_eigval=self.config.allow_neg_eigval,
                          input_precision=self.gdn_precision, meta=step.meta, validate=False)
            if step.fused:  # deferred commits: the fused verify applies this slot's pending record and keeps it
                o, factors = gdn_tree_verify(q, k, v, a_gate, b_gate, pending=self.caches.pending[gi],
                                             max_depth=step.max_depth, **common)
                step.layer_factors.append(factors)
            else:
                o = torch.empty((B, N, HV, V), dtype=self.dtype, device=self.device)  # [B, N, HV, V]
                if self._gate_in_gemv(T, layer.w_out):  # o: w o silu(z); the per-head norm factor in w_out
                    gate = OutputGate(z, layer.norm_w, torch.empty(
                        (B, N, HV, V // GATE_PIECE), dtype=torch.float32, device=self.device))  # parts
                f = step.factors
                gdn_tree_verify(q, k, v, a_gate, b_gate, output_gate=gate,
                                out=(o, f.delta[gi], f.log_gamma[gi], f.k_rnorm[gi]), **common)
        if gate is not None:
            self.add_linear(res, o.view(T, HV * V), layer.w_out, post_norm,
                            RowNorm(gate.parts.view(T, HV, -1), self.eps))  # h += [T, Dm]
        else:
            gated = gated_rmsnorm(o.reshape(T, HV, V), z.reshape(T, HV, V), layer.norm_w, eps=self.eps)  # z's dtype
            self.add_linear(res, gated.view(T, HV * V), layer.w_out, post_norm)  # h += [T, Dm]

    def _gdn_decode(self, layer: GDNLayerWeights, gi: int, res: Residual, post_norm: torch.Tensor,
                    step: StepBuffers) -> None:
        """A GDN layer on a decode step: projection + conv step, the recurrence with the gated norm fused,
        ``w_out`` (the state read and written once)."""
        H, HV, K, V, _ = self.weights.gdn_dims
        B, C = step.B, 2 * H * K + HV * V
        proj = self.norm_linear(res, layer.in_norm, layer.w_in, conv=ConvStep(
            layer.conv_w, self.caches.conv_pools[gi], step.slots))  # [B, C + HV V + 2 HV], conv'd q | k | v
        conv = proj[:, :C]  # [B, C]
        gated = gdn_decode(
            conv[:, : H * K].unflatten(-1, (H, K)), conv[:, H * K : 2 * H * K].unflatten(-1, (H, K)),
            conv[:, 2 * H * K :].unflatten(-1, (HV, V)), proj[:, C + HV * V + HV :],
            proj[:, C + HV * V : C + HV * V + HV], layer.A_log, layer.dt_bias, self.caches.state_pools[gi],
            step.slots, allow_neg_eigval=self.config.allow_neg_eigval,
            z=proj[:, C : C + HV * V].unflatten(-1, (HV, V)), norm_weight=layer.norm_w, eps=self.eps,
            validate=False)  # [B, HV, V] gated-normed
        self.add_linear(res, gated.view(B, HV * V), layer.w_out, post_norm)  # h += [B, Dm]

    def _attention(self, layer: AttentionLayerWeights, ai: int, res: Residual, post_norm: torch.Tensor,
                   step: StepBuffers) -> None:
        """An attention layer: ``w_qkv``, q / k norm + RoPE + KV store at ``lens + offset``, tree attention (a decode
        step: one-node trees at offset 0, its K / V stored in place), ``w_o``."""
        HQ, HKV, D = self.weights.attn_dims
        B, N = step.B, step.N
        proj = self.norm_linear(res, layer.in_norm, layer.w_qkv).view(B, N, -1)  # [B, N, 2 HQ D + 2 HKV D]
        qg = proj[..., : 2 * HQ * D].unflatten(-1, (HQ, 2 * D))  # [B, N, HQ, 2D] query_h | gate_h
        kk = proj[..., 2 * HQ * D : 2 * HQ * D + HKV * D].unflatten(-1, (HKV, D))  # [B, N, HKV, D]
        vv = proj[..., 2 * HQ * D + HKV * D :].unflatten(-1, (HKV, D))  # [B, N, HKV, D]
        offsets, words = (step.meta.depth, step.meta.words) if step.tree else (
            self.caches.zero_offsets[:B], self.caches.root_words[:B])  # [B, N], [B, N, W]
        k_pool, v_pool = self.caches.k_pools[ai], self.caches.v_pools[ai]
        q_rot = ta.prepare_qkv(qg[..., :D], kk, vv, layer.q_norm, layer.k_norm, self.weights.inv_freq, offsets,
                               k_pool, v_pool, step.slots, step.lens, eps=self.eps,
                               validate=False)  # [B, N, HQ, D]; K / V stored at lens + offset
        splits = ta.default_launch(B, N, HQ, HKV, D, self.capacity, self.device, self.dtype)[4]  # graph safe
        att = ta.tree_attention(q_rot, k_pool, v_pool, step.slots, step.lens, words, gate=qg[..., D:],
                                num_splits=splits, validate=False,
                                pdl=self.pdl and B <= ATTENTION_PDL_MAX_BATCH)  # [B, N, HQ, D]
        self.add_linear(res, att.reshape(B * N, HQ * D), layer.w_o, post_norm)  # h += [T, Dm]

    def _fla_chunk(self, q, k, v, a_gate, b_gate, layer: GDNLayerWeights, gi: int, slots) -> torch.Tensor:
        """Prefill chunk through flash-linear-attention's chunked GDN (one request); writes the final state."""
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule

        g, beta = gates(a_gate, b_gate, layer.A_log, layer.dt_bias, self.config.allow_neg_eigval)  # [1, T, HV] each
        g = g.clamp_min(LOG_DECAY_FLOOR.value)  # fla's in-chunk cumulative sums: finite, as the tree kernels hold them
        H, HV, K, V, _ = self.weights.gdn_dims
        group = HV // H
        qe = q.repeat_interleave(group, dim=2) if group > 1 else q  # fla expects q/k per value head here
        ke = k.repeat_interleave(group, dim=2) if group > 1 else k
        pool = self.caches.state_pools[gi]
        state = pool.index_select(0, slots.long())  # [1, HV, K, V]
        o, final = chunk_gated_delta_rule(qe.contiguous(), ke.contiguous(), v.contiguous(), g, beta.to(q.dtype),
                                          scale=K**-0.5, initial_state=state, output_final_state=True,
                                          use_qk_l2norm_in_kernel=True)
        pool.index_copy_(0, slots.long(), final.float())
        return o


def fla_available() -> bool:
    """Whether flash-linear-attention's chunked GDN can run prefill chunks (a CUDA device, importable, no Triton
    interpreter)."""
    if not torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET", "0") == "1":
        return False
    try:
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule  # noqa: F401
    except Exception:
        return False
    return True
