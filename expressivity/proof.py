r"""What is proved about the hybrid construction, and how.

**Theorem (bounded scope).** For the construction of :mod:`~lumotree.expressivity.hybrid` with ``M = R = 4`` and
every input with ``1 <= n <= 12`` bits and ``2 <= m <= 4`` pairs, the argmax of the reference model's float64 logits
at the last token is the answer. The proof has five parts; each is a function here and reports
``proved`` / ``refuted`` (with a counterexample) / ``unknown``:

1. :func:`prove_parity_invariant` (**Z3, every length**). The parity head's core inputs ``q, k, v, alpha, beta``
   depend on the current token only (its conv taps on older tokens are zero: checked on the weights); they are
   taken from the reference layer's input path and converted *exactly* to rationals. With a symbolic state
   ``S = s e1 e0^T`` (``s != 0``), one step of :func:`lumotree.reference.gdn.chain` on Z3 terms keeps that form for
   every token kind, multiplies ``s`` by a negative factor on bit-1 tokens and a positive one on all others, and the
   readout ``o = S^T q`` has the sign of ``s`` and no other component. From ``S0 = 0`` the BOS step gives ``s > 0``:
   by induction, ``sign(o_t[0]) = (-1)^{p_t}`` for every input of every length.
2. :func:`exhaustive_parity_tree` (**exact, exhaustive**): the reference tree recurrence
   (:func:`lumotree.reference.gdn.tree_recurrent`) in ``Fraction`` arithmetic on the complete binary tree of bit
   strings of depth 12 (8191 nodes: every bit string up to n = 12 is a root-to-node path) confirms every sign and
   gives the exact range of ``|o_t|``.
3. :func:`check_symmetry` (**exact, on the weights**): relabelling keys by any permutation and values by any
   permutation maps every weight array onto itself (after the matching permutation of channels). So the model's
   logits are equivariant under relabelling, and it suffices to check one input per relabelling class: keys
   ``K_0..K_{m-1}`` in order, values as restricted-growth strings (set partitions into at most R blocks).
4. :func:`exhaustive_retrieval` (**exhaustive, float64 reference model**): every canonical key-value region with
   ``m <= 4``, every ordered query pair and both parities (with the bit strings at both ends of the ``|o_t|`` range
   and of the length range) through the chain path, with the attention internals probed: the logit at the right
   value token exceeds every other logit by at least ``Delta_min``, the right value vector is the one-hot of the
   answer, and the argmax is the answer. The same inputs through the tree path (``verify_tree``, all query pairs as
   leaves of one tree) give the same argmax.
5. :func:`prove_margin` (**Z3**): the softmax step. Let position c carry the right value, ``e_j = exp(l_j - l_c)``
   for the other ``L - 1`` positions, ``0 <= e_j <= eps`` with ``eps >= exp(-Delta_min)`` a rational bound, value
   entries ``|v_j[r]| <= a_hi``, ``v_c[ans] >= a_lo``, ``v_c[r] = 0`` (r != ans). Then for every r != ans::

       (o[ans] - o[r]) (1 + sum_j e_j) = v_c[ans] + sum_j e_j (v_j[ans] - v_j[r]) > 0     and     o[ans] > 0

   whenever ``a_lo > 2 (L - 1) eps a_hi``; Z3 proves the implication with symbolic ``e_j, v_j`` for all
   ``L <= 12 + 2 * 4 + 5``. The output gate is exactly 1 and the LM head maps ``o[r]`` to the logit of ``V_r`` with one
   shared positive weight (every other logit is 0), so the argmax is the answer.

Parts 1-2 are about the exact rationals the float64 layer produces; part 4 is about float64 itself; the remaining
dependence of the key-value positions on the bits is the value of ``|o_t|`` (the gated RMSNorm makes ``PAR``
``(-1)^p`` up to ``eps``), covered by running part 4 at both ends of its exact range.
The same argument with ``n`` up to 10^4 is the closed-form margin condition with ``L = 10^4 + 2m + 5``, which
:func:`margin_condition` evaluates; those lengths are *measured* (``lumotree expressivity check``), not proved.
"""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

import numpy as np

from ..reference import gdn
from ..reference.attention import apply_rope, rope_cos_sin, unpack_query_gate, zero_centred_rmsnorm
from ..reference.gdn import GDNLayerCache
from ..reference.model import mlp
from ..reference.tree import TokenTree
from . import hybrid
from .hybrid import PARITY_HEAD, HybridConstruction
from .task import BOS, NUM_SPECIAL, ONE, QUERY, SEP, ZERO, Instance, Vocabulary

