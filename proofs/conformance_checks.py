"""The float64 code around the exact cores, run: the attention and GDN layers and the hybrid model on draft trees.

The layers project, normalise and rotate in float64 (square roots, ``exp``, ``cos``), so these checks compare numbers
to a tolerance on seeded random weights (status ``checked``), on every tree shape up to a size and on deep trees:

- ``layers/attention``: every node's keys carry RoPE at position ``cache length + depth`` (the depth counted here
  along the parent walk, the rotation by the reference's ``rope_cos_sin`` / ``apply_rope``), every node's output is
  the output of decoding its path token by token from the cache, and the layer commit leaves the cache decoding
  leaves;
- ``layers/gdn``: the same for the GDN layer (projections, tree convolution, gates, closed form, gated norm) and its
  commit (conv state and recurrent state);
- ``model/tree-pass``: ``HybridModel.verify_tree`` logits of every node = the logits of decoding its path with
  ``forward``, and ``HybridModel.commit`` leaves every layer cache and the length as that decoding does.

Decoding token by token is the chain path of each layer (``*_layer_chain`` with one token), so a position, window,
ancestor or commit mistake in the tree path shows as a difference of order one against rounding of order 1e-15.
"""

from __future__ import annotations

import random
from typing import Any

import numpy as np

from lumotree.reference.tree import TokenTree

from .core import Context, Outcome, check
from .exact import all_parent_arrays
from .gdn_checks import deep_parent_array
from .index_checks import walk

DOCS = "tree-layers.md"
TOLERANCE = 1e-9
MAX_NODES = {"quick": 4, "full": 5}
DEEP = {"quick": (("deep-wide", 24),), "full": (("chain", 40), ("deep-wide", 40), ("broom", 24))}
CACHE_LENGTHS = (0, 3)


def _shapes(ctx: Context) -> list[tuple[int, ...]]:
    max_nodes = MAX_NODES["quick" if ctx.quick else "full"]
    rng = random.Random(2)
    return [p for n in range(1, max_nodes + 1) for p in all_parent_arrays(n)] + [
        deep_parent_array(kind, n, rng) for kind, n in DEEP["quick" if ctx.quick else "full"]
    ]


def _scope(ctx: Context, shapes: list, dims: str) -> dict[str, str]:
    max_nodes = MAX_NODES["quick" if ctx.quick else "full"]
    deep = "; ".join(f"a {kind} of {n} nodes" for kind, n in DEEP["quick" if ctx.quick else "full"])
    return {
        "trees": f"all parent arrays with 1..{max_nodes} nodes and {deep} ({len(shapes)} trees), every node",
        "dims": dims,
        "numbers": f"float64, seeded random weights and inputs; agreement to {TOLERANCE:g} (relative to the values' "
        "scale)",
    }


def _differs(got: Any, want: Any) -> float:
    got, want = np.asarray(got, dtype=np.float64), np.asarray(want, dtype=np.float64)
    if got.shape != want.shape:
        return float("inf")
    return float(np.abs(got - want).max(initial=0.0) / max(1.0, np.abs(want).max(initial=0.0)))


def _weights(rng: np.random.Generator, shapes: dict[str, tuple[int, ...]], one: tuple[str, ...] = ()) -> dict:
    """Projections ``N(0, 1 / fan_in)``, norm weights ``N(0, 0.1^2)`` (``1 + ...`` for the names in ``one``)."""
    out = {}
    for name, shape in shapes.items():
        if len(shape) == 2:
            out[name] = rng.standard_normal(shape) / np.sqrt(shape[-1])
        else:
            out[name] = rng.normal(0.0, 0.1, shape) + (1.0 if name in one else 0.0)
    return out


def _decode_path(chain: Any, cache: Any, x: np.ndarray, path: list[int]) -> tuple[np.ndarray, Any]:
    """Decode the path's tokens one at a time from ``cache``: (last output ``[D]``, the cache after them)."""
    out = None
    for j in path:
        rows, cache = chain(x[j : j + 1], cache)
        out = rows[0]
    return out, cache


RAISES = (ArithmeticError, IndexError, ValueError, TypeError)


def _first_mismatch(pairs: dict[str, tuple[Any, Any]]) -> tuple[str, float] | None:
    for name, (got, want) in pairs.items():
        error = _differs(got, want)
        if not error <= TOLERANCE:
            return name, error
    return None


