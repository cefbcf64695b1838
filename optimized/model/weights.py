"""The optimized model's weights: checkpoint tensors validated, fused and reordered once for the kernels (from any
supported checkpoint layout, :mod:`lumotree.reference.layouts`), and seeded random weights drawn on the device for
benchmark models."""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Optional

import numpy as np
import torch

from ..ops.gemv import Fp8Weight, fp8_cat, interleave_gate_up
from ..ops.tree_attention import rope_inv_freq

__all__ = ["finite",
           "GDNLayerWeights", "AttentionLayerWeights", "MLPWeights", "MTPWeights", "ModelWeights", "load_weights",
           "build_weights", "check_kernel_limits", "select_layers", "gdn_row_orders", "random_tensors",
           "random_weights", "successor_permutation"]


@dataclass
class GDNLayerWeights:
    in_norm: torch.Tensor  # [Dm] fp32, 1 + w
    w_in: torch.Tensor  # [C + HV V + 2 HV, Dm]: rows q | k | v | z | b | a (head-major each)
    conv_w: torch.Tensor  # [C, W]
    A_log: torch.Tensor  # [HV] fp32
    dt_bias: torch.Tensor  # [HV] fp32
    norm_w: torch.Tensor  # [V] fp32 (plain weight of the gated RMSNorm)
    w_out: torch.Tensor  # [Dm, HV V]


@dataclass
class AttentionLayerWeights:
    in_norm: torch.Tensor  # [Dm] fp32, 1 + w
    w_qkv: torch.Tensor  # [2 HQ D + 2 HKV D, Dm]: HF q_proj rows (query_h | gate_h per head), k_proj, v_proj
    q_norm: torch.Tensor  # [D] fp32 zero-centred weight w
    k_norm: torch.Tensor  # [D] fp32
    w_o: torch.Tensor  # [Dm, HQ D]


@dataclass
class MLPWeights:
    post_norm: torch.Tensor  # [Dm] fp32, 1 + w
    w_gate_up: torch.Tensor  # dense: [2 I, Dm] gate / up rows interleaved (gemv.interleave_gate_up); MoE: [E, 2 I, Dm]
    w_down: torch.Tensor  # dense: [Dm, I]; MoE: [E, Dm, I]
    router: torch.Tensor | None = None  # MoE: [E, Dm]
    shared_gate_up: torch.Tensor | None = None  # [2 Is, Dm]
    shared_down: torch.Tensor | None = None  # [Dm, Is]
    shared_gate: torch.Tensor | None = None  # [1, Dm]
    first_expert: int | None = None  # MoE on a tensor-parallel rank: the global id of w_gate_up[0] (a block)


@dataclass
class MTPWeights:
    """The multi-token-prediction head (checkpoint ``mtp.*``) in the kernels' layouts, on the model's device, kept
    for the MTP drafter: ``fc: [Dm, 2 Dm]`` on ``concat(norm(embedding), norm(hidden))``, its attention layers and
    MLPs, and the norms (fp32, ``1 + w``)."""

    fc: torch.Tensor  # [Dm, 2 Dm]
    embed_norm: torch.Tensor  # [Dm] fp32, 1 + w (pre_fc_norm_embedding)
    hidden_norm: torch.Tensor  # [Dm] fp32, 1 + w (pre_fc_norm_hidden)
    layers: list[AttentionLayerWeights]
    mlps: list[MLPWeights]
    final_norm: torch.Tensor  # [Dm] fp32, 1 + w


@dataclass
class ModelWeights:
    """Every weight of the model on its device, in the kernels' layouts."""

    embed: torch.Tensor  # [Vocab, Dm]
    final_norm: torch.Tensor  # [Dm] fp32, 1 + w
    lm_head: torch.Tensor  # [Vocab, Dm]
    layers: list[GDNLayerWeights | AttentionLayerWeights]
    mlps: list[MLPWeights]
    gdn_dims: tuple[int, int, int, int, int] | None  # (H, HV, K, V, conv width) of the GDN layers
    attn_dims: tuple[int, int, int] | None  # (HQ, HKV, D) of the attention layers
    inv_freq: torch.Tensor | None  # [rotary_dim / 2] fp32 RoPE inverse frequencies
    mtp: MTPWeights | None = None
    shard: tuple[int, int] = (0, 1)  # (rank, tensor_parallel) of the part held (:mod:`lumotree.optimized.parallel`)


#: ``fetch(stored name, dtype or None) -> tensor``: one stored tensor on the device, finite, in ``dtype`` (None: the
#: model's)
Fetch = Callable[[str, Optional[torch.dtype]], torch.Tensor]


