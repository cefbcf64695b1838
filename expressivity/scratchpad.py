r"""Pure gated attention with a scratchpad: an explicit construction that writes the running parity, then answers.

The model is the reference :class:`~lumotree.reference.model.HybridModel` with four ``full_attention`` layers and no
GDN layer. Its vocabulary is the task's plus two scratch tokens ``s0, s1``. After the input it generates, greedily,
``s_1 .. s_n`` (``s_i = b_1 xor .. xor b_i``) and then the answer: a scratchpad of exactly ``n`` tokens.

**Why O(1) scratchpad tokens cannot work at constant precision.** With a constant number of scratchpad tokens, a
constant-depth transformer whose activations have a constant number of bits computes a function in AC^0 (Li, Liu,
Zhou, Ma 2024, *Chain of Thought Empowers Transformers to Solve Inherently Serial Problems*, ICLR; see also Hao,
Angluin, Frank 2022 for hard attention, Hahn 2020 for the sensitivity bound of soft attention). Fixing the key-value
region so that the two query slots hold different values turns any solver of our task into a parity circuit, and
parity is not in AC^0 (Furst, Saxe, Sipser 1984; Hastad 1986). With O(n) scratchpad tokens the same models compute
parity step by step (Merrill & Sabharwal 2024, *The Expressive Power of Transformers with Chain of Thought*, ICLR),
at O(log n) bits of precision, which is what this construction uses: it locates "the i-th bit" by comparing counts.

**Layers** (every activation is a normalised residual; a count ``c`` divided by ``t + 1`` is how uniform causal
attention reports it, and the zero-centred q/k norms turn a pair ``(a, N) / (t + 1)`` into the unit vector
``phi(a) = (a, N) / |(a, N)|``, independent of ``t``: the *layer-norm hash*, whose dot products
``phi(a) . phi(b)`` peak exactly at ``a = b``, by at least ``1 - cos(1 / (2N))`` for ``a, b <= N``):

1. one head with query 0 (uniform over the prefix): ``X = 1/(t+1)`` and ``CS = #scratch/(t+1)``.
2. head *prev* (query ``phi(t - 1)`` from ``(1 - 2X, N X)``, key ``phi(t)`` from ``(1 - X, N X)``): copies the
   previous token's kind and key identity. Head *bit* (query ``phi(i + 1)`` from ``(CS + X, N X)``, key ``phi(t)``
   from ``(1 - X, N X)`` at the bits, ``t = 1..n``, and at SEP, ``t = n + 1``; every other key pushed off by a large
   third component): reads bit ``i + 1``, or SEP once all bits are consumed (``RB1``, ``RSEP``). MLP (SiLU gates
   that are exactly 0 or linear in float64): the next scratch token ``s xor b`` as two logit channels (off once
   ``RSEP``), the q_0 / q_1 markers (a key after ``?`` / after a key) and ``KVKEY`` (a value token's key).
3. head *select*: a scratch token ``s_p`` queries the q_p marker and copies that query's key identity (``SELKEY``).
4. head *answer*: ``SELKEY`` queries ``KVKEY`` and copies the value (``ANS``), read by the LM head.

Hash heads use a logit scale ``64 / (1 - cos(1/(2N)))``; ``N = max_length`` bounds the positions (float64 keeps the
hash exact to well beyond N = 2^14; the eps of the q/k norms is made negligible by a large pre-norm gain).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..reference.attention import AttentionWeights, pack_query_gate
from ..reference.config import HybridConfig
from ..reference.model import DecoderLayerWeights, HybridModel, MLPWeights, ModelWeights
from .channels import ChannelLayout
from .task import BOS, NUM_SPECIAL, ONE, QUERY, SEP, ZERO, Instance, Vocabulary

__all__ = ["ScratchpadLayout", "ScratchpadConstruction", "build_scratchpad", "generate", "ScratchpadRun"]

KINDS = ("IS_BOS", "IS_BIT0", "IS_BIT1", "IS_SEP", "IS_QM", "IS_KEY", "IS_VAL", "IS_S0", "IS_S1")
_TOKEN_KIND = {BOS: "IS_BOS", ZERO: "IS_BIT0", ONE: "IS_BIT1", SEP: "IS_SEP", QUERY: "IS_QM"}
_LOGIT = 64.0  # softmax margin of every head at its target (target logit minus the best other logit)
_GATE = 100.0  # sigmoid(100) = 1 and silu(-100) = 0 exactly in float64
_KEY_GAIN = 1e6  # pre-norm gain: q/k norm eps (1e-6) becomes negligible against the hash gap


@dataclass(frozen=True)
class ScratchpadLayout(ChannelLayout):
    """Residual channels of the scratchpad construction (see the module docstring for what each one holds)."""

    num_keys: int
    num_values: int

    def __post_init__(self) -> None:
        Vocabulary(self.num_keys, self.num_values)

    def blocks(self) -> list[tuple[str, int]]:
        M, R = self.num_keys, self.num_values
        return [("ONE", 1), *((k, 1) for k in KINDS), ("NOID", 1), ("KEY", M), ("VAL", R),
                ("X", 1), ("CS", 1),
                ("PREV_QM", 1), ("PREV_KEY", 1), ("PREV_KEYID", M), ("RB1", 1), ("RSEP", 1),
                ("LOGIT_S0", 1), ("LOGIT_S1", 1), ("Q0MARK", 1), ("Q1MARK", 1), ("KVKEY", M),
                ("SELKEY", M), ("ANS", R)]

    @property
    def vocab_size(self) -> int:
        """Task vocabulary plus ``s0, s1``."""
        return NUM_SPECIAL + self.num_keys + self.num_values + 2

    @property
    def s0(self) -> int:
        return NUM_SPECIAL + self.num_keys + self.num_values

    @property
    def s1(self) -> int:
        return self.s0 + 1

    @property
    def head_dim(self) -> int:
        return 8 * math.ceil((max(self.num_keys, self.num_values) + 3) / 6)

    def embedding(self) -> np.ndarray:
        """``[vocab, D]``: ONE + kind + identity (NOID for special and scratch tokens), three ones per token."""
        vocab = Vocabulary(self.num_keys, self.num_values)
        E = np.zeros((self.vocab_size, self.hidden_size))  # [vocab, D]
        for token in range(self.vocab_size):
            E[token, self.ONE] = 1.0
            if token < NUM_SPECIAL:
                E[token, getattr(self, _TOKEN_KIND[token])] = 1.0
                E[token, self.NOID] = 1.0
            elif vocab.is_key(token):
                E[token, [self.IS_KEY, self.KEY + vocab.key_index(token)]] = 1.0
            elif vocab.is_value(token):
                E[token, [self.IS_VAL, self.VAL + vocab.value_index(token)]] = 1.0
            else:
                E[token, [self.IS_S0 if token == self.s0 else self.IS_S1, self.NOID]] = 1.0
        return E


@dataclass
class ScratchpadConstruction:
    """The built pure-attention model, its layout and ``max_length`` (the largest position the hash separates)."""

    model: HybridModel
    layout: ScratchpadLayout
    max_length: int


def _hash_logit_scale(max_length: int) -> float:
    """``64 / (1 - cos(1 / (2N)))``: the hash's smallest gap between distinct counts up to N, scaled to margin 64."""
    half_angle = 0.5 / max_length
    gap = 2.0 * math.sin(half_angle / 2.0) ** 2  # 1 - cos(x), without cancellation
    return _LOGIT / gap


