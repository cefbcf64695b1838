r"""A fixed-width hybrid that solves parity-conditioned retrieval with string keys (PCR-S).

Three layers of the reference :class:`~lumotree.reference.model.HybridModel`: **GDN, GDN, gated attention**. The
width does not depend on the key length L or the number of pairs m (``D = 20 + 2R``, GDN heads 2 x (K = 2, V = 3),
one attention head); one weight, the attention's logit scale, grows with the longest key the model is built for
(``max_key_length``, O(L) bits). No scratchpad: the answer is the argmax at the last input token.

**Layer 0, GDN.** Head *parity* is the Householder reflection of :mod:`~lumotree.expressivity.hybrid` (``beta = 2``
on bit-1 tokens): ``PAR = (-1)^{p_t}``. Head *encode* keeps one state row ``(x, c)``. A non-letter token resets it:
``alpha = 0``, ``beta = 1``, ``v = (0, G)``. A letter u (a = 0, b = 1) halves it and adds: ``alpha = 1``,
``beta = 1/2``, ``v = (G u, G)``, so ``c = G`` throughout and after the letters ``u_1 .. u_L``

    x = G (u_1 2^-L + u_2 2^-(L-1) + .. + u_L 2^-1),

a binary fraction of the reversed key: distinct keys of one length give distinct ratios ``r = x / c`` in
``[0, 1 - 2^-L]``, at least ``2^-L`` apart. ``G = 64`` and the gates are set so that ``beta = 1/2`` and ``alpha in
{0, 1}`` hold **exactly** in float64; the gated RMSNorm writes the unit vector ``ENC = (x, c) / |(x, c)|``.

**Layer 1, GDN** (both heads read, through the short conv's tap ``t - 1``, the *previous* token's ``ENC`` plus an
offset ``B`` that keeps SiLU exactly linear; the offset channel is subtracted again by ``out_proj``). Head *key copy*
(``alpha = 0``, ``beta = 1``, readout only at value tokens) writes ``KVENC`` = the encoding of the key just
before each value token. Head *hold* (``alpha = 1``; ``beta = 1`` on the comma, 0 elsewhere) snapshots the encoding
of ``q_0`` at the comma and keeps it: ``HOLD``. **MLP 1** (4 SwiGLU units, SiLU exactly 0 or linear): ``SEL = HOLD``
if ``PAR > 0`` else ``ENC``, i.e. the encoding of ``q_p`` at the last token.

**Layer 2, gated attention**: query ``SEL``, key ``KVENC``, value the value token's one-hot. The zero-centred q/k
norms turn both into unit vectors at angle ``theta = atan(r)``, so the score ``S cos(theta_q - theta_k)`` is largest
exactly at the value token whose key equals ``q_p``; distinct keys up to length ``L_max`` differ in angle by at least
``atan(1) - atan(1 - 2^-L_max)`` and ``S = 64 / (1 - cos(that))`` makes the margin 64 (positions without a key have
score 0). The LM head reads the retrieved value.

**Write strength.** Only the parity head needs ``beta > 1``. ``reflection_beta <= 1`` builds the ablation
(``allow_neg_eigval = False``, every other gate unchanged), which answers parity-blind.

**Precision.** In float64 the encodings are exact, the directions carry rounding errors of a few ulps, and the
score error grows as ``4^L``: :func:`lumotree.expressivity.check` measures the longest key length it still solves.
At a p-bit cache (:class:`~lumotree.expressivity.adversary.RoundedRunner`) the key directions need about ``2L`` bits:
the model needs precision logarithmic in the number of keys, as any fixed-width attention must.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..reference.attention import AttentionWeights, pack_query_gate
from ..reference.config import HybridConfig
from ..reference.gdn import GDNWeights, gates, pack_ba, pack_qkvz
from ..reference.model import DecoderLayerWeights, HybridModel, MLPWeights, ModelWeights
from ..reference.tree import TokenTree
from .channels import ChannelLayout
from .hybrid import final_logits
from .string_task import COMMA, LETTER_A, LETTER_B, NUM_FIXED, StringInstance, StringVocabulary
from .task import BOS, ONE, QUERY, SEP, ZERO

__all__ = [
    "KINDS",
    "StringHybridLayout",
    "StringHybrid",
    "build_string_hybrid",
    "angle_gap",
    "logit_scale",
    "predict",
    "query_tree",
    "tree_predictions",
    "ENCODE_GAIN",
]

KINDS = ("T_BOS", "T_BIT0", "T_BIT1", "T_SEP", "T_QM", "T_LA", "T_LB", "T_COMMA", "T_VAL")
_TOKEN_KIND = {BOS: "T_BOS", ZERO: "T_BIT0", ONE: "T_BIT1", SEP: "T_SEP", QUERY: "T_QM", LETTER_A: "T_LA",
               LETTER_B: "T_LB", COMMA: "T_COMMA"}
PARITY_HEAD, ENCODE_HEAD = 0, 1  # layer 0
KEY_COPY_HEAD, HOLD_HEAD = 0, 1  # layer 1
#: ``G``: the encode head's digit and constant (a power of two, so the binary fraction is exact).
ENCODE_GAIN = 64.0
_MARGIN = 64.0  # attention logit margin at the right value token
_BIG = 2.0**20  # q/k pre-activations: l2norm of a one-entry vector is then exactly 1 in float64
_SAT = 100.0  # saturated gate logit: sigmoid(100) = 1, sigmoid(-100) = 0, tanh(50) = 1 exactly in float64
_OFFSET = 64.0  # lower bound of the layer-1 value channels: silu is exactly the identity above ~38
_KEY_GAIN = 1e6  # attention pre-norm gain: the norms' eps becomes negligible
_EPS = 1e-6


@dataclass(frozen=True)
class StringHybridLayout(ChannelLayout):
    """Residual channels for ``num_values`` R: ``ONE``, the kinds (:data:`KINDS`), ``NOID``, ``VAL`` (R), ``PAR``,
    ``ENC``, ``KVENC``, ``HOLD``, ``SEL`` (2 each: x then c), ``ANS`` (R)."""

    num_values: int

    def __post_init__(self) -> None:
        StringVocabulary(self.num_values)

    def blocks(self) -> list[tuple[str, int]]:
        R = self.num_values
        return [("ONE", 1), *((k, 1) for k in KINDS), ("NOID", 1), ("VAL", R), ("PAR", 1), ("ENC", 2),
                ("KVENC", 2), ("HOLD", 2), ("SEL", 2), ("ANS", R)]

    @property
    def head_dim(self) -> int:
        """Attention head dim: a multiple of 8 whose non-rotary 3/4 holds max(2, R) channels."""
        return 8 * math.ceil(max(2, self.num_values) / 6)

    def embedding(self) -> np.ndarray:
        """``[vocab, D]``: ONE + kind + identity (``VAL_r`` or ``NOID``): three ones per token."""
        vocab = StringVocabulary(self.num_values)
        E = np.zeros((vocab.size, self.hidden_size))  # [vocab, D]
        for token in range(vocab.size):
            E[token, self.ONE] = 1.0
            if token < NUM_FIXED:
                E[token, [getattr(self, _TOKEN_KIND[token]), self.NOID]] = 1.0
            else:
                E[token, [self.T_VAL, self.VAL + vocab.value_index(token)]] = 1.0
        return E


def angle_gap(max_key_length: int) -> float:
    """``1 - cos(atan(1) - atan(1 - 2^-L))``: the least ``1 - cos`` between the directions of two distinct keys of
    one length ``L <= max_key_length`` (consecutive ratios are closest at the top of ``[0, 1]``)."""
    delta = math.atan(1.0) - math.atan(1.0 - 2.0**-max_key_length)
    return 2.0 * math.sin(delta / 2.0) ** 2


def logit_scale(max_key_length: int) -> float:
    """The attention score at a perfect match, ``S = 64 / angle_gap(L_max)``."""
    return _MARGIN / angle_gap(max_key_length)


def _normalised_entry(hidden_size: int, ones: float) -> float:
    """A unit entry of a residual whose squares sum to ``ones``, after the zero-centred RMSNorm (weight 0)."""
    return 1.0 / math.sqrt(ones / hidden_size + _EPS)


def _exact_weight(x: float, target: float) -> float:
    """A float ``w`` with ``x * w == target`` in float64 (searched next to ``target / x``)."""
    w = target / x
    for _ in range(64):
        product = x * w
        if product == target:
            return w
        w = np.nextafter(w, np.inf if product < target else -np.inf)
    raise ArithmeticError(f"no float w with {x!r} * w == {target!r}")


def _gate_weight(x: float, beta: float, allow_neg: bool, exact: bool = True) -> float:
    """A weight ``w`` whose logit ``b = x * w`` gives exactly ``beta`` through the reference's own gate function
    (``sigmoid(b)``, or ``2 sigmoid(b)`` with ``allow_neg``); saturated values use ``|b| = 150``. With
    ``exact=False`` a value no float logit reaches exactly gets the nearest logit instead of an error."""
    top = 2.0 if allow_neg else 1.0
    if beta == 0.0 or beta == top:
        return (1.5 if beta else -1.5) * _SAT / x
    if beta == top / 2:
        return 0.0  # sigmoid(0) = 1/2 exactly
    p = beta / top
    centre = (math.log(p) - math.log1p(-p)) / x
    zero = np.zeros(1)
    up = down = centre
    for _ in range(4096):
        for w in (up, down):
            _, got = gates(np.zeros((1, 1)), np.array([[x * w]]), zero, zero, allow_neg)
            if got[0, 0] == beta:
                return float(w)
        up, down = np.nextafter(up, np.inf), np.nextafter(down, -np.inf)
    if not exact:
        return float(centre)
    raise ArithmeticError(f"no logit weight gives beta = {beta} exactly in float64")


@dataclass
class StringHybrid:
    """The built model with its ``layout``, ``max_key_length`` and ``reflection_beta``."""

    model: HybridModel
    layout: StringHybridLayout
    max_key_length: int
    reflection_beta: float

    @property
    def vocab(self) -> StringVocabulary:
        return StringVocabulary(self.layout.num_values)


def _config(layout: StringHybridLayout, allow_neg: bool) -> HybridConfig:
    return HybridConfig(
        vocab_size=StringVocabulary(layout.num_values).size, hidden_size=layout.hidden_size, intermediate_size=4,
        num_hidden_layers=3, layer_types=("linear_attention", "linear_attention", "full_attention"),
        num_attention_heads=1, num_key_value_heads=1, head_dim=layout.head_dim, partial_rotary_factor=0.25,
        linear_num_key_heads=2, linear_num_value_heads=2, linear_key_head_dim=2, linear_value_head_dim=3,
        linear_conv_kernel_dim=4, num_experts=0, allow_neg_eigval=allow_neg, rms_norm_eps=_EPS,
    )


def build_string_hybrid(num_values: int, max_key_length: int = 16, reflection_beta: float = 2.0) -> StringHybrid:
    """The construction of the module docstring for ``R = num_values`` and keys up to ``max_key_length`` letters.

    ``reflection_beta``: the parity head's write strength on bit-1 tokens, ``2`` (the construction) or a value in
    ``(0, 1]`` (the ablation, ``allow_neg_eigval = False``).
    """
    if isinstance(max_key_length, bool) or not isinstance(max_key_length, int) or not 1 <= max_key_length <= 40:
        raise ValueError(f"max_key_length = {max_key_length!r} must be an integer in [1, 40]")
    if isinstance(reflection_beta, bool) or not isinstance(reflection_beta, (int, float)):
        raise TypeError(f"reflection_beta = {reflection_beta!r} must be a number")
    if not (reflection_beta == 2.0 or 0.0 < reflection_beta <= 1.0):
        raise ValueError(f"reflection_beta = {reflection_beta} must be 2 (the construction) or in (0, 1] (ablation)")
    layout = StringHybridLayout(num_values)
    allow_neg = reflection_beta > 1.0
    config = _config(layout, allow_neg)
    L, R, D = layout, layout.num_values, layout.hidden_size
    spec = config.gdn_spec()
    H, K, V, W = spec.num_k_heads, spec.head_k_dim, spec.head_v_dim, spec.conv_kernel
    letters = [L.T_LA, L.T_LB]
    non_letters = [getattr(L, k) for k in KINDS if getattr(L, k) not in letters]
    every_kind = [getattr(L, k) for k in KINDS]

    def gdn_parts():
        return (np.zeros((H * K, D)), np.zeros((H * K, D)), np.zeros((H * V, D)), np.zeros((H * V, D)),
                np.zeros((H, D)), np.zeros((H, D)))  # w_q, w_k, w_v, w_z [HK|HV V, D]; w_b, w_a [HV, D]

    # ------------------------------------------------------------------------------------------ layer 0: GDN
    xi = _normalised_entry(D, 3.0)  # every active entry of a normalised embedding
    big = _BIG / xi
    w_q, w_k, w_v, w_z, w_b, w_a = gdn_parts()
    h = PARITY_HEAD
    w_q[h * K + 0, L.ONE] = big
    w_k[h * K + 0, [L.T_BOS, L.T_BIT1]] = big
    w_k[h * K + 1, [c for c in every_kind if c not in (L.T_BOS, L.T_BIT1)]] = big
    w_v[h * V + 0, L.T_BOS] = _exact_weight(xi, ENCODE_GAIN)
    w_b[h, L.T_BIT1] = _gate_weight(xi, float(reflection_beta), allow_neg, exact=False)  # 2: the reflection
    h = ENCODE_HEAD
    w_q[h * K + 0, L.ONE] = big
    w_k[h * K + 0, L.ONE] = big
    w_v[h * V + 0, L.T_LB] = _exact_weight(xi, ENCODE_GAIN)  # the digit
    w_v[h * V + 1, L.ONE] = _exact_weight(xi, ENCODE_GAIN)  # the constant c = G
    w_b[h, letters] = _gate_weight(xi, 0.5, allow_neg)
    w_b[h, non_letters] = _gate_weight(xi, 1.0, allow_neg)
    w_a[h, non_letters] = 2000.0 / xi  # with A_log = 0, dt_bias = -1000: alpha = exp(-1000) = 0 (reset)
    w_z[:, L.ONE] = _SAT / xi  # silu(z) = 100 on every head and channel
    conv0 = np.zeros((spec.conv_dim, W))  # [C, W]; column W - 1 is the current token
    conv0[:, W - 1] = 1.0
    A_log0 = np.array([-100.0, 0.0])  # parity: alpha = 1 always; encode: alpha from softplus(a - 1000)
    dt_bias0 = np.array([0.0, -1000.0])
    unit = 1.0 / (math.sqrt(V) * _SAT)  # gated RMSNorm output has |.| <= sqrt(V) * 100: unit entries
    out0 = np.zeros((D, H * V))  # [D, HV V]
    out0[L.PAR, PARITY_HEAD * V + 0] = unit
    out0[L.ENC + 0, ENCODE_HEAD * V + 0] = unit
    out0[L.ENC + 1, ENCODE_HEAD * V + 1] = unit
    mixer0 = GDNWeights(pack_qkvz(w_q, w_k, w_v, w_z, H), pack_ba(w_b, w_a, H), conv0, A_log0, dt_bias0,
                        np.ones(V), out0)
    zero_mlp = MLPWeights(np.zeros((4, D)), np.zeros((4, D)), np.zeros((D, 4)))
    layer0 = DecoderLayerWeights(np.zeros(D), mixer0, np.zeros(D), zero_mlp)

    # ------------------------------------------------------------------------------------------ layer 1: GDN
    # residual after layer 0: 3 unit entries + PAR (|.| ~ 1) + ENC (a unit vector): squares sum to at most ~5
    xi5 = _normalised_entry(D, 5.5)
    big1 = _BIG / xi5
    offset = _OFFSET / xi5
    w_q, w_k, w_v, w_z, w_b, w_a = gdn_parts()
    for h in (KEY_COPY_HEAD, HOLD_HEAD):
        w_k[h * K + 0, L.ONE] = big1
        w_v[h * V + 0, [L.ENC + 0, L.ONE]] = [offset, offset]  # x + B   (previous token, via the conv)
        w_v[h * V + 1, [L.ENC + 1, L.ONE]] = [offset, offset]  # c + B
        w_v[h * V + 2, L.ONE] = offset  # B
    w_q[KEY_COPY_HEAD * K + 0, L.T_VAL] = big1  # read out only at value tokens
    w_q[KEY_COPY_HEAD * K + 1, [c for c in every_kind if c != L.T_VAL]] = big1
    w_q[HOLD_HEAD * K + 0, L.ONE] = big1
    if allow_neg:
        w_b[KEY_COPY_HEAD, L.ONE] = 0.0  # beta = 2 sigmoid(0) = 1
        w_b[HOLD_HEAD, L.T_COMMA] = 0.0
        w_b[HOLD_HEAD, [c for c in every_kind if c != L.T_COMMA]] = -1.5 * _SAT / xi5  # beta = 0
    else:
        w_b[KEY_COPY_HEAD, L.ONE] = 1.5 * _SAT / xi5  # beta = sigmoid(>= 150) = 1
        w_b[HOLD_HEAD, L.T_COMMA] = 1.5 * _SAT / xi5
        w_b[HOLD_HEAD, [c for c in every_kind if c != L.T_COMMA]] = -1.5 * _SAT / xi5
    w_z[:, L.ONE] = _SAT / xi5 * 1.5  # silu(z) >= 150 > 0: a common positive factor
    conv1 = np.zeros((spec.conv_dim, W))  # [C, W]
    conv1[:, W - 1] = 1.0
    v_channels = slice(2 * spec.key_dim, spec.conv_dim)
    conv1[v_channels, W - 1] = 0.0
    conv1[v_channels, W - 2] = 1.0  # value channels read the previous token
    A_log1 = np.array([0.0, -100.0])  # key copy: alpha = exp(-softplus(1000)) = 0; hold: alpha = 1
    dt_bias1 = np.array([1000.0, 0.0])
    out1 = np.zeros((D, H * V))  # [D, HV V]
    for h, block in ((KEY_COPY_HEAD, L.KVENC), (HOLD_HEAD, L.HOLD)):
        out1[block + 0, [h * V + 0, h * V + 2]] = [1.0, -1.0]  # (x + B) - B
        out1[block + 1, [h * V + 1, h * V + 2]] = [1.0, -1.0]  # (c + B) - B
    mixer1 = GDNWeights(pack_qkvz(w_q, w_k, w_v, w_z, H), pack_ba(w_b, w_a, H), conv1, A_log1, dt_bias1,
                        np.ones(V), out1 / (math.sqrt(V) * 150.0))

    # MLP 1: SEL = HOLD if PAR > 0 else ENC (SiLU arguments are >= 100 in size: exactly linear or exactly 0)
    xi_par = _normalised_entry(D, 12.0)  # |normalised PAR| at any position is at least this
    G = _SAT / xi_par
    gate1, up1, down1 = np.zeros((4, D)), np.zeros((4, D)), np.zeros((D, 4))  # [I, D], [I, D], [D, I]
    for u, (sign, source, c) in enumerate([(1.0, L.HOLD, 0), (1.0, L.HOLD, 1), (-1.0, L.ENC, 0), (-1.0, L.ENC, 1)]):
        gate1[u, L.PAR] = sign * G
        up1[u, source + c] = 1.0
        down1[L.SEL + c, u] = 1.0 / G
    layer1 = DecoderLayerWeights(np.zeros(D), mixer1, np.zeros(D), MLPWeights(gate1, up1, down1))

    # ------------------------------------------------------------------------------------------ layer 2: attention
    att = config.attention_spec()
    Dh, rd = att.head_dim, att.rotary_dim
    w_query, w_gate = np.zeros((Dh, D)), np.zeros((Dh, D))  # [Dh, D]
    k_proj, v_proj, o_proj = np.zeros((Dh, D)), np.zeros((Dh, D)), np.zeros((D, Dh))
    for c in range(2):
        w_query[rd + c, L.SEL + c] = _KEY_GAIN
        k_proj[rd + c, L.KVENC + c] = _KEY_GAIN
    for r in range(R):
        v_proj[rd + r, L.VAL + r] = 1.0
        o_proj[L.ANS + r, rd + r] = 1.0
    w_gate[:, L.ONE] = _SAT / _normalised_entry(D, 16.0)  # output gate sigmoid(>= 100) = 1
    # unit vectors become sqrt(Dh) (1 + w) after the norms: score = sqrt(Dh) omega_q omega_k cos(angle); the key
    # side keeps omega_k = 1 so that cached keys stay of size sqrt(Dh)
    omega_q = logit_scale(max_key_length) / math.sqrt(Dh)
    q_norm = np.zeros(Dh)
    q_norm[rd : rd + 2] = omega_q - 1.0
    mixer2 = AttentionWeights(pack_query_gate(w_query, w_gate, 1), k_proj, v_proj, o_proj, q_norm, np.zeros(Dh))
    layer2 = DecoderLayerWeights(np.zeros(D), mixer2, np.zeros(D), zero_mlp)

    vocab = StringVocabulary(R)
    lm_head = np.zeros((vocab.size, D))  # [vocab, D]
    for r in range(R):
        lm_head[vocab.value(r), L.ANS + r] = 1.0
    weights = ModelWeights(layout.embedding(), [layer0, layer1, layer2], np.zeros(D), lm_head)
    return StringHybrid(HybridModel(config, weights), layout, max_key_length, float(reflection_beta))


# ====================================================================================================== running it
def _check(construction: StringHybrid, instance: StringInstance) -> None:
    if instance.num_values != construction.layout.num_values:
        raise ValueError(f"instance has R = {instance.num_values} values but the construction was built for "
                         f"R = {construction.layout.num_values}")


def predict(construction: StringHybrid, instances: Sequence[StringInstance], chunk: int = 512) -> list[int]:
    """The argmax at the last input token of each instance (chain path, float64)."""
    out = []
    for inst in instances:
        _check(construction, inst)
        out.append(int(np.argmax(final_logits(construction.model, inst.tokens, chunk))))
    return out


def query_tree(instance: StringInstance) -> tuple[TokenTree, list[tuple[str, str]]]:
    """A draft tree asking every ordered query pair of the instance's keys at once: root ``?``, a trie of the keys
    (``q_0``), a comma under each key's last letter, under it a trie of the other keys (``q_1``). Returns the tree
    and, per node, the pair its leaf completes (``("", "")`` for inner nodes)."""
    vocab = instance.vocab
    parents, tokens, pairs = [-1], [QUERY], [("", "")]

    def add_trie(root: int, words: list[str]) -> dict[str, int]:
        """Add a trie of ``words`` under ``root``; returns each word's last node."""
        children: dict[tuple[int, int], int] = {}
        ends = {}
        for word in words:
            node = root
            for token in vocab.letters(word):
                if (node, token) not in children:
                    parents.append(node)
                    tokens.append(token)
                    pairs.append(("", ""))
                    children[(node, token)] = len(parents) - 1
                node = children[(node, token)]
            ends[word] = node
        return ends

    keys = sorted(instance.keys)
    for q0, end in add_trie(0, keys).items():
        parents.append(end)
        tokens.append(COMMA)
        pairs.append(("", ""))
        comma = len(parents) - 1
        for q1, leaf in add_trie(comma, [k for k in keys if k != q0]).items():
            pairs[leaf] = (q0, q1)
    return TokenTree(parents, tokens), pairs


def tree_predictions(construction: StringHybrid, instance: StringInstance, chunk: int = 512):
    """Prefill everything before ``?`` (chain path), then run :func:`query_tree` through ``model.verify_tree``.
    Returns ``(tree_logits [N, vocab], pairs)``."""
    _check(construction, instance)
    cache = construction.model.new_cache()
    final_logits(construction.model, instance.tokens[: instance.prefix_length], chunk, cache)
    tree, pairs = query_tree(instance)
    return construction.model.verify_tree(None, tree, cache), pairs