def finite(t: torch.Tensor) -> bool:
    """Whether every value of ``t`` is finite (float8_e4m3fn: no NaN code, ``S 1111 111``; it has no infinities).
    First by the sum (one reduction, no temporary: a NaN or an infinity makes it non-finite), and only when the sum
    is not finite (a bad value, or finite values whose sum overflows) value by value."""
    if t.dtype == torch.float8_e4m3fn:
        return not bool(((t.view(torch.uint8) & 0x7F) == 0x7F).any())
    return bool(torch.isfinite(t.sum())) or bool(torch.isfinite(t).all())


def check_kernel_limits(config: Any) -> None:
    """The sizes the kernels take (checked before any weight is read): GDN head dims a power of two in [16, 256],
    at least one rotated RoPE pair; each error names the config key."""
    if "linear_attention" in config.layer_types:
        gs = config.gdn_spec()
        for key, value in (("linear_key_head_dim", gs.head_k_dim), ("linear_value_head_dim", gs.head_v_dim)):
            if not 16 <= value <= 256 or value & (value - 1):
                raise ValueError(f"config key {key!r} = {value}: the GDN kernels need a power of two in [16, 256] "
                                 "(the reference backend takes any size)")
    if ("full_attention" in config.layer_types or config.mtp_num_hidden_layers) and not config.attention_spec(
            ).rotary_dim:
        raise ValueError("config key 'partial_rotary_factor' = 0 (no RoPE): the optimized attention kernels rotate "
                         "at least one pair (the reference backend takes it)")


def load_weights(config: Any, tensors: Mapping[str, Any], device: torch.device, dtype: torch.dtype) -> ModelWeights:
    """Validate canonical HF-named ``tensors`` (:mod:`lumotree.reference.weights`: names, shapes, finiteness; every
    missing or unexpected tensor named) against ``config`` and build the kernels' layouts on ``device`` (matrices in
    ``dtype``, norms and gates fp32). Checkpoint directories stream through
    :func:`~lumotree.optimized.model.loader.load_checkpoint` instead.

    A stored ``lm_head.weight`` is the head even with ``tie_word_embeddings`` (as transformers loads it); without one
    a tied config uses the embedding."""
    from lumotree.reference.layouts import CheckpointLayout

    layout = CheckpointLayout()  # canonical tensors are a qwen3_next checkpoint's under model.
    layout.check(config, {name: tuple(t.shape) for name, t in tensors.items()})
    check_kernel_limits(config)

    def fetch(name: str, as_dtype: torch.dtype | None) -> torch.Tensor:
        t = tensors[name]
        t = torch.from_numpy(np.ascontiguousarray(t)) if isinstance(t, np.ndarray) else t
        if not finite(t):
            raise ValueError(f"tensor {name!r} contains NaN or inf")
        return t.to(device=device, dtype=as_dtype or dtype).contiguous()

    return build_weights(config, layout, fetch, set(tensors), device, dtype)


