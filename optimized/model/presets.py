"""Seeded random models for trying the runtime without a checkpoint (Qwen3-Next layout, dense MLP): the configs of
``lumotree generate --random`` and ``lumotree bench e2e --config``."""

from __future__ import annotations

from typing import Any

__all__ = ["RANDOM_CONFIGS"]

#: name -> :class:`~lumotree.reference.config.HybridConfig` keyword arguments
RANDOM_CONFIGS: dict[str, dict[str, Any]] = {
    "tiny": dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
                 num_key_value_heads=2, head_dim=16, linear_key_head_dim=16, linear_value_head_dim=16,
                 linear_num_key_heads=2, linear_num_value_heads=4, num_experts=0),
    "small": dict(vocab_size=8192, hidden_size=512, intermediate_size=1536, num_hidden_layers=8, num_attention_heads=8,
                  num_key_value_heads=2, head_dim=128, linear_key_head_dim=128, linear_value_head_dim=128,
                  linear_num_key_heads=4, linear_num_value_heads=8, num_experts=0),
    # the end-to-end benchmark's model (2.2 B parameters: hidden 2048, 24 layers = 18 GDN + 6 gated attention)
    "bench": dict(vocab_size=151936, hidden_size=2048, intermediate_size=5632, num_hidden_layers=24,
                  num_attention_heads=16, num_key_value_heads=2, head_dim=256, partial_rotary_factor=0.25,
                  rope_theta=10_000_000.0, linear_key_head_dim=128, linear_value_head_dim=128,
                  linear_num_key_heads=16, linear_num_value_heads=32, linear_conv_kernel_dim=4, num_experts=0),
}