class _Weights:
    """Accumulates one attention layer's per-head projections (plain ``[Hq Dh, D]`` blocks)."""

    def __init__(self, heads: int, head_dim: int, hidden: int):
        self.heads, self.Dh, self.D = heads, head_dim, hidden
        self.query = np.zeros((heads * head_dim, hidden))  # [Hq Dh, D]
        self.gate = np.zeros((heads * head_dim, hidden))  # [Hq Dh, D]
        self.key = np.zeros((heads * head_dim, hidden))  # [Hkv Dh, D]
        self.value = np.zeros((heads * head_dim, hidden))  # [Hkv Dh, D]
        self.out = np.zeros((hidden, heads * head_dim))  # [D, Hq Dh]
        self.norm_scale = np.ones(head_dim)  # (1 + w) of both q and k norms, per channel

    def row(self, head: int, channel: int) -> int:
        return head * self.Dh + channel

    def build(self, gate_logit_weight: float, one: int) -> AttentionWeights:
        self.gate[:, one] = gate_logit_weight
        return AttentionWeights(pack_query_gate(self.query, self.gate, self.heads), self.key, self.value, self.out,
                                self.norm_scale - 1.0, self.norm_scale - 1.0)


def build_scratchpad(num_keys: int, num_values: int, max_length: int = 4096) -> ScratchpadConstruction:
    """The pure-attention scratchpad construction (see the module docstring); valid for sequences (input plus
    scratchpad) of at most ``max_length`` tokens."""
    if isinstance(max_length, bool) or not isinstance(max_length, int) or not 8 <= max_length <= 2**16:
        raise ValueError(f"max_length = {max_length!r} must be an integer in [8, 65536]")
    layout = ScratchpadLayout(num_keys, num_values)
    M, R, D = layout.num_keys, layout.num_values, layout.hidden_size
    Dh = layout.head_dim
    rd = Dh // 4
    heads = 2
    config = HybridConfig(
        vocab_size=layout.vocab_size, hidden_size=D, intermediate_size=max(2 * M + 8, 16), num_hidden_layers=4,
        layer_types=("full_attention",) * 4, num_attention_heads=heads, num_key_value_heads=heads, head_dim=Dh,
        partial_rotary_factor=0.25, num_experts=0,
    )
    eps = config.rms_norm_eps
    N = float(max_length)
    # every embedding has three ones: after the input norm each is xi
    xi = 1.0 / math.sqrt(3.0 / D + eps)
    # the largest residual this construction builds has fewer than 24 entries of size <= 1 (checked by the bound
    # below being used only where a lower bound of the normalised ONE channel is needed)
    one_floor = 1.0 / math.sqrt(24.0 / D + eps)
    gate_weight = _GATE / one_floor
    L = layout
    I = config.intermediate_size

    def dense(units: list[tuple[dict[int, float], dict[int, float], dict[int, float]]]) -> MLPWeights:
        gate, up, down = np.zeros((I, D)), np.zeros((I, D)), np.zeros((D, I))  # [I, D], [I, D], [D, I]
        for u, (g, p, d) in enumerate(units):
            for c, w in g.items():
                gate[u, c] = w
            for c, w in p.items():
                up[u, c] = w
            for c, w in d.items():
                down[c, u] = w
        return MLPWeights(gate, up, down)

    # ------------------------------------------------------------------------------------------- layer 1: counts
    a1 = _Weights(heads, Dh, D)  # query 0: uniform attention over the prefix
    a1.value[a1.row(0, 0), L.IS_BOS] = 1.0 / xi  # X = 1 / (t + 1)
    a1.value[a1.row(0, 1), [L.IS_S0, L.IS_S1]] = 1.0 / xi  # CS = #scratch / (t + 1)
    a1.out[L.X, a1.row(0, 0)] = 1.0
    a1.out[L.CS, a1.row(0, 1)] = 1.0
    mlp1 = dense([])

    # ------------------------------------------------------------------------------------------- layer 2: hashes
    a2 = _Weights(heads, Dh, D)
    hash_scale = _hash_logit_scale(max_length)
    omega_hash = math.sqrt(hash_scale / math.sqrt(Dh))
    a2.norm_scale[rd : rd + 3] = omega_hash
    # head 0: previous token. query ~ (t - 1, N), key ~ (t, N) (all divided by t + 1)
    h = 0
    a2.query[a2.row(h, rd + 0), [L.ONE, L.X]] = [_KEY_GAIN, -2.0 * _KEY_GAIN]
    a2.query[a2.row(h, rd + 1), L.X] = N * _KEY_GAIN
    a2.key[a2.row(h, rd + 0), [L.ONE, L.X]] = [_KEY_GAIN, -_KEY_GAIN]
    a2.key[a2.row(h, rd + 1), L.X] = N * _KEY_GAIN
    copies = [(L.IS_QM, L.PREV_QM), (L.IS_KEY, L.PREV_KEY)] + [(L.KEY + i, L.PREV_KEYID + i) for i in range(M)]
    for j, (src, dst) in enumerate(copies):
        a2.value[a2.row(h, j), src] = 1.0 / xi
        a2.out[dst, a2.row(h, j)] = 1.0
    # head 1: bit i + 1 (or SEP when i = n). query ~ (i + 1, N); key ~ (j, N) at bits, (n + 1, N) at SEP
    h = 1
    a2.query[a2.row(h, rd + 0), [L.CS, L.X]] = [_KEY_GAIN, _KEY_GAIN]
    a2.query[a2.row(h, rd + 1), L.X] = N * _KEY_GAIN
    a2.key[a2.row(h, rd + 0), [L.ONE, L.X]] = [_KEY_GAIN, -_KEY_GAIN]  # phi(t): bit j sits at t = j, SEP at n + 1
    a2.key[a2.row(h, rd + 1), L.X] = N * _KEY_GAIN
    push = 1e3 * (N + 1) * _KEY_GAIN  # keys of other tokens point (almost) along a third axis
    a2.key[a2.row(h, rd + 2), [L.ONE, L.IS_BIT0, L.IS_BIT1, L.IS_SEP]] = [push, -push, -push, -push]
    for j, (src, dst) in enumerate(((L.IS_BIT1, L.RB1), (L.IS_SEP, L.RSEP))):
        a2.value[a2.row(h, j), src] = 1.0 / xi
        a2.out[dst, a2.row(h, j)] = 1.0
    # MLP 2 (inputs normalised; every threshold is relative to ONE, so the common 1/rms scale cancels)
    G = _GATE * 4.0 / one_floor
    logit_size = 10.0 / (G * 0.5)  # a firing unit gives about G/2 * ONE_normalised; scaled to ~10 logit units
    S, B1, DONE, ONEc = L.IS_S1, L.RB1, L.RSEP, L.ONE
    units = [
        # next scratch token s xor b, only while not done (RSEP ~ 0)
        ({S: G, B1: -G, ONEc: -0.5 * G, DONE: -G}, {ONEc: 1.0}, {L.LOGIT_S1: logit_size}),  # s=1, b=0
        ({S: -G, B1: G, ONEc: -0.5 * G, DONE: -G}, {ONEc: 1.0}, {L.LOGIT_S1: logit_size}),  # s=0, b=1
        ({S: G, B1: G, ONEc: -1.5 * G, DONE: -G}, {ONEc: 1.0}, {L.LOGIT_S0: logit_size}),  # s=1, b=1
        ({S: -G, B1: -G, ONEc: 0.5 * G, DONE: -G}, {ONEc: 1.0}, {L.LOGIT_S0: logit_size}),  # s=0, b=0
        # query markers: q_0 is a key after '?', q_1 a key after a key
        ({L.IS_KEY: G, L.PREV_QM: G, ONEc: -1.5 * G}, {ONEc: 1.0}, {L.Q0MARK: 1.0}),
        ({L.IS_KEY: G, L.PREV_KEY: G, ONEc: -1.5 * G}, {ONEc: 1.0}, {L.Q1MARK: 1.0}),
    ]
    units += [({L.IS_VAL: G, L.PREV_KEYID + i: G, ONEc: -1.5 * G}, {ONEc: 1.0}, {L.KVKEY + i: 1.0})
              for i in range(M)]
    mlp2 = dense(units)

    # ------------------------------------------------------------------------------------------- layer 3: select
    a3 = _Weights(heads, Dh, D)
    omega = math.sqrt(_LOGIT / math.sqrt(Dh))
    a3.norm_scale[rd:] = omega
    a3.query[a3.row(0, rd + 0), L.IS_S0] = 1.0
    a3.query[a3.row(0, rd + 1), L.IS_S1] = 1.0
    a3.key[a3.row(0, rd + 0), L.Q0MARK] = 1.0
    a3.key[a3.row(0, rd + 1), L.Q1MARK] = 1.0
    for i in range(M):
        a3.value[a3.row(0, i), L.KEY + i] = 1.0 / xi
        a3.out[L.SELKEY + i, a3.row(0, i)] = 1.0

    # ------------------------------------------------------------------------------------------- layer 4: answer
    a4 = _Weights(heads, Dh, D)
    a4.norm_scale[rd:] = omega
    for i in range(M):
        a4.query[a4.row(0, rd + i), L.SELKEY + i] = 1.0
        a4.key[a4.row(0, rd + i), L.KVKEY + i] = 1.0
    for r in range(R):
        a4.value[a4.row(0, r), L.VAL + r] = 1.0 / xi
        a4.out[L.ANS + r, a4.row(0, r)] = 1.0

    zero_mlp = dense([])
    layers = [
        DecoderLayerWeights(np.zeros(D), a1.build(gate_weight, L.ONE), np.zeros(D), mlp1),
        DecoderLayerWeights(np.zeros(D), a2.build(gate_weight, L.ONE), np.zeros(D), mlp2),
        DecoderLayerWeights(np.zeros(D), a3.build(gate_weight, L.ONE), np.zeros(D), zero_mlp),
        DecoderLayerWeights(np.zeros(D), a4.build(gate_weight, L.ONE), np.zeros(D), zero_mlp),
    ]
    vocab = Vocabulary(M, R)
    lm_head = np.zeros((layout.vocab_size, D))  # [vocab, D]
    lm_head[layout.s0, L.LOGIT_S0] = 1.0
    lm_head[layout.s1, L.LOGIT_S1] = 1.0
    for r in range(R):
        lm_head[vocab.value(r), L.ANS + r] = 1.0
    weights = ModelWeights(layout.embedding(), layers, np.zeros(D), lm_head)
    return ScratchpadConstruction(HybridModel(config, weights), layout, max_length)


