"""Block-FP8 weights (lumotree.reference.fp8, lumotree.optimized.ops.gemv.fp8) against the dequantised model.

CPU (Triton interpreter): the kernels (the GEMV's broadcast and ``tl.dot`` forms with split K, SwiGLU, the residual
add + norm, the tiled many-row kernel) against a float64 product with the exactly dequantised weight, into
NaN-poisoned outputs; fused weights (concatenated, permuted, interleaved rows) keep each row's scales; tiny FP8
checkpoints of every layout written in the release format load as float8 on the device (never upcast) and dequantise
to the reference's weights; ``lumotree generate --model DIR`` decodes the same greedy tokens on both backends in every
spec mode; malformed FP8 configs and tensors end in one line naming the key or tensor.
GPU (``pytest -m gpu``): the model's bf16 decode shapes against torch on the dequantised weight.
"""

from __future__ import annotations

import functools
import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("safetensors")

from lumotree.cli import main  # noqa: E402
from lumotree.optimized.model import load_checkpoint  # noqa: E402
from lumotree.optimized.ops import gemv as G  # noqa: E402
from lumotree.reference import model as rm  # noqa: E402
from lumotree.reference.checkpoint import write_checkpoint  # noqa: E402
from lumotree.reference.config import HybridConfig  # noqa: E402
from lumotree.reference.fp8 import dequantize_blocks, quantize_blocks, quantize_tensors  # noqa: E402
from lumotree.reference.layouts import CheckpointLayout  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
RTOL = 1e-5  # float32 kernels against float64, norm-wise


@functools.lru_cache(maxsize=8)  # the GPU tests reuse each shape's weight
def _weight(N: int, K: int, seed: int, lead: tuple[int, ...] = ()) -> G.Fp8Weight:
    w = np.random.default_rng(seed).standard_normal((*lead, N, K)) * np.linspace(0.01, 3, K)  # varied blocks
    q, s = quantize_blocks(w)
    return G.Fp8Weight.from_blocks(q.to(DEVICE), s.to(DEVICE))


def _x(M: int, K: int, seed: int, dtype=torch.float32) -> torch.Tensor:
    return torch.randn(M, K, generator=torch.Generator().manual_seed(seed)).to(DEVICE, dtype)  # [M, K]


def _rel(y: torch.Tensor, ref: torch.Tensor) -> float:
    return float((y.double() - ref).norm() / ref.norm().clamp_min(1e-30))


def _poisoned(M: int, N: int) -> torch.Tensor:
    return torch.full((M, N), float("nan"), device=DEVICE)  # [M, N]


# ------------------------------------------------------------------------------------------------------- kernels
def test_dequantisation_is_exact_and_matches_the_torch_form():
    w = np.random.default_rng(0).standard_normal((2, 200, 300))
    q, s = quantize_blocks(w, name="x.experts.gate_up_proj")
    assert q.dtype == torch.float8_e4m3fn and s.shape == (2, 2, 3) and s.dtype == torch.float32
    exact = dequantize_blocks(q.double().numpy(), s.numpy())  # float64: e4m3 x float32 is exact
    assert np.abs(exact - w).max() <= np.abs(w).max() / 16  # e4m3's 4 significant bits
    fp8 = G.Fp8Weight.from_blocks(q, s)
    assert torch.equal(fp8.dequantize(torch.float64), torch.from_numpy(exact))
    assert torch.equal(fp8.expert(1).dequantize(torch.float64), torch.from_numpy(exact[1]))


@pytest.mark.parametrize("M, N, K", [(1, 40, 300), (3, 130, 256), (8, 64, 129), (16, 70, 384), (70, 150, 260)])
def test_fp8_linear_matches_the_dequantised_product(M, N, K):
    w, x = _weight(N, K, M), _x(M, K, M)
    ref = x.double() @ w.dequantize(torch.float64).T
    assert _rel(G.fp8_linear(x, w), ref) < RTOL
    if M <= G.MAX_ROWS:
        for cfg in (G.GemvConfig(4, 512, 2, 4, 1), G.GemvConfig(8, 64, 3, 4, 1), G.GemvConfig(16, 128, 1, 4, 2, True),
                    G.GemvConfig(32, 256, 2, 4, 2, True)):
            if cfg.use_dot or M <= G.MAX_SUM_ROWS:
                y = G.small_batch_linear(x, w, config=cfg, out=_poisoned(M, N))
                assert _rel(y, ref) < RTOL, cfg


