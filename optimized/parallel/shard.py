r"""The sharding plan: the part of a model's weights (:class:`~lumotree.optimized.model.weights.ModelWeights`) that
rank ``r`` of ``P`` holds. Contiguous blocks of heads, columns, experts and vocabulary rows:

- GDN layer: key heads ``[r H / P, ...)`` and the value heads that read them (``HV / P``, GVA groups stay whole):
  their rows of ``w_in`` in each part ``q | k | v | z | b | a``, their conv channels, ``A_log``, ``dt_bias`` and
  columns of ``w_out`` (row parallel: the outputs are summed over ranks). The tree verify, the factors and the commit
  are per value head, so each rank runs them on its heads (and holds only their states);
- attention layer: query heads ``[r HQ / P, ...)`` (query | gate rows, ``o_proj`` columns); KV heads split the same
  way when ``P`` divides ``HKV``, else (``HKV`` divides ``P``) each rank holds the one KV head its query heads read;
- dense MLP: intermediate columns ``[r I / P, ...)`` of the interleaved gate | up rows and of ``w_down``;
- MoE: experts ``[r E / P, ...)`` (the router stays whole: every rank routes every token and runs the pairs of its
  experts), the shared expert's intermediate columns split as a dense MLP's, its sigmoid gate whole;
- LM head: vocabulary rows :func:`~lumotree.optimized.parallel.context.vocab_range`; the embedding, the norms and
  the MTP head's ``fc`` stay whole.

A size that does not split raises one line naming ``tensor_parallel``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

import torch

from ..model.weights import AttentionLayerWeights, GDNLayerWeights, MLPWeights, ModelWeights, MTPWeights
from ..ops.gemv import FP8_BLOCK_K, Fp8Weight
from .context import vocab_range

__all__ = ["shard_weights", "shard_head", "rank_weights", "layer_part", "check_shardable"]


def _split(name: str, size: int, world: int) -> int:
    if size % world:
        raise ValueError(f"tensor_parallel = {world} does not divide {name} = {size}")
    return size // world


def _kv_heads(hq: int, hkv: int, world: int) -> tuple[int, int]:
    """``(KV heads a rank holds, 1 if each is held by several ranks else 0)``: ``hkv / world`` when ``world``
    divides ``hkv``, else (``hkv`` divides ``world``) the one KV head its query heads read."""
    if hkv % world == 0:
        return hkv // world, 0
    if world % hkv == 0:
        return 1, 1
    raise ValueError(f"tensor_parallel = {world} neither divides nor is a multiple of num_key_value_heads = {hkv}")


def check_shardable(config: Any, world: int) -> None:
    """Raise (one line naming ``tensor_parallel``) unless every sharded size of ``config`` splits over ``world``."""
    if world < 1:
        raise ValueError(f"tensor_parallel = {world} must be at least 1")
    if world == 1:
        return
    if "linear_attention" in config.layer_types:
        gs = config.gdn_spec()
        _split("linear_num_key_heads", gs.num_k_heads, world)
        _split("linear_num_value_heads", gs.num_v_heads, world)
    if "full_attention" in config.layer_types or config.mtp_num_hidden_layers:
        spec = config.attention_spec()
        _split("num_attention_heads", spec.num_heads, world)
        _kv_heads(spec.num_heads, spec.num_kv_heads, world)
    moe = [config.is_moe_layer(i) for i in range(config.num_hidden_layers)]
    if not all(moe):
        _split("intermediate_size", config.intermediate_size, world)
    if any(moe):
        _split("num_experts", config.num_experts, world)
        if config.shared_expert_intermediate_size:
            _split("shared_expert_intermediate_size", config.shared_expert_intermediate_size, world)


def _rows(w: Any, index: torch.Tensor) -> Any:
    """Rows ``index`` of a weight (increasing across an FP8 weight's float tail: its FP8 rows first)."""
    if not isinstance(w, Fp8Weight):
        return w[index.to(w.device)].contiguous()
    index = index.to(w.device)
    n = w.weight.shape[-2]
    part = w.head.take_rows(index[index < n])
    tail = None if w.tail is None else w.tail[index[index >= n] - n].contiguous()
    return part if tail is None or not tail.shape[0] else part._replace(tail=tail)


def _cols(w: Any, first: int, count: int) -> Any:
    """Columns ``[first, first + count)`` of a weight; block FP8: whole scale blocks only."""
    if not isinstance(w, Fp8Weight):
        return w[..., first : first + count].contiguous()
    K = w.weight.shape[-1]
    if first % FP8_BLOCK_K or (count % FP8_BLOCK_K and first + count != K):
        raise ValueError(f"tensor_parallel: columns [{first}, {first + count}) of a block-FP8 weight cut its "
                         f"{FP8_BLOCK_K}-column scale blocks")
    blocks = slice(first // FP8_BLOCK_K, -(-(first + count) // FP8_BLOCK_K))
    tail = None if w.tail is None else w.tail[..., first : first + count].contiguous()
    return Fp8Weight(w.weight[..., first : first + count].contiguous(), w.scale[..., blocks].contiguous(),
                     w.scale_rows, tail)


def _experts(w: Any, first: int, count: int) -> Any:
    """Experts ``[first, first + count)`` of stacked ``[E, N, K]`` experts."""
    if isinstance(w, Fp8Weight):
        return Fp8Weight(w.weight[first : first + count].contiguous(), w.scale[first : first + count].contiguous(),
                         w.scale_rows)
    return w[first : first + count].contiguous()


def _block(first: int, count: int, width: int = 1, offset: int = 0) -> torch.Tensor:
    """Row indices of items ``[first, first + count)`` of ``width`` rows each, after ``offset`` rows."""
    return offset + torch.arange(first * width, (first + count) * width)


def _gdn(w: GDNLayerWeights, dims: tuple, rank: int, world: int) -> GDNLayerWeights:
    H, HV, K, V, _ = dims
    h, hv = H // world, HV // world
    parts = [(H, K, h), (H, K, h), (HV, V, hv), (HV, V, hv), (HV, 1, hv), (HV, 1, hv)]  # q k v z b a
    index, offset = [], 0
    for heads, width, local in parts:
        index.append(_block(rank * local, local, width, offset))
        offset += heads * width
    conv_rows = torch.cat(index[:3])  # q | k | v channels
    return GDNLayerWeights(w.in_norm, _rows(w.w_in, torch.cat(index)), _rows(w.conv_w, conv_rows),
                           w.A_log[rank * hv : (rank + 1) * hv].contiguous(),
                           w.dt_bias[rank * hv : (rank + 1) * hv].contiguous(), w.norm_w,
                           _cols(w.w_out, rank * hv * V, hv * V))


def _attention(w: AttentionLayerWeights, dims: tuple, rank: int, world: int) -> AttentionLayerWeights:
    HQ, HKV, D = dims
    hq = HQ // world
    hkv, _ = _kv_heads(HQ, HKV, world)
    kv0 = rank * hkv if HKV % world == 0 else rank * hq // (HQ // HKV)  # the KV head this rank's queries read
    q = _block(rank * hq, hq, 2 * D)
    k = _block(kv0, hkv, D, 2 * HQ * D)
    v = _block(kv0, hkv, D, 2 * HQ * D + HKV * D)
    return AttentionLayerWeights(w.in_norm, _rows(w.w_qkv, torch.cat([q, k, v])), w.q_norm, w.k_norm,
                                 _cols(w.w_o, rank * hq * D, hq * D))


def _mlp(m: MLPWeights, rank: int, world: int) -> MLPWeights:
    if m.router is None:  # interleaved gate | up rows: column j is rows 2j, 2j + 1
        inner = m.w_down.shape[1] // world
        return replace(m, w_gate_up=_rows(m.w_gate_up, _block(rank * inner, inner, 2)),
                       w_down=_cols(m.w_down, rank * inner, inner))
    E = m.router.shape[0] // world
    shared = {}
    if m.shared_down is not None:
        Is = m.shared_down.shape[1] // world
        rows = torch.cat([_block(rank * Is, Is), _block(rank * Is, Is, 1, Is * world)])  # gate rows, up rows
        shared = dict(shared_gate_up=_rows(m.shared_gate_up, rows), shared_down=_cols(m.shared_down, rank * Is, Is))
    return replace(m, w_gate_up=_experts(m.w_gate_up, rank * E, E), w_down=_experts(m.w_down, rank * E, E),
                   first_expert=rank * E, **shared)


def layer_part(config: Any, rank: int, world: int) -> Callable[[Any], Any]:
    """Rank ``rank``'s part of one layer's or one MLP's weights (GDN, attention, dense or MoE), as a function: the
    ``keep`` of :func:`~lumotree.optimized.model.weights.build_weights`, so that a checkpoint streams to the device
    one whole layer at a time (:func:`~lumotree.optimized.model.loader.load_checkpoint` with ``part``); the head and
    the sizes follow with :func:`shard_weights` ``(layers_done=True)``."""
    check_shardable(config, world)
    gdn = attn = None
    if "linear_attention" in config.layer_types:
        gs = config.gdn_spec()
        gdn = (gs.num_k_heads, gs.num_v_heads, gs.head_k_dim, gs.head_v_dim, gs.conv_kernel)
    if "full_attention" in config.layer_types or config.mtp_num_hidden_layers:
        spec = config.attention_spec()
        attn = (spec.num_heads, spec.num_kv_heads, spec.head_dim)

    def part(w: Any) -> Any:
        if isinstance(w, GDNLayerWeights):
            return _gdn(w, gdn, rank, world)
        if isinstance(w, AttentionLayerWeights):
            return _attention(w, attn, rank, world)
        return _mlp(w, rank, world)

    return part


def shard_weights(weights: ModelWeights, config: Any, rank: int, world: int, layers_done: bool = False
                  ) -> ModelWeights:
    """Rank ``rank``'s part of ``weights`` (module docstring); new tensors on the weights' device, the rest shared.
    ``world`` 1: ``weights`` itself. ``layers_done``: the layers, MLPs and MTP head are this rank's parts already
    (:func:`layer_part`); the LM head and the sizes are cut here."""
    check_shardable(config, world)
    if weights.shard != (0, 1):
        raise ValueError(f"weights are already the part {weights.shard} (rank, tensor_parallel) of a model")
    if world == 1:
        return weights
    if not 0 <= rank < world:
        raise ValueError(f"rank = {rank} is outside [0, tensor_parallel = {world})")
    gdn, attn = weights.gdn_dims, weights.attn_dims
    layers, mlps = weights.layers, weights.mlps
    if not layers_done:
        layers = [_gdn(w, gdn, rank, world) if isinstance(w, GDNLayerWeights) else _attention(w, attn, rank, world)
                  for w in weights.layers]
        mlps = [_mlp(m, rank, world) for m in weights.mlps]
    first, end = vocab_range(weights.lm_head.shape[0], rank, world)
    lm_head = _rows(weights.lm_head, torch.arange(first, end))
    local_gdn = None if gdn is None else (gdn[0] // world, gdn[1] // world, *gdn[2:])
    local_attn = None if attn is None else (attn[0] // world, _kv_heads(*attn[:2], world)[0], attn[2])
    mtp = weights.mtp if layers_done or weights.mtp is None else shard_head(weights.mtp, attn, rank, world)
    return ModelWeights(weights.embed, weights.final_norm, lm_head, layers, mlps, local_gdn, local_attn,
                        weights.inv_freq, mtp, shard=(rank, world))


def shard_head(head: MTPWeights, attn_dims: tuple[int, int, int], rank: int, world: int) -> MTPWeights:
    """Rank ``rank``'s part of an MTP or EAGLE head (its attention layers and MLPs as the model's; ``fc`` and the
    norms whole); ``attn_dims``: the whole model's ``(HQ, HKV, D)``."""
    if world == 1:
        return head
    for m in head.mlps:
        if m.router is None:
            _split("the head's intermediate_size", m.w_down.shape[1], world)
    return MTPWeights(head.fc, head.embed_norm, head.hidden_norm,
                      [_attention(w, attn_dims, rank, world) for w in head.layers],
                      [_mlp(m, rank, world) for m in head.mlps], head.final_norm)


def rank_weights(weights: ModelWeights, config: Any, parallel: Any) -> ModelWeights:
    """The weights a model on rank ``parallel.rank`` of ``parallel.world`` runs: whole weights sharded, a part
    already made for this rank (a draft sharing a sharded target's tensors) as it is; another part is refused."""
    if weights.shard == (0, 1) and parallel.world > 1:
        return shard_weights(weights, config, parallel.rank, parallel.world)
    if weights.shard != (parallel.rank, parallel.world):
        raise ValueError(f"weights are the part {weights.shard} (rank, tensor_parallel) of a model; this model is "
                         f"rank {parallel.rank} of tensor_parallel = {parallel.world}")
    return weights
