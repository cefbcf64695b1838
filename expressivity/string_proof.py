r"""What is proved about the string-key hybrid (:mod:`~lumotree.expressivity.string_hybrid`), and how.

Each function returns a :class:`~lumotree.expressivity.proof.ProofReport` (``proved`` / ``refuted`` / ``unknown``):

1. :func:`prove_parity` (**Z3, every n**): the parity head's exact per-kind inputs (taken from the reference layer's
   input path, converted exactly to rationals) keep ``S = s e1 e0^T`` and flip ``s`` exactly on bit-1 tokens.
2. :func:`prove_encoding` (**Z3, every key length**): the encode head's inputs depend on the current token only;
   from *any* state a non-letter token leaves ``S = e1 (0, G, 0)``, and a letter ``u`` maps ``e1 (x, G, 0)`` to
   ``e1 (x/2 + G u/2, G, 0)``; the readout is ``(x, G, 0)`` times a positive constant. By induction the readout at
   the last letter of a key ``u_1 .. u_L`` is ``(G sum_i u_i 2^-(L-i+1), G)``: exact, for every L.
3. :func:`exhaustive_encoding_tree` (**exact, exhaustive**): the same through
   :func:`lumotree.reference.gdn.tree_recurrent` in ``Fraction`` arithmetic on the trie of every key up to a length.
4. :func:`check_angle_gap` (**exhaustive up to a length; paper for all**): the directions ``(r, 1)`` of distinct
   ratios ``r in 2^-L Z``, ``0 <= r < 1``, are more than ``atan(1) - atan(1 - 2^-L)`` apart (atan is concave on
   ``[0, 1]``, so consecutive grid points are closest at the top, where they are ``atan(1 - 2^-L) -
   atan(1 - 2^(1-L)) > atan(1) - atan(1 - 2^-L)`` apart), which is what
   :func:`~lumotree.expressivity.string_hybrid.logit_scale` assumes.
5. :func:`exhaustive_retrieval` (**exhaustive, float64 model**): every key set up to a length and size (two orders),
   every ordered query pair, both parities, chain path with the attention probed (logit gap, value bounds) and tree
   path; then :func:`~lumotree.expressivity.proof.prove_margin` (**Z3**) for the softmax step.
6. :func:`fixed_point_parity` and :func:`fixed_point_encoding` (**p-bit arithmetic, exhaustive**): the two GDN heads
   run in :class:`~lumotree.reference.fixedpoint.Fixed` arithmetic (every operation rounded to ``fx<p>.<f>``):
   the parity head over *every* representable state (a finite induction, hence every n), the encode head over the
   trie of every key up to a length (distinct encodings per length).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from fractions import Fraction
from typing import Any

import numpy as np

from ..reference import gdn
from ..reference.attention import apply_rope, rope_cos_sin, unpack_query_gate, zero_centred_rmsnorm
from ..reference.fixedpoint import FixedFormat, to_fixed
from ..reference.gdn import GDNLayerCache
from ..reference.model import mlp
from ..reference.tree import TokenTree
from . import string_hybrid
from .hybrid import _exact, final_logits
from .proof import ProofReport, _timed, _z3_array, _z3_unsat, parity_invariant_from_inputs, prove_margin
from .string_hybrid import ENCODE_HEAD, PARITY_HEAD, StringHybrid
from .string_task import COMMA, LETTER_A, LETTER_B, StringInstance, key_string
from .task import BOS, ONE, QUERY, SEP, ZERO

__all__ = ["head_inputs", "kind_inputs", "prove_parity", "prove_encoding", "exhaustive_encoding_tree",
           "check_angle_gap", "probe", "exhaustive_retrieval", "fixed_point_parity", "fixed_point_encoding",
           "prove_string_hybrid"]

_KIND = {BOS: "BOS", ZERO: "bit0", ONE: "bit1", SEP: "SEP", QUERY: "?", LETTER_A: "a", LETTER_B: "b", COMMA: ","}


def _kind(token: int) -> str:
    return _KIND.get(int(token), "value")


def head_inputs(construction: StringHybrid, head: int, tokens: Sequence[int]):
    """Layer-0 core inputs of ``head`` on ``tokens`` by the reference layer's own input path:
    float64 ``(q [T, K], k [T, K], v [T, V], alpha [T], beta [T])``."""
    model = construction.model
    ids = np.asarray(tokens, dtype=np.int64)
    layer = model.weights.layers[0]
    x = zero_centred_rmsnorm(model.weights.embed_tokens[ids], layer.input_layernorm, model.config.rms_norm_eps)
    spec = model.config.gdn_spec()
    conv_state = np.zeros((spec.conv_kernel - 1, spec.conv_dim))  # [W - 1, C]
    _, q, k, v, _, alpha, beta = gdn.gdn_layer_inputs(x, layer.mixer, spec, conv_state, TokenTree.chain(len(ids)))
    return q[:, head], k[:, head], v[:, head], alpha[:, head], beta[:, head]


def kind_inputs(construction: StringHybrid, head: int) -> dict[str, tuple[np.ndarray, ...]]:
    """``{kind: (q, k, v, alpha, beta)}`` as exact Fractions for a layer-0 head. Raises ``ValueError`` unless the
    inputs depend on the current token only (zero conv taps on older tokens) and on its kind only."""
    spec = construction.model.config.gdn_spec()
    K, V = spec.head_k_dim, spec.head_v_dim
    channels = ([head * K + c for c in range(K)] + [spec.key_dim + head * K + c for c in range(K)]
                + [2 * spec.key_dim + head * V + c for c in range(V)])
    if np.any(construction.model.weights.layers[0].mixer.conv1d[channels, :-1] != 0):
        raise ValueError(f"head {head} of layer 0 reads older tokens through its conv; its inputs are not per-token")
    tokens = np.arange(construction.vocab.size)
    q, k, v, alpha, beta = head_inputs(construction, head, tokens)
    out: dict[str, tuple[np.ndarray, ...]] = {}
    seen: dict[str, tuple[np.ndarray, ...]] = {}
    for t in tokens.tolist():
        kind = _kind(t)
        values = (q[t], k[t], v[t], np.array([alpha[t]]), np.array([beta[t]]))
        if kind in seen:
            if not all(np.array_equal(a, b) for a, b in zip(values, seen[kind])):
                raise ValueError(f"token {construction.vocab.name(t)} gives other head-{head} inputs than its kind")
            continue
        seen[kind] = values
        out[kind] = tuple(_exact(a) for a in values)
    return out


def prove_parity(construction: StringHybrid, expect_flip: bool = True) -> ProofReport:
    """Part 1 (Z3, every n): :func:`~lumotree.expressivity.proof.parity_invariant_from_inputs` on the parity head."""
    return parity_invariant_from_inputs(kind_inputs(construction, PARITY_HEAD), expect_flip,
                                        scope_note=f"; reflection_beta = {construction.reflection_beta}")


def _step(inputs: tuple[np.ndarray, ...], S: np.ndarray):
    q, k, v, alpha, beta = (_z3_array(a) for a in inputs)
    o, S_new = gdn.chain(q[None, None], k[None, None], v[None, None], alpha[None], beta[None], S[None], Fraction(1))
    return o[0, 0], S_new[0]


@_timed
def prove_encoding(construction: StringHybrid) -> ProofReport:
    """Part 2 (Z3, every key length): reset from any state, halve-and-add on letters, readout ``(x, G, 0)``."""
    import z3

    inputs = kind_inputs(construction, ENCODE_HEAD)
    K, V = inputs["a"][1].shape[0], inputs["a"][2].shape[0]
    G = inputs["b"][2][0]
    details: dict[str, Any] = {"G": float(G), "G_is_64": G == 64, "beta_letters": float(inputs["a"][4][0]),
                               "alpha_letters": float(inputs["a"][3][0])}
    anything = np.array([[z3.Real(f"S_{i}_{j}") for j in range(V)] for i in range(K)], dtype=object)
    x = z3.Real("x")
    zero = z3.RealVal(0)
    row = np.empty((K, V), dtype=object)
    row[...] = zero
    row[0, 0], row[0, 1] = x, _z3_array(np.array([G]))[0]
    failures = []
    for kind, inp in sorted(inputs.items()):
        if kind in ("a", "b"):
            u = 1 if kind == "b" else 0
            o, S = _step(inp, row)
            target = [x / 2 + G * u / 2, G] + [0] * (V - 2)
            expected = [S[0, j] == target[j] for j in range(V)] + [S[i, j] == 0 for i in range(1, K) for j in range(V)]
        else:
            o, S = _step(inp, anything)
            target = [0, G] + [0] * (V - 2)
            expected = [S[0, j] == target[j] for j in range(V)] + [S[i, j] == 0 for i in range(1, K) for j in range(V)]
        q = inp[0]
        readout = [o[j] == S[0, j] * q[0] for j in range(V)]  # o = S^T q with q = (q0, 0): a positive multiple
        status, witness = _z3_unsat([], z3.Not(z3.And(*expected, *readout, q[0] > 0)))
        details[kind] = status
        if status != "proved":
            failures.append((kind, str(witness)[:300]))
    if failures:
        details["failures"] = failures
    status = "proved" if not failures else "refuted"
    return ProofReport("encoding_invariant", status, "every key length (induction): the encode head's readout is "
                       "(G sum_i u_i 2^-(L-i+1), G) up to a positive factor, reset by every non-letter", details)


def _key_trie(max_length: int) -> TokenTree:
    parents, tokens, frontier = [-1], [SEP], [0]
    for _ in range(max_length):
        nxt = []
        for node in frontier:
            for letter in (LETTER_A, LETTER_B):
                parents.append(node)
                tokens.append(letter)
                nxt.append(len(parents) - 1)
        frontier = nxt
    return TokenTree(parents, tokens)


@_timed
def exhaustive_encoding_tree(construction: StringHybrid, max_length: int = 8) -> ProofReport:
    """Part 3 (exact, exhaustive): the trie of every key up to ``max_length`` letters under a reset token, through
    :func:`lumotree.reference.gdn.tree_recurrent` in Fraction arithmetic; the readout ratio at every node must be the
    binary fraction of the reversed key, and distinct keys of one length must give distinct ratios."""
    if isinstance(max_length, bool) or not isinstance(max_length, int) or not 1 <= max_length <= 12:
        raise ValueError(f"max_length = {max_length!r} must be an integer in [1, 12]")
    tree = _key_trie(max_length)
    q, k, v, alpha, beta = (_exact(a) for a in head_inputs(construction, ENCODE_HEAD, tree.tokens))
    S0 = np.full((1, k.shape[-1], v.shape[-1]), Fraction(0), dtype=object)
    o, _ = gdn.tree_recurrent(q[:, None], k[:, None], v[:, None], alpha[:, None], beta[:, None], S0, tree,
                              scale=Fraction(1))
    wrong, ratios = [], {}
    for node in range(1, tree.num_nodes):
        letters = [1 if tree.tokens[j] == LETTER_B else 0 for j in tree.path(node)[1:]]
        L = len(letters)
        expected = sum(Fraction(u, 2 ** (L - i)) for i, u in enumerate(letters))
        ratio = o[node, 0, 0] / o[node, 0, 1]
        if ratio != expected:
            wrong.append({"key": "".join("ab"[u] for u in letters), "ratio": float(ratio)})
        ratios.setdefault(L, set()).add(ratio)
    collisions = {L: 2**L - len(r) for L, r in ratios.items() if len(r) != 2**L}
    details: dict[str, Any] = {"nodes": tree.num_nodes, "keys": tree.num_nodes - 1}
    if wrong or collisions:
        details.update(counterexamples=wrong[:5], collisions=collisions)
        return ProofReport("encoding_exhaustive_exact", "refuted", f"every key up to {max_length} letters", details)
    return ProofReport("encoding_exhaustive_exact", "proved", f"all {tree.num_nodes - 1} keys up to {max_length} "
                       "letters: ratio = binary fraction of the reversed key, injective per length", details)


@_timed
def check_angle_gap(max_length: int = 14) -> ProofReport:
    """Part 4 (exhaustive for every ``L <= max_length``, in 60-digit arithmetic): the least ``1 - cos`` between the
    directions of two grid ratios is attained by the top two grid points and is at least
    :func:`~lumotree.expressivity.string_hybrid.angle_gap`."""
    import mpmath

    rows = []
    with mpmath.workdps(60):
        for L in range(1, max_length + 1):
            angles = [mpmath.atan(mpmath.mpf(j) / 2**L) for j in range(2**L)]
            gaps = [1 - mpmath.cos(b - a) for a, b in zip(angles, angles[1:])] or [mpmath.mpf(1)]
            least = min(gaps)
            at_top = gaps[-1] == least
            claimed = string_hybrid.angle_gap(L)
            ok = at_top and float(least) >= claimed
            rows.append({"L": L, "least": float(least), "claimed": claimed, "at_top": bool(at_top), "ok": bool(ok)})
    status = "proved" if all(r["ok"] for r in rows) else "refuted"
    return ProofReport("angle_gap_exhaustive", status, f"every grid of 2^L ratios, L <= {max_length}",
                       {"rows": [rows[0], rows[-1]]})


def probe(construction: StringHybrid, tokens: Sequence[int]) -> dict[str, np.ndarray]:
    """The attention internals at the last token (scores ``[T]``, value vectors ``[T, Dh]``, logits), recomputed
    from the weights with the reference's layer functions and checked against ``model.forward``."""
    model = construction.model
    ids = np.asarray(tokens, dtype=np.int64)
    cfg, w = model.config, model.weights
    eps = cfg.rms_norm_eps
    h = w.embed_tokens[ids]  # [T, D]
    for layer in w.layers[:2]:
        out, _ = gdn.gdn_layer_chain(zero_centred_rmsnorm(h, layer.input_layernorm, eps), layer.mixer,
                                     cfg.gdn_spec(), GDNLayerCache.empty(cfg.gdn_spec()))
        h = h + out
        h = h + mlp(zero_centred_rmsnorm(h, layer.post_attention_layernorm, eps), layer.mlp)
    last = w.layers[2]
    x = zero_centred_rmsnorm(h, last.input_layernorm, eps)  # [T, D]
    att = cfg.attention_spec()
    T, Dh = ids.shape[0], att.head_dim
    w_query, w_gate = unpack_query_gate(last.mixer.q_proj, att.num_heads)
    cos, sin = rope_cos_sin(np.arange(T), att.rotary_dim, att.rope_theta)  # [T, rd]
    query = apply_rope(zero_centred_rmsnorm((x @ w_query.T).reshape(T, 1, Dh), last.mixer.q_norm, eps), cos, sin)
    key = apply_rope(zero_centred_rmsnorm((x @ last.mixer.k_proj.T).reshape(T, 1, Dh), last.mixer.k_norm, eps),
                     cos, sin)
    values = x @ last.mixer.v_proj.T  # [T, Dh]
    scores = (key[:, 0] @ query[-1, 0]) * att.scale  # [T]
    reference = final_logits(model, ids)
    weights = np.exp(scores - scores.max())
    o = (weights @ values) / weights.sum()
    gate = 0.5 * (1.0 + np.tanh(0.5 * (x[-1] @ w_gate.T)))
    h_last = h[-1] + (o * gate) @ last.mixer.o_proj.T
    h_last = h_last + mlp(zero_centred_rmsnorm(h_last[None], last.post_attention_layernorm, eps), last.mlp)[0]
    logits = zero_centred_rmsnorm(h_last, w.norm, eps) @ w.lm_head.T
    if not np.allclose(logits, reference, rtol=1e-9, atol=1e-9):
        raise AssertionError("probe disagrees with model.forward: it no longer mirrors the reference model")
    return {"scores": scores, "values": values, "logits": reference}