def test_fused_weights_keep_each_rows_scales():
    K = 260
    parts = [_weight(N, K, seed) for seed, N in enumerate((130, 64, 100))]
    cat = G.fp8_cat(parts)
    perm = torch.randperm(cat.shape[0], generator=torch.Generator().manual_seed(1)).to(DEVICE)
    moved = cat.take_rows(perm)
    dense = torch.cat([p.dequantize(torch.float64) for p in parts])
    assert torch.equal(moved.dequantize(torch.float64), dense[perm])
    x = _x(2, K, 3)
    assert _rel(G.small_batch_linear(x, moved, out=_poisoned(2, cat.shape[0])), x.double() @ dense[perm].T) < RTOL
    gate, up = parts[2], _weight(100, K, 9)
    act = G.small_batch_linear(x, G.interleave_gate_up(gate, up), swiglu=True, out=_poisoned(2, 100))
    g, u = (x.double() @ p.dequantize(torch.float64).T for p in (gate, up))
    assert _rel(act, torch.nn.functional.silu(g) * u) < RTOL


def test_residual_add_and_norm_with_fp8_weights():
    M, K, N = 2, 256, 192
    w1, w2, x = _weight(N, K, 1), _weight(64, N, 2), _x(M, K, 3)
    h = _x(M, N, 4)
    scale = torch.rand(N, device=DEVICE) + 0.5
    h_new = h.double() + x.double() @ w1.dequantize(torch.float64).T
    rows = G.residual_linear(x, w1, h, scale=scale)
    assert _rel(h, h_new) < RTOL
    normed = h_new / (h_new.pow(2).mean(-1, keepdim=True) + 1e-6).sqrt() * scale.double()
    y = G.small_batch_linear(rows.scaled, w2, norm=G.RowNorm(rows.parts, 1e-6), out=_poisoned(M, 64))
    assert _rel(y, normed @ w2.dequantize(torch.float64).T) < RTOL


def test_fp8_weight_errors_name_the_argument():
    w, x = _weight(64, 256, 0), _x(2, 256, 0)
    with pytest.raises(ValueError, match="w has shape"):
        G.fp8_linear(_x(2, 128, 0), w)
    with pytest.raises(TypeError, match="w must be an Fp8Weight"):
        G.fp8_linear(x, w.dequantize())
    with pytest.raises(ValueError, match="w.scale"):
        G.small_batch_linear(x, w._replace(scale=w.scale[:, :1].contiguous()))
    with pytest.raises(ValueError, match="scale_rows must index"):
        w._replace(scale_rows=w.scale_rows + 5).checked()
    with pytest.raises(ValueError, match="config.tma"):
        G.small_batch_linear(x, w, config=G.GemvConfig(16, 64, 1, 4, 1, True, True))


# ------------------------------------------------------------------------------------------------------- checkpoints
SIZES = dict(vocab_size=48, hidden_size=32, num_hidden_layers=2, layer_types=("linear_attention", "full_attention"),
             num_attention_heads=4, num_key_value_heads=2, head_dim=16, linear_key_head_dim=16,
             linear_value_head_dim=16, linear_num_key_heads=2, linear_num_value_heads=4, mtp_num_hidden_layers=1)
MOE = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16, shared_expert_intermediate_size=24)
LAYOUTS = {
    "qwen3_next": (HybridConfig(**SIZES, **MOE), CheckpointLayout("qwen3_next")),
    "qwen3_5_text": (HybridConfig(**SIZES, model_type="qwen3_5_text", num_experts=0, intermediate_size=40),
                     CheckpointLayout("qwen3_5_text")),
    "qwen3_5_moe-fused": (HybridConfig(**SIZES, **MOE, model_type="qwen3_5_moe_text"),
                          CheckpointLayout("qwen3_5_moe_text", fused_experts=True)),
}