__all__ = ["ProofReport", "parity_token_inputs", "parity_invariant_from_inputs", "prove_parity_invariant",
           "exhaustive_parity_tree", "check_symmetry", "canonical_regions", "probe", "exhaustive_retrieval",
           "exp_neg_upper_bound", "margin_condition", "prove_margin", "prove_hybrid"]


@dataclass
class ProofReport:
    """One part of the argument: ``status`` is ``proved`` / ``refuted`` / ``unknown``; ``scope`` says over what;
    ``details`` holds the numbers (or the counterexample); ``seconds`` the wall time."""

    name: str
    status: str
    scope: str
    details: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "status": self.status, "scope": self.scope, "details": self.details,
                "seconds": round(self.seconds, 3)}


def _timed(func):
    def wrapper(*args, **kwargs) -> ProofReport:
        start = time.perf_counter()
        report = func(*args, **kwargs)
        report.seconds = time.perf_counter() - start
        return report

    wrapper.__name__ = func.__name__
    wrapper.__doc__ = func.__doc__
    return wrapper


def _kind(token: int, vocab: Vocabulary) -> str:
    if token < NUM_SPECIAL:
        return {BOS: "BOS", ZERO: "bit0", ONE: "bit1", SEP: "SEP", QUERY: "?"}[token]
    return "key" if vocab.is_key(token) else "value"


# ====================================================================================================== part 1
def _parity_conv_channels(construction: HybridConstruction) -> list[int]:
    spec = construction.model.config.gdn_spec()
    K, V = spec.head_k_dim, spec.head_v_dim
    h = PARITY_HEAD
    return ([h * K + c for c in range(K)] + [spec.key_dim + h * K + c for c in range(K)]
            + [2 * spec.key_dim + h * V + c for c in range(V)])


def parity_token_inputs(construction: HybridConstruction) -> dict[str, tuple[np.ndarray, ...]]:
    """The parity head's exact core inputs per token kind: ``{kind: (q [K], k [K], v [V], alpha, beta)}`` as
    ``Fraction`` arrays (float64 values converted exactly).

    Raises ``ValueError`` unless they depend on the current token only: the parity head's conv weights on older
    taps must be zero, and all tokens of one kind (e.g. every key) must give identical inputs.
    """
    conv = construction.model.weights.layers[0].mixer.conv1d  # [C, W]
    older = conv[_parity_conv_channels(construction), :-1]
    if np.any(older != 0):
        raise ValueError("the parity head's short conv reads older tokens; its inputs are not per-token")
    vocab = construction.vocab
    tokens = np.arange(vocab.size)
    q, k, v, alpha, beta = (a[:, 0] for a in hybrid.parity_head_inputs(construction, tokens))
    out: dict[str, tuple[np.ndarray, ...]] = {}
    for token in tokens.tolist():
        kind = _kind(token, vocab)
        values = (q[token], k[token], v[token], np.array([alpha[token]]), np.array([beta[token]]))
        if kind in out:
            if not all(np.array_equal(np.asarray(a, dtype=np.float64), b.astype(np.float64))
                       for a, b in zip(values, out[kind])):
                raise ValueError(f"token {vocab.name(token)} gives other parity-head inputs than its kind {kind}")
            continue
        out[kind] = tuple(hybrid._exact(a) for a in values)
    return out


def _z3_value(x: Fraction):
    import z3

    return z3.Q(x.numerator, x.denominator)


def _z3_array(a: np.ndarray) -> np.ndarray:
    return np.vectorize(_z3_value, otypes=[object])(a)


def _z3_unsat(constraints: Sequence[Any], negated_claim: Any, timeout_ms: int = 60000) -> tuple[str, Any]:
    """``("proved", None)`` if ``constraints and negated_claim`` is unsat, ``("refuted", model)`` if sat."""
    import z3

    solver = z3.Solver()
    solver.set("timeout", timeout_ms)
    solver.add(*constraints)
    solver.add(negated_claim)
    result = solver.check()
    if result == z3.unsat:
        return "proved", None
    if result == z3.sat:
        return "refuted", solver.model()
    return "unknown", solver.reason_unknown()