def build_weights(config: Any, layout: Any, fetch: Fetch, stored: Collection[str], device: torch.device,
                  dtype: torch.dtype, keep: Callable[[Any], Any] | None = None) -> ModelWeights:
    """The kernels' layouts from a checkpoint of ``layout`` (:class:`lumotree.reference.layouts.CheckpointLayout`,
    already checked), one layer after the other: each stored tensor is fetched once and combined on the device
    (GDN ``w_in`` rows ``q | k | v | z | b | a``: Qwen3.5's split projections concatenated, Qwen3-Next's packed ones
    permuted; experts stacked ``[E, 2 I, Dm]`` / ``[E, Dm, I]`` in place, or taken fused).

    Block-FP8 weights (``layout.fp8``) stay in float8 with their scales
    (:class:`~lumotree.optimized.ops.gemv.Fp8Weight`); fused from FP8 parts they stay FP8 (each row keeps its scales,
    nothing is requantised); a fused weight whose parts are stored some in FP8, some in float is dequantised to the
    model's dtype, except float parts after the FP8 ones (a release's ``in_proj_ba`` / ``in_proj_b`` and ``in_proj_a``
    next to an FP8 ``in_proj_qkvz``), which stay a float tail of the FP8 weight.

    ``keep``: applied to each layer's and each MLP's weights once built, and only its result kept (a tensor-parallel
    rank's part, :func:`~lumotree.optimized.parallel.layer_part`: a whole layer is on the device one at a time)."""
    f32 = torch.float32
    keep = keep or (lambda w: w)

    def get(name: str, as_dtype: torch.dtype | None = None) -> torch.Tensor | Fp8Weight:
        stored_name = layout.stored_name(name)
        if stored_name in layout.fp8:
            return Fp8Weight.from_blocks(fetch(stored_name, torch.float8_e4m3fn),
                                         fetch(stored_name + "_scale_inv", f32))
        return fetch(stored_name, as_dtype)

    def cat(parts: list) -> torch.Tensor | Fp8Weight:
        quantised = [isinstance(p, Fp8Weight) for p in parts]
        lead = quantised.index(False) if False in quantised else len(parts)
        if lead == len(parts):
            return fp8_cat(parts)
        if lead and not any(quantised[lead:]):  # FP8 rows, then float ones: a float tail
            return fp8_cat(parts[:lead])._replace(tail=torch.cat(parts[lead:]).contiguous()).checked()
        return torch.cat([p.dequantize(dtype) if isinstance(p, Fp8Weight) else p for p in parts])

    def pair(gate, up) -> torch.Tensor | Fp8Weight:  # interleave_gate_up of mixed parts: float
        if isinstance(gate, Fp8Weight) != isinstance(up, Fp8Weight):
            gate, up = (p.dequantize(dtype) if isinstance(p, Fp8Weight) else p for p in (gate, up))
        return interleave_gate_up(gate, up)

    def rows(w, index: torch.Tensor):
        return w.take_rows(index.to(w.device)) if isinstance(w, Fp8Weight) else w[index]

    def contiguous(w):
        return w if isinstance(w, Fp8Weight) else w.contiguous()

    embed = get("model.embed_tokens.weight")  # [Vocab, Dm]
    lm_head = get("lm_head.weight") if "lm_head.weight" in stored else embed  # [Vocab, Dm]
    gdn_dims = attn_dims = inv_freq = None
    if "linear_attention" in config.layer_types:
        gs = config.gdn_spec()
        gdn_dims = (gs.num_k_heads, gs.num_v_heads, gs.head_k_dim, gs.head_v_dim, gs.conv_kernel)
        qkvz_perm, ba_perm = gdn_row_orders(gs.num_k_heads, gs.num_v_heads, gs.head_k_dim, gs.head_v_dim)
    if "full_attention" in config.layer_types or config.mtp_num_hidden_layers:
        spec = config.attention_spec()
        attn_dims = (spec.num_heads, spec.num_kv_heads, spec.head_dim)
        inv_freq = rope_inv_freq(spec.rotary_dim, spec.rope_theta, device)  # [rd / 2]

    def attention(s: str, in_norm: torch.Tensor) -> AttentionLayerWeights:
        w_qkv = cat([get(f"{s}.q_proj.weight"), get(f"{s}.k_proj.weight"), get(f"{s}.v_proj.weight")])
        return AttentionLayerWeights(in_norm, w_qkv, get(f"{s}.q_norm.weight", f32), get(f"{s}.k_norm.weight", f32),
                                     get(f"{s}.o_proj.weight"))

    def mlp(m: str, moe: bool, post: torch.Tensor) -> MLPWeights:
        if not moe:
            return MLPWeights(post, pair(get(f"{m}.gate_proj.weight"), get(f"{m}.up_proj.weight")),
                              get(f"{m}.down_proj.weight"))
        if layout.fused(f"{m}.experts"):
            gate_up, down = get(f"{m}.experts.gate_up_proj"), get(f"{m}.experts.down_proj")  # [E, 2I, Dm], [E, Dm, I]
            if isinstance(gate_up, Fp8Weight) != isinstance(down, Fp8Weight):  # one kind per block: float
                gate_up, down = (w.dequantize(dtype) if isinstance(w, Fp8Weight) else w for w in (gate_up, down))
        elif any(layout.stored_name(f"{m}.experts.{e}.{part}_proj.weight") in layout.fp8
                 for e in range(config.num_experts) for part in ("gate", "up", "down")):
            gate_up, down = _fp8_experts(config, lambda e, part: get(f"{m}.experts.{e}.{part}_proj.weight"), dtype)
        else:
            E, inner, D = config.num_experts, config.moe_intermediate_size, config.hidden_size
            gate_up = torch.empty((E, 2 * inner, D), dtype=dtype, device=device)  # [E, 2I, Dm]: gate rows, up rows
            down = torch.empty((E, D, inner), dtype=dtype, device=device)  # [E, Dm, I]
            for e in range(E):
                gate_up[e, :inner] = get(f"{m}.experts.{e}.gate_proj.weight")
                gate_up[e, inner:] = get(f"{m}.experts.{e}.up_proj.weight")
                down[e] = get(f"{m}.experts.{e}.down_proj.weight")
        shared_gate_up = cat([get(f"{m}.shared_expert.gate_proj.weight"), get(f"{m}.shared_expert.up_proj.weight")])
        if isinstance(shared_gate_up, Fp8Weight) and shared_gate_up.tail is not None:  # FP8 gate, float up: float
            shared_gate_up = shared_gate_up.dequantize(dtype)
        return MLPWeights(post, gate_up, down, router=get(f"{m}.gate.weight"), shared_gate_up=shared_gate_up,
                          shared_down=get(f"{m}.shared_expert.down_proj.weight"),
                          shared_gate=get(f"{m}.shared_expert_gate.weight"))

    layers: list[GDNLayerWeights | AttentionLayerWeights] = []
    mlps: list[MLPWeights] = []
    for i, kind in enumerate(config.layer_types):
        p = f"model.layers.{i}"
        in_norm = 1.0 + get(f"{p}.input_layernorm.weight", f32)
        if kind == "linear_attention":
            a = f"{p}.linear_attn"
            A_log = get(f"{a}.A_log", f32)
            if layout.split_projections:  # rows q | k | v, z, b, a as stored
                w_in = cat([get(f"{a}.in_proj_qkv.weight"), get(f"{a}.in_proj_z.weight"),
                            get(f"{a}.in_proj_b.weight"), get(f"{a}.in_proj_a.weight")])
            else:
                w_in = cat([rows(get(f"{a}.in_proj_qkvz.weight"), qkvz_perm),
                            rows(get(f"{a}.in_proj_ba.weight"), ba_perm)])
            layers.append(keep(GDNLayerWeights(
                in_norm, contiguous(w_in), get(f"{a}.conv1d.weight")[:, 0, :].contiguous(), A_log,
                get(f"{a}.dt_bias", f32), get(f"{a}.norm.weight", f32), get(f"{a}.out_proj.weight"))))
        else:
            layers.append(keep(attention(f"{p}.self_attn", in_norm)))
        mlps.append(keep(mlp(f"{p}.mlp", config.is_moe_layer(i),
                             1.0 + get(f"{p}.post_attention_layernorm.weight", f32))))
    mtp = None
    if config.mtp_num_hidden_layers:
        heads = [(keep(attention(f"mtp.layers.{j}.self_attn",
                                 1.0 + get(f"mtp.layers.{j}.input_layernorm.weight", f32))),
                  keep(mlp(f"mtp.layers.{j}.mlp", config.is_moe_layer(j),
                           1.0 + get(f"mtp.layers.{j}.post_attention_layernorm.weight", f32))))
                 for j in range(config.mtp_num_hidden_layers)]
        mtp = MTPWeights(get("mtp.fc.weight"), 1.0 + get("mtp.pre_fc_norm_embedding.weight", f32),
                         1.0 + get("mtp.pre_fc_norm_hidden.weight", f32), [h[0] for h in heads],
                         [h[1] for h in heads], 1.0 + get("mtp.norm.weight", f32))
    return ModelWeights(embed, 1.0 + get("model.norm.weight", f32), lm_head, layers, mlps, gdn_dims, attn_dims,
                        inv_freq, mtp)


