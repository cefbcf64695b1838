"""Gated DeltaNet on draft trees: :func:`gdn_tree_verify` and :func:`gdn_tree_commit` (module
:mod:`~lumotree.optimized.ops.gdn_tree.api`), the deferred commits they may share (:func:`pending_commits`,
:func:`gdn_tree_flush`), and the pipelines behind them: portable (``solve`` + ``apply``, or one kernel), fused (sm_90,
``fused`` + ``fused_kernel``), ``commit`` and ``pending``; torch references in ``reference``."""

from .api import (FUSED_MIN_BATCH, PendingCommits, fused_preferred, gates, gdn_tree_commit, gdn_tree_flush,
                  gdn_tree_verify, pending_commits)
from .common import GATE_PIECE, PRECISIONS, OutputGate, TreeFactors
from .config import KernelConfig, commit_config, verify_config
from .pending import pending_layout
from .primitives import LOG_DECAY_FLOOR

__all__ = ["gdn_tree_verify", "gdn_tree_commit", "gdn_tree_flush", "pending_commits", "pending_layout",
           "fused_preferred", "gates", "LOG_DECAY_FLOOR",
           "PendingCommits", "TreeFactors", "OutputGate", "KernelConfig", "verify_config", "commit_config",
           "GATE_PIECE", "PRECISIONS", "FUSED_MIN_BATCH"]
