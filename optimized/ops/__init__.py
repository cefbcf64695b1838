"""Triton kernels of the runtime, one subpackage or module per op family.

- :mod:`~lumotree.optimized.ops.gdn_tree`: Gated DeltaNet verify / commit on draft trees (portable and fused sm_90).
- :mod:`~lumotree.optimized.ops.tree_attention`: gated attention on draft trees, its inputs and the KV compaction.
- :mod:`~lumotree.optimized.ops.conv_tree`: the GDN layer's short convolution on trees and its conv-state commit.
- :mod:`~lumotree.optimized.ops.gdn_decode`: one-token GDN decode step, conv step, gated RMSNorm.
- :mod:`~lumotree.optimized.ops.gemv`: the small-batch weight-streaming GEMV with fused neighbours.
- :mod:`~lumotree.optimized.ops.moe`: the routed mixture-of-experts block (grouped top-k GEMMs).
- :mod:`~lumotree.optimized.ops.tree_meta`: the per-step tree metadata every op reads.
- :mod:`~lumotree.optimized.ops.greedy`: greedy acceptance of a batch of trees in one launch.
- :mod:`~lumotree.optimized.ops.checks`, :mod:`~lumotree.optimized.ops.pdl`: argument checks and programmatic
  dependent launch, shared by the ops.
"""
