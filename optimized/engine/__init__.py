"""The decoding engine: continuous batching over slots, autoregressive / chain / tree speculation, the verification
budget, the drafters (the MTP drafter: :mod:`~lumotree.optimized.engine.mtp`), lossless verification and sampling,
the hybrid prefix cache, and the end-to-end benchmark (:mod:`~lumotree.optimized.engine.e2e`)."""

from .budget import CostProfile, make_budget
from .drafters import DRAFTERS, Draft, DraftRequest, EngineDrafter, make_drafter
from .selfspec import layer_skip_checkpoint
from .engine import DEFAULT_NODE_BUCKETS, MODES, Engine
from .mtp import MTPDrafter
from .prefix_cache import PrefixCache, PrefixCacheStats, PrefixHit
from .records import EngineStats, GenerationResult, Request, StepRecord, TokenEvent
from .sampling import SamplingParams, TreeBatch, VerifyOutcome
from .targets import OptimizedTarget, ReferenceMTPHead, ReferenceTarget, TargetModel

__all__ = ["Engine", "MODES", "DEFAULT_NODE_BUCKETS", "TargetModel", "ReferenceTarget", "OptimizedTarget",
           "SamplingParams", "TreeBatch", "VerifyOutcome", "CostProfile", "make_budget", "Draft", "DraftRequest",
           "EngineDrafter", "DRAFTERS", "make_drafter", "MTPDrafter", "ReferenceMTPHead", "layer_skip_checkpoint",
           "Request", "TokenEvent", "GenerationResult", "StepRecord", "EngineStats", "PrefixCache", "PrefixHit",
           "PrefixCacheStats"]