@_timed
def parity_invariant_from_inputs(inputs: dict[str, tuple[np.ndarray, ...]], expect_flip: bool = True,
                                 name: str | None = None, scope_note: str = "") -> ProofReport:
    """Z3, every length: given a parity head's exact per-kind core inputs ``{kind: (q, k, v, alpha, beta)}`` (kinds
    ``"BOS"``, ``"bit1"`` and any others), one step of :func:`lumotree.reference.gdn.chain` on Z3 terms keeps
    ``S = s e1 e0^T`` (``s != 0``) and flips the sign of ``s`` exactly on ``bit1`` (``expect_flip=True``) or never
    (``expect_flip=False``); the readout has the sign of ``s``; from ``S0 = 0`` the BOS step gives ``s > 0``."""
    import z3

    K = inputs["BOS"][1].shape[0]
    V = inputs["BOS"][2].shape[0]
    s = z3.Real("s")
    scale = Fraction(1)
    details: dict[str, Any] = {"kinds": sorted(inputs)}

    def one_step(kind: str, S0: np.ndarray):
        q, k, v, alpha, beta = (_z3_array(a) for a in inputs[kind])
        o, S = gdn.chain(q[None, None], k[None, None], v[None, None], alpha[None], beta[None],
                         S0[None], scale)
        return o[0, 0], S[0]  # [V], [K, V]

    zero = z3.RealVal(0)
    symbolic = np.full((K, V), zero, dtype=object)
    symbolic[0, 0] = s
    failures = []
    for kind in sorted(inputs):
        if kind == "BOS":
            continue
        o, S = one_step(kind, symbolic)
        rest_zero = z3.And(*[S[i, j] == 0 for i in range(K) for j in range(V) if (i, j) != (0, 0)],
                           *[o[j] == 0 for j in range(1, V)])
        flips = expect_flip and kind == "bit1"
        sign = S[0, 0] * s < 0 if flips else S[0, 0] * s > 0
        claim = z3.And(rest_zero, sign, o[0] * S[0, 0] > 0)
        status, witness = _z3_unsat([s != 0], z3.Not(claim))
        details[kind] = {"flips_sign": flips, "status": status}
        if status != "proved":
            failures.append((kind, status, str(witness)))
    o, S = one_step("BOS", np.full((K, V), zero, dtype=object))
    claim = z3.And(S[0, 0] > 0, o[0] > 0, *[S[i, j] == 0 for i in range(K) for j in range(V) if (i, j) != (0, 0)],
                   *[o[j] == 0 for j in range(1, V)])
    status, witness = _z3_unsat([], z3.Not(claim))
    details["BOS"] = {"from_zero_state": True, "status": status}
    if status != "proved":
        failures.append(("BOS", status, str(witness)))
    if failures:
        details["failures"] = failures
        final = "refuted" if any(f[1] == "refuted" for f in failures) else "unknown"
    else:
        final = "proved"
    what = "flips exactly on bit-1 tokens" if expect_flip else "never flips"
    name = name or ("parity_invariant" if expect_flip else "ablation_sign_never_flips")
    return ProofReport(name, final, f"every input length (induction); the readout sign {what}{scope_note}", details)


def prove_parity_invariant(construction: HybridConstruction, expect_flip: bool = True) -> ProofReport:
    """:func:`parity_invariant_from_inputs` on the construction's parity head: the sign flips exactly on bit-1 tokens
    (``expect_flip=True``) or never (``expect_flip=False``, the ``beta < 1`` ablation)."""
    return parity_invariant_from_inputs(parity_token_inputs(construction), expect_flip,
                                        scope_note=f"; reflection_beta = {construction.reflection_beta}")


# ====================================================================================================== part 2
def _bit_tree(n_max: int) -> TokenTree:
    parents, tokens = [-1], [BOS]
    frontier = [0]
    for _ in range(n_max):
        nxt = []
        for node in frontier:
            for bit in (ZERO, ONE):
                parents.append(node)
                tokens.append(bit)
                nxt.append(len(parents) - 1)
        frontier = nxt
    return TokenTree(parents, tokens)


