"""Every supported model type against transformers' own classes, on tiny random checkpoints they build and save:
``Qwen3NextForCausalLM``, ``Qwen3_5ForCausalLM``, ``Qwen3_5MoeForCausalLM`` and the conditional-generation
``Qwen3_5ForConditionalGeneration`` / ``Qwen3_5MoeForConditionalGeneration`` (text model under
``model.language_model.``, a vision tower that is skipped).

Logits (prefill and cached decode steps, fp32) of the reference backend and of the optimized backend (Triton
interpreter, fp32) agree with transformers' within 1e-5 relative (measured 2.5e-7 .. 6.4e-7; transformers' float32 and
float64 differ by up to 7.1e-7; Qwen3.5's ``in_proj_b`` and ``in_proj_a`` swapped give 0.31); greedy continuations
through ``lumotree generate --model DIR`` equal transformers' ``generate`` in every speculation mode on both backends.
Each model has a GDN layer and an attention layer (GVA 2, head dims 16: the kernels' smallest); the MoE ones top-2 of
4 experts with a shared expert. Qwen3.5's split projections, its M-RoPE keys, the tied head of a conditional
checkpoint, the fused-expert layout of the released Qwen3.5-MoE checkpoints (read by transformers to the same logits)
and the MTP head are exercised here.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("safetensors")

from test_hf_parity import external_kernels, max_rel_error, our_logits, randomise  # noqa: E402

from lumotree.cli import main  # noqa: E402
from lumotree.optimized.model import load_pretrained as load_optimized  # noqa: E402
from lumotree.reference.config import CONDITIONAL_MODEL_TYPES  # noqa: E402
from lumotree.reference.model import load_pretrained  # noqa: E402

if not hasattr(transformers, "Qwen3_5MoeForConditionalGeneration"):
    pytest.skip("transformers has no Qwen3.5 classes (needs >= 5)", allow_module_level=True)
for _family in ("qwen3_5", "qwen3_5_moe"):
    if external_kernels(_family):
        pytest.skip(f"transformers uses external kernels for {_family}, not its torch fallback",
                    allow_module_level=True)

PARITY_BOUND = 1e-5
VOCAB = 64
TEXT = dict(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, layer_types=["linear_attention", "full_attention"],
            num_attention_heads=4, num_key_value_heads=2, head_dim=16, linear_key_head_dim=16,
            linear_value_head_dim=16, linear_num_key_heads=2, linear_num_value_heads=4)
MOE = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16, shared_expert_intermediate_size=24)
VISION = dict(depth=1, hidden_size=16, intermediate_size=32, num_heads=2, out_hidden_size=32, patch_size=4,
              spatial_merge_size=1, temporal_patch_size=1, num_position_embeddings=16)
MROPE = {"rope_type": "default", "rope_theta": 1000.0, "partial_rotary_factor": 0.5, "mrope_section": [2, 1, 1],
         "mrope_interleaved": True}


def hf_model(kind: str):
    """transformers' class and config of a tiny model of ``kind``."""
    t = transformers
    if kind == "qwen3_next":
        return t.Qwen3NextForCausalLM, t.Qwen3NextConfig(**TEXT, **MOE)
    if kind == "qwen3_5_text":
        return t.Qwen3_5ForCausalLM, t.Qwen3_5TextConfig(**TEXT, intermediate_size=48)
    if kind == "qwen3_5_moe_text":
        return t.Qwen3_5MoeForCausalLM, t.Qwen3_5MoeTextConfig(**TEXT, **MOE, rope_parameters=MROPE)
    if kind == "qwen3_5":  # the head tied to the embedding by the top-level key
        return t.Qwen3_5ForConditionalGeneration, t.Qwen3_5Config(
            text_config=dict(**TEXT, intermediate_size=48, rope_parameters=MROPE), vision_config=VISION,
            tie_word_embeddings=True)
    return t.Qwen3_5MoeForConditionalGeneration, t.Qwen3_5MoeConfig(text_config=dict(**TEXT, **MOE),
                                                                     vision_config=VISION)


