r"""How each model type's checkpoints store the hybrid model: tensor names, shapes and the conversion to canonical.

The same function is stored in several layouts (read from transformers' own modeling files):

- ``qwen3_next`` (``Qwen3NextForCausalLM``): the text model under ``model.``; each GDN layer's projections packed
  per key head g as ``linear_attn.in_proj_qkvz`` (rows ``q_g, k_g, v_g, z_g``) and ``in_proj_ba`` (``b_g, a_g``).
- ``qwen3_5_text`` / ``qwen3_5_moe_text`` (``Qwen3_5ForCausalLM`` / ``Qwen3_5MoeForCausalLM``): split projections
  ``in_proj_qkv: [2 H K + HV V, D]`` (rows ``q | k | v``, each head-major: the conv channels' order),
  ``in_proj_z: [HV V, D]``, ``in_proj_b, in_proj_a: [HV, D]``. transformers saves these under ``model.`` and also
  loads them from ``model.language_model.``.
- ``qwen3_5`` / ``qwen3_5_moe`` conditional-generation checkpoints: the text model under ``model.language_model.``,
  ``lm_head.weight`` and ``mtp.*`` at the top, the vision tower under ``model.visual.`` (skipped: lumotree runs text).
- Experts of an MoE block one by one (``mlp.experts.{e}.gate_proj.weight``, ...; what transformers saves) or fused
  (``mlp.experts.gate_up_proj: [E, 2 I, D]`` rows gate then up, ``mlp.experts.down_proj: [E, D, I]``; what the
  released Qwen3.5-MoE checkpoints store). transformers loads both; so does lumotree.
- The MTP head (``mtp.*``, :mod:`~lumotree.reference.weights`) is stored at the top level in every type, with the
  type's expert layout.

:func:`resolve_checkpoint` reads a ``config.json`` dict and the stored tensor names into the model's
:class:`~lumotree.reference.config.HybridConfig` and the :class:`CheckpointLayout`; the layout lists the stored
tensors (:meth:`CheckpointLayout.stored_shapes`), checks a checkpoint's table against them
(:meth:`CheckpointLayout.check`) and converts stored tensors to the canonical ones and back (the permutations are
exact).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from .checkpoint import FLOAT_DTYPES, TensorInfo
from .config import CONDITIONAL_MODEL_TYPES, MODEL_TYPES, HybridConfig
from .fp8 import FP8_DTYPE, dequantize_blocks, fp8_eligible, scale_name, scale_shape
from .gdn import pack_ba, pack_qkvz, unpack_ba, unpack_qkvz
from .weights import hf_tensor_shapes, mtp_tensor_shapes

__all__ = ["CheckpointLayout", "resolve_checkpoint", "canonical_shapes", "VISION_PREFIX", "TEXT_PREFIXES"]

#: where the vision tower of a Qwen3.5 checkpoint sits (skipped)
VISION_PREFIX = "model.visual."
#: where a checkpoint's text model sits: transformers' ``*ForCausalLM`` and ``*ForConditionalGeneration``
TEXT_PREFIXES = ("model.", "model.language_model.")
_EXPERT = re.compile(r"^(.*\.mlp\.experts)\.(\d+)\.(gate|up|down)_proj\.weight$")


def canonical_shapes(config: HybridConfig) -> dict[str, tuple[int, ...]]:
    """Every canonical tensor of the model, MTP head included."""
    return {**hf_tensor_shapes(config), **mtp_tensor_shapes(config)}


@dataclass(frozen=True)
class CheckpointLayout:
    """How one checkpoint stores its tensors: the ``model_type`` (its GDN projections), the text model's ``prefix``
    (:data:`TEXT_PREFIXES`) and which MoE blocks store their experts fused (module docstring): all (True), none
    (False), or those whose canonical stems (``model.layers.{i}.mlp.experts``, ``mtp.layers.{j}.mlp.experts``) are
    listed. ``fp8``: the stored names of the weights stored in block FP8 (:mod:`~lumotree.reference.fp8`; each
    with its ``_scale_inv`` tensor)."""

    model_type: str = "qwen3_next"
    prefix: str = "model."
    fused_experts: bool | frozenset[str] = False
    fp8: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        if self.model_type not in MODEL_TYPES:
            raise ValueError(f"model_type = {self.model_type!r} is not one of {sorted(MODEL_TYPES)}")
        if self.prefix not in TEXT_PREFIXES:
            raise ValueError(f"prefix = {self.prefix!r} is not one of {TEXT_PREFIXES}")

    @property
    def split_projections(self) -> bool:
        """Qwen3.5's ``in_proj_qkv`` / ``in_proj_z`` / ``in_proj_b`` / ``in_proj_a`` (else Qwen3-Next's packed)."""
        return self.model_type != "qwen3_next"

    def fused(self, stem: str) -> bool:
        """Whether the MoE block of canonical stem ``...mlp.experts`` stores its experts fused."""
        return self.fused_experts is True or (not isinstance(self.fused_experts, bool) and stem in self.fused_experts)

    def skips(self, name: str) -> bool:
        """Stored tensors read past: a Qwen3.5 checkpoint's vision tower."""
        return self.split_projections and name.startswith(VISION_PREFIX)

    def stored_name(self, canonical: str) -> str:
        """The stored name of a canonical tensor that is stored as it is (``model.`` moves under the prefix)."""
        return self.prefix + canonical[len("model."):] if canonical.startswith("model.") else canonical

    # ------------------------------------------------------------------------------------------------ names
    def sources(self, name: str, shape: tuple[int, ...], config: HybridConfig) -> dict[str, tuple[int, ...]]:
        """The stored tensors (name -> shape) canonical tensor ``name`` is made from; a fused expert tensor is
        listed once, with expert 0's gate (``gate_up_proj``) and down (``down_proj``) projections."""
        D = config.hidden_size
        if self.split_projections and name.endswith(".linear_attn.in_proj_qkvz.weight"):
            spec = config.gdn_spec()
            base = self.stored_name(name[: -len("in_proj_qkvz.weight")])
            return {f"{base}in_proj_qkv.weight": (spec.conv_dim, D), f"{base}in_proj_z.weight": (spec.value_dim, D)}
        if self.split_projections and name.endswith(".linear_attn.in_proj_ba.weight"):
            HV = config.linear_num_value_heads
            base = self.stored_name(name[: -len("in_proj_ba.weight")])
            return {f"{base}in_proj_b.weight": (HV, D), f"{base}in_proj_a.weight": (HV, D)}
        match = _EXPERT.match(name)
        if match and self.fused(match[1]):
            stem, expert, part = match.groups()
            E, inner = config.num_experts, config.moe_intermediate_size
            if expert != "0" or part == "up":
                return {}
            if part == "gate":
                return {self.stored_name(f"{stem}.gate_up_proj"): (E, 2 * inner, D)}
            return {self.stored_name(f"{stem}.down_proj"): (E, D, inner)}
        return {self.stored_name(name): shape}

    def stored_shapes(self, config: HybridConfig) -> dict[str, tuple[int, ...]]:
        """Every tensor a checkpoint of this layout stores for ``config`` (text model and MTP head), with its shape
        (a tied config's optional ``lm_head.weight`` and the skipped vision tower not included)."""
        out: dict[str, tuple[int, ...]] = {}
        for name, shape in canonical_shapes(config).items():
            out.update(self.sources(name, shape, config))
        for name in sorted(self.fp8 & set(out)):
            out[scale_name(name)] = scale_shape(name, out[name], config.fp8_block_size or (128, 128))
        return out

    def check(self, config: HybridConfig, table: Mapping[str, TensorInfo | tuple[int, ...]]) -> list[str]:
        """Check a checkpoint's tensors (name -> :class:`~lumotree.reference.checkpoint.TensorInfo`, or a shape)
        against :meth:`stored_shapes` before any data is read; returns the names to read (the skipped ones left out).
        A missing, unexpected, wrong-shaped or non-float tensor raises ``ValueError`` naming it, and so does a
        float8 tensor that is not a linear weight of a block-FP8 config, or its scales' (missing, wrong shape,
        not float32)."""
        for name in sorted(self.fp8):
            if not fp8_eligible(name):
                raise ValueError(f"tensor {name!r} is stored as float8 ({FP8_DTYPE}); lumotree reads block FP8 for "
                                 "the linear projections only (embedding, head, norms and gates stay float)")
            if config.fp8_block_size is None:
                raise ValueError(f"tensor {name!r} is stored as float8 ({FP8_DTYPE}) but the config has no "
                                 "'quantization_config' (block FP8: quant_method 'fp8')")
        expected = self.stored_shapes(config)
        if config.tie_word_embeddings and "lm_head.weight" in table:  # a tied config may store its head: kept
            expected["lm_head.weight"] = (config.vocab_size, config.hidden_size)
        for name in sorted(table):
            if name not in expected and not self.skips(name):
                hint = " (config.mtp_num_hidden_layers = 0: no MTP head)" if name.startswith("mtp.") and not \
                    config.mtp_num_hidden_layers else ""
                raise ValueError(f"unexpected tensor {name!r} in the checkpoint (not part of this {self.model_type} "
                                 f"model{hint})")
        for name, shape in expected.items():
            if name not in table:
                raise ValueError(f"checkpoint is missing tensor {name!r} (expected shape {list(shape)})")
            info = table[name]
            stored = info.shape if isinstance(info, TensorInfo) else tuple(info)
            if tuple(stored) != shape:
                raise ValueError(f"tensor {name!r} has shape {list(stored)}, expected {list(shape)}")
            if name in self.fp8 or name.endswith("_scale_inv"):
                want = FP8_DTYPE if name in self.fp8 else "F32"
                if isinstance(info, TensorInfo) and info.dtype != want:
                    raise ValueError(f"tensor {name!r} has dtype {info.dtype}, expected {want} (block FP8)")
            elif isinstance(info, TensorInfo) and info.dtype not in FLOAT_DTYPES:
                raise ValueError(f"tensor {name!r} has dtype {info.dtype}; lumotree loads floating-point tensors "
                                 f"({', '.join(FLOAT_DTYPES)})")
        return list(expected)

    # ------------------------------------------------------------------------------------------------ tensors
    def to_canonical(self, get: Callable[[str], Any], config: HybridConfig, stored: Mapping[str, Any] | None = None
                     ) -> dict[str, np.ndarray]:
        """Canonical tensors from stored ones (``get(stored name) -> array``; exact permutations and slices; block
        FP8 weights dequantised exactly, :func:`~lumotree.reference.fp8.dequantize_blocks`). A tied config's stored
        ``lm_head.weight`` is passed through when ``stored`` (the stored names) holds it."""
        cache: dict[str, np.ndarray] = {}

        def read(name: str) -> np.ndarray:
            if name not in cache:
                cache[name] = np.asarray(get(name))
                if name in self.fp8:
                    cache[name] = dequantize_blocks(cache[name], get(scale_name(name)), config.fp8_block_size)
            return cache[name]

        out: dict[str, np.ndarray] = {}
        for name, shape in canonical_shapes(config).items():
            sources = self.sources(name, shape, config)
            match = _EXPERT.match(name)
            if match and self.fused(match[1]):
                stem, expert, part = match.groups()
                inner = config.moe_intermediate_size
                if part == "down":
                    out[name] = read(self.stored_name(f"{stem}.down_proj"))[int(expert)]
                else:
                    rows = slice(0, inner) if part == "gate" else slice(inner, 2 * inner)
                    out[name] = read(self.stored_name(f"{stem}.gate_up_proj"))[int(expert), rows]
            elif self.split_projections and name.endswith("in_proj_qkvz.weight"):
                spec = config.gdn_spec()
                qkv, z = (read(n) for n in sources)
                q, k, v = np.split(qkv, [spec.key_dim, 2 * spec.key_dim])
                out[name] = pack_qkvz(q, k, v, z, spec.num_k_heads)
            elif self.split_projections and name.endswith("in_proj_ba.weight"):
                b, a = (read(n) for n in sources)
                out[name] = pack_ba(b, a, config.linear_num_key_heads)
            else:
                (source,) = sources
                out[name] = read(source)
        if config.tie_word_embeddings and stored is not None and "lm_head.weight" in stored:
            out["lm_head.weight"] = read("lm_head.weight")
        return out

    def from_canonical(self, tensors: Mapping[str, np.ndarray], config: HybridConfig) -> dict[str, np.ndarray]:
        """The stored tensors of this layout from canonical ones (the inverse of :meth:`to_canonical`)."""
        out: dict[str, np.ndarray] = {}
        known = canonical_shapes(config)
        for name, t in tensors.items():
            shape = tuple(np.shape(t))
            sources = self.sources(name, shape, config) if name in known else {name: shape}
            match = _EXPERT.match(name)
            if match and self.fused(match[1]):
                stem, expert, part = match.groups()
                if expert == "0" and part != "up":
                    experts = range(config.num_experts)
                    if part == "gate":
                        fused = [np.concatenate([tensors[f"{stem}.{e}.gate_proj.weight"],
                                                 tensors[f"{stem}.{e}.up_proj.weight"]]) for e in experts]
                    else:
                        fused = [tensors[f"{stem}.{e}.down_proj.weight"] for e in experts]
                    (target,) = sources
                    out[target] = np.stack(fused)
            elif self.split_projections and name.endswith("in_proj_qkvz.weight"):
                q, k, v, z = unpack_qkvz(np.asarray(t), config.gdn_spec())
                qkv_name, z_name = sources
                out[qkv_name], out[z_name] = np.concatenate([q, k, v]), z
            elif self.split_projections and name.endswith("in_proj_ba.weight"):
                b, a = unpack_ba(np.asarray(t), config.gdn_spec())
                b_name, a_name = sources
                out[b_name], out[a_name] = b, a
            else:
                (target,) = sources
                out[target] = t
        return out