@_timed
def exhaustive_parity_tree(construction: HybridConstruction, n_max: int = 12) -> ProofReport:
    """Exact and exhaustive: :func:`lumotree.reference.gdn.tree_recurrent` in ``Fraction`` arithmetic on the
    complete binary tree of bit strings of depth ``n_max`` (every string up to ``n_max`` bits is a path), on the
    readout column of the parity head (the columns of a GDN state evolve independently: column j of ``S_t`` depends
    only on column j of ``S_{t-1}`` and ``v_t[j]``). Checks ``sign(o) = (-1)^parity`` at every node."""
    if isinstance(n_max, bool) or not isinstance(n_max, int) or not 1 <= n_max <= 16:
        raise ValueError(f"n_max = {n_max!r} must be an integer in [1, 16] (the tree has 2^(n_max+1) - 1 nodes)")
    inputs = parity_token_inputs(construction)
    tree = _bit_tree(n_max)
    kinds = ["BOS" if t == BOS else ("bit1" if t == ONE else "bit0") for t in tree.tokens]
    q = np.stack([inputs[k][0] for k in kinds])[:, None, :]  # [N, 1, K]
    k = np.stack([inputs[k][1] for k in kinds])[:, None, :]  # [N, 1, K]
    v = np.stack([inputs[k][2][:1] for k in kinds])[:, None, :]  # [N, 1, 1] the readout column
    alpha = np.stack([inputs[k][3] for k in kinds])  # [N, 1]
    beta = np.stack([inputs[k][4] for k in kinds])  # [N, 1]
    S0 = np.full((1, k.shape[-1], 1), Fraction(0), dtype=object)
    o, _ = gdn.tree_recurrent(q, k, v, alpha, beta, S0, tree, scale=Fraction(1))
    readout = o[:, 0, 0]  # [N]
    parity = np.zeros(tree.num_nodes, dtype=np.int64)
    for i, p in enumerate(tree.parents):
        if p >= 0:
            parity[i] = parity[p] ^ (tree.tokens[i] == ONE)
    wrong = [i for i in range(tree.num_nodes) if readout[i] == 0 or (readout[i] < 0) != bool(parity[i])]
    magnitudes = [abs(x) for x in readout]
    details: dict[str, Any] = {
        "nodes": tree.num_nodes,
        "bit_strings": tree.num_nodes - 1,
        "min_abs_readout": float(min(magnitudes)),
        "max_abs_readout": float(max(magnitudes)),
    }
    if wrong:
        i = wrong[0]
        bits = [1 if tree.tokens[j] == ONE else 0 for j in tree.path(i)[1:]]
        details["counterexample"] = {"bits": bits, "readout": float(readout[i])}
        return ProofReport("parity_exhaustive_exact", "refuted", f"all bit strings with n <= {n_max}", details)
    return ProofReport("parity_exhaustive_exact", "proved", f"all {tree.num_nodes - 1} bit strings with n <= {n_max}",
                       details)


