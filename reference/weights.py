r"""The hybrid model's weights in float64 and their canonical HF tensors: names, shapes, and the two-way mapping.

*Canonical tensors* are HF-named in the Qwen3-Next layout whatever the checkpoint's model type: the text model under
``model.`` (``linear_attn.in_proj_qkvz`` / ``in_proj_ba`` grouped per key head, experts one by one as
``mlp.experts.{e}.*``), ``lm_head.weight``, and the multi-token-prediction head under ``mtp.``. Checkpoints of other
layouts (Qwen3.5's split projections, fused experts, ``model.language_model.``) are converted to and from these by
:mod:`~lumotree.reference.layouts`.

The MTP head (``config.mtp_num_hidden_layers`` layers; the released checkpoints' ``mtp.*`` tensors) is kept for the
MTP drafter in :class:`MTPWeights`: ``mtp.pre_fc_norm_embedding`` (the next token's embedding, normed),
``mtp.pre_fc_norm_hidden`` (the target's last hidden state, normed), ``mtp.fc: [D, 2D]`` on their concatenation
(embedding first), ``mtp.layers.{j}`` full-attention decoder layers with the model's MLP (MoE by the model's rule
for layer index j), a final ``mtp.norm``, then the target's LM head. Every norm is the zero-centred RMSNorm.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Union

import numpy as np

from .attention import AttentionWeights
from .config import HybridConfig
from .gdn import GDNWeights
from .numerics import check_finite

__all__ = [
    "MLPWeights",
    "MoEWeights",
    "DecoderLayerWeights",
    "MTPWeights",
    "ModelWeights",
    "hf_tensor_shapes",
    "mtp_tensor_shapes",
    "weights_to_tensors",
    "weights_from_tensors",
    "validated_weights",
]


@dataclass
class MLPWeights:
    """Dense SwiGLU: ``gate_proj, up_proj: [I, D]``, ``down_proj: [D, I]`` (HF ``mlp.*`` / ``shared_expert.*``)."""

    gate_proj: np.ndarray
    up_proj: np.ndarray
    down_proj: np.ndarray


@dataclass
class MoEWeights:
    """MoE block: ``router: [E, D]`` (HF ``mlp.gate``), experts stacked ``gate_proj, up_proj: [E, I, D]``,
    ``down_proj: [E, D, I]`` (HF ``mlp.experts.{e}.*``), ``shared_expert: MLPWeights``,
    ``shared_expert_gate: [1, D]``."""

    router: np.ndarray
    gate_proj: np.ndarray
    up_proj: np.ndarray
    down_proj: np.ndarray
    shared_expert: MLPWeights
    shared_expert_gate: np.ndarray


@dataclass
class DecoderLayerWeights:
    """One block: ``input_layernorm, post_attention_layernorm: [D]`` (zero-centred), the mixer
    (:class:`~lumotree.reference.gdn.GDNWeights` or :class:`~lumotree.reference.attention.AttentionWeights`) and
    the MLP (:class:`MLPWeights` or :class:`MoEWeights`)."""

    input_layernorm: np.ndarray
    mixer: Union[GDNWeights, AttentionWeights]
    post_attention_layernorm: np.ndarray
    mlp: Union[MLPWeights, MoEWeights]


@dataclass
class MTPWeights:
    """The multi-token-prediction head (HF ``mtp.*``, module docstring): ``fc: [D, 2D]``,
    ``pre_fc_norm_embedding, pre_fc_norm_hidden, norm: [D]`` (zero-centred), ``layers``: full-attention
    :class:`DecoderLayerWeights`."""

    fc: np.ndarray
    pre_fc_norm_embedding: np.ndarray
    pre_fc_norm_hidden: np.ndarray
    layers: list[DecoderLayerWeights]
    norm: np.ndarray


@dataclass
class ModelWeights:
    """All weights, float64: ``embed_tokens: [vocab, D]``, ``layers``, final ``norm: [D]`` (zero-centred),
    ``lm_head: [vocab, D]`` (None: the embedding is used, as ``tie_word_embeddings`` asks; a tied checkpoint that
    stores a different head keeps it, as transformers does), ``mtp``: the MTP head (None without one)."""

    embed_tokens: np.ndarray
    layers: list[DecoderLayerWeights]
    norm: np.ndarray
    lm_head: np.ndarray | None
    mtp: MTPWeights | None = None


def _mlp_shapes(prefix: str, D: int, inner: int) -> dict[str, tuple[int, ...]]:
    return {f"{prefix}.gate_proj.weight": (inner, D), f"{prefix}.up_proj.weight": (inner, D),
            f"{prefix}.down_proj.weight": (D, inner)}


def _layer_shapes(p: str, kind: str, moe: bool, config: HybridConfig) -> dict[str, tuple[int, ...]]:
    """The canonical tensors of one decoder layer under prefix ``p``."""
    D = config.hidden_size
    shapes: dict[str, tuple[int, ...]] = {f"{p}.input_layernorm.weight": (D,),
                                          f"{p}.post_attention_layernorm.weight": (D,)}
    if kind == "linear_attention":
        for name, shape in config.gdn_spec().weight_shapes().items():
            if name == "conv1d":
                shape = (shape[0], 1, shape[1])
            suffix = "" if name in ("A_log", "dt_bias") else ".weight"
            shapes[f"{p}.linear_attn.{name}{suffix}"] = shape
    else:
        for name, shape in config.attention_spec().weight_shapes().items():
            shapes[f"{p}.self_attn.{name}.weight"] = shape
    if moe:
        shapes[f"{p}.mlp.gate.weight"] = (config.num_experts, D)
        for e in range(config.num_experts):
            shapes.update(_mlp_shapes(f"{p}.mlp.experts.{e}", D, config.moe_intermediate_size))
        shapes.update(_mlp_shapes(f"{p}.mlp.shared_expert", D, config.shared_expert_intermediate_size))
        shapes[f"{p}.mlp.shared_expert_gate.weight"] = (1, D)
    else:
        shapes.update(_mlp_shapes(f"{p}.mlp", D, config.intermediate_size))
    return shapes


def hf_tensor_shapes(config: HybridConfig) -> dict[str, tuple[int, ...]]:
    """Every canonical tensor of the text model of this config (no MTP head: :func:`mtp_tensor_shapes`), with its
    HF shape; for ``qwen3_next`` exactly the tensors of a ``Qwen3NextForCausalLM`` checkpoint."""
    D = config.hidden_size
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (config.vocab_size, D),
                                          "model.norm.weight": (D,)}
    if not config.tie_word_embeddings:
        shapes["lm_head.weight"] = (config.vocab_size, D)
    for i, kind in enumerate(config.layer_types):
        shapes.update(_layer_shapes(f"model.layers.{i}", kind, config.is_moe_layer(i), config))
    return shapes


def mtp_tensor_shapes(config: HybridConfig) -> dict[str, tuple[int, ...]]:
    """The canonical ``mtp.*`` tensors of ``config.mtp_num_hidden_layers`` MTP layers (empty for 0)."""
    if not config.mtp_num_hidden_layers:
        return {}
    D = config.hidden_size
    if "full_attention" not in config.layer_types:
        config.attention_spec()  # the MTP layers are attention layers: their sizes must be valid
    shapes: dict[str, tuple[int, ...]] = {"mtp.fc.weight": (D, 2 * D), "mtp.pre_fc_norm_embedding.weight": (D,),
                                          "mtp.pre_fc_norm_hidden.weight": (D,), "mtp.norm.weight": (D,)}
    for j in range(config.mtp_num_hidden_layers):
        shapes.update(_layer_shapes(f"mtp.layers.{j}", "full_attention", config.is_moe_layer(j), config))
    return shapes


def _layer_to_tensors(p: str, layer: DecoderLayerWeights, out: dict[str, np.ndarray]) -> None:
    asarray = np.asarray
    out[f"{p}.input_layernorm.weight"] = layer.input_layernorm
    out[f"{p}.post_attention_layernorm.weight"] = layer.post_attention_layernorm
    mixer = layer.mixer
    if isinstance(mixer, GDNWeights):
        for name in ("in_proj_qkvz", "in_proj_ba", "norm", "out_proj"):
            out[f"{p}.linear_attn.{name}.weight"] = getattr(mixer, name)
        out[f"{p}.linear_attn.conv1d.weight"] = asarray(mixer.conv1d)[:, None, :]
        out[f"{p}.linear_attn.A_log"] = mixer.A_log
        out[f"{p}.linear_attn.dt_bias"] = mixer.dt_bias
    else:
        for name in ("q_proj", "k_proj", "v_proj", "o_proj", "q_norm", "k_norm"):
            out[f"{p}.self_attn.{name}.weight"] = getattr(mixer, name)
    block = layer.mlp
    if isinstance(block, MoEWeights):
        out[f"{p}.mlp.gate.weight"] = block.router
        for e in range(asarray(block.router).shape[0]):
            for name in ("gate_proj", "up_proj", "down_proj"):
                out[f"{p}.mlp.experts.{e}.{name}.weight"] = asarray(getattr(block, name))[e]
        for name in ("gate_proj", "up_proj", "down_proj"):
            out[f"{p}.mlp.shared_expert.{name}.weight"] = getattr(block.shared_expert, name)
        out[f"{p}.mlp.shared_expert_gate.weight"] = block.shared_expert_gate
    else:
        for name in ("gate_proj", "up_proj", "down_proj"):
            out[f"{p}.mlp.{name}.weight"] = getattr(block, name)


def weights_to_tensors(weights: ModelWeights, config: HybridConfig) -> dict[str, np.ndarray]:
    """Canonical HF tensor name -> array (HF shapes) for every weight, the MTP head's included."""
    out = {"model.embed_tokens.weight": weights.embed_tokens, "model.norm.weight": weights.norm}
    if weights.lm_head is not None:
        out["lm_head.weight"] = weights.lm_head
    for i, layer in enumerate(weights.layers):
        _layer_to_tensors(f"model.layers.{i}", layer, out)
    if weights.mtp is not None:
        mtp = weights.mtp
        out.update({"mtp.fc.weight": mtp.fc, "mtp.pre_fc_norm_embedding.weight": mtp.pre_fc_norm_embedding,
                    "mtp.pre_fc_norm_hidden.weight": mtp.pre_fc_norm_hidden, "mtp.norm.weight": mtp.norm})
        for j, layer in enumerate(mtp.layers):
            _layer_to_tensors(f"mtp.layers.{j}", layer, out)
    return out


