"""Deferred GDN tree commits (lumotree.optimized.ops.gdn_tree.pending): record + flush against the reference commit.

CPU: the Triton interpreter on tiny fp32 shapes; the factors come from the torch closed form
(``gdn_tree_closed_form_ref``), the expected states from ``gdn_tree_commit_ref`` in float64. A record holds its
operands rounded to tf32, so the states it stands for are the commit's within the bound of that rounding, element
by element (:func:`assert_within_tf32`); the rounding itself is checked exactly. Unused pool slots are NaN: never
read, never written.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st
from strategies import build_tree_parents, trees
from test_gdn_kernels import make_case

from lumotree.optimized.ops.gdn_tree import pending as PD
from lumotree.optimized.ops.gdn_tree import reference as R

RECORD_BUILD = """
import json, os, re, subprocess, tempfile
import triton
from lumotree.optimized.ops.gdn_tree import pending as PD
cuobjdump = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
out = {}
for norm in (True, False):
    for sizes in (True, False):
        kernel = PD.build_record_for_sm90(norm=norm, sizes=sizes, max_registers=None)
        with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
            f.write(kernel.asm["cubin"])
            f.flush()
            usage = subprocess.run([cuobjdump, "-res-usage", f.name], capture_output=True, text=True).stdout
        out[f"norm={norm} sizes={sizes}"] = {k: int(v) for k, v in re.findall(r"(REG|STACK):(\\d+)", usage)}
