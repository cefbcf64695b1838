"""5. Short convolution and attention on trees, and the conv-state / KV compaction after a commit.

The reference's tree functions (``reference/gdn.py``: ``short_conv``, ``conv_state_commit``;
``reference/attention.py``: ``tree_attention_core``, ``kv_commit``) run on independent symbols, and are compared with
the *sequential* computation along the path root..i written out independently here: what decoding the path's tokens
one at a time from the committed conv state / KV cache computes.

- ``conv/sympy``: ``short_conv(...)[i]`` = the causal depthwise conv (HF ``conv1d`` with the conv state as left
  context) run over the path's inputs, last output; ``conv_state_commit(..., a)`` = the last ``W - 1`` rows of
  ``conv_state ++ inputs[path(a)]`` (what sequential decoding leaves). Polynomials in ``QQ[...]``.
- ``attention/sympy``: ``tree_attention_core(...)[i]`` = softmax attention of node i's query over the cache followed by
  the path's keys/values, with ``exp`` kept symbolic (``sympy.exp`` of symbolic scores); ``kv_commit(..., a)`` = the
  cache after appending the path's K/V in order.
"""

from __future__ import annotations

import random
from typing import Any

import numpy as np

from lumotree.reference.tree import TokenTree

from .core import Context, Outcome, check
from .exact import all_parent_arrays, count_parent_arrays, polynomial_ring, show

DOCS = "tree-layers.md"
CONV_MAX_NODES = {"quick": 5, "full": 6}
CONV_KERNELS = (1, 2, 3, 4)
CONV_CHANNELS = 2
ATTENTION_MAX_NODES = {"quick": 5, "full": 6}
ATTENTION_DIMS = ({"Hq": 1, "Hkv": 1, "Dh": 2}, {"Hq": 2, "Hkv": 1, "Dh": 2})
ATTENTION_CACHE_LENGTHS = (0, 2)


# ---------------------------------------------------------------------------------------------------- conv
def sequential_conv(sequence: np.ndarray, conv_state: np.ndarray, weight: np.ndarray) -> tuple[list, np.ndarray]:
    """Decode ``sequence: [T, C]`` token by token through a depthwise causal conv of width ``W``.

    ``y_t[c] = sum_{j < W} weight[c, j] * x_{t - W + 1 + j}[c]`` where ``x_{-1}, x_{-2}, ...`` are the rows of
    ``conv_state: [W - 1, C]`` newest last. Returns the outputs ``[T][C]`` and the final conv state (the last
    ``W - 1`` rows seen).
    """
    W = weight.shape[1]
    history = [row for row in conv_state] + [row for row in sequence]  # oldest first
    outputs = []
    for t in range(len(sequence)):
        window = history[t : t + W]  # x_{t-W+1} .. x_t
        outputs.append([sum((window[j][c] * weight[c, j] for j in range(W)), 0) for c in range(weight.shape[0])])
    tail = history[len(history) - (W - 1) :] if W > 1 else []
    state = np.array(tail, dtype=object).reshape(W - 1, conv_state.shape[1])  # [W - 1, C]
    return outputs, state