# ====================================================================================================== part 3
def _relabelled_weights(construction: HybridConstruction, key_perm: np.ndarray, value_perm: np.ndarray):
    """Every weight array with keys relabelled ``i -> key_perm[i]`` and values ``r -> value_perm[r]`` (channels
    permuted to match); returns ``{name: (original, relabelled)}``."""
    layout = construction.layout
    model = construction.model
    M, R, D = layout.num_keys, layout.num_values, layout.hidden_size
    vocab = construction.vocab

    hidden = np.arange(D)  # new index of every hidden channel
    for block, perm in (("KEY", key_perm), ("KVKEY", key_perm), ("PREV", key_perm), ("SEL", key_perm),
                        ("VAL", value_perm), ("ANS", value_perm)):
        start = getattr(layout, block)
        hidden[start : start + len(perm)] = start + perm
    token = np.arange(vocab.size)
    token[NUM_SPECIAL : NUM_SPECIAL + M] = NUM_SPECIAL + key_perm
    token[NUM_SPECIAL + M :] = NUM_SPECIAL + M + value_perm

    def relabel(a: np.ndarray, rows: np.ndarray | None, cols: np.ndarray | None) -> np.ndarray:
        out = np.empty_like(a)
        r = np.arange(a.shape[0]) if rows is None else rows
        if a.ndim == 1:
            out[r] = a
            return out
        c = np.arange(a.shape[1]) if cols is None else cols
        out[np.ix_(r, c)] = a
        return out

    spec = model.config.gdn_spec()
    H, HV, V = spec.num_k_heads, spec.num_v_heads, spec.head_v_dim
    value_rows = np.arange(HV * V)  # heads 1 and 2 carry key identities on their value channels
    for head in (hybrid.VALUE_COPY_HEAD, hybrid.PREV_HEAD):
        value_rows[head * V : head * V + M] = head * V + key_perm
    conv_rows = np.concatenate([np.arange(2 * spec.key_dim), 2 * spec.key_dim + value_rows])
    units = np.concatenate([key_perm, M + key_perm])
    att = model.config.attention_spec()
    rd, Dh = att.rotary_dim, att.head_dim
    qk_dims = np.arange(Dh)
    qk_dims[rd : rd + M] = rd + key_perm
    v_dims = np.arange(Dh)
    v_dims[rd : rd + R] = rd + value_perm

    w = model.weights
    l0, l1 = w.layers
    g = l0.mixer
    w_q, w_k, w_v, w_z = gdn.unpack_qkvz(g.in_proj_qkvz, spec)
    w_query, w_gate = unpack_query_gate(l1.mixer.q_proj, att.num_heads)
    pairs = {
        "embed_tokens": (w.embed_tokens, relabel(w.embed_tokens, token, hidden)),
        "lm_head": (w.lm_head, relabel(w.lm_head, token, hidden)),
        "norm": (w.norm, relabel(w.norm, hidden, None)),
        "l0.input_layernorm": (l0.input_layernorm, relabel(l0.input_layernorm, hidden, None)),
        "l0.post_attention_layernorm": (l0.post_attention_layernorm,
                                        relabel(l0.post_attention_layernorm, hidden, None)),
        "l0.w_q": (w_q, relabel(w_q, None, hidden)),
        "l0.w_k": (w_k, relabel(w_k, None, hidden)),
        "l0.w_v": (w_v, relabel(w_v, value_rows, hidden)),
        "l0.w_z": (w_z, relabel(w_z, value_rows, hidden)),
        "l0.in_proj_ba": (g.in_proj_ba, relabel(g.in_proj_ba, None, hidden)),
        "l0.conv1d": (g.conv1d, relabel(g.conv1d, conv_rows, None)),
        "l0.norm": (np.tile(g.norm, HV), relabel(np.tile(g.norm, HV), value_rows, None)),
        "l0.out_proj": (g.out_proj, relabel(g.out_proj, hidden, value_rows)),
        "l0.mlp.gate": (l0.mlp.gate_proj, relabel(l0.mlp.gate_proj, units, hidden)),
        "l0.mlp.up": (l0.mlp.up_proj, relabel(l0.mlp.up_proj, units, hidden)),
        "l0.mlp.down": (l0.mlp.down_proj, relabel(l0.mlp.down_proj, hidden, units)),
        "l1.input_layernorm": (l1.input_layernorm, relabel(l1.input_layernorm, hidden, None)),
        "l1.post_attention_layernorm": (l1.post_attention_layernorm,
                                        relabel(l1.post_attention_layernorm, hidden, None)),
        "l1.w_query": (w_query, relabel(w_query, qk_dims, hidden)),
        "l1.w_gate": (w_gate, relabel(w_gate, v_dims, hidden)),
        "l1.k_proj": (l1.mixer.k_proj, relabel(l1.mixer.k_proj, qk_dims, hidden)),
        "l1.v_proj": (l1.mixer.v_proj, relabel(l1.mixer.v_proj, v_dims, hidden)),
        "l1.o_proj": (l1.mixer.o_proj, relabel(l1.mixer.o_proj, hidden, v_dims)),
        "l1.q_norm": (l1.mixer.q_norm, relabel(l1.mixer.q_norm, qk_dims, None)),
        "l1.k_norm": (l1.mixer.k_norm, relabel(l1.mixer.k_norm, qk_dims, None)),
        "l1.mlp.gate": (l1.mlp.gate_proj, relabel(l1.mlp.gate_proj, None, hidden)),
        "l1.mlp.up": (l1.mlp.up_proj, relabel(l1.mlp.up_proj, None, hidden)),
        "l1.mlp.down": (l1.mlp.down_proj, relabel(l1.mlp.down_proj, hidden, None)),
    }
    if H != HV:
        raise ValueError("the symmetry check assumes one value head per q/k head")
    return pairs


@_timed
def check_symmetry(construction: HybridConstruction, trials: int = 8, seed: int = 0) -> ProofReport:
    """Relabelling invariance of the weights: for random key and value permutations (plus two transpositions),
    every weight array equals its relabelled copy exactly. Together with the permutation-equivariance of every
    operation of the model (row-wise norms, element-wise gates, matrix products, softmax over positions) this gives
    ``logits(tau x)[tau y] = logits(x)[y]`` for the token relabelling ``tau`` (in real arithmetic; float64 may
    differ in the last bits by summation order)."""
    rng = np.random.default_rng(seed)
    M, R = construction.layout.num_keys, construction.layout.num_values
    def swap(size: int) -> np.ndarray:
        out = np.arange(size)
        out[[0, 1]] = out[[1, 0]] if size > 1 else out[[0, 0]]
        return out

    # generators of S_M x S_R (a cycle and the transposition (0 1) for each), then random elements
    perms = [(np.roll(np.arange(M), 1), np.arange(R)), (swap(M), np.arange(R)),
             (np.arange(M), np.roll(np.arange(R), 1)), (np.arange(M), swap(R))]
    perms += [(rng.permutation(M), rng.permutation(R)) for _ in range(trials)]
    for key_perm, value_perm in perms:
        for name, (original, relabelled) in _relabelled_weights(construction, key_perm, value_perm).items():
            if not np.array_equal(original, relabelled):
                return ProofReport("relabelling_symmetry", "refuted", "key and value permutations",
                                   {"weight": name, "key_perm": key_perm.tolist(), "value_perm": value_perm.tolist()})
    return ProofReport("relabelling_symmetry", "proved", "every weight array under generators of S_M x S_R (a cycle "
                       "and a transposition each), hence under every relabelling", {"permutation_pairs": len(perms)})