def write_fp8(path, name, edit=None, keep_float=()):
    """A random model of ``LAYOUTS[name]`` written as a block-FP8 checkpoint (the release format: float8 weights and
    float32 ``weight_scale_inv``; the tensors named in ``keep_float`` stay float32); ``edit`` changes the stored
    tensors or the config dict (``edit(stored, raw)``) before they are written."""
    config, layout = LAYOUTS[name]
    model = rm.build_random(config, seed=7)
    stored = layout.from_canonical(rm.weights_to_tensors(model.weights, config), config)
    kept = {n: stored.pop(n) for n in keep_float}
    stored = {**quantize_tensors(stored), **kept}
    raw = config.replace(fp8_block_size=(128, 128)).to_dict()
    if edit is not None:
        edit(stored, raw)
    write_checkpoint(path, raw, stored, dtype="float32", max_shard_bytes=20000)
    return stored


@pytest.mark.parametrize("name", sorted(LAYOUTS))
def test_fp8_checkpoints_load_as_float8_and_dequantise_to_the_reference(tmp_path, name):
    stored = write_fp8(tmp_path, name)
    ref = rm.load_pretrained(tmp_path)
    assert ref.config.fp8_block_size == (128, 128)
    config, weights, report = load_checkpoint(tmp_path, DEVICE, torch.float32)
    assert report.bytes == sum(t.numel() * (1 if t.dtype == torch.float8_e4m3fn else 4) for t in stored.values()
                               if hasattr(t, "dtype") and t.dtype in (torch.float8_e4m3fn, torch.float32)) + sum(
        np.asarray(t).size * 4 for t in stored.values() if not hasattr(t, "dtype") or t.dtype == np.float64)
    fp8 = [weights.layers[0].w_in, weights.layers[0].w_out, weights.layers[1].w_qkv, weights.layers[1].w_o,
           weights.mlps[0].w_gate_up, weights.mlps[0].w_down, weights.mtp.fc]
    assert all(isinstance(w, G.Fp8Weight) and w.weight.dtype == torch.float8_e4m3fn for w in fp8)
    assert weights.embed.dtype == torch.float32 and not isinstance(weights.lm_head, G.Fp8Weight)
    # the optimized layouts, dequantised, are the reference's weights in the kernels' order
    from lumotree.optimized.model.weights import load_weights
    canonical = rm.weights_to_tensors(ref.weights, ref.config)
    plain = load_weights(ref.config, {k: torch.from_numpy(np.asarray(v)) for k, v in canonical.items()}, DEVICE,
                         torch.float64)
    for got, want in [(weights.layers[0].w_in, plain.layers[0].w_in), (weights.layers[1].w_qkv, plain.layers[1].w_qkv),
                      (weights.mlps[0].w_gate_up, plain.mlps[0].w_gate_up), (weights.mlps[0].w_down,
                                                                             plain.mlps[0].w_down)]:
        assert torch.equal(got.dequantize(torch.float64), want)


def test_float_parts_after_fp8_ones_stay_a_float_tail_and_others_dequantise(tmp_path):
    """A release keeps ``in_proj_b`` / ``in_proj_a`` float next to FP8 ``in_proj_qkv`` / ``in_proj_z``: ``w_in`` is
    FP8 with a float tail; a float part before FP8 ones (``q_proj`` float, ``k_proj`` FP8) dequantises the fused
    weight."""
    kept = ["model.layers.0.linear_attn.in_proj_b.weight", "model.layers.0.linear_attn.in_proj_a.weight",
            "model.layers.1.self_attn.q_proj.weight"]
    write_fp8(tmp_path, "qwen3_5_text", keep_float=kept)
    ref = rm.load_pretrained(tmp_path)
    _, weights, _ = load_checkpoint(tmp_path, DEVICE, torch.float32)
    w_in = weights.layers[0].w_in
    assert isinstance(w_in, G.Fp8Weight) and w_in.tail.dtype == torch.float32 and w_in.tail.shape == (8, 32)
    assert weights.layers[1].w_qkv.dtype == torch.float32 and isinstance(weights.layers[1].w_o, G.Fp8Weight)
    from lumotree.optimized.model.weights import load_weights
    canonical = rm.weights_to_tensors(ref.weights, ref.config)
    plain = load_weights(ref.config, {k: torch.from_numpy(np.asarray(v)) for k, v in canonical.items()}, DEVICE,
                         torch.float64)
    assert torch.equal(w_in.dequantize(torch.float64), plain.layers[0].w_in)