@check(
    "conv/sympy",
    claim="the tree-window short conv at node i and the conv state after committing node a equal sequential decoding "
    "of the path root..i (root..a)",
    docs=DOCS,
)
def conv_on_trees(ctx: Context) -> Outcome:
    layer = ctx.ref.need("layer")
    max_nodes = CONV_MAX_NODES["quick" if ctx.quick else "full"]
    shapes = [p for n in range(1, max_nodes + 1) for p in all_parent_arrays(n)]
    scope = {
        "trees": f"all {count_parent_arrays(max_nodes)} parent arrays with 1..{max_nodes} nodes, every node",
        "dims": f"kernel W in {set(CONV_KERNELS)}, C = {CONV_CHANNELS} channels",
        "numbers": "sympy QQ[...] polynomials: every input, conv-state and weight entry an independent symbol",
    }
    cases = [(p, W) for p in shapes for W in CONV_KERNELS]
    for parents, W in ctx.cases(cases, note="shapes x kernel widths"):
        tree = TokenTree(parents)
        N, C = tree.num_nodes, CONV_CHANNELS
        names = (
            [f"x_{i}_{c}" for i in range(N) for c in range(C)]
            + [f"state_{r}_{c}" for r in range(W - 1) for c in range(C)]
            + [f"w_{c}_{j}" for c in range(C) for j in range(W)]
        )
        _, gens = polynomial_ring(names)
        inputs = np.array(gens[: N * C], dtype=object).reshape(N, C)  # [N, C]
        conv_state = np.array(gens[N * C : N * C + (W - 1) * C], dtype=object).reshape(W - 1, C)  # [W - 1, C]
        weight = np.array(gens[N * C + (W - 1) * C :], dtype=object).reshape(C, W)  # [C, W]
        tree_out = layer.short_conv(inputs, conv_state, weight, tree)  # [N, C]
        for i in range(N):
            path = tree.path(i)
            outputs, state_after = sequential_conv(inputs[path], conv_state, weight)
            committed = layer.conv_state_commit(inputs, conv_state, tree, i)
            for what, got, want in (
                (f"short_conv[{i}]", np.asarray(tree_out[i], dtype=object), np.array(outputs[-1], dtype=object)),
                (f"conv_state_commit(node {i})", np.asarray(committed, dtype=object), state_after),
            ):
                if got.shape != want.shape or any(a != b for a, b in zip(got.flat, want.flat)):
                    return Outcome(
                        "refuted",
                        scope,
                        detail=f"{what} differs from sequential decoding of path {path} (W = {W})",
                        counterexample={
                            "tree": list(parents),
                            "kernel": W,
                            "node": i,
                            "path": path,
                            "which": what,
                            "reference": show(got),
                            "sequential": show(want),
                        },
                    )
    return Outcome("proved", scope, detail=f"{len(cases)} (shape, kernel) cases, every node: outputs and conv states")


# ---------------------------------------------------------------------------------------------------- attention
def sequential_attention(q_i, k_cache, v_cache, k_path, v_path, scale, exp, group: int) -> np.ndarray:
    """One decoding step's attention: query ``q_i: [Hq, Dh]`` over the cache followed by the path's keys/values
    (``[L, Hkv, Dh]``, ``[d + 1, Hkv, Dh]``). ``o_h = sum_j exp(scale q_h . k_j) v_j / sum_j exp(scale q_h . k_j)``,
    kv head ``h // group``."""
    keys = list(k_cache) + list(k_path)
    values = list(v_cache) + list(v_path)
    Hq, Dh = q_i.shape
    out = np.empty((Hq, Dh), dtype=object)
    for h in range(Hq):
        g = h // group
        weights = [exp(sum((q_i[h, d] * key[g, d] for d in range(Dh)), 0) * scale) for key in keys]
        total = sum(weights, 0)
        for d in range(Dh):
            out[h, d] = sum((w * value[g, d] for w, value in zip(weights, values)), 0) / total
    return out


