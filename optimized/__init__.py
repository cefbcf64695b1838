"""Fast runtime: Triton kernels, the optimized hybrid model and the decoding engine (GPU; the kernels also run under
the Triton interpreter on a CPU).

Packages: :mod:`~lumotree.optimized.ops` (the kernels, one subpackage per op family), :mod:`~lumotree.optimized.model`
(weights, caches, layers, CUDA graphs) and :mod:`~lumotree.optimized.engine` (engine, budget, drafters, sampling, the
end-to-end benchmark). The public names below are importable from this package directly; they are loaded on first
use, so importing the package imports neither triton nor the kernels.
"""

from __future__ import annotations

import importlib
from typing import Any

#: public name -> the module that defines it
_PUBLIC = {
    **dict.fromkeys(("gdn_tree_verify", "gdn_tree_commit", "gdn_tree_flush", "pending_commits", "PendingCommits",
                     "TreeFactors", "OutputGate"), "lumotree.optimized.ops.gdn_tree"),
    **dict.fromkeys(("tree_attention", "prepare_qkv", "kv_commit", "rope_inv_freq"),
                    "lumotree.optimized.ops.tree_attention"),
    **dict.fromkeys(("tree_conv", "tree_conv_commit"), "lumotree.optimized.ops.conv_tree"),
    **dict.fromkeys(("gdn_decode", "conv_step", "gated_rmsnorm"), "lumotree.optimized.ops.gdn_decode"),
    **dict.fromkeys(("small_batch_linear", "residual_linear"), "lumotree.optimized.ops.gemv"),
    **dict.fromkeys(("moe_routed", "moe_routed_ref"), "lumotree.optimized.ops.moe"),
    **dict.fromkeys(("tree_metadata", "TreeMeta"), "lumotree.optimized.ops.tree_meta"),
    **dict.fromkeys(("tree_greedy_accept", "greedy_accept_ref", "GreedyAcceptance"), "lumotree.optimized.ops.greedy"),
    **dict.fromkeys(("OptimizedModel", "load_pretrained", "load_checkpoint", "from_reference", "build_random"),
                    "lumotree.optimized.model"),
    **dict.fromkeys(("Engine", "OptimizedTarget", "ReferenceTarget", "SamplingParams", "make_drafter"),
                    "lumotree.optimized.engine"),
}
_SUBPACKAGES = ("ops", "model", "engine")

__all__ = sorted(_PUBLIC) + list(_SUBPACKAGES)


def __getattr__(name: str) -> Any:
    if name in _SUBPACKAGES:
        return importlib.import_module(f"{__name__}.{name}")
    if name in _PUBLIC:
        return getattr(importlib.import_module(_PUBLIC[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