KINDS = ("qwen3_next", "qwen3_5_text", "qwen3_5_moe_text", "qwen3_5", "qwen3_5_moe")


pytestmark = pytest.mark.usefixtures("one_torch_thread_no_grad")  # conftest.py


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """kind -> (transformers class, checkpoint directory saved by transformers)."""
    out = {}
    with torch.no_grad():
        for seed, kind in enumerate(KINDS):
            cls, config = hf_model(kind)
            torch.manual_seed(seed)
            model = cls(config)
            randomise(model, seed=10 + seed)
            path = tmp_path_factory.mktemp(kind)
            model.save_pretrained(path)
            out[kind] = (cls, path)
    return out


def hf_logits(cls, path, dtype, prompt, steps):
    """transformers' logits for the prompt (prefill) and each cached decode step."""
    model = cls.from_pretrained(path, dtype=dtype, experts_implementation="eager", attn_implementation="eager")
    out = model(torch.tensor([list(prompt)]), use_cache=True)
    rows, cache = [out.logits[0]], out.past_key_values
    for token in steps:
        out = model(torch.tensor([[int(token)]]), cache=cache, use_cache=True)
        rows.append(out.logits[0])
        cache = out.past_key_values
    return torch.cat(rows).double().numpy()


def hf_greedy(cls, path, prompt, new):
    model = cls.from_pretrained(path, dtype=torch.float64, experts_implementation="eager", attn_implementation="eager")
    return model.generate(torch.tensor([prompt]), max_new_tokens=new, do_sample=False, eos_token_id=None,
                          pad_token_id=0)[0, len(prompt):].tolist()


@pytest.mark.parametrize("kind", KINDS)
def test_logits_match_transformers_on_both_backends(checkpoints, kind):
    cls, path = checkpoints[kind]
    rng = np.random.default_rng(KINDS.index(kind))
    prompt, steps = rng.integers(0, VOCAB, 7), rng.integers(0, VOCAB, 5)
    want32 = hf_logits(cls, path, torch.float32, prompt, steps)
    ref = load_pretrained(path)
    assert ref.config.model_type == CONDITIONAL_MODEL_TYPES.get(kind, kind)
    mine = our_logits(ref, prompt, steps)
    for want in (hf_logits(cls, path, torch.float64, prompt, steps), want32):
        assert max_rel_error(mine, want) < PARITY_BOUND, kind
    opt = load_optimized(path, num_slots=1, max_seq_len=32, max_nodes=4, graphs=False, dtype=torch.float32)
    got = [opt.prefill(0, prompt.tolist()).double().numpy()[None]]
    for token in steps:
        got.append(opt.decode(torch.tensor([0], dtype=torch.int32), torch.tensor([int(token)])).double().numpy())
    assert max_rel_error(np.concatenate(got), want32[len(prompt) - 1:]) < PARITY_BOUND, kind


RUNS = [  # backend, spec mode, drafter options
    ("reference", "none", []),
    ("reference", "chain", ["--drafter", "ngram"]),
    ("reference", "tree", ["--drafter", "draft-model", "--draft-layers", "0"]),
    ("optimized", "none", []),
    ("optimized", "chain", ["--drafter", "ngram"]),
    ("optimized", "tree", ["--drafter", "ngram"]),
]
#: the draft is the whole target (its layers shared, not copied): every drafted token is accepted, so paths of depth 3
#: commit on the interpreter too (one model type: the draft runs in the interpreter as well, 4x the time)
FULL_DRAFT = ("optimized", "chain", ["--drafter", "draft-model", "--draft-layers", "0,1"])