@check(
    "attention/sympy",
    claim="ancestor-masked tree attention at node i and the KV cache after committing node a equal sequential "
    "decoding of the path root..i (root..a); softmax with exp kept symbolic",
    docs=DOCS,
)
def attention_on_trees(ctx: Context) -> Outcome:
    import sympy

    attention = ctx.ref.need("attention")
    max_nodes = ATTENTION_MAX_NODES["quick" if ctx.quick else "full"]
    shapes = [p for n in range(1, max_nodes + 1) for p in all_parent_arrays(n)]
    scope = {
        "trees": f"all {count_parent_arrays(max_nodes)} parent arrays with 1..{max_nodes} nodes, every node",
        "dims": "; ".join(f"Hq={d['Hq']} Hkv={d['Hkv']} Dh={d['Dh']}" for d in ATTENTION_DIMS)
        + f"; cache length L in {set(ATTENTION_CACHE_LENGTHS)}",
        "numbers": "sympy expressions: every q, k, v, cache entry and the scale an independent symbol; exp symbolic; "
        "equal iff cancel(a - b) = 0",
    }
    cases = [(p, d, L) for p in shapes for d in ATTENTION_DIMS for L in ATTENTION_CACHE_LENGTHS]
    for parents, dims, L in ctx.cases(cases, note="shapes x dims x cache"):
        tree = TokenTree(parents)
        N, Hq, Hkv, Dh = tree.num_nodes, dims["Hq"], dims["Hkv"], dims["Dh"]
        x = _symbol_arrays(
            {"q": (N, Hq, Dh), "kc": (L, Hkv, Dh), "vc": (L, Hkv, Dh), "kt": (N, Hkv, Dh), "vt": (N, Hkv, Dh)}
        )
        scale = sympy.Symbol("scale")
        try:
            out = attention.tree_attention_core(x["q"], x["kc"], x["vc"], x["kt"], x["vt"], tree, scale, exp=sympy.exp)
        except (ArithmeticError, ValueError, IndexError) as err:  # sequential decoding is defined on every such input
            return Outcome(
                "refuted",
                scope,
                detail=f"tree_attention_core raised {type(err).__name__}: {err} where sequential decoding is defined",
                counterexample={"tree": list(parents), "dims": dims, "cache_length": L, "error": repr(err)},
            )
        for i in range(N):
            path = tree.path(i)
            want = sequential_attention(x["q"][i], x["kc"], x["vc"], x["kt"][path], x["vt"][path], scale, sympy.exp,
                                        Hq // Hkv)
            for idx in np.ndindex(Hq, Dh):
                if sympy.cancel(out[i][idx] - want[idx]) != 0:
                    return Outcome(
                        "refuted",
                        scope,
                        detail=f"tree_attention_core[{i}, {idx[0]}, {idx[1]}] differs from sequential decoding of "
                        f"path {path}",
                        counterexample=_attention_counterexample(attention, tree, dims, L, i, idx),
                    )
            try:
                k_new, v_new = attention.kv_commit(x["kc"], x["vc"], x["kt"], x["vt"], tree, i)
            except (ArithmeticError, ValueError, IndexError) as err:  # the sequential cache is defined
                return Outcome(
                    "refuted",
                    scope,
                    detail=f"kv_commit(node {i}) raised {type(err).__name__}: {err} where sequential decoding is "
                    "defined",
                    counterexample={"tree": list(parents), "cache_length": L, "node": i, "error": repr(err)},
                )
            k_seq = np.concatenate([x["kc"], x["kt"][path]], axis=0)  # [L + d + 1, Hkv, Dh]
            v_seq = np.concatenate([x["vc"], x["vt"][path]], axis=0)
            for what, got, want_cache in (("keys", k_new, k_seq), ("values", v_new, v_seq)):
                got = np.asarray(got, dtype=object)
                if got.shape != want_cache.shape or any(a != b for a, b in zip(got.flat, want_cache.flat)):
                    return Outcome(
                        "refuted",
                        scope,
                        detail=f"kv_commit(node {i}) {what} differ from the cache after decoding path {path}",
                        counterexample={
                            "tree": list(parents),
                            "cache_length": L,
                            "node": i,
                            "path": path,
                            f"kv_commit {what}": show(got),
                            f"sequential {what}": show(want_cache),
                        },
                    )
    return Outcome("proved", scope, detail=f"{len(cases)} (shape, dims, cache) cases, every node: outputs and caches")


def _symbol_arrays(shapes: dict[str, tuple[int, ...]]) -> dict[str, np.ndarray]:
    import sympy

    out = {}
    for name, shape in shapes.items():
        arr = np.empty(shape, dtype=object)
        for idx in np.ndindex(*shape):
            arr[idx] = sympy.Symbol("_".join([name, *map(str, idx)]))
        out[name] = arr
    return out


def _attention_counterexample(attention: Any, tree: TokenTree, dims: dict, L: int, node: int, idx) -> dict[str, Any]:
    """Small-integer float inputs where the reference and sequential decoding differ numerically."""
    import math

    rng = random.Random(node)
    N, Hq, Hkv, Dh = tree.num_nodes, dims["Hq"], dims["Hkv"], dims["Dh"]
    example: dict[str, Any] = {"tree": list(tree.parents), "dims": dims, "cache_length": L, "node": node}
    for _ in range(32):
        x = {
            name: np.array([float(rng.randint(-2, 2)) for _ in range(int(np.prod(shape)))]).reshape(shape)
            for name, shape in {
                "q": (N, Hq, Dh), "kc": (L, Hkv, Dh), "vc": (L, Hkv, Dh), "kt": (N, Hkv, Dh), "vt": (N, Hkv, Dh)
            }.items()
        }
        out = attention.tree_attention_core(x["q"], x["kc"], x["vc"], x["kt"], x["vt"], tree, 0.5)
        path = tree.path(node)
        want = sequential_attention(x["q"][node], x["kc"], x["vc"], x["kt"][path], x["vt"][path], 0.5, math.exp,
                                    Hq // Hkv)
        if abs(float(out[node][idx]) - float(want[idx])) > 1e-9:
            return example | {
                "inputs": show(x),
                "scale": 0.5,
                "entry": list(idx),
                "reference": float(out[node][idx]),
                "sequential": float(want[idx]),
            }
    return example
