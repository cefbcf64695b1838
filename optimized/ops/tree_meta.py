r"""Tree metadata of a batch of draft trees, built once per step and shared by every layer and every op.

A batch holds ``B`` trees of up to ``N`` nodes, each a parent array in topological order (``parents: [B, N]``,
``parents[b, 0] == -1``, ``0 <= parents[b, i] < i``; with ``num_nodes: [B]`` only the first ``num_nodes[b]``
entries are real). :func:`tree_metadata` turns it into ``words: [B, N, ceil(N/32)]`` int32, the inclusive ancestor
bitsets (bit ``j % 32`` of word ``j // 32`` of row ``i`` is ``M[i, j]``: the layout of
:func:`lumotree.reference.tree.ancestor_words`), and ``depth: [B, N]`` int32. The device helpers below
(:func:`accepted_path` and its pieces, :func:`path_chunk`, :func:`tree_size`) read them inside the kernels with
exactly the arithmetic of :func:`lumotree.reference.tree.mask_bit`: ``(words[i][j // 32] >> (j % 32)) & 1``.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from lumotree.reference.tree import TokenTree

from .checks import check_num_nodes, check_tensor, check_tree_rows

__all__ = [
    "WORD_BITS",
    "PATH_BLOCK",
    "TreeMeta",
    "tree_metadata",
    "tree_metadata_buffers",
    "tree_metadata_program",
    "check_meta",
    "accepted_path",
    "ancestor_words",
    "path_of_words",
    "path_chunk",
    "tree_size",
    "token_trees",
]

WORD_BITS = 32  # lumotree.reference.tree.WORD_BITS
PATH_BLOCK = 16  # commits: accepted-path nodes gathered per chunk (path_chunk; a tl.dot in the GDN commit)


class TreeMeta(NamedTuple):
    """Per-step tree metadata shared by every layer: ``words [B, N, W]`` int32 inclusive ancestor bitsets
    (``W = ceil(N / 32)``) and ``depth [B, N]`` int32 (root 0)."""

    words: torch.Tensor
    depth: torch.Tensor


@triton.jit
def tree_metadata_program(b, Parents, NumNodes, Words, Depth, N, s_pb, s_pn, W, NP: tl.constexpr,
                          BLOCK_W: tl.constexpr, ROUNDS: tl.constexpr, HAS_NUM: tl.constexpr):
    """Request ``b``'s tree, every node at once by pointer jumping (``ROUNDS = ceil(log2 N)`` rounds, all in
    registers): ``words[i] = bit(i) | words[parent(i)] | ...`` and ``depth[i]`` = the number of ancestors. Round r
    ORs in (adds) the words (depth) of the ancestor ``jump[i]`` at distance ``2^r`` and doubles the jump, so after it
    ``words[i]`` holds the path up to distance ``2^(r+1) - 1``. Nodes past ``num_nodes[b]`` (``HAS_NUM``) are read as
    a chain below the last real node (their parents are not read; their rows are never used). Called by
    :func:`_tree_metadata_kernel` and by the model's step prologue (one launch less a tree step)."""
    node = tl.arange(0, NP)  # [NP]
    node_ok = node < N
    real = node_ok
    if HAS_NUM:
        real = node_ok & (node < tl.load(NumNodes + b))
    parent = tl.load(Parents + b * s_pb + node * s_pn, mask=real, other=0).to(tl.int32)  # [NP]
    jump = tl.where(real, parent, node - 1)  # [NP] the ancestor 2^r steps up (-1: none)
    offs_w = tl.arange(0, BLOCK_W)  # [BLOCK_W]
    bit = tl.full([NP, BLOCK_W], 1, tl.int32) << (node % 32)[:, None]  # [NP, BLOCK_W] bit 31 -> sign bit
    words = tl.where(offs_w[None, :] == (node // 32)[:, None], bit, 0)  # [NP, BLOCK_W]
    depth = tl.where(jump >= 0, 1, 0)  # [NP]
    for _ in tl.static_range(ROUNDS):
        up = jump >= 0  # [NP]
        src = tl.maximum(jump, 0)  # [NP]
        words = words | tl.where(up[:, None], tl.gather(words, tl.broadcast_to(src[:, None], [NP, BLOCK_W]), 0), 0)
        depth = depth + tl.where(up, tl.gather(depth, src, 0), 0)
        jump = tl.where(up, tl.gather(jump, src, 0), -1)
    tl.store(Words + (b * N + node[:, None]) * W + offs_w[None, :], words,
             mask=node_ok[:, None] & (offs_w < W)[None, :])
    tl.store(Depth + b * N + node, depth, mask=node_ok)


@triton.jit
def _tree_metadata_kernel(Parents, NumNodes, Words, Depth, N, s_pb, s_pn, W, NP: tl.constexpr, BLOCK_W: tl.constexpr,
                          ROUNDS: tl.constexpr, HAS_NUM: tl.constexpr):
    """One program per request: :func:`tree_metadata_program`."""
    tree_metadata_program(tl.program_id(0).to(tl.int64), Parents, NumNodes, Words, Depth, N, s_pb, s_pn, W, NP,
                          BLOCK_W, ROUNDS, HAS_NUM)


def tree_metadata_buffers(B: int, N: int, device: torch.device) -> tuple[TreeMeta, dict]:
    """The outputs ``words [B, N, W]`` and ``depth [B, N]`` of :func:`tree_metadata_program` and its constexprs."""
    W = (N + WORD_BITS - 1) // WORD_BITS
    words = torch.empty((B, N, W), dtype=torch.int32, device=device)  # [B, N, W]
    depth = torch.empty((B, N), dtype=torch.int32, device=device)  # [B, N]
    consts = dict(NP=triton.next_power_of_2(N), BLOCK_W=max(2, triton.next_power_of_2(W)),
                  ROUNDS=max(1, (N - 1).bit_length()))
    return TreeMeta(words, depth), consts


def tree_metadata(parents: torch.Tensor, *, num_nodes: torch.Tensor | None = None, validate: bool = True
                  ) -> TreeMeta:
    """Ancestor bitsets and depths for a batch of trees ``parents: [B, N]`` (int32/int64, any strides, each row a
    valid tree; with ``num_nodes: [B]`` only its first ``num_nodes[b]`` entries, the rest
    read as a chain below the last real node).

    Mirrors :func:`lumotree.reference.tree.ancestor_words` word for word, in one launch. ``validate`` checks the
    trees first (one device-to-host copy; switch it off inside CUDA-graph capture, after checking the same trees
    once).
    """
    device = parents.device if isinstance(parents, torch.Tensor) else torch.device("cpu")
    check_tensor("parents", parents, (None, None), "B, N", (torch.int32, torch.int64), device, last_contiguous=False)
    B, N = parents.shape
    if N < 1:
        raise ValueError(f"parents has N = {N} nodes per request: a tree has at least its root")
    if num_nodes is not None:
        num_nodes = check_num_nodes(num_nodes, B, N, device, validate)
    if validate:
        check_tree_rows(parents, num_nodes)
    meta, consts = tree_metadata_buffers(B, N, device)
    _tree_metadata_kernel[(B,)](parents, num_nodes if num_nodes is not None else parents, meta.words, meta.depth, N,
                                parents.stride(0), parents.stride(1), meta.words.shape[2],
                                HAS_NUM=num_nodes is not None, **consts)
    return meta


def check_meta(meta: object, B: int, N: int, device: torch.device) -> TreeMeta:
    """``meta``: the :class:`TreeMeta` of this step's ``[B, N]`` trees (from :func:`tree_metadata`)."""
    if not isinstance(meta, TreeMeta):
        raise TypeError(f"meta must be a TreeMeta (from tree_metadata()), got {type(meta).__name__}")
    W = (N + WORD_BITS - 1) // WORD_BITS
    check_tensor("meta.words", meta.words, (B, N, W), "B, N, ceil(N/32)", (torch.int32,), device, contiguous=True)
    check_tensor("meta.depth", meta.depth, (B, N), "B, N", (torch.int32,), device, contiguous=True)
    return meta


@triton.jit
def accepted_path(word_row_ptr, n_valid, NP: tl.constexpr, WORD_BITS: tl.constexpr):
    """The path root..a of one request, from row a of its inclusive ancestor bitsets (``word_row_ptr`` at
    ``words[b, a]``; nodes ``>= n_valid`` not read): ``(on_path [NP], rank [NP], path_len)`` with ``on_path[j] =
    (words[a][j // WORD_BITS] >> (j % WORD_BITS)) & 1`` (the arithmetic of ``lumotree.reference.tree.mask_bit``,
    literally) and ``rank[j]`` node j's position on the path, i.e. its depth (trees are topological)."""
    return path_of_words(ancestor_words(word_row_ptr, n_valid, NP, WORD_BITS), NP, WORD_BITS)


@triton.jit
def ancestor_words(word_row_ptr, n_valid, NP: tl.constexpr, WORD_BITS: tl.constexpr):
    """``[NP]``: the bitset word that holds node j's bit, for each node j (0 for ``j >= n_valid``): the load of
    :func:`accepted_path`, for a kernel that issues it early."""
    nodes = tl.arange(0, NP)  # [NP]
    return tl.load(word_row_ptr + nodes // WORD_BITS, mask=nodes < n_valid, other=0)  # [NP]


@triton.jit
def path_of_words(word, NP: tl.constexpr, WORD_BITS: tl.constexpr):
    """``(on_path, rank, path_len)`` of :func:`accepted_path` from its :func:`ancestor_words`."""
    nodes = tl.arange(0, NP)  # [NP]
    on_path = ((word >> (nodes % WORD_BITS)) & 1) != 0  # [NP]
    return on_path, tl.cumsum(on_path.to(tl.int32), axis=0) - 1, tl.sum(on_path.to(tl.int32), axis=0)


@triton.jit
def tree_size(num_nodes_ptr, b, N, HAS_NUM: tl.constexpr):
    """Request ``b``'s node count: ``num_nodes[b]``, or N when the caller gave no sizes (``HAS_NUM`` False: every
    tree has N nodes, and no sizes tensor is made: the kernels of the GDN verify, its commit and the tree conv)."""
    if HAS_NUM:
        n_b = tl.load(num_nodes_ptr + b)
    else:
        n_b = N
    return n_b


@triton.jit
def path_chunk(on_path, rank, p0, NP: tl.constexpr, PB: tl.constexpr):
    """``[PB]`` node indices of path entries ``p0 .. p0 + PB - 1`` (of :func:`accepted_path`; 0 past its end)."""
    nodes = tl.arange(0, NP)  # [NP]
    lanes = tl.arange(0, PB)  # [PB]
    pick = on_path[None, :] & (rank[None, :] == p0 + lanes[:, None])  # [PB, NP]
    return tl.sum(tl.where(pick, nodes[None, :], 0), axis=1)  # [PB]


def token_trees(parents: torch.Tensor, num_nodes: torch.Tensor | None = None) -> list[TokenTree]:
    """The batch's trees as reference :class:`~lumotree.reference.tree.TokenTree` s (host side; the torch
    references' view of a ``[B, N]`` batch with optional sizes)."""
    B, N = parents.shape
    sizes = [N] * B if num_nodes is None else [int(n) for n in num_nodes.cpu()]
    rows = parents.cpu().tolist()
    return [TokenTree(rows[b][: sizes[b]]) for b in range(B)]
