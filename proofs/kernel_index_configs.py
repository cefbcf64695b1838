"""The launch configs the kernel index checks cover: each a call of a launch function on ``meta`` tensors, with the
sizes it is proved for (symbolic ones as :class:`~lumotree.proofs.kernel_launch.Dim`).

Shapes are the model's: Qwen3-Next's GDN layer (``H = 16`` q/k heads, ``HV = 32`` value heads, ``K = V = 128``,
conv channels ``C = 8192``, width 4) and gated attention (``HQ = 16``, ``HKV = 2``, ``D = 256``, bf16), plus, in the
full scope, the extremes the launch code accepts (``K = V = 16`` and ``256``, one value head per q/k head, trees of
1..128 nodes). Launch parameters are the launch code's own choices (``verify_config`` / ``commit_config`` for an
H200's 132 SMs, ``default_launch``) or given where the launch takes them (``block_v``, ``num_splits``). Inputs are
contiguous or, as the model passes them, views into wider rows (row width ``X``, symbolic).
"""

from __future__ import annotations

from typing import Any

from .kernel_launch import Dim, LaunchConfig

__all__ = ["gdn_verify", "gdn_commit", "gdn_decode", "attention", "tree_conv"]

SMS = 132  # an H200's streaming multiprocessors: the launch configs the GPU gets
QWEN_GDN = dict(H=16, HV=32, K=128, V=128)

B = Dim("B", (2, 3, 5), 1)  # requests
P = Dim("P", (3, 6, 7), 1)  # pool slots
G = Dim("G", (2, 3, 5), 1)  # layers of one launch
T = Dim("T", (2, 3, 5), 1)  # token rows