print(json.dumps(out))
"""
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
TF32_UNIT = 2.0**-11  # the relative rounding error of a tf32 value (10 mantissa bits, round to nearest)


def round_tf32(x: torch.Tensor) -> torch.Tensor:
    """fp32 ``x`` rounded to the nearest tf32 value, ties away from zero (the record's rounding, in torch)."""
    bits = x.float().contiguous().view(torch.int32)
    return ((bits + 0x1000) & -0x2000).view(torch.float32)


def value_head_kpt(pending, slots) -> torch.Tensor:
    """``[B, HV, K, PATH]``: each value head's ``kpt`` (its key head's, shared by the group)."""
    H, HV = pending.kpt.shape[1], pending.dp.shape[2]
    return pending.kpt[slots].repeat_interleave(HV // H, dim=1)


def rounding_bound(pending, slots) -> torch.Tensor:
    """``[B, HV, K, V]`` float64: what rounding ``kpt`` and ``dp`` to tf32 may move ``kpt dp``, element by element:
    ``(2u + u^2) |kpt| |dp|`` (each operand within ``u`` of its exact value), 0 where nothing is pending."""
    mags = torch.einsum("bhkp,bphv->bhkv", value_head_kpt(pending, slots).double().abs(),
                        pending.dp[slots].double().abs())
    return torch.where(pending.active[slots].bool()[..., None, None], (2 + TF32_UNIT) * TF32_UNIT * mags, 0.0)


def assert_within_tf32(got, want, bound):
    """``|got - want| <= bound`` element by element, plus fp32 rounding (``1e-5`` of the largest ``|want|``)."""
    excess = (got.double() - want).abs() - bound - 1e-5 * want.abs().max()
    assert float(excess.max()) <= 0.0, f"beyond the tf32 rounding bound by {float(excess.max()):.3e}"


def factors_of(case, l2norm: bool):
    """fp32 factors of the case's trees from the torch closed form (the verify's function). The decays are mild
    (``g`` scaled by 1/20: ``Gamma`` >= 0.2 over 20 nodes), so ``Gamma_a S0`` is not lost beside the path's terms
    in the paths past ``PATH`` nodes."""
    case["a"] = case["a"] / 20
    return R.gdn_tree_closed_form_ref(case["q"], case["k"], case["v"], case["a"], case["b"], case["pool"],
                                      case["slots"], case["parents"], num_nodes=case["num_nodes"],
                                      use_qk_l2norm_in_kernel=l2norm)[1]


def true_states(pool, pending, slots):
    """``gamma_a S + kpt dp`` where pending, else ``S``, at ``slots`` (float64): what pool + pending hold."""
    s = pool[slots].double()  # [B, HV, K, V]
    upd = torch.einsum("bhkp,bphv->bhkv", value_head_kpt(pending, slots).double(), pending.dp[slots].double())
    held = pending.gamma_a[slots].double()[..., None, None] * s + upd
    return torch.where(pending.active[slots].bool()[..., None, None], held, s)


def accepted_nodes(rows, picks):
    return torch.tensor([int(p * len(r)) % len(r) for r, p in zip(rows, picks)], dtype=torch.int32, device=DEVICE)


@settings(max_examples=8, deadline=None)
@given(rows=st.lists(trees(max_nodes=22), min_size=1, max_size=3), group=st.sampled_from([1, 2]),
       l2norm=st.booleans(), picks=st.lists(st.floats(0, 0.999), min_size=3, max_size=3), seed=st.integers(0, 2**16),
       half_delta=st.booleans())
@example(rows=[[-1]], group=1, l2norm=False, picks=[0.0] * 3, seed=0, half_delta=False)  # a single node
@example(rows=[build_tree_parents("chain", 20, None)], group=2, l2norm=True, picks=[0.999] * 3, seed=1,
         half_delta=True)  # past PATH
@example(rows=[build_tree_parents("chain", 16, None), [-1] + [0] * 9], group=1, l2norm=True, picks=[0.999] * 3,
         seed=2, half_delta=True)  # exactly PATH nodes; a star
def test_record_then_flush_is_the_commit(rows, group, l2norm, picks, seed, half_delta):
    """After a record the pool plus what is pending equals the reference commit (paths past PATH nodes are
    committed at once, the rest pending); the flush leaves exactly that in the pool and nothing pending. The
    factors' Delta may be fp16 (the fused verify's): the reference commits the same values."""
    case = make_case(rows, H=2, group=group, pad=1, seed=seed)
    factors = factors_of(case, l2norm)
    if half_delta:
        factors = factors._replace(delta=factors.delta.half())
    accepted = accepted_nodes(rows, picks)
    want = R.gdn_tree_commit_ref(case["pool"].double(), case["slots"], factors, case["parents"], accepted,
                                 num_nodes=case["num_nodes"])  # [B, HV, K, V]
    pool = case["pool"]
    pending = PD.pending_commits(pool, 2)
    PD.gdn_tree_record(pending, pool, case["slots"], factors, case["parents"], accepted, num_nodes=case["num_nodes"])
    slots = case["slots"]
    bound = rounding_bound(pending, slots)
    assert_within_tf32(true_states(pool, pending, slots), want, bound)
    assert not bool((pending.kpt.view(torch.int32) & 0x1FFF).any())  # tf32 values
    assert not bool((pending.dp.view(torch.int32) & 0x1FFF).any())
    long_path = torch.tensor([len(gdn_path(r, int(a))) > PD.PATH_NODES for r, a in zip(rows, accepted)])
    assert torch.equal(pending.active[slots].bool().cpu(), ~long_path[:, None].expand(-1, pending.active.shape[1]))
    PD.gdn_tree_flush(pending, pool, slots)
    assert_within_tf32(pool[slots], want, bound)
    assert not bool(pending.active.any())
    others = torch.ones(pool.shape[0], dtype=torch.bool, device=pool.device)
    others[slots] = False
    assert torch.isnan(pool[others]).all()


def gdn_path(parents, node):
    path = [node]
    while parents[path[-1]] >= 0:
        path.append(parents[path[-1]])
    return path


def test_a_second_record_applies_the_first():
    """Two steps with no flush between: the second record applies the first before it records (its factors come
    from the true state after step 1), so the flush leaves the commit of both. The third request's second path
    (20 nodes) is too long to hold: applied first, then committed at once."""
    rows = [build_tree_parents("deep_wide", 9, __import__("numpy").random.default_rng(3)), [-1, 0, 1, 1, 0],
            build_tree_parents("chain", 20, None)]
    case = make_case(rows, H=1, group=2, seed=4)
    pool = case["pool"]
    pending = PD.pending_commits(pool, 1)
    first = torch.tensor([6, 3, 5], dtype=torch.int32, device=DEVICE)
    f1 = factors_of(case, True)
    PD.gdn_tree_record(pending, pool, case["slots"], f1, case["parents"], first, num_nodes=case["num_nodes"])
    bound = rounding_bound(pending, case["slots"])  # the first record's error, carried (decayed) into the second
    s1 = R.gdn_tree_commit_ref(case["pool"].double(), case["slots"], f1, case["parents"], first,
                               num_nodes=case["num_nodes"])  # [B, HV, K, V] the true state after step 1
    case2 = make_case(rows, H=1, group=2, seed=5)  # step 2's tokens, verified from the true state
    case2["slots"] = case["slots"]
    true_pool = torch.full_like(pool, float("nan"))
    true_pool[case["slots"]] = s1.float()
    case2["pool"] = true_pool
    f2 = factors_of(case2, True)
    second = torch.tensor([8, 4, 19], dtype=torch.int32, device=DEVICE)
    want = R.gdn_tree_commit_ref(s1.new_zeros(pool.shape, dtype=torch.float64).index_copy(
        0, case["slots"].long(), s1), case["slots"], f2, case["parents"], second, num_nodes=case["num_nodes"])
    PD.gdn_tree_record(pending, pool, case["slots"], f2, case["parents"], second, num_nodes=case["num_nodes"])
    bound = bound + rounding_bound(pending, case["slots"])
    assert_within_tf32(true_states(pool, pending, case["slots"]), want, bound)
    PD.gdn_tree_flush(pending, pool)  # every slot: only the pending ones are touched
    assert_within_tf32(pool[case["slots"]], want, bound)


def test_the_record_rounds_its_operands_to_nearest_tf32():
    """On a chain (path = nodes 0..a), two value heads sharing a key head: ``kpt`` is the float64 ``K^_p^T``
    rounded to nearest tf32, each value head's ``dp`` its ``diag(w) Delta_p`` rounded so (a tf32 unit apart at
    most, where the fp32 product lies next to a rounding boundary; truncation would leave about half of them a
    unit low), zero past the path."""
    rows = [build_tree_parents("chain", 12, None)]
    case = make_case(rows, H=1, group=2, K=32, V=32, seed=7)
    factors = factors_of(case, True)
    a = 9
    pending = PD.pending_commits(case["pool"], 1)
    PD.gdn_tree_record(pending, case["pool"], case["slots"], factors, case["parents"],
                       torch.tensor([a], dtype=torch.int32, device=DEVICE), num_nodes=case["num_nodes"])
    slot = int(case["slots"][0])
    path = torch.arange(a + 1)
    lg = factors.log_gamma[0].double()  # [N, HV]
    w = torch.exp(lg[a] - lg[path])  # [P, HV]
    k_hat = factors.k[0, path, 0].double() * factors.k_rnorm[0, path, 0, None].double()  # [P, K]
    for got, exact in ((pending.kpt[slot, 0, :, : a + 1], k_hat.T),
                       (pending.dp[slot, : a + 1], w[:, :, None] * factors.delta[0, path].double())):
        want = round_tf32(exact.float())
        assert bool(((got - want).abs() <= want.abs() * 2 * TF32_UNIT).all())
        assert float((got == want).double().mean()) > 0.98
    assert not bool(pending.kpt[slot, :, :, a + 1:].any())
    assert torch.equal(pending.active[slot].cpu(), torch.ones(2, dtype=torch.int32))
    assert torch.allclose(pending.gamma_a[slot].double(), torch.exp(lg[a]), rtol=1e-6)


def test_bad_input_names_the_argument():
    case = make_case([[-1, 0, 1]], group=2, seed=6)
    pool = case["pool"]
    factors = factors_of(case, False)
    accepted = torch.tensor([2], dtype=torch.int32, device=DEVICE)
    args = (pool, case["slots"], factors, case["parents"], accepted)
    with pytest.raises(TypeError, match="pending"):
        PD.gdn_tree_record((1, 2, 3, 4), *args)
    with pytest.raises(ValueError, match="key_heads"):
        PD.pending_commits(pool, 3)
    pending = PD.pending_commits(pool, 2)
    with pytest.raises(ValueError, match="pending holds 2"):
        PD.gdn_tree_record(pending, *args)
    pending = PD.pending_commits(pool, 1)
    with pytest.raises(ValueError, match="pending.kpt"):
        PD.gdn_tree_record(pending._replace(kpt=pending.kpt[:, :, :8]), *args)
    with pytest.raises(TypeError, match="pending.active"):
        PD.gdn_tree_flush(pending._replace(active=pending.active.float()), pool)
    with pytest.raises(ValueError, match="path"):
        PD.pending_commits(pool, 1, path=8)
    with pytest.raises(ValueError, match="accepted"):
        PD.gdn_tree_record(pending, pool, case["slots"], factors, case["parents"],
                           torch.tensor([3], dtype=torch.int32, device=DEVICE))
    with pytest.raises(ValueError, match="slots"):
        PD.gdn_tree_flush(pending, pool, torch.tensor([0, 0], dtype=torch.int32, device=DEVICE))
    with pytest.raises(TypeError, match="factors"):
        PD.gdn_tree_record(pending, pool, case["slots"], factors[:3], case["parents"], accepted)


def test_record_kernel_builds_for_sm90_without_spills(tmp_path):
    """The record compiles for sm_90 (on any machine, as ``gdn_tree_record`` launches it but uncapped) with no
    stack: every form in registers (a launch cap, where one is set, trades a few spills for residency). A
    refactor that moved the path weights of its long-path branch onto the delta rows left ptxas at 32 registers
    and 3.4 KB of spills, and the step 35 us slower (run 102). Built in a process of its own without
    ``TRITON_INTERPRET`` (which replaces ``@triton.jit`` kernels) and with an empty Triton cache."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = str(tmp_path)
    done = subprocess.run([sys.executable, "-c", RECORD_BUILD], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    built = json.loads(done.stdout.strip().splitlines()[-1])
    assert len(built) == 4
    for form, usage in built.items():
        assert usage["STACK"] == 0 and usage["REG"] > 64, (form, usage)