@pytest.mark.parametrize("kind", KINDS)
def test_generate_equals_transformers_greedy_in_every_mode(checkpoints, kind, tmp_path, capsys):
    cls, path = checkpoints[kind]
    prompt = np.random.default_rng(20 + KINDS.index(kind)).integers(0, VOCAB, 6).tolist()
    new = 6
    want = hf_greedy(cls, path, prompt, new)
    out = tmp_path / "out.json"
    for backend, spec, extra in RUNS + ([FULL_DRAFT] if kind == "qwen3_5_moe" else []):
        code = main(["generate", "--model", str(path), "--backend", backend, "--spec", spec, *extra, "--budget",
                     "fixed", "--max-nodes", "4", "--max-new-tokens", str(new), "--num-slots", "1", "--max-seq-len",
                     "32", "--prompt", " ".join(map(str, prompt)), "--json", str(out), "--quiet"])
        assert code == 0, capsys.readouterr().err
        result = json.loads(out.read_text())
        assert result["results"][0]["tokens"] == want, (kind, backend, spec)
        if "0,1" in extra:  # the draft is the target: every drafted token is accepted
            assert result["summary"]["mean_accepted"] >= 1, (kind, result["summary"])


@pytest.mark.parametrize("kind", ["qwen3_next", "qwen3_5_moe"])
def test_the_mtp_head_is_kept_in_both_backends_and_changes_no_logits(checkpoints, kind, tmp_path):
    """The released checkpoints' ``mtp.*`` tensors (one MTP layer: attention + the model's MoE; Qwen3-Next's config
    without ``mtp_num_hidden_layers``, Qwen3.5's with it; Qwen3.5-MoE's experts fused) added to a transformers
    checkpoint: both backends keep them, values intact, in their weights; transformers ignores them; the logits do
    not change."""
    import shutil

    from safetensors.torch import load_file, save_file

    from lumotree.reference.checkpoint import tensor_table
    from lumotree.reference.layouts import CheckpointLayout, resolve_checkpoint

    cls, original = checkpoints[kind]
    path = tmp_path / kind
    shutil.copytree(original, path)
    raw = json.loads((path / "config.json").read_text())
    config, layout = resolve_checkpoint(raw, tensor_table(path))
    layout = CheckpointLayout(layout.model_type, layout.prefix, fused_experts=kind == "qwen3_5_moe")
    gen = torch.Generator().manual_seed(7)
    mtp = {name: torch.randn(shape, generator=gen) / 4 for name, shape in
           layout.stored_shapes(config.replace(mtp_num_hidden_layers=1)).items() if name.startswith("mtp.")}
    save_file({**load_file(str(path / "model.safetensors")), **mtp}, str(path / "model.safetensors"),
              metadata={"format": "pt"})
    if kind == "qwen3_5_moe":
        raw["text_config"]["mtp_num_hidden_layers"] = 1
        (path / "config.json").write_text(json.dumps(raw))
    ref = load_pretrained(path)
    assert ref.config.mtp_num_hidden_layers == 1 and ref.weights.mtp is not None
    np.testing.assert_array_equal(ref.weights.mtp.fc, mtp["mtp.fc.weight"].double().numpy())
    np.testing.assert_array_equal(ref.weights.mtp.layers[0].mixer.k_proj, mtp["mtp.layers.0.self_attn.k_proj.weight"])
    if kind == "qwen3_5_moe":
        fused = mtp["mtp.layers.0.mlp.experts.gate_up_proj"]  # [E, 2I, D]: gate rows, then up rows
        np.testing.assert_array_equal(ref.weights.mtp.layers[0].mlp.up_proj[2], fused[2, MOE["moe_intermediate_size"]:])
    opt = load_optimized(path, num_slots=1, max_seq_len=16, max_nodes=4, graphs=False, dtype=torch.float32)
    head = opt.weights.mtp
    assert torch.equal(head.fc, mtp["mtp.fc.weight"]) and torch.equal(head.hidden_norm,
                                                                       1 + mtp["mtp.pre_fc_norm_hidden.weight"])
    q, k, v = (mtp[f"mtp.layers.0.self_attn.{n}_proj.weight"] for n in "qkv")
    assert torch.equal(head.layers[0].w_qkv, torch.cat([q, k, v])) and head.mlps[0].router is not None
    prompt = [5, 9, 2, 7]
    before = load_pretrained(original)
    np.testing.assert_array_equal(our_logits(ref, prompt, []), our_logits(before, prompt, []))
    want = hf_logits(cls, original, torch.float32, prompt, [])
    np.testing.assert_array_equal(hf_logits(cls, path, torch.float32, prompt, []), want)