def _layer_from_tensors(p: str, kind: str, moe: bool, config: HybridConfig, get) -> DecoderLayerWeights:
    def dense(prefix: str) -> MLPWeights:
        return MLPWeights(*(get(f"{prefix}.{n}.weight") for n in ("gate_proj", "up_proj", "down_proj")))

    mixer: GDNWeights | AttentionWeights
    if kind == "linear_attention":
        a = f"{p}.linear_attn"
        mixer = GDNWeights(
            in_proj_qkvz=get(f"{a}.in_proj_qkvz.weight"), in_proj_ba=get(f"{a}.in_proj_ba.weight"),
            conv1d=get(f"{a}.conv1d.weight")[:, 0, :], A_log=get(f"{a}.A_log"), dt_bias=get(f"{a}.dt_bias"),
            norm=get(f"{a}.norm.weight"), out_proj=get(f"{a}.out_proj.weight"),
        )
    else:
        mixer = AttentionWeights(*(get(f"{p}.self_attn.{n}.weight")
                                   for n in ("q_proj", "k_proj", "v_proj", "o_proj", "q_norm", "k_norm")))
    block: MLPWeights | MoEWeights
    if moe:
        experts = range(config.num_experts)
        block = MoEWeights(
            router=get(f"{p}.mlp.gate.weight"),
            gate_proj=np.stack([get(f"{p}.mlp.experts.{e}.gate_proj.weight") for e in experts]),
            up_proj=np.stack([get(f"{p}.mlp.experts.{e}.up_proj.weight") for e in experts]),
            down_proj=np.stack([get(f"{p}.mlp.experts.{e}.down_proj.weight") for e in experts]),
            shared_expert=dense(f"{p}.mlp.shared_expert"),
            shared_expert_gate=get(f"{p}.mlp.shared_expert_gate.weight"),
        )
    else:
        block = dense(f"{p}.mlp")
    return DecoderLayerWeights(get(f"{p}.input_layernorm.weight"), mixer, get(f"{p}.post_attention_layernorm.weight"),
                               block)