def _fp8_experts(config: Any, get: Callable[[int, str], Any], dtype: torch.dtype) -> tuple[Any, Any]:
    """The experts of an MoE block stored one by one, stacked: ``gate_up [E, 2 I, Dm]`` (gate rows, up rows) and
    ``down [E, Dm, I]``, block FP8 when every expert is (one scale-row index for all experts), else dequantised."""
    E = config.num_experts
    parts = [(get(e, "gate"), get(e, "up"), get(e, "down")) for e in range(E)]
    if not all(isinstance(p, Fp8Weight) for trio in parts for p in trio):
        plain = [[p.dequantize(dtype) if isinstance(p, Fp8Weight) else p for p in trio] for trio in parts]
        return (torch.stack([torch.cat([g, u]) for g, u, _ in plain]), torch.stack([d for _, _, d in plain]))
    gate_up = [fp8_cat([g, u]) for g, u, _ in parts]
    stack = lambda ws: Fp8Weight(torch.stack([w.weight for w in ws]), torch.stack([w.scale for w in ws]),  # noqa: E731
                                 ws[0].scale_rows)
    return stack(gate_up), stack([d for _, _, d in parts])


def select_layers(weights: ModelWeights, layers: Sequence[int]) -> ModelWeights:
    """The weights of a model made of some of these layers (renumbered 0..), with the same embedding, final norm and
    head, sharing every tensor (no copy) and without the MTP head: the layer-skip draft model of a loaded model
    (its config: :func:`lumotree.reference.drafters.layer_skip_config`)."""
    chosen = list(layers)
    kinds = [weights.layers[i] for i in chosen]
    has_gdn = any(isinstance(w, GDNLayerWeights) for w in kinds)
    has_attention = any(isinstance(w, AttentionLayerWeights) for w in kinds)
    return ModelWeights(weights.embed, weights.final_norm, weights.lm_head, kinds, [weights.mlps[i] for i in chosen],
                        weights.gdn_dims if has_gdn else None, weights.attn_dims if has_attention else None,
                        weights.inv_freq if has_attention else None, shard=weights.shard)


