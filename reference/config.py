"""The hybrid model's configuration: HF ``Qwen3NextConfig`` fields, read from and written to ``config.json`` dicts.

Model types (:data:`MODEL_TYPES`): ``qwen3_next`` (``Qwen3NextForCausalLM``), ``qwen3_5_text``
(``Qwen3_5ForCausalLM``: dense MLPs) and ``qwen3_5_moe_text`` (``Qwen3_5MoeForCausalLM``: every layer MoE, top-k
weights always renormalised), plus the conditional-generation checkpoints ``qwen3_5`` / ``qwen3_5_moe``
(:data:`CONDITIONAL_MODEL_TYPES`), whose ``text_config`` is read (their ``vision_config`` is skipped: lumotree runs the
text model). All compute the same hybrid function; they differ in defaults, in which MLP keys exist and in tensor
names (:mod:`~lumotree.reference.layouts`).

:meth:`HybridConfig.from_dict` accepts both the transformers 4.57 layout (``rope_theta``, ``partial_rotary_factor``,
``full_attention_interval`` at top level) and the transformers 5 layout (``rope_parameters``, ``layer_types``).
A key it does not know raises ``ValueError`` naming the key, except the HF metadata keys in
:data:`IGNORED_HF_KEYS`, which do not change the function the model computes (training-only or bookkeeping fields).
Keys that would change it but are unsupported (RoPE scaling, sliding windows, attention biases, activations other than
SiLU, an ungated attention output, dedicated MTP embeddings) raise with the key's name. A ``quantization_config`` is
read when it is the fine-grained FP8 format of the family's FP8 releases (``quant_method`` ``"fp8"``,
``weight_block_size`` ``[128, 128]``, dynamic activations, float32 scales: :mod:`~lumotree.reference.fp8`) and sets
:attr:`HybridConfig.fp8_block_size`; any other method or setting raises naming the key. Defaults are the model type's HF
defaults, so a ``config.json`` that omits a key means what it means to HF. Qwen3.5's multimodal RoPE keys
(``rope_parameters.mrope_section``, ``mrope_interleaved``) are read and checked: text tokens carry the same position
on all three sections, which makes interleaved M-RoPE the plain RoPE of the other types.

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

__all__ = ["HybridConfig", "FP8_BLOCK", "FP8_NOT_CONVERTED", "IGNORED_HF_KEYS", "LAYER_KINDS", "MODEL_TYPES",
           "CONDITIONAL_MODEL_TYPES"]

LAYER_KINDS = ("linear_attention", "full_attention")
#: text model types and the transformers class that runs each
MODEL_TYPES = {"qwen3_next": "Qwen3NextForCausalLM", "qwen3_5_text": "Qwen3_5ForCausalLM",
               "qwen3_5_moe_text": "Qwen3_5MoeForCausalLM"}
#: conditional-generation (image + text) model types -> the model type of their ``text_config``
CONDITIONAL_MODEL_TYPES = {"qwen3_5": "qwen3_5_text", "qwen3_5_moe": "qwen3_5_moe_text"}

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

#: the FP8 weight blocks lumotree reads: ``[128, 128]`` (rows, columns), as the family's FP8 releases store them
FP8_BLOCK = (128, 128)
#: the modules a block-FP8 checkpoint written by lumotree keeps in its float dtype (as the releases do)
FP8_NOT_CONVERTED = ["lm_head", "model.embed_tokens", "mlp.gate", "shared_expert_gate"]
# fine-grained FP8 settings lumotree reads, and the values accepted (the first is the only one that changes nothing)
_FP8_FIXED: dict[str, tuple[Any, ...]] = {
    "activation_scheme": ("dynamic",), "scale_fmt": ("float", None), "fmt": ("e4m3",), "dequantize": (False, True),
    "expert_dtype": ("fp8",), "modules_to_convert": (None, []),
}

# keys whose value must be the one stated (anything else changes the function and is not supported)
_FIXED_HF_KEYS: dict[str, tuple[Any, ...]] = {
    "hidden_act": ("silu",),
    "attention_bias": (False,),
    "use_sliding_window": (False,),
    "sliding_window": (None,),
    "rope_scaling": (None,),
    "attn_output_gate": (True,),  # Qwen3.5 configs state the gated attention output
    "output_gate_type": ("swish",),  # GDN output gate silu(z)
    "mtp_use_dedicated_embeddings": (False,),  # the MTP head reads the model's embedding
    "mamba_ssm_dtype": ("float32",),  # recurrent states in fp32 (float64 in the reference)
}

# HF defaults that differ from Qwen3NextConfig's, per model type (Qwen3_5TextConfig, Qwen3_5MoeTextConfig)
_TYPE_DEFAULTS: dict[str, dict[str, Any]] = {
    "qwen3_next": {},
    "qwen3_5_text": dict(vocab_size=248320, hidden_size=4096, intermediate_size=12288, num_hidden_layers=32,
                         num_key_value_heads=4, num_experts=0),
    "qwen3_5_moe_text": dict(vocab_size=248320, hidden_size=2048, intermediate_size=0, num_hidden_layers=40,
                             num_key_value_heads=2, num_experts=256, num_experts_per_tok=8),
}
# keys a model type does not have (transformers deletes them): rejected, or accepted only at the value the type's
# computation implies (None: read and ignored, it changes nothing)
_ABSENT_KEYS: dict[str, dict[str, tuple[Any, ...] | None]] = {
    "qwen3_next": {},
    "qwen3_5_text": {k: (0,) if k == "num_experts" else () for k in (
        "num_experts", "num_experts_per_tok", "moe_intermediate_size", "shared_expert_intermediate_size",
        "decoder_sparse_step", "norm_topk_prob", "mlp_only_layers")},
    "qwen3_5_moe_text": {"intermediate_size": None, "decoder_sparse_step": (1,), "norm_topk_prob": (True,),
                         "mlp_only_layers": ([], (), None)},
}
# top-level keys of a conditional-generation config besides text_config / vision_config: they concern images
_CONDITIONAL_KEYS = frozenset({"image_token_id", "video_token_id", "vision_start_token_id", "vision_end_token_id",
                               "language_model_only", "tie_word_embeddings"})


@dataclass(frozen=True)
class HybridConfig:
    """Hybrid-model hyper-parameters (HF field names; defaults are HF's ``Qwen3NextConfig`` defaults).

    ``model_type`` (:data:`MODEL_TYPES`) names the checkpoint family: ``qwen3_5_text`` needs ``num_experts = 0``,
    ``qwen3_5_moe_text`` an MoE block in every layer with renormalised top-k weights. ``mtp_num_hidden_layers``:
    decoder layers of the multi-token-prediction head stored under ``mtp.`` (0: none).

    ``fp8_block_size``: ``(128, 128)`` when the checkpoint's ``quantization_config`` is block FP8 (its linear weights
    may be stored as float8_e4m3fn with per-block ``weight_scale_inv``: :mod:`~lumotree.reference.fp8`), else None.

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
    model_type: str = "qwen3_next"
    mtp_num_hidden_layers: int = 0
    fp8_block_size: tuple[int, int] | None = None

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
                     "num_experts_per_tok", "mtp_num_hidden_layers"):
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
        if self.fp8_block_size is not None:
            object.__setattr__(self, "fp8_block_size", tuple(self.fp8_block_size))
            if self.fp8_block_size != FP8_BLOCK:
                raise ValueError(f"config.fp8_block_size = {self.fp8_block_size!r}: only {FP8_BLOCK} is supported")
        if self.model_type not in MODEL_TYPES:
            raise ValueError(f"config.model_type = {self.model_type!r} is not one of {sorted(MODEL_TYPES)}")
        if self.model_type == "qwen3_5_text" and self.num_experts:
            raise ValueError(f"config.num_experts = {self.num_experts}: qwen3_5_text models have dense MLPs (0)")
        every_layer_moe = self.decoder_sparse_step == 1 and not self.mlp_only_layers
        if self.model_type == "qwen3_5_moe_text" and not (self.num_experts and every_layer_moe and self.norm_topk_prob):
            raise ValueError("config: qwen3_5_moe_text models have an MoE block in every layer with renormalised top-k "
                             "weights (num_experts > 0, decoder_sparse_step 1, no mlp_only_layers, norm_topk_prob)")
        if self.model_type == "qwen3_5_moe_text":  # no dense MLP: the field does not exist for this type
            object.__setattr__(self, "intermediate_size", 0)
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
        """Read a HF ``config.json`` dict (transformers 4.57 or 5 layout) of any :data:`MODEL_TYPES` type, or the
        ``text_config`` of a :data:`CONDITIONAL_MODEL_TYPES` one. Unknown keys raise ``ValueError`` naming them."""
        if not isinstance(d, dict):
            raise ValueError(f"config must be a dict, got {type(d).__name__}")
        model_type = d.get("model_type", "qwen3_next")
        if model_type in CONDITIONAL_MODEL_TYPES:
            return cls._from_conditional(d)
        if model_type not in MODEL_TYPES:  # before the keys: another architecture's are unknown
            raise ValueError(f"config key 'model_type' = {model_type!r} is not supported; lumotree runs "
                             f"{', '.join(repr(t) for t in (*MODEL_TYPES, *CONDITIONAL_MODEL_TYPES))} checkpoints")
        fields = {f.name for f in dataclasses.fields(cls)} - {"rope_theta", "partial_rotary_factor", "model_type",
                                                              "fp8_block_size"}
        kwargs: dict[str, Any] = {**_TYPE_DEFAULTS[model_type], "model_type": model_type,
                                  "fp8_block_size": _read_quantization(d.get("quantization_config"), "")}
        absent = _ABSENT_KEYS[model_type]
        interval = None
        for key, value in d.items():
            if key in IGNORED_HF_KEYS or key == "quantization_config":
                continue
            if key in absent:
                allowed = absent[key]
                if allowed is not None and (value not in allowed or isinstance(value, bool) != isinstance(
                        allowed[0] if allowed else None, bool)):
                    raise ValueError(
                        f"config key {key!r} = {value!r}: a {model_type} model has no such setting"
                        + (f" (it computes as {allowed[0]!r}, the only value accepted)" if allowed else ""))
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
                kwargs.update(_read_rope_parameters(value, model_type != "qwen3_next"))
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
                    f"unknown config key {key!r}: lumotree's {model_type} reader does not know it (ignored HF "
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

    @classmethod
    def _from_conditional(cls, d: dict[str, Any]) -> HybridConfig:
        """The text model of a conditional-generation config: its ``text_config``, with the top level's
        ``tie_word_embeddings`` (the key transformers' ``*ForConditionalGeneration`` ties the head by)."""
        model_type = d["model_type"]
        text_type = CONDITIONAL_MODEL_TYPES[model_type]
        quantization = d.get("quantization_config")
        _read_quantization(quantization, "")
        for key in d:
            if key not in IGNORED_HF_KEYS and key not in _CONDITIONAL_KEYS and key not in (
                    "text_config", "vision_config", "quantization_config"):
                raise ValueError(f"unknown config key {key!r} in a {model_type} config (lumotree reads its "
                                 "'text_config'; the vision tower is skipped)")
        text = d.get("text_config")
        if not isinstance(text, dict):
            raise ValueError(f"config key 'text_config' must be a dict (a {model_type} checkpoint's text model), "
                             f"got {type(text).__name__}")
        if text.get("model_type", text_type) != text_type:
            raise ValueError(f"config key 'text_config.model_type' = {text['model_type']!r}: a {model_type} "
                             f"checkpoint's text model is {text_type!r}")
        _read_quantization(text.get("quantization_config"), "text_config.")
        if quantization is not None and text.get("quantization_config") is not None:
            raise ValueError("config keys 'quantization_config' and 'text_config.quantization_config' are both set: "
                             "a checkpoint has one")
        if quantization is not None:
            text = {**text, "quantization_config": quantization}
        tie = d.get("tie_word_embeddings", False)
        if not isinstance(tie, bool):
            raise ValueError(f"config key 'tie_word_embeddings' = {tie!r} must be a boolean")
        try:
            return cls.from_dict({**text, "model_type": text_type, "tie_word_embeddings": tie})
        except ValueError as exc:  # name the nested key
            raise ValueError(str(exc).replace("config key '", "config key 'text_config.", 1)) from None

    def to_dict(self) -> dict[str, Any]:
        """A HF ``config.json`` dict (transformers 5 layout) of ``model_type`` that transformers' config class of the
        type reads back to the same model (keys the type does not have are left out)."""
        out: dict[str, Any] = {"architectures": [MODEL_TYPES[self.model_type]], "model_type": self.model_type}
        absent = _ABSENT_KEYS[self.model_type]
        for f in dataclasses.fields(self):
            if f.name in ("rope_theta", "partial_rotary_factor", "allow_neg_eigval", "model_type") or f.name in absent:
                continue
            if f.name == "mtp_num_hidden_layers" and not self.mtp_num_hidden_layers:
                continue
            value = getattr(self, f.name)
            out[f.name] = list(value) if isinstance(value, tuple) else value
        out["rope_parameters"] = {
            "rope_type": "default",
            "rope_theta": float(self.rope_theta),
            "partial_rotary_factor": float(self.partial_rotary_factor),
        }
        out.pop("fp8_block_size", None)
        if self.fp8_block_size is not None:
            out["quantization_config"] = {"quant_method": "fp8", "weight_block_size": list(self.fp8_block_size),
                                          "activation_scheme": "dynamic", "modules_to_not_convert": FP8_NOT_CONVERTED}
        out["hidden_act"] = "silu"
        out["attention_bias"] = False
        if self.allow_neg_eigval:  # written only when set: transformers does not implement it
            out["allow_neg_eigval"] = True
        return out


