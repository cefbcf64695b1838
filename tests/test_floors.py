"""The floors' work counts (lumotree.optimized.model.floors) against the model's real weights."""

from __future__ import annotations

import dataclasses

import numpy as np

from lumotree.optimized.model import floors as roofline
from lumotree.reference.config import HybridConfig
from lumotree.reference.model import build_random, weights_to_tensors

TINY = dict(vocab_size=37, hidden_size=16, intermediate_size=24, num_hidden_layers=4, num_attention_heads=4,
            num_key_value_heads=2, head_dim=8, linear_key_head_dim=8, linear_value_head_dim=8,
            linear_num_key_heads=2, linear_num_value_heads=4, num_experts=0)


def matrix_sizes(config: HybridConfig) -> dict[str, int]:
    """Sizes of the 2-D arrays of a real (random) model of ``config``, embedding left out."""
    tensors = weights_to_tensors(build_random(config, seed=1).weights, config)
    return {n: int(np.asarray(t).size) for n, t in tensors.items()
            if np.asarray(t).ndim == 2 and n != "model.embed_tokens.weight"}


def test_dense_matmul_params_are_the_models_matrices():
    config = HybridConfig(**TINY)
    assert roofline.matmul_params_per_token(config) == sum(matrix_sizes(config).values())
    assert roofline.weight_bytes(config) == 2 * sum(matrix_sizes(config).values())


def test_moe_counts_only_the_routed_experts():
    """All experts active: every matrix; one active: the other experts' three matrices per MoE layer drop out."""
    moe = dict(TINY, num_experts=4, moe_intermediate_size=6, shared_expert_intermediate_size=10)
    everything = HybridConfig(**moe, num_experts_per_tok=4)
    sizes = matrix_sizes(everything)
    assert roofline.matmul_params_per_token(everything) == sum(sizes.values())
    one = dataclasses.replace(everything, num_experts_per_tok=1)
    per_expert = 3 * one.hidden_size * one.moe_intermediate_size
    moe_layers = sum(one.is_moe_layer(i) for i in range(one.num_hidden_layers))
    assert moe_layers == one.num_hidden_layers
    assert roofline.matmul_params_per_token(one) == sum(sizes.values()) - moe_layers * 3 * per_expert