def gdn_row_orders(H: int, HV: int, K: int, V: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Row permutations of HF ``in_proj_qkvz`` / ``in_proj_ba`` (grouped per key head: q, k, v, z / b, a) into
    ``q | k | v | z`` / ``b | a``, each head-major: the conv inputs become one contiguous slice."""
    g = HV // H
    rows = torch.arange(H * (2 * K + 2 * g * V)).view(H, 2 * K + 2 * g * V)
    qkvz = torch.cat([rows[:, :K].flatten(), rows[:, K : 2 * K].flatten(), rows[:, 2 * K : 2 * K + g * V].flatten(),
                      rows[:, 2 * K + g * V :].flatten()])
    rows_ba = torch.arange(H * 2 * g).view(H, 2 * g)
    return qkvz, torch.cat([rows_ba[:, :g].flatten(), rows_ba[:, g:].flatten()])


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
    from lumotree.reference.layouts import canonical_shapes

    if successor and config.tie_word_embeddings:
        raise ValueError("successor=True needs tie_word_embeddings=False (lm_head is a permuted copy of the embedding)")
    gen = torch.Generator(device=device).manual_seed(seed)
    tensors = {name: _draw(name, shape, gen, device, residual_scale if successor else 1.0)
               for name, shape in canonical_shapes(config).items()}
    if successor:
        embed = tensors["model.embed_tokens.weight"]  # [Vocab, Dm]
        successor_of = successor_permutation(config.vocab_size, seed, device)  # [Vocab]
        tensors["lm_head.weight"] = torch.empty_like(embed).index_copy_(0, successor_of, embed)  # row pi(t) = e_t
    return tensors if dtype is None else {name: t.to(dtype) for name, t in tensors.items()}


def _draw(name: str, shape: tuple[int, ...], gen: torch.Generator, device: Any, residual_scale: float = 1.0
          ) -> torch.Tensor:
    """One canonical tensor of a random model, fp32 on ``device``: :func:`lumotree.reference.model.build_random`'s
    distribution for ``name``; the projections that write the residual stream scaled by ``residual_scale``."""
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
        if residual_scale != 1.0 and leaf in ("o_proj", "out_proj", "down_proj"):
            t.mul_(residual_scale)
    return t


def random_weights(config: Any, seed: int, device: Any, dtype: torch.dtype) -> ModelWeights:
    """A random model's :class:`ModelWeights` in ``dtype`` on ``device``, each tensor drawn (with
    :func:`random_tensors`' distributions, in the order the layouts are built, so other values than
    :func:`random_tensors` gives for the same seed) and cast just before it is placed: the device holds the weights
    plus one fp32 tensor (one expert's matrix), so a model that fills the card builds without a second copy."""
    from lumotree.reference.layouts import CheckpointLayout, canonical_shapes

    check_kernel_limits(config)
    device = torch.device(device)
    shapes = canonical_shapes(config)
    gen = torch.Generator(device=device).manual_seed(seed)

    def fetch(name: str, as_dtype: torch.dtype | None) -> torch.Tensor:
        return _draw(name, shapes[name], gen, device).to(as_dtype or dtype)

    return build_weights(config, CheckpointLayout(), fetch, set(shapes), device, dtype)


def successor_permutation(vocab_size: int, seed: int, device: Any = "cpu") -> torch.Tensor:
    """``pi: [Vocab]`` int64, the seeded permutation of a ``successor=True`` random model (greedy next token of t)."""
    gen = torch.Generator(device="cpu").manual_seed(seed + 0x5EED)
    return torch.randperm(vocab_size, generator=gen).to(device)
