"""The optimized model's weights: HF checkpoint tensors validated, fused and reordered once for the kernels, and
seeded random weights drawn on the device for benchmark models."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from ..ops.gdn_tree.common import check_decay_rates
from ..ops.gemv import interleave_gate_up
from ..ops.tree_attention import rope_inv_freq

__all__ = ["GDNLayerWeights", "AttentionLayerWeights", "MLPWeights", "ModelWeights", "load_weights",
           "gdn_row_orders", "random_tensors", "successor_permutation"]


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


def load_weights(config: Any, tensors: Mapping[str, Any], device: torch.device, dtype: torch.dtype) -> ModelWeights:
    """Validate HF-named ``tensors`` (names, shapes, finiteness; every missing or unexpected tensor named) against
    ``config`` and build the kernels' layouts on ``device`` (matrices in ``dtype``, norms and gates fp32).

    A stored ``lm_head.weight`` is the head even with ``tie_word_embeddings`` (as transformers loads it); without one
    a tied config uses the embedding."""
    from lumotree.reference.model import IGNORED_TENSOR_PREFIXES, hf_tensor_shapes

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
    if "lm_head.weight" in tensors and "lm_head.weight" not in expected:  # a tied config that stores a head
        want = (config.vocab_size, config.hidden_size)
        if tuple(tensors["lm_head.weight"].shape) != want:
            raise ValueError(f"tensor 'lm_head.weight' has shape {list(tensors['lm_head.weight'].shape)}, "
                             f"expected {list(want)}")

    def get(name: str, as_dtype: torch.dtype | None = None) -> torch.Tensor:
        t = tensors[name]
        t = torch.from_numpy(np.ascontiguousarray(t)) if isinstance(t, np.ndarray) else t
        if not bool(torch.isfinite(t).all()):
            raise ValueError(f"tensor {name!r} contains NaN or inf")
        return t.to(device=device, dtype=as_dtype or dtype).contiguous()

    f32 = torch.float32
    embed = get("model.embed_tokens.weight")  # [Vocab, Dm]
    lm_head = get("lm_head.weight") if "lm_head.weight" in tensors else embed  # [Vocab, Dm]
    gdn_dims = attn_dims = inv_freq = None
    if "linear_attention" in config.layer_types:
        gs = config.gdn_spec()
        gdn_dims = (gs.num_k_heads, gs.num_v_heads, gs.head_k_dim, gs.head_v_dim, gs.conv_kernel)
        for key, value in (("linear_key_head_dim", gs.head_k_dim), ("linear_value_head_dim", gs.head_v_dim)):
            if not 16 <= value <= 256 or value & (value - 1):
                raise ValueError(f"config key {key!r} = {value}: the GDN kernels need a power of two in [16, 256] "
                                 "(the reference backend takes any size)")
        qkvz_perm, ba_perm = gdn_row_orders(gs.num_k_heads, gs.num_v_heads, gs.head_k_dim, gs.head_v_dim)
    if "full_attention" in config.layer_types:
        spec = config.attention_spec()
        attn_dims = (spec.num_heads, spec.num_kv_heads, spec.head_dim)
        if spec.rotary_dim == 0:
            raise ValueError("config key 'partial_rotary_factor' = 0 (no RoPE): the optimized attention kernels rotate "
                             "at least one pair (the reference backend takes it)")
        inv_freq = rope_inv_freq(spec.rotary_dim, spec.rope_theta, device)  # [rd / 2]
    layers: list[GDNLayerWeights | AttentionLayerWeights] = []
    mlps: list[MLPWeights] = []
    for i, kind in enumerate(config.layer_types):
        p = f"model.layers.{i}"
        in_norm = 1.0 + get(f"{p}.input_layernorm.weight", f32)
        if kind == "linear_attention":
            a = f"{p}.linear_attn"
            try:
                check_decay_rates(get(f"{a}.A_log", f32))
            except ValueError as exc:
                raise ValueError(f"tensor '{a}.A_log': {exc}") from None
            w_in = torch.cat([get(f"{a}.in_proj_qkvz.weight")[qkvz_perm], get(f"{a}.in_proj_ba.weight")[ba_perm]])
            layers.append(GDNLayerWeights(
                in_norm, w_in.contiguous(), get(f"{a}.conv1d.weight")[:, 0, :].contiguous(),
                get(f"{a}.A_log", f32), get(f"{a}.dt_bias", f32), get(f"{a}.norm.weight", f32),
                get(f"{a}.out_proj.weight")))
        else:
            s = f"{p}.self_attn"
            w_qkv = torch.cat([get(f"{s}.q_proj.weight"), get(f"{s}.k_proj.weight"), get(f"{s}.v_proj.weight")])
            layers.append(AttentionLayerWeights(in_norm, w_qkv, get(f"{s}.q_norm.weight", f32),
                                                get(f"{s}.k_norm.weight", f32), get(f"{s}.o_proj.weight")))
        post = 1.0 + get(f"{p}.post_attention_layernorm.weight", f32)
        m = f"{p}.mlp"
        if config.is_moe_layer(i):
            experts = range(config.num_experts)
            gate_up = torch.stack([torch.cat([get(f"{m}.experts.{e}.gate_proj.weight"),
                                              get(f"{m}.experts.{e}.up_proj.weight")]) for e in experts])
            down = torch.stack([get(f"{m}.experts.{e}.down_proj.weight") for e in experts])
            mlps.append(MLPWeights(
                post, gate_up, down, router=get(f"{m}.gate.weight"),
                shared_gate_up=torch.cat([get(f"{m}.shared_expert.gate_proj.weight"),
                                          get(f"{m}.shared_expert.up_proj.weight")]),
                shared_down=get(f"{m}.shared_expert.down_proj.weight"),
                shared_gate=get(f"{m}.shared_expert_gate.weight")))
        else:
            mlps.append(MLPWeights(post, interleave_gate_up(get(f"{m}.gate_proj.weight"), get(f"{m}.up_proj.weight")),
                                   get(f"{m}.down_proj.weight")))
    return ModelWeights(embed, 1.0 + get("model.norm.weight", f32), lm_head, layers, mlps, gdn_dims, attn_dims,
                        inv_freq)


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