def _read_quantization(value: Any, where: str) -> tuple[int, int] | None:
    """The block size of a fine-grained FP8 ``quantization_config`` (None when absent); anything else raises naming
    the key (``where`` prefixes nested keys)."""
    if value is None:
        return None
    key = f"{where}quantization_config"
    if not isinstance(value, dict):
        raise ValueError(f"config key {key!r} must be a dict, got {type(value).__name__}")
    method = value.get("quant_method")
    if method != "fp8":
        raise ValueError(f"config key '{key}.quant_method' = {method!r} is not supported: lumotree loads float "
                         "checkpoints and block FP8 ('fp8')")
    for item, setting in value.items():
        name = f"{key}.{item}"
        if item == "weight_block_size":
            if not (isinstance(setting, (list, tuple)) and tuple(setting) == FP8_BLOCK):
                raise ValueError(f"config key {name!r} = {setting!r} is not supported (only {list(FP8_BLOCK)})")
        elif item in _FP8_FIXED:
            if setting not in _FP8_FIXED[item]:
                raise ValueError(f"config key {name!r} = {setting!r} is not supported (only {_FP8_FIXED[item][0]!r})")
        elif item in ("modules_to_not_convert", "ignored_layers"):  # the tensors' dtypes say what is quantised
            if setting is not None and not (isinstance(setting, list) and all(isinstance(m, str) for m in setting)):
                raise ValueError(f"config key {name!r} = {setting!r} must be a list of module names")
        elif item != "quant_method":
            raise ValueError(f"unknown config key {name!r}")
    if "weight_block_size" not in value:
        raise ValueError(f"config key '{key}.weight_block_size' is missing (lumotree reads {list(FP8_BLOCK)} blocks)")
    return FP8_BLOCK


def _interval_layer_types(num_layers: int, interval: int) -> tuple[str, ...]:
    return tuple("full_attention" if (i + 1) % interval == 0 else "linear_attention" for i in range(num_layers))


def _read_rope_parameters(value: Any, multimodal: bool = False) -> dict[str, Any]:
    """``rope_theta`` / ``partial_rotary_factor`` from a ``rope_parameters`` dict; with ``multimodal`` (Qwen3.5)
    also the M-RoPE keys, checked and dropped: text positions are equal on every section."""
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
        elif multimodal and key == "mrope_interleaved":
            if not isinstance(item, bool):
                raise ValueError(f"config key 'rope_parameters.mrope_interleaved' = {item!r} must be a boolean")
        elif multimodal and key == "mrope_section":
            if not (isinstance(item, list) and len(item) == 3
                    and all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in item)):
                raise ValueError(f"config key 'rope_parameters.mrope_section' = {item!r} must be a list of three "
                                 "non-negative integers")
        else:
            raise ValueError(f"unknown config key 'rope_parameters.{key}'")
    return out
