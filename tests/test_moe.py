"""The routed MoE block (lumotree.optimized.ops.moe) against its torch reference and the exact reference model.

CPU: the Triton interpreter on small float32 shapes: ``moe_routed`` against ``moe_routed_ref`` (float32, norm-wise
relative error below 1e-5) and against ``reference.model.moe`` (float64 numpy, the same bound) for 1 to 70 tokens,
4 to 16 experts, top 1 to 4, with and without renormalisation and the shared expert; experts that receive no token,
every token on one expert, exact ties in the router (the lower index wins), one and several router programs (bit-
identical), a NaN-poisoned ``out``, fp16 inputs, run-to-run determinism, every input error, a hypothesis property,
the default launch rule, every default kernel compiled for sm_90 (no GPU needed), the prefill, tree verify, commit
and decode of a Qwen3-Next and a Qwen3.5-MoE model against the reference model, and the benchmark's random weights.
Block-FP8 experts (any mix of FP8 and float weights) against the reference on the dequantised weights.
GPU (``pytest -m gpu``): Qwen3-Next's and Qwen3.5-MoE's shapes in bf16 (float and block-FP8 experts) against the
reference's fp32 experts on the same routing, and a CUDA-graph replay.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st

from lumotree.optimized.ops import moe as M
from lumotree.optimized.ops.gemv import Fp8Weight
from lumotree.optimized.ops.moe.resources import tools_present
from lumotree.reference import model as rm
from lumotree.reference.config import HybridConfig
from lumotree.reference.tree import TokenTree

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
RTOL = 1e-5  # float32 kernel against the references, norm-wise
SHARED = ("shared_gate_up", "shared_down", "shared_gate")


def _block(T: int, E: int, Dm: int, I: int, Is: int, seed: int, dtype=torch.float32) -> dict:
    """Random inputs of one MoE block (``Is = 0``: no shared expert), weights of unit-scale outputs."""
    gen = torch.Generator(device=DEVICE).manual_seed(seed)

    def rand(*shape, scale=1.0):
        return (torch.randn(*shape, generator=gen, device=DEVICE) * scale).to(dtype)

    args = dict(x=rand(T, Dm), router=rand(E, Dm), w_gate_up=rand(E, 2 * I, Dm, scale=Dm**-0.5),
                w_down=rand(E, Dm, I, scale=I**-0.5))
    if Is:
        args.update(shared_gate_up=rand(2 * Is, Dm, scale=Dm**-0.5), shared_down=rand(Dm, Is, scale=Is**-0.5),
                    shared_gate=rand(1, Dm, scale=Dm**-0.5))
    return args


def _call(fn, args: dict, top_k: int, norm: bool, **kwargs) -> torch.Tensor:
    return fn(**args, top_k=top_k, norm_topk_prob=norm, **kwargs)


def _rel_err(y: torch.Tensor, ref: torch.Tensor) -> float:
    return float((y.double() - ref.double()).norm() / ref.double().norm().clamp_min(1e-30))


def _model_moe(args: dict, top_k: int, norm: bool) -> np.ndarray:
    """``reference.model.moe`` (float64 numpy) on the same weights: ``w_gate_up`` split into gate and up rows."""
    a = {n: t.double().cpu().numpy() for n, t in args.items()}
    I, Is = a["w_gate_up"].shape[1] // 2, a["shared_gate_up"].shape[0] // 2
    shared = rm.MLPWeights(a["shared_gate_up"][:Is], a["shared_gate_up"][Is:], a["shared_down"])
    w = rm.MoEWeights(a["router"], a["w_gate_up"][:, :I], a["w_gate_up"][:, I:], a["w_down"], shared,
                      a["shared_gate"])
    return rm.moe(a["x"], w, top_k, norm)


def _check(args: dict, top_k: int, norm: bool, **kwargs) -> torch.Tensor:
    """``moe_routed`` into a NaN-poisoned ``out``: every row written, within RTOL of the float32 reference."""
    T, Dm = args["x"].shape
    out = torch.full((T, Dm), float("nan"), dtype=args["x"].dtype, device=DEVICE)  # [T, Dm]
    y = _call(M.moe_routed, args, top_k, norm, out=out, **kwargs)
    assert y.data_ptr() == out.data_ptr() and bool(torch.isfinite(y).all())
    assert _rel_err(y, _call(M.moe_routed_ref, args, top_k, norm)) < RTOL
    return y


# --------------------------------------------------------------------------------------------------- correctness
CASES = [  # (T, E, top_k, norm_topk_prob, shared width Is; 0: none)
    (1, 4, 1, True, 0), (1, 8, 2, False, 24), (1, 16, 4, True, 16),
    (3, 4, 4, True, 24), (3, 8, 1, False, 0), (3, 16, 2, True, 24),
    (17, 4, 2, False, 16), (17, 8, 4, True, 0), (17, 16, 1, True, 24),
    (70, 4, 1, True, 24), (70, 8, 2, True, 16), (70, 16, 4, False, 24),
]


@pytest.mark.parametrize("T,E,top_k,norm,Is", CASES, ids=lambda v: str(v))
def test_matches_both_references(T, E, top_k, norm, Is):
    """Against ``moe_routed_ref`` in float32 and (with the shared expert, which the reference model always has)
    ``reference.model.moe`` in float64, else ``moe_routed_ref`` in float64."""
    args = _block(T, E, 32, 16, Is, seed=T * 1000 + E * 10 + top_k)
    y = _check(args, top_k, norm)
    exact = (_model_moe(args, top_k, norm) if Is else
             _call(M.moe_routed_ref, {n: t.double() for n, t in args.items()}, top_k, norm).numpy())
    assert _rel_err(y, torch.from_numpy(exact)) < RTOL


def _fp8(w: torch.Tensor, seed: int, permute: bool = False) -> Fp8Weight:
    """Block FP8 of ``w`` after scaling each 128 x 128 block by its own random factor (so that a wrong scale block
    shows), optionally with permuted rows (the scale-row index then differs from ``n // 128``)."""
    gen = torch.Generator(device=DEVICE).manual_seed(seed)
    *lead, N, K = w.shape
    blocks = torch.exp(torch.randn(*lead, -(-N // 128), -(-K // 128), generator=gen, device=DEVICE))
    full = blocks.repeat_interleave(128, dim=-2).repeat_interleave(128, dim=-1)[..., :N, :K]
    q = Fp8Weight.quantize(w * full)
    return q.take_rows(torch.randperm(N, generator=gen, device=DEVICE)) if permute else q


def _dequantised(args: dict, dtype=torch.float32) -> dict:
    return {n: t.dequantize(dtype) if isinstance(t, Fp8Weight) else t.to(dtype) for n, t in args.items()}


FP8_CASES = [  # (T, E, top_k, the FP8 weights, shared width Is; 0: none)
    (1, 8, 2, ("w_gate_up", "w_down", "shared_gate_up", "shared_down"), 136),
    (5, 4, 2, ("w_gate_up", "w_down"), 136),
    (5, 8, 3, ("w_gate_up", "w_down"), 0),
    (33, 8, 2, ("w_gate_up", "shared_down"), 136),
    (33, 4, 1, ("w_down", "shared_gate_up"), 136),
]


@pytest.mark.parametrize("T,E,top_k,fp8,Is", FP8_CASES, ids=lambda v: str(v))
def test_fp8_experts_match_the_reference_on_the_dequantised_weights(T, E, top_k, fp8, Is):
    """Block-FP8 experts and shared expert (any mix of FP8 and float weights; 2 x 3 scale blocks of 128, partial
    ones, permuted rows) against ``moe_routed_ref`` on the dequantised weights in float32 and, exactly dequantised,
    float64; into a NaN-poisoned ``out``."""
    args = _block(T, E, 160, 144, Is, seed=T + E + top_k)
    for i, name in enumerate(fp8):
        args[name] = _fp8(args[name], seed=i, permute=i == 0)
    out = torch.full((T, 160), float("nan"), device=DEVICE)
    y = _call(M.moe_routed, args, top_k, True, out=out)
    assert y.data_ptr() == out.data_ptr() and bool(torch.isfinite(y).all())
    assert _rel_err(y, _call(M.moe_routed_ref, _dequantised(args), top_k, True)) < RTOL
    assert _rel_err(y, _call(M.moe_routed_ref, _dequantised(args, torch.float64), top_k, True)) < RTOL
    assert torch.equal(y, _call(M.moe_routed, args, top_k, True))


def test_fp8_experts_bad_inputs_name_the_argument():
    a = _block(3, 4, 160, 144, 136, seed=2)
    a.update(w_gate_up=_fp8(a["w_gate_up"], 0), w_down=_fp8(a["w_down"], 1), shared_down=_fp8(a["shared_down"], 2))
    up, down = a["w_gate_up"], a["w_down"]
    cases = [
        (dict(a, w_down=down._replace(scale=down.scale[:, :, :1])), ValueError, r"w_down.scale has shape"),
        (dict(a, w_gate_up=up._replace(weight=up.weight.float())), TypeError, "w_gate_up.weight has dtype"),
        (dict(a, w_gate_up=up._replace(scale_rows=up.scale_rows.long())), TypeError, "w_gate_up.scale_rows has dtype"),
        (dict(a, w_down=down._replace(scale_rows=down.scale_rows + 5)), ValueError,
         r"w_down.scale_rows holds 6: the indices must lie in \[0, R = 2\)"),
        (dict(a, shared_down=a["shared_down"]._replace(tail=torch.zeros(1, 136, device=DEVICE))), ValueError,
         "shared_down is an Fp8Weight with a float tail"),
        (dict(a, config=M.MoEConfig(16, 16, 16, 256, 4)), ValueError,
         "config.block_k = 256 must divide 128 with block-FP8 weights"),
    ]
    for kwargs, error, message in cases:
        with pytest.raises(error, match=message):
            _call(M.moe_routed, kwargs, 2, True)


@pytest.mark.parametrize("T", [17, 40])
def test_one_and_several_router_programs_are_bit_identical(T):
    """``route_tokens`` 4 (counts per block, the scan and the scatter) and 128 (one program sorts everything) give
    the same stable order and so the same bits; the output is the same on a repeated call."""
    args = _block(T, 8, 32, 16, 16, seed=T)
    one = _check(args, 2, True, config=M.MoEConfig(16, 16, 16, 16, 128))
    several = _check(args, 2, True, config=M.MoEConfig(16, 16, 16, 16, 4))
    assert torch.equal(one, several)
    assert torch.equal(several, _call(M.moe_routed, args, 2, True, config=M.MoEConfig(16, 16, 16, 16, 4)))


def _biased(args: dict, favoured: list[int], margin: float) -> dict:
    """Router logits ``margin`` higher for the ``favoured`` experts (a constant feature of x)."""
    args = {n: t.clone() for n, t in args.items()}
    args["x"][:, 0] = 1.0
    args["router"][:, 0] = -margin
    args["router"][favoured, 0] = margin
    return args


@pytest.mark.parametrize("top_k", [1, 2])
def test_experts_without_tokens_are_skipped(top_k):
    """Only experts 1, 4 and 6 of 8 can win: the rest receive no token (their weights NaN: never read)."""
    args = _biased(_block(17, 8, 32, 16, 24, seed=5), [1, 4, 6], margin=20.0)
    ids, _ = M.route_ref(args["x"], args["router"], top_k, True)
    assert set(ids.unique().tolist()) <= {1, 4, 6}
    unused = [0, 2, 3, 5, 7]
    want = _call(M.moe_routed_ref, args, top_k, True)
    args["w_gate_up"][unused] = float("nan")
    args["w_down"][unused] = float("nan")
    y = _call(M.moe_routed, args, top_k, True)
    assert _rel_err(y, want) < RTOL


@pytest.mark.parametrize("top_k", [1, 2])
def test_every_token_on_one_expert(top_k):
    """70 tokens all routed to expert 3 (several tiles of one expert), with a second choice for top 2."""
    args = _biased(_block(70, 8, 32, 16, 16, seed=6), [3], margin=30.0)
    ids, _ = M.route_ref(args["x"], args["router"], top_k, True)
    assert bool((ids[:, 0] == 3).all())
    _check(args, top_k, True)
    _check(args, top_k, True, config=M.MoEConfig(32, 16, 16, 16, 8))


@pytest.mark.parametrize("top_k", [1, 2])
def test_router_ties_go_to_the_lower_expert_index(top_k):
    """Integer inputs make the logits exact: experts 2, 5 and 6 share one router row (an exact tie at the top for
    every token), the other experts lie far below. The first ``top_k`` of the tie in index order win; swapping the
    weights of the last winner and expert 6 changes the output."""
    gen = torch.Generator().manual_seed(7)
    args = _block(9, 8, 32, 16, 16, seed=8)
    args["x"] = torch.randint(-2, 3, (9, 32), generator=gen).float().to(DEVICE)
    args["x"][:, 0] = 4.0
    router = torch.randint(-1, 2, (8, 32), generator=gen).float()
    router[:, 0] = -8.0
    router[[5, 6]] = router[2].clone()
    router[[2, 5, 6], 0] = 8.0
    args["router"] = router.to(DEVICE)
    ids, _ = M.route_ref(args["x"], args["router"], top_k, False)
    assert ids.tolist() == [[2, 5][:top_k]] * 9
    y = _check(args, top_k, False)
    order = list(range(8))
    order[[2, 5][top_k - 1]], order[6] = 6, [2, 5][top_k - 1]
    swapped = {**args, "w_gate_up": args["w_gate_up"][order], "w_down": args["w_down"][order]}
    assert _rel_err(y, _call(M.moe_routed_ref, swapped, top_k, False)) > 1e-2


def test_all_experts_chosen_and_one_expert():
    """``top_k = E`` (every expert, weights renormalised to the full softmax) and ``E = 1``."""
    args = _block(5, 4, 32, 16, 24, seed=9)
    _check(args, 4, True)
    _check(_block(5, 1, 32, 16, 0, seed=10), 1, False)


def test_strided_rows_of_x():
    """x as every other column block of a wider tensor (rows 64 elements apart)."""
    args = _block(5, 8, 32, 16, 16, seed=13)
    wide = torch.zeros(5, 64, device=DEVICE)
    wide[:, 16:48] = args["x"]
    args["x"] = wide[:, 16:48]
    assert args["x"].stride() == (64, 1)
    _check(args, 2, True)


def test_fp16_inputs_accumulate_in_fp32():
    """fp16 inputs (the interpreter's ``tl.dot`` does not take bf16): within the roundings of the intermediates."""
    args = _block(17, 8, 64, 32, 32, seed=11, dtype=torch.float16)
    y = _call(M.moe_routed, args, 2, True)
    assert y.dtype == torch.float16
    assert _rel_err(y, _call(M.moe_routed_ref, {n: t.double() for n, t in args.items()}, 2, True)) < 5e-3


@pytest.mark.filterwarnings("ignore:All-NaN slice:RuntimeWarning")  # the interpreter's max over the NaN row
def test_nan_input_is_rejected_or_stays_in_bounds():
    """NaN in x: a ValueError naming x; with ``validate=False`` (graph capture) the kernels still index in range
    and the other tokens' rows are exact."""
    args = _block(6, 8, 32, 16, 16, seed=12)
    want = _call(M.moe_routed_ref, args, 2, True)
    args["x"][2, 3] = float("nan")
    with pytest.raises(ValueError, match=r"x contains NaN or inf \(first at index \[2, 3\]\)"):
        _call(M.moe_routed, args, 2, True)
    for config in (M.MoEConfig(16, 16, 16, 16, 128), M.MoEConfig(16, 16, 16, 16, 2)):
        y = _call(M.moe_routed, args, 2, True, validate=False, config=config)
        others = [0, 1, 3, 4, 5]
        assert y.shape == (6, 32) and _rel_err(y[others], want[others]) < RTOL


@settings(max_examples=6, deadline=None)
@given(T=st.integers(1, 24), E=st.integers(1, 12), k_frac=st.floats(0, 1), norm=st.booleans(),
       Is=st.sampled_from([0, 8, 24]), Dm=st.sampled_from([16, 40]), I=st.sampled_from([8, 24]),
       block_m=st.sampled_from([16, 32]), route_tokens=st.sampled_from([1, 4, 64]), seed=st.integers(0, 2**16))
def test_random_blocks_and_launches(T, E, k_frac, norm, Is, Dm, I, block_m, route_tokens, seed):
    top_k = 1 + int(k_frac * (E - 1))
    args = _block(T, E, Dm, I, Is, seed)
    _check(args, top_k, norm, config=M.MoEConfig(block_m, 16, 16, 16, route_tokens))


def test_default_config_rule():
    """moe_config's rule (docstring) at Qwen3-Next's shapes on a 132-SM card, and shrunk to small problems."""
    def cfg(T: int) -> M.MoEConfig:
        return M.moe_config(T, 10, 512, 512, 2048, "cpu", sms=132)

    assert cfg(1) == M.MoEConfig(16, 16, 32, 128, 16, 4, 3)  # 10 one-row tiles: narrow programs
    assert cfg(16) == M.MoEConfig(16, 128, 128, 64, 16, 4, 3)
    assert cfg(1024) == M.MoEConfig(32, 128, 128, 64, 16, 4, 3)  # 20 rows per expert
    assert cfg(8192) == M.MoEConfig(64, 128, 128, 64, 16, 8, 3)
    assert M.moe_config(3, 2, 8, 16, 32, "cpu", sms=4) == M.MoEConfig(16, 16, 16, 16, 128, 4, 3)
    assert M.moe_config(1, 8, 256, 512, 2048, "cpu", sms=132).route_tokens == 32  # Qwen3.5-MoE


def _tiny_moe_config(model_type: str) -> HybridConfig:
    """A 2-layer MoE model (GDN then attention) of 6 experts top 2 with a shared expert: Qwen3-Next's block without
    renormalisation, Qwen3.5-MoE's (always renormalised)."""
    return HybridConfig(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                        layer_types=("linear_attention", "full_attention"), num_attention_heads=4,
                        num_key_value_heads=2, head_dim=16, linear_key_head_dim=16, linear_value_head_dim=16,
                        linear_num_key_heads=2, linear_num_value_heads=4, num_experts=6, num_experts_per_tok=2,
                        moe_intermediate_size=24, shared_expert_intermediate_size=16,
                        norm_topk_prob=model_type == "qwen3_5_moe_text", rope_theta=1000.0, model_type=model_type)


@pytest.mark.parametrize("model_type", ["qwen3_next", "qwen3_5_moe_text"])
def test_moe_model_decode_and_tree_verify_match_reference(model_type):
    """The optimized model's MoE layers on the routed block (every call goes through ``moe_routed``): prefill, a
    tree verify, its commit and decode steps at B = 1 and 2 equal the float64 reference model."""
    from lumotree.optimized import model as om
    from lumotree.optimized.model import layers

    config = _tiny_moe_config(model_type)
    ref = rm.build_random(config, seed=4)
    opt = om.from_reference(ref, num_slots=2, max_seq_len=32, max_nodes=8, graphs=False)
    calls = []
    routed = layers.moe_routed

    def counted(*args, **kwargs):
        calls.append(args[0].shape[0])
        return routed(*args, **kwargs)

    layers.moe_routed = counted
    try:
        caches, prompts = [ref.new_cache(), ref.new_cache()], [[3, 5, 7, 11, 13], [2, 4]]
        for slot, prompt in enumerate(prompts):
            want = ref.forward(prompt, caches[slot])[-1]
            np.testing.assert_allclose(opt.prefill(slot, prompt).numpy(), want, atol=1e-4)
        tree = TokenTree([-1, 0, 0, 1, 2], [4, 8, 9, 10, 12])
        logits = opt.verify(torch.tensor([1], dtype=torch.int32), torch.tensor([tree.tokens]),
                            torch.tensor([tree.parents], dtype=torch.int32))
        np.testing.assert_allclose(logits[0].numpy(), ref.verify_tree(list(tree.tokens), tree, caches[1]), atol=1e-4)
        opt.commit(torch.tensor([1], dtype=torch.int32), torch.tensor([3], dtype=torch.int32))
        ref.commit(list(tree.tokens), tree, 3, caches[1])
        got = opt.decode(torch.tensor([1], dtype=torch.int32), torch.tensor([17]))
        np.testing.assert_allclose(got[0].numpy(), ref.forward([17], caches[1])[-1], atol=1e-4)
        got = opt.decode(torch.tensor([0, 1], dtype=torch.int32), torch.tensor([19, 23]))
        for row, (slot, token) in enumerate([(0, 19), (1, 23)]):
            np.testing.assert_allclose(got[row].numpy(), ref.forward([token], caches[slot])[-1], atol=1e-4)
    finally:
        layers.moe_routed = routed
    assert calls == [5, 5, 2, 2, 5, 5, 1, 1, 2, 2]  # per step, both layers: prefills, the verify, the decodes


def test_random_weights_match_random_tensors_layouts():
    """``random_weights`` (drawn one tensor at a time, for the benchmark's large models) builds the layouts, dtypes
    and distributions that ``load_weights`` builds from ``random_tensors``."""
    from lumotree.optimized.model import random_tensors, random_weights
    from lumotree.optimized.model.weights import load_weights

    config = _tiny_moe_config("qwen3_next")
    drawn = random_weights(config, seed=3, device="cpu", dtype=torch.float32)
    loaded = load_weights(config, random_tensors(config, 3, "cpu"), torch.device("cpu"), torch.float32)

    def leaves(w):
        return [(type(o).__name__, n, t) for o in (w, *w.layers, *w.mlps) for n, t in vars(o).items()
                if isinstance(t, torch.Tensor)]

    pairs = list(zip(leaves(drawn), leaves(loaded)))
    assert len(pairs) == len(leaves(loaded)) > 20
    for (kind, name, a), (_, _, b) in pairs:
        assert (a.shape, a.dtype) == (b.shape, b.dtype), (kind, name)
        assert bool(torch.isfinite(a).all()), (kind, name)
        if a.numel() >= 256:  # same distribution: scales within 25 % (different draws)
            assert abs(float(a.std()) / float(b.std()) - 1) < 0.25, (kind, name)
    assert not torch.equal(drawn.mlps[0].w_gate_up, loaded.mlps[0].w_gate_up)


# ---------------------------------------------------------------------------------------------------- bad inputs
def _bad_input_cases():
    a = _block(3, 4, 32, 16, 24, seed=1)
    no_shared = {n: t for n, t in a.items() if n not in SHARED}
    return [
        (dict(a, x=a["x"].numpy() if DEVICE == "cpu" else [1.0]), TypeError, "x must be a torch.Tensor"),
        (dict(a, x=a["x"][0]), ValueError, r"x has shape \(32,\), expected \[T, Dm\]"),
        (dict(a, x=a["x"][:0]), ValueError, "T = 0 tokens"),
        (dict(a, x=a["x"].to(torch.int32)), TypeError, "x has dtype torch.int32"),
        (dict(a, x=torch.zeros(32, 3, device=DEVICE).T), ValueError, "x must have a contiguous last dimension"),
        (dict(a, router=a["router"][:, :16]), ValueError, r"router has shape \(4, 16\), expected \[E, Dm\]"),
        (dict(a, router=a["router"].half()), TypeError, "router has dtype torch.float16"),
        (dict(a, router=torch.zeros(0, 32, device=DEVICE)), ValueError, "router has 0 rows"),
        (dict(a, router=torch.zeros(4, 32, device="meta")), ValueError, "router is on meta"),
        (dict(a, w_gate_up=a["w_gate_up"][:3]), ValueError, r"w_gate_up has shape \(3, 32, 32\), expected \[E, 2I"),
        (dict(a, w_gate_up=a["w_gate_up"][:, :31]), ValueError, "w_gate_up has 31 rows per expert"),
        (dict(a, w_down=a["w_down"][..., :8]), ValueError, r"w_down has shape \(4, 32, 8\), expected \[E, Dm, I\]"),
        (dict(a, w_down=a["w_down"].transpose(1, 2).contiguous().transpose(1, 2)), ValueError,
         "w_down must have a contiguous last dimension"),
        (dict(a, top_k=0), ValueError, r"top_k = 0 must lie in \[1, E = 4\]"),
        (dict(a, top_k=5), ValueError, r"top_k = 5 must lie in \[1, E = 4\]"),
        (dict(a, top_k=2.0), TypeError, "top_k must be an int"),
        (dict(a, top_k=True), TypeError, "top_k must be an int"),
        (dict(a, norm_topk_prob=1), TypeError, "norm_topk_prob must be a bool"),
        (dict(no_shared, shared_down=a["shared_down"]), ValueError, "shared_gate_up, shared_gate is None"),
        (dict(a, shared_gate_up=a["shared_gate_up"][:47]), ValueError, "shared_gate_up has 47 rows"),
        (dict(a, shared_down=a["shared_down"][:, :8]), ValueError, r"shared_down has shape \(32, 8\), expected"),
        (dict(a, shared_gate=a["shared_gate"][0]), ValueError, r"shared_gate has shape \(32,\), expected \[1, Dm\]"),
        (dict(a, config=(16, 16, 16, 16, 4)), TypeError, "config must be a MoEConfig"),
        (dict(a, config=M.MoEConfig(8, 16, 16, 16, 4)), ValueError, "config.block_m = 8 must be a power of two"),
        (dict(a, config=M.MoEConfig(16, 16, 48, 16, 4)), ValueError, "config.down_n = 48"),
        (dict(a, config=M.MoEConfig(16, 16, 16, 16, 3)), ValueError, "config.route_tokens = 3"),
        (dict(a, config=M.MoEConfig(16, 16, 16, 16, 4, 4, 0)), ValueError, "config.num_stages = 0"),
        (dict(a, out=torch.empty(3, 31, device=DEVICE)), ValueError, r"out has shape \(3, 31\), expected \[T, Dm\]"),
        (dict(a, out=torch.empty(3, 32, device=DEVICE).half()), TypeError, "out has dtype torch.float16"),
        (dict(a, out=torch.empty(32, 3, device=DEVICE).T), ValueError, "out must be contiguous"),
        (dict(a, out=a["x"]), ValueError, "out shares memory with x"),
    ]


@pytest.mark.parametrize("case", range(len(_bad_input_cases())))
def test_bad_inputs_raise_naming_the_argument(case):
    kwargs, error, message = _bad_input_cases()[case]
    kwargs.setdefault("top_k", 2)
    kwargs.setdefault("norm_topk_prob", True)
    with pytest.raises(error, match=message):
        M.moe_routed(**kwargs)


# ------------------------------------------------------------------------------------------------ compile check
@pytest.mark.skipif(not tools_present(), reason="Triton's NVIDIA ptxas / cuobjdump are not installed")
@pytest.mark.parametrize("fp8", [False, True], ids=["bf16", "fp8"])
def test_default_kernels_compile_for_sm90_without_spills(fp8):
    """Every default launch at Qwen3-Next's shapes (T = 1, 16, 64, 1024), specialised as the JIT does, compiles for
    sm_90 in bf16 (and with block-FP8 expert and shared weights) without stack (spills)
    (:mod:`lumotree.optimized.ops.moe.resources`, in a subprocess without the interpreter; ``--models`` without the
    flag adds Qwen3.5-MoE's shapes)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    run = subprocess.run([sys.executable, "-m", "lumotree.optimized.ops.moe.resources", "--models", "qwen3-next",
                          *["--fp8"] * fp8], capture_output=True, text=True, env=env, timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    rows = [json.loads(line) for line in run.stdout.splitlines() if line.startswith("{")]
    kinds = {row["label"].split()[0] for row in rows}
    assert kinds == {"route", "scan", "scatter", "gate_up", "down", "combine"}, kinds
    assert sum(row["launches"] for row in rows) == 4 + 4 + 6 + 6  # T = 1 and 16: one router launch
    for row in rows:
        assert "error" not in row, row
        assert row["stack"] == 0 and row["smem"] <= 160 * 1024, row


# ----------------------------------------------------------------------------------------------------------- GPU
GPU_MODELS = {"qwen3-next": (2048, 512, 512, 10, 512), "qwen3.5-moe": (2048, 256, 512, 8, 512)}  # Dm E I k Is


@pytest.mark.gpu
@pytest.mark.parametrize("model", list(GPU_MODELS))
@pytest.mark.parametrize("T", [1, 16, 64, 1024])
def test_gpu_model_shapes_bf16_match_fp32_reference(model, T):
    """Qwen3-Next's and Qwen3.5-MoE's block shapes (transformers' config defaults) in bf16, at decode (T = 1, 16),
    tree verify (64) and prefill-sized (1024) steps, against ``moe_routed_ref``'s fp32 experts on the same bf16
    routing; bit-identical on a repeated call."""
    Dm, E, I, k, Is = GPU_MODELS[model]
    args = _block(T, E, Dm, I, Is, seed=T, dtype=torch.bfloat16)
    y = _call(M.moe_routed, args, k, True)
    ref = _call(M.moe_routed_ref, dict(args, x=args["x"].float()), k, True, route_dtype=torch.bfloat16)
    assert y.dtype == torch.bfloat16 and _rel_err(y, ref) < 1e-2
    assert torch.equal(y, _call(M.moe_routed, args, k, True))  # deterministic


@pytest.mark.gpu
@pytest.mark.parametrize("model", list(GPU_MODELS))
@pytest.mark.parametrize("T", [1, 16, 64, 1024])
def test_gpu_fp8_experts_bf16_match_fp32_reference(model, T):
    """Block-FP8 experts and shared expert at the models' block shapes, bf16 activations, against
    ``moe_routed_ref``'s fp32 experts on the dequantised weights and the same bf16 routing; deterministic."""
    Dm, E, I, k, Is = GPU_MODELS[model]
    args = _block(T, E, Dm, I, Is, seed=T, dtype=torch.bfloat16)
    for name in ("w_gate_up", "w_down", "shared_gate_up", "shared_down"):
        args[name] = Fp8Weight.quantize(args[name])
    y = _call(M.moe_routed, args, k, True)
    ref = _call(M.moe_routed_ref, _dequantised(args), k, True, route_dtype=torch.bfloat16)
    assert y.dtype == torch.bfloat16 and _rel_err(y, ref) < 1e-2
    assert torch.equal(y, _call(M.moe_routed, args, k, True))


@pytest.mark.gpu
def test_gpu_graph_replay_equals_eager():
    """Captured in a CUDA graph (no host syncs, fixed shapes), replayed on new inputs in place."""
    args = _block(64, 512, 2048, 512, 512, seed=3, dtype=torch.bfloat16)
    out = torch.empty_like(args["x"])
    _call(M.moe_routed, args, 10, True, validate=False, out=out)  # compile
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        _call(M.moe_routed, args, 10, True, validate=False, out=out)
    args["x"].copy_(torch.randn_like(args["x"]))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, _call(M.moe_routed, args, 10, True))
