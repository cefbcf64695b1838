"""Lower bounds on the time of a model's steps: the work every exact implementation must do, counted from the
config (dense matrix products at the tensor cores' peak, bytes moved at least once at the memory bandwidth).

``bound = max(flops / peak_flops, bytes / bandwidth)``; a speed target below its bound at the card's datasheet
peaks cannot be met by any implementation on that card.
"""

from __future__ import annotations

from lumotree.reference.config import HybridConfig
from lumotree.reference.model import hf_tensor_shapes

__all__ = ["DATASHEET", "matmul_params_per_token", "weight_bytes", "tree_step_flops", "attention_flops", "kv_bytes",
           "gdn_flops", "gdn_bytes", "bound_us"]

#: H200 SXM datasheet peaks (dense, no sparsity): the most favourable rates a bound can assume
DATASHEET = {"bf16_flops": 989.4e12, "tf32_flops": 494.7e12, "bandwidth": 4.8e12}


def matmul_params_per_token(config: HybridConfig) -> int:
    """Weights one token multiplies by: every 2-D weight of the checkpoint except the embedding (a row gather) and,
    in MoE layers, only the router, the shared expert and ``num_experts_per_tok`` experts."""
    total = 0
    expert_params = 0
    for name, shape in hf_tensor_shapes(config).items():
        if len(shape) != 2 or name == "model.embed_tokens.weight":
            continue
        if ".mlp.experts." in name:
            if name.split(".mlp.experts.")[1].startswith("0."):  # count one expert's three matrices per layer
                expert_params += shape[0] * shape[1]
            continue
        total += shape[0] * shape[1]
    return total + expert_params * config.num_experts_per_tok


def weight_bytes(config: HybridConfig, bytes_per_weight: int = 2) -> int:
    """Bytes of the weights a decode step reads (dense MLP: all of them but the embedding's unused rows)."""
    if config.num_experts:
        raise ValueError("weight_bytes: a dense-MLP config only (an MoE decode reads only the experts it routes to)")
    return matmul_params_per_token(config) * bytes_per_weight


def tree_step_flops(config: HybridConfig, tokens: int) -> float:
    """Projection, MLP and LM-head products of ``tokens`` tokens: 2 FLOPs per weight per token."""
    return 2.0 * matmul_params_per_token(config) * tokens


def attention_flops(B: int, N: int, L: int, q_heads: int, head_dim: int) -> float:
    """``q k^T`` and ``p v`` of ``N`` queries per head against ``L`` committed keys (the tree's own keys left out:
    a lower bound)."""
    return 4.0 * B * q_heads * N * L * head_dim


def kv_bytes(B: int, L: int, kv_heads: int, head_dim: int, bytes_per_value: int = 2) -> float:
    """The committed K and V, read once."""
    return 2.0 * B * L * kv_heads * head_dim * bytes_per_value


def gdn_flops(B: int, N: int, HV: int, K: int, V: int) -> float:
    """``K S0`` and ``Q S0`` of every value head (``[N, K] x [K, V]`` each)."""
    return 2.0 * 2.0 * B * HV * N * K * V


def gdn_bytes(B: int, N: int, H: int, HV: int, K: int, V: int, token_bytes: int = 4) -> float:
    """The fp32 state read once and written once, q / k / v in and o out at ``token_bytes``, and each node's fp32
    ``delta`` (what a commit after sampling needs per value head: ``V`` numbers; the rest of the factors, one or two
    numbers a node, left out)."""
    state = 2.0 * B * HV * K * V * 4
    tokens = B * N * (2 * H * K + 2 * HV * V) * token_bytes
    delta = B * N * HV * V * 4
    return state + tokens + delta


def bound_us(flops: float, nbytes: float, rates: dict[str, float], flops_kind: str) -> float:
    return max(flops / rates[flops_kind], nbytes / rates["bandwidth"]) * 1e6