def _regions(key_lengths: Sequence[int], m_max: int):
    for L in key_lengths:
        strings = [key_string(i, L) for i in range(2**L)]
        for m in range(2, min(m_max, 2**L) + 1):
            for chosen in itertools.combinations(strings, m):
                yield chosen
                if m > 1:
                    yield tuple(reversed(chosen))


@_timed
def exhaustive_retrieval(construction: StringHybrid, key_lengths: Sequence[int] = (1, 2), m_max: int = 4,
                         bit_strings: Sequence[tuple[int, ...]] = ((0,), (1,), (1, 1, 0), (1,) * 9)) -> ProofReport:
    """Part 5 (exhaustive, float64): every key set with lengths in ``key_lengths`` and ``2 <= m <= m_max`` (sorted
    and reversed order), values ``0..m-1``, every ordered query pair, each bit string; chain path with the attention
    probed and tree path (all pairs as leaves of one ``verify_tree``). Reports the least logit gap at the right value
    token, the value bounds and any wrong answer."""
    R = construction.layout.num_values
    if m_max > R:
        raise ValueError(f"m_max = {m_max} needs R >= m_max distinct values; the construction has R = {R}")
    rd = construction.model.config.attention_spec().rotary_dim
    gap, a_lo, a_hi, cases, tree_cases, longest = math.inf, math.inf, 0.0, 0, 0, 0
    wrong: list[dict[str, Any]] = []
    for bits in bit_strings:
        for keys in _regions(key_lengths, m_max):
            values = tuple(range(len(keys)))
            base = None
            for q0, q1 in itertools.permutations(keys, 2):
                inst = StringInstance(bits, keys, values, (q0, q1), R)
                base = inst
                p = probe(construction, inst.tokens)
                target = inst.queries[inst.parity]
                c = len(bits) + 2 + (keys.index(target) + 1) * (inst.key_length + 1) - 1  # its value token
                gap = min(gap, float(p["scores"][c] - np.delete(p["scores"], c).max()))
                content = p["values"][:, rd : rd + R]  # [T, R]
                a_lo = min(a_lo, float(content[c, inst.answer_index]))
                a_hi = max(a_hi, float(np.abs(np.delete(content, c, axis=0)).max()))
                if np.any(np.delete(content[c], inst.answer_index) != 0):
                    wrong.append({"tokens": inst.render(), "why": "the right value vector is not a one-hot"})
                if int(np.argmax(p["logits"])) != inst.answer:
                    wrong.append({"tokens": inst.render(), "path": "chain"})
                longest = max(longest, len(inst.tokens))
                cases += 1
            tree_logits, pairs = string_hybrid.tree_predictions(construction, base)
            for node, (q0, q1) in enumerate(pairs):
                if q0:
                    tree_cases += 1
                    full = StringInstance(bits, keys, values, (q0, q1), R)
                    if int(np.argmax(tree_logits[node])) != full.answer:
                        wrong.append({"tokens": full.render(), "path": "tree"})
    details = {"chain_cases": cases, "tree_cases": tree_cases, "logit_gap_min": gap, "right_value_min": a_lo,
               "other_value_abs_max": a_hi, "longest_input": longest}
    scope = (f"every key set of lengths {list(key_lengths)} with 2 <= m <= {m_max} (two orders), every ordered query "
             f"pair, bit strings {[list(b) for b in bit_strings]}")
    if wrong:
        details["counterexamples"] = wrong[:5]
        return ProofReport("string_retrieval_exhaustive", "refuted", scope, details)
    return ProofReport("string_retrieval_exhaustive", "proved", scope, details)


