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
# (max nodes, dims): Hq = 4, Hkv = 2 has two kv heads each read by two query heads, so a wrong GQA map shows
ATTENTION_SCOPE = {
    "quick": ((5, {"Hq": 1, "Hkv": 1, "Dh": 2}), (4, {"Hq": 4, "Hkv": 2, "Dh": 2})),
    "full": ((6, {"Hq": 1, "Hkv": 1, "Dh": 2}), (6, {"Hq": 2, "Hkv": 1, "Dh": 2}), (6, {"Hq": 4, "Hkv": 2, "Dh": 2})),
}
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
    weight=4,
)
def attention_on_trees(ctx: Context) -> Outcome:
    import sympy

    attention = ctx.ref.need("attention")
    attention_scope = ATTENTION_SCOPE["quick" if ctx.quick else "full"]
    scope = {
        "trees": "; ".join(f"all {count_parent_arrays(n)} parent arrays with 1..{n} nodes (Hq={d['Hq']} "
                           f"Hkv={d['Hkv']})" for n, d in attention_scope) + ", every node",
        "dims": "; ".join(f"Hq={d['Hq']} Hkv={d['Hkv']} Dh={d['Dh']}" for _, d in attention_scope)
        + f"; cache length L in {set(ATTENTION_CACHE_LENGTHS)}",
        "numbers": "sympy expressions: every q, k, v, cache entry and the scale an independent symbol; exp symbolic; "
        "equal iff cancel(a - b) = 0",
    }
    cases = [(p, d, L) for max_nodes, d in attention_scope for n in range(1, max_nodes + 1)
             for p in all_parent_arrays(n) for L in ATTENTION_CACHE_LENGTHS]
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


# ---------------------------------------------------------------------------------------------------- layer commits
MODEL_COMMIT_MAX_NODES = {"quick": 4, "full": 5}
MODEL_COMMIT_CACHE_LENGTH = 2
MODEL_LAYERS = ("linear_attention", "full_attention", "linear_attention")


def commit_model(model_module: Any) -> Any:
    """A tiny hybrid model (GDN, attention, GDN; GDN H = 1, HV = 2, K = V = 2, conv kernel 4; attention 2 query heads,
    1 kv head, head dim 2): its weights do not enter a commit, only the layer layout and the cache shapes."""
    config = model_module.HybridConfig(
        vocab_size=4, hidden_size=4, intermediate_size=4, num_hidden_layers=len(MODEL_LAYERS),
        layer_types=MODEL_LAYERS, num_attention_heads=2, num_key_value_heads=1, head_dim=2, linear_key_head_dim=2,
        linear_value_head_dim=2, linear_num_key_heads=1, linear_num_value_heads=2, linear_conv_kernel_dim=4,
        num_experts=0, partial_rotary_factor=1.0,
    )
    return model_module.build_random(config, seed=0)


def _model_commit_case(ref: Any, model: Any, tree: TokenTree, length: int):
    """Symbolic records and caches for every layer of ``model``, and what sequential decoding of each path leaves:
    returns ``(records, layer caches, expected(node) -> per-layer dict of arrays)``."""
    from lumotree.reference.attention import AttentionTreeRecord, KVCache
    from lumotree.reference.gdn import GDNLayerCache, GDNTreeRecord

    N = tree.num_nodes
    gdn_spec, attention_spec = model._gdn_spec, model._attention_spec
    W, C = gdn_spec.conv_kernel, gdn_spec.conv_dim
    H, HV, K, V = gdn_spec.num_k_heads, gdn_spec.num_v_heads, gdn_spec.head_k_dim, gdn_spec.head_v_dim
    Hkv, Dh = attention_spec.num_kv_heads, attention_spec.head_dim
    shapes: dict[str, tuple[int, ...]] = {}
    for layer, kind in enumerate(MODEL_LAYERS):
        if kind == "linear_attention":
            shapes |= {f"x{layer}": (N, C), f"cs{layer}": (W - 1, C), f"q{layer}": (N, H, K), f"k{layer}": (N, H, K),
                       f"v{layer}": (N, HV, V), f"a{layer}": (N, HV), f"b{layer}": (N, HV), f"s{layer}": (HV, K, V)}
        else:
            shapes |= {f"kc{layer}": (length, Hkv, Dh), f"vc{layer}": (length, Hkv, Dh), f"kt{layer}": (N, Hkv, Dh),
                       f"vt{layer}": (N, Hkv, Dh)}
    x: dict[str, np.ndarray] = {}
    scale = {}
    for layer in range(len(MODEL_LAYERS)):  # one ring per layer: layers never mix, and small rings are fast
        own = {name: shape for name, shape in shapes.items() if name.endswith(str(layer))}
        names = [f"{name}_{'_'.join(map(str, idx))}" for name, shape in own.items() for idx in np.ndindex(*shape)]
        _, gens = polynomial_ring(names + ["scale"])
        values = iter(gens)
        x |= {name: np.array([next(values) for _ in range(int(np.prod(shape)))], dtype=object).reshape(shape)
              for name, shape in own.items()}
        scale[layer] = next(values)
    records, caches, expected = [], [], []
    for layer, kind in enumerate(MODEL_LAYERS):
        if kind == "linear_attention":
            gdn_in = tuple(x[f"{n}{layer}"] for n in "qkvabs")
            _, factors = ref.tree_closed_form(*gdn_in, tree, scale=scale[layer])
            _, states = ref.tree_recurrent(*gdn_in, tree, scale=scale[layer])
            records.append(GDNTreeRecord(conv_inputs=x[f"x{layer}"], factors=factors))
            caches.append(GDNLayerCache(conv_state=x[f"cs{layer}"], state=x[f"s{layer}"]))
            expected.append(lambda a, layer=layer, states=states: {
                "state": states[a],
                "conv_state": sequential_conv(x[f"x{layer}"][tree.path(a)], x[f"cs{layer}"],
                                              np.ones((C, W), dtype=int))[1],
            })
        else:
            records.append(AttentionTreeRecord(keys=x[f"kt{layer}"], values=x[f"vt{layer}"]))
            caches.append(KVCache(x[f"kc{layer}"], x[f"vc{layer}"]))
            expected.append(lambda a, layer=layer: {
                "keys": np.concatenate([x[f"kc{layer}"], x[f"kt{layer}"][tree.path(a)]], axis=0),
                "values": np.concatenate([x[f"vc{layer}"], x[f"vt{layer}"][tree.path(a)]], axis=0),
            })
    return records, caches, expected


