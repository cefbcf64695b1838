"""The hybrid model's configuration: HF ``Qwen3NextConfig`` fields, read from and written to ``config.json`` dicts.

:meth:`HybridConfig.from_dict` accepts both the transformers 4.57 layout (``rope_theta``, ``partial_rotary_factor``,
``full_attention_interval`` at top level) and the transformers 5 layout (``rope_parameters``, ``layer_types``).
A key it does not know raises ``ValueError`` naming the key, except the HF metadata keys in
:data:`IGNORED_HF_KEYS`, which do not change the function the model computes (training-only or bookkeeping fields).
Keys that would change it but are unsupported (RoPE scaling, sliding windows, attention biases, activations other than
SiLU) raise with the key's name. Defaults are HF's, so a ``config.json`` that omits a key means what it means to HF.

Extension key: ``allow_neg_eigval`` (default false): GDN write strength ``beta = 2 sigmoid(b)`` instead of
``sigmoid(b)``, so ``I - beta k k^T`` can be a reflection (negative eigenvalue). HF has no such switch; a checkpoint
with it set computes a different function under transformers.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from .attention import AttentionSpec
from .gdn import GDNLayerSpec

__all__ = ["HybridConfig", "IGNORED_HF_KEYS", "LAYER_KINDS"]

LAYER_KINDS = ("linear_attention", "full_attention")

#: HF config keys that are read and ignored: they do not change the logits of a forward pass.
IGNORED_HF_KEYS = frozenset(
    {
        "architectures", "model_type", "transformers_version", "torch_dtype", "dtype", "_name_or_path",
        "bos_token_id", "eos_token_id", "pad_token_id", "initializer_range", "use_cache", "output_router_logits",
        "router_aux_loss_coef", "attention_dropout", "max_position_embeddings", "max_window_layers",
        "output_attentions", "output_hidden_states", "return_dict", "tie_encoder_decoder", "is_encoder_decoder",
        "id2label", "label2id", "problem_type", "chunk_size_feed_forward", "tokenizer_class",
    }
)

# keys whose value must be the one stated (anything else changes the function and is not supported)
_FIXED_HF_KEYS: dict[str, tuple[Any, ...]] = {
    "hidden_act": ("silu",),
    "attention_bias": (False,),
    "use_sliding_window": (False,),
    "sliding_window": (None,),
    "rope_scaling": (None,),
}


@dataclass(frozen=True)
class HybridConfig:
    """Qwen3-Next hyper-parameters (HF field names; defaults are HF's ``Qwen3NextConfig`` defaults).

    ``layer_types[i]`` is ``"full_attention"`` or ``"linear_attention"`` (GDN); by default layer i is full attention
    iff ``(i + 1) % full_attention_interval == 0`` (interval 4). Layer i uses the MoE block iff
    ``i not in mlp_only_layers and num_experts > 0 and (i + 1) % decoder_sparse_step == 0``, else a dense SwiGLU MLP
    of ``intermediate_size``. ``rotary_dim = int(head_dim * partial_rotary_factor)``.
    """

    vocab_size: int = 151936
    hidden_size: int = 2048
    intermediate_size: int = 5632
    num_hidden_layers: int = 48
    num_attention_heads: int = 16
    num_key_value_heads: int = 2
    head_dim: int = 256
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    partial_rotary_factor: float = 0.25
    tie_word_embeddings: bool = False
    linear_conv_kernel_dim: int = 4
    linear_key_head_dim: int = 128
    linear_value_head_dim: int = 128
    linear_num_key_heads: int = 16
    linear_num_value_heads: int = 32
    decoder_sparse_step: int = 1
    moe_intermediate_size: int = 512
    shared_expert_intermediate_size: int = 512
    num_experts_per_tok: int = 10
    num_experts: int = 512
    norm_topk_prob: bool = True
    mlp_only_layers: tuple[int, ...] = ()
    layer_types: tuple[str, ...] = field(default=())
    allow_neg_eigval: bool = False

    def __post_init__(self) -> None:
        positive = (
            "vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
            "head_dim", "linear_conv_kernel_dim", "linear_key_head_dim", "linear_value_head_dim",
            "linear_num_key_heads", "linear_num_value_heads", "decoder_sparse_step",
        )
        for name in positive:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"config.{name} = {value!r} must be a positive integer")
        for name in ("intermediate_size", "moe_intermediate_size", "shared_expert_intermediate_size", "num_experts",
                     "num_experts_per_tok"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"config.{name} = {value!r} must be a non-negative integer")
        for name in ("tie_word_embeddings", "norm_topk_prob", "allow_neg_eigval"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"config.{name} = {getattr(self, name)!r} must be a boolean")
        if not (isinstance(self.rms_norm_eps, (int, float)) and self.rms_norm_eps > 0):
            raise ValueError(f"config.rms_norm_eps = {self.rms_norm_eps!r} must be a positive number")
        if not (isinstance(self.rope_theta, (int, float)) and self.rope_theta > 0):
            raise ValueError(f"config.rope_theta = {self.rope_theta!r} must be a positive number")
        if not (isinstance(self.partial_rotary_factor, (int, float)) and 0 <= self.partial_rotary_factor <= 1):
            raise ValueError(f"config.partial_rotary_factor = {self.partial_rotary_factor!r} must be in [0, 1]")
        if self.rotary_dim % 2:
            raise ValueError(f"config: rotary_dim = int(head_dim * partial_rotary_factor) = {self.rotary_dim} is odd")
        if not self.layer_types:
            object.__setattr__(self, "layer_types", _interval_layer_types(self.num_hidden_layers, 4))
        object.__setattr__(self, "layer_types", tuple(self.layer_types))
        object.__setattr__(self, "mlp_only_layers", tuple(self.mlp_only_layers))
        if len(self.layer_types) != self.num_hidden_layers:
            raise ValueError(
                f"config.layer_types has {len(self.layer_types)} entries but num_hidden_layers = "
                f"{self.num_hidden_layers}"
            )
        for i, kind in enumerate(self.layer_types):
            if kind not in LAYER_KINDS:
                raise ValueError(f"config.layer_types[{i}] = {kind!r} is not one of {LAYER_KINDS}")
        for i, layer in enumerate(self.mlp_only_layers):
            if isinstance(layer, bool) or not isinstance(layer, int) or not 0 <= layer < self.num_hidden_layers:
                raise ValueError(f"config.mlp_only_layers[{i}] = {layer!r} is not a layer index")
        # the sub-specs validate head divisibility
        if "full_attention" in self.layer_types:
            self.attention_spec()
        if "linear_attention" in self.layer_types:
            self.gdn_spec()
        if any(self.is_moe_layer(i) for i in range(self.num_hidden_layers)):
            if not 1 <= self.num_experts_per_tok <= self.num_experts:
                raise ValueError(
                    f"config.num_experts_per_tok = {self.num_experts_per_tok} must be in [1, num_experts = "
                    f"{self.num_experts}]"
                )
            if self.moe_intermediate_size < 1:
                raise ValueError("config.moe_intermediate_size must be positive when MoE layers exist")
        if any(not self.is_moe_layer(i) for i in range(self.num_hidden_layers)) and self.intermediate_size < 1:
            raise ValueError("config.intermediate_size must be positive when dense MLP layers exist")

    # ------------------------------------------------------------------------------------------------ derived
    @property
    def rotary_dim(self) -> int:
        return int(self.head_dim * self.partial_rotary_factor)

    def is_moe_layer(self, layer: int) -> bool:
        """HF's rule: MoE iff not in ``mlp_only_layers``, experts exist and
        ``(layer + 1) % decoder_sparse_step == 0``."""
        return (
            layer not in self.mlp_only_layers and self.num_experts > 0 and (layer + 1) % self.decoder_sparse_step == 0
        )

    def gdn_spec(self) -> GDNLayerSpec:
        return GDNLayerSpec(
            hidden_size=self.hidden_size,
            num_k_heads=self.linear_num_key_heads,
            num_v_heads=self.linear_num_value_heads,
            head_k_dim=self.linear_key_head_dim,
            head_v_dim=self.linear_value_head_dim,
            conv_kernel=self.linear_conv_kernel_dim,
            eps=float(self.rms_norm_eps),
            allow_neg_eigval=self.allow_neg_eigval,
        )

    def attention_spec(self) -> AttentionSpec:
        return AttentionSpec(
            hidden_size=self.hidden_size,
            num_heads=self.num_attention_heads,
            num_kv_heads=self.num_key_value_heads,
            head_dim=self.head_dim,
            rotary_dim=self.rotary_dim,
            rope_theta=float(self.rope_theta),
            eps=float(self.rms_norm_eps),
        )

    def replace(self, **changes: Any) -> HybridConfig:
        """A copy with some fields changed (re-validated)."""
        return dataclasses.replace(self, **changes)

    # ------------------------------------------------------------------------------------------------ HF dicts
    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> HybridConfig:
        """Read a HF ``config.json`` dict (transformers 4.57 or 5 layout). Unknown keys raise ``ValueError``."""
        if not isinstance(d, dict):
            raise ValueError(f"config must be a dict, got {type(d).__name__}")
        if d.get("model_type", "qwen3_next") != "qwen3_next":  # before the keys: another architecture's are unknown
            raise ValueError(f"config key 'model_type' = {d['model_type']!r} is not supported; lumotree runs "
                             "'qwen3_next' checkpoints")
        fields = {f.name for f in dataclasses.fields(cls)} - {"rope_theta", "partial_rotary_factor"}
        kwargs: dict[str, Any] = {}
        interval = None
        for key, value in d.items():
            if key in IGNORED_HF_KEYS:
                continue
            if key in _FIXED_HF_KEYS:
                if value not in _FIXED_HF_KEYS[key] or isinstance(value, bool) != isinstance(
                    _FIXED_HF_KEYS[key][0], bool
                ):
                    raise ValueError(
                        f"config key {key!r} = {value!r} is not supported (only {_FIXED_HF_KEYS[key][0]!r})"
                    )
                continue
            if key == "full_attention_interval":
                if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                    raise ValueError(f"config key 'full_attention_interval' = {value!r} must be a positive integer")
                interval = value
            elif key in ("rope_theta", "partial_rotary_factor"):
                kwargs[key] = value
            elif key == "rope_parameters":
                kwargs.update(_read_rope_parameters(value))
            elif key in ("layer_types", "mlp_only_layers"):
                if value is None:
                    continue
                if not isinstance(value, (list, tuple)):
                    raise ValueError(f"config key {key!r} must be a list, got {value!r}")
                kwargs[key] = tuple(value)
            elif key in fields:
                kwargs[key] = value
            else:
                raise ValueError(
                    f"unknown config key {key!r}: lumotree's Qwen3-Next reference does not know it (ignored HF "
                    "metadata keys are listed in lumotree.reference.config.IGNORED_HF_KEYS)"
                )
        if "layer_types" not in kwargs:
            layers = kwargs.get("num_hidden_layers", cls.num_hidden_layers)
            if isinstance(layers, int) and not isinstance(layers, bool) and layers > 0:
                kwargs["layer_types"] = _interval_layer_types(layers, 4 if interval is None else interval)
        elif interval is not None:
            expected = _interval_layer_types(len(kwargs["layer_types"]), interval)
            if tuple(kwargs["layer_types"]) != expected:
                raise ValueError("config keys 'layer_types' and 'full_attention_interval' disagree")
        return cls(**kwargs)

    def to_dict(self) -> dict[str, Any]:
        """A HF ``config.json`` dict (transformers 5 layout) that ``Qwen3NextConfig`` reads back to the same model."""
        out: dict[str, Any] = {"architectures": ["Qwen3NextForCausalLM"], "model_type": "qwen3_next"}
        for f in dataclasses.fields(self):
            if f.name in ("rope_theta", "partial_rotary_factor", "allow_neg_eigval"):
                continue
            value = getattr(self, f.name)
            out[f.name] = list(value) if isinstance(value, tuple) else value
        out["rope_parameters"] = {
            "rope_type": "default",
            "rope_theta": float(self.rope_theta),
            "partial_rotary_factor": float(self.partial_rotary_factor),
        }
        out["hidden_act"] = "silu"
        out["attention_bias"] = False
        if self.allow_neg_eigval:  # written only when set: transformers does not implement it
            out["allow_neg_eigval"] = True
        return out


def _interval_layer_types(num_layers: int, interval: int) -> tuple[str, ...]:
    return tuple("full_attention" if (i + 1) % interval == 0 else "linear_attention" for i in range(num_layers))


def _read_rope_parameters(value: Any) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ValueError(f"config key 'rope_parameters' must be a dict, got {value!r}")
    out: dict[str, Any] = {}
    for key, item in value.items():
        if key == "rope_type":
            if item != "default":
                raise ValueError(f"config key 'rope_parameters.rope_type' = {item!r} is not supported (only 'default')")
        elif key in ("rope_theta", "partial_rotary_factor"):
            out[key] = item
        else:
            raise ValueError(f"unknown config key 'rope_parameters.{key}'")
    return out
