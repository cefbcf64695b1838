r"""The fused GDN tree verify (Hopper): the previous step's pending commit applied while the state is streamed.

One step of tree decoding on a GDN layer reads every request's state twice with the split kernels: the verify
reads ``S0``, the commit reads it again and writes the accepted node's state. :func:`fused_verify` reads
and writes it once: each state chunk becomes ``gamma_a S + kpt dp`` (the previous step's accepted path, recorded
by :func:`~lumotree.optimized.ops.gdn_tree.pending.gdn_tree_record`), is written back, and is used for this step's
tree in the same pass (the closed form of :mod:`~lumotree.optimized.ops.gdn_tree`). The step is then::

    o, factors = fused_verify(q, k, v, g, beta, pool, slots, parents, pending)   # applies, clears
    accepted = ...                                                                         # sampling
    gdn_tree_record(pending, pool, slots, factors, parents, accepted)                      # records

The kernel (``_gdn_fused_gluon``) is a persistent warp-specialised Gluon kernel for sm_90: a TMA loader, an
8-warp state stream, a 4-warp solve running one item ahead, and with ``use_qk_l2norm_in_kernel`` a 2-warp norm
partition. Products are tf32 (the state stream, the Gram products, the doubling of trees deeper than 10 or with
keys not normalised in the kernel) and fp16 x fp16 with fp32 accumulation (the doubling of trees no deeper than
``max_depth <= 10`` with normalised keys, where a bound keeps its operands in fp16's range; the epilogue's ``TB`` /
``QKD`` products), so its error bound is the ``"tf32"`` mode's. ``Delta`` leaves in fp16, the values the outputs'
product used (the commit then applies what the outputs saw).

Scope (checked, each with an error that names the argument): an sm_90 GPU; fp32 ``q, k, v, g, beta``, contiguous;
``K = V = 128``; ``N = 64`` (smaller trees padded, with ``num_nodes``); ``HV`` a multiple of ``H``; distinct slots. The
pool is modified (the pending commits applied); nothing else is.
"""

from __future__ import annotations

import importlib.util
import numbers

import torch

from ..checks import check_finite_nodes, check_range_nodes, check_scalar, check_tensor, node_mask, num_sms
from ..tree_meta import TreeMeta
from .common import TreeFactors, check_commit_tree
from .pending import PATH_NODES, PendingCommits, check_pool_and_pending

__all__ = ["fused_verify", "fused_verify_supported", "node_rows_addressable"]


def fused_verify_supported(device: torch.device | str) -> bool:
    """Whether :func:`fused_verify` runs on ``device``: a CUDA device of compute capability 9.0 with a
    Triton that has Gluon."""
    device = torch.device(device)
    if device.type != "cuda" or not torch.cuda.is_available():
        return False
    if torch.cuda.get_device_capability(device) != (9, 0):
        return False
    try:
        return importlib.util.find_spec("triton.experimental.gluon") is not None
    except ImportError:  # no triton.experimental
        return False


def node_rows_addressable(t: torch.Tensor) -> bool:
    """Whether ``t: [B, N, heads, dim]`` (last dim contiguous) views as ``[B N, heads dim]`` rows with a 16-byte
    aligned row stride: what the kernel's tensor descriptors address (contiguous tensors, and slices of the channels
    of contiguous node rows)."""
    B, N, heads, dim = t.shape
    return (t.stride(3) == 1 and t.stride(2) == dim and t.stride(0) == N * t.stride(1)
            and (t.stride(1) * t.element_size()) % 16 == 0 and t.data_ptr() % 16 == 0)