@_timed
def fixed_point_parity(construction: StringHybrid, fmt: FixedFormat) -> ProofReport:
    """Part 6a (p-bit arithmetic, exhaustive over states, hence every n): the parity head's per-kind inputs rounded to
    ``fmt`` and one :func:`lumotree.reference.gdn.step` in :class:`~lumotree.reference.fixedpoint.Fixed` arithmetic
    from **every** state ``S = s e1 e0^T`` with ``0 < |s| <= max/2`` (the invariant set I): bit-1 tokens map s to
    ``-s``, every other kind keeps s (both stay in I), and BOS from the zero state lands in I with ``s > 0``. The
    readout has the sign of s. By induction the sign is the parity after every prefix, for every n."""
    inputs = {kind: tuple(to_fixed(np.asarray(a, dtype=object), fmt) for a in value)
              for kind, value in kind_inputs(construction, PARITY_HEAD).items()}
    K, V = inputs["BOS"][1].shape[0], inputs["BOS"][2].shape[0]
    zero = fmt(0)
    half = fmt.max_int // 2
    scale = fmt(1)

    def step(kind: str, s):
        q, k, v, alpha, beta = inputs[kind]
        S = np.full((K, V), zero, dtype=object)
        S[0, 0] = s
        o, S_new = gdn.step(S, q, k, v, alpha[0], beta[0], scale)
        rest = [S_new[i, j] for i in range(K) for j in range(V) if (i, j) != (0, 0)] + list(o[1:])
        return S_new[0, 0], o[0], all(x == 0 for x in rest)

    s0, o0, clean = step("BOS", zero)
    failures = [] if (clean and 0 < s0.n <= half and o0 > 0) else [{"kind": "BOS", "s": float(s0)}]
    states = 0
    for n in itertools.chain(range(-half, 0), range(1, half + 1)):
        s = type(zero)(n, fmt)
        states += 1
        for kind in inputs:
            if kind == "BOS":
                continue
            s_new, o, clean = step(kind, s)
            expected = -s if kind == "bit1" else s
            if not (clean and s_new == expected and (o > 0) == (s_new > 0) and o != 0):
                failures.append({"kind": kind, "s": float(s), "s_new": float(s_new), "readout": float(o)})
                break
        if len(failures) > 3:
            break
    details = {"format": fmt.name, "states": states, "bos_state": float(s0)}
    if failures:
        details["failures"] = failures[:4]
        return ProofReport("fixed_point_parity", "refuted", f"{fmt.name} arithmetic", details)
    return ProofReport("fixed_point_parity", "proved", f"every n, in {fmt.name} arithmetic (all {states} states of "
                       "the invariant set)", details)