# ====================================================================================================== part 4
def _restricted_growth(m: int, R: int):
    """Set partitions of ``m`` slots into at most ``R`` blocks as restricted-growth strings."""
    def grow(prefix: list[int], top: int):
        if len(prefix) == m:
            yield tuple(prefix)
            return
        for b in range(min(top + 2, R)):
            yield from grow(prefix + [b], max(top, b))

    yield from grow([0], 0) if m else iter([()])


def canonical_regions(m_max: int, num_values: int) -> list[tuple[tuple[int, ...], tuple[int, ...]]]:
    """One ``(keys, values)`` per relabelling class, ``2 <= m <= m_max``: keys ``0..m-1`` in order, values a
    restricted-growth string."""
    return [(tuple(range(m)), values) for m in range(2, m_max + 1) for values in _restricted_growth(m, num_values)]


def probe(construction: HybridConstruction, tokens: Sequence[int]) -> dict[str, np.ndarray]:
    """The attention internals at the last token, recomputed from the model's weights with the reference's own
    layer functions (GDN layer chain, SwiGLU, zero-centred norms, RoPE); checked against ``model.forward``.

    Returns ``scores [T]`` (``scale q_last . k_j``), ``values [T, Dh]`` and ``logits [vocab]``.
    """
    model = construction.model
    ids = np.asarray(tokens, dtype=np.int64)
    cfg, w = model.config, model.weights
    eps = cfg.rms_norm_eps
    l0, l1 = w.layers
    h = w.embed_tokens[ids]  # [T, D]
    out, _ = gdn.gdn_layer_chain(zero_centred_rmsnorm(h, l0.input_layernorm, eps), l0.mixer, cfg.gdn_spec(),
                                 GDNLayerCache.empty(cfg.gdn_spec()))
    h = h + out
    h = h + mlp(zero_centred_rmsnorm(h, l0.post_attention_layernorm, eps), l0.mlp)
    x = zero_centred_rmsnorm(h, l1.input_layernorm, eps)  # [T, D]
    att = cfg.attention_spec()
    T, Dh = ids.shape[0], att.head_dim
    w_query, w_gate = unpack_query_gate(l1.mixer.q_proj, att.num_heads)
    cos, sin = rope_cos_sin(np.arange(T), att.rotary_dim, att.rope_theta)  # [T, rd]
    query = apply_rope(zero_centred_rmsnorm((x @ w_query.T).reshape(T, 1, Dh), l1.mixer.q_norm, eps), cos, sin)
    key = apply_rope(zero_centred_rmsnorm((x @ l1.mixer.k_proj.T).reshape(T, 1, Dh), l1.mixer.k_norm, eps), cos, sin)
    values = x @ l1.mixer.v_proj.T  # [T, Dh]
    scores = (key[:, 0] @ query[-1, 0]) * att.scale  # [T]
    weights = np.exp(scores - scores.max())
    o = (weights @ values) / weights.sum()  # [Dh]
    gate = 0.5 * (1.0 + np.tanh(0.5 * (x[-1] @ w_gate.T)))  # [Dh]
    h_last = h[-1] + (o * gate) @ l1.mixer.o_proj.T
    h_last = h_last + mlp(zero_centred_rmsnorm(h_last[None], l1.post_attention_layernorm, eps), l1.mlp)[0]
    head = w.embed_tokens if w.lm_head is None else w.lm_head
    logits = zero_centred_rmsnorm(h_last, w.norm, eps) @ head.T  # [vocab]
    reference = hybrid.final_logits(model, ids)
    if not np.allclose(logits, reference, rtol=1e-9, atol=1e-9):
        raise AssertionError("probe disagrees with model.forward: the probe no longer mirrors the reference model")
    return {"scores": scores, "values": values, "logits": reference, "gate": gate}