@pytest.mark.parametrize("name, kept", [("qwen3_5_moe-fused", "model.layers.0.mlp.experts.down_proj"),
                                        ("qwen3_next", "model.layers.1.mlp.experts.2.up_proj.weight")])
def test_an_moe_block_of_fp8_and_float_experts_dequantises(tmp_path, name, kept):
    write_fp8(tmp_path, name, keep_float=[kept])
    ref = rm.load_pretrained(tmp_path)
    _, weights, _ = load_checkpoint(tmp_path, DEVICE, torch.float32)
    layer = int(kept.split(".")[2])
    mixed, other = weights.mlps[layer], weights.mlps[1 - layer]
    assert mixed.w_gate_up.dtype == mixed.w_down.dtype == torch.float32 and isinstance(other.w_down, G.Fp8Weight)
    experts = rm.weights_to_tensors(ref.weights, ref.config)  # the exact dequantised weights, float64
    down = np.stack([experts[f"model.layers.{layer}.mlp.experts.{e}.down_proj.weight"] for e in range(4)])
    assert np.array_equal(mixed.w_down.cpu().numpy(), down.astype(np.float32))  # fp8 x fp32 rounds once


def test_a_shared_expert_of_an_fp8_gate_and_a_float_up_dequantises(tmp_path):
    """The shared expert's gate | up of two kinds becomes float (the routed kernels take no float tail); its down
    projection and the experts stay FP8."""
    write_fp8(tmp_path, "qwen3_next", keep_float=["model.layers.1.mlp.shared_expert.up_proj.weight"])
    _, weights, _ = load_checkpoint(tmp_path, DEVICE, torch.float32)
    mixed, other = weights.mlps[1], weights.mlps[0]
    assert mixed.shared_gate_up.dtype == torch.float32 and isinstance(mixed.shared_down, G.Fp8Weight)
    assert isinstance(mixed.w_gate_up, G.Fp8Weight) and isinstance(other.shared_gate_up, G.Fp8Weight)


def test_a_float_tail_runs_as_a_second_launch_with_the_norm_and_the_conv():
    M, K, C, width = 2, 256, 96, 4
    head, tail = _weight(160, K, 1), torch.randn(24, K, device=DEVICE)
    w = head._replace(tail=tail).checked()
    assert w.shape == (184, K)
    x = _x(M, K, 2) * 0.05
    parts = torch.rand(M, 3, device=DEVICE) * K  # [M, 3]
    conv_w = torch.randn(C, width, device=DEVICE)
    pool = torch.randn(3, width - 1, C, device=DEVICE)
    slots = torch.tensor([2, 0], dtype=torch.int32, device=DEVICE)
    want_pool = pool.clone()
    dense = w.dequantize(torch.float64)  # [184, K]
    plain = (x.double() @ dense.T) / (parts.double().sum(-1, keepdim=True) / K + 1e-6).sqrt()
    from lumotree.optimized.ops.gdn_decode import conv_step
    want = plain.clone()
    want[:, :C] = conv_step(plain[:, :C].float(), conv_w, want_pool, slots).double()
    got = G.small_batch_linear(x, w, norm=G.RowNorm(parts, 1e-6), conv=G.ConvStep(conv_w, pool, slots),
                               out=_poisoned(M, 184))
    assert _rel(got, want) < RTOL and torch.allclose(pool, want_pool, rtol=1e-5, atol=1e-5)
    assert _rel(G.fp8_linear(_x(70, K, 3), w), _x(70, K, 3).double() @ dense.T) < RTOL
    with pytest.raises(ValueError, match="float tail"):
        G.residual_linear(x, w, torch.zeros(M, 184, device=DEVICE))


RUNS = [("reference", "none", []), ("optimized", "tree", ["--drafter", "ngram"])]
MORE_RUNS = [("optimized", "none", []), ("optimized", "chain", ["--drafter", "ngram"]),
             ("reference", "tree", ["--drafter", "draft-model", "--draft-layers", "0"])]


