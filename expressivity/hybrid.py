r"""The hybrid construction: weights of the reference hybrid model that solve parity-conditioned retrieval.

Two layers in the Qwen3-Next layout (layer 0 GDN, layer 1 gated attention), no scratchpad: the answer is the argmax
of the logits at the last input position. Every weight below is set by :func:`build_hybrid`; the model is the
project's :class:`~lumotree.reference.model.HybridModel`, run through its chain path (``forward``) and its tree path
(``verify_tree``).

**Residual channels** (:class:`HybridLayout`; D = 10 + 4M + 2R). The embedding of every token has exactly three
ones: ``ONE`` (all tokens), its kind (``T_BOS, T_BIT0, T_BIT1, T_SEP, T_QM, T_KEY, T_VAL``) and its identity
(``KEY_i``, ``VAL_r``, or ``NOID`` for the five special tokens), so every normalised embedding entry equals
``xi = 1 / sqrt(3/D + eps)``. Layers write ``PAR`` (parity sign), ``KVKEY_i`` (at a value token: the key it is
stored under), ``PREV_i`` (the previous token's key identity), ``SEL_i`` (the selected query key), ``ANS_r``
(the retrieved value).

**Layer 0, GDN** (3 q/k heads, 3 value heads, K = 2, V = M, ``allow_neg_eigval``). Pre-conv projections have gain
``GAIN / xi`` so every active channel reaches ``GAIN = 100`` and SiLU passes it unchanged (``silu(100) = 100`` and
``silu(0) = 0`` exactly in float64).

- head 0, *parity*: ``q = e1`` always; ``k = e1`` on BOS and bit-1 tokens, ``k = e2`` on all others; ``v = GAIN e0``
  on BOS, else 0. Decay ``alpha = 1`` (``A_log = -100``); ``beta = 2 sigmoid(b)`` with ``b = 100`` on bit-1 tokens
  (``beta = 2``: the step is the Householder reflection ``I - 2 e1 e1^T``), ``b = 0`` elsewhere (``beta = 1``). From
  ``S0 = 0`` the BOS step writes ``S = GAIN e1 e0^T``; every bit-1 token multiplies row e1 by ``1 - beta |k|^2 < 0``;
  every other token's key ``e2`` is orthogonal to row e1, which it leaves unchanged. So
  ``o_t = S_t^T q_t = (-1)^{p_t} c_t e0`` with ``c_t > 0`` and ``p_t`` the parity of the bits so far.
  The gated RMSNorm divides ``c_t`` out: ``PAR = (-1)^{p_t}`` (up to ``eps``).
- head 1, *value copy*: ``alpha = 0`` (``A_log = log 100``, ``dt_bias = 100``: ``g = -10^4``), ``k = e1`` always,
  ``q = e1`` on value tokens and ``e2`` elsewhere; ``v`` is taken by the short convolution from the *previous* token
  (tap ``W - 2``): ``v_t = GAIN onehot(key id of token t-1)``. So ``o_t = scale beta [token t is a value] v_t`` and
  ``KVKEY = onehot(k_j)`` exactly at the value token of pair j, 0 elsewhere.
- head 2, *previous token*: as head 1 with ``q = e1`` always: ``PREV = onehot(key id of token t-1)``.

**Layer 0, MLP** (SwiGLU, 2M units): unit ``(i, current)`` computes ``silu(-G PAR) KEY_i``, unit ``(i, previous)``
``silu(G PAR) PREV_i`` (``G`` makes ``|G PAR| >= 100``, where SiLU is exactly ``x`` or ``0``); both write ``SEL_i``.
At the last token (q_1, whose previous token is q_0): ``SEL = onehot(q_1)`` if ``p = 1`` else ``onehot(q_0)``,
i.e. ``SEL = onehot(q_p)``.

**Layer 1, gated attention** (1 head, head_dim Dh, rotary on the first Dh/4 channels; content lives in the other
channels so RoPE leaves it alone): query ``= SEL``, key ``= KVKEY``, value ``= VAL``, output gate ``sigmoid(100) = 1``.
The zero-centred q/k norms scale unit one-hots to ``sqrt(Dh) omega``, so the logit is exactly
``LOGIT_MARGIN = sqrt(Dh) omega^2`` at the value token of the pair whose key is ``q_p`` and exactly 0 at every other
position (orthogonal one-hots or zero keys). The output writes ``ANS = sum_j w_j VAL_j`` with softmax weight
``w_c >= 1 / (1 + (L-1) e^{-LOGIT_MARGIN})`` on the right value; the LM head reads ``ANS_r`` into the logit of
``V_r`` (all other logits 0). See :mod:`lumotree.expressivity.proof` for what is proved about it.

**Ablation** (``reflection_beta < 1``): the same weights with ``allow_neg_eigval = False`` and the bit-1 write
strength set to ``reflection_beta``; then ``1 - beta |k|^2 >= 0``, row e1 never changes sign, ``PAR = +1`` for every
input and the model always answers with q_0's value: parity-blind chance.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction

import numpy as np

from ..reference import gdn
from ..reference.attention import AttentionWeights, pack_query_gate, zero_centred_rmsnorm
from ..reference.config import HybridConfig
from ..reference.gdn import GDNWeights, pack_ba, pack_qkvz
from ..reference.model import DecoderLayerWeights, HybridCache, HybridModel, MLPWeights, ModelWeights
from ..reference.tree import TokenTree
from .channels import ChannelLayout
from .task import BOS, NUM_SPECIAL, ONE, QUERY, SEP, ZERO, Instance, Vocabulary

__all__ = [
    "GAIN",
    "LOGIT_MARGIN",
    "HybridLayout",
    "hybrid_config",
    "build_hybrid",
    "HybridConstruction",
    "final_logits",
    "predict",
    "query_tree",
    "tree_predictions",
    "parity_head_inputs",
    "exact_parity_readout",
]

#: Magnitude every active pre-activation channel reaches (SiLU / sigmoid / tanh saturate exactly in float64).
GAIN = 100.0
#: Attention logit at the right value token (every other logit is 0).
LOGIT_MARGIN = 64.0
#: The parity head's write-strength logit on bit-1 tokens: ``sigmoid(100) = 1`` exactly in float64, so beta = 2.
_SATURATED_LOGIT = 100.0
_NO_DECAY_A_LOG = -100.0  # g = -e^-100 softplus(0) -> alpha = exp(g) = 1.0 in float64
_FULL_DECAY_A_LOG = math.log(100.0)  # with dt_bias = 100: g = -100 * 100 -> alpha = 0.0 in float64
_FULL_DECAY_DT_BIAS = 100.0

KINDS = ("T_BOS", "T_BIT0", "T_BIT1", "T_SEP", "T_QM", "T_KEY", "T_VAL")
_TOKEN_KIND = {BOS: "T_BOS", ZERO: "T_BIT0", ONE: "T_BIT1", SEP: "T_SEP", QUERY: "T_QM"}
PARITY_HEAD, VALUE_COPY_HEAD, PREV_HEAD = 0, 1, 2


@dataclass(frozen=True)
class HybridLayout(ChannelLayout):
    """Residual-channel indices of the construction for ``num_keys`` M and ``num_values`` R.

    Scalar channels: ``ONE``, the seven kind indicators (:data:`KINDS`), ``NOID``, ``PAR``; blocks (start index,
    length M or R): ``KEY``, ``VAL``, ``KVKEY``, ``PREV``, ``SEL``, ``ANS``.
    """

    num_keys: int
    num_values: int

    def __post_init__(self) -> None:
        Vocabulary(self.num_keys, self.num_values)  # validates the sizes
        if self.num_keys < 2:
            raise ValueError(f"num_keys = {self.num_keys}: the task needs at least 2 keys")

    def blocks(self) -> list[tuple[str, int]]:
        M, R = self.num_keys, self.num_values
        return [("ONE", 1), *((k, 1) for k in KINDS), ("NOID", 1), ("PAR", 1), ("KEY", M), ("VAL", R),
                ("KVKEY", M), ("PREV", M), ("SEL", M), ("ANS", R)]

    @property
    def head_dim(self) -> int:
        """Attention head dim: a multiple of 8 whose non-rotary 3/4 holds max(M, R) content channels."""
        return 8 * math.ceil(max(self.num_keys, self.num_values) / 6)

    def embedding(self) -> np.ndarray:
        """``[vocab, D]``: ONE + kind + identity, three ones per token."""
        vocab = Vocabulary(self.num_keys, self.num_values)
        E = np.zeros((vocab.size, self.hidden_size))  # [vocab, D]
        for token in range(vocab.size):
            E[token, self.ONE] = 1.0
            if token < NUM_SPECIAL:
                E[token, getattr(self, _TOKEN_KIND[token])] = 1.0
                E[token, self.NOID] = 1.0
            elif vocab.is_key(token):
                E[token, self.T_KEY] = 1.0
                E[token, self.KEY + vocab.key_index(token)] = 1.0
            else:
                E[token, self.T_VAL] = 1.0
                E[token, self.VAL + vocab.value_index(token)] = 1.0
        return E


def hybrid_config(layout: HybridLayout, allow_neg_eigval: bool = True, gdn_head_dims: tuple[int, int] | None = None,
                  attention_head_dim: int | None = None) -> HybridConfig:
    """The two-layer config (GDN then attention, dense MLPs) sized for ``layout``.

    ``gdn_head_dims = (K, V)`` (default ``(2, M)``) and ``attention_head_dim`` (default :attr:`HybridLayout.head_dim`)
    may be larger than needed, e.g. powers of two for the optimized kernels; the extra channels stay zero.
    """
    M = layout.num_keys
    K, V = (2, M) if gdn_head_dims is None else gdn_head_dims
    Dh = layout.head_dim if attention_head_dim is None else attention_head_dim
    for name, value, least in (("gdn_head_dims[0] (K)", K, 2), ("gdn_head_dims[1] (V)", V, M)):
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            raise ValueError(f"{name} = {value!r} must be an integer >= {least}")
    if isinstance(Dh, bool) or not isinstance(Dh, int) or Dh % 8 or Dh - Dh // 4 < max(M, layout.num_values):
        raise ValueError(f"attention_head_dim = {Dh!r} must be a multiple of 8 whose non-rotary 3/4 holds "
                         f"max(M, R) = {max(M, layout.num_values)} channels")
    return HybridConfig(
        vocab_size=NUM_SPECIAL + layout.num_keys + layout.num_values,
        hidden_size=layout.hidden_size,
        intermediate_size=2 * M,
        num_hidden_layers=2,
        layer_types=("linear_attention", "full_attention"),
        num_attention_heads=1,
        num_key_value_heads=1,
        head_dim=Dh,
        partial_rotary_factor=0.25,
        linear_num_key_heads=3,
        linear_num_value_heads=3,
        linear_key_head_dim=K,
        linear_value_head_dim=V,
        linear_conv_kernel_dim=4,
        num_experts=0,
        allow_neg_eigval=allow_neg_eigval,
    )


def _normalised_entry(hidden_size: int, ones: int, eps: float) -> float:
    """The value of each 1-entry of a 0/1 vector with ``ones`` ones after the zero-centred RMSNorm (weight 0)."""
    return 1.0 / math.sqrt(ones / hidden_size + eps)


@dataclass
class HybridConstruction:
    """The built model and what it was built from: ``layout``, ``reflection_beta`` (the parity head's write strength
    on bit-1 tokens; 2 in the construction, < 1 in the ablation)."""

    model: HybridModel
    layout: HybridLayout
    reflection_beta: float

    @property
    def vocab(self) -> Vocabulary:
        return Vocabulary(self.layout.num_keys, self.layout.num_values)


def _logit(p: float) -> float:
    return math.log(p) - math.log1p(-p)


def build_hybrid(num_keys: int, num_values: int, reflection_beta: float = 2.0,
                 gdn_head_dims: tuple[int, int] | None = None,
                 attention_head_dim: int | None = None) -> HybridConstruction:
    """The construction's weights as a :class:`~lumotree.reference.model.HybridModel` (see the module docstring).

    ``reflection_beta``: the parity head's write strength on bit-1 tokens. ``2`` (default) is the construction
    (``b = 100``, ``2 sigmoid(100) = 2.0`` in float64); a value in ``(1, 2)`` keeps the reflection's sign flip with
    magnitude ``|1 - beta|`` per bit; a value in ``(0, 1]`` is the ablation (``allow_neg_eigval = False``,
    ``beta = sigmoid(b)``, eigenvalue ``1 - beta >= 0``). ``gdn_head_dims``, ``attention_head_dim``: larger head
    sizes (see :func:`hybrid_config`), e.g. ``(16, 16)`` and ``64`` for the optimized kernels.
    """
    if not isinstance(reflection_beta, (int, float)) or isinstance(reflection_beta, bool):
        raise TypeError(f"reflection_beta = {reflection_beta!r} must be a number")
    if not 0.0 < reflection_beta <= 2.0:
        raise ValueError(f"reflection_beta = {reflection_beta} must be in (0, 2]")
    layout = HybridLayout(num_keys, num_values)
    allow_neg = reflection_beta > 1.0
    config = hybrid_config(layout, allow_neg_eigval=allow_neg, gdn_head_dims=gdn_head_dims,
                           attention_head_dim=attention_head_dim)
    M, R, D = layout.num_keys, layout.num_values, layout.hidden_size
    eps = config.rms_norm_eps
    xi = _normalised_entry(D, 3, eps)  # every active entry of a normalised embedding
    gain = GAIN / xi

    # ---------------------------------------------------------------------------------------------- layer 0: GDN
    spec = config.gdn_spec()
    H, HV, K, V, W = spec.num_k_heads, spec.num_v_heads, spec.head_k_dim, spec.head_v_dim, spec.conv_kernel
    w_q = np.zeros((H * K, D))  # [H K, D]
    w_k = np.zeros((H * K, D))  # [H K, D]
    w_v = np.zeros((HV * V, D))  # [HV V, D]
    w_z = np.zeros((HV * V, D))  # [HV V, D]
    others_than = lambda *names: [getattr(layout, k) for k in KINDS if k not in names]  # noqa: E731

    def row(head: int, channel: int, width: int) -> int:
        return head * width + channel

    # head 0: parity
    w_q[row(PARITY_HEAD, 0, K), layout.ONE] = gain
    w_k[row(PARITY_HEAD, 0, K), [layout.T_BOS, layout.T_BIT1]] = gain
    w_k[row(PARITY_HEAD, 1, K), others_than("T_BOS", "T_BIT1")] = gain
    w_v[row(PARITY_HEAD, 0, V), layout.T_BOS] = gain
    # head 1: key of the preceding token, only at value tokens
    w_q[row(VALUE_COPY_HEAD, 0, K), layout.T_VAL] = gain
    w_q[row(VALUE_COPY_HEAD, 1, K), others_than("T_VAL")] = gain
    w_k[row(VALUE_COPY_HEAD, 0, K), layout.ONE] = gain
    # head 2: key of the preceding token, everywhere
    w_q[row(PREV_HEAD, 0, K), layout.ONE] = gain
    w_k[row(PREV_HEAD, 0, K), layout.ONE] = gain
    for head in (VALUE_COPY_HEAD, PREV_HEAD):
        for i in range(M):
            w_v[row(head, i, V), layout.KEY + i] = gain
    w_z[:, layout.ONE] = gain  # silu(z) = GAIN on every head and channel

    conv = np.zeros((spec.conv_dim, W))  # [C, W]; column W - 1 is the current token
    conv[:, W - 1] = 1.0
    v_offset = 2 * spec.key_dim
    for head in (VALUE_COPY_HEAD, PREV_HEAD):  # these value channels read the previous token instead
        channels = slice(v_offset + head * V, v_offset + (head + 1) * V)
        conv[channels, W - 1] = 0.0
        conv[channels, W - 2] = 1.0

    w_b = np.zeros((HV, D))  # [HV, D]
    w_a = np.zeros((HV, D))  # [HV, D]
    if reflection_beta == 2.0:
        bit_one_logit = _SATURATED_LOGIT
    elif allow_neg:
        bit_one_logit = _logit(reflection_beta / 2.0)
    else:
        bit_one_logit = _SATURATED_LOGIT if reflection_beta == 1.0 else _logit(reflection_beta)
    w_b[PARITY_HEAD, layout.T_BIT1] = bit_one_logit / xi
    w_b[[VALUE_COPY_HEAD, PREV_HEAD], layout.ONE] = _SATURATED_LOGIT / xi  # any positive beta works for the copies
    A_log = np.array([_NO_DECAY_A_LOG, _FULL_DECAY_A_LOG, _FULL_DECAY_A_LOG])  # [HV]
    dt_bias = np.array([0.0, _FULL_DECAY_DT_BIAS, _FULL_DECAY_DT_BIAS])  # [HV]

    # gated RMSNorm output of a head is sqrt(V) GAIN on its one active channel: write 1 into the residual
    unit = 1.0 / (math.sqrt(V) * GAIN)
    out_proj = np.zeros((D, HV * V))  # [D, HV V]
    out_proj[layout.PAR, PARITY_HEAD * V + 0] = unit
    for i in range(M):
        out_proj[layout.KVKEY + i, VALUE_COPY_HEAD * V + i] = unit
        out_proj[layout.PREV + i, PREV_HEAD * V + i] = unit
    mixer0 = GDNWeights(
        in_proj_qkvz=pack_qkvz(w_q, w_k, w_v, w_z, H), in_proj_ba=pack_ba(w_b, w_a, H), conv1d=conv,
        A_log=A_log, dt_bias=dt_bias, norm=np.ones(V), out_proj=out_proj,
    )

    # ---------------------------------------------------------------------------------------------- layer 0: MLP
    # after layer 0 a position holds at most 6 unit entries (3 embedding, PAR, KVKEY, PREV): |normalised PAR| >= xi6
    xi6 = _normalised_entry(D, 6, eps)
    selector_gain = GAIN / xi6
    gate = np.zeros((2 * M, D))  # [2M, D]
    up = np.zeros((2 * M, D))  # [2M, D]
    down = np.zeros((D, 2 * M))  # [D, 2M]
    for i in range(M):
        gate[i, layout.PAR] = -selector_gain  # open when PAR < 0 (odd parity): take the current key
        up[i, layout.KEY + i] = 1.0
        gate[M + i, layout.PAR] = selector_gain  # open when PAR > 0 (even parity): take the previous key
        up[M + i, layout.PREV + i] = 1.0
        down[layout.SEL + i, i] = 1.0 / (GAIN * xi6)
        down[layout.SEL + i, M + i] = 1.0 / (GAIN * xi6)
    layer0 = DecoderLayerWeights(np.zeros(D), mixer0, np.zeros(D), MLPWeights(gate, up, down))

    # ---------------------------------------------------------------------------------------------- layer 1: attention
    att = config.attention_spec()
    Dh, rd = att.head_dim, att.rotary_dim
    w_query = np.zeros((Dh, D))  # [Dh, D] (one head)
    w_gate = np.zeros((Dh, D))  # [Dh, D]
    k_proj = np.zeros((Dh, D))  # [Dh, D]
    v_proj = np.zeros((Dh, D))  # [Dh, D]
    o_proj = np.zeros((D, Dh))  # [D, Dh]
    for i in range(M):
        w_query[rd + i, layout.SEL + i] = 1.0
        k_proj[rd + i, layout.KVKEY + i] = 1.0
    for r in range(R):
        v_proj[rd + r, layout.VAL + r] = 1.0
        o_proj[layout.ANS + r, rd + r] = 1.0
    w_gate[:, layout.ONE] = _SATURATED_LOGIT / _normalised_entry(D, 12, eps)  # >= 100 at every position
    # one-hots of any size become sqrt(Dh) (1 + w) after the q/k norms: logit = Dh^-1/2 Dh omega^2
    omega = math.sqrt(LOGIT_MARGIN / math.sqrt(Dh))
    mixer1 = AttentionWeights(
        q_proj=pack_query_gate(w_query, w_gate, 1), k_proj=k_proj, v_proj=v_proj, o_proj=o_proj,
        q_norm=np.full(Dh, omega - 1.0), k_norm=np.full(Dh, omega - 1.0),
    )
    I = config.intermediate_size
    layer1 = DecoderLayerWeights(np.zeros(D), mixer1, np.zeros(D),
                                 MLPWeights(np.zeros((I, D)), np.zeros((I, D)), np.zeros((D, I))))

    # ---------------------------------------------------------------------------------------------- embedding, head
    vocab = Vocabulary(M, R)
    lm_head = np.zeros((vocab.size, D))  # [vocab, D]
    for r in range(R):
        lm_head[vocab.value(r), layout.ANS + r] = 1.0
    weights = ModelWeights(layout.embedding(), [layer0, layer1], np.zeros(D), lm_head)
    return HybridConstruction(HybridModel(config, weights), layout, float(reflection_beta))


# ====================================================================================================== running it
def _check_instance(construction: HybridConstruction, instance: Instance) -> None:
    if (instance.num_keys, instance.num_values) != (construction.layout.num_keys, construction.layout.num_values):
        raise ValueError(
            f"instance has M = {instance.num_keys}, R = {instance.num_values} but the construction was built for "
            f"M = {construction.layout.num_keys}, R = {construction.layout.num_values}"
        )


def final_logits(model: HybridModel, tokens: Sequence[int], chunk: int = 512,
                 cache: HybridCache | None = None) -> np.ndarray:
    """Logits ``[vocab]`` at the last token, prefilling through ``model.forward`` in chunks of ``chunk`` tokens (the
    chain path; chunking bounds the attention score matrix). ``cache`` (default: a new one) is advanced."""
    tokens = np.asarray(tokens, dtype=np.int64)
    if chunk < 1:
        raise ValueError(f"chunk = {chunk} must be positive")
    cache = model.new_cache() if cache is None else cache
    logits = None
    for start in range(0, tokens.shape[0], chunk):
        logits = model.forward(tokens[start : start + chunk], cache)  # [T, vocab]
    if logits is None:
        raise ValueError("tokens is empty")
    return logits[-1]


def predict(construction: HybridConstruction, instances: Sequence[Instance], chunk: int = 512) -> list[int]:
    """The argmax at the last input token of each instance (chain path)."""
    out = []
    for inst in instances:
        _check_instance(construction, inst)
        out.append(int(np.argmax(final_logits(construction.model, inst.tokens, chunk))))
    return out


def query_tree(instance: Instance) -> tuple[TokenTree, list[tuple[int, int]]]:
    """A draft tree asking every ordered query pair at once: root ``?``, one child per key ``q_0``, under it one leaf
    per other key ``q_1``. Returns the tree (with tokens) and, per node, the pair it completes (``(-1, -1)`` for
    inner nodes)."""
    vocab = instance.vocab
    keys = sorted(instance.keys)
    parents, tokens, pairs = [-1], [QUERY], [(-1, -1)]
    for q0 in keys:
        parents.append(0)
        tokens.append(vocab.key(q0))
        pairs.append((-1, -1))
        node = len(parents) - 1
        for q1 in keys:
            if q1 != q0:
                parents.append(node)
                tokens.append(vocab.key(q1))
                pairs.append((q0, q1))
    return TokenTree(parents, tokens), pairs


def tree_predictions(construction: HybridConstruction, instance: Instance, chunk: int = 512):
    """Prefill ``BOS bits SEP pairs`` (chain path), then run :func:`query_tree` through ``model.verify_tree``.

    Returns ``(tree_logits [N, vocab], pairs)``: the tree path's logits at every node and the query pair each leaf
    completes. The leaf for ``(q_0, q_1)`` must predict the answer of the instance with those queries.
    """
    _check_instance(construction, instance)
    prefix = instance.tokens[:-3]  # up to the last value, '?' becomes the tree root
    cache = construction.model.new_cache()
    final_logits(construction.model, prefix, chunk, cache)
    tree, pairs = query_tree(instance)
    return construction.model.verify_tree(None, tree, cache), pairs


# ====================================================================================================== exact parity
def parity_head_inputs(construction: HybridConstruction, tokens: Sequence[int]):
    """The parity head's core inputs on ``tokens``, computed by the reference layer's own input path
    (embedding, zero-centred RMSNorm, projections, short conv, SiLU, l2norm, gates).

    Returns float64 ``(q [T, 1, K], k [T, 1, K], v [T, 1, V], alpha [T, 1], beta [T, 1])``.
    """
    model = construction.model
    ids = np.asarray(tokens, dtype=np.int64)
    layer = model.weights.layers[0]
    x = zero_centred_rmsnorm(model.weights.embed_tokens[ids], layer.input_layernorm, model.config.rms_norm_eps)
    spec = model.config.gdn_spec()
    path = TokenTree.chain(ids.shape[0])
    conv_state = np.zeros((spec.conv_kernel - 1, spec.conv_dim))  # [W - 1, C]
    _, q, k, v, _, alpha, beta = gdn.gdn_layer_inputs(x, layer.mixer, spec, conv_state, path)
    h = PARITY_HEAD
    return q[:, h : h + 1], k[:, h : h + 1], v[:, h : h + 1], alpha[:, h : h + 1], beta[:, h : h + 1]


def _exact(a: np.ndarray) -> np.ndarray:
    """Float64 -> Fraction, exactly (every float is a dyadic rational)."""
    return np.vectorize(Fraction, otypes=[object])(np.asarray(a, dtype=np.float64))


def exact_parity_readout(construction: HybridConstruction, tokens: Sequence[int]) -> np.ndarray:
    """The parity head's readout ``o_t[0]`` for every token, in exact rational arithmetic: the float64 core inputs
    of :func:`parity_head_inputs` converted exactly to ``Fraction`` and run through
    :func:`lumotree.reference.gdn.chain` from ``S0 = 0``. Returns ``[T]`` Fractions (sign = ``(-1)^{p_t}``)."""
    q, k, v, alpha, beta = (_exact(a) for a in parity_head_inputs(construction, tokens))
    S0 = np.zeros((1, k.shape[-1], v.shape[-1]), dtype=object)
    S0[...] = Fraction(0)
    o, _ = gdn.chain(q, k, v, alpha, beta, S0, scale=Fraction(1))
    return o[:, 0, 0]