def nodes(low: int, high: int) -> Dim:
    """Trees of ``low..high`` nodes (one padded size and one number of bitset words throughout)."""
    span = high - low
    return Dim("N", (low + span // 4, low + span // 2 + 1, high - 1), low, high)


def width(low: int) -> Dim:
    """The row width of a buffer whose rows hold an input as a slice (at least the slice's width)."""
    return Dim("X", (low + 16, low + 48, low + 80), low)


def _t(*shape: int, dtype: Any = None) -> Any:
    import torch

    return torch.empty(*shape, device="meta", dtype=dtype or torch.float32)


def _i32(*shape: int) -> Any:
    import torch

    return _t(*shape, dtype=torch.int32)


def _rows(s: dict, n: int, heads: int, dim: int, offset: int = 0, dtype: Any = None) -> Any:
    """``[B, N, heads, dim]``: contiguous, or (``X`` in the sizes) a slice of a ``[B, N, X]`` buffer's rows."""
    if "X" not in s:
        return _t(s["B"], n, heads, dim, dtype=dtype)
    return _t(s["B"], n, s["X"], dtype=dtype)[..., offset: offset + heads * dim].unflatten(-1, (heads, dim))


# ---------------------------------------------------------------------------------------------------- GDN verify
def _verify_call(precision: str, batch: int, gated: bool = False, bf16: bool = False, gate: bool = False) -> Any:
    import torch

    from lumotree.optimized.ops.gdn_tree.common import GATE_PIECE, OutputGate
    from lumotree.optimized.ops.gdn_tree.config import verify_config
    from lumotree.optimized.ops.gdn_tree.portable import portable_verify

    def make(s: dict) -> Any:
        H, HV, K, V, N = s["H"], s["HV"], s["K"], s["V"], s["N"]
        dtype = torch.bfloat16 if bf16 else torch.float32
        q, k = _rows(s, N, H, K, 0, dtype), _rows(s, N, H, K, H * K, dtype)
        v = _rows(s, N, HV, V, 2 * H * K, dtype)
        a, b = _t(s["B"], N, HV), _t(s["B"], N, HV)
        config = verify_config(batch, HV, N, K, V, torch.device("meta"), H, precision, dtype, sms=SMS)
        output_gate = OutputGate(_t(s["B"], N, HV, V), _t(V), _t(s["B"], N, HV, V // GATE_PIECE)) if gate else None
        return lambda: portable_verify(
            q, k, v, a, b, _t(s["P"], HV, K, V), _i32(s["B"]), _i32(s["B"], N), num_nodes=_i32(s["B"]),
            A_log=_t(HV) if gated else None, dt_bias=_t(HV) if gated else None, use_qk_l2norm_in_kernel=True,
            input_precision=precision, validate=False, config=config, gate=output_gate)

    return make


def gdn_verify() -> list[LaunchConfig]:
    q = QWEN_GDN
    return [
        LaunchConfig("split pipeline (GVA pair solve, fp16 scratch, TMA), tf32, N 33..64, B >= 8 on an H200 config",
                     (B, P, nodes(33, 64)), q, _verify_call("tf32", 64)),
        LaunchConfig("one-kernel verify, ieee, N 17..32, one request's config", (B, P, nodes(17, 32)), q,
                     _verify_call("ieee", 1)),
        LaunchConfig("split solve by row halves, tf32, N 65..96", (B, P, nodes(65, 96)), q, _verify_call("tf32", 64),
                     quick=False),
        LaunchConfig("row halves, ieee, N 97..128, gates in the kernel", (B, P, nodes(97, 128)), q,
                     _verify_call("ieee", 1, gated=True), quick=False),
        LaunchConfig("split pipeline, tf32x3, bf16 q / k / v as slices of wider rows, N 33..64, fused output gate, "
                     "one request's config", (B, P, nodes(33, 64), width(2 * 16 * 128 + 32 * 128)), q,
                     _verify_call("tf32x3", 1, bf16=True, gate=True), quick=False),
        LaunchConfig("one-kernel verify, tf32, N 9..16, K = V = 256, one value head per q/k head",
                     (B, P, nodes(9, 16)), dict(H=4, HV=4, K=256, V=256), _verify_call("tf32", 1), quick=False),
        LaunchConfig("split pipeline, tf32, N 33..64, K = V = 16", (B, P, nodes(33, 64)),
                     dict(H=2, HV=4, K=16, V=16), _verify_call("tf32", 64), quick=False),
    ]


# ---------------------------------------------------------------------------------------------------- GDN commits
def _factors(s: dict, N: int, layers: int | None = None) -> Any:
    from lumotree.optimized.ops.gdn_tree.common import TreeFactors

    lead = (layers,) if layers else ()
    return TreeFactors(_t(*lead, s["B"], N, s["HV"], s["V"]), _t(*lead, s["B"], N, s["HV"]),
                       _t(*lead, s["B"], N, s["H"], s["K"]), _t(*lead, s["B"], N, s["H"]))


def _commit_call(precision: str, batch: int, layered: bool = False) -> Any:
    import torch

    from lumotree.optimized.ops.gdn_tree.commit import commit_in_place
    from lumotree.optimized.ops.gdn_tree.config import commit_config

    def make(s: dict) -> Any:
        HV, K, V, N = s["HV"], s["K"], s["V"], s["N"]
        layers = s["G"] if layered else None
        pool = _t(layers, s["P"], HV, K, V) if layered else _t(s["P"], HV, K, V)
        config = commit_config(batch, HV, N, K, V, torch.device("meta"), precision, sms=SMS)
        return lambda: commit_in_place(pool, _i32(s["B"]), _factors(s, N, layers), _i32(s["B"], N), _i32(s["B"]),
                                       num_nodes=_i32(s["B"]), input_precision=precision, validate=False,
                                       config=config)

    return make


def _pending_call(s: dict) -> Any:
    from lumotree.optimized.ops.gdn_tree.pending import PATH_NODES, PendingCommits, gdn_tree_flush, gdn_tree_record

    H, HV, K, V, N = s["H"], s["HV"], s["K"], s["V"], s["N"]
    pool = _t(s["P"], HV, K, V)
    pending = PendingCommits(_t(s["P"], H, K, PATH_NODES), _t(s["P"], PATH_NODES, HV, V), _t(s["P"], HV),
                             _i32(s["P"], HV))

    def call() -> None:
        gdn_tree_record(pending, pool, _i32(s["B"]), _factors(s, N), _i32(s["B"], N), _i32(s["B"]),
                        num_nodes=_i32(s["B"]), validate=False)
        gdn_tree_flush(pending, pool, _i32(s["B"]), validate=False)

    return call


def gdn_commit() -> list[LaunchConfig]:
    q = QWEN_GDN
    return [
        LaunchConfig("in-place commit, tf32, N 33..64, B >= 8 on an H200 config", (B, P, nodes(33, 64)), q,
                     _commit_call("tf32", 64), distinct_slots=True),
        LaunchConfig("pending record and flush, N 33..64", (B, P, nodes(33, 64)), q, _pending_call,
                     distinct_slots=True),
        LaunchConfig("in-place commit of G stacked layers, ieee (rank-one), N 65..96", (G, B, P, nodes(65, 96)), q,
                     _commit_call("ieee", 64, layered=True), quick=False, distinct_slots=True),
        LaunchConfig("in-place commit, one request's config, N 97..128", (B, P, nodes(97, 128)), q,
                     _commit_call("tf32", 1), quick=False, distinct_slots=True),
        LaunchConfig("pending record and flush, N 97..128, K = V = 256", (B, P, nodes(97, 128)),
                     dict(H=4, HV=8, K=256, V=256), _pending_call, quick=False, distinct_slots=True),
    ]


# ---------------------------------------------------------------------------------------------------- decode
def _decode_call(block_v: int, norm: bool) -> Any:
    from lumotree.optimized.ops.gdn_decode import conv_step, gdn_decode

    def make(s: dict) -> Any:
        H, HV, K, V, C = s["H"], s["HV"], s["K"], s["V"], s["C"]
        rows = _t(s["B"], s["X"])  # the projection's rows: q | k | v | z | b | a
        q = rows[:, : H * K].unflatten(1, (H, K))
        k = rows[:, H * K: 2 * H * K].unflatten(1, (H, K))
        v = rows[:, 2 * H * K: 2 * H * K + HV * V].unflatten(1, (HV, V))
        z = rows[:, C: C + HV * V].unflatten(1, (HV, V)) if norm else None
        b, a = rows[:, C + HV * V: C + HV * V + HV], rows[:, C + HV * V + HV: C + HV * V + 2 * HV]

        def call() -> None:
            conv_step(rows[:, :C], _t(C, 4), _t(s["P"], 3, C), _i32(s["B"]), validate=False)
            gdn_decode(q, k, v, a, b, _t(HV), _t(HV), _t(s["P"], HV, K, V), _i32(s["B"]), z=z,
                       norm_weight=_t(V) if norm else None, block_v=block_v, validate=False)

        return call

    return make


def _norm_call(s: dict) -> Any:
    from lumotree.optimized.ops.gdn_decode import gated_rmsnorm

    return lambda: gated_rmsnorm(_t(s["T"], s["HV"], s["V"]), _t(s["T"], s["HV"], s["V"]), _t(s["V"]))


def gdn_decode() -> list[LaunchConfig]:
    q = QWEN_GDN | dict(C=8192)
    row = 2 * 8192 + 2 * 32
    return [
        LaunchConfig("conv step + decode step, whole-head programs with the fused norm, views into projection rows",
                     (B, P, width(row)), q, _decode_call(128, True), distinct_slots=True),
        LaunchConfig("gated RMSNorm", (T,), q, _norm_call),
        LaunchConfig("conv step + decode step, 32-column programs, the norm by the head's last program",
                     (B, P, width(row)), q, _decode_call(32, True), quick=False, distinct_slots=True),
        LaunchConfig("conv step + decode step without the norm, K = V = 256", (B, P, width(2 * 4096 + 2 * 4)),
                     dict(H=2, HV=4, K=256, V=256, C=2 * 2 * 256 + 4 * 256), _decode_call(64, False), quick=False,
                     distinct_slots=True),
    ]


# ---------------------------------------------------------------------------------------------------- attention
def _attention_call(splits: int, prepare: bool) -> Any:
    import torch

    from lumotree.optimized.ops import tree_attention as ta
    from lumotree.optimized.ops.tree_meta import TreeMeta

    def make(s: dict) -> Any:
        HQ, HKV, D, N = s["HQ"], s["HKV"], s["D"], s["N"]
        bf16 = torch.bfloat16
        qkv = _t(s["B"], N, s["X"], dtype=bf16)  # q | gate | k | v rows of the projection
        q = qkv[..., : HQ * D].unflatten(-1, (HQ, D))
        gate = qkv[..., HQ * D: 2 * HQ * D].unflatten(-1, (HQ, D))
        k = qkv[..., 2 * HQ * D: 2 * HQ * D + HKV * D].unflatten(-1, (HKV, D))
        v = qkv[..., 2 * HQ * D + HKV * D: 2 * HQ * D + 2 * HKV * D].unflatten(-1, (HKV, D))
        cache = _t(s["G"], s["P"], HKV, s["C"], D, dtype=bf16)
        words, depth = _i32(s["B"], N, (N + 31) // 32), _i32(s["B"], N)
        slots, lens = _i32(s["B"]), _i32(s["B"])

        def call() -> None:
            if prepare:  # the cache slots need not be distinct
                ta.prepare_qkv(q, k, v, _t(D), _t(D), _t(32), depth, cache[0], cache[0], slots, lens, validate=False)
                return
            ta.tree_attention(_t(s["B"], N, HQ, D, dtype=bf16), cache[0], cache[0], slots, lens, words, gate=gate,
                              num_splits=splits, validate=False)
            ta.kv_commit(cache, cache, slots, lens, TreeMeta(words, depth), _i32(s["B"]), validate=False)

        return call

    return make


def attention() -> list[LaunchConfig]:
    q = dict(HQ=16, HKV=2, D=256)
    sizes = (B, P, G, Dim("C", (200, 300, 333), 1), width(2 * 16 * 256 + 2 * 2 * 256))
    return [
        LaunchConfig("tree attention in one split, kv_commit of G layers, N = 64", sizes, q | dict(N=64),
                     _attention_call(1, False), distinct_slots=True),
        LaunchConfig("prepare_qkv, N = 64", sizes, q | dict(N=64), _attention_call(1, True)),
        LaunchConfig("tree attention in 16 splits and their combine, kv_commit, N = 64", sizes, q | dict(N=64),
                     _attention_call(16, False), quick=False, distinct_slots=True),
        LaunchConfig("decode (N = 1): tree attention in 8 splits, kv_commit", sizes, q | dict(N=1),
                     _attention_call(8, False), quick=False, distinct_slots=True),
        LaunchConfig("prepare_qkv, N = 1", sizes, q | dict(N=1), _attention_call(1, True), quick=False),
        LaunchConfig("N = 128: tree attention in one split, kv_commit", sizes, q | dict(N=128),
                     _attention_call(1, False), quick=False, distinct_slots=True),
        LaunchConfig("prepare_qkv, N = 128", sizes, q | dict(N=128), _attention_call(1, True), quick=False),
    ]


# ---------------------------------------------------------------------------------------------------- tree conv
def _conv_call(commit: bool) -> Any:
    from lumotree.optimized.ops.conv_tree import tree_conv, tree_conv_commit

    def make(s: dict) -> Any:
        N, C, W = s["N"], s["C"], s["W"]
        x = _t(s["G"], s["B"], N, s["X"])[..., :C]  # each layer's conv inputs: a slice of its projection rows
        pools = _t(s["G"], s["P"], W - 1, C)
        if commit:
            return lambda: tree_conv_commit(pools, _i32(s["B"]), x, _i32(s["B"], N), _i32(s["B"]),
                                            num_nodes=_i32(s["B"]), validate=False)
        return lambda: tree_conv(x[0], _t(C, W), pools[0], _i32(s["B"]), _i32(s["B"], N), bias=_t(C),
                                 num_nodes=_i32(s["B"]), validate=False, out=_t(s["B"], N, C))

    return make


def tree_conv() -> list[LaunchConfig]:
    sizes = (B, P, G)
    out = []
    for fixed, quick in ((dict(N=64, C=8192, W=4), True), (dict(N=128, C=1000, W=2), False),
                         (dict(N=5, C=64, W=6), False)):
        shape = f"N = {fixed['N']}, C = {fixed['C']}, width {fixed['W']}"
        out += [LaunchConfig(f"tree conv, {shape}", sizes + (width(fixed["C"]),), fixed, _conv_call(False), quick),
                LaunchConfig(f"conv-state commit of G layers, {shape}", sizes + (width(fixed["C"]),), fixed,
                             _conv_call(True), quick, distinct_slots=True)]
    return out