def weights_from_tensors(tensors: Mapping[str, np.ndarray], config: HybridConfig) -> ModelWeights:
    """Build :class:`ModelWeights` from canonical HF-named tensors (the ``mtp.*`` ones for
    ``config.mtp_num_hidden_layers`` MTP layers). A missing tensor, a wrong shape, a non-finite entry or an
    unexpected tensor raises ``ValueError`` naming the tensor. With tied embeddings a stored ``lm_head.weight`` that
    differs from the embedding is kept as the head (what transformers does, with a warning)."""
    expected = {**hf_tensor_shapes(config), **mtp_tensor_shapes(config)}
    for name in sorted(tensors):
        if name in expected:
            continue
        if name == "lm_head.weight" and config.tie_word_embeddings:
            head = np.asarray(tensors[name], dtype=np.float64)
            if head.shape != (config.vocab_size, config.hidden_size):
                raise ValueError(f"tensor 'lm_head.weight' has shape {list(head.shape)}, expected "
                                 f"{[config.vocab_size, config.hidden_size]}")
            check_finite("tensor 'lm_head.weight'", head)
            continue
        hint = " (config.mtp_num_hidden_layers = 0: no MTP head)" if name.startswith("mtp.") and not \
            config.mtp_num_hidden_layers else ""
        raise ValueError(f"unexpected tensor {name!r} in the checkpoint (not part of this config's model{hint})")
    for name, shape in expected.items():
        if name not in tensors:
            raise ValueError(f"checkpoint is missing tensor {name!r} (expected shape {list(shape)})")
        t = np.asarray(tensors[name], dtype=np.float64)
        if t.shape != shape:
            raise ValueError(f"tensor {name!r} has shape {list(t.shape)}, expected {list(shape)}")
        check_finite(f"tensor {name!r}", t)

    def get(name: str) -> np.ndarray:
        return np.asarray(tensors[name], dtype=np.float64)

    layers = [_layer_from_tensors(f"model.layers.{i}", kind, config.is_moe_layer(i), config, get)
              for i, kind in enumerate(config.layer_types)]
    mtp = None
    if config.mtp_num_hidden_layers:
        mtp = MTPWeights(get("mtp.fc.weight"), get("mtp.pre_fc_norm_embedding.weight"),
                         get("mtp.pre_fc_norm_hidden.weight"),
                         [_layer_from_tensors(f"mtp.layers.{j}", "full_attention", config.is_moe_layer(j), config, get)
                          for j in range(config.mtp_num_hidden_layers)], get("mtp.norm.weight"))
    lm_head = get("lm_head.weight") if "lm_head.weight" in tensors else None  # tied: a stored head is kept
    if lm_head is not None and config.tie_word_embeddings and np.array_equal(lm_head, get("model.embed_tokens.weight")):
        lm_head = None
    return ModelWeights(get("model.embed_tokens.weight"), layers, get("model.norm.weight"), lm_head, mtp)


