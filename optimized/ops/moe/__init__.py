"""Routed mixture-of-experts block (Qwen3-Next / Qwen3.5-MoE): routing, a counting sort of the (token, expert)
pairs by expert, a grouped gate | up GEMM with SiLU(gate) * up fused, the grouped down GEMM and a deterministic
weighted combine, reading only the experts the tokens route to; float or block-FP8 experts (dequantised per tile).
Kernels and schedule: :mod:`~lumotree.optimized.ops.moe.kernels`; launch and checks:
:mod:`~lumotree.optimized.ops.moe.routed`; the torch reference: :mod:`~lumotree.optimized.ops.moe.reference`."""

from .reference import moe_routed_ref, route_ref
from .routed import MAX_EXPERTS, MoEConfig, moe_config, moe_routed

__all__ = ["moe_routed", "moe_routed_ref", "route_ref", "moe_config", "MoEConfig", "MAX_EXPERTS"]