@check(
    "commit/layers",
    claim="the hybrid model's commit (HybridModel.commit_pass, through gdn_layer_commit and attention_layer_commit) "
    "leaves every layer's cache as sequential decoding of the accepted path: recurrent state, conv state, KV cache, "
    "length",
    docs=DOCS,
    weight=2,
)
def model_commit(ctx: Context) -> Outcome:
    model_module = ctx.ref.need("model")
    model = commit_model(model_module)
    max_nodes = MODEL_COMMIT_MAX_NODES["quick" if ctx.quick else "full"]
    shapes = [p for n in range(1, max_nodes + 1) for p in all_parent_arrays(n)]
    scope = {
        "trees": f"all {len(shapes)} parent arrays with 1..{max_nodes} nodes, every accepted node",
        "dims": f"layers {', '.join(MODEL_LAYERS)}; GDN H=1 HV=2 K=2 V=2, conv kernel 4 (8 channels); attention "
        f"Hkv=1 Dh=2; committed cache length {MODEL_COMMIT_CACHE_LENGTH}",
        "numbers": "sympy QQ[...] polynomials: every record, cache and GDN input entry an independent symbol",
    }
    committed = 0
    for parents in ctx.cases(shapes, note="shapes"):
        tree = TokenTree(parents)
        records, caches, expected = _model_commit_case(ctx.ref, model, tree, MODEL_COMMIT_CACHE_LENGTH)
        for node in range(tree.num_nodes):
            cache = model_module.HybridCache([c.copy() for c in caches], MODEL_COMMIT_CACHE_LENGTH)
            tree_pass = model_module.TreePass(None, tuple(records), tuple([0] * tree.num_nodes), tree, cache.uid,
                                              cache.version)
            try:
                model.commit_pass(tree_pass, node, cache)
            except (ArithmeticError, IndexError, ValueError, TypeError) as err:  # decoding the path is defined
                return Outcome("refuted", scope, detail=f"committing node {node} of {list(parents)} raised "
                               f"{type(err).__name__}: {err}", counterexample={"tree": list(parents), "node": node,
                                                                              "error": repr(err)})
            committed += 1
            want_length = MODEL_COMMIT_CACHE_LENGTH + len(tree.path(node))
            diffs = [("length", cache.length, want_length)] if cache.length != want_length else []
            for layer, (layer_cache, want) in enumerate(zip(cache.layers, expected)):
                for field_name, array in want(node).items():
                    got = np.asarray(getattr(layer_cache, field_name), dtype=object)
                    if got.shape != array.shape or any(a != b for a, b in zip(got.flat, array.flat)):
                        diffs.append((f"layer {layer} ({MODEL_LAYERS[layer]}) {field_name}", show(got), show(array)))
            if diffs:
                what, got, want = diffs[0]
                return Outcome(
                    "refuted",
                    scope,
                    detail=f"after committing node {node} of {list(parents)}: {what} differs from sequential decoding",
                    counterexample={"tree": list(parents), "node": node, "path": tree.path(node), "which": what,
                                    "committed": got, "sequential": want},
                )
    return Outcome("proved", scope, detail=f"{committed} (shape, accepted node) commits: every layer as decoding")