# ---------------------------------------------------------------------------------------------------- attention
@check(
    "layers/attention",
    claim="the attention layer on a tree: keys rotated at cache length + depth, outputs and the committed KV cache as "
    "decoding each path token by token",
    expected="checked",
    docs=DOCS,
)
def attention_layer(ctx: Context) -> Outcome:
    attention = ctx.ref.need("attention")
    spec = attention.AttentionSpec(hidden_size=8, num_heads=4, num_kv_heads=2, head_dim=4, rotary_dim=2,
                                   rope_theta=100.0)
    rng = np.random.default_rng(11)
    weights = attention.AttentionWeights(**_weights(rng, spec.weight_shapes()))
    shapes = _shapes(ctx)
    scope = _scope(ctx, shapes, "D=8, Hq=4, Hkv=2, Dh=4, rotary_dim=2 (partial RoPE); cache length 0 and 3")

    def chain(x, cache):
        return attention.attention_layer_chain(x, weights, spec, cache)

    def compare(parents: tuple[int, ...], length: int) -> dict[str, tuple[Any, Any]]:
        tree = TokenTree(parents)
        N = tree.num_nodes
        cache = attention.KVCache.empty(spec)
        if length:
            _, cache = chain(rng.standard_normal((length, 8)), cache)
        x = rng.standard_normal((N, 8))  # [N, D]
        out, record = attention.attention_layer_tree(x, weights, spec, cache, tree)
        depth = np.array([len(walk(parents, i)) - 1 for i in range(N)])  # [N] edges to the root
        cos, sin = attention.rope_cos_sin(length + depth, spec.rotary_dim, spec.rope_theta)
        keys = attention.zero_centred_rmsnorm((x @ weights.k_proj.T).reshape(N, 2, 4), weights.k_norm, spec.eps)
        pairs = {"keys rotated at cache length + depth": (record.keys, attention.apply_rope(keys, cos, sin))}
        for i in range(N):
            want, decoded = _decode_path(chain, cache.copy(), x, tree.path(i))
            committed = attention.attention_layer_commit(record, cache, tree, i)
            pairs |= {
                f"output of node {i}": (out[i], want),
                f"committed keys (node {i})": (committed.keys, decoded.keys),
                f"committed values (node {i})": (committed.values, decoded.values),
            }
        return pairs

    return _sweep(ctx, shapes, scope, compare, "keys, outputs and commits as decoding")


def _sweep(ctx: Context, shapes: list, scope: dict, compare: Any, what: str) -> Outcome:
    """Run ``compare(parents, cache length)`` on every shape and cache length; the first mismatch (or raise) refutes."""
    for parents in ctx.cases(shapes, note="trees"):
        for length in CACHE_LENGTHS:
            try:
                mismatch = _first_mismatch(compare(parents, length))
            except RAISES as err:  # the reference raising on a valid tree is a failure
                return Outcome("refuted", scope, detail=f"raised {type(err).__name__}: {err} on a tree of "
                               f"{len(parents)} nodes, cache length {length}",
                               counterexample={"tree": list(parents), "cache_length": length, "error": repr(err)})
            if mismatch is not None:
                return Outcome("refuted", scope, detail=f"{mismatch[0]} differs from decoding by {mismatch[1]:.3g} "
                               f"({len(parents)} nodes, cache length {length})",
                               counterexample={"tree": list(parents), "cache_length": length, "which": mismatch[0],
                                               "error": mismatch[1]})
    return Outcome("checked", scope, detail=f"{len(shapes)} trees x {len(CACHE_LENGTHS)} cache lengths: {what}")


