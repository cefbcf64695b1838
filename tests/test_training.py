"""Training on the CPU, tiny configs: the training model against transformers' ``Qwen3_5ForCausalLM`` and the exact
reference (fp32 logits), its checkpoint through transformers and back, the MTP head's loss against a hand-written
one, loss decreasing, resume equal to an uninterrupted run, a frozen-target MTP run that moves only ``mtp.*``, the
corpus split, the tokenizer in ``AutoTokenizer``, and the whole organism recipe end to end. GPU: fla's chunk kernel
against the torch recurrence (values and gradients)."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("safetensors")
pytest.importorskip("tokenizers")

from lumotree.reference.config import HybridConfig  # noqa: E402
from lumotree.reference.model import load_pretrained  # noqa: E402
from lumotree.training.corpus import CorpusFile, Source, collect, corpus_digest, is_heldout, split  # noqa: E402
from lumotree.training.data import batch, documents, encode  # noqa: E402
from lumotree.training.formats import SPECIAL_TOKENS  # noqa: E402
from lumotree.training.gdn import chunked_gated_delta_rule, gated_delta_rule, recurrent_gated_delta_rule  # noqa: E402
from lumotree.training.model import HybridLM, load_checkpoint, save_checkpoint  # noqa: E402
from lumotree.training.organism import ORGANISM_CONFIG, ORGANISM_TRAINING, train_organism  # noqa: E402
from lumotree.training.tokenizer import save_tokenizer, train_tokenizer  # noqa: E402
from lumotree.training.trainer import TrainConfig, lr_at, train  # noqa: E402

if not hasattr(transformers, "Qwen3_5ForCausalLM"):
    pytest.skip("transformers has no Qwen3.5 classes (needs >= 5)", allow_module_level=True)

TINY = HybridConfig(model_type="qwen3_5_text", vocab_size=64, hidden_size=32, num_hidden_layers=4,
                    num_attention_heads=4, num_key_value_heads=2, head_dim=16, linear_key_head_dim=16,
                    linear_value_head_dim=16, linear_num_key_heads=2, linear_num_value_heads=4, intermediate_size=48,
                    num_experts=0, mtp_num_hidden_layers=1, tie_word_embeddings=True, partial_rotary_factor=0.5)
TINY_TRAINING = TrainConfig(seq_len=16, batch_size=4, lr=3e-3, warmup_steps=3, calibration_steps=3, steps=12,
                            log_every=1, checkpoint_every=100, eval_tokens=400)
PARITY_BOUND = 1e-5


pytestmark = pytest.mark.usefixtures("one_torch_thread")  # conftest.py


def random_model(config: HybridConfig, seed: int) -> HybridLM:
    """Seeded initialisation with every norm and gate moved off its identity (so each one is tested)."""
    model = HybridLM(config, backend="torch")
    model.initialize(seed, std=0.3)
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim == 1 and not name.endswith(("A_log", "dt_bias")):
                p.add_(0.2 * torch.randn(p.shape, generator=g))
    return model


def rel_error(ours: torch.Tensor, theirs: torch.Tensor) -> float:
    return float(((ours - theirs).abs() / ours.abs().amax(-1, keepdim=True)).max())


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    model = random_model(TINY, seed=3)
    path = tmp_path_factory.mktemp("tiny")
    save_checkpoint(model, path, dtype=torch.float32)
    return model, path


def test_forward_matches_transformers_and_the_reference(saved):
    model, path = saved
    tokens = torch.randint(0, TINY.vocab_size, (2, 13), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ours = model(tokens)
        hf = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="eager")
        assert type(hf).__name__ == "Qwen3_5ForCausalLM"
        assert rel_error(ours, hf(tokens).logits) < PARITY_BOUND
    ref = load_pretrained(path)
    for row in range(2):
        want = torch.from_numpy(np.asarray(ref.forward(tokens[row].tolist(), ref.new_cache()), dtype=np.float64))
        assert rel_error(ours[row].double(), want) < PARITY_BOUND
    assert rel_error(ours, ours + 1e-3 * ours.abs().amax()) > PARITY_BOUND  # the bound can fail


def test_checkpoint_round_trips_with_its_mtp_head(saved, tmp_path):
    model, path = saved
    names = set(json.loads((path / "config.json").read_text()) and
                __import__("safetensors").safe_open(str(path / "model.safetensors"), "pt").keys())
    assert {"mtp.fc.weight", "mtp.pre_fc_norm_embedding.weight", "mtp.pre_fc_norm_hidden.weight", "mtp.norm.weight",
            "mtp.layers.0.self_attn.q_proj.weight"} <= names and "lm_head.weight" not in names
    back = load_checkpoint(path, backend="torch")
    for (name, a), (_, b) in zip(model.state_dict().items(), back.state_dict().items()):
        assert torch.equal(a, b), name
    ref = load_pretrained(path)  # lumotree keeps the MTP head
    np.testing.assert_array_equal(ref.weights.mtp.fc, model.mtp.fc.weight.detach().double().numpy())
    with pytest.raises(FileNotFoundError, match="path"):
        load_checkpoint(tmp_path)


def test_mtp_loss_is_the_token_after_next_from_hidden_and_next_embedding(saved):
    model, _ = saved
    tokens = torch.randint(0, TINY.vocab_size, (1, 9), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        main, mtp = model.losses(tokens)
        hidden = model.hidden(tokens)
        m = model.mtp
        rows = []
        for i in range(7):  # position i: h_i and the embedding of token i + 1 -> token i + 2
            x = m.fc(torch.cat((m.pre_fc_norm_embedding(model.model.embed_tokens(tokens[:, 1: i + 2])),
                                m.pre_fc_norm_hidden(hidden[:, : i + 1])), dim=-1))
            cos, sin = model.rotary(i + 1, x.device)
            for layer in m.layers:
                x = layer(x, cos, sin)
            rows.append(torch.log_softmax(model.logits(m.norm(x))[0, -1], -1)[tokens[0, i + 2]])
        assert float(mtp) == pytest.approx(-float(torch.stack(rows).mean()), rel=1e-5)
        logp = torch.log_softmax(model(tokens)[0, :-1], -1)
        assert float(main) == pytest.approx(-float(logp.gather(1, tokens[0, 1:, None]).mean()), rel=1e-5)


def test_gdn_backend_argument_is_checked():
    x = torch.zeros(1, 2, 1, 4)
    with pytest.raises(ValueError, match="backend"):
        gated_delta_rule(x, x, x, x[..., 0], x[..., 0], backend="cuda")
    for rule in (recurrent_gated_delta_rule, chunked_gated_delta_rule):
        with pytest.raises(ValueError, match="v has 4 heads, not a multiple of the 3 key heads"):
            rule(torch.zeros(1, 2, 3, 4), torch.zeros(1, 2, 3, 4), torch.zeros(1, 2, 4, 4), torch.zeros(1, 2, 4),
                 torch.zeros(1, 2, 4))


def gdn_inputs(device: str, T: int, K: int, V: int, seed: int = 0):
    g = torch.Generator(device=device).manual_seed(seed)
    B, H, HV = 2, 2, 4
    q, k = (torch.randn(B, T, H, K, device=device, generator=g) for _ in range(2))
    v = torch.randn(B, T, HV, V, device=device, generator=g)
    gate = -2 * torch.rand(B, T, HV, device=device, generator=g)
    beta = torch.rand(B, T, HV, device=device, generator=g)
    weights = torch.randn(B, T, HV, V, device=device, generator=g)
    return [t.requires_grad_() for t in (q, k, v, gate, beta)], weights


def values_and_grads(fn, inputs, weights):
    out = fn(*inputs)
    return out.detach(), torch.autograd.grad((out * weights).sum(), inputs)


def test_chunked_form_equals_the_recurrence_with_gradients():
    inputs, weights = gdn_inputs("cpu", T=45, K=16, V=8)
    want, want_grads = values_and_grads(recurrent_gated_delta_rule, inputs, weights)
    got, grads = values_and_grads(lambda *x: chunked_gated_delta_rule(*x, chunk=16), inputs, weights)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    for a, b in zip(grads, want_grads):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
    got = gated_delta_rule(*inputs, backend="chunk").detach()  # chunk 64 > T: one padded chunk
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_learning_rate_schedule():
    cfg = TrainConfig(steps=100, warmup_steps=10, calibration_steps=5, lr=1.0, min_lr_ratio=0.1)
    assert lr_at(0, None, cfg) == pytest.approx(0.1) and lr_at(9, None, cfg) == pytest.approx(1.0)
    assert lr_at(10, 100, cfg) == pytest.approx(1.0) and lr_at(100, 100, cfg) == pytest.approx(0.1)
    assert lr_at(55, 100, cfg) == pytest.approx(0.55)
    with pytest.raises(ValueError, match="steps"):
        TrainConfig(steps=None, seconds=None)
    with pytest.raises(ValueError, match="calibration_steps"):
        TrainConfig(steps=10, warmup_steps=2, calibration_steps=5)


def stream_of(seed: int, n: int = 3000) -> np.ndarray:
    """A learnable stream: a repeating random phrase with noise."""
    rng = np.random.default_rng(seed)
    phrase = rng.integers(0, TINY.vocab_size, 23)
    out = np.tile(phrase, n // len(phrase) + 1)[:n]
    noise = rng.random(n) < 0.1
    out[noise] = rng.integers(0, TINY.vocab_size, noise.sum())
    return out.astype(np.uint16)


def test_loss_decreases_and_resume_equals_an_uninterrupted_run(tmp_path):
    stream, heldout = stream_of(0), stream_of(0)[:600]
    cfg = replace(TINY_TRAINING, steps=24, checkpoint_every=12, lr=1e-2)
    full = HybridLM(TINY, backend="torch")
    full.initialize(5)
    history = train(full, stream, heldout, cfg, "cpu", tmp_path / "a", progress=None)
    losses = [row[1] for row in history["steps"]]
    assert np.mean(losses[-4:]) < np.mean(losses[:4]) - 0.3, losses
    assert history["eval"]["loss"] < np.log(TINY.vocab_size) - 0.3
    part = HybridLM(TINY, backend="torch")
    part.initialize(5)
    train(part, stream, heldout, cfg, "cpu", tmp_path / "b", progress=None, stop_at=12)
    resumed = HybridLM(TINY, backend="torch")
    resumed.initialize(99)  # overwritten by the checkpoint
    again = train(resumed, stream, heldout, cfg, "cpu", tmp_path / "b", resume=True, progress=None)
    for (name, a), (_, b) in zip(full.state_dict().items(), resumed.state_dict().items()):
        torch.testing.assert_close(a, b, rtol=0, atol=0, msg=name)
    assert again["eval"] == history["eval"]
    with pytest.raises(FileNotFoundError, match="resume"):
        train(part, stream, None, cfg, "cpu", tmp_path / "none", resume=True, progress=None)


def test_a_frozen_target_trains_only_its_mtp_head():
    model = HybridLM(TINY, backend="torch")
    model.initialize(2)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    history = train(model, stream_of(1), None, replace(TINY_TRAINING, steps=4, trainable="mtp"), "cpu",
                    progress=None)
    assert history["total"] == 4
    for name, value in model.state_dict().items():
        assert torch.equal(value, before[name]) != name.startswith("mtp."), name


def test_split_by_path_hash_never_trains_on_a_heldout_file():
    files = [CorpusFile(f"src/pkg{i % 7}/mod{i}.py", f"x = {i}\n") for i in range(400)]
    train_files, heldout = split(files, 0.1)
    assert not {f.name for f in train_files} & {f.name for f in heldout}
    assert len(train_files) + len(heldout) == 400 and 20 <= len(heldout) <= 60
    assert {f.name for f in split(files[::-1], 0.1)[1]} == {f.name for f in heldout}  # per file, not per list
    assert all(is_heldout(f.name, 0.1) for f in heldout) and not any(is_heldout(f.name, 0.0) for f in files)
    docs = documents(train_files, seed=0, edit_share=1.0, tool_share=1.0)
    assert not any(f.name in d for f in heldout for d in docs)
    assert corpus_digest(files) == corpus_digest(files[::-1]) != corpus_digest(files[1:])
    with pytest.raises(ValueError, match="heldout_fraction"):
        split(files, 1.0)


def small_corpus(tmp_path) -> list[Source]:
    import sysconfig

    stdlib = sysconfig.get_paths()["stdlib"]
    return [Source("json", f"{stdlib}/json"), Source("email", f"{stdlib}/email")]


def test_tokenizer_loads_in_autotokenizer_and_round_trips(tmp_path):
    files = collect(small_corpus(tmp_path))
    tokenizer = train_tokenizer([f.text for f in files], vocab_size=400)
    assert train_tokenizer([f.text for f in files], vocab_size=400).to_str() == tokenizer.to_str()  # deterministic
    save_tokenizer(tokenizer, tmp_path, model_max_length=128)
    auto = transformers.AutoTokenizer.from_pretrained(tmp_path)
    text = files[0].text[:500] + "<|edit|>Rename `x`.\n<|result|>  déjà vu\t€"
    ids = tokenizer.encode(text, add_special_tokens=False).ids
    assert auto.encode(text) == ids and auto.decode(ids) == text
    assert [auto.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS] == list(range(len(SPECIAL_TOKENS)))
    assert auto.eos_token_id == 0 and len(auto) == 400
    stream = encode(tokenizer, [text, text])
    assert stream.dtype == np.uint16 and len(stream) == 2 * len(ids)
    assert batch(stream, 0, 7, 3, 8).tolist() == batch(stream, 0, 7, 3, 8).tolist()
    with pytest.raises(ValueError, match="vocab_size"):
        train_tokenizer(["a"], vocab_size=10)


def test_the_organism_recipe_end_to_end(tmp_path):
    config = replace(TINY, vocab_size=320)
    training = replace(ORGANISM_TRAINING, seq_len=32, batch_size=2, warmup_steps=3, calibration_steps=3,
                       eval_tokens=200)
    out = tmp_path / "organism"
    record = train_organism(out, device="cpu", steps=3, seed=1, sources=small_corpus(tmp_path), config=config,
                            training=training, recipe=dict(heldout_fraction=0.2, workload_items=2), progress=None)
    for name in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "recipe.json",
                 "training_log.json", "README.md", "workloads/edit.jsonl"):
        assert (out / name).is_file(), name
    assert record["training"]["steps"] == 3 and record["corpus"]["digest"] in (out / "README.md").read_text()
    assert json.loads((out / "config.json").read_text())["model_type"] == "qwen3_5_text"
    assert load_pretrained(out).config.mtp_num_hidden_layers == 1
    assert transformers.AutoTokenizer.from_pretrained(out).eos_token_id == 0
    assert ORGANISM_CONFIG.model_type == "qwen3_5_text" and ORGANISM_CONFIG.layer_types.count("full_attention") * 4 \
        == ORGANISM_CONFIG.num_hidden_layers


def test_the_organism_fits_the_size_limit():
    from lumotree.training.model import checkpoint_bytes

    assert 20e6 < checkpoint_bytes(ORGANISM_CONFIG) < 47e6  # bf16, tied head, MTP head included


@pytest.mark.gpu
def test_fla_chunk_kernel_matches_the_recurrence_with_gradients():
    pytest.importorskip("fla")
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    inputs, weights = gdn_inputs("cuda", T=150, K=64, V=64)
    want, want_grads = values_and_grads(recurrent_gated_delta_rule, inputs, weights)
    for backend in ("fla", "chunk"):
        got, grads = values_and_grads(lambda *x: gated_delta_rule(*x, backend=backend), inputs, weights)
        torch.testing.assert_close(got, want, rtol=2e-3, atol=2e-3)
        for a, b in zip(grads, want_grads):
            torch.testing.assert_close(a, b, rtol=5e-3, atol=5e-3)