@dataclass(frozen=True)
class ScratchpadRun:
    """One generation: ``scratchpad`` (the generated tokens before the answer), ``answer`` (the first generated
    value token, or -1 if none came within the budget), ``correct``, ``parities_right`` (scratchpad = running
    parity)."""

    scratchpad: tuple[int, ...]
    answer: int
    correct: bool
    parities_right: bool


def generate(construction: ScratchpadConstruction, instance: Instance, chunk: int = 512,
             max_new_tokens: int | None = None) -> ScratchpadRun:
    """Greedy decoding with the model's cache (``forward``, one token at a time after a chunked prefill) until a
    value token appears or ``max_new_tokens`` (default ``2n + 4``) tokens were generated."""
    layout = construction.layout
    if (instance.num_keys, instance.num_values) != (layout.num_keys, layout.num_values):
        raise ValueError(f"instance has M = {instance.num_keys}, R = {instance.num_values}; the construction was built "
                         f"for M = {layout.num_keys}, R = {layout.num_values}")
    n = len(instance.bits)
    budget = 2 * n + 4 if max_new_tokens is None else max_new_tokens
    if instance.spec.length + budget > construction.max_length:
        raise ValueError(f"input length {instance.spec.length} + {budget} generated tokens exceeds max_length = "
                         f"{construction.max_length} of this construction")
    model = construction.model
    vocab = instance.vocab
    cache = model.new_cache()
    tokens = instance.tokens
    logits = None
    for start in range(0, tokens.shape[0], chunk):
        logits = model.forward(tokens[start : start + chunk], cache)
    generated: list[int] = []
    nxt = int(np.argmax(logits[-1]))
    while True:
        generated.append(nxt)
        if vocab.is_value(nxt) or len(generated) >= budget:
            break
        nxt = int(np.argmax(model.forward([nxt], cache)[-1]))
    answer = generated[-1] if vocab.is_value(generated[-1]) else -1
    scratch = tuple(generated[:-1] if answer >= 0 else generated)
    running = np.cumsum(instance.bits) % 2
    expected = tuple(layout.s1 if b else layout.s0 for b in running)
    return ScratchpadRun(scratch, answer, answer == instance.answer, scratch == expected)


def run_many(construction: ScratchpadConstruction, instances: Sequence[Instance]) -> list[ScratchpadRun]:
    return [generate(construction, inst) for inst in instances]
