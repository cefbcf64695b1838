"""KV compaction after acceptance: the K / V of each request's accepted path move to the positions right after its
committed ones, in path order, in place (every attention layer of a step in one launch)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..checks import check_cache_slots, check_kv_cache, check_lens_fit, check_rank, check_slot_range
from ..tree_meta import PATH_BLOCK, WORD_BITS, TreeMeta, accepted_path, path_chunk

__all__ = ["kv_commit"]


@triton.jit
def _kv_commit_kernel(
    KC, VC, Slots, Lens, Words, Accepted,
    skcl, skcp, skch, skcc, svcl, svcp, svch, svcc, swb, swn,
    B, N, D, NP: tl.constexpr, PB: tl.constexpr, BLOCK_D: tl.constexpr, WORD_BITS: tl.constexpr,
):  # fmt: skip
    """One program per (layer, request, kv head): the path root..a (``a = accepted[b]``) gathered PB nodes at a
    time in path order; path entry r (the node at depth r: trees are topological, so the path's nodes sorted by
    index are sorted by depth) moves from tree position ``L + j`` to ``L + r``. In place: a chunk's sources are all
    read before its targets are written (a barrier between), and a chunk's targets ``L + r < L + p0 + PB`` lie below
    every later source (``j >= r``)."""
    layer = (tl.program_id(0) // B).to(tl.int64)
    b = tl.program_id(0) % B
    h = tl.program_id(1)
    lanes = tl.arange(0, PB)  # [PB]
    offs_d = tl.arange(0, BLOCK_D)  # [BLOCK_D]
    slot = tl.load(Slots + b).to(tl.int64)
    L = tl.load(Lens + b).to(tl.int64)
    a = tl.load(Accepted + b)
    on_path, rank, path_len = accepted_path(Words + b * swb + a * swn, N, NP, WORD_BITS)  # [NP], [NP], scalar
    k_base = KC + layer * skcl + slot * skcp + h * skch
    v_base = VC + layer * svcl + slot * svcp + h * svch
    for p0 in range(0, path_len, PB):
        src = path_chunk(on_path, rank, p0, NP, PB)  # [PB] node at depth p0 + lane
        move = (p0 + lanes < path_len) & (src != p0 + lanes)  # [PB] on the path and not already in place
        m = move[:, None] & (offs_d < D)[None, :]  # [PB, BLOCK_D]
        kj = tl.load(k_base + (L + src)[:, None] * skcc + offs_d[None, :], mask=m)  # [PB, BLOCK_D]
        vj = tl.load(v_base + (L + src)[:, None] * svcc + offs_d[None, :], mask=m)  # [PB, BLOCK_D]
        tl.debug_barrier()  # the chunk's sources are read before its targets are written
        tl.store(k_base + (L + p0 + lanes)[:, None] * skcc + offs_d[None, :], kj, mask=m)
        tl.store(v_base + (L + p0 + lanes)[:, None] * svcc + offs_d[None, :], vj, mask=m)


def kv_commit(
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slots: torch.Tensor,
    cache_lens: torch.Tensor,
    meta: TreeMeta,
    accepted: torch.Tensor,
    *,
    validate: bool = True,
) -> None:
    """Compact each request's accepted path into its cache slot, in place.

    For request b with accepted node ``a = accepted[b]`` the K/V of the path root..a (tree positions
    ``cache_lens[b] + j``) move to ``cache_lens[b] + depth(j)``, in path order (trees topological: parents first).
    The caller then advances ``cache_lens[b]`` by ``depth(a) + 1`` (the model does this once for all layers).
    Layers run on the same trees commit in one launch: caches ``[G, P, HKV, C, D]`` (each layer's block laid out
    as one layer's cache).
    """
    if not isinstance(k_cache, torch.Tensor):
        raise TypeError(f"k_cache must be a torch.Tensor, got {type(k_cache).__name__}")
    device = k_cache.device
    layered = k_cache.ndim == 5
    if layered:
        if not isinstance(v_cache, torch.Tensor) or v_cache.shape != k_cache.shape:
            raise ValueError(f"v_cache must match k_cache {tuple(k_cache.shape)} in shape")
        k_caches, v_caches = k_cache, v_cache
        k_cache, v_cache = k_cache[0], v_cache[0]  # layer 0 stands for the shared checks
    check_rank("k_cache", k_cache, 4, (torch.float32, torch.bfloat16, torch.float16), device)
    P, HKV, C, D = k_cache.shape
    check_kv_cache(k_cache, v_cache, HKV, D, device)
    if not layered:
        k_caches, v_caches = k_cache[None], v_cache[None]
    words, depth = meta
    check_rank("meta.words", words, 3, (torch.int32,), device)
    B, N, W = words.shape
    check_rank("meta.depth", depth, 2, (torch.int32,), device)
    if depth.shape != (B, N) or not depth.is_contiguous() or words.stride(2) != 1:
        raise ValueError(f"meta.depth must be a contiguous [B, N] = {(B, N)} tensor")
    check_cache_slots(slots, cache_lens, B, device)
    check_rank("accepted", accepted, 1, (torch.int32,), device)
    if accepted.shape[0] != B:
        raise ValueError(f"accepted has shape {tuple(accepted.shape)}, expected [B] = [{B}]")
    if validate:
        acc_cpu = accepted.cpu()
        if bool(((acc_cpu < 0) | (acc_cpu >= N)).any()):
            b = int(torch.nonzero((acc_cpu < 0) | (acc_cpu >= N))[0, 0])
            raise ValueError(f"accepted[{b}] = {int(acc_cpu[b])} is not a node index in [0, {N})")
        check_slot_range(slots, P)
        check_lens_fit(cache_lens, None, N, C)
    _kv_commit_kernel[(k_caches.shape[0] * B, HKV)](
        k_caches, v_caches, slots, cache_lens, words, accepted.contiguous(),
        k_caches.stride(0), k_caches.stride(1), k_caches.stride(2), k_caches.stride(3),
        v_caches.stride(0), v_caches.stride(1), v_caches.stride(2), v_caches.stride(3),
        words.stride(0), words.stride(1), B, N, D,
        NP=max(16, triton.next_power_of_2(N)), PB=PATH_BLOCK, BLOCK_D=triton.next_power_of_2(D),
        WORD_BITS=WORD_BITS,
    )  # fmt: skip
