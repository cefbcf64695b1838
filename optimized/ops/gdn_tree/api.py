r"""The GDN tree op: one verify and one commit, dispatching to the fastest correct pipeline.

A step of tree decoding on one Gated DeltaNet layer verifies every request's draft tree from its committed state
``S0``, then commits the accepted node's state. Per value head, with the inclusive ancestor mask ``M``, path sums
``log Gamma = M g`` and decays ``D_ij = M_ij Gamma_i / Gamma_j``::

    A     = diag(beta) (K K^T ⊙ D ⊙ M°)                          strictly lower triangular
    Delta = (I + A)^{-1} diag(beta) (V - diag(Gamma) K S0)
    O     = scale (diag(Gamma) Q S0 + (Q K^T ⊙ D) Delta)
    S_a   = Gamma_a S0 + sum_{j in path(a)} (Gamma_a / Gamma_j) k_j delta_j^T        (the commit of node a)

Two ways to hold the state between the steps:

- **in place** (``pending=None``): :func:`gdn_tree_commit` rebuilds ``S_a`` in the pool, one read and one write of
  every state, after a verify that read it once;
- **deferred** (``pending`` from :func:`pending_commits`): the commit only records the accepted path
  (``S_true = gamma_a S + kpt dp``, per slot) and the next verify applies it while it streams the state, so a step
  reads and writes each state once. On an sm_90 GPU the fused verify (a persistent warp-specialised Gluon kernel)
  does this where it is faster (:func:`fused_preferred`); elsewhere the verify flushes what is pending for its slots
  and runs the portable pipeline. Any other reader of the pool (a decode step, a prefill, a copy) must call
  :func:`gdn_tree_flush` first.

Arguments follow flash-linear-attention: ``q, k: [B, N, H, K]``, ``v: [B, N, HV, V]``, ``g, beta: [B, N, HV]``,
value head ``h`` reads q / k head ``h // (HV // H)``; the state pool ``initial_state: [P, HV, K, V]`` fp32 is read
at ``state_indices: [B]``.
"""

from __future__ import annotations

import torch

from ..checks import check_tensor
from ..tree_meta import TreeMeta
from .commit import commit_in_place
from .common import OutputGate, TreeFactors
from .fused import fused_verify, fused_verify_supported, node_rows_addressable
from .pending import PendingCommits, gdn_tree_flush, gdn_tree_record, pending_commits
from .portable import portable_verify

__all__ = ["gdn_tree_verify", "gdn_tree_commit", "gdn_tree_flush", "pending_commits", "fused_preferred", "gates",
           "PendingCommits", "TreeFactors", "OutputGate"]

#: batches from which the fused verify + record beat the portable verify + commit at N = 64 on sm_90 (one layer at
#: Qwen3-Next shapes: 1.96x against 3.08x fla's decode step at B = 64, 2.16x against 2.96x at B = 8; the portable
#: pipeline stays faster at B = 1)
FUSED_MIN_BATCH = 8


def fused_preferred(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, initial_state: torch.Tensor,
                    input_precision: str | None) -> bool:
    """Whether :func:`gdn_tree_verify` with ``pending`` takes the fused path for these inputs: an sm_90 GPU with
    Gluon, fp32 ``q, k, v`` addressable as node rows, trees of exactly the fused kernel's 64 nodes, ``[128, 128]``
    states, the tensor-core precision (``input_precision`` None or ``"tf32"``) and at least :data:`FUSED_MIN_BATCH`
    requests."""
    if input_precision not in (None, "tf32") or not fused_verify_supported(q.device):
        return False
    B, N = q.shape[:2]
    return (N == 64 and tuple(initial_state.shape[-2:]) == (128, 128) and B >= FUSED_MIN_BATCH
            and all(t.dtype == torch.float32 and node_rows_addressable(t) for t in (q, k, v)))


