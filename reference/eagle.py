r"""The EAGLE-style draft head, exact in float64: a one-layer head on the target's final-normed hidden states and the
token embeddings, trained to reproduce the target's own next features and next-token distribution.

One head step at position p reads the target's hidden state ``h_p`` of context token p and the next token
``x_{p+1}``::

    u   = fc [ rmsnorm0(embed(x_{p+1}); pre_fc_norm_embedding) ; rmsnorm0(h_p; pre_fc_norm_hidden) ]    # [D]
    u   = decoder_block(u; layer)         one gated-attention layer (RoPE at position p over the head's own KV cache)
                                          with a dense SwiGLU MLP
    f_p = rmsnorm0(u; norm)               ``norm``: a copy of the target's final norm, frozen in training
    logits_p = f_p @ lm_head^T            the target's LM head: a distribution over x_{p+2}

``f_p`` regresses the target's next feature ``h_{p+1}`` (EAGLE's feature loss) and ``logits_p`` the target's
distribution over ``x_{p+2}`` (its token loss). Drafting feeds the head its own features: depth k + 1 reads
``(f, drafted token)`` of depth k at position ``p + k``, EAGLE's autoregression at the feature level. It is laid out
like the checkpoint MTP head (:mod:`lumotree.reference.mtp`, same alignment and cache), so the exact head here is
:class:`~lumotree.reference.mtp.MTPHead`'s math on the EAGLE weights; it differs in what it is trained on (the frozen
target's outputs, not the corpus tokens) and where it is stored.

Storage (:func:`read_eagle`): a folder (by convention ``eagle/`` beside the target) with ``config.json``
(``"format": "lumotree-eagle"``, ``hidden_size``, ``intermediate_size``, ``vocab_size``, and the confidence
``calibration``) and ``model.safetensors`` holding ``eagle.fc.weight: [D, 2D]``, ``eagle.pre_fc_norm_embedding``,
``eagle.pre_fc_norm_hidden``, ``eagle.norm`` (``.weight: [D]``, zero-centred) and ``eagle.layers.0.*`` (a
full-attention decoder layer with the target's attention shapes and a dense MLP).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np

from .model import HybridModel
from .mtp import MTPHead
from .weights import MTPWeights, _layer_from_tensors

__all__ = ["EAGLE_FORMAT", "EagleHead", "eagle_weights", "eagle_tensor_shapes", "read_eagle", "calibrate"]

EAGLE_FORMAT = "lumotree-eagle"


def eagle_tensor_shapes(config, intermediate_size: int) -> dict[str, tuple[int, ...]]:
    """The stored tensors of an EAGLE head for a target of ``config`` (attention shapes from the target)."""
    D = config.hidden_size
    spec = config.attention_spec()
    q = spec.num_heads * spec.head_dim
    kv = spec.num_kv_heads * spec.head_dim
    p = "eagle.layers.0"
    return {"eagle.fc.weight": (D, 2 * D), "eagle.pre_fc_norm_embedding.weight": (D,),
            "eagle.pre_fc_norm_hidden.weight": (D,), "eagle.norm.weight": (D,),
            f"{p}.input_layernorm.weight": (D,), f"{p}.post_attention_layernorm.weight": (D,),
            f"{p}.self_attn.q_proj.weight": (2 * q, D), f"{p}.self_attn.k_proj.weight": (kv, D),
            f"{p}.self_attn.v_proj.weight": (kv, D), f"{p}.self_attn.o_proj.weight": (D, q),
            f"{p}.self_attn.q_norm.weight": (spec.head_dim,), f"{p}.self_attn.k_norm.weight": (spec.head_dim,),
            f"{p}.mlp.gate_proj.weight": (intermediate_size, D), f"{p}.mlp.up_proj.weight": (intermediate_size, D),
            f"{p}.mlp.down_proj.weight": (D, intermediate_size)}


def eagle_weights(config, tensors: dict, intermediate_size: int) -> MTPWeights:
    """The head's weights (float64) from its stored tensors, every name and shape checked against ``config``."""
    want = eagle_tensor_shapes(config, intermediate_size)
    missing, unexpected = sorted(set(want) - set(tensors)), sorted(set(tensors) - set(want))
    if missing or unexpected:
        raise ValueError(f"EAGLE tensors: missing {missing[:3]}, unexpected {unexpected[:3]}")
    for name, shape in want.items():
        if tuple(np.shape(tensors[name])) != shape:
            raise ValueError(f"tensor {name!r} has shape {list(np.shape(tensors[name]))}, expected {list(shape)}")
        if not np.all(np.isfinite(np.asarray(tensors[name], dtype=np.float64))):
            raise ValueError(f"tensor {name!r} contains NaN or inf")

    def get(name: str) -> np.ndarray:
        return np.asarray(tensors[name], dtype=np.float64)

    layer = _layer_from_tensors("eagle.layers.0", "full_attention", False, config, get)
    return MTPWeights(get("eagle.fc.weight"), get("eagle.pre_fc_norm_embedding.weight"),
                      get("eagle.pre_fc_norm_hidden.weight"), [layer], get("eagle.norm.weight"))