def _extreme_bit_strings(n_max: int) -> list[tuple[int, ...]]:
    """Both parities at both ends of the number of ones (the exact |o_t| range) and of the length."""
    strings = {(0,), (1,), (0,) * n_max, (0,) * (n_max - 1) + (1,), (1,) * n_max, (1,) * (n_max - 1) + (0,)}
    return sorted(s for s in strings if len(s) >= 1)


@_timed
def exhaustive_retrieval(construction: HybridConstruction, n_max: int = 12, m_max: int = 4) -> ProofReport:
    """Every canonical key-value region (``m <= m_max``) x every ordered query pair x the extreme bit strings,
    through the chain path with the attention probed, and through the tree path (all query pairs as leaves).
    Reports the logit gap, value bounds and any wrong answer."""
    layout = construction.layout
    if m_max > layout.num_keys:
        raise ValueError(f"m_max = {m_max} exceeds num_keys = {layout.num_keys}")
    att = construction.model.config.attention_spec()
    rd = att.rotary_dim
    R = layout.num_values
    gap_min, a_lo, a_hi, cases, tree_cases = math.inf, math.inf, 0.0, 0, 0
    wrong: list[dict[str, Any]] = []
    for bits in _extreme_bit_strings(n_max):
        for keys, values in canonical_regions(m_max, R):
            base = None
            for q0, q1 in itertools.permutations(keys, 2):
                inst = Instance(bits, keys, values, (q0, q1), layout.num_keys, layout.num_values)
                base = inst
                tokens = inst.tokens
                p = probe(construction, tokens)
                c = len(tokens) - 3 - 2 * len(keys) + 2 * keys.index(inst.queries[inst.parity]) + 1  # value token
                others = np.delete(p["scores"], c)
                gap_min = min(gap_min, float(p["scores"][c] - others.max()))
                content = p["values"][:, rd : rd + R]  # [T, R]
                right = content[c]
                ans = inst.answer_index
                if np.any(np.delete(right, ans) != 0):
                    wrong.append({"tokens": inst.render(), "why": "right value vector is not a one-hot"})
                a_lo = min(a_lo, float(right[ans]))
                a_hi = max(a_hi, float(np.abs(np.delete(content, c, axis=0)).max()))
                if int(np.argmax(p["logits"])) != inst.answer:
                    predicted = construction.vocab.name(int(np.argmax(p["logits"])))
                    wrong.append({"tokens": inst.render(), "predicted": predicted,
                                  "answer": construction.vocab.name(inst.answer)})
                cases += 1
            tree_logits, pairs = hybrid.tree_predictions(construction, base)
            for node, (q0, q1) in enumerate(pairs):
                if q0 < 0:
                    continue
                inst = Instance(bits, keys, values, (q0, q1), layout.num_keys, layout.num_values)
                tree_cases += 1
                if int(np.argmax(tree_logits[node])) != inst.answer:
                    wrong.append({"tokens": inst.render(), "path": "tree"})
    details = {"chain_cases": cases, "tree_cases": tree_cases, "logit_gap_min": gap_min, "right_value_min": a_lo,
               "other_value_abs_max": a_hi, "bit_strings": [list(b) for b in _extreme_bit_strings(n_max)]}
    scope = (f"all {len(canonical_regions(m_max, R))} canonical key-value regions with m <= {m_max} (M = "
             f"{layout.num_keys}, R = {R}), every ordered query pair, extreme bit strings up to n = {n_max}")
    if wrong:
        details["counterexamples"] = wrong[:5]
        return ProofReport("retrieval_exhaustive", "refuted", scope, details)
    return ProofReport("retrieval_exhaustive", "proved", scope, details)


# ====================================================================================================== part 5
def exp_neg_upper_bound(delta: Fraction, terms: int | None = None) -> Fraction:
    """A rational ``eps >= exp(-delta)`` for ``delta > 0``: ``1 / sum_{k <= terms} delta^k / k!`` (a partial sum of
    the exponential series is a lower bound of ``exp(delta)``); ``terms`` defaults to ``3 delta + 40`` (tight)."""
    delta = Fraction(delta)
    if delta <= 0:
        raise ValueError(f"delta = {delta} must be positive")
    terms = math.ceil(3 * delta) + 40 if terms is None else terms
    total, term = Fraction(1), Fraction(1)
    for k in range(1, terms + 1):
        term = term * delta / k
        total += term
    return 1 / total


def margin_condition(length: int, delta: float, a_lo: float, a_hi: float) -> dict[str, Any]:
    """The closed-form sufficient condition ``a_lo > 2 (L - 1) exp(-delta) a_hi`` for a length ``L`` (float64)."""
    bound = 2.0 * (length - 1) * math.exp(-delta) * a_hi
    return {"length": length, "lhs_a_lo": a_lo, "rhs": bound, "holds": a_lo > bound}