@_timed
def fixed_point_encoding(construction: StringHybrid, fmt: FixedFormat, max_length: int = 10) -> ProofReport:
    """Part 6b (p-bit arithmetic, exhaustive over keys): the encode head over the trie of every key up to
    ``max_length`` letters in ``fmt`` arithmetic. Reports, per length, how many distinct readouts the ``2^L`` keys
    get; ``exact_up_to`` is the longest length with no collision and ratios equal to the binary fraction (for
    ``G = 64 = 2^6`` that needs ``frac_bits >= L - 6``)."""
    tree = _key_trie(max_length)
    arrays = [to_fixed(np.asarray(_exact(a), dtype=object), fmt)
              for a in head_inputs(construction, ENCODE_HEAD, tree.tokens)]
    q, k, v, alpha, beta = arrays
    S0 = to_fixed(np.zeros((1, k.shape[-1], v.shape[-1])), fmt)
    o, _ = gdn.tree_recurrent(q[:, None], k[:, None], v[:, None], alpha[:, None], beta[:, None], S0, tree,
                              scale=fmt(1))
    per_length: dict[int, set] = {}
    exact: dict[int, bool] = {}
    for node in range(1, tree.num_nodes):
        letters = [1 if tree.tokens[j] == LETTER_B else 0 for j in tree.path(node)[1:]]
        L = len(letters)
        readout = (o[node, 0, 0].value, o[node, 0, 1].value)
        per_length.setdefault(L, set()).add(readout)
        expected = sum(Fraction(u, 2 ** (L - i)) for i, u in enumerate(letters))
        exact[L] = exact.get(L, True) and readout[1] != 0 and readout[0] / readout[1] == expected
    distinct = {L: len(r) for L, r in sorted(per_length.items())}
    exact_up_to = 0
    for L in sorted(distinct):
        if distinct[L] == 2**L and exact[L]:
            exact_up_to = L
        else:
            break
    return ProofReport("fixed_point_encoding", "proved" if exact_up_to >= 1 else "refuted",
                       f"every key up to {max_length} letters in {fmt.name} arithmetic: exact and injective for "
                       f"L <= {exact_up_to}", {"format": fmt.name, "distinct_per_length": distinct,
                                                "exact_up_to": exact_up_to})


