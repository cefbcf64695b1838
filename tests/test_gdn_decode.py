"""Single-token GDN decode kernels (lumotree.optimized.ops.gdn_decode) against the float64 reference.

CPU: the Triton interpreter on small float32 shapes; outputs are NaN-poisoned before each call (every element must be
written), pools hold random non-zero values, slots are shuffled inside a larger pool (untouched slots must stay
untouched). Reference: :mod:`lumotree.reference.gdn` (``gates``, ``l2norm``, ``step``, ``chain``, ``short_conv``,
``conv_state_commit``, ``gated_rmsnorm``) in float64 on the kernels' own inputs.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from lumotree.optimized.ops import gdn_decode as gd
from lumotree.reference import gdn as ref
from lumotree.reference.tree import TokenTree

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
RTOL, ATOL = 2e-5, 2e-6  # float32 kernels against float64


def _t(x: np.ndarray, dtype=torch.float32) -> torch.Tensor:
    return torch.tensor(x, dtype=dtype, device=DEVICE)


def _np(t: torch.Tensor) -> np.ndarray:
    return t.detach().double().cpu().numpy()


# ------------------------------------------------------------------------------------------------------- conv step
@pytest.mark.parametrize("width,C", [(4, 40), (2, 16), (3, 1100)])
def test_conv_step_matches_reference_conv_and_commit(width, C):
    """y = silu(short_conv) of a one-node tree; the conv state becomes conv_state_commit of that node."""
    rng = np.random.default_rng(width * 1000 + C)
    B, P = 3, 5
    slots = rng.permutation(P)[:B]
    pool = _t(rng.normal(size=(P, width - 1, C)))  # [P, W - 1, C]
    before = pool.clone()
    x = _t(rng.normal(size=(B, C + 7)))[:, 3 : 3 + C]  # [B, C] a strided row view
    weight = _t(rng.normal(size=(C, width)))
    out = torch.full((B, C), float("nan"), device=DEVICE)
    gd.conv_step(x, weight, pool, torch.tensor(slots, dtype=torch.int32, device=DEVICE), out=out)
    one = TokenTree([-1])
    for i, s in enumerate(slots):
        old = _np(before[s])
        y = ref.silu(ref.short_conv(_np(x[i])[None], old, _np(weight), one))[0]
        np.testing.assert_allclose(_np(out[i]), y, rtol=RTOL, atol=ATOL)
        np.testing.assert_array_equal(_np(pool[s]), ref.conv_state_commit(_np(x[i])[None], old, one, 0))
    for s in set(range(P)) - set(slots.tolist()):
        assert torch.equal(pool[s], before[s])


def test_conv_step_without_activation():
    rng = np.random.default_rng(7)
    pool = _t(rng.normal(size=(2, 3, 24)))
    before = pool.clone()
    x, weight = _t(rng.normal(size=(1, 24))), _t(rng.normal(size=(24, 4)))
    y = gd.conv_step(x, weight, pool, torch.tensor([1], dtype=torch.int32, device=DEVICE), activation=None)
    expected = ref.short_conv(_np(x), _np(before[1]), _np(weight), TokenTree([-1]))
    np.testing.assert_allclose(_np(y), expected, rtol=RTOL, atol=ATOL)


# ------------------------------------------------------------------------------------------------------ GDN step
def _decode_inputs(rng, B, P, H, HV, K, V):
    q = rng.normal(size=(B, H, K))
    k = rng.normal(size=(B, H, K))
    v = rng.normal(size=(B, HV, V))
    a = rng.normal(size=(B, HV)) * 2.0
    b = rng.normal(size=(B, HV)) * 3.0  # sigmoid(b) spans (0, 1): beta up to 2 with allow_neg_eigval
    z = rng.normal(size=(B, HV, V))
    A_log = np.log(rng.uniform(0.1, 2.0, size=HV))
    dt_bias = rng.normal(size=HV) * 0.5
    S = rng.normal(size=(P, HV, K, V)) * 0.3
    # float32-representable float64 values: the reference sees exactly the kernels' inputs
    return tuple(x.astype(np.float32).astype(np.float64) for x in (q, k, v, a, b, z, A_log, dt_bias, S))


def _reference_step(q, k, v, a, b, A_log, dt_bias, S0, allow_neg_eigval, scale):
    """Float64: gates and l2 norms as the reference layer, then one recurrence step per value head."""
    H, HV = q.shape[0], v.shape[0]
    alpha, beta = ref.gates(a[None], b[None], A_log, dt_bias, allow_neg_eigval)
    qn, kn = ref.l2norm(q), ref.l2norm(k)
    o = np.zeros_like(v)
    S = np.zeros_like(S0)
    for hv in range(HV):
        h = hv // (HV // H)
        o[hv], S[hv] = ref.step(S0[hv], qn[h], kn[h], v[hv], alpha[0, hv], beta[0, hv], scale)
    return o, S


@pytest.mark.parametrize("H,HV", [(2, 2), (2, 4)])
@pytest.mark.parametrize("allow_neg_eigval", [False, True])
@pytest.mark.parametrize("fused_norm,block_v", [(False, 16), (True, 32), (True, 16)])
def test_gdn_decode_matches_reference_step(H, HV, allow_neg_eigval, fused_norm, block_v):
    """Output (raw or gated-normed: one program per head, or two V blocks whose last one normalises the head) and
    the in-place state equal the float64 step; other slots untouched; the arrival counters are back at zero."""
    rng = np.random.default_rng(H * 100 + HV * 10 + 2 * allow_neg_eigval + fused_norm)
    B, P, K, V = 3, 5, 16, 32
    q, k, v, a, b, z, A_log, dt_bias, S = _decode_inputs(rng, B, P, H, HV, K, V)
    slots = rng.permutation(P)[:B]
    pool = _t(S)
    norm_w = rng.normal(size=V) * 0.5 + 1.0
    out = torch.full((B, HV, V), float("nan"), device=DEVICE)
    kw = dict(z=_t(z), norm_weight=_t(norm_w)) if fused_norm else {}
    kw["block_v"] = block_v  # 16: two V blocks per head
    gd.gdn_decode(_t(q), _t(k), _t(v), _t(a), _t(b), _t(A_log), _t(dt_bias), pool,
                  torch.tensor(slots, dtype=torch.int32, device=DEVICE), allow_neg_eigval=allow_neg_eigval,
                  out=out, **kw)
    for i, s in enumerate(slots):
        o, S_new = _reference_step(q[i], k[i], v[i], a[i], b[i], A_log, dt_bias, S[s], allow_neg_eigval, K**-0.5)
        if fused_norm:
            o = ref.gated_rmsnorm(o, z[i], norm_w, 1e-6)
        np.testing.assert_allclose(_np(out[i]), o, rtol=RTOL, atol=ATOL)
        np.testing.assert_allclose(_np(pool[s]), S_new, rtol=RTOL, atol=ATOL)
    for s in set(range(P)) - set(slots.tolist()):
        np.testing.assert_array_equal(_np(pool[s]), S[s])
    from lumotree.optimized.ops.gemv import split_k_scratch_cache

    assert all(int(counters.abs().sum()) == 0 for _, counters in split_k_scratch_cache().values())


def test_gdn_decode_steps_equal_reference_chain():
    """Four decode steps in a row on one slot equal the reference chain recurrence over the four tokens."""
    rng = np.random.default_rng(11)
    T, H, HV, K, V = 4, 2, 4, 16, 16
    steps = [_decode_inputs(rng, 1, 2, H, HV, K, V) for _ in range(T)]
    S0 = steps[0][-1][1]  # [HV, K, V]
    pool = _t(steps[0][-1])
    A_log, dt_bias = steps[0][6], steps[0][7]
    outs = []
    for q, k, v, a, b, *_ in steps:
        outs.append(_np(gd.gdn_decode(_t(q), _t(k), _t(v), _t(a), _t(b), _t(A_log), _t(dt_bias), pool,
                                      torch.tensor([1], dtype=torch.int32, device=DEVICE), allow_neg_eigval=True)))
    q, k, v, a, b = (np.concatenate([s[i] for s in steps]) for i in range(5))
    alpha, beta = ref.gates(a, b, A_log, dt_bias, allow_neg_eigval=True)
    o_ref, S_ref = ref.chain(ref.l2norm(q), ref.l2norm(k), v, alpha, beta, S0)
    np.testing.assert_allclose(np.concatenate(outs), o_ref, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(_np(pool[1]), S_ref, rtol=1e-4, atol=1e-5)


def test_gated_rmsnorm_matches_reference():
    rng = np.random.default_rng(5)
    T, HV, V = 7, 3, 32
    proj = _t(rng.normal(size=(T, 2 * HV * V + 5)))  # z as a strided slice of a wider projection
    z = proj[:, HV * V + 5 :].unflatten(-1, (HV, V))
    o = _t(rng.normal(size=(T, HV, V)) * 4.0)
    w = rng.normal(size=V) + 1.0
    out = torch.full((T, HV, V), float("nan"), device=DEVICE)
    gd.gated_rmsnorm(o, z, _t(w), eps=1e-6, out=out)
    np.testing.assert_allclose(_np(out), ref.gated_rmsnorm(_np(o), _np(z), w, 1e-6), rtol=RTOL, atol=ATOL)


# ------------------------------------------------------------------------------------------------------ validation
def test_decode_kernels_validate_inputs():
    rng = np.random.default_rng(0)
    q, k, v, a, b, z, A_log, dt_bias, S = _decode_inputs(rng, 2, 3, 2, 4, 16, 32)
    args = [_t(q), _t(k), _t(v), _t(a), _t(b), _t(A_log), _t(dt_bias), _t(S)]
    slots = torch.tensor([0, 2], dtype=torch.int32, device=DEVICE)
    with pytest.raises(ValueError, match="repeats a slot"):
        gd.gdn_decode(*args, torch.tensor([1, 1], dtype=torch.int32, device=DEVICE))
    with pytest.raises(ValueError, match=r"slots\[1\] = 3"):
        gd.gdn_decode(*args, torch.tensor([0, 3], dtype=torch.int32, device=DEVICE))
    bad_q = args[0].clone()
    bad_q[1, 0, 3] = float("nan")
    with pytest.raises(ValueError, match="q.* is not finite"):
        gd.gdn_decode(bad_q, *args[1:], slots)
    with pytest.raises(ValueError, match="both z and norm_weight"):
        gd.gdn_decode(*args, slots, z=_t(z))
    with pytest.raises(ValueError, match="GVA"):
        gd.gdn_decode(*args[:7], _t(S[:, :3]), slots)
    with pytest.raises(ValueError, match="v has shape"):
        gd.gdn_decode(args[0], args[1], args[2][:, :2], *args[3:], slots)
    with pytest.raises(ValueError, match="power of two"):
        gd.gdn_decode(args[0][..., :12], args[1][..., :12], *args[2:7], _t(S[:, :, :12]), slots)
    pool = _t(rng.normal(size=(3, 3, 8)))
    with pytest.raises(ValueError, match="weight has shape"):
        gd.conv_step(_t(rng.normal(size=(2, 8))), _t(np.ones((8, 3))), pool, slots)
    with pytest.raises(ValueError, match="activation"):
        gd.conv_step(_t(rng.normal(size=(2, 8))), _t(np.ones((8, 4))), pool, slots, activation="relu")
    with pytest.raises(ValueError, match="repeats a slot"):
        gd.conv_step(_t(rng.normal(size=(2, 8))), _t(np.ones((8, 4))), pool,
                     torch.tensor([2, 2], dtype=torch.int32, device=DEVICE))


# ------------------------------------------------------------------------------------------------------------ GPU
@pytest.mark.gpu
def test_gpu_qwen3_next_shapes_bf16_inputs_against_float64():
    """Qwen3-Next GDN shapes (16 q/k heads, 32 value heads, K = V = 128), bf16 activations, fp32 state: relative
    error of the gated output and of the state against float64 on the same (bf16-rounded) inputs <= 1e-4."""
    rng = np.random.default_rng(3)
    B, P, H, HV, K, V = 4, 6, 16, 32, 128, 128
    q, k, v, a, b, z, A_log, dt_bias, S = _decode_inputs(rng, B, P, H, HV, K, V)
    bf = torch.bfloat16
    tq, tk, tv, ta, tb, tz = (_t(x, bf) for x in (q, k, v, a, b, z))
    q, k, v, a, b, z = (_np(t) for t in (tq, tk, tv, ta, tb, tz))
    pool = _t(S)
    slots = rng.permutation(P)[:B]
    norm_w = rng.normal(size=V) * 0.5 + 1.0
    out = torch.full((B, HV, V), float("nan"), device=DEVICE, dtype=torch.float32)
    gd.gdn_decode(tq, tk, tv, ta, tb, _t(A_log), _t(dt_bias), pool, torch.tensor(slots, dtype=torch.int32,
                  device=DEVICE), z=tz.float(), norm_weight=_t(norm_w), out=out)
    for i, s in enumerate(slots):
        o, S_new = _reference_step(q[i], k[i], v[i], a[i], b[i], A_log, dt_bias, S[s], False, K**-0.5)
        o = ref.gated_rmsnorm(o, z[i], norm_w, 1e-6)
        assert np.linalg.norm(_np(out[i]) - o) / np.linalg.norm(o) < 1e-4
        assert np.linalg.norm(_np(pool[s]) - S_new) / np.linalg.norm(S_new) < 1e-4