@pytest.mark.parametrize("model_type", ["qwen3_5_text", "qwen3_5_moe_text"])
def test_our_qwen3_5_checkpoints_load_in_transformers(tmp_path, model_type):
    """``save_pretrained`` of a Qwen3.5 model writes its split projections; transformers' class of the type reads it
    (float64) to the same logits, and so does ``load_pretrained``."""
    from lumotree.reference.config import HybridConfig
    from lumotree.reference.model import build_random, save_pretrained

    sizes = {**TEXT, "layer_types": tuple(TEXT["layer_types"]), "rope_theta": 500.0}
    config = HybridConfig(**sizes, model_type=model_type, **(
        dict(num_experts=0, intermediate_size=40) if model_type == "qwen3_5_text" else MOE))
    ours = build_random(config, seed=4)
    save_pretrained(ours, tmp_path)
    cls = transformers.Qwen3_5ForCausalLM if model_type == "qwen3_5_text" else transformers.Qwen3_5MoeForCausalLM
    prompt, steps = [3, 1, 4, 1, 5, 9], [2, 6, 5]
    mine = our_logits(ours, prompt, steps)
    assert max_rel_error(mine, hf_logits(cls, tmp_path, torch.float64, prompt, steps)) < PARITY_BOUND
    loaded = load_pretrained(tmp_path)
    assert loaded.config == config
    np.testing.assert_array_equal(our_logits(loaded, prompt, steps), mine)


def test_fused_experts_read_as_transformers_reads_them(checkpoints, tmp_path):
    """The released Qwen3.5-MoE checkpoints' fused experts (``mlp.experts.gate_up_proj: [E, 2I, D]``, gate rows first;
    ``mlp.experts.down_proj: [E, D, I]``): transformers reads such a checkpoint to the logits of the per-expert one,
    and so do both backends."""
    import shutil

    from safetensors.torch import load_file, save_file

    cls, original = checkpoints["qwen3_5_moe"]
    path = tmp_path / "fused"
    shutil.copytree(original, path)
    tensors = load_file(str(path / "model.safetensors"))
    for i in range(TEXT["num_hidden_layers"]):
        stem = f"model.language_model.layers.{i}.mlp.experts"
        experts = range(MOE["num_experts"])
        tensors[f"{stem}.gate_up_proj"] = torch.stack([torch.cat([tensors.pop(f"{stem}.{e}.gate_proj.weight"),
                                                                  tensors.pop(f"{stem}.{e}.up_proj.weight")])
                                                       for e in experts])
        tensors[f"{stem}.down_proj"] = torch.stack([tensors.pop(f"{stem}.{e}.down_proj.weight") for e in experts])
    save_file(tensors, str(path / "model.safetensors"), metadata={"format": "pt"})
    prompt = [4, 8, 15, 16, 23]
    want = hf_logits(cls, original, torch.float32, prompt, [])
    np.testing.assert_array_equal(hf_logits(cls, path, torch.float32, prompt, []), want)
    np.testing.assert_array_equal(our_logits(load_pretrained(path), prompt, []),
                                  our_logits(load_pretrained(original), prompt, []))
    opt = load_optimized(path, num_slots=1, max_seq_len=16, max_nodes=4, graphs=False, dtype=torch.float32)
    assert max_rel_error(opt.prefill(0, prompt).double().numpy()[None], want[-1:]) < PARITY_BOUND