# ---------------------------------------------------------------------------------------------------- GDN layer
@check(
    "layers/gdn",
    claim="the GDN layer on a tree (tree convolution, gates, closed form, gated norm): outputs and the committed conv "
    "and recurrent states as decoding each path token by token",
    expected="checked",
    docs=DOCS,
)
def gdn_layer(ctx: Context) -> Outcome:
    layer = ctx.ref.need("layer")
    spec = layer.GDNLayerSpec(hidden_size=8, num_k_heads=2, num_v_heads=4, head_k_dim=2, head_v_dim=2)
    rng = np.random.default_rng(12)
    shapes_w = spec.weight_shapes()
    raw = _weights(rng, shapes_w, one=("norm",))
    raw["conv1d"] = rng.normal(0.0, 0.5, shapes_w["conv1d"])
    raw["A_log"] = np.log(rng.uniform(0.1, 2.0, shapes_w["A_log"]))
    weights = layer.GDNWeights(**raw)
    shapes = _shapes(ctx)
    scope = _scope(ctx, shapes, "D=8, H=2, HV=4, K=2, V=2, conv kernel 4; cache after 0 and 3 tokens")

    def chain(x, cache):
        return layer.gdn_layer_chain(x, weights, spec, cache)

    def compare(parents: tuple[int, ...], length: int) -> dict[str, tuple[Any, Any]]:
        tree = TokenTree(parents)
        cache = layer.GDNLayerCache.empty(spec)
        if length:
            _, cache = chain(rng.standard_normal((length, 8)), cache)
        x = rng.standard_normal((tree.num_nodes, 8))  # [N, D]
        out, record = layer.gdn_layer_tree(x, weights, spec, cache, tree)
        pairs = {}
        for i in range(tree.num_nodes):
            want, decoded = _decode_path(chain, cache.copy(), x, tree.path(i))
            committed = layer.gdn_layer_commit(record, cache, tree, i)
            pairs |= {
                f"output of node {i}": (out[i], want),
                f"committed recurrent state (node {i})": (committed.state, decoded.state),
                f"committed conv state (node {i})": (committed.conv_state, decoded.conv_state),
            }
        return pairs

    return _sweep(ctx, shapes, scope, compare, "outputs and commits as decoding")


# ---------------------------------------------------------------------------------------------------- model
@check(
    "model/tree-pass",
    claim="HybridModel.verify_tree logits of every node = decoding its path with forward, and HybridModel.commit "
    "leaves every layer cache and the length as that decoding",
    expected="checked",
    docs=DOCS,
    weight=2,
)
def model_tree_pass(ctx: Context) -> Outcome:
    model_module = ctx.ref.need("model")
    config = model_module.HybridConfig(
        vocab_size=6, hidden_size=8, intermediate_size=8, num_hidden_layers=4,
        layer_types=("linear_attention", "full_attention", "linear_attention", "full_attention"),
        num_attention_heads=4, num_key_value_heads=2, head_dim=4, linear_key_head_dim=2, linear_value_head_dim=2,
        linear_num_key_heads=2, linear_num_value_heads=4, num_experts=0, partial_rotary_factor=0.5,
    )
    model = model_module.build_random(config, seed=13)
    rng = random.Random(13)
    shapes = _shapes(ctx)
    scope = _scope(ctx, shapes, "vocab 6, D=8, layers GDN, attention, GDN, attention (GDN H=2 HV=4 K=V=2; attention "
                   "Hq=4 Hkv=2 Dh=4, rotary 2); a committed prompt of 0 or 3 tokens")

    def compare(parents: tuple[int, ...], length: int) -> dict[str, tuple[Any, Any]]:
        shape = TokenTree(parents)
        tokens = [0] * shape.num_nodes
        for i in range(shape.num_nodes):  # distinct sibling tokens: node i gets one more than its last sibling
            siblings = [c for c in shape.children(shape.parents[i]) if c < i] if i else []
            tokens[i] = (tokens[siblings[-1]] + 1) % 6 if siblings else rng.randrange(6)
        tree = TokenTree(parents, tokens)
        cache = model.new_cache()
        if length:
            model.forward([rng.randrange(6) for _ in range(length)], cache)
        logits = model.verify_tree(tokens, tree, cache)
        pairs = {}
        for i in range(tree.num_nodes):
            decoded = cache.copy()
            for j in tree.path(i):
                want = model.forward([tokens[j]], decoded)[0]
            committed = cache.copy()
            model.commit(tokens, tree, i, committed)
            pairs[f"logits of node {i}"] = (logits[i], want)
            pairs[f"length after committing node {i}"] = (committed.length, decoded.length)
            for layer, (got, ref_cache) in enumerate(zip(committed.layers, decoded.layers)):
                for name in ("state", "conv_state", "keys", "values"):
                    if hasattr(ref_cache, name):
                        pairs[f"layer {layer} {name} after committing node {i}"] = (getattr(got, name),
                                                                                    getattr(ref_cache, name))
        return pairs

    return _sweep(ctx, shapes, scope, compare, "logits and every layer's commit as decoding")
