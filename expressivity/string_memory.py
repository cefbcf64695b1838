r"""A hand-built pure Gated DeltaNet for PCR-S: parity plus an exact associative memory over ``2^L0`` key slots.

This is the pure-GDN solver of single-token PCR (a first layer computing the parity as the hybrid's does, a second
an exact associative memory over one-hot keys in place of attention) carried over to string keys. It is the
strongest pure-GDN solver we know, and it is what the lower bound must hold against: it answers **every** input
whose keys have at most ``L0`` letters (its width grows as ``2^L0``), and it must fail once keys are longer, as every
fixed-size pure-GDN model must (:mod:`~lumotree.expressivity.lower_bound`); the adversary exhibits such failures.

Three GDN layers (every layer ``linear_attention``), ``N = 2^L0`` slots:

- **layer 0**: the parity head and the encode head of :mod:`~lumotree.expressivity.string_hybrid` (``PAR``, the unit
  vector ``ENC`` of ``(x, c)`` with ``x / c`` the binary fraction of the reversed key). **MLP 0** turns the ratio into a
  one-hot ``SLOT`` over N bins: for bin j the three units ``silu(g (d + 1)), silu(g d), silu(g (d - 1))`` with
  ``d = N x / c - j`` combine to the hat ``max(0, 1 - |d|)``; for a key of ``L <= L0`` letters ``N x / c`` is an
  integer, every SiLU argument is 0 or at least 40 in size (SiLU is then exactly ReLU) and ``SLOT`` is the one-hot
  of the key (up to rounding of order 1e-13). Longer keys fall between bins and alias.
- **layer 1**: head *hold* snapshots the previous token's ``SLOT`` at the comma (``q_0``'s slot); **MLP 1**
  selects ``SEL = HOLD`` if ``PAR > 0`` else ``SLOT`` (the slot of ``q_p`` at the last token).
- **layer 2**: head *memory*, ``alpha = 1``; at a value token ``beta = 1``, key = the previous token's ``SLOT``
  (conv tap ``t - 1``), value = the value's one-hot: the delta rule ``S <- (I - k k^T) S + k v^T`` overwrites row
  ``k``. At the last token the query ``SEL`` reads the row of ``q_p``: the answer.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..reference.config import HybridConfig
from ..reference.gdn import GDNWeights, pack_ba, pack_qkvz
from ..reference.model import DecoderLayerWeights, HybridModel, MLPWeights, ModelWeights
from .channels import ChannelLayout
from .hybrid import final_logits
from .string_hybrid import (_BIG, _SAT, ENCODE_GAIN, KINDS, StringHybridLayout, _exact_weight, _gate_weight,
                            _normalised_entry)
from .string_task import StringInstance, StringVocabulary

__all__ = ["MemoryLayout", "StringMemory", "build_string_memory", "predict"]


@dataclass(frozen=True)
class MemoryLayout(ChannelLayout):
    """Residual channels: ``ONE``, the kinds, ``NOID``, ``VAL`` (R), ``PAR``, ``ENC`` (2), ``SLOT``, ``HOLD``,
    ``SEL`` (``2^slot_bits`` each), ``ANS`` (R)."""

    num_values: int
    slot_bits: int

    def __post_init__(self) -> None:
        StringVocabulary(self.num_values)
        if isinstance(self.slot_bits, bool) or not isinstance(self.slot_bits, int) or not 1 <= self.slot_bits <= 8:
            raise ValueError(f"slot_bits = {self.slot_bits!r} must be an integer in [1, 8] (2^slot_bits slots)")

    @property
    def slots(self) -> int:
        return 1 << self.slot_bits

    def blocks(self) -> list[tuple[str, int]]:
        R, N = self.num_values, self.slots
        return [("ONE", 1), *((k, 1) for k in KINDS), ("NOID", 1), ("VAL", R), ("PAR", 1), ("ENC", 2),
                ("SLOT", N), ("HOLD", N), ("SEL", N), ("ANS", R)]

    def embedding(self) -> np.ndarray:
        """The string hybrid's embedding (ONE + kind + identity) placed in this layout."""
        base = StringHybridLayout(self.num_values)
        E = np.zeros((StringVocabulary(self.num_values).size, self.hidden_size))  # [vocab, D]
        for name in ("ONE", *KINDS, "NOID"):
            E[:, getattr(self, name)] = base.embedding()[:, getattr(base, name)]
        E[:, self.VAL : self.VAL + self.num_values] = base.embedding()[:, base.VAL : base.VAL + self.num_values]
        return E


@dataclass
class StringMemory:
    """The built pure-GDN model with its layout (``slot_bits`` = L0, the longest key it stores exactly)."""

    model: HybridModel
    layout: MemoryLayout

    @property
    def vocab(self) -> StringVocabulary:
        return StringVocabulary(self.layout.num_values)


