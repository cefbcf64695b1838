"""Parity with HuggingFace transformers' ``Qwen3NextForCausalLM`` (its pure-torch CPU path) on tiny random configs.

transformers builds the model, re-initialises every weight at a size where each part matters (its own init leaves the
mixers nearly silent), and saves it with ``save_pretrained``; our ``load_pretrained`` reads it. Prefill of 7 tokens and
20 cached decode steps must match transformers' logits. transformers computes the GDN core, every RMSNorm and RoPE
in float32 even when the model is float64, so "its precision" is float32's. Measured max relative error (per position,
``max |ours - HF| / max |ours|``, these four configs): 0.5e-6 .. 2.5e-6 against HF float64, 1.0e-6 .. 2.4e-6 against
HF float32; HF float32 and HF float64 differ from each other by 1.1e-6 .. 2.1e-6. Asserted bound: 1e-5. For scale:
a 1e-3 relative error in one RMSNorm gives 3e-3, a conv window shifted by one token 2, the other RoPE pairing 8e-2.
The opposite direction (our ``save_pretrained`` read by ``from_pretrained``) is checked the same way.
"""

import importlib.util
import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("safetensors")

from lumotree.reference.model import HybridConfig, build_random, load_pretrained, save_pretrained  # noqa: E402

if not hasattr(transformers, "Qwen3NextForCausalLM"):
    pytest.skip("transformers has no Qwen3NextForCausalLM (needs >= 4.57.1)", allow_module_level=True)


def _closure(fn) -> dict:
    """The free variables a plain function closes over, by name."""
    return dict(zip(fn.__code__.co_freevars, (c.cell_contents for c in fn.__closure__ or ())))


def _plain_function(fn):
    """The function behind transformers' hub-kernel wrapper: from 5.25 (with ``kernels`` installed) each kernel
    function is an ``nn.Module`` whose ``forward`` closes over it as ``func``; before, the function itself."""
    while not hasattr(fn, "__code__"):
        inner = _closure(type(fn).forward).get("func")
        if inner is None:
            raise TypeError(f"cannot see through transformers' wrapper {type(fn).__name__} of a kernel function")
        fn = inner
    return fn


def external_kernels(model: str = "qwen3_next") -> list[str]:
    """The kernel functions of transformers' ``model`` (its ``modeling_<model>`` module) bound to an external package
    (flash-linear-attention, causal-conv1d) instead of its pure-torch fallback: it decides once, at import, and keeps
    the flag in a closure."""
    hf_module = importlib.import_module(f"transformers.models.{model}.modeling_{model}")

    bound = []
    for name in ("torch_chunk_gated_delta_rule", "torch_recurrent_gated_delta_rule", "causal_conv1d_fn",
                 "causal_conv1d_update"):
        cells = _closure(_plain_function(getattr(hf_module, name)))
        flag = cells.get("is_new_implementation")
        if flag is None:  # another transformers layout: fall back to asking for the distributions
            flag = any(importlib.util.find_spec(pkg) is not None for pkg in ("fla.ops", "causal_conv1d"))
        if flag:
            bound.append(name)
    return bound


if external_kernels():
    pytest.skip(f"transformers uses external kernels for {external_kernels()}, not its torch fallback",
                allow_module_level=True)

PARITY_BOUND = 1e-5
VOCAB = 64
BASE = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=4, num_attention_heads=4,
            num_key_value_heads=2, head_dim=16, linear_key_head_dim=8, linear_value_head_dim=8, linear_num_key_heads=2)
HF_CONFIGS = {
    "dense-gva1": dict(linear_num_value_heads=2, num_experts=0),
    "dense-gva2-tied-interval2": dict(linear_num_value_heads=4, num_experts=0, tie_word_embeddings=True,
                                      layer_types=["linear_attention", "full_attention"] * 2,
                                      rope_parameters={"rope_type": "default", "rope_theta": 1000.0,
                                                       "partial_rotary_factor": 0.5}),
    "moe-gva1": dict(linear_num_value_heads=2, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16,
                     shared_expert_intermediate_size=24),
    "moe-gva2-mlp-only": dict(linear_num_value_heads=4, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16,
                              shared_expert_intermediate_size=24, mlp_only_layers=[1], norm_topk_prob=False),
}