@_timed
def prove_margin(max_length: int, delta_min: float, a_lo: float, a_hi: float) -> ProofReport:
    """Z3: with the right position's logit ``delta_min`` above all others (``e_j <= eps``, a rational bound of
    ``exp(-delta_min)``), right value entry ``>= a_lo``, every other value entry in ``[-a_hi, a_hi]``, the softmax
    output ranks the answer strictly first and positive, for every length ``L <= max_length`` (absent positions are
    ``e_j = 0``)."""
    import z3

    if not (delta_min > 0 and a_lo > 0 and a_hi >= 0):
        return ProofReport("softmax_margin", "refuted", "inputs", {"delta_min": delta_min, "a_lo": a_lo, "a_hi": a_hi})
    # rational bounds on the safe side of the measured floats; a gap above 256 is used as 256 (exp(-256) bounds
    # exp(-gap) from above, and the series bound stays short)
    delta_q = Fraction(math.floor(min(delta_min, 256.0) * 10**6), 10**6)
    a_lo_q = Fraction(math.floor(a_lo * 10**9), 10**9)
    a_hi_q = Fraction(math.ceil(a_hi * 10**9), 10**9)
    eps = exp_neg_upper_bound(delta_q)
    q = _z3_value
    bound_e, bound_v = q(eps), q(a_hi_q)
    # lemma (nonlinear, one term): 0 <= e <= eps and |u|, |w| <= a_hi  =>  e (u - w) >= -2 eps a_hi
    e, u, w = z3.Reals("e u w")
    term_status, witness = _z3_unsat([e >= 0, e <= bound_e, u >= -bound_v, u <= bound_v, w >= -bound_v, w <= bound_v],
                                     z3.Not(z3.And(e * (u - w) >= -2 * bound_e * bound_v, e * u >= -bound_e * bound_v)))
    # the sum (linear given the lemma): (o[ans] - o[r]) (1 + sum e) = v_c[ans] + sum_j e_j (u_j - w_j) > 0, o[ans] > 0
    others = max_length - 1
    gap_terms = [z3.Real(f"gap_{j}") for j in range(others)]
    ans_terms = [z3.Real(f"ans_{j}") for j in range(others)]
    right = z3.Real("v_c_ans")
    constraints = [right >= q(a_lo_q)]
    constraints += [t >= -2 * bound_e * bound_v for t in gap_terms] + [t >= -bound_e * bound_v for t in ans_terms]
    claim = z3.And(right + z3.Sum(*gap_terms) > 0, right + z3.Sum(*ans_terms) > 0)
    sum_status, sum_witness = _z3_unsat(constraints, z3.Not(claim))
    status = "proved" if term_status == sum_status == "proved" else (
        "refuted" if "refuted" in (term_status, sum_status) else "unknown")
    witness = witness if term_status != "proved" else sum_witness
    details = {"max_length": max_length, "delta_min": float(delta_q), "eps_upper_bound": float(eps),
               "a_lo": float(a_lo_q), "a_hi": float(a_hi_q),
               "closed_form": margin_condition(max_length, float(delta_q), float(a_lo_q), float(a_hi_q))}
    if status == "refuted":
        details["counterexample"] = str(witness)[:400]
    return ProofReport("softmax_margin", status, f"every length L <= {max_length}", details)


# ====================================================================================================== all of it
def prove_hybrid(num_keys: int = 4, num_values: int = 4, n_max: int = 12, m_max: int = 4) -> dict[str, Any]:
    """Build the construction and run parts 1-5; ``status`` is ``proved`` iff every part is."""
    construction = hybrid.build_hybrid(num_keys, num_values)
    parts = [prove_parity_invariant(construction), exhaustive_parity_tree(construction, n_max),
             check_symmetry(construction)]
    retrieval = exhaustive_retrieval(construction, n_max, m_max)
    parts.append(retrieval)
    d = retrieval.details
    parts.append(prove_margin(n_max + 2 * m_max + 5, d["logit_gap_min"], d["right_value_min"],
                              d["other_value_abs_max"]))
    statuses = {p.status for p in parts}
    status = "proved" if statuses == {"proved"} else ("refuted" if "refuted" in statuses else "unknown")
    return {"status": status,
            "scope": f"every input with 1 <= n <= {n_max} bits and 2 <= m <= {m_max} pairs, M = {num_keys} keys, "
                     f"R = {num_values} values",
            "parts": [p.as_dict() for p in parts]}