def build_string_memory(num_values: int, slot_bits: int = 2) -> StringMemory:
    """The construction of the module docstring: R values, ``2^slot_bits`` slots (exact for keys of at most
    ``slot_bits`` letters)."""
    layout = MemoryLayout(num_values, slot_bits)
    L, R, N, D = layout, layout.num_values, layout.slots, layout.hidden_size
    H, K, V, W = 2, max(2, N), max(3, N, R), 4
    config = HybridConfig(
        vocab_size=StringVocabulary(R).size, hidden_size=D, intermediate_size=3 * N, num_hidden_layers=3,
        layer_types=("linear_attention",) * 3, linear_num_key_heads=H, linear_num_value_heads=H,
        linear_key_head_dim=K, linear_value_head_dim=V, linear_conv_kernel_dim=W, num_experts=0,
        allow_neg_eigval=True, num_attention_heads=1, num_key_value_heads=1, head_dim=8, rms_norm_eps=1e-6,
    )
    spec = config.gdn_spec()
    letters = [L.T_LA, L.T_LB]
    every_kind = [getattr(L, k) for k in KINDS]
    non_letters = [c for c in every_kind if c not in letters]
    I = config.intermediate_size

    def parts():
        return (np.zeros((H * K, D)), np.zeros((H * K, D)), np.zeros((H * V, D)), np.zeros((H * V, D)),
                np.zeros((H, D)), np.zeros((H, D)))

    def conv(previous: list[slice]) -> np.ndarray:
        c = np.zeros((spec.conv_dim, W))  # [C, W]
        c[:, W - 1] = 1.0
        for channels in previous:
            c[channels, W - 1] = 0.0
            c[channels, W - 2] = 1.0
        return c

    unit = 1.0 / (math.sqrt(V) * _SAT)  # a gated-RMSNorm output entry of size sqrt(V) * 100 becomes 1

    # ------------------------------------------------------------------------------------------ layer 0
    xi = _normalised_entry(D, 3.0)
    big = _BIG / xi
    w_q, w_k, w_v, w_z, w_b, w_a = parts()
    w_q[0 * K, L.ONE] = big  # parity head (as in the string hybrid)
    w_k[0 * K + 0, [L.T_BOS, L.T_BIT1]] = big
    w_k[0 * K + 1, [c for c in every_kind if c not in (L.T_BOS, L.T_BIT1)]] = big
    w_v[0 * V + 0, L.T_BOS] = _exact_weight(xi, ENCODE_GAIN)
    w_b[0, L.T_BIT1] = _gate_weight(xi, 2.0, True)
    w_q[1 * K, L.ONE] = big  # encode head
    w_k[1 * K, L.ONE] = big
    w_v[1 * V + 0, L.T_LB] = _exact_weight(xi, ENCODE_GAIN)
    w_v[1 * V + 1, L.ONE] = _exact_weight(xi, ENCODE_GAIN)
    w_b[1, letters] = _gate_weight(xi, 0.5, True)
    w_b[1, non_letters] = _gate_weight(xi, 1.0, True)
    w_a[1, non_letters] = 2000.0 / xi
    w_z[:, L.ONE] = _SAT / xi
    out0 = np.zeros((D, H * V))  # [D, HV V]
    out0[L.PAR, 0] = unit
    out0[L.ENC + 0, V + 0] = unit
    out0[L.ENC + 1, V + 1] = unit
    mixer0 = GDNWeights(pack_qkvz(w_q, w_k, w_v, w_z, H), pack_ba(w_b, w_a, H), conv([]),
                        np.array([-100.0, 0.0]), np.array([0.0, -1000.0]), np.ones(V), out0)
    # MLP 0: hats over N bins of d = N x / c - j; the residual holds ONE, kind, id, PAR and the unit vector ENC
    rho = _normalised_entry(D, 5.5)
    g = 60.0 / (rho / math.sqrt(2.0))  # c / |(x, c)| >= 1/sqrt(2): every nonzero argument is >= 60 in size
    gate0, up0, down0 = np.zeros((I, D)), np.zeros((I, D)), np.zeros((D, I))  # [I, D], [I, D], [D, I]
    for j in range(N):
        for u, (shift, weight) in enumerate(((1, 1.0), (0, -2.0), (-1, 1.0))):
            unit_index = 3 * j + u
            gate0[unit_index, L.ENC + 0] = g * N
            gate0[unit_index, L.ENC + 1] = g * (shift - j)
            up0[unit_index, L.ONE] = 1.0
            down0[L.SLOT + j, unit_index] = weight / (g * rho)
    layer0 = DecoderLayerWeights(np.zeros(D), mixer0, np.zeros(D), MLPWeights(gate0, up0, down0))

    # ------------------------------------------------------------------------------------------ layer 1: hold
    # residual: 3 unit entries, PAR, ENC, SLOT (one entry of size ~ g rho kappa / (g rho) <= ~2): squares <= ~10
    xi1 = _normalised_entry(D, 12.0)
    w_q, w_k, w_v, w_z, w_b, w_a = parts()
    w_q[0, L.ONE] = _BIG / xi1
    w_k[0, L.ONE] = _BIG / xi1
    for j in range(N):
        w_v[j, L.SLOT + j] = 200.0 / xi1  # the previous token's slot (a matching entry is >= ~60 after scaling)
    w_b[0, L.T_COMMA] = 0.0  # beta = 2 sigmoid(0) = 1 at the comma
    w_b[0, [c for c in every_kind if c != L.T_COMMA]] = -1.5 * _SAT / xi1  # beta = 0 elsewhere
    w_z[:, L.ONE] = 1.5 * _SAT / xi1
    out1 = np.zeros((D, H * V))  # [D, HV V]
    for j in range(N):
        out1[L.HOLD + j, j] = 1.0 / (math.sqrt(V) * 150.0)
    mixer1 = GDNWeights(pack_qkvz(w_q, w_k, w_v, w_z, H), pack_ba(w_b, w_a, H),
                        conv([slice(2 * spec.key_dim, 2 * spec.key_dim + V)]), np.array([-100.0, -100.0]),
                        np.zeros(2), np.ones(V), out1)
    xi_par = _normalised_entry(D, 24.0)
    G = _SAT / xi_par
    gate1, up1, down1 = np.zeros((I, D)), np.zeros((I, D)), np.zeros((D, I))
    for j in range(N):
        gate1[j, L.PAR] = G  # PAR > 0 (even parity): q_0's slot, held
        up1[j, L.HOLD + j] = 1.0
        down1[L.SEL + j, j] = 1.0 / G
        gate1[N + j, L.PAR] = -G  # odd parity: q_1's slot, the current one
        up1[N + j, L.SLOT + j] = 1.0
        down1[L.SEL + j, N + j] = 1.0 / G
    layer1 = DecoderLayerWeights(np.zeros(D), mixer1, np.zeros(D), MLPWeights(gate1, up1, down1))

    # ------------------------------------------------------------------------------------------ layer 2: memory
    xi2 = _normalised_entry(D, 30.0)
    w_q, w_k, w_v, w_z, w_b, w_a = parts()
    for j in range(N):
        w_q[j, L.SEL + j] = _BIG / xi2
        w_k[j, L.SLOT + j] = _BIG / xi2  # previous token (conv tap t - 1)
    for r in range(R):
        w_v[r, L.VAL + r] = 100.0 / xi2
    w_b[0, L.T_VAL] = 0.0  # beta = 1 at value tokens
    w_b[0, [c for c in every_kind if c != L.T_VAL]] = -1.5 * _SAT / xi2  # beta = 0 elsewhere
    w_z[:, L.ONE] = 1.5 * _SAT / xi2
    out2 = np.zeros((D, H * V))
    for r in range(R):
        out2[L.ANS + r, r] = 1.0 / (math.sqrt(V) * 150.0)
    mixer2 = GDNWeights(pack_qkvz(w_q, w_k, w_v, w_z, H), pack_ba(w_b, w_a, H),
                        conv([slice(spec.key_dim, spec.key_dim + K)]), np.array([-100.0, -100.0]), np.zeros(2),
                        np.ones(V), out2)
    zero_mlp = MLPWeights(np.zeros((I, D)), np.zeros((I, D)), np.zeros((D, I)))
    layer2 = DecoderLayerWeights(np.zeros(D), mixer2, np.zeros(D), zero_mlp)

    vocab = StringVocabulary(R)
    lm_head = np.zeros((vocab.size, D))  # [vocab, D]
    for r in range(R):
        lm_head[vocab.value(r), L.ANS + r] = 1.0
    weights = ModelWeights(layout.embedding(), [layer0, layer1, layer2], np.zeros(D), lm_head)
    return StringMemory(HybridModel(config, weights), layout)


def predict(memory: StringMemory, instances: Sequence[StringInstance]) -> list[int]:
    """The argmax at the last input token of each instance (chain path, float64)."""
    out = []
    for inst in instances:
        if inst.num_values != memory.layout.num_values:
            raise ValueError(f"instance has R = {inst.num_values}; the memory was built for R = "
                             f"{memory.layout.num_values}")
        out.append(int(np.argmax(final_logits(memory.model, inst.tokens))))
    return out