def prove_string_hybrid(num_values: int = 4, max_key_length: int = 16, quick: bool = False) -> dict[str, Any]:
    """Build the construction and run parts 1-6; ``status`` is ``proved`` iff every part is."""
    construction = string_hybrid.build_string_hybrid(num_values, max_key_length)
    retrieval = exhaustive_retrieval(construction, (1, 2) if quick else (1, 2, 3), 3 if quick else 4)
    d = retrieval.details
    parts = [prove_parity(construction), prove_encoding(construction),
             exhaustive_encoding_tree(construction, 6 if quick else 10), check_angle_gap(10 if quick else 16),
             retrieval,
             prove_margin(d["longest_input"], d["logit_gap_min"], d["right_value_min"], d["other_value_abs_max"]),
             fixed_point_parity(construction, FixedFormat(12, 3) if quick else FixedFormat(16, 6)),
             fixed_point_encoding(construction, FixedFormat(12, 1) if quick else FixedFormat(16, 4),
                                  8 if quick else 12)]
    statuses = {p.status for p in parts}
    status = "proved" if statuses == {"proved"} else ("refuted" if "refuted" in statuses else "unknown")
    return {"status": status, "scope": f"R = {num_values}, max_key_length = {max_key_length}; see each part",
            "parts": [p.as_dict() for p in parts]}



