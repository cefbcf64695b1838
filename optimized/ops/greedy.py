r"""Greedy acceptance of a batch of draft trees in one launch: which node each request accepts, from the target's
argmax at every node.

Node ``i`` of request ``b`` *matches* when its token is the target's argmax at its parent (the root always matches);
it is *accepted* when every inclusive ancestor matches (``M[i, j] = 1`` implies ``match[j]``, with ``M`` the
ancestor bitsets of :mod:`~lumotree.optimized.ops.tree_meta`); the deepest accepted node wins (one accepted node per
depth: siblings carry distinct tokens; of equal depths, the lowest index). Its depth is the number of drafted tokens
accepted, the argmax there is the next pending token, and the request's caches advance by depth + 1.

:func:`tree_greedy_accept` computes all of it in one program per request (match bits OR-reduced into words, the
acceptance test word by word, the best node by an argmax over ``where(accepted, depth, -1)``, the path from the
winner's ancestor row) and writes the packed outcome the engine reads back in one copy; :func:`greedy_accept_ref`
is the torch reference on a dense ``[B, N, N]`` ancestor matrix, which the engine's unfused verification uses.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from .checks import check_num_nodes, check_tensor
from .tree_meta import WORD_BITS, TreeMeta, ancestor_words, check_meta, path_of_words

__all__ = ["GreedyAcceptance", "tree_greedy_accept", "greedy_accept_ref"]


class GreedyAcceptance(NamedTuple):
    """``packed [B, 3 + N]`` int64: accepted node, its depth, the argmax there (the next pending token), then the
    on-path mask; ``accepted [B]`` int32 (the node, for the commits); ``advance [B]`` int32 (depth + 1)."""

    packed: torch.Tensor
    accepted: torch.Tensor
    advance: torch.Tensor


def greedy_accept_ref(tokens: torch.Tensor, parents: torch.Tensor, valid: torch.Tensor, ancestor: torch.Tensor,
                      depth: torch.Tensor, target_argmax: torch.Tensor
                      ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Greedy acceptance from ``tokens, parents, valid, depth: [B, N]``, the inclusive ancestor matrix
    ``ancestor: [B, N, N]`` bool and ``target_argmax: [B, N]`` (module docstring): ``(accepted node [B], its depth
    [B], next token [B], on-path mask [B, N])``. Device tensors only, no host reads (CUDA-graph safe)."""
    B, N = tokens.shape
    parent_pred = target_argmax.gather(1, parents.clamp(min=0).long())  # [B, N] argmax at each node's parent
    node = torch.arange(N, device=tokens.device)
    match = (tokens == parent_pred) | (node[None, :] == 0)  # [B, N]
    match &= valid
    accepted = ~(ancestor & ~match[:, None, :]).any(-1) & valid  # [B, N] AND of match over the inclusive ancestors
    score = torch.where(accepted, depth, torch.full_like(depth, -1))  # [B, N]
    best = score.argmax(1)  # [B]
    next_token = target_argmax.gather(1, best[:, None]).squeeze(1)  # [B]
    on_path = ancestor.gather(1, best[:, None, None].expand(B, 1, N)).squeeze(1)  # [B, N]
    return best, depth.gather(1, best[:, None]).squeeze(1), next_token, on_path


@triton.jit
def _bitwise_or(a, b):
    return a | b