def read_eagle(path: str | os.PathLike) -> tuple[dict, dict[str, np.ndarray]]:
    """``(config, tensors as float64 arrays)`` of an EAGLE folder (module docstring)."""
    from .checkpoint import read_tensors

    path = Path(path)
    if not (path / "config.json").is_file():
        raise FileNotFoundError(f"eagle = {str(path)!r} has no config.json (train one with lumotree train eagle)")
    config = json.loads((path / "config.json").read_text())
    if config.get("format") != EAGLE_FORMAT:
        raise ValueError(f"eagle = {str(path)!r}: config.json is not an EAGLE head (format {config.get('format')!r})")
    return config, read_tensors(path)


def calibrate(probabilities: np.ndarray, hits: np.ndarray, bins: int = 10) -> dict[str, list[float]]:
    """A monotone map from the head's probability of a drafted token to the rate at which the target accepts it:
    ``probabilities`` binned into ``bins`` equal-width bins, each bin's hit rate (with one pseudo-hit at the bin's
    centre, so empty bins stay defined), made non-decreasing by pool-adjacent-violators. ``{"edges", "values"}``:
    ``values[i]`` holds on ``[edges[i], edges[i + 1])``."""
    p = np.clip(np.asarray(probabilities, dtype=np.float64), 0.0, 1.0)  # [n]
    h = np.asarray(hits, dtype=np.float64)  # [n]
    if p.shape != h.shape:
        raise ValueError(f"probabilities has shape {p.shape} but hits {h.shape}")
    edges = np.linspace(0.0, 1.0, bins + 1)
    index = np.minimum((p * bins).astype(np.int64), bins - 1)
    counts = np.bincount(index, minlength=bins) + 1.0  # [bins]
    sums = np.bincount(index, weights=h, minlength=bins) + (edges[:-1] + edges[1:]) / 2
    blocks: list[list[float]] = []  # pool adjacent violators: [total, weight, bins pooled]
    for s, c in zip(sums, counts):
        blocks.append([s, c, 1])
        while len(blocks) > 1 and blocks[-2][0] / blocks[-2][1] > blocks[-1][0] / blocks[-1][1]:
            s2, c2, k2 = blocks.pop()
            blocks[-1] = [blocks[-1][0] + s2, blocks[-1][1] + c2, blocks[-1][2] + k2]
    values = [b[0] / b[1] for b in blocks for _ in range(int(b[2]))]
    return {"edges": edges.tolist(), "values": values}


class EagleHead(MTPHead):
    """The EAGLE head of a target :class:`~lumotree.reference.model.HybridModel` (module docstring), with
    :class:`~lumotree.reference.mtp.MTPHead`'s calls: ``new_cache()``, ``forward(hidden [T, D], token_ids [T], cache)
    -> (logits [T, V], f [T, D])`` (entries appended), ``tree(hidden [N, D], tokens [N], tree, cache)`` (cache
    untouched). ``weights``: :func:`eagle_weights`, or a folder path (:func:`read_eagle`)."""

    def __init__(self, model: HybridModel, weights: MTPWeights | str | os.PathLike):
        if not isinstance(model, HybridModel):
            raise TypeError(f"model must be a HybridModel, got {type(model).__name__}")
        if "full_attention" not in model.config.layer_types:
            raise ValueError("model has no attention layer: the EAGLE head takes the target's attention shapes")
        self.eagle_config: dict = {}
        if not isinstance(weights, MTPWeights):
            self.eagle_config, tensors = read_eagle(weights)
            if int(self.eagle_config.get("hidden_size", -1)) != model.config.hidden_size:
                raise ValueError(f"eagle = {str(weights)!r}: hidden_size {self.eagle_config.get('hidden_size')} is "
                                 f"not the target's {model.config.hidden_size}")
            weights = eagle_weights(model.config, tensors, int(self.eagle_config["intermediate_size"]))
        self.model = model
        self.config = model.config
        self.weights = weights
        self.spec = model.config.attention_spec()
