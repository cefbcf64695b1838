"""Small-batch linear (lumotree.optimized.ops.gemv) against a float64 matmul.

CPU: the Triton interpreter on small float32 shapes (outputs must match ``x.double() @ w.double().T`` to 1e-5
relative), every launch form (broadcast + sum and ``tl.dot``, split-K 1 to 4, K not a multiple of the tile, padded M
and N), the split-K reduction bit-identical run to run with its counters back at zero, and every input error.
GPU (``pytest -m gpu``): the bench model's bf16 projection shapes against torch in float32, the LM head in fp32 out,
and a CUDA-graph replay.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st

from strategies import build_tree_parents, trees

from lumotree.optimized.ops import gemv as G

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
RTOL = 1e-5  # float32 kernel against float64, norm-wise


def _inputs(M: int, N: int, K: int, seed: int, dtype=torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator(device=DEVICE).manual_seed(seed)
    x = torch.randn(M, K, generator=gen, device=DEVICE).to(dtype)  # [M, K]
    w = torch.randn(N, K, generator=gen, device=DEVICE).to(dtype)  # [N, K]
    return x, w


def _rel_err(y: torch.Tensor, ref: torch.Tensor) -> float:
    return float((y.double() - ref).norm() / ref.norm().clamp_min(1e-30))


def _ref(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return x.double() @ w.double().T  # [M, N]


def _counters_zero() -> bool:
    return all(int(counters.abs().sum()) == 0 for _, counters in G.split_k_scratch_cache().values())


# --------------------------------------------------------------------------------------------------- correctness
@pytest.mark.parametrize("K", [16, 40, 128])
@pytest.mark.parametrize("N", [1, 17, 64, 100])
@pytest.mark.parametrize("M", [1, 3, 8, 21, 64])
def test_default_config_matches_float64(M, N, K):
    x, w = _inputs(M, N, K, seed=M * 10000 + N * 100 + K)
    y = G.small_batch_linear(x, w)
    assert y.shape == (M, N) and y.dtype == torch.float32
    assert _rel_err(y, _ref(x, w)) < RTOL


CONFIGS = [  # (block_n, block_k, split_k, num_warps, num_stages, use_dot, tma)
    G.GemvConfig(16, 16, 1, 4, 1),
    G.GemvConfig(16, 16, 2, 4, 1),
    G.GemvConfig(8, 32, 3, 4, 2),
    G.GemvConfig(4, 16, 4, 2, 1),
    G.GemvConfig(32, 64, 2, 8, 3),  # K = 40, 100: one partial tile
    G.GemvConfig(16, 32, 1, 4, 3, True),
    G.GemvConfig(16, 16, 3, 4, 3, True),
    G.GemvConfig(32, 32, 4, 4, 2, True),
    G.GemvConfig(16, 32, 3, 4, 2, True, True),  # tiles through tensor descriptors (edges zero-filled)
]


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: "-".join(map(str, c)))
@pytest.mark.parametrize("M,N,K", [(1, 100, 40), (3, 17, 128), (8, 64, 100), (5, 1, 72)])
def test_configs_match_float64_and_leave_counters_at_zero(M, N, K, config):
    x, w = _inputs(M, N, K, seed=7 * M + N + K)
    y = G.small_batch_linear(x, w, config=config)
    assert _rel_err(y, _ref(x, w)) < RTOL
    assert _counters_zero()


@pytest.mark.parametrize("config", [G.GemvConfig(8, 16, 4, 4, 1), G.GemvConfig(16, 16, 3, 4, 1, True)],
                         ids=["sum", "dot"])
def test_split_k_is_deterministic_and_reuses_its_scratch(config):
    x, w = _inputs(4, 100, 128, seed=3)
    first = G.small_batch_linear(x, w, config=config)
    scratch = {k: v[0].data_ptr() for k, v in G.split_k_scratch_cache().items()}
    for _ in range(3):
        again = G.small_batch_linear(x, w, config=config)
        assert torch.equal(first, again)  # bit-identical: fixed-order split-K sum
    assert {k: v[0].data_ptr() for k, v in G.split_k_scratch_cache().items()} == scratch  # cached, not reallocated
    assert _counters_zero()
    # keys (device type, index, M, N, block_n, split)
    assert any(k[2:] == (4, 100, config.block_n, config.split_k) for k in G.split_k_scratch_cache())


def test_split_k_scratch_counters_start_at_zero():
    partials, counters = G.split_k_scratch(torch.device(DEVICE), 3, 50, 16, 2)
    assert partials.shape == (2, 3, 50) and partials.dtype == torch.float32
    assert counters.shape == (4,) and counters.dtype == torch.int32 and int(counters.abs().sum()) == 0
    assert G.split_k_scratch(torch.device(DEVICE), 3, 50, 16, 2)[1] is counters


@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_out_dtype_is_one_rounding_of_the_fp32_sum(out_dtype):
    x, w = _inputs(2, 64, 40, seed=11)
    y = G.small_batch_linear(x, w, out_dtype=out_dtype, config=G.GemvConfig(16, 16, 2, 4, 1))
    assert y.dtype == out_dtype
    ref = _ref(x, w)
    tol = RTOL if out_dtype == torch.float32 else 1e-2
    assert _rel_err(y, ref) < tol


@pytest.mark.parametrize("use_dot", [False, True])
def test_half_inputs_accumulate_in_fp32(use_dot):
    """fp16 inputs (the interpreter's ``tl.dot`` does not take bf16): only the output rounding is lost."""
    x, w = _inputs(4, 40, 64, seed=13, dtype=torch.float16)
    y = G.small_batch_linear(x, w, out_dtype=torch.float32, config=G.GemvConfig(32, 32, 2, 4, 3, use_dot))
    assert _rel_err(y, _ref(x, w)) < RTOL


def test_out_buffer_is_written_and_returned():
    """``out=``: the product lands in the given buffer (a row block of a larger tensor, as the model's stacked
    projections), the same values as a fresh output; nothing outside it is touched."""
    x, w = _inputs(3, 24, 40, seed=17)
    big = torch.full((2, 3, 24), float("nan"), device=DEVICE)
    cfg = G.GemvConfig(8, 16, 2, 4, 1)
    y = G.small_batch_linear(x, w, config=cfg, out=big[1])
    assert y.data_ptr() == big[1].data_ptr() and torch.isnan(big[0]).all()
    assert torch.equal(y, G.small_batch_linear(x, w, config=cfg))
    with pytest.raises(ValueError, match="out has shape"):
        G.small_batch_linear(x, w, out=big[1, :2])
    with pytest.raises(TypeError, match="out has dtype"):
        G.small_batch_linear(x, w, out=big[1].half())
    with pytest.raises(ValueError, match="out must be contiguous"):
        G.small_batch_linear(x, w, out=torch.empty(24, 3, device=DEVICE).T)
    with pytest.raises(ValueError, match="out shares memory"):
        G.small_batch_linear(x[:, :40], w, out=x.view(-1)[:72].view(3, 24))


def test_strided_rows_of_x():
    base, w = _inputs(3, 40, 72, seed=5)
    x = base[:, 8:56]  # [3, 48] rows 72 elements apart
    y = G.small_batch_linear(x, w[:, :48].contiguous(), config=G.GemvConfig(8, 16, 2, 4, 1))
    assert _rel_err(y, _ref(x, w[:, :48])) < RTOL


@pytest.mark.parametrize("config", [G.GemvConfig(4, 16, 3, 4, 1), G.GemvConfig(16, 32, 2, 4, 2, True),
                                    G.GemvConfig(16, 32, 2, 4, 2, True, True), G.GemvConfig(8, 16, 1, 4, 1), None],
                         ids=["sum-split3", "dot-split2", "tma-split2", "sum-unsplit", "default"])
@pytest.mark.parametrize("M,I,K", [(1, 37, 40), (3, 16, 72), (8, 64, 128), (40, 21, 48)])
def test_swiglu_epilogue_equals_gemv_then_swiglu(M, I, K, config):
    """``swiglu=True`` on the interleaved gate | up weight matches ``silu(x g^T) * (x u^T)`` in float64 and is
    bit-identical to the plain GEMV followed by the model's SwiGLU kernel (interleaved columns); every output column
    is written (NaN-poisoned ``out``), the odd widths included."""
    from lumotree.optimized.model.kernels import silu_mul

    x, w = _inputs(M, 2 * I, K, seed=M + I)
    if config is not None and not config.use_dot and M > G.MAX_SUM_ROWS:
        with pytest.raises(ValueError, match="the broadcast \\+ sum form"):
            G.small_batch_linear(x, w, config=config, swiglu=True)
        return
    gate, up = w[:I].contiguous(), w[I:].contiguous()  # [I, K] each
    w_gu = G.interleave_gate_up(gate, up)  # [2I, K]
    assert torch.equal(w_gu[0::2], gate) and torch.equal(w_gu[1::2], up)
    g, u = x.double() @ gate.double().T, x.double() @ up.double().T  # [M, I]
    reference = g * torch.sigmoid(g) * u  # [M, I]
    out = torch.full((M, I), float("nan"), device=DEVICE)  # [M, I]
    fused = G.small_batch_linear(x, w_gu, config=config, swiglu=True, out=out)
    assert fused.data_ptr() == out.data_ptr() and bool(torch.isfinite(fused).all())
    assert _rel_err(fused, reference) < RTOL
    assert torch.equal(fused, silu_mul(G.small_batch_linear(x, w_gu, config=config)))
    with pytest.raises(ValueError, match="w has 5 rows: with swiglu"):
        G.small_batch_linear(x, w_gu[:5].contiguous(), swiglu=True)
    with pytest.raises(ValueError, match=r"out has shape .*M, N / 2 \(swiglu\)"):
        G.small_batch_linear(x, w_gu, swiglu=True, out=torch.empty(M, 2 * I, device=DEVICE))


@settings(max_examples=10, deadline=None)
@given(M=st.integers(1, 64), N=st.integers(1, 80), K=st.integers(1, 130), block_n=st.sampled_from([1, 4, 16, 32]),
       block_k=st.sampled_from([16, 32, 64]), split_k=st.integers(1, 5), use_dot=st.booleans(),
       seed=st.integers(0, 2**16))
def test_random_shapes_and_configs(M, N, K, block_n, block_k, split_k, use_dot, seed):
    if M > G.MAX_SUM_ROWS:  # only the tl.dot form takes more than 8 rows
        use_dot, block_n = True, max(block_n, 16)
    use_dot = use_dot and block_n >= 16
    x, w = _inputs(M, N, K, seed)
    config = G.GemvConfig(block_n, block_k, split_k, 4, 2, use_dot)
    y = G.small_batch_linear(x, w, config=config)
    assert _rel_err(y, _ref(x, w)) < RTOL
    assert torch.equal(y, G.small_batch_linear(x, w, config=config))
    assert _counters_zero()


def test_default_config_rule():
    """The measured H200 rule (gemv_config's docstring), by output width, with splits cut to whole K tiles."""
    assert G.gemv_config(1, 2048, 4096, "cpu") == G.GemvConfig(4, 1024, 1, 4, 1, False)
    assert G.gemv_config(1, 2048, 5632, "cpu") == G.GemvConfig(4, 512, 4, 4, 1, False)
    assert G.gemv_config(1, 12352, 2048, "cpu") == G.GemvConfig(32, 256, 1, 8, 1, False)
    assert G.gemv_config(1, 151936, 2048, "cpu") == G.GemvConfig(8, 512, 1, 4, 1, False)
    assert G.gemv_config(8, 2048, 5632, "cpu") == G.GemvConfig(64, 128, 8, 4, 4, True)
    assert G.gemv_config(2, 9216, 2048, "cpu") == G.GemvConfig(32, 128, 1, 4, 4, True)
    assert G.gemv_config(2, 17, 40, "cpu").block_k == 64  # shrinks to the problem
    assert G.gemv_config(64, 151936, 2048, "cpu") == G.GemvConfig(64, 64, 1, 4, 5, True)
    assert G.gemv_config(16, 151936, 2048, "cpu") == G.GemvConfig(128, 128, 1, 4, 3, True)
    assert G.gemv_config(64, 2048, 4096, "cpu") == G.GemvConfig(64, 128, 4, 4, 4, True)
    assert G.gemv_config(64, 12352, 2048, "cpu") == G.GemvConfig(64, 64, 1, 4, 5, True)
    assert [G.preferred(M, 12352) for M in (1, 8, 9, 64, 65)] == [True, True, True, True, False]
    assert [G.preferred(M, 151936) for M in (1, 16, 64, 65)] == [True, True, True, False]
    assert G.gemv_config(1, 16, 5 * 1024, "cpu").split_k == 4  # split in 4: 10 tiles of 512
    assert G.gemv_config(1, 16, 4 * 1024 + 512, "cpu") == G.GemvConfig(4, 512, 3, 4, 1, False)  # 9 tiles: 3 x 3


# ---------------------------------------------------------------------------------------------------- bad inputs
def _bad_input_cases():
    x, w = _inputs(2, 8, 16, seed=1)
    return [
        (dict(x=x.numpy() if DEVICE == "cpu" else [1.0], w=w), TypeError, "x must be a torch.Tensor"),
        (dict(x=x[0], w=w), ValueError, r"x has shape \(16,\), expected \[M, K\]"),
        (dict(x=torch.zeros(65, 16, device=DEVICE), w=w), ValueError, "x has 65 rows"),
        (dict(x=torch.zeros(9, 16, device=DEVICE), w=w, config=G.GemvConfig(16, 16, 1, 4, 1)), ValueError,
         "broadcast \\+ sum form"),
        (dict(x=torch.zeros(0, 16, device=DEVICE), w=w), ValueError, "x has 0 rows"),
        (dict(x=torch.zeros(16, 2, device=DEVICE).T, w=w), ValueError, "x must have a contiguous last dimension"),
        (dict(x=x.to(torch.int32), w=w), TypeError, "x has dtype torch.int32"),
        (dict(x=torch.zeros(2, 0, device=DEVICE), w=torch.zeros(8, 0, device=DEVICE)), ValueError, "K = 0"),
        (dict(x=x, w=w[None]), ValueError, r"w has shape \(1, 8, 16\), expected \[N, K\]"),
        (dict(x=x, w=w[:, :8]), ValueError, r"w has shape \(8, 8\), expected \[N, K\] = \(None, 16\)"),
        (dict(x=x, w=torch.zeros(16, 16, device=DEVICE)[::2]), ValueError, "w must be contiguous"),
        (dict(x=x, w=w.half()), TypeError, "w has dtype torch.float16"),
        (dict(x=x, w=torch.zeros(0, 16, device=DEVICE)), ValueError, "N = 0"),
        (dict(x=x, w=torch.zeros(8, 16, device="meta")), ValueError, "w is on meta"),
        (dict(x=x, w=w, out_dtype=torch.int32), TypeError, "out_dtype must be one of"),
        (dict(x=x, w=w, out_dtype="bfloat16"), TypeError, "out_dtype must be one of"),
        (dict(x=x, w=w, config=(16, 16, 1, 4, 1)), TypeError, "config must be a GemvConfig"),
        (dict(x=x, w=w, config=G.GemvConfig(12, 16, 1, 4, 1)), ValueError, "config.block_n = 12"),
        (dict(x=x, w=w, config=G.GemvConfig(16, 0, 1, 4, 1)), ValueError, "config.block_k = 0"),
        (dict(x=x, w=w, config=G.GemvConfig(16, 16, 0, 4, 1)), ValueError, "config.split_k = 0"),
        (dict(x=x, w=w, config=G.GemvConfig(16, 16, 1.5, 4, 1)), ValueError, "config.split_k = 1.5"),
        (dict(x=x, w=w, config=G.GemvConfig(16, 16, 1, 64, 1)), ValueError, "config.num_warps = 64"),
        (dict(x=x, w=w, config=G.GemvConfig(16, 16, 1, 4, 0)), ValueError, "config.num_stages = 0"),
        (dict(x=x, w=w, config=G.GemvConfig(8, 16, 1, 4, 1, True)), ValueError, "use_dot needs block_n"),
        (dict(x=x, w=w, config=G.GemvConfig(16, 16, 1, 4, 1, False, True)), ValueError, "config.tma needs"),
        (dict(x=x, w=w, config=G.GemvConfig(512, 16, 1, 4, 1, True, True)), ValueError, "at most 256"),
    ]


@pytest.mark.parametrize("case", range(len(_bad_input_cases())))
def test_bad_inputs_raise_naming_the_argument(case):
    kwargs, error, message = _bad_input_cases()[case]
    with pytest.raises(error, match=message):
        G.small_batch_linear(**kwargs)


# ----------------------------------------------------------------------------------------------------------- GPU
BENCH_SHAPES = [(12352, 2048), (2048, 4096), (9216, 2048), (11264, 2048), (2048, 5632), (151936, 2048)]


@pytest.mark.gpu
@pytest.mark.parametrize("M", [1, 2, 4, 8, 16, 64])
@pytest.mark.parametrize("N,K", BENCH_SHAPES)
def test_gpu_bench_shapes_bf16_match_torch(N, K, M):
    x, w = _inputs(M, N, K, seed=N + K + M, dtype=torch.bfloat16)
    lm_head = N > 100_000
    y = G.small_batch_linear(x, w, out_dtype=torch.float32 if lm_head else None)
    assert y.dtype == (torch.float32 if lm_head else torch.bfloat16)
    ref = x.float() @ w.float().T  # [M, N]
    assert _rel_err(y.float(), ref.double()) < 2e-2
    assert torch.equal(y, G.small_batch_linear(x, w, out_dtype=y.dtype))
    torch.cuda.synchronize()
    assert _counters_zero()


@pytest.mark.gpu
@pytest.mark.parametrize("M", [1, 2, 8, 16, 64])
def test_gpu_swiglu_epilogue_bf16_bit_identical_to_swiglu_kernel(M):
    """The bench model's gate | up projection (``[2 x 5632, 2048]``, rows interleaved) with SwiGLU in the GEMV's
    epilogue equals GEMV + SwiGLU kernel bit for bit in bf16 (the same fp32 math on the rounded pairs), with and
    without PDL, at the decode and tree-step row counts."""
    from lumotree.optimized.model.kernels import silu_mul

    x, w = _inputs(M, 2 * 5632, 2048, seed=M, dtype=torch.bfloat16)
    two_kernels = silu_mul(G.small_batch_linear(x, w))  # [M, 5632]
    for pdl in (False, True):
        assert torch.equal(G.small_batch_linear(x, w, swiglu=True, pdl=pdl), two_kernels)


@pytest.mark.gpu
@pytest.mark.parametrize("config", [None, G.GemvConfig(16, 256, 8, 4, 1), G.GemvConfig(32, 256, 8, 4, 3, True)],
                         ids=["default", "sum-split8", "dot-split8"])
def test_gpu_cuda_graph_replay_matches_eager(config):
    x, w = _inputs(2, 2048, 4096, seed=9, dtype=torch.bfloat16)
    eager = G.small_batch_linear(x, w, config=config)  # compiles and caches the scratch
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = G.small_batch_linear(x, w, config=config)
    for _ in range(3):
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(y, eager)
    assert _counters_zero()


def _assert_pdl_and_replay_equal(chain) -> torch.Tensor:
    """``chain(pdl)`` with PDL, eagerly and replayed three times from a CUDA graph, equals ``chain(False)`` bit for
    bit (every split-K counter back at zero); returns ``chain(False)``."""
    plain = chain(False)
    assert torch.equal(chain(True), plain)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = chain(True)
    for _ in range(3):
        captured.zero_()
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(captured, plain)
    assert _counters_zero()
    return plain


@pytest.mark.gpu
@pytest.mark.parametrize("M", [1, 4])
def test_gpu_pdl_chain_sees_every_previous_write(M):
    """A chain of GEMVs launched with PDL, each reading what the kernel before it wrote (the previous GEMV directly,
    or through the model's add + RMSNorm kernel, which lets its successor launch early): bit-identical to the same
    chain without PDL, eagerly and in a CUDA-graph replay. A wait placed too late would read stale inputs."""
    from lumotree.optimized.model.kernels import add_rmsnorm
    from lumotree.optimized.ops.pdl import pdl_supported

    if not pdl_supported(DEVICE):
        pytest.skip("programmatic dependent launch needs compute capability >= 9.0")
    K = 2048
    gen = torch.Generator(device=DEVICE).manual_seed(21)
    ws = [(torch.randn(K, K, generator=gen, device=DEVICE) / K**0.5).to(torch.bfloat16) for _ in range(6)]
    norm_w = torch.ones(K, device=DEVICE)
    x0 = torch.randn(M, K, generator=gen, device=DEVICE).to(torch.bfloat16)

    def chain(pdl: bool) -> torch.Tensor:
        h = x0.clone()
        y = x0
        for i, w in enumerate(ws):
            y = G.small_batch_linear(y, w, pdl=pdl)  # [M, K]
            if i % 2:
                y = add_rmsnorm(h, y, norm_w, 1e-6)  # h += y in place, then the norm
        return torch.cat([y, h])

    _assert_pdl_and_replay_equal(chain)


# ------------------------------------------------------------------------- residual add + RMSNorm in the GEMV
FUSED_CONFIGS = [G.GemvConfig(4, 16, 3, 4, 1), G.GemvConfig(16, 16, 2, 4, 2, True), G.GemvConfig(8, 32, 1, 4, 1),
                 None]
FUSED_IDS = ["sum-split3", "dot-split2", "sum-unsplit", "default"]


def _rmsnorm64(h: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    hd = h.double()
    return hd * torch.rsqrt((hd * hd).mean(-1, keepdim=True) + eps) * weight.double()  # [M, K]


@pytest.mark.parametrize("config", FUSED_CONFIGS, ids=FUSED_IDS)
@pytest.mark.parametrize("M,N,K", [(1, 40, 24), (3, 33, 48), (8, 64, 72)])
def test_residual_linear_adds_in_place_and_returns_row_squares(M, N, K, config):
    """``residual_linear`` leaves ``h + GEMV(x)`` in ``h`` bit for bit (the same fp32 product, one add), returns
    pieces that sum to each new row's sum of squares and, with a scale, the new rows times it."""
    x, w = _inputs(M, N, K, seed=M * 7 + N)
    gen = torch.Generator(device=DEVICE).manual_seed(N)
    h = torch.randn(M, N, generator=gen, device=DEVICE)  # [M, N]
    scale = torch.rand(N, generator=gen, device=DEVICE) + 0.5  # [N]
    for with_scale in (False, True):
        updated = h.clone()
        rows = G.residual_linear(x, w, updated, config=config, scale=scale if with_scale else None)
        assert torch.equal(updated, h + G.small_batch_linear(x, w, config=config))
        assert rows.parts.dtype == torch.float32 and rows.parts.shape[0] == M
        np.testing.assert_allclose(rows.parts.double().sum(-1).cpu(), (updated.double() ** 2).sum(-1).cpu(),
                                   rtol=1e-6)
        if with_scale:
            assert torch.equal(rows.scaled, updated * scale)
        else:
            assert rows.scaled is None
    assert _counters_zero()


@pytest.mark.parametrize("config", FUSED_CONFIGS, ids=FUSED_IDS)
@pytest.mark.parametrize("M,N,K", [(1, 17, 40), (3, 64, 33), (8, 24, 128)])
def test_norm_factor_after_residual_linear_is_rmsnorm_then_gemv(M, N, K, config):
    """``small_batch_linear(rows.scaled, w, norm=RowNorm(rows.parts, eps))`` after ``residual_linear(..., scale=g)``
    equals ``RMSNorm(h) @ w.T`` in float64 (to fp32 rounding) and the model's add + RMSNorm kernel followed by the
    plain GEMV (which rounds at other places)."""
    from lumotree.optimized.model.kernels import add_rmsnorm

    gen = torch.Generator(device=DEVICE).manual_seed(M + N + K)
    x = torch.randn(M, 20, generator=gen, device=DEVICE)  # [M, 20] the producer's input
    w_in = torch.randn(K, 20, generator=gen, device=DEVICE)  # [K, 20]
    h = torch.randn(M, K, generator=gen, device=DEVICE)  # [M, K]
    w = torch.randn(N, K, generator=gen, device=DEVICE)  # [N, K]
    weight = torch.rand(K, generator=gen, device=DEVICE) + 0.5  # [K] 1 + w
    h_kernel = h.clone()
    rows = G.residual_linear(x, w_in, h, config=config, scale=weight)
    y = G.small_batch_linear(rows.scaled, w, config=config, norm=G.RowNorm(rows.parts, 1e-6))
    assert _rel_err(y, _rmsnorm64(h, weight, 1e-6) @ w.double().T) < RTOL
    two_kernels = G.small_batch_linear(add_rmsnorm(h_kernel, G.small_batch_linear(x, w_in, config=config), weight,
                                                    1e-6), w, config=config)
    assert torch.equal(h_kernel, h)  # the same residual either way
    assert _rel_err(y, two_kernels.double()) < RTOL
    # the factor alone: row m of the product times rsqrt(sum(parts[m]) / K + eps)
    parts = torch.rand(M, 5, generator=gen, device=DEVICE)  # [M, 5]
    factor = torch.rsqrt(parts.double().sum(-1, keepdim=True) / K + 0.5)  # [M, 1]
    got = G.small_batch_linear(h, w, config=config, norm=G.RowNorm(parts, 0.5))
    assert _rel_err(got, _ref(h, w) * factor) < RTOL


SEGMENT_CONFIGS = [G.GemvConfig(16, 16, 3, 4, 2, True), G.GemvConfig(32, 32, 1, 4, 3, True),
                   G.GemvConfig(16, 16, 2, 4, 2, True, True)]


@pytest.mark.parametrize("config", SEGMENT_CONFIGS, ids=["dot-split3", "dot-unsplit", "tma-split2"])
@pytest.mark.parametrize("M,N,S,seg", [(1, 17, 4, 32), (5, 40, 3, 16), (12, 24, 2, 64)])
def test_segment_norm_scales_each_segments_product(M, N, S, seg, config):
    """``RowNorm`` with parts ``[M, S, R]``: ``y[m] = sum_s rsqrt(sum(parts[m, s]) / (K / S) + eps) x[m, seg s]
    w[:, seg s]^T`` against float64, directly and inside ``residual_linear`` (splits that start inside a segment
    among them); and the gated RMSNorm per head it stands for: ``x = w_norm o silu(z)`` with the parts from o's rows
    equals ``gated_rmsnorm(o, z, w_norm) @ w.T``."""
    from lumotree.optimized.ops.gdn_decode import gated_rmsnorm

    if seg % config.block_k:
        pytest.skip("tiles straddle segments")
    K = S * seg
    gen = torch.Generator(device=DEVICE).manual_seed(M * 31 + S)
    x, w = _inputs(M, N, K, seed=M + N)
    parts = torch.rand(M, S, 3, generator=gen, device=DEVICE)  # [M, S, R]
    factor = torch.rsqrt(parts.double().sum(-1) / seg + 0.25)  # [M, S]
    want = torch.einsum("msk,nsk,ms->mn", x.double().view(M, S, seg), w.double().view(N, S, seg), factor)
    got = G.small_batch_linear(x, w, config=config, norm=G.RowNorm(parts, 0.25))
    assert _rel_err(got, want) < RTOL
    h = torch.randn(M, N, generator=gen, device=DEVICE)  # [M, N]
    updated = h.clone()
    G.residual_linear(x, w, updated, config=config, norm=G.RowNorm(parts, 0.25))
    assert _rel_err(updated, h.double() + want) < RTOL
    o = torch.randn(M, S, seg, generator=gen, device=DEVICE)  # [M, heads, V]
    z = torch.randn(M, S, seg, generator=gen, device=DEVICE)  # [M, heads, V]
    w_norm = torch.rand(seg, generator=gen, device=DEVICE) + 0.5  # [V]
    gated = (w_norm * o * torch.nn.functional.silu(z)).reshape(M, K)  # [M, K]
    sq = (o * o).view(M, S, 2, seg // 2).sum(-1)  # [M, S, 2] the sums of squares in two pieces
    got = G.small_batch_linear(gated, w, config=config, norm=G.RowNorm(sq.contiguous(), 1e-6))
    want = gated_rmsnorm(o, z, w_norm, eps=1e-6).reshape(M, K).double() @ w.double().T  # [M, N]
    assert _rel_err(got, want) < RTOL
    assert _counters_zero()


def _norm_bad_cases():
    x, w = _inputs(2, 8, 16, seed=3)
    parts = torch.ones(2, 4, device=DEVICE)
    h = torch.zeros(2, 8, device=DEVICE)
    lin = G.small_batch_linear
    return [
        (lin, dict(x=x, w=w, norm=(parts, 1e-6)), TypeError, "norm must be a RowNorm"),
        (lin, dict(x=x, w=w, norm=G.RowNorm(parts[:1], 1e-6)), ValueError, r"norm.parts has shape \(1, 4\)"),
        (lin, dict(x=x, w=w, norm=G.RowNorm(parts.double(), 1e-6)), TypeError, "norm.parts has dtype"),
        (lin, dict(x=x, w=w, norm=G.RowNorm(torch.ones(2, G.MAX_NORM_PARTS + 1, device=DEVICE), 1e-6)),
         ValueError, "pieces per row"),
        (lin, dict(x=x, w=w, norm=G.RowNorm(parts, 0.0)), ValueError, "norm.eps = 0.0"),
        (lin, dict(x=x, w=w, norm=G.RowNorm(torch.ones(2, 3, 1, device=DEVICE), 1e-6)), ValueError,
         "S = 3 segments, which do not divide"),
        (lin, dict(x=x, w=w, norm=G.RowNorm(torch.ones(2, 2, 1, device=DEVICE), 1e-6),
                   config=G.GemvConfig(8, 16, 1, 4, 1)), ValueError, "needs the tl.dot form"),
        (lin, dict(x=x, w=w, norm=G.RowNorm(torch.ones(2, 2, 1, device=DEVICE), 1e-6),
                   config=G.GemvConfig(16, 16, 1, 4, 1, True)), ValueError, "K tiles inside one segment"),
        (G.residual_linear, dict(x=x, w=w, residual=h[:1]), ValueError, r"residual has shape \(1, 8\)"),
        (G.residual_linear, dict(x=x, w=w, residual=h.double()), TypeError, "residual has dtype"),
        (G.residual_linear, dict(x=x, w=w, residual=torch.zeros(8, 2, device=DEVICE).T), ValueError,
         "residual must be contiguous"),
        (G.residual_linear, dict(x=x, w=w, residual=x.view(-1)[:16].view(2, 8)), ValueError, "residual shares memory"),
        (G.residual_linear, dict(x=x, w=w, residual=h, scale=torch.ones(16, device=DEVICE)), ValueError,
         r"scale has shape \(16,\)"),
        (G.residual_linear, dict(x=x, w=w, residual=h, scale=torch.ones(8, device=DEVICE).half()), TypeError,
         "scale has dtype"),
    ]


@pytest.mark.parametrize("case", range(len(_norm_bad_cases())))
def test_fused_norm_bad_inputs_raise_naming_the_argument(case):
    fn, kwargs, error, message = _norm_bad_cases()[case]
    with pytest.raises(error, match=message):
        fn(**kwargs)


@pytest.mark.gpu
@pytest.mark.parametrize("M", [1, 2, 8, 16, 64])
def test_gpu_fused_norm_chain_bf16_matches_separate_kernels(M):
    """The decode step's pattern on the bench model's shapes in bf16: w_out (``[2048, 4096]``) adds into the residual,
    gate | up (``[11264, 2048]``, SwiGLU in its epilogue) normalises it (from the scaled rows and the row factor), down
    (``[2048, 5632]``) adds, the next ``w_in`` (``[12352, 2048]``) normalises. The first residual update equals the
    GEMV + add + RMSNorm kernel path bit for bit, the rest agrees to bf16 rounding (rounded at other places); with
    PDL, eagerly and replayed in a CUDA graph, everything is bit-identical to the fused chain without PDL.

    Returned: ``[h after the first add | h at the end | last projection]``."""
    from lumotree.optimized.model.kernels import add_rmsnorm, silu_mul

    gen = torch.Generator(device=DEVICE).manual_seed(M)

    def weight(n: int, k: int) -> torch.Tensor:
        return (torch.randn(n, k, generator=gen, device=DEVICE) / k**0.5).to(torch.bfloat16)

    w_out, w_gu, w_down, w_in = weight(2048, 4096), weight(11264, 2048), weight(2048, 5632), weight(12352, 2048)
    norm1, norm2 = (torch.rand(2048, generator=gen, device=DEVICE) + 0.5 for _ in range(2))
    h0 = torch.randn(M, 2048, generator=gen, device=DEVICE).to(torch.bfloat16)
    att = torch.randn(M, 4096, generator=gen, device=DEVICE).to(torch.bfloat16)

    def fused(pdl: bool) -> torch.Tensor:
        h = h0.clone()
        rows = G.residual_linear(att, w_out, h, scale=norm1, pdl=pdl)
        first = h.clone()
        act = G.small_batch_linear(rows.scaled, w_gu, pdl=pdl, norm=G.RowNorm(rows.parts, 1e-6), swiglu=True)
        rows = G.residual_linear(act, w_down, h, scale=norm2, pdl=pdl)
        out = G.small_batch_linear(rows.scaled, w_in, pdl=pdl, norm=G.RowNorm(rows.parts, 1e-6))
        return torch.cat([first, h, out], 1)

    def separate() -> torch.Tensor:
        h = h0.clone()
        x = add_rmsnorm(h, G.small_batch_linear(att, w_out), norm1, 1e-6)
        first = h.clone()
        x = add_rmsnorm(h, G.small_batch_linear(silu_mul(G.small_batch_linear(x, w_gu)), w_down), norm2, 1e-6)
        return torch.cat([first, h, G.small_batch_linear(x, w_in)], 1)

    plain = _assert_pdl_and_replay_equal(fused)
    expected = separate()
    assert torch.equal(plain[:, :2048], expected[:, :2048])
    assert _rel_err(plain[:, 2048:].float(), expected[:, 2048:].double()) < 1e-2


# ------------------------------------------------------------------------------------ conv step in the epilogue
@pytest.mark.parametrize("config", [G.GemvConfig(4, 16, 3, 4, 1), G.GemvConfig(16, 16, 1, 4, 2, True), None],
                         ids=["sum-split3", "dot", "default"])
@pytest.mark.parametrize("M,N,C,width,silu", [(1, 40, 24, 4, True), (3, 50, 50, 4, False), (5, 33, 17, 3, True)])
def test_conv_epilogue_equals_gemv_then_conv_step(M, N, C, width, silu, config):
    """``conv=ConvStep(...)``: the first C columns through one conv step, the state advanced in place at the slots
    (others untouched), bit-identical to the plain GEMV followed by ``gdn_decode.conv_step`` (split-K configs run
    unsplit); with ``norm`` too (the w_in projection of a fused decode step)."""
    from lumotree.optimized.ops.gdn_decode import conv_step

    K, P = 40, 7
    gen = torch.Generator(device=DEVICE).manual_seed(M * 100 + C)
    x, w = _inputs(M, N, K, seed=C)
    weight = torch.randn(C, width, generator=gen, device=DEVICE)  # [C, W]
    pool = torch.randn(P, width - 1, C, generator=gen, device=DEVICE)  # [P, W - 1, C]
    slots = torch.randperm(P, generator=torch.Generator().manual_seed(M))[:M].to(torch.int32).to(DEVICE)
    parts = torch.rand(M, 3, generator=gen, device=DEVICE) * K  # [M, 3]
    for norm in (None, G.RowNorm(parts, 1e-6)):
        expected_pool, got_pool = pool.clone(), pool.clone()
        unsplit = (config or G.gemv_config(M, N, K, DEVICE))._replace(split_k=1)  # what the conv launch runs
        plain = G.small_batch_linear(x, w, config=unsplit, norm=norm)
        expected = plain.clone()
        expected[:, :C] = conv_step(plain[:, :C], weight, expected_pool, slots, activation="silu" if silu else None)
        got = G.small_batch_linear(x, w, config=config, norm=norm, conv=G.ConvStep(weight, got_pool, slots, silu))
        assert torch.equal(got, expected)
        assert torch.equal(got_pool, expected_pool)
        untouched = [s for s in range(P) if s not in slots.tolist()]
        assert torch.equal(got_pool[untouched], pool[untouched])


def _conv_bad_cases():
    x, w = _inputs(2, 8, 16, seed=3)
    weight, pool = torch.ones(6, 4, device=DEVICE), torch.zeros(3, 3, 6, device=DEVICE)
    slots = torch.tensor([0, 2], dtype=torch.int32, device=DEVICE)
    conv = G.ConvStep
    return [
        (dict(conv=(weight, pool, slots)), TypeError, "conv must be a ConvStep"),
        (dict(conv=conv(torch.ones(9, 4, device=DEVICE), torch.zeros(3, 3, 9, device=DEVICE), slots)), ValueError,
         "C = 9 channels"),
        (dict(conv=conv(torch.ones(6, 1, device=DEVICE), torch.zeros(3, 0, 6, device=DEVICE), slots)), ValueError,
         "W = 1 tap"),
        (dict(conv=conv(weight, pool[:, :2], slots)), ValueError, r"conv.state_pool has shape \(3, 2, 6\)"),
        (dict(conv=conv(weight, pool.half(), slots)), TypeError, "conv.state_pool has dtype"),
        (dict(conv=conv(weight, pool, slots[:1])), ValueError, r"slots has shape \(1,\)"),
        (dict(conv=conv(weight, pool, torch.tensor([0, 3], dtype=torch.int32, device=DEVICE))), ValueError,
         r"slots\[1\] = 3 is outside the pool"),
        (dict(conv=conv(weight, pool, torch.tensor([1, 1], dtype=torch.int32, device=DEVICE))), ValueError,
         "repeats a slot"),
    ]


@pytest.mark.parametrize("case", range(len(_conv_bad_cases())))
def test_conv_epilogue_bad_inputs_raise_naming_the_argument(case):
    kwargs, error, message = _conv_bad_cases()[case]
    x, w = _inputs(2, 8, 16, seed=3)
    with pytest.raises(error, match=message):
        G.small_batch_linear(x, w, **kwargs)


# ------------------------------------------------------------------------------- tree conv in the epilogue
@settings(max_examples=8, deadline=None)
@given(rows=st.lists(trees(max_nodes=9), min_size=1, max_size=3), C=st.integers(1, 40), extra=st.integers(0, 20),
       width=st.sampled_from([2, 3, 4]), silu=st.booleans(), dot_tiles=st.sampled_from([(16, 16), (32, 16)]),
       tma=st.booleans(), seed=st.integers(0, 2**16))
def test_tree_conv_epilogue_equals_gemv_then_tree_conv(rows, C, extra, width, silu, dot_tiles, tma, seed):
    """``conv=TreeConv(...)`` on a tree step's rows (request b's nodes at rows b N .. b N + N - 1, trees of mixed
    sizes padded to N): ``y`` is the plain product and ``conv.out`` (NaN before the call) is bit-identical to
    :func:`conv_tree.tree_conv` of y's first C columns (padding nodes zeros), the state pool untouched; split-K
    configs run unsplit."""
    from lumotree.optimized.ops.conv_tree import tree_conv

    B, N, K, P = len(rows), max(len(r) for r in rows), 24, 5
    Nout = C + extra
    gen = torch.Generator(device=DEVICE).manual_seed(seed)
    x, w = _inputs(B * N, Nout, K, seed=seed)
    parents = torch.tensor([r + [0] * (N - len(r)) for r in rows], dtype=torch.int32, device=DEVICE)  # [B, N]
    num_nodes = torch.tensor([len(r) for r in rows], dtype=torch.int32, device=DEVICE)  # [B]
    weight = torch.randn(C, width, generator=gen, device=DEVICE)  # [C, W]
    pool = torch.randn(P, width - 1, C, generator=gen, device=DEVICE)  # [P, W - 1, C]
    slots = torch.tensor([(3 * b + 1) % P for b in range(B)], dtype=torch.int32, device=DEVICE)  # [B]
    out = torch.full((B, N, C), float("nan"), device=DEVICE)  # [B, N, C]
    config = G.GemvConfig(*dot_tiles, 3, 4, 2, True, tma)
    before = pool.clone()
    y = G.small_batch_linear(x, w, config=config, conv=G.TreeConv(weight, pool, slots, parents, num_nodes, out, silu))
    plain = G.small_batch_linear(x, w, config=config._replace(split_k=1))
    assert torch.equal(y, plain)
    expected = tree_conv(plain[:, :C].reshape(B, N, C), weight, pool, slots, parents, num_nodes=num_nodes,
                         activation="silu" if silu else None)
    assert torch.equal(out, expected)
    assert torch.equal(pool, before)
    assert _rel_err(y, _ref(x, w)) < RTOL


@pytest.mark.parametrize("rows", [[[-1]], [[-1, 0, 1, 2]], [[-1, 0, 0], [-1, 0, 0]], [[-1], [-1, 0]]],
                         ids=["single", "chain", "star-x2", "mixed"])
@pytest.mark.parametrize("config", [None, G.GemvConfig(8, 16, 2, 4, 1)], ids=["default", "sum-split2"])
def test_tree_conv_epilogue_at_few_rows(rows, config):
    """Tree steps of 1-6 rows (the broadcast + sum form and the default launch): the same values as GEMV +
    tree_conv, the committed conv state read for every node near the root."""
    from lumotree.optimized.ops.conv_tree import tree_conv

    B, N, C, K, P = len(rows), max(len(r) for r in rows), 12, 16, 3
    x, w = _inputs(B * N, C + 5, K, seed=B * N)
    gen = torch.Generator(device=DEVICE).manual_seed(7)
    parents = torch.tensor([r + [0] * (N - len(r)) for r in rows], dtype=torch.int32, device=DEVICE)  # [B, N]
    num_nodes = torch.tensor([len(r) for r in rows], dtype=torch.int32, device=DEVICE)  # [B]
    weight = torch.randn(C, 4, generator=gen, device=DEVICE)  # [C, W]
    pool = torch.randn(P, 3, C, generator=gen, device=DEVICE)  # [P, W - 1, C]
    slots = torch.tensor([2, 0][:B], dtype=torch.int32, device=DEVICE)  # [B]
    out = torch.full((B, N, C), float("nan"), device=DEVICE)  # [B, N, C]
    y = G.small_batch_linear(x, w, config=config, conv=G.TreeConv(weight, pool, slots, parents, num_nodes, out))
    expected = tree_conv(y[:, :C].reshape(B, N, C), weight, pool, slots, parents, num_nodes=num_nodes)
    assert torch.equal(out, expected)
    assert _rel_err(y, _ref(x, w)) < RTOL


def _tree_conv_bad_cases():
    weight, pool = torch.ones(6, 4, device=DEVICE), torch.zeros(3, 3, 6, device=DEVICE)
    slots = torch.tensor([0, 2], dtype=torch.int32, device=DEVICE)
    parents = torch.tensor([[-1, 0, 1, 1], [-1, 0, 0, 2]], dtype=torch.int32, device=DEVICE)  # B = 2, N = 4
    nodes = torch.tensor([4, 3], dtype=torch.int32, device=DEVICE)
    out = torch.zeros(2, 4, 6, device=DEVICE)
    tc = G.TreeConv
    return [
        (dict(conv=tc(weight, pool, slots, parents[:, :3].contiguous(), nodes, out[:, :3])), ValueError,
         "B \\* nodes = 6"),
        (dict(conv=tc(weight, pool, slots, parents[:, ::2], nodes, out[:, ::2])), ValueError,
         "conv.parents must be contiguous"),
        (dict(conv=tc(weight, pool, slots, parents.long(), nodes, out)), TypeError, "conv.parents has dtype"),
        (dict(conv=tc(weight, pool, slots, parents, nodes.long(), out)), TypeError, "conv.num_nodes has dtype"),
        (dict(conv=tc(weight, pool, slots, parents, nodes, out[..., :5])), ValueError, "conv.out has shape"),
        (dict(conv=tc(weight, pool, slots, parents, nodes, out.double())), TypeError, "conv.out has dtype"),
        (dict(conv=tc(weight, pool, slots, torch.tensor([[-1, 0, 2, 1], [-1, 0, 0, 2]], dtype=torch.int32,
                                                            device=DEVICE), nodes, out)), ValueError, r"parents\[0\]"),
        (dict(conv=tc(weight, pool, slots, parents, torch.tensor([4, 5], dtype=torch.int32, device=DEVICE), out)),
         ValueError, r"num_nodes\[1\] = 5"),
        (dict(conv=tc(weight, pool, torch.tensor([0, 3], dtype=torch.int32, device=DEVICE), parents, nodes, out)),
         ValueError, r"slots\[1\] = 3 is outside the pool"),
        (dict(conv=tc(torch.ones(9, 4, device=DEVICE), torch.zeros(3, 3, 9, device=DEVICE), slots, parents, nodes,
                      torch.zeros(2, 4, 9, device=DEVICE))), ValueError, "C = 9 channels"),
    ]


@pytest.mark.parametrize("case", range(len(_tree_conv_bad_cases())))
def test_tree_conv_epilogue_bad_inputs_raise_naming_the_argument(case):
    kwargs, error, message = _tree_conv_bad_cases()[case]
    x, w = _inputs(8, 8, 16, seed=3)
    with pytest.raises(error, match=message):
        G.small_batch_linear(x, w, **kwargs)


@pytest.mark.gpu
@pytest.mark.parametrize("B,N", [(1, 64), (2, 32), (4, 16), (3, 5)])
def test_gpu_tree_conv_epilogue_bf16_bit_identical_to_separate_kernels(B, N):
    """The bench model's ``w_in`` projection (``[12352, 2048]``, conv over its first 8192 columns) on tree steps of
    B requests x N nodes in bf16, with the default launch (and PDL): ``y`` and the conv bit-identical to the GEMV
    followed by :func:`conv_tree.tree_conv`."""
    from lumotree.optimized.ops.conv_tree import tree_conv

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    rng = np.random.default_rng(B * 100 + N)
    C, P = 8192, 8
    x, w = _inputs(B * N, 12352, 2048, seed=N, dtype=torch.bfloat16)
    kinds = ["random", "chain", "star", "deep_wide"]
    rows = [build_tree_parents(kinds[b % 4], N - b % 2, rng) for b in range(B)]
    parents = torch.tensor([r + [0] * (N - len(r)) for r in rows], dtype=torch.int32, device="cuda")  # [B, N]
    num_nodes = torch.tensor([len(r) for r in rows], dtype=torch.int32, device="cuda")  # [B]
    weight = torch.randn(C, 4, device="cuda").to(torch.bfloat16)  # [C, W]
    pool = torch.randn(P, 3, C, device="cuda")  # [P, W - 1, C] fp32, as the model's
    slots = torch.tensor(list(range(P - 1, P - 1 - B, -1)), dtype=torch.int32, device="cuda")  # [B]
    out = torch.full((B, N, C), float("nan"), device="cuda").to(torch.bfloat16)  # [B, N, C]
    y = G.small_batch_linear(x, w, pdl=True, conv=G.TreeConv(weight, pool, slots, parents, num_nodes, out))
    plain = G.small_batch_linear(x, w, config=G.gemv_config(B * N, 12352, 2048, "cuda")._replace(split_k=1))
    assert torch.equal(y, plain)
    assert torch.equal(out, tree_conv(plain[:, :C].reshape(B, N, C), weight, pool, slots, parents,
                                      num_nodes=num_nodes))