@triton.jit
def _tree_greedy_accept_kernel(Tokens, Parents, NumNodes, Words, Depth, Argmax, Packed, Accepted, Advance, N, W,
                               s_tb, s_pb, s_ab, NP: tl.constexpr, BLOCK_W: tl.constexpr):
    """One program per request (module docstring)."""
    b = tl.program_id(0).to(tl.int64)
    node = tl.arange(0, NP)  # [NP]
    inside = node < N
    n_b = tl.load(NumNodes + b)
    real = inside & (node < n_b)
    parent = tl.load(Parents + b * s_pb + node, mask=real, other=0)  # [NP]
    token = tl.load(Tokens + b * s_tb + node, mask=real, other=0).to(tl.int64)  # [NP]
    argmax = tl.load(Argmax + b * s_ab + node, mask=inside, other=0).to(tl.int64)  # [NP]
    at_parent = tl.gather(argmax, tl.maximum(parent, 0), 0)  # [NP] the target's argmax at each node's parent
    match = real & ((token == at_parent) | (node == 0))  # [NP]
    offs_w = tl.arange(0, BLOCK_W)  # [BLOCK_W]
    own = (node // WORD_BITS)[:, None] == offs_w[None, :]  # [NP, BLOCK_W] the word that holds node j's bit
    bits = tl.where(own & match[:, None], tl.full([NP, BLOCK_W], 1, tl.int32) << (node % WORD_BITS)[:, None], 0)
    match_words = tl.reduce(bits, 0, _bitwise_or)  # [BLOCK_W] bit j: node j matches
    words = tl.load(Words + (b * N + node[:, None]) * W + offs_w[None, :],
                    mask=inside[:, None] & (offs_w < W)[None, :], other=0)  # [NP, BLOCK_W] inclusive ancestors
    unmatched = tl.reduce(words & ~match_words[None, :], 1, _bitwise_or)  # [NP] ancestors that do not match
    accepted = real & (unmatched == 0)  # [NP]
    depth = tl.load(Depth + b * N + node, mask=inside, other=0)  # [NP]
    best = tl.argmax(tl.where(accepted, depth, -1), 0)  # the deepest accepted node (lowest index on ties)
    is_best = node == best
    best_depth = tl.sum(tl.where(is_best, depth, 0), 0)
    next_token = tl.sum(tl.where(is_best, argmax, 0), 0)
    on_path, _, _ = path_of_words(ancestor_words(Words + (b * N + best) * W, n_b, NP, WORD_BITS), NP, WORD_BITS)
    row = Packed + b * (N + 3)
    tl.store(row, best.to(tl.int64))
    tl.store(row + 1, best_depth.to(tl.int64))
    tl.store(row + 2, next_token)
    tl.store(row + 3 + node, on_path.to(tl.int64), mask=inside)
    tl.store(Accepted + b, best.to(tl.int32))
    tl.store(Advance + b, best_depth + 1)


def tree_greedy_accept(tokens: torch.Tensor, target_argmax: torch.Tensor, *, parents: torch.Tensor,
                       num_nodes: torch.Tensor, meta: TreeMeta, validate: bool = True) -> GreedyAcceptance:
    """Greedy acceptance of ``[B, N]`` draft trees (module docstring) in one launch: ``tokens, target_argmax: [B, N]``
    integer ids (any strides along B), ``parents: [B, N]`` int32 (row stride any, unit node stride), ``num_nodes:
    [B]`` int32, ``meta``: the trees' :class:`~lumotree.optimized.ops.tree_meta.TreeMeta`. Device tensors only, no
    host reads (CUDA-graph safe; ``validate`` False inside a capture)."""
    device = tokens.device if isinstance(tokens, torch.Tensor) else torch.device("cpu")
    ints = (torch.int32, torch.int64)
    check_tensor("tokens", tokens, (None, None), "B, N", ints, device, last_contiguous=True)
    B, N = tokens.shape
    check_tensor("target_argmax", target_argmax, (B, N), "B, N", ints, device, last_contiguous=True)
    check_tensor("parents", parents, (B, N), "B, N", (torch.int32,), device, last_contiguous=True)
    num_nodes = check_num_nodes(num_nodes, B, N, device, validate)
    meta = check_meta(meta, B, N, device)
    packed = torch.empty((B, N + 3), dtype=torch.int64, device=device)  # [B, 3 + N]
    accepted = torch.empty((B,), dtype=torch.int32, device=device)  # [B]
    advance = torch.empty((B,), dtype=torch.int32, device=device)  # [B]
    W = meta.words.shape[2]
    _tree_greedy_accept_kernel[(B,)](tokens, parents, num_nodes, meta.words, meta.depth, target_argmax, packed,
                                     accepted, advance, N, W, tokens.stride(0), parents.stride(0),
                                     target_argmax.stride(0), NP=triton.next_power_of_2(N),
                                     BLOCK_W=max(2, triton.next_power_of_2(W)))
    return GreedyAcceptance(packed, accepted, advance)
