"""5. Short convolution and attention on trees, and the conv-state / KV compaction after a commit."""
