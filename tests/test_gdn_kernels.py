"""GDN tree kernels (lumotree.optimized.ops.gdn_tree) against the exact float64 reference (lumotree.reference.gdn).

CPU: the Triton interpreter, tiny fp32 shapes, outputs poisoned with NaN before every call, unused pool slots NaN.
GPU (``pytest -m gpu``): Qwen3-Next shapes, fp32 and bf16, the three precision modes with their error bounds.
"""

from __future__ import annotations

import math
import re

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from strategies import build_tree_parents, trees

from lumotree.optimized.ops import gdn_tree as G
from lumotree.optimized.ops.gdn_tree import reference as R
from lumotree.optimized.ops.gdn_tree.commit import commit_in_place
from lumotree.optimized.ops.gdn_tree.portable import portable_verify
from lumotree.optimized.ops.tree_meta import tree_metadata
from lumotree.reference import gdn
from lumotree.reference.tree import TokenTree

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


# ----------------------------------------------------------------------------------------------------------- helpers
def make_case(parent_rows, *, H=1, group=1, K=16, V=16, pad=0, gated=False, seed=0, dtype=torch.float32,
              device=DEVICE):
    """A batch of trees (padded to the largest + ``pad``, padding filled with junk) with random GDN inputs."""
    gen = torch.Generator().manual_seed(seed)
    B = len(parent_rows)
    N = max(len(p) for p in parent_rows) + pad
    HV = H * group
    parents = torch.full((B, N), -7, dtype=torch.int64)  # junk in the padding: it must be ignored
    for b, row in enumerate(parent_rows):
        parents[b, : len(row)] = torch.tensor(row)
    num_nodes = torch.tensor([len(p) for p in parent_rows], dtype=torch.int32)
    q = torch.randn(B, N, H, K, generator=gen)
    k = torch.randn(B, N, H, K, generator=gen)
    v = torch.randn(B, N, HV, V, generator=gen)
    if gated:
        gate_a = torch.randn(B, N, HV, generator=gen)
        gate_b = torch.randn(B, N, HV, generator=gen) * 2
    else:
        gate_a = torch.log(torch.rand(B, N, HV, generator=gen) * 0.8 + 0.2)  # g = log alpha, alpha in [0.2, 1)
        gate_b = torch.rand(B, N, HV, generator=gen) * 2.0  # beta in [0, 2]
    P = B + 2
    pool = torch.full((P, HV, K, V), float("nan"))  # unused slots stay NaN: never read, never written
    slots = torch.randperm(P, generator=gen)[:B]
    pool[slots] = torch.randn(B, HV, K, V, generator=gen)
    for b, row in enumerate(parent_rows):  # padding nodes' inputs NaN: never read (or zeroed as soon as loaded)
        for t in (q, k, v):
            t[b, len(row):] = float("nan")
    A_log = torch.randn(HV, generator=gen) * 0.5
    dt_bias = torch.randn(HV, generator=gen) * 0.5
    case = dict(q=q, k=k, v=v, a=gate_a, b=gate_b, pool=pool, slots=slots, parents=parents, num_nodes=num_nodes,
                A_log=A_log, dt_bias=dt_bias)
    case = {n: t.to(device) for n, t in case.items()}
    for n in ("q", "k", "v"):
        case[n] = case[n].to(dtype)
    return case


def run_verify(case, *, l2norm, gated, neg=False, precision="ieee", **kw):
    """Kernel verify with NaN-poisoned output buffers."""
    q, k, v = case["q"], case["k"], case["v"]
    B, N, H, _ = q.shape
    HV, V = v.shape[2:]
    out = (torch.full((B, N, HV, V), float("nan"), dtype=v.dtype, device=q.device),
           torch.full((B, N, HV, V), float("nan"), device=q.device),
           torch.full((B, N, HV), float("nan"), device=q.device),
           torch.full((B, N, H), float("nan"), device=q.device))
    common = dict(num_nodes=case["num_nodes"], input_precision=precision, out=out, **kw)
    if gated:
        return portable_verify(q, k, v, case["a"], case["b"], case["pool"], case["slots"], case["parents"],
                               A_log=case["A_log"], dt_bias=case["dt_bias"], allow_neg_eigval=neg,
                               use_qk_l2norm_in_kernel=l2norm, **common)
    return portable_verify(q, k, v, case["a"], case["b"], case["pool"], case["slots"], case["parents"],
                           use_qk_l2norm_in_kernel=l2norm, **common)


def reference_inputs(case, b, *, l2norm, gated, neg=False):
    """Float64 numpy inputs of request b for lumotree.reference.gdn: (q, k, v, alpha, beta, S0, tree)."""
    n = int(case["num_nodes"][b])
    f64 = {name: t.detach().cpu().double().numpy() for name, t in case.items()}
    q, k, v = f64["q"][b, :n], f64["k"][b, :n], f64["v"][b, :n]
    if l2norm:
        q = q / np.sqrt((q * q).sum(-1, keepdims=True) + 1e-6)
        k = k / np.sqrt((k * k).sum(-1, keepdims=True) + 1e-6)
    if gated:
        alpha = np.exp(-np.exp(f64["A_log"]) * np.logaddexp(0.0, f64["a"][b, :n] + f64["dt_bias"]))
        beta = (2.0 if neg else 1.0) / (1.0 + np.exp(-f64["b"][b, :n]))
    else:
        alpha, beta = np.exp(f64["a"][b, :n]), f64["b"][b, :n]
    S0 = f64["pool"][int(case["slots"][b])]
    tree = TokenTree(case["parents"][b, :n].cpu().tolist())
    return q, k, v, alpha, beta, S0, tree


def rel_err(x, ref) -> float:
    x = torch.as_tensor(x).double().cpu()
    ref = torch.as_tensor(ref).double().cpu()
    assert torch.isfinite(x).all(), "non-finite output (an unwritten or poisoned element)"
    return float((x - ref).norm() / ref.norm().clamp_min(1e-30))


def check_against_reference(case, o, factors, *, l2norm, gated, neg=False, tol=1e-4):
    B, N = case["parents"].shape
    for b in range(B):
        n = int(case["num_nodes"][b])
        q, k, v, alpha, beta, S0, tree = reference_inputs(case, b, l2norm=l2norm, gated=gated, neg=neg)
        ref_o, ref_f = gdn.tree_closed_form(q, k, v, alpha, beta, S0, tree)
        assert rel_err(o[b, :n], ref_o) < tol
        assert rel_err(factors.delta[b, :n], ref_f.delta) < tol
        assert rel_err(factors.log_gamma[b, :n], np.log(ref_f.gamma)) < tol or np.abs(np.log(ref_f.gamma)).max() == 0
        if l2norm:
            kb = case["k"][b, :n].double().cpu()
            assert rel_err(factors.k_rnorm[b, :n], torch.rsqrt((kb * kb).sum(-1) + 1e-6)) < tol
        # padding rows are written, as zeros
        for t in (o, factors.delta, factors.log_gamma) + ((factors.k_rnorm,) if l2norm else ()):
            assert torch.equal(t[b, n:].float().cpu(), torch.zeros_like(t[b, n:].float().cpu()))


# --------------------------------------------------------------------------------------- differential (interpreter)
VERIFY_PIPELINES = ("split", "split_group", "split_tma", "split_halves", "split_rows", "fused", "fused_vec",
                    "fused_tma", "fused_halves")


def verify_pipeline(name: str, group: int) -> G.KernelConfig:
    """Every verify pipeline: split (solve + apply; ``split_group``: one solve program for the ``group`` value heads of
    a q/k head, 3 stages; ``split_tma``: the solve's and the apply's tiles through tensor descriptors; ``split_rows``:
    the solve by row halves from 32 padded nodes, two programs per value head, fp16 scratch in tf32 mode) and fused per
    V block (V = 16), the fused one with the ancestor mask read as an [N, N] gather or as word vectors, or its tiles
    through descriptors (``fused_tma``)."""
    grouped = name == "split_group"
    return G.KernelConfig(16, 16, 4, 2, split=name.startswith("split"), solve_warps=4,
                          word_vectors=name == "fused_vec", solve_heads=group if grouped else 1,
                          solve_stages=3 if grouped else 0, tma=name.endswith("_tma"), solve_tma=name == "split_tma",
                          halves=name.endswith("_halves"), row_halves=name == "split_rows",
                          scratch16=name == "split_rows")


