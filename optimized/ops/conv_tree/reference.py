"""Torch references of the tree conv kernels, batched like them (any device, any float dtype): node i's window
by explicit gathers (:func:`tree_conv_ref`) and the conv state after acceptance (:func:`tree_conv_commit_ref`)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from lumotree.reference.tree import TokenTree

from ..tree_meta import token_trees

__all__ = ["tree_conv_ref", "tree_conv_commit_ref"]


def _conv_windows(tree: TokenTree, width: int) -> list[list[int]]:
    """Node i's window, oldest first, as indices into ``concat(conv_state [W - 1 rows], inputs)``."""
    out = []
    for i in range(tree.num_nodes):
        lineage, node = [], i
        while node >= 0 and len(lineage) < width:
            lineage.append(width - 1 + node)
            node = tree.parents[node]
        missing = width - len(lineage)
        out.append(list(range(width - 1 - missing, width - 1)) + lineage[::-1])
    return out


def tree_conv_ref(x, weight, conv_pool, slots, parents, *, bias=None, num_nodes=None, activation="silu"):
    """Tree-window depthwise conv by explicit windows: ``[B, N, C]`` (padding zeros), in the promoted dtype."""
    B, N, C = x.shape
    width = weight.shape[1]
    dtype = torch.promote_types(x.dtype, weight.dtype)
    out = torch.zeros((B, N, C), dtype=dtype, device=x.device)
    for b, tree in enumerate(token_trees(parents, num_nodes)):
        n = tree.num_nodes
        sources = torch.cat([conv_pool[int(slots[b])].to(dtype), x[b, :n].to(dtype)])  # [W - 1 + n, C]
        windows = sources[torch.tensor(_conv_windows(tree, width), device=x.device)]  # [n, W, C]
        y = (windows * weight.to(dtype).T[None]).sum(1)  # [n, C]
        if bias is not None:
            y = y + bias.to(dtype)
        out[b, :n] = F.silu(y) if activation == "silu" else y
    return out


def tree_conv_commit_ref(conv_pool, slots, x, parents, accepted, *, num_nodes=None):
    """Out of place: the new conv states ``[B, W - 1, C]`` (last ``W - 1`` inputs on the path to ``accepted``)."""
    width = conv_pool.shape[1] + 1
    out = []
    for b, tree in enumerate(token_trees(parents, num_nodes)):
        n = tree.num_nodes
        sources = torch.cat([conv_pool[int(slots[b])], x[b, :n].to(conv_pool.dtype)])  # [W - 1 + n, C]
        out.append(sources[torch.tensor(_conv_windows(tree, width)[int(accepted[b])][1:], device=x.device)])
    return torch.stack(out)
