"""Small-batch linear layers (decode and small tree steps): a split-K weight-streaming GEMV with fused
neighbours (SwiGLU, residual add + RMSNorm, the GDN layer's short conv). Kernel and math:
:mod:`~lumotree.optimized.ops.gemv.kernels`; launch and checks: :mod:`~lumotree.optimized.ops.gemv.linear`."""

from .kernels import (MAX_NORM_PARTS, MAX_ROWS, MAX_SUM_ROWS, OUT_DTYPES, WIDE_N, ConvStep, GemvConfig, ResidualRows,
                      RowNorm, TreeConv)
from .linear import (gemv_config, interleave_gate_up, preferred, residual_linear, small_batch_linear, split_k_scratch,
                     split_k_scratch_cache)

__all__ = ["small_batch_linear", "residual_linear", "gemv_config", "preferred", "interleave_gate_up", "split_k_scratch",
           "split_k_scratch_cache", "GemvConfig", "RowNorm", "ResidualRows", "ConvStep", "TreeConv",
           "MAX_ROWS", "MAX_SUM_ROWS", "MAX_NORM_PARTS", "WIDE_N", "OUT_DTYPES"]