def gdn_tree_verify(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    *,
    parents: torch.Tensor,
    initial_state: torch.Tensor,
    state_indices: torch.Tensor,
    num_nodes: torch.Tensor | None = None,
    scale: float | None = None,
    use_qk_l2norm_in_kernel: bool = False,
    A_log: torch.Tensor | None = None,
    dt_bias: torch.Tensor | None = None,
    allow_neg_eigval: bool = False,
    pending: PendingCommits | None = None,
    max_depth: int | None = None,
    input_precision: str | None = None,
    output_gate: OutputGate | None = None,
    meta: TreeMeta | None = None,
    out: tuple | None = None,
    validate: bool = True,
) -> tuple[torch.Tensor, TreeFactors]:
    """Verify a batch of draft trees on one GDN layer: every node's output and the factors its commit needs.

    ``q, k: [B, N, H, K]``, ``v: [B, N, HV, V]`` (fp32, bf16 or fp16, last dim contiguous); ``g`` (log decay, <= 0)
    and ``beta`` (in [0, 2]) ``[B, N, HV]``, or with ``A_log, dt_bias: [HV]`` the raw projections ``a`` and ``b``,
    gated in the kernel: ``g = -exp(A_log) softplus(a + dt_bias)``, ``beta = sigmoid(b)`` (``2 sigmoid(b)`` with
    ``allow_neg_eigval``). ``parents: [B, N]`` with ``parents[b, 0] == -1`` and ``0 <= parents[b, i] < i``;
    ``num_nodes: [B]`` for trees smaller than N (padding ignored, its outputs zero). ``initial_state: [P, HV, K, V]``
    fp32 read at ``state_indices: [B]`` (distinct with ``pending``); ``scale`` defaults to ``K ** -0.5``;
    ``use_qk_l2norm_in_kernel`` L2-normalises q and k (``x * rsqrt(|x|^2 + 1e-6)``).

    ``pending``: the slots' deferred commits (module docstring): applied to the pool by this call. ``max_depth``: a
    bound on every tree's depth (the drafter's), which lets the fused path invert in fp16 for trees at most 10 deep.
    ``input_precision``: ``"ieee"`` (fp32 FMA), ``"tf32x3"`` or ``"tf32"`` (tensor cores); None: ``"tf32"`` on the
    fused path, else ``"ieee"``. ``output_gate``: fuse the first half of the gated RMSNorm after the layer (portable
    path; :class:`~lumotree.optimized.ops.gdn_tree.common.OutputGate`). ``meta``: this step's
    :func:`~lumotree.optimized.ops.tree_meta.tree_metadata` (shared by the layers). ``out``: preallocated ``(o, delta,
    log_gamma, k_rnorm)`` (portable path). ``validate=False`` skips the checks that read data back to the host (tree
    structure, ranges, finiteness), e.g. inside CUDA-graph capture.

    Returns ``o: [B, N, HV, V]`` (``o_i = scale S_i^T q_i``, ``S_i`` the state after node i; fp32 from the fused path,
    else v's dtype) and the :class:`~lumotree.optimized.ops.gdn_tree.common.TreeFactors`.
    """
    gated = A_log is not None or dt_bias is not None
    if pending is not None and output_gate is None and out is None and fused_preferred(q, k, v, initial_state,
                                                                                        input_precision):
        if gated:
            check_tensor("A_log", A_log, (v.shape[2],), "HV", (torch.float32,), q.device, contiguous=True)
            check_tensor("dt_bias", dt_bias, (v.shape[2],), "HV", (torch.float32,), q.device, contiguous=True)
            g, beta = gates(g, beta, A_log, dt_bias, allow_neg_eigval)
        return fused_verify(q, k, v, g.float().contiguous(), beta.float().contiguous(), initial_state, state_indices,
                            parents, pending, scale=scale, num_nodes=num_nodes,
                            use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel, meta=meta, max_depth=max_depth,
                            validate=validate)
    if pending is not None:
        gdn_tree_flush(pending, initial_state, state_indices, validate=validate)
    return portable_verify(q, k, v, g, beta, initial_state, state_indices, parents, A_log=A_log, dt_bias=dt_bias,
                           allow_neg_eigval=allow_neg_eigval, use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel,
                           scale=scale, num_nodes=num_nodes, input_precision=input_precision or "ieee", meta=meta,
                           validate=validate, out=out, gate=output_gate)


def gates(a: torch.Tensor, b: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor,
          allow_neg_eigval: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """The gates from the raw projections, fp32 ``[B, N, HV]`` each: ``g = -exp(A_log + log softplus(a +
    dt_bias))`` (``= -exp(A_log) softplus(a + dt_bias)``, in the log domain so that an ``exp(A_log)`` beyond fp32
    gives ``-inf``, never ``inf * 0``; ``log softplus(x) = x`` below -15 to fp32's precision), ``beta = sigmoid(b)``
    (doubled with ``allow_neg_eigval``). The kernels hold a ``g`` below ``LOG_DECAY_FLOOR`` at it."""
    x = a.float() + dt_bias  # [B, N, HV]
    log_softplus = torch.where(x < -15.0, x, torch.nn.functional.softplus(x).log())  # [B, N, HV]
    g = -(A_log + log_softplus).exp()  # [B, N, HV]
    beta = torch.sigmoid(b.float())  # [B, N, HV]
    return g, 2.0 * beta if allow_neg_eigval else beta


def gdn_tree_commit(
    factors: TreeFactors,
    accepted: torch.Tensor,
    *,
    parents: torch.Tensor,
    initial_state: torch.Tensor,
    state_indices: torch.Tensor,
    num_nodes: torch.Tensor | None = None,
    pending: PendingCommits | None = None,
    input_precision: str | None = None,
    meta: TreeMeta | None = None,
    validate: bool = True,
) -> torch.Tensor:
    """Commit each request's accepted node: ``S_a = Gamma_a S0 + sum_{j in path(a)} (Gamma_a / Gamma_j) k_j
    delta_j^T`` with ``a = accepted[b]`` (any node, the root included).

    ``factors`` from :func:`gdn_tree_verify` of the same trees (``parents``, ``num_nodes``, ``meta`` as there);
    ``state_indices`` distinct. Without ``pending`` the state is rebuilt in place in ``initial_state`` (layers verified
    on the same trees may commit in one launch: ``initial_state: [G, P, HV, K, V]`` with factors stacked ``[G, ...]``);
    with it the path is recorded and applied by the next verify or flush (a path longer than the record's 16 nodes is
    committed at once). ``input_precision``: the in-place commit's products (None: ``"ieee"``). Returns
    ``initial_state``.
    """
    if pending is not None:
        gdn_tree_record(pending, initial_state, state_indices, factors, parents, accepted, num_nodes=num_nodes,
                        meta=meta, validate=validate)
        return initial_state
    return commit_in_place(initial_state, state_indices, factors, parents, accepted, num_nodes=num_nodes,
                           input_precision=input_precision or "ieee", meta=meta, validate=validate)

