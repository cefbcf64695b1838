"""Tensor and expert parallel decoding: one process per device, each holding a part of the model's weights and
caches (:mod:`~lumotree.optimized.parallel.shard`), the collectives of a step
(:mod:`~lumotree.optimized.parallel.context`), and the launch of one process per rank
(:mod:`~lumotree.optimized.parallel.launch`). On one process every collective is a no-op (:data:`SINGLE`)."""

from .context import NO_MULTICAST_ENV, SINGLE, Parallel, init_parallel, vocab_range
from .shard import check_shardable, layer_part, rank_weights, shard_head, shard_weights

__all__ = ["Parallel", "SINGLE", "init_parallel", "vocab_range", "NO_MULTICAST_ENV", "shard_weights", "shard_head",
           "rank_weights", "layer_part", "check_shardable"]