def fused_verify(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    state_pool: torch.Tensor,
    slots: torch.Tensor,
    parents: torch.Tensor,
    pending: PendingCommits,
    *,
    scale: float | None = None,
    num_nodes: torch.Tensor | None = None,
    use_qk_l2norm_in_kernel: bool = False,
    meta: TreeMeta | None = None,
    max_depth: int | None = None,
    validate: bool = True,
) -> tuple[torch.Tensor, TreeFactors]:
    """Apply each slot's pending commit to its state, write it back, and verify this step's trees from it.

    ``q, k: [B, 64, H, 128]``, ``v: [B, 64, HV, 128]``, ``g`` (log decay) and ``beta``: ``[B, 64, HV]``, all fp32
    and contiguous; ``state_pool: [P, HV, 128, 128]`` fp32 at ``slots: [B]`` (distinct); ``parents: [B, 64]``;
    ``num_nodes: [B]`` for trees smaller than 64 (padding ignored, outputs there zero); ``pending`` from
    :func:`~lumotree.optimized.ops.gdn_tree.pending.pending_commits` on the same pool (and ``H``). Per (request, value
    head): ``S0 = gamma_a S + kpt dp`` where pending (else ``S``) is written to the pool and the entry cleared; then
    ``o`` and the factors as :func:`~lumotree.optimized.ops.gdn_tree.gdn_tree_verify` with ``input_precision="tf32"``
    computes them from ``S0``. ``meta``: this step's :func:`tree_meta`. ``max_depth``: a bound on every tree's depth
    (a drafter's configured depth); with ``use_qk_l2norm_in_kernel`` and a bound of at most
    ``FP16_DOUBLING_MAX_DEPTH`` (10) the doubling takes fp16 operands (twice the tensor rate; the bound keeps them in
    range), else tf32. With ``validate`` the bound is checked, and without one the trees' own depth is used.
    ``validate=False`` skips the checks that read data back to the host. Returns ``(o, factors)``."""
    device = q.device if isinstance(q, torch.Tensor) else torch.device("cpu")
    if not fused_verify_supported(device):
        raise RuntimeError(f"fused_verify needs an sm_90 (Hopper) CUDA device and Triton with Gluon; q is "
                           f"on {device}: use gdn_tree_verify + gdn_tree_commit there")
    P, H_pending, HV, K, V, path = check_pool_and_pending(state_pool, pending)
    if (K, V) != (128, 128):
        raise ValueError(f"state_pool's states are [{K}, {V}]; the fused verify is built for [128, 128]")
    if path != PATH_NODES:
        raise ValueError(f"pending holds paths of {path} nodes; the fused verify reads {PATH_NODES}")
    f32 = (torch.float32, )
    check_tensor("q", q, (None, None, None, K), "B, N, H, K", f32, device)
    B, N, H = q.shape[:3]
    from . import fused_kernel as F  # noqa: PLC0415  (Gluon: imported only where it runs)
    if N != F.NODES:
        raise ValueError(f"q has N = {N} nodes per request; the fused verify takes trees of exactly {F.NODES}")
    check_tensor("k", k, (B, N, H, K), "B, N, H, K", f32, device)
    if H != H_pending:
        raise ValueError(f"q / k have H = {H} key heads; pending holds {H_pending} (pending_commits(pool, {H}))")
    check_tensor("v", v, (B, N, HV, V), "B, N, HV, V", f32, device)
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not node_rows_addressable(t):
            raise ValueError(f"{name} (strides {t.stride()}) must be addressable as [B N, heads x dim] rows with a "
                             "16-byte aligned row stride (a slice of contiguous node rows)")
    check_tensor("g", g, (B, N, HV), "B, N, HV", f32, device, contiguous=True)
    check_tensor("beta", beta, (B, N, HV), "B, N, HV", f32, device, contiguous=True)
    if HV % H != 0:
        raise ValueError(f"v has HV = {HV} value heads, not a multiple of H = {H} (q)")
    scale = K**-0.5 if scale is None else check_scalar("scale", scale)
    if max_depth is not None:
        if isinstance(max_depth, bool) or not isinstance(max_depth, numbers.Integral) or max_depth < 0:
            raise ValueError(f"max_depth must be a non-negative int or None, got {max_depth!r}")
        max_depth = int(max_depth)
    slots, num_nodes, _, meta, has_num = check_commit_tree(parents, slots, num_nodes, None, meta, B, N, P, device,
                                                           validate)  # slots: int32
    if validate:
        real = node_mask(num_nodes, N)  # [B, N]
        for name, t in (("q", q), ("k", k), ("v", v), ("beta", beta)):
            check_finite_nodes(name, t, real)  # g may be -inf (a decay of 0): the kernel floors it
        check_range_nodes("g", g, float("-inf"), 0.0, real)
        check_range_nodes("beta", beta, 0.0, 2.0, real)
        check_finite_nodes("state_pool[slots]", state_pool[slots.long()][None], None)
        depth = int(meta.depth.masked_fill(~real, 0).max())  # the deepest real node
        if max_depth is not None and depth > max_depth:
            raise ValueError(f"max_depth = {max_depth}, but a tree in parents is {depth} deep")
        max_depth = depth if max_depth is None else max_depth
    fp16_doubling = (bool(use_qk_l2norm_in_kernel) and max_depth is not None
                     and max_depth <= F.FP16_DOUBLING_MAX_DEPTH.value)  # (the bound needs |k^| <= 1)
    sizes = num_nodes if has_num else slots  # an unused int pointer without sizes
    o = torch.empty(B, N, HV, V, device=device)
    delta = torch.empty(B, N, HV, V, device=device, dtype=torch.float16)  # as the outputs' product used it
    log_gamma = torch.empty(B, N, HV, device=device)
    k_rnorm = torch.empty(B, N, H, device=device) if use_qk_l2norm_in_kernel else None
    W = meta.words.shape[2]
    descs = F.descriptors(state_pool, q, k, v, o, delta, pending.kpt, pending.dp)
    F._fused_verify_kernel[(min(num_sms(device), B * HV), )](
        *descs, slots, pending.gamma_a, pending.active, beta, g, meta.words, meta.depth, log_gamma,
        k_rnorm if k_rnorm is not None else log_gamma, sizes, float(scale), B * HV,
        H=H, HV=HV, K=K, V=V, N=N, PATH=path, W=W, NORM=bool(use_qk_l2norm_in_kernel), BK=F.BK, STAGES=F.STAGES,
        SLOTS=F.SOLVER_SLOTS, WARPS=F.CONSUMER_WARPS, SOLVER_REGS=F.SOLVER_REGS, HAS_NUM=has_num,
        FP16_DOUBLING=fp16_doubling,
        num_warps=F.CONSUMER_WARPS,
    )
    return o, TreeFactors(delta, log_gamma, k, k_rnorm)
