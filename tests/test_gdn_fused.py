"""The fused GDN tree verify (lumotree.optimized.ops.gdn_tree.fused, Gluon, sm_90).

CPU: the kernel is built for sm_90 without a GPU (Triton compiles it; ``TRITON_INTERPRET`` cannot run Gluon), and
calls off Hopper raise. GPU (``pytest -m gpu``, an H100 / H200): two decoding steps, the second verified by the
fused kernel from the first step's recorded commit, against float64 torch (the closed form on the exact commit of
the first step's factors).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
from strategies import build_tree_parents
from test_gdn_kernels import make_case, rel_err

from lumotree.optimized.ops.gdn_tree import fused as FV
from lumotree.optimized.ops.gdn_tree import pending as PD
from lumotree.optimized.ops.gdn_tree import reference as R
from lumotree.optimized.ops.gdn_tree.portable import portable_verify

HOPPER = torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)
SMEM_LIMIT = 227 * 1024  # bytes of shared memory a block may take on sm_90


BUILD = """
import json
from lumotree.optimized.ops.gdn_tree import fused_kernel as F
out = {}
for norm in (True, False):
    kernel = F.build_for_sm90(norm=norm, fp16_doubling=norm)  # (fp16 operands need normalised keys)
    ptx = kernel.asm["ptx"]
    out[str(norm)] = dict(shared=kernel.metadata.shared, setmaxnreg=ptx.count("setmaxnreg"),
                          wgmma=ptx.count("wgmma.mma_async"), tma=ptx.count("cp.async.bulk.tensor"),
                          fences=ptx.count("fence.proxy.async"), chunks=128 // F.BK)
print(json.dumps(out))
"""


def test_kernel_builds_for_sm90(tmp_path):
    """Both forms compile for sm_90 (on any machine): warp-specialised (register reallocation between the
    partitions), on the tensor cores, TMA in and out, within a block's shared memory; and the vector partition
    fences each chunk's slot against the async proxy before freeing it (its 8 chunks: 8 more fences). Built in a
    process of its own, as a GPU process builds it: without ``TRITON_INTERPRET`` (whose patches of Triton's
    tensor methods, left by the interpreted tests before this one, break Gluon's code generator) and with an
    empty Triton cache, so the code generator runs (a cached build once hid a kernel that could not be
    generated)."""
    pytest.importorskip("triton.experimental.gluon")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = str(tmp_path)
    done = subprocess.run([sys.executable, "-c", BUILD], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    built = json.loads(done.stdout.strip().splitlines()[-1])
    for form in built.values():
        assert form["shared"] <= SMEM_LIMIT
        assert form["setmaxnreg"] >= 3 and form["wgmma"] > 0 and form["tma"] > 0
    assert built["True"]["fences"] - built["False"]["fences"] == built["True"]["chunks"]


def test_off_hopper_the_call_raises_naming_the_device():
    q = torch.zeros(2, 64, 1, 128)
    if FV.fused_verify_supported(q.device):
        pytest.skip("this machine runs the fused verify")
    with pytest.raises(RuntimeError, match="sm_90"):
        FV.fused_verify(q, q, q, q, q, q, q, q, None)


DOUBLING_DEPTHS = {"shallow": (1, 2, 4, 5, 8, 10), "deep": (11, 16, 33)}  # the doubling's round count changes past
# 1, 2, 4, 8, 16, 32; its operands are fp16 for trees up to FP16_DOUBLING_MAX_DEPTH = 10 deep (deeper: tf32)


def _rows(kind: str, seed: int, B: int = 6, sized: bool = False) -> list[list[int]]:
    """``B`` trees of 64 nodes (``sized``: of 16-64 nodes); ``kind`` "shallow" / "deep": one tree of each depth in
    :data:`DOUBLING_DEPTHS` (a spine that deep, the other nodes hung off random spine nodes above its end)."""
    rng = np.random.default_rng(seed)
    if kind in DOUBLING_DEPTHS:
        return [[-1] + list(range(d)) + [int(rng.integers(0, max(d, 1))) for _ in range(63 - d)]
                for d in DOUBLING_DEPTHS[kind]]
    return [build_tree_parents(kind, int(rng.integers(16, 65)) if sized else 64, rng) for _ in range(B)]


def test_fp16_doubling_bound():
    """The bound behind ``FP16_DOUBLING_MAX_DEPTH``, in exact integers, for every operand the doubling stores: with
    ``|A_ij| <= 2`` on ancestor pairs ``l`` levels apart, ``|(A^m)_ij| <= 2^m C(l - 1, m - 1)`` and a partial sum
    of powers at most ``sum_m 2^m C(l - 1, m - 1) = 2 * 3^(l - 1)``; fp16's largest finite value is 65504. The
    deepest fp16 tree stays within it, one level deeper does not."""
    from math import comb

    F = pytest.importorskip("lumotree.optimized.ops.gdn_tree.fused_kernel")
    fp16_max = float(np.finfo(np.float16).max)

    def worst(levels_apart: int) -> int:
        powers = max(2**m * comb(levels_apart - 1, m - 1) for m in range(1, levels_apart + 1))
        partial = sum(2**m * comb(levels_apart - 1, m - 1) for m in range(1, levels_apart + 1))
        assert partial == 2 * 3**(levels_apart - 1)
        return max(powers, partial)

    deepest = F.FP16_DOUBLING_MAX_DEPTH.value
    assert all(worst(l) <= fp16_max for l in range(1, deepest + 1))
    assert worst(deepest + 1) > fp16_max


def _case(rows, norm: bool, seed: int, group: int = 2):
    """Qwen3-Next-sized inputs for ``rows`` padded to 64 nodes (NaN inputs in the padding); q / k rows of norm 1
    (``norm`` False: as the model gives them) or of random norms in [0.25, 4] (``norm``: the kernel normalises,
    and a norm taken from the wrong row shows)."""
    case = make_case(rows, H=2, group=group, K=128, V=128, pad=64 - max(len(r) for r in rows), seed=seed,
                     device="cuda")
    gen = torch.Generator(device="cuda").manual_seed(seed)
    for name in ("q", "k"):
        x = case[name] / case[name].norm(dim=-1, keepdim=True)
        if norm:
            x = x * (0.25 + 3.75 * torch.rand(x.shape[:3] + (1, ), device="cuda", generator=gen))
        case[name] = x.contiguous()
    return case


@pytest.mark.gpu
@pytest.mark.skipif(not HOPPER, reason="the fused verify runs on sm_90 only")
@pytest.mark.parametrize("kind, sized", [("random", False), ("chain", False), ("deep_wide", False), ("shallow", False),
                                         ("deep", False),
                                         ("random", True), ("star", True)])
@pytest.mark.parametrize("norm", [True, False])
def test_gpu_fused_step_matches_float64(kind, sized, norm):
    """Step 1 verified and recorded; step 2 by the fused kernel from the pool + the record: the pool it writes is
    the exact commit of step 1's factors, its outputs the closed form from that state (tf32 bounds), padding
    nodes' outputs zero, and after step 2's record and a flush the pool is the exact commit of step 2's
    factors."""
    rows = _rows(kind, seed=11, sized=sized)
    case = _case(rows, norm, seed=11)
    pool, slots, parents = case["pool"], case["slots"], case["parents"]
    sizes = dict(num_nodes=case["num_nodes"]) if sized else {}
    start = pool.clone()
    args = (case["q"], case["k"], case["v"], case["a"], case["b"])
    _, f1 = portable_verify(*args, pool, slots, parents, use_qk_l2norm_in_kernel=norm, input_precision="tf32",
                              **sizes)
    acc1 = torch.tensor([len(r) // 2 for r in rows], dtype=torch.int32, device="cuda")
    pending = PD.pending_commits(pool, 2)
    PD.gdn_tree_record(pending, pool, slots, f1, parents, acc1, **sizes)
    s1 = R.gdn_tree_commit_ref(start.double(), slots, f1, parents, acc1, **sizes)  # [B, HV, K, V] step 1's state
    case2 = _case(rows, norm, seed=12)  # step 2's tokens on the same trees
    args2 = tuple(case2[n] for n in ("q", "k", "v", "a", "b"))
    o2, f2 = FV.fused_verify(*args2, pool, slots, parents, pending, use_qk_l2norm_in_kernel=norm, **sizes)
    torch.cuda.synchronize()
    assert rel_err(pool[slots], s1) < 5e-4  # the update applied in tf32 (the probe: 2.0e-4)
    assert not bool(pending.active.any())
    pool64 = torch.zeros(pool.shape, dtype=torch.float64, device="cuda")
    pool64[slots.long()] = s1
    want_o, want_f = R.gdn_tree_closed_form_ref(*(t.double() for t in args2), pool64, slots, parents,
                                                use_qk_l2norm_in_kernel=norm, **sizes)
    assert rel_err(o2, want_o) < 3e-3
    assert f2.delta.dtype == torch.float16  # the values the outputs' product used
    assert rel_err(f2.delta, want_f.delta) < 2e-3
    assert rel_err(f2.log_gamma, want_f.log_gamma) < 1e-5
    if norm:
        assert rel_err(f2.k_rnorm, want_f.k_rnorm.nan_to_num(0.0)) < 1e-5  # (the reference: NaN * 0 on padding)
    for b, row in enumerate(rows):  # padding written as zeros
        for t in (o2, f2.delta, f2.log_gamma) + ((f2.k_rnorm, ) if norm else ()):
            assert not bool(t[b, len(row):].any())
    acc2 = torch.tensor([len(r) - 1 for r in rows], dtype=torch.int32, device="cuda")
    PD.gdn_tree_record(pending, pool, slots, f2, parents, acc2, **sizes)
    PD.gdn_tree_flush(pending, pool, slots)
    s2 = R.gdn_tree_commit_ref(pool64, slots, f2, parents, acc2, **sizes)
    assert rel_err(pool[slots], s2) < 5e-4
    others = torch.ones(pool.shape[0], dtype=torch.bool, device="cuda")
    others[slots.long()] = False
    assert torch.isnan(pool[others]).all()  # slots outside the batch untouched


@pytest.mark.gpu
@pytest.mark.skipif(not HOPPER, reason="the fused verify runs on sm_90 only")
def test_gpu_bad_input_names_the_argument():
    case = _case(_rows("random", seed=13, B=2), True, seed=13)
    pool, slots, parents = case["pool"], case["slots"], case["parents"]
    pending = PD.pending_commits(pool, 2)
    args = [case[n] for n in ("q", "k", "v", "a", "b")]
    with pytest.raises(TypeError, match="q"):
        FV.fused_verify(args[0].half(), *args[1:], pool, slots, parents, pending)
    with pytest.raises(ValueError, match="N = 32"):
        FV.fused_verify(*(t[:, :32].contiguous() for t in args), pool, slots, parents[:, :32], pending)
    with pytest.raises(ValueError, match="slots"):
        FV.fused_verify(*args, pool, slots[[0, 0]], parents, pending)
    with pytest.raises(ValueError, match="NaN"):
        FV.fused_verify(args[0] * float("nan"), *args[1:], pool, slots, parents, pending)
    with pytest.raises(ValueError, match="max_depth"):  # the trees are deeper than promised
        FV.fused_verify(*args, pool, slots, parents, pending, max_depth=1)
    with pytest.raises(ValueError, match="max_depth"):
        FV.fused_verify(*args, pool, slots, parents, pending, max_depth="3")