pytestmark = pytest.mark.usefixtures("one_torch_thread_no_grad")  # conftest.py


def randomise(model, seed: int) -> None:
    """Weights of useful size, the same recipe as ``build_random``."""
    g = torch.Generator().manual_seed(seed)
    for name, p in model.named_parameters():
        if name.endswith("A_log"):
            p.copy_(torch.empty(p.shape).uniform_(0.1, 2.0, generator=g).log())
        elif name.endswith("dt_bias"):
            p.copy_(0.5 * torch.randn(p.shape, generator=g))
        elif "conv1d" in name:
            p.copy_(0.5 * torch.randn(p.shape, generator=g))
        elif name.endswith("linear_attn.norm.weight"):
            p.copy_(1 + 0.1 * torch.randn(p.shape, generator=g))
        elif p.ndim == 1:
            p.copy_(0.1 * torch.randn(p.shape, generator=g))
        elif "embed_tokens" in name:
            p.copy_(torch.randn(p.shape, generator=g))
        else:
            p.copy_(torch.randn(p.shape, generator=g) / math.sqrt(p.shape[-1]))


def hf_logits(path, dtype, prompt, steps):
    """transformers' logits for the prompt (prefill) and each cached decode step: ``[len(prompt) + len(steps), V]``."""
    model = transformers.Qwen3NextForCausalLM.from_pretrained(path, dtype=dtype, experts_implementation="eager",
                                                              attn_implementation="eager")
    out = model(torch.tensor([list(prompt)]), use_cache=True)
    rows, cache = [out.logits[0]], out.past_key_values
    for token in steps:
        out = model(torch.tensor([[int(token)]]), cache=cache, use_cache=True)
        rows.append(out.logits[0])
        cache = out.past_key_values
    return torch.cat(rows).double().numpy()


def our_logits(model, prompt, steps):
    cache = model.new_cache()
    rows = [model.forward(prompt, cache)] + [model.forward([t], cache) for t in steps]
    assert cache.length == len(prompt) + len(steps)
    return np.concatenate(rows)


def max_rel_error(ours, theirs):
    return float((np.abs(ours - theirs) / np.abs(ours).max(axis=-1, keepdims=True)).max())


@pytest.mark.parametrize("name", sorted(HF_CONFIGS))
def test_transformers_checkpoint_loads_and_matches(tmp_path, name):
    config = transformers.Qwen3NextConfig(**BASE, **HF_CONFIGS[name])
    torch.manual_seed(0)
    hf_model = transformers.Qwen3NextForCausalLM(config)
    randomise(hf_model, seed=1)
    hf_model.save_pretrained(tmp_path)
    ours = load_pretrained(tmp_path)
    kinds = set(ours.config.layer_types)
    assert kinds == {"linear_attention", "full_attention"} and ours.config.num_hidden_layers >= 4
    rng = np.random.default_rng(0)
    prompt, steps = rng.integers(0, VOCAB, 7), rng.integers(0, VOCAB, 20)
    mine = our_logits(ours, prompt, steps)
    for dtype in (torch.float64, torch.float32):
        err = max_rel_error(mine, hf_logits(tmp_path, dtype, prompt, steps))
        assert err < PARITY_BOUND, (name, dtype, err)