@settings(max_examples=24, deadline=None)
@given(
    rows=st.lists(trees(max_nodes=11), min_size=1, max_size=3),
    group=st.sampled_from([1, 2]),
    pad=st.integers(0, 2),
    l2norm=st.booleans(),
    gated=st.booleans(),
    neg=st.booleans(),
    pick=st.lists(st.integers(0, 10**6), min_size=3, max_size=3),
    pipeline=st.sampled_from(list(VERIFY_PIPELINES)),
    commit_rows=st.sampled_from([8, 16]),
    rank_one=st.booleans(),
    commit_tma=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_verify_and_commit_match_reference(rows, group, pad, l2norm, gated, neg, pick, pipeline, commit_rows, rank_one,
                                           commit_tma, seed):
    case = make_case(rows, H=1 if group == 2 else 2, group=group, K=32, pad=pad, gated=gated, seed=seed)  # 2 K chunks
    o, factors = run_verify(case, l2norm=l2norm, gated=gated, neg=neg, config=verify_pipeline(pipeline, group))
    check_against_reference(case, o, factors, l2norm=l2norm, gated=gated, neg=neg)

    # commit an arbitrary node of each tree (root, inner node or leaf) in place; other slots untouched
    accepted = [pick[b] % len(r) for b, r in enumerate(rows)]
    commit_and_check(case, factors, accepted, l2norm=l2norm, gated=gated, neg=neg, commit_rows=commit_rows,
                     rank_one=rank_one, tma=commit_tma)


@pytest.mark.parametrize("pipeline", VERIFY_PIPELINES)
def test_every_pipeline_over_several_k_and_v_tiles(pipeline):
    """Every verify pipeline on a fixed batch (single node, chain, star, deep+wide; padded by 2) with K = V = 32: two
    K chunks and two V blocks of 16, so a tile read at the wrong row or column offset changes the values (the
    hypothesis test samples the pipelines; this one runs each)."""
    rng = np.random.default_rng(7)
    rows = [[-1]] + [build_tree_parents(kind, n, rng) for kind, n in (("chain", 6), ("star", 8), ("deep_wide", 11))]
    case = make_case(rows, H=1, group=2, K=32, V=32, pad=2, gated=True, seed=7)
    o, factors = run_verify(case, l2norm=True, gated=True, config=verify_pipeline(pipeline, 2))
    check_against_reference(case, o, factors, l2norm=True, gated=True)
    commit_and_check(case, factors, [0, 5, 4, 10], l2norm=True, gated=True)


@pytest.mark.parametrize("rank_one", [False, True])
def test_commit_takes_an_fp16_delta(rank_one):
    """The fused verify hands over Delta in fp16: the commit (either form of its path terms) commits the values it
    holds, as the reference does from the same factors."""
    rng = np.random.default_rng(5)
    rows = [[-1]] + [build_tree_parents(kind, n, rng) for kind, n in (("chain", 6), ("deep_wide", 11))]
    case = make_case(rows, H=1, group=2, K=32, V=32, pad=2, seed=5)
    _, factors = run_verify(case, l2norm=True, gated=False)
    factors = factors._replace(delta=factors.delta.half())
    accepted = torch.tensor([0, 5, 9], dtype=torch.int32, device=DEVICE)
    want = R.gdn_tree_commit_ref(case["pool"].double(), case["slots"], factors, case["parents"], accepted,
                                 num_nodes=case["num_nodes"])  # [B, HV, K, V]
    pool = case["pool"]
    commit_in_place(pool, case["slots"], factors, case["parents"], accepted, num_nodes=case["num_nodes"],
                      config=G.KernelConfig(16, 16, 4, 1, rank_one=rank_one))
    assert rel_err(pool[case["slots"]], want) < 1e-5


def commit_and_check(case, factors, accepted, *, l2norm, gated, neg=False, commit_rows=16, rank_one=False,
                     tma=False):
    """Commit node ``accepted[b]`` of each request in place (``commit_rows``: 16, one program per K; 8, two;
    ``rank_one``: the path's terms as outer products, ``KernelConfig.rank_one``; ``tma``: the state tile through a
    tensor descriptor) and check each committed state against the reference recurrence from ``S0``, and that the
    other slots stay NaN."""
    expected = [gdn.tree_recurrent(*reference_inputs(case, b, l2norm=l2norm, gated=gated, neg=neg))[1][node]
                for b, node in enumerate(accepted)]  # from S0, before the commit overwrites it
    pool = case["pool"]
    before = pool.clone()
    commit_in_place(pool, case["slots"], factors, case["parents"],
                      torch.tensor(accepted, dtype=torch.int32, device=DEVICE), num_nodes=case["num_nodes"],
                      config=G.KernelConfig(16, commit_rows, 4, 1, rank_one=rank_one, tma=tma))
    for b in range(len(accepted)):
        assert rel_err(pool[int(case["slots"][b])], expected[b]) < 1e-4
    others = torch.ones(pool.shape[0], dtype=torch.bool, device=pool.device)
    others[case["slots"]] = False
    assert torch.isnan(pool[others]).all() and torch.isnan(before[others]).all()


@pytest.mark.parametrize("group, heads", [(3, 3), (4, 4), (4, 2)])
@pytest.mark.parametrize("gated", [False, True])
def test_solve_programs_of_several_heads(group, heads, gated):
    """The split solve with ``heads`` value heads of a GVA group of ``group`` per program: its loop forms the heads
    two at a time (both operands, then both doublings), an odd last head alone; every head's outputs and factors
    match the reference, and the commit from them too."""
    rng = np.random.default_rng(group * 10 + heads)
    rows = [build_tree_parents(kind, n, rng) for kind, n in (("random", 11), ("chain", 5), ("star", 7))]
    case = make_case(rows, H=1, group=group, pad=1, gated=gated, seed=group + heads)
    config = G.KernelConfig(16, 16, 4, 2, split=True, solve_warps=4, solve_heads=heads, solve_stages=3)
    o, factors = run_verify(case, l2norm=True, gated=gated, config=config)
    check_against_reference(case, o, factors, l2norm=True, gated=gated)
    commit_and_check(case, factors, [len(r) - 1 for r in rows], l2norm=True, gated=gated, rank_one=gated)


def test_pdl_request_gives_the_plain_launch_values():
    """``pdl=True`` with a config that asks for the PDL launch: the same values as without (where PDL is unsupported,
    the interpreter or a GPU before sm_90, the plain launch: the prefetch's inline PTX is never traced there; on
    sm_90 a PDL launch behind a kernel that does not signal, which waits for it to end)."""
    rng = np.random.default_rng(2)
    case = make_case([build_tree_parents("deep_wide", 9, rng), [-1, 0]], H=1, group=2, gated=True, seed=2)
    cfg = verify_pipeline("fused", 2)._replace(pdl=True)
    plain, plain_f = run_verify(case, l2norm=True, gated=True, config=cfg)
    o, f = run_verify(case, l2norm=True, gated=True, config=cfg, pdl=True)
    assert torch.equal(o, plain) and torch.equal(f.delta, plain_f.delta)
    check_against_reference(case, o, f, l2norm=True, gated=True)


@pytest.mark.parametrize("pipeline", VERIFY_PIPELINES)
def test_no_sizes_and_the_pdl_requests_give_the_same_values(pipeline):
    """``num_nodes=None`` (every tree full: the kernels read no sizes and no sizes tensor is made) gives bit for bit
    the outputs, factors and committed states of explicit sizes; so do ``launch_dependents=True`` and the commit's
    ``pdl=True`` (plain launches where PDL is unsupported; on a GPU of sm_90 the commit's PDL launch behind the
    signalling verify), and int32 accepted nodes against int64 (read as given, no conversion kernel)."""
    rng = np.random.default_rng(5)
    rows = [build_tree_parents(kind, 9, rng) for kind in ("chain", "star", "deep_wide")]
    case = make_case(rows, H=1, group=2, gated=True, seed=5)
    accepted = torch.tensor([8, 3, 5], device=DEVICE)
    results = []
    for sizes, pdl, nodes in ((case["num_nodes"], False, accepted), (None, False, accepted), (None, True, accepted),
                              (None, True, accepted.int())):
        pool = case["pool"].clone()
        o, f = run_verify(dict(case, num_nodes=sizes, pool=pool), l2norm=True, gated=True,
                          config=verify_pipeline(pipeline, 2), launch_dependents=pdl)
        commit_in_place(pool, case["slots"], f, case["parents"], nodes, num_nodes=sizes, pdl=pdl)
        results.append((o, *f, pool))
    for got in results[1:]:
        for a, b in zip(got, results[0]):
            assert_same(a, b)
    check_against_reference(case, results[1][0], G.TreeFactors(*results[1][1:5]), l2norm=True, gated=True)


@pytest.mark.parametrize("pipeline", VERIFY_PIPELINES)
def test_output_gate_stores_the_gated_output_and_its_norm_pieces(pipeline):
    """``gate=OutputGate(z, weight, parts)`` in every pipeline: the factors bit for bit as without it, ``o'`` =
    ``weight * o * silu(z)`` of the plain output, the NaN-poisoned parts filled with pieces that sum to the sums of
    squares of o's rows per head (zeros on padding), and the GEMV with those parts as a per-head
    RowNorm equals ``gated_rmsnorm(o, z, weight) @ w_out.T`` (single node, chain, star, deep+wide, padding; z a
    strided view as the model's projection leaves it)."""
    from lumotree.optimized.ops.gdn_decode import gated_rmsnorm
    from lumotree.optimized.ops.gemv import RowNorm, small_batch_linear

    rng = np.random.default_rng(4)
    rows = [[-1], build_tree_parents("chain", 6, rng), build_tree_parents("star", 5, rng),
            build_tree_parents("deep_wide", 9, rng)]
    case = make_case(rows, H=1, group=2, pad=1, gated=True, seed=5, V=32)
    B, N, HV, V = case["v"].shape
    gen = torch.Generator().manual_seed(6)
    z = torch.randn(B, N, HV, V + 3, generator=gen).to(DEVICE)[..., 1 : V + 1]  # [B, N, HV, V] strided rows
    weight = (torch.rand(V, generator=gen) + 0.5).to(DEVICE)  # [V]
    parts = torch.full((B, N, HV, V // G.GATE_PIECE), float("nan"), device=DEVICE)  # [B, N, HV, V / 16]
    cfg = verify_pipeline(pipeline, 2)._replace(block_v=32)  # two pieces per program
    plain, plain_f = run_verify(case, l2norm=True, gated=True, config=cfg)
    got, f = run_verify(case, l2norm=True, gated=True, config=cfg, gate=G.OutputGate(z, weight, parts))
    assert torch.equal(f.delta, plain_f.delta) and torch.equal(f.log_gamma, plain_f.log_gamma)
    want = weight * plain * torch.nn.functional.silu(z)  # [B, N, HV, V]
    assert rel_err(got, want) < 1e-6
    assert rel_err(parts.sum(-1), (plain.double() ** 2).sum(-1)) < 1e-6  # every piece written (NaN-poisoned)
    for b, n in enumerate(case["num_nodes"].tolist()):  # padding rows: zeros
        assert not got[b, n:].any() and not parts[b, n:].any()
    w_out = torch.randn(24, HV * V, generator=gen).to(DEVICE)  # [Dm, HV V]
    y = small_batch_linear(got.view(B * N, HV * V), w_out,
                           norm=RowNorm(parts.view(B * N, HV, V // G.GATE_PIECE), 1e-6))  # [B N, Dm]
    y_ref = gated_rmsnorm(plain.view(B * N, HV, V), z.reshape(B * N, HV, V), weight, eps=1e-6).view(B * N, -1)
    assert rel_err(y, y_ref.double() @ w_out.double().T) < 1e-5


@pytest.mark.parametrize("kind,n,seed", [("random", 40, 1), ("deep_wide", 70, 2), ("chain", 33, 3)])
def test_multiword_trees(kind, n, seed):
    """Trees past 32 nodes: the mask reads words j // 32 > 0 (mixed with a small tree in the same batch); at 70
    nodes (NP = 128) the ``_halves`` pipelines invert by diagonal halves across the word boundary."""
    rows = [build_tree_parents(kind, n, np.random.default_rng(seed)), [-1, 0, 0, 1]]
    case = make_case(rows, H=1, group=2, seed=seed)
    for pipeline in VERIFY_PIPELINES:
        o, factors = run_verify(case, l2norm=True, gated=False, config=verify_pipeline(pipeline, 2))
        check_against_reference(case, o, factors, l2norm=True, gated=False)
    accepted = torch.tensor([n - 1, 3], dtype=torch.int32, device=DEVICE)
    q, k, v, alpha, beta, S0, tree = reference_inputs(case, 0, l2norm=True, gated=False)
    _, factors_ref = gdn.tree_closed_form(q, k, v, alpha, beta, S0, tree)
    expected = gdn.commit(S0, factors_ref, tree, n - 1)
    commit_in_place(case["pool"], case["slots"], factors, case["parents"], accepted, num_nodes=case["num_nodes"])
    assert rel_err(case["pool"][int(case["slots"][0])], expected) < 1e-4


@pytest.mark.parametrize("n", [20, 40, 100])
@pytest.mark.parametrize("precision", ["ieee", "tf32x3", "tf32"])
def test_inverse_by_halves_at_every_padded_size(n, precision):
    """``KernelConfig.halves`` (``(I + A)^{-1}`` from its diagonal halves and the block below them) at 32, 64 and
    128 padded nodes, the split and the fused pipeline, and ``row_halves`` (the split solve's two programs per
    value head, the lower one waiting for the upper one's block): against the reference, deep trees (the
    doubling's every level) beside a small one."""
    rng = np.random.default_rng(n)
    rows = [build_tree_parents("deep_wide", n, rng), build_tree_parents("chain", n // 2, rng), [-1, 0, 0, 1]]
    case = make_case(rows, H=1, group=2, gated=True, seed=n)
    for pipeline in ("split_halves", "split_rows", "fused_halves"):
        o, factors = run_verify(case, l2norm=True, gated=True, precision=precision,
                                config=verify_pipeline(pipeline, 2))
        check_against_reference(case, o, factors, l2norm=True, gated=True, tol=2e-3 if precision == "tf32" else 1e-4)


@pytest.mark.parametrize("precision", ["ieee", "tf32"])
@pytest.mark.parametrize("pipeline", VERIFY_PIPELINES)
def test_half_precision_keys_take_the_exact_path(pipeline, precision):
    """fp16 q / k / v (values tf32 holds exactly: no rounding before the products, |k|^2 read off K K^T's diagonal)
    against the float64 closed form of the same fp16 values, every pipeline, single node, chain, star and deep+wide
    trees; the L2 norms and the factors too."""
    rng = np.random.default_rng(9)
    rows = [[-1], build_tree_parents("chain", 7, rng), build_tree_parents("star", 6, rng),
            build_tree_parents("deep_wide", 10, rng)]
    case = make_case(rows, H=1, group=2, pad=1, seed=11, dtype=torch.float16)
    o, factors = run_verify(case, l2norm=True, gated=True, precision=precision, config=verify_pipeline(pipeline, 2))
    check_against_reference(case, o.float(), factors, l2norm=True, gated=True, tol=2e-3)


def _scratch_pair(case, pipeline, gated):
    """tf32 verify through the split pipeline with the fp16 scratch (the default) and with fp32 scratch."""
    cfg = verify_pipeline(pipeline, 2)._replace(scratch16=True)
    kw = dict(l2norm=True, gated=gated, precision="tf32")
    return run_verify(case, **kw, config=cfg), run_verify(case, **kw, config=cfg._replace(scratch16=False))


@pytest.mark.parametrize("pipeline", ["split", "split_group"])
def test_fp16_scratch_holds_the_tf32_operands(pipeline):
    """``KernelConfig.scratch16`` (the small-batch default): ``TB`` and ``QKD`` handed to the apply in scaled fp16
    give the tf32 products the operands they read from fp32 scratch. Where ``|TB|`` reaches its bound 4 (every key
    the same, ``beta = 2``, no decay: each ``I - 2 k k^T`` a reflection), bit for bit; on random inputs (single
    node, chain, star, deep+wide, padding) within 1e-6 of the fp32 scratch (only entries below fp16's normal range,
    |x| < 6e-8, are rounded further) and within tf32's error of the float64 closed form."""
    rng = np.random.default_rng(12)
    rows = [[-1], build_tree_parents("chain", 9, rng), build_tree_parents("star", 6, rng),
            build_tree_parents("deep_wide", 10, rng)]
    case = make_case(rows, H=1, group=2, pad=1, seed=13)
    case["k"][:] = case["k"][:1, :1]  # one key everywhere
    case["a"].zero_()  # g = 0: alpha = 1
    case["b"].fill_(2.0)  # beta = 2
    (o16, f16), (o32, f32) = _scratch_pair(case, pipeline, gated=False)
    assert_same(o16, o32)
    assert_same(f16.delta, f32.delta)
    check_against_reference(case, o16, f16, l2norm=True, gated=False, tol=2e-3)

    case = make_case(rows, H=1, group=2, pad=1, seed=14, gated=True)
    (o16, f16), (o32, f32) = _scratch_pair(case, pipeline, gated=True)
    assert rel_err(o16, o32) < 1e-6 and rel_err(f16.delta, f32.delta) < 1e-6
    check_against_reference(case, o16, f16, l2norm=True, gated=True, tol=2e-3)


@pytest.mark.parametrize("l2norm", [True, False])
def test_layers_commit_in_one_launch(l2norm):
    """A stack of layers (pools [G, P, HV, K, V], factors with a leading layer dimension, keys as strided views of
    a wider buffer, as the model passes them) commits in one launch exactly as one launch per layer: single node,
    chain, star and deep+wide trees, the accepted node anywhere; other slots stay NaN."""
    rng = np.random.default_rng(4)
    rows = [[-1], build_tree_parents("chain", 6, rng), build_tree_parents("star", 5, rng),
            build_tree_parents("deep_wide", 9, rng)]
    base = make_case(rows, H=1, group=2, pad=1, seed=40)
    cases = []
    for g in range(3):  # the layers' own inputs and states at the slots of one batch
        other = make_case(rows, H=1, group=2, pad=1, seed=41 + g)
        layer = dict(base, **{n: other[n] for n in ("q", "k", "v", "a", "b")}, pool=base["pool"].clone())
        layer["pool"][base["slots"]] = other["pool"][other["slots"]]
        cases.append(layer)
    factors = [run_verify(c, l2norm=l2norm, gated=False)[1] for c in cases]
    accepted = torch.tensor([0, 5, 3, 7], dtype=torch.int32, device=DEVICE)
    B, N, H, K = cases[0]["k"].shape
    wide = torch.full((3, B, N, 3 * H * K), float("nan"), device=DEVICE)  # the keys inside q | k | v rows
    wide[..., H * K : 2 * H * K] = torch.stack([c["k"] for c in cases]).flatten(-2)
    keys = wide[..., H * K : 2 * H * K].unflatten(-1, (H, K))  # [G, B, N, H, K] strided
    stacked = G.TreeFactors(torch.stack([f.delta for f in factors]), torch.stack([f.log_gamma for f in factors]),
                            keys, torch.stack([f.k_rnorm for f in factors]) if l2norm else None)
    pools = torch.stack([c["pool"] for c in cases])  # [G, P, HV, K, V]
    shared = dict(num_nodes=cases[0]["num_nodes"])
    assert commit_in_place(pools, cases[0]["slots"], stacked, cases[0]["parents"], accepted, **shared) is pools
    for g, (c, f) in enumerate(zip(cases, factors)):
        commit_in_place(c["pool"], c["slots"], f, c["parents"], accepted, **shared)
        assert torch.equal(pools[g].nan_to_num(7.0), c["pool"].nan_to_num(7.0))
        assert not torch.isnan(pools[g][c["slots"]]).any()
    with pytest.raises(ValueError, match="factors.delta"):
        commit_in_place(pools, cases[0]["slots"], stacked._replace(delta=stacked.delta[:2]), cases[0]["parents"],
                          accepted, **shared)
    with pytest.raises(ValueError, match="factors.k "):
        commit_in_place(pools, cases[0]["slots"], stacked._replace(k=keys[0]), cases[0]["parents"], accepted,
                          **shared)


def test_meta_reuse_validate_off_and_modes_agree():
    """A prebuilt tree_meta with validate=False gives the same bits; the three modes agree (interpreter: fp32)."""
    rows = [[-1, 0, 1, 1, 0, 4], [-1, 0]]
    case = make_case(rows, H=2, group=1, pad=1, seed=5)
    o1, f1 = run_verify(case, l2norm=True, gated=False)
    meta = tree_metadata(case["parents"], num_nodes=case["num_nodes"])
    o2, f2 = run_verify(case, l2norm=True, gated=False, meta=meta, validate=False)
    assert torch.equal(o1, o2) and torch.equal(f1.delta, f2.delta)
    for mode in ("tf32", "tf32x3"):
        o3, _ = run_verify(case, l2norm=True, gated=False, precision=mode, meta=meta)
        assert rel_err(o3, o1) < (2e-3 if mode == "tf32" else 1e-5)


@settings(max_examples=6, deadline=None)
@given(rows=st.lists(trees(max_nodes=9), min_size=1, max_size=3), group=st.sampled_from([1, 2]),
       seed=st.integers(0, 2**16))
def test_torch_baselines_match_reference(rows, group, seed):
    """The benchmark's torch baselines compute the reference's function (float64)."""
    case = make_case(rows, H=1, group=group, seed=seed, device="cpu")
    case = {n: (t.double() if t.is_floating_point() else t) for n, t in case.items()}
    args = (case["q"], case["k"], case["v"], case["a"], case["b"], case["pool"], case["slots"], case["parents"])
    kw = dict(num_nodes=case["num_nodes"], use_qk_l2norm_in_kernel=True)
    o_node, states = R.gdn_tree_pernode_ref(*args, **kw)
    o_branch = R.gdn_tree_branch_ref(*args, **kw)
    o_closed, factors = R.gdn_tree_closed_form_ref(*args, **kw)
    accepted = torch.tensor([len(r) - 1 for r in rows])
    committed = R.gdn_tree_commit_ref(case["pool"], case["slots"], factors, case["parents"], accepted,
                                      num_nodes=case["num_nodes"])
    for b in range(len(rows)):
        n = len(rows[b])
        q, k, v, alpha, beta, S0, tree = reference_inputs(case, b, l2norm=True, gated=False)
        ref_o, ref_states = gdn.tree_recurrent(q, k, v, alpha, beta, S0, tree)
        for o in (o_node, o_branch, o_closed):
            assert rel_err(o[b, :n], ref_o) < 1e-10
        assert rel_err(states[b, :n], ref_states) < 1e-10
        assert rel_err(committed[b], ref_states[n - 1]) < 1e-10


# -------------------------------------------------------------------------------------------------------- bad input
def _bad_inputs():
    """(description, mutate(case) -> None, expected exception, text the message must contain)."""

    def setp(b, i, val):
        def f(c):
            c["parents"][b, i] = val
        return f

    def replace(name, fn):
        def f(c):
            c[name] = fn(c[name])
        return f

    return [
        ("root parent not -1", setp(0, 0, 0), ValueError, "parents[0]"),
        ("parent after child", setp(0, 2, 3), ValueError, "parents[0]"),
        ("self parent", setp(1, 1, 1), ValueError, "parents[1]"),
        ("slot out of range", replace("slots", lambda t: t + 100), ValueError, "slots"),
        ("negative slot", replace("slots", lambda t: t - 100), ValueError, "slots"),
        ("k shape", replace("k", lambda t: t[:, :, :, :8]), ValueError, "k has shape"),
        ("v dtype", replace("v", lambda t: t.double()), TypeError, "v has dtype"),
        ("g shape", replace("a", lambda t: t[:, :, :1]), ValueError, "g has shape"),
        ("beta > 2", replace("b", lambda t: t + 3.0), ValueError, "beta"),
        ("g > 0", replace("a", lambda t: t.abs() + 0.1), ValueError, "g"),
        ("NaN in q", replace("q", lambda t: t.index_fill(1, torch.tensor([1], device=t.device), float("nan"))),
         ValueError, "q"),
        ("inf in v", replace("v", lambda t: t.index_fill(1, torch.tensor([0], device=t.device), float("inf"))),
         ValueError, "v"),
        ("pool dtype", replace("pool", lambda t: t.half()), TypeError, "state_pool"),
        ("num_nodes too large", replace("num_nodes", lambda t: t + 50), ValueError, "num_nodes"),
        ("num_nodes zero", replace("num_nodes", lambda t: t * 0), ValueError, "num_nodes"),
        ("parents float", replace("parents", lambda t: t.float()), TypeError, "parents"),
    ]


@pytest.mark.parametrize("desc,mutate,exc,text", _bad_inputs(), ids=[b[0] for b in _bad_inputs()])
def test_bad_input_raises_before_launch(desc, mutate, exc, text):
    case = make_case([[-1, 0, 1, 1], [-1, 0, 0]], H=1, group=2, seed=0)
    mutate(case)
    with pytest.raises(exc, match=re.escape(text)):
        run_verify(case, l2norm=True, gated=False)


def test_bad_input_misc():
    case = make_case([[-1, 0, 1]], seed=1)
    with pytest.raises(ValueError, match="at most 128"):
        big = make_case([[-1] + list(range(128))], H=1, group=1, K=16, V=16, seed=1)
        run_verify(big, l2norm=False, gated=False)
    with pytest.raises(ValueError, match="input_precision"):
        run_verify(case, l2norm=False, gated=False, precision="fp16")
    with pytest.raises(ValueError, match="K"):
        run_verify(make_case([[-1, 0]], K=24), l2norm=False, gated=False)
    with pytest.raises(ValueError, match="scale"):
        run_verify(case, l2norm=False, gated=False, scale=float("nan"))
    o, f = run_verify(case, l2norm=False, gated=False)
    with pytest.raises(ValueError, match="accepted"):
        commit_in_place(case["pool"], case["slots"], f, case["parents"], torch.tensor([3], device=DEVICE))
    two = make_case([[-1, 0], [-1]], seed=2)
    o, f = run_verify(two, l2norm=False, gated=False)
    with pytest.raises(ValueError, match="repeats a slot"):
        commit_in_place(two["pool"], torch.zeros(2, dtype=torch.int64, device=DEVICE), f, two["parents"],
                          torch.zeros(2, dtype=torch.int32, device=DEVICE), num_nodes=two["num_nodes"])
    with pytest.raises(TypeError, match="config"):
        commit_in_place(two["pool"], two["slots"], f, two["parents"],
                          torch.zeros(2, dtype=torch.int32, device=DEVICE), num_nodes=two["num_nodes"],
                          config=(16, 16, 4, 1))
    with pytest.raises(TypeError, match="factors"):
        commit_in_place(case["pool"], case["slots"], tuple(f), case["parents"], torch.zeros(1, device=DEVICE))
    grouped = make_case([[-1, 0]], H=1, group=2, seed=3)
    for bad in (dict(solve_heads=3), dict(solve_heads=0), dict(max_registers=8), dict(max_registers=300)):
        with pytest.raises(ValueError, match=next(iter(bad))):
            run_verify(grouped, l2norm=False, gated=False, config=G.KernelConfig(16, 16, 4, 2, **bad))
    o, factors = run_verify(grouped, l2norm=False, gated=False)
    with pytest.raises(ValueError, match="max_registers"):
        commit_in_place(grouped["pool"], grouped["slots"], factors, grouped["parents"],
                          torch.zeros(len(grouped["slots"]), dtype=torch.int32, device=DEVICE),
                          num_nodes=grouped["num_nodes"], config=G.KernelConfig(16, 16, 4, 1, max_registers=-1))


def test_bad_output_gate_raises_naming_the_field():
    """A malformed ``OutputGate`` is refused before any launch, naming its field."""
    case = make_case([[-1, 0, 0]], H=1, group=2, seed=4)
    B, N, HV, V = case["v"].shape
    z = torch.zeros(B, N, HV, V, device=DEVICE)
    w = torch.ones(V, device=DEVICE)
    parts = torch.zeros(B, N, HV, V // G.GATE_PIECE, device=DEVICE)
    bad = [((z, w, parts), TypeError, "gate must be an OutputGate"),
           (G.OutputGate(z[:, :2], w, parts), ValueError, "gate.z has shape"),
           (G.OutputGate(z, w[:8], parts), ValueError, "gate.weight has shape"),
           (G.OutputGate(z, w, parts[..., :0]), ValueError, "gate.parts has shape"),
           (G.OutputGate(z, w, parts.double()), TypeError, "gate.parts has dtype"),
           (G.OutputGate(torch.zeros(B, N, HV, 2 * V, device=DEVICE)[..., ::2], w, parts), ValueError,
            "gate.z must have a contiguous last dimension")]
    for gate, error, message in bad:
        with pytest.raises(error, match=message):
            run_verify(case, l2norm=True, gated=False, gate=gate)


# ------------------------------------------------------------------------------------------------------------- GPU
QWEN = dict(H=16, group=2, K=128, V=128)


def assert_same(a, b):
    torch.testing.assert_close(a, b, rtol=0, atol=0, equal_nan=True)


def _gpu_rows(seed):
    rng = np.random.default_rng(seed)
    return [build_tree_parents(kind, n, rng) for kind, n in
            [("random", 64), ("chain", 64), ("star", 17), ("deep_wide", 128), ("single", 1), ("random", 100)]]


@pytest.mark.gpu
@pytest.mark.parametrize("precision,tol", [("ieee", 1e-5), ("tf32x3", 1e-5), ("tf32", 1e-3)])
@pytest.mark.parametrize("gated", [False, True])
@pytest.mark.parametrize("large_batch_config", [False, True])
def test_gpu_qwen_shapes_error_bounds(precision, tol, gated, large_batch_config):
    """Trees of every family up to 128 nodes at Qwen3-Next shapes against float64, with this batch's default
    config or (``large_batch_config``) the one chosen for 64 requests of 128 nodes: the split pipeline, its solve
    inverting by halves."""
    rows = _gpu_rows(7)
    case = make_case(rows, **QWEN, gated=gated, seed=11)
    config = None
    if large_batch_config:
        config = G.verify_config(64, QWEN["H"] * QWEN["group"], 128, QWEN["K"], QWEN["V"], torch.device("cuda"),
                                 QWEN["H"], precision)
        assert config.split and config.halves
    o, factors = run_verify(case, l2norm=True, gated=gated, neg=gated, precision=precision, config=config)
    g, beta = (R.gdn_gates_ref(case["a"].double(), case["b"].double(), case["A_log"].double(),
                               case["dt_bias"].double(), True) if gated else (case["a"], case["b"]))
    args = [case[n].double() for n in ("q", "k", "v")] + [g.double(), beta.double(), case["pool"].double()]
    ref_o, ref_f = R.gdn_tree_closed_form_ref(*args, case["slots"], case["parents"], num_nodes=case["num_nodes"],
                                              use_qk_l2norm_in_kernel=True)
    real = torch.arange(o.shape[1], device=o.device)[None, :] < case["num_nodes"][:, None]
    assert rel_err(o[real], ref_o[real]) < tol
    assert rel_err(factors.delta[real], ref_f.delta[real]) < tol
    assert torch.equal(o[~real], torch.zeros_like(o[~real]))
    accepted = torch.tensor([37, 63, 16, 127, 0, 99], dtype=torch.int32, device=o.device)
    ref_s = R.gdn_tree_commit_ref(case["pool"].double(), case["slots"], ref_f, case["parents"], accepted,
                                  num_nodes=case["num_nodes"])
    commit_in_place(case["pool"], case["slots"], factors, case["parents"], accepted, num_nodes=case["num_nodes"],
                      input_precision=precision)
    assert rel_err(case["pool"][case["slots"]], ref_s) < tol


def _qwen_random_batch(B, seed):
    """B random 64-node trees at Qwen3-Next shapes (gated), the default tf32 verify config for them (the split
    pipeline) and the verify keywords; the generator for more draws."""
    rng = np.random.default_rng(seed)
    case = make_case([build_tree_parents("random", 64, rng) for _ in range(B)], **QWEN, gated=True, seed=B)
    config = G.verify_config(B, QWEN["H"] * QWEN["group"], 64, QWEN["K"], QWEN["V"], torch.device("cuda"),
                             QWEN["H"], "tf32")
    assert config.split
    return rng, case, config, dict(l2norm=True, gated=True, precision="tf32", validate=False)


@pytest.mark.gpu
@pytest.mark.parametrize("B", [64, 1])
def test_gpu_fp16_scratch_and_the_register_caps(B):
    """Qwen3-Next shapes, tf32: the split pipeline with fp16 scratch within 1e-6 of fp32 scratch (the operands the
    same tf32 values; only entries below 6e-8 rounded further); the apply capped at 128 registers
    (``max_registers``) and the commit at 128 and 96 bit for bit as without the caps."""
    rng, case, config, kw = _qwen_random_batch(B, B + 3)
    o32, f32 = run_verify(case, **kw, config=config._replace(scratch16=False))
    o16, f16 = run_verify(case, **kw, config=config._replace(scratch16=True))
    capped, f_capped = run_verify(case, **kw, config=config._replace(scratch16=True, max_registers=128))
    assert rel_err(o16, o32) < 1e-6 and rel_err(f16.delta, f32.delta) < 1e-6
    assert_same(capped, o16)
    assert_same(f_capped.delta, f16.delta)
    accepted = torch.tensor(rng.integers(0, 64, B).tolist(), device="cuda")
    commit_cfg = G.commit_config(B, QWEN["H"] * QWEN["group"], 64, QWEN["K"], QWEN["V"], torch.device("cuda"))
    pools = []
    for cap in (0, 128, 96):
        pool = case["pool"].clone()
        commit_in_place(pool, case["slots"], f32, case["parents"], accepted, num_nodes=case["num_nodes"],
                          input_precision="tf32", config=commit_cfg._replace(max_registers=cap))
        pools.append(pool)
    assert_same(pools[1], pools[0])
    assert_same(pools[2], pools[0])


@pytest.mark.gpu
@pytest.mark.parametrize("B,N", [(64, 64), (1, 64), (1, 32), (1, 128)])
def test_gpu_tma_tiles_are_bit_exact(B, N):
    """``KernelConfig.tma`` (the apply's or, at B = 1 and N = 32, the fused kernel's tiles and the commit's state
    tile through tensor descriptors; at N = 128 behind the solve by row halves): at Qwen3-Next shapes, trees of
    mixed sizes (padding nodes' inputs NaN), outputs, factors and committed states bit for bit as the per-thread
    loads give them, with plain and PDL launches."""
    rng = np.random.default_rng(B + N + 11)
    sizes = rng.integers(1, N + 1, B).tolist()
    sizes[0] = N
    case = make_case([build_tree_parents("random", n, rng) for n in sizes], **QWEN, gated=True, seed=B)
    config = G.verify_config(B, QWEN["H"] * QWEN["group"], N, QWEN["K"], QWEN["V"], torch.device("cuda"),
                             QWEN["H"], "tf32")
    assert config.split == (N >= 64) and config.row_halves == (N == 128)
    kw = dict(l2norm=True, gated=True, precision="tf32", validate=False)
    accepted = torch.tensor([int(rng.integers(0, n)) for n in sizes], device="cuda")
    commit_cfg = G.commit_config(B, QWEN["H"] * QWEN["group"], N, QWEN["K"], QWEN["V"], torch.device("cuda"))
    results = []
    for tma in (False, True):
        pool = case["pool"].clone()
        o, f = run_verify(case, **kw, config=config._replace(tma=tma), launch_dependents=True)
        commit_in_place(pool, case["slots"], f, case["parents"], accepted, num_nodes=case["num_nodes"],
                          input_precision="tf32", validate=False, pdl=True, config=commit_cfg._replace(tma=tma))
        results.append((o, *f[:2], pool[case["slots"]]))
    for got, want in zip(results[1], results[0]):
        assert torch.isfinite(got).all()
        assert_same(got, want)


@pytest.mark.gpu
@pytest.mark.parametrize("B", [64, 16])
def test_gpu_apply_pdl_is_bit_exact(B):
    """``KernelConfig.apply_pdl`` (the apply kernel a programmatic dependent launch behind the solve, which reads
    q, k and the state before it waits): outputs and factors bit for bit as the plain split pipeline, eagerly and in
    a CUDA-graph replay whose inputs were rewritten after capture."""
    _, case, config, kw = _qwen_random_batch(B, B + 1)
    o_plain, f_plain = run_verify(case, **kw, config=config._replace(apply_pdl=False))
    o_pdl, f_pdl = run_verify(case, **kw, config=config._replace(apply_pdl=True))
    assert_same(o_pdl, o_plain)
    for got, want in zip(f_pdl, f_plain):
        assert_same(got, want)
    inputs = {n: case[n].clone() for n in ("q", "k", "v", "a", "b")}
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        o_graph, f_graph = run_verify(case, **kw, config=config._replace(apply_pdl=True))
    for n in inputs:
        case[n].normal_()
        case[n].copy_(inputs[n])
    graph.replay()
    torch.cuda.synchronize()
    assert_same(o_graph, o_plain)
    for got, want in zip(f_graph, f_plain):
        assert_same(got, want)


@pytest.mark.gpu
@pytest.mark.parametrize("B", [1, 16, 64])
def test_gpu_pdl_commit_behind_a_signalling_verify_is_bit_exact(B):
    """``gdn_tree_commit(pdl=True)`` right behind ``gdn_tree_verify(launch_dependents=True)`` (the commit launches
    under the verify's tail, loads its state tiles, waits, then reads the factors; B = 1 and 16: the split
    pipeline's apply signals at its start; B = 64: only as it exits, ``KernelConfig.early_signal``): outputs and
    committed states bit for bit as plain launches, eagerly and in a CUDA-graph replay whose v is rewritten between
    replays (the commit must read the factors of its own replay)."""
    rng = np.random.default_rng(B + 7)
    case = make_case([build_tree_parents("random", 64, rng) for _ in range(B)], **QWEN, gated=True, seed=B)
    accepted = torch.tensor(rng.integers(0, 64, B).tolist(), device="cuda")
    pool0 = case["pool"].clone()
    v0 = case["v"].clone()

    def step(pdl):
        case["pool"].copy_(pool0)
        o, f = run_verify(case, l2norm=True, gated=True, precision="tf32", validate=False, launch_dependents=pdl)
        commit_in_place(case["pool"], case["slots"], f, case["parents"], accepted, num_nodes=case["num_nodes"],
                          input_precision="tf32", validate=False, pdl=pdl)
        return o

    o_plain = step(False)
    pool_plain = case["pool"].clone()
    assert_same(step(True), o_plain)
    assert_same(case["pool"], pool_plain)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        o_graph = step(True)
    for scale in (0.5, 1.0):  # v = v0 / 2, then v0 again
        case["v"].copy_(v0 * scale)
        graph.replay()
        torch.cuda.synchronize()
        o_got, pool_got = o_graph.clone(), case["pool"].clone()
        assert_same(o_got, step(False))
        assert_same(pool_got, case["pool"])
        assert torch.equal(pool_got[case["slots"]], pool_plain[case["slots"]]) == (scale == 1.0)


@pytest.mark.gpu
@pytest.mark.parametrize("B,n", [(1, 64), (1, 32), (16, 64)])
def test_gpu_output_gate_bf16_qwen_shapes(B, n):
    """The output gate at the model's launches (bf16, Qwen3-Next GDN shapes, tf32; B = 1: the fused kernel, PDL
    at N = 64; B = 16: the split pipeline): the factors bit for bit as without it, ``o'`` within one bf16 rounding
    of ``round(w * round(o) * silu(z))`` and the pieces' sums within fp32 summation error of round(o)'s sums of
    squares."""
    rng = np.random.default_rng(n + B)
    case = make_case([build_tree_parents("random", n, rng) for _ in range(B)], **QWEN, gated=True, seed=n,
                     dtype=torch.bfloat16)
    N, HV, V = n, QWEN["H"] * QWEN["group"], QWEN["V"]
    gen = torch.Generator(device="cuda").manual_seed(n)
    z = torch.randn(B, N, HV, V, generator=gen, device="cuda").to(torch.bfloat16)  # [B, N, HV, V]
    weight = torch.rand(V, generator=gen, device="cuda") + 0.5  # [V]
    parts = torch.full((B, N, HV, V // G.GATE_PIECE), float("nan"), device="cuda")  # [B, N, HV, V / 16]
    plain, plain_f = run_verify(case, l2norm=True, gated=True, precision="tf32", pdl=True)
    got, f = run_verify(case, l2norm=True, gated=True, precision="tf32", pdl=True,
                        gate=G.OutputGate(z, weight, parts))
    assert torch.equal(f.delta, plain_f.delta)
    want = weight * plain.float() * torch.nn.functional.silu(z.float())  # [B, N, HV, V]
    assert rel_err(got, want) < 4e-3  # bf16 rounding of the product
    assert rel_err(parts.sum(-1), (plain.double() ** 2).sum(-1)) < 1e-5


@pytest.mark.gpu
@pytest.mark.parametrize("n", [64, 32, 5])
def test_gpu_pdl_launch_of_the_fused_kernel_is_bit_identical(n):
    """``pdl=True`` with a config that asks for it (the fused kernel at B = 1 as the model launched it at N = 64
    until the fourteenth session: a PDL launch that prefetches its ``S0`` tiles before the wait; forced here at every
    size) behind a kernel that
    writes its inputs: bit-identical to the plain launch, every step of a CUDA-graph replay too (the inputs are
    rewritten between replays)."""
    rng = np.random.default_rng(n)
    case = make_case([build_tree_parents("random", n, rng)], **QWEN, gated=True, seed=n, dtype=torch.bfloat16)
    cfg = G.verify_config(1, QWEN["H"] * QWEN["group"], n, QWEN["K"], QWEN["V"], torch.device("cuda"), QWEN["H"],
                          "tf32")
    if cfg.split:  # N = 64 takes the split pipeline since the fourteenth session: the fused kernel's launch before
        cfg = G.KernelConfig(32, 32, 8, 3, False)
    cfg = cfg._replace(pdl=True)
    v_src = case["v"].clone()
    plain, plain_f = run_verify(case, l2norm=True, gated=True, precision="tf32", config=cfg)

    def step():
        case["v"].copy_(v_src * 1.0)  # the previous kernel writes the input the PDL launch must wait for
        return run_verify(case, l2norm=True, gated=True, precision="tf32", config=cfg, pdl=True, validate=False)

    o, f = step()
    assert torch.equal(o, plain) and torch.equal(f.delta, plain_f.delta)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        o, f = step()
    for scale in (0.5, 2.0):  # v = v0 / 2, then v0 again
        v_src.mul_(scale)
        case["v"].zero_()
        graph.replay()
        torch.cuda.synchronize()
        want, _ = run_verify(case, l2norm=True, gated=True, precision="tf32", config=cfg)
        assert torch.equal(o, want)
        assert torch.equal(want, plain) == (scale == 2.0)


@pytest.mark.gpu
def test_gpu_bf16_inputs_within_2x_of_torch_bf16():
    """bf16 q/k/v: the kernel (fp32 inside) against float64 on the same bf16 inputs, vs torch's bf16 per-node."""
    rows = _gpu_rows(3)[:4]
    case = make_case(rows, **QWEN, seed=4, dtype=torch.bfloat16)
    o, _ = run_verify(case, l2norm=True, gated=False, precision="tf32")
    args = [case[n] for n in ("q", "k", "v", "a", "b")]
    kw = dict(num_nodes=case["num_nodes"], use_qk_l2norm_in_kernel=True)
    ref_o, _ = R.gdn_tree_closed_form_ref(*[a.double() for a in args], case["pool"].double(), case["slots"],
                                          case["parents"], **kw)
    bf16_o, _ = R.gdn_tree_pernode_ref(*[a.bfloat16() for a in args], case["pool"].bfloat16(), case["slots"],
                                       case["parents"], **kw)
    real = torch.arange(o.shape[1], device=o.device)[None, :] < case["num_nodes"][:, None]
    ours, theirs = rel_err(o[real], ref_o[real]), rel_err(bf16_o[real], ref_o[real])
    assert ours <= 2 * theirs, (ours, theirs)
    assert math.isfinite(ours)


@pytest.mark.gpu
@pytest.mark.parametrize("precision,tol", [("ieee", 1e-5), ("tf32", 1e-3)])
def test_gpu_k_split_commit_error_bounds(precision, tol):
    """The K-split commit (four programs share a (request, value head, V block)) at Qwen3-Next shapes, mixed tree
    sizes, vs float64 (verify with the default launch)."""
    case = make_case(_gpu_rows(5), **QWEN, seed=13)
    o, factors = run_verify(case, l2norm=True, gated=False, precision=precision)
    args = [case[n].double() for n in ("q", "k", "v", "a", "b", "pool")]
    ref_o, ref_f = R.gdn_tree_closed_form_ref(*args, case["slots"], case["parents"], num_nodes=case["num_nodes"],
                                              use_qk_l2norm_in_kernel=True)
    real = torch.arange(o.shape[1], device=o.device)[None, :] < case["num_nodes"][:, None]
    assert rel_err(o[real], ref_o[real]) < tol
    assert rel_err(factors.delta[real], ref_f.delta[real]) < tol
    assert torch.equal(o[~real], torch.zeros_like(o[~real]))
    accepted = torch.tensor([37, 63, 16, 127, 0, 99], dtype=torch.int32, device=o.device)
    ref_s = R.gdn_tree_commit_ref(case["pool"].double(), case["slots"], ref_f, case["parents"], accepted,
                                  num_nodes=case["num_nodes"])
    commit_in_place(case["pool"], case["slots"], factors, case["parents"], accepted, num_nodes=case["num_nodes"],
                      input_precision=precision, config=G.KernelConfig(64, 32, 4, 1))
    assert rel_err(case["pool"][case["slots"]], ref_s) < tol


def test_default_configs_follow_the_measured_rules():
    """verify_config: the GVA-paired 4-warp solve up to N = 64 when the group is even (and H is known); at N = 128 the
    solve by row halves, 4 warps and 2 stages in the tensor-core modes, ieee at every batch size 8 warps and a 16-column
    apply; small batches at N = 64 in the tensor-core modes: the split pipeline with one value head per 4-warp solve
    program, a 3-stage apply and fp16 scratch, at N = 128 an 8-warp solve by row halves and a 64-column apply; else the
    fused kernel, with its one-wave shape at N = 32; no default asks for the fused kernel's PDL launch. fp16 scratch at
    N = 64 in the tensor-core modes, with the large-batch apply capped at 128 registers, and from 8 (request, value
    head) pairs per SM on in tf32 mode 64 columns uncapped with the commit launched as the apply exits
    (``early_signal``); the large-batch commit capped at 128. Tensor descriptors: every split solve's q / k except by
    row halves; the apply's tiles from N = 64 on except ieee at N = 128; the fused kernel's in the tensor-core modes
    with fp32 inputs except at the one-wave N = 32 shape; never the commit's. The inverse by halves in the split solve
    past N = 64 only."""
    cpu = torch.device("cpu")  # 4 "SMs" off the GPU: B * HV >= 8 selects the split pipeline
    paired = G.verify_config(64, 32, 64, 128, 128, cpu, H=16)
    assert paired.split and paired.solve_heads == 2 and paired.solve_warps == 4 and paired.solve_stages == 3
    assert G.verify_config(64, 32, 64, 128, 128, cpu).solve_heads == 1  # H unknown: no pairing
    assert G.verify_config(64, 48, 64, 128, 128, cpu, H=16).solve_heads == 1  # odd group (3)
    big = G.verify_config(64, 32, 128, 128, 128, cpu, H=16)
    assert (big.solve_heads, big.solve_warps, big.solve_stages, big.row_halves) == (1, 4, 2, True)
    big_x3 = G.verify_config(64, 32, 128, 128, 128, cpu, H=16, precision="tf32x3")
    assert (big_x3.solve_heads, big_x3.solve_warps, big_x3.solve_stages, big_x3.row_halves) == (1, 4, 2, True)
    for B in (64, 1):  # ieee at N = 128, every batch: split, the 8-warp 2-stage solve by row halves, 16-column apply
        ieee = G.verify_config(B, 32, 128, 128, 128, cpu, H=16, precision="ieee")
        assert ieee.split and ieee.row_halves and (ieee.solve_warps, ieee.solve_stages or ieee.num_stages) == (8, 2)
        assert (ieee.block_v, ieee.num_warps) == (16, 8)
    for precision in ("tf32", "tf32x3"):  # small batches at N = 128: the split pipeline, solve by row halves
        rows = G.verify_config(1, 2, 128, 128, 128, cpu, H=1, precision=precision)
        assert rows.split and rows.row_halves and rows.apply_pdl and rows.tma and not rows.solve_tma
        assert (rows.solve_warps, rows.solve_stages, rows.block_v, rows.num_warps, rows.num_stages) == (8, 2, 64, 8, 2)
    for B, precision in ((1, "tf32"), (3, "tf32"), (1, "tf32x3")):
        small = G.verify_config(B, 2, 64, 128, 128, cpu, H=1, precision=precision)
        assert small.split and small.apply_pdl
        assert (small.solve_heads, small.solve_warps, small.solve_stages) == (1, 4, 3)
        assert (small.block_v, small.num_warps, small.num_stages, small.block_k) == (32, 4, 3, 32)
        assert small.scratch16 and not small.max_registers  # one program per SM or fewer: no cap
    mid = G.verify_config(4, 4, 64, 128, 128, cpu, H=2)  # 2 to 8 pairs per SM
    assert mid.split and mid.solve_heads == 2
    assert mid.scratch16 and mid.max_registers == 128  # uncapped: 134 registers, 3 programs per SM
    assert mid.num_stages == 3 and mid.block_v == 32 and mid.early_signal  # 3 stages: the cap, 4 programs per SM
    assert paired.scratch16 and paired.num_stages == 3  # >= 8 pairs per SM: 64 columns, 166 registers, 3 per SM
    assert (paired.block_v, paired.max_registers, paired.early_signal) == (64, 0, False)
    assert not big.scratch16 and not big.max_registers  # N = 128: fp32 scratch (not measured with fp16)
    for precision in ("ieee", "tf32x3"):  # fp16 holds tf32 operands only; tf32x3's apply would spill at the cap
        paired_other = G.verify_config(64, 32, 64, 128, 128, cpu, H=16, precision=precision)
        assert not paired_other.scratch16 and not paired_other.max_registers and paired_other.num_stages == 2
        assert paired_other.block_v == 32 and paired_other.early_signal
    assert G.commit_config(64, 32, 64, 128, 128, cpu).max_registers == 128
    assert not any(G.commit_config(64, 32, 64, 128, 128, cpu, precision).max_registers for precision in
                   ("ieee", "tf32x3"))  # hundreds of bytes of spills at the cap
    assert not G.commit_config(1, 2, 64, 128, 128, cpu).max_registers
    ieee_small = G.verify_config(1, 2, 64, 128, 128, cpu, H=1, precision="ieee")
    assert not ieee_small.split and (ieee_small.num_warps, ieee_small.num_stages, ieee_small.block_k) == (4, 3, 32)
    # one wave of fused programs (1 x 2 x 32 / 32 <= 4): the model-like sweep's shape at N = 32
    one_wave = {N: G.verify_config(1, 2, N, 128, 32, cpu, H=1) for N in (32, 16)}
    assert not any(c.split for c in one_wave.values())
    assert [(c.num_warps, c.num_stages, c.block_k) for c in one_wave.values()] == [(4, 4, 16), (4, 3, 32)]
    assert not any(c.pdl for c in one_wave.values())
    assert not small.pdl and not big.pdl and not ieee_small.pdl
    assert small.early_signal and big.early_signal and ieee_small.early_signal
    assert all(c.solve_tma for c in (paired, small, mid)) and not any(c.solve_tma for c in (big, big_x3, ieee))
    assert paired.tma and big.tma and mid.tma and not small.tma and not ieee.tma
    assert not G.verify_config(64, 32, 32, 128, 128, cpu, H=16).tma  # N = 32: the descriptor apply lost
    fused = {(N, p): G.verify_config(1, 2, N, 128, 32, cpu, H=1, precision=p) for N in (8, 32)
             for p in ("tf32", "tf32x3")}
    assert not any(c.split for c in fused.values())
    assert all(c.tma == (N != 32) for (N, _), c in fused.items())  # the one-wave N = 32 shape: pointers
    assert not ieee_small.tma and not G.verify_config(1, 2, 32, 128, 128, cpu, H=1, precision="ieee").tma
    bf16 = {N: G.verify_config(1, 2, N, 128, 32, cpu, H=1, dtype=torch.bfloat16) for N in (8, 16, 128)}
    assert [(c.split, c.tma) for c in bf16.values()] == [(False, False), (False, False), (True, True)]  # the fused
    # kernel with 16-bit inputs through pointers; at N = 128 the split pipeline's apply through descriptors
    assert not any(G.commit_config(B, 32, 64, 128, 128, cpu, p).tma for B in (1, 64) for p in G.PRECISIONS)
    # the inverse by halves: the split solve past N = 64 in every mode (ieee at every batch), never the fused kernel
    assert big.halves and ieee.halves and G.verify_config(64, 32, 128, 128, 128, cpu, H=16, precision="ieee").halves
    assert G.verify_config(64, 32, 128, 128, 128, cpu, H=16, precision="tf32x3").halves
    assert not any(c.halves for c in (paired, small, mid, ieee_small, *fused.values(), bf16[8], bf16[16]))
    # the solve by row halves: past N = 64 only
    assert not any(c.row_halves for c in (paired, small, mid, ieee_small, *fused.values(), bf16[8]))
