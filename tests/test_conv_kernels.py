"""Short convolution on trees (lumotree.optimized.ops.conv_tree) against the float64 reference
(:func:`lumotree.reference.gdn.short_conv`, :func:`lumotree.reference.gdn.conv_state_commit`).

CPU: Triton interpreter, outputs poisoned with NaN, unused pool slots NaN. GPU (``pytest -m gpu``): Qwen3-Next channel
count (C = 8192, W = 4), bf16 and fp32.
"""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from strategies import build_tree_parents, trees

from lumotree.optimized.ops import conv_tree as CT
from lumotree.optimized.ops.conv_tree import reference as R
from lumotree.reference import gdn
from lumotree.reference.tree import TokenTree

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def make_conv_case(rows, *, C=24, width=4, pad=0, bias=False, seed=0, dtype=torch.float32, device=DEVICE):
    gen = torch.Generator().manual_seed(seed)
    B, N = len(rows), max(len(r) for r in rows) + pad
    parents = torch.full((B, N), 99, dtype=torch.int32)  # junk padding
    for b, r in enumerate(rows):
        parents[b, : len(r)] = torch.tensor(r)
    P = B + 2
    pool = torch.full((P, width - 1, C), float("nan"))
    slots = torch.randperm(P, generator=gen)[:B]
    pool[slots] = torch.randn(B, width - 1, C, generator=gen)
    case = dict(
        x=torch.randn(B, N, C, generator=gen).to(dtype),
        weight=torch.randn(C, width, generator=gen),
        bias=torch.randn(C, generator=gen) if bias else None,
        pool=pool.to(dtype),
        slots=slots,
        parents=parents,
        num_nodes=torch.tensor([len(r) for r in rows], dtype=torch.int32),
    )
    return {n: (t.to(device) if t is not None else None) for n, t in case.items()}


def reference_conv(case, b, activation="silu"):
    n = int(case["num_nodes"][b])
    tree = TokenTree(case["parents"][b, :n].cpu().tolist())
    x = case["x"][b, :n].double().cpu().numpy()
    state = case["pool"][int(case["slots"][b])].double().cpu().numpy()
    y = gdn.short_conv(x, state, case["weight"].double().cpu().numpy(), tree)
    if case["bias"] is not None:
        y = y + case["bias"].double().cpu().numpy()
    return (gdn.silu(y) if activation == "silu" else y), x, state, tree


def rel_err(x, ref) -> float:
    x, ref = torch.as_tensor(x).double().cpu(), torch.as_tensor(ref).double().cpu()
    assert torch.isfinite(x).all(), "non-finite output (an unwritten or poisoned element)"
    return float((x - ref).norm() / ref.norm().clamp_min(1e-30))


@settings(max_examples=16, deadline=None)
@given(rows=st.lists(trees(max_nodes=12), min_size=1, max_size=3), width=st.sampled_from([2, 3, 4]),
       pad=st.integers(0, 2), bias=st.booleans(), silu=st.booleans(),
       pick=st.lists(st.integers(0, 10**6), min_size=3, max_size=3), seed=st.integers(0, 2**16))
def test_tree_conv_and_commit_match_reference(rows, width, pad, bias, silu, pick, seed):
    case = make_conv_case(rows, width=width, pad=pad, bias=bias, seed=seed)
    activation = "silu" if silu else None
    B, N, C = case["x"].shape
    out = torch.full((B, N, C), float("nan"), device=DEVICE)
    CT.tree_conv(case["x"], case["weight"], case["pool"], case["slots"], case["parents"], bias=case["bias"],
                 num_nodes=case["num_nodes"], activation=activation, out=out)
    accepted = torch.tensor([pick[b] % len(r) for b, r in enumerate(rows)], dtype=torch.int32, device=DEVICE)
    expected_state = []
    for b in range(B):
        ref, x, state, tree = reference_conv(case, b, activation)
        n = len(rows[b])
        assert rel_err(out[b, :n], ref) < 1e-6
        assert torch.equal(out[b, n:], torch.zeros_like(out[b, n:]))
        expected_state.append(gdn.conv_state_commit(x, state, tree, int(accepted[b])))
    CT.tree_conv_commit(case["pool"], case["slots"], case["x"], case["parents"], accepted,
                        num_nodes=case["num_nodes"])
    for b in range(B):
        assert torch.equal(case["pool"][int(case["slots"][b])].double().cpu(), torch.from_numpy(expected_state[b]))
    others = torch.ones(case["pool"].shape[0], dtype=torch.bool, device=DEVICE)
    others[case["slots"]] = False
    assert torch.isnan(case["pool"][others]).all()


@pytest.mark.parametrize("validate", [True, False])
def test_no_sizes_gives_the_values_of_full_sizes(validate):
    """``num_nodes=None`` (every tree full: the conv kernel reads no sizes and, without validation, no sizes tensor
    is made) gives bit for bit the outputs and committed states of explicit sizes; so do int64 accepted nodes
    (read as given, no conversion)."""
    rng = np.random.default_rng(4)
    rows = [build_tree_parents(kind, 7, rng) for kind in ("chain", "star", "deep_wide")]
    case = make_conv_case(rows, width=4, bias=True, seed=4)
    accepted = torch.tensor([6, 3, 5], dtype=torch.int32, device=DEVICE)
    results = []
    for sizes, accepted in ((case["num_nodes"], accepted), (None, accepted), (None, accepted.long())):
        pool = case["pool"].clone()
        y = CT.tree_conv(case["x"], case["weight"], pool, case["slots"], case["parents"], bias=case["bias"],
                         num_nodes=sizes, validate=validate)
        CT.tree_conv_commit(pool, case["slots"], case["x"], case["parents"], accepted, num_nodes=sizes,
                            validate=validate)
        results.append((y, pool.nan_to_num(7.0)))
    for other in results[1:]:
        for got, want in zip(other, results[0]):
            assert torch.equal(got, want)
    assert rel_err(results[1][0][0], reference_conv(case, 0)[0]) < 1e-5