def test_our_checkpoint_loads_in_transformers_and_matches(tmp_path):
    config = HybridConfig(**{k: v for k, v in BASE.items()}, linear_num_value_heads=4, num_experts=4,
                          num_experts_per_tok=2, moe_intermediate_size=16, shared_expert_intermediate_size=24,
                          mlp_only_layers=(2,), rope_theta=500.0)
    ours = build_random(config, seed=5)
    save_pretrained(ours, tmp_path, max_shard_bytes=20_000)  # sharded, float64
    rng = np.random.default_rng(1)
    prompt, steps = rng.integers(0, VOCAB, 6), rng.integers(0, VOCAB, 20)
    err = max_rel_error(our_logits(ours, prompt, steps), hf_logits(tmp_path, torch.float64, prompt, steps))
    assert err < PARITY_BOUND, err


def test_long_speculative_run_equals_transformers_greedy(tmp_path, capsys):
    """Hundreds of tree-speculative steps through ``lumotree generate`` (reference backend, the layer-skip draft
    model, trees of 8 nodes) on a transformers-saved checkpoint: the greedy continuation equals transformers' own
    ``generate`` token for token."""
    import json

    from lumotree.cli import main

    config = transformers.Qwen3NextConfig(**BASE, **HF_CONFIGS["dense-gva1"])
    torch.manual_seed(0)
    hf_model = transformers.Qwen3NextForCausalLM(config)
    randomise(hf_model, seed=2)
    hf_model.save_pretrained(tmp_path)
    prompt = np.random.default_rng(3).integers(0, VOCAB, 12).tolist()
    new = 240
    hf_model = transformers.Qwen3NextForCausalLM.from_pretrained(tmp_path, dtype=torch.float64,
                                                                 attn_implementation="eager")
    want = hf_model.generate(torch.tensor([prompt]), max_new_tokens=new, do_sample=False, eos_token_id=None,
                             pad_token_id=0)[0, len(prompt):].tolist()
    out = tmp_path / "out.json"
    code = main(["generate", "--model", str(tmp_path), "--backend", "reference", "--spec", "tree", "--drafter",
                 "draft-model", "--draft-layers", "0,1", "--budget", "fixed", "--max-nodes", "8", "--max-new-tokens",
                 str(new), "--prompt", " ".join(map(str, prompt)), "--json", str(out), "--quiet"])
    assert code == 0, capsys.readouterr().err
    result = json.loads(out.read_text())
    assert result["results"][0]["tokens"] == want
    assert result["summary"]["speculative_steps"] >= 100 and result["summary"]["mean_accepted"] > 0


def test_tied_config_with_a_stored_head_keeps_the_head_in_both_backends(tmp_path):
    """A checkpoint with ``tie_word_embeddings: true`` that stores an ``lm_head.weight`` different from the
    embedding: transformers keeps the stored head (with a warning); so do the reference and the optimized model."""
    from safetensors.torch import load_file, save_file

    from lumotree.optimized.model import load_pretrained as load_optimized

    sizes = {**BASE, "linear_key_head_dim": 16, "linear_value_head_dim": 16}  # the kernels' smallest head
    config = transformers.Qwen3NextConfig(**sizes, **HF_CONFIGS["dense-gva2-tied-interval2"])
    torch.manual_seed(0)
    hf_model = transformers.Qwen3NextForCausalLM(config)
    randomise(hf_model, seed=4)
    hf_model.save_pretrained(tmp_path)
    tensors = load_file(str(tmp_path / "model.safetensors"))
    tensors["lm_head.weight"] = torch.randn(VOCAB, BASE["hidden_size"], generator=torch.Generator().manual_seed(9))
    save_file(tensors, str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
    prompt = np.random.default_rng(5).integers(0, VOCAB, 6)
    want = hf_logits(tmp_path, torch.float64, prompt, [])[-1]
    ours = load_pretrained(tmp_path)
    assert max_rel_error(our_logits(ours, prompt, [])[-1:], want[None]) < PARITY_BOUND
    opt = load_optimized(tmp_path, num_slots=1, max_seq_len=16, max_nodes=8, graphs=False, dtype=torch.float32)
    got = opt.prefill(0, prompt.tolist()).double().numpy()
    assert max_rel_error(got[None], want[None]) < 1e-4