def resolve_checkpoint(raw: Mapping[str, Any], names: Any) -> tuple[HybridConfig, CheckpointLayout]:
    """The model and the layout of a checkpoint from its ``config.json`` dict and its stored tensor names (a table of
    :class:`~lumotree.reference.checkpoint.TensorInfo` by name also gives the weights stored in block FP8).

    Conditional-generation types keep the text model under ``model.language_model.``; text types under ``model.``,
    or ``model.language_model.`` when the names say so (transformers loads both). An MoE block's experts are fused
    when the checkpoint stores its ``mlp.experts.gate_up_proj``. The MTP head: ``mtp_num_hidden_layers`` layers (1
    when the key is absent: the released checkpoints' head) when the checkpoint stores ``mtp.*`` tensors, else none.
    """
    config = HybridConfig.from_dict(dict(raw))
    fp8 = frozenset(name for name, info in names.items() if isinstance(info, TensorInfo) and info.dtype == FP8_DTYPE
                    ) if isinstance(names, Mapping) else frozenset()
    names = set(names)
    conditional = raw.get("model_type") in CONDITIONAL_MODEL_TYPES
    if conditional or (config.model_type != "qwen3_next" and "model.language_model.embed_tokens.weight" in names):
        prefix = "model.language_model."
    else:
        prefix = "model."
    text = raw.get("text_config") if conditional else raw
    if not any(name.startswith("mtp.") for name in names):
        layers = 0
    else:
        layers = config.mtp_num_hidden_layers if "mtp_num_hidden_layers" in text else 1
    config = config.replace(mtp_num_hidden_layers=layers)
    layout = CheckpointLayout(config.model_type, prefix)
    stems = {match[1] for name in canonical_shapes(config) if (match := _EXPERT.match(name))}
    fused = frozenset(stem for stem in stems if layout.stored_name(f"{stem}.gate_up_proj") in names)
    return config, CheckpointLayout(config.model_type, prefix, bool(fused) if fused in (stems, frozenset()) else fused,
                                    fp8)
