"""Small-batch linear layers (decode and small tree steps): a split-K weight-streaming GEMV with fused neighbours
(SwiGLU, residual add + RMSNorm, the GDN layer's short conv), for float and block-FP8 weights
(:mod:`~lumotree.optimized.ops.gemv.fp8`: :class:`Fp8Weight`, and :func:`fp8_linear` for any number of rows). Kernel and
math: :mod:`~lumotree.optimized.ops.gemv.kernels`; launch and checks: :mod:`~lumotree.optimized.ops.gemv.linear`."""

from .fp8 import FP8_BLOCK_K, Fp8Weight, fp8_cat, fp8_linear
from .kernels import (MAX_NORM_PARTS, MAX_ROWS, MAX_SUM_ROWS, OUT_DTYPES, WIDE_N, ConvStep, GemvConfig, ResidualRows,
                      RowNorm, TreeConv)
from .linear import (gemv_config, interleave_gate_up, preferred, residual_linear, small_batch_linear, split_k_scratch,
                     split_k_scratch_cache)

__all__ = ["small_batch_linear", "fp8_linear", "Fp8Weight", "fp8_cat", "FP8_BLOCK_K", "residual_linear",
           "gemv_config", "preferred", "interleave_gate_up", "split_k_scratch",
           "split_k_scratch_cache", "GemvConfig", "RowNorm", "ResidualRows", "ConvStep", "TreeConv",
           "MAX_ROWS", "MAX_SUM_ROWS", "MAX_NORM_PARTS", "WIDE_N", "OUT_DTYPES"]