def test_layers_commit_in_one_launch():
    """Pools ``[G, P, W - 1, C]`` and inputs ``[G, B, N, C]`` (strided views of wider rows, as the model's
    projections) commit in one launch exactly as one launch per layer; other slots stay NaN."""
    rng = np.random.default_rng(2)
    rows = [[-1], build_tree_parents("chain", 5, rng), build_tree_parents("star", 4, rng),
            build_tree_parents("deep_wide", 8, rng)]
    base = make_conv_case(rows, width=4, pad=1, seed=20)
    cases = []
    for g in range(3):  # the layers' own inputs and states at the slots of one batch
        other = make_conv_case(rows, width=4, pad=1, seed=21 + g)
        layer = dict(base, x=other["x"], pool=base["pool"].clone())
        layer["pool"][base["slots"]] = other["pool"][other["slots"]]
        cases.append(layer)
    accepted = torch.tensor([0, 4, 2, 6], dtype=torch.int32, device=DEVICE)
    B, N, C = cases[0]["x"].shape
    wide = torch.full((3, B, N, C + 5), float("nan"), device=DEVICE)
    wide[..., :C] = torch.stack([c["x"] for c in cases])
    pools = torch.stack([c["pool"] for c in cases])  # [G, P, W - 1, C]
    shared = dict(num_nodes=cases[0]["num_nodes"])
    assert CT.tree_conv_commit(pools, cases[0]["slots"], wide[..., :C], cases[0]["parents"], accepted,
                               **shared) is pools
    for g, c in enumerate(cases):
        CT.tree_conv_commit(c["pool"], c["slots"], c["x"], c["parents"], accepted, **shared)
        assert torch.equal(pools[g].nan_to_num(7.0), c["pool"].nan_to_num(7.0))
    with pytest.raises(ValueError, match="x has shape"):
        CT.tree_conv_commit(pools, cases[0]["slots"], wide[:2, ..., :C], cases[0]["parents"], accepted, **shared)


def test_torch_conv_baselines_match_reference():
    rows = [build_tree_parents("deep_wide", 9, np.random.default_rng(0)), [-1, 0, 1]]
    case = make_conv_case(rows, bias=True, seed=3, device="cpu")
    out = R.tree_conv_ref(case["x"].double(), case["weight"].double(), case["pool"].double(), case["slots"],
                          case["parents"], bias=case["bias"].double(), num_nodes=case["num_nodes"])
    accepted = torch.tensor([8, 0])
    new = R.tree_conv_commit_ref(case["pool"].double(), case["slots"], case["x"], case["parents"], accepted,
                                 num_nodes=case["num_nodes"])
    for b in range(2):
        ref, x, state, tree = reference_conv(case, b)
        assert rel_err(out[b, : len(rows[b])], ref) < 1e-12
        assert np.array_equal(new[b].numpy(), gdn.conv_state_commit(x, state, tree, int(accepted[b])))


def test_conv_bad_input():
    case = make_conv_case([[-1, 0, 1]], seed=1)
    args = lambda c: (c["x"], c["weight"], c["pool"], c["slots"], c["parents"])  # noqa: E731
    bad = dict(case, parents=case["parents"].clone())
    bad["parents"][0, 2] = 2
    with pytest.raises(ValueError, match=re.escape("parents[0][2]")):
        CT.tree_conv(*args(bad))
    with pytest.raises(ValueError, match="slots"):
        CT.tree_conv(*args(dict(case, slots=case["slots"] + 10)))
    with pytest.raises(ValueError, match="weight has shape"):
        CT.tree_conv(*args(dict(case, weight=case["weight"][:, :3])))
    with pytest.raises(ValueError, match="x"):
        CT.tree_conv(*args(dict(case, x=case["x"].index_fill(1, torch.tensor([0], device=DEVICE), float("nan")))))
    with pytest.raises(ValueError, match="activation"):
        CT.tree_conv(*args(case), activation="gelu")
    with pytest.raises(ValueError, match="accepted"):
        CT.tree_conv_commit(case["pool"], case["slots"], case["x"], case["parents"],
                            torch.tensor([5], device=DEVICE))
    with pytest.raises(ValueError, match="conv_pool has shape"):
        CT.tree_conv(*args(dict(case, pool=case["pool"][:, :, :5])))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gpu_qwen_channels(dtype):
    rng = np.random.default_rng(5)
    shapes = [("random", 64), ("chain", 128), ("star", 9), ("single", 1)]
    rows = [build_tree_parents(kind, n, rng) for kind, n in shapes]
    case = make_conv_case(rows, C=8192, width=4, seed=2, dtype=dtype)
    out = CT.tree_conv(case["x"], case["weight"], case["pool"], case["slots"], case["parents"],
                       num_nodes=case["num_nodes"])
    ref = R.tree_conv_ref(case["x"].double(), case["weight"].double(), case["pool"].double(), case["slots"],
                          case["parents"], num_nodes=case["num_nodes"])
    assert rel_err(out, ref) < (1e-6 if dtype == torch.float32 else 1e-2)
    accepted = torch.tensor([40, 127, 8, 0], dtype=torch.int32, device=DEVICE)
    want = R.tree_conv_commit_ref(case["pool"], case["slots"], case["x"], case["parents"], accepted,
                                  num_nodes=case["num_nodes"])
    CT.tree_conv_commit(case["pool"], case["slots"], case["x"], case["parents"], accepted,
                        num_nodes=case["num_nodes"])
    assert torch.equal(case["pool"][case["slots"]], want)