@pytest.mark.parametrize("name, runs", [
    ("qwen3_next", RUNS),  # the tree step runs prefill chunks, tree steps and commits: every projection form
    pytest.param("qwen3_next", MORE_RUNS, marks=pytest.mark.slow),
    pytest.param("qwen3_5_moe-fused", RUNS + MORE_RUNS, marks=pytest.mark.slow),
])
def test_generate_greedy_tokens_equal_the_reference_on_the_dequantised_model(tmp_path, capsys, name, runs):
    """As a release stores it: ``in_proj_ba`` kept float (``w_in`` FP8 with a float tail)."""
    write_fp8(tmp_path, name, keep_float=["model.layers.0.linear_attn.in_proj_ba.weight"] * (name == "qwen3_next"))
    out = tmp_path / "out.json"
    tokens = {}
    for backend, spec, extra in runs if runs[0][0] == "reference" else [RUNS[0], *runs]:
        code = main(["generate", "--model", str(tmp_path), "--backend", backend, "--spec", spec, *extra, "--budget",
                     "fixed", "--max-nodes", "4", "--max-new-tokens", "5", "--num-slots", "1", "--max-seq-len", "32",
                     "--prompt", "3 1 4 1", "--json", str(out), "--quiet"])
        assert code == 0, capsys.readouterr().err
        tokens[(backend, spec)] = json.loads(out.read_text())["results"][0]["tokens"]
    assert len(set(map(tuple, tokens.values()))) == 1, tokens


