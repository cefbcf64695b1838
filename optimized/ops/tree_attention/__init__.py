"""Tree attention for the gated attention layers: inputs (:func:`prepare_qkv`), the attention over the committed
KV cache plus each node's ancestors (:func:`tree_attention`) and the KV compaction after acceptance
(:func:`kv_commit`)."""

from .attention import AttentionLaunch, choose_num_splits, default_launch, default_tree_slack, tree_attention
from .kv_commit import kv_commit
from .prepare import prepare_qkv, rope_inv_freq

__all__ = ["tree_attention", "AttentionLaunch", "prepare_qkv", "rope_inv_freq", "kv_commit", "choose_num_splits",
           "default_launch", "default_tree_slack"]