def validated_weights(weights: ModelWeights, config: HybridConfig) -> ModelWeights:
    """Hand-built weights checked (kinds per layer, shapes, finiteness; errors name the HF tensor) and copied to
    float64 arrays."""
    if len(weights.layers) != config.num_hidden_layers:
        raise ValueError(f"weights.layers has {len(weights.layers)} layers, config says {config.num_hidden_layers}")
    if not config.tie_word_embeddings and weights.lm_head is None:
        raise ValueError("weights.lm_head is None but config.tie_word_embeddings is false")
    if (weights.mtp is not None) != bool(config.mtp_num_hidden_layers):
        raise ValueError(f"weights.mtp is {'set' if weights.mtp is not None else 'None'} but "
                         f"config.mtp_num_hidden_layers = {config.mtp_num_hidden_layers}")
    mtp_layers = weights.mtp.layers if weights.mtp is not None else []
    kinds = [(f"layers[{i}]", layer, kind, config.is_moe_layer(i))
             for i, (kind, layer) in enumerate(zip(config.layer_types, weights.layers))]
    kinds += [(f"mtp.layers[{j}]", layer, "full_attention", config.is_moe_layer(j))
              for j, layer in enumerate(mtp_layers)]
    for where, layer, kind, moe in kinds:
        want_mixer = GDNWeights if kind == "linear_attention" else AttentionWeights
        want_mlp = MoEWeights if moe else MLPWeights
        if not isinstance(layer.mixer, want_mixer):
            raise ValueError(f"weights.{where}.mixer is {type(layer.mixer).__name__}; {kind} needs "
                             f"{want_mixer.__name__}")
        if not isinstance(layer.mlp, want_mlp):
            raise ValueError(f"weights.{where}.mlp is {type(layer.mlp).__name__}; it needs {want_mlp.__name__}")
    # one source of truth for names and shapes: the HF mapping
    return weights_from_tensors(weights_to_tensors(weights, config), config)