def test_transformers_reads_our_fp8_checkpoint_as_the_same_model(tmp_path):
    """transformers (without a GPU it dequantises block-FP8 linears on load) reads the checkpoint that
    :func:`write_fp8` writes to the reference's dequantised weights and logits. The dense type only: transformers'
    CPU fallback leaves the experts' scales unapplied."""
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("accelerate")  # transformers' FP8 loading needs it
    write_fp8(tmp_path, "qwen3_5_text")
    model, info = transformers.AutoModelForCausalLM.from_pretrained(
        tmp_path, dtype=torch.float32, attn_implementation="eager", output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    ref = rm.load_pretrained(tmp_path)
    prompt = [3, 1, 4, 1, 5]
    with torch.no_grad():
        hf = model(torch.tensor([prompt])).logits[0].double().numpy()
    mine = ref.forward(prompt, ref.new_cache())
    assert np.abs(mine - hf).max() <= 1e-5 * np.abs(mine).max()


def test_the_fp8_config_round_trips_and_sits_at_the_top_of_conditional_configs():
    config = LAYOUTS["qwen3_5_moe-fused"][0].replace(fp8_block_size=(128, 128))
    raw = config.to_dict()
    assert raw["quantization_config"]["weight_block_size"] == [128, 128]
    assert HybridConfig.from_dict(raw) == config
    text = {k: v for k, v in raw.items() if k != "quantization_config"}
    conditional = {"model_type": "qwen3_5_moe", "text_config": text, "quantization_config": raw["quantization_config"]}
    assert HybridConfig.from_dict(conditional).fp8_block_size == (128, 128)
    with pytest.raises(ValueError, match="'quantization_config' and 'text_config.quantization_config'"):
        HybridConfig.from_dict({**conditional, "text_config": raw})
    with pytest.raises(ValueError, match="unknown config key 'fp8_block_size'"):
        HybridConfig.from_dict({**raw, "fp8_block_size": [128, 128]})
    with pytest.raises(ValueError, match="'quantization_config.scale_fmt'"):
        HybridConfig.from_dict({**raw, "quantization_config": {**raw["quantization_config"], "scale_fmt": "ue8m0"}})


P = "model.layers"
MALFORMED = {  # case -> (edit(stored, raw), words of the one-line error)
    "other method": (lambda t, c: c.update(quantization_config={"quant_method": "gptq", "bits": 4}),
                     ["'quantization_config.quant_method'", "gptq"]),
    "other block size": (lambda t, c: c["quantization_config"].update(weight_block_size=[64, 64]),
                         ["'quantization_config.weight_block_size'", "[64, 64]"]),
    "static activations": (lambda t, c: c["quantization_config"].update(activation_scheme="static"),
                           ["'quantization_config.activation_scheme'"]),
    "unknown key": (lambda t, c: c["quantization_config"].update(group_size=32),
                    ["'quantization_config.group_size'"]),
    "no quantization_config": (lambda t, c: c.pop("quantization_config"),
                               ["'quantization_config'", f"tensor '{P}.0.linear_attn.", "float8"]),
    "missing scale": (lambda t, c: t.pop(f"{P}.1.self_attn.o_proj.weight_scale_inv"),
                      [f"missing tensor '{P}.1.self_attn.o_proj.weight_scale_inv'"]),
    "wrong scale shape": (lambda t, c: t.update({f"{P}.0.mlp.down_proj.weight_scale_inv": torch.ones(2, 1)}),
                          [f"'{P}.0.mlp.down_proj.weight_scale_inv' has shape [2, 1], expected [1, 1]"]),
    "scale of a float weight": (lambda t, c: t.update({"lm_head.weight_scale_inv": torch.ones(1, 1)}),
                                ["unexpected tensor 'lm_head.weight_scale_inv'"]),
    "float8 embedding": (lambda t, c: t.update({"model.embed_tokens.weight": quantize_blocks(
        t["model.embed_tokens.weight"])[0]}), ["'model.embed_tokens.weight'", "float8"]),
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_malformed_fp8_checkpoints_end_in_one_line_naming_the_key_or_tensor(tmp_path, capsys, case):
    edit, words = MALFORMED[case]
    write_fp8(tmp_path, "qwen3_5_text", edit=edit)
    for load in (lambda: load_checkpoint(tmp_path, "cpu", torch.float32), lambda: rm.load_pretrained(tmp_path)):
        with pytest.raises(ValueError) as error:
            load()
        message = str(error.value)
        assert "\n" not in message and all(w in message for w in words), message
    code = main(["generate", "--model", str(tmp_path), "--prompt", "1 2", "--quiet"])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err and words[0] in err.strip().splitlines()[-1], err


def _steps_match_the_reference(tmp_path, name):
    """Prefill (chunks of 4: tree steps) and decode logits of a tiny block-FP8 checkpoint (fp32, every projection on
    the FP8 GEMV with its fused norms and convs) against the reference backend on the dequantised model."""
    from lumotree.optimized.model import load_pretrained as load_optimized

    write_fp8(tmp_path, name, keep_float=["model.layers.0.linear_attn.in_proj_ba.weight"] * (name == "qwen3_next"))
    ref = rm.load_pretrained(tmp_path)
    prompt, steps = [3, 1, 4, 1, 5], [2, 6]  # a 4-node chunk, a 1-node chunk, two decode steps
    want = ref.forward(prompt + steps, ref.new_cache())[len(prompt) - 1:]
    opt = load_optimized(tmp_path, num_slots=1, max_seq_len=32, max_nodes=4, dtype=torch.float32,
                         small_batch_linear=True, device=DEVICE, graphs=False)
    got = [opt.prefill(0, prompt).double().cpu().numpy()[None]]
    for token in steps:
        got.append(opt.decode(torch.tensor([0], dtype=torch.int32, device=DEVICE),
                              torch.tensor([token], device=DEVICE)).double().cpu().numpy())
    got = np.concatenate(got)
    assert np.abs(got - want).max() <= 1e-4 * np.abs(want).max()


@pytest.mark.slow
def test_fp8_checkpoint_steps_on_the_gemv_match_the_reference(tmp_path):
    _steps_match_the_reference(tmp_path, "qwen3_next")


# ------------------------------------------------------------------------------------------------------- GPU
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
@pytest.mark.parametrize("name", sorted(LAYOUTS))
def test_gpu_fp8_checkpoint_steps_match_the_reference(tmp_path, name):
    _steps_match_the_reference(tmp_path, name)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
@pytest.mark.parametrize("M", [1, 4, 16, 64, 300])
@pytest.mark.parametrize("N, K", [(12352, 2048), (2048, 4096), (1024, 2048), (16384, 2048)])
def test_gpu_bf16_fp8_projections(M, N, K):
    w, x = _weight(N, K, N + K), _x(M, K, M, torch.bfloat16)
    ref = x.double() @ w.dequantize(torch.float64).T
    y = G.fp8_linear(x, w)
    assert y.dtype == torch.bfloat16 and _rel(y, ref) < 1e-2
