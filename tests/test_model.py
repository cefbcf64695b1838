"""The hybrid model: tree verify = decoding each path token by token, commit then decode = plain decode, the config
reader, HF-format checkpoints, and bad input (each error names what is wrong)."""

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from strategies import trees

from lumotree.reference import TokenTree
from lumotree.reference.checkpoint import INDEX_FILE, read_tensors, write_checkpoint
from lumotree.reference.model import (
    HybridConfig,
    HybridModel,
    build_random,
    load_pretrained,
    save_pretrained,
    weights_to_tensors,
)

SMALL = dict(vocab_size=40, hidden_size=16, intermediate_size=24, num_hidden_layers=4, num_attention_heads=4,
             num_key_value_heads=2, head_dim=8, linear_key_head_dim=4, linear_value_head_dim=4,
             linear_num_key_heads=2, linear_num_value_heads=4, rope_theta=100.0)
CONFIGS = {
    # dense MLP, GVA 2, layers G A G A
    "dense": HybridConfig(**SMALL, num_experts=0,
                          layer_types=("linear_attention", "full_attention") * 2),
    # MoE with a dense layer in between, GVA 1, layers G G G A
    "moe": HybridConfig(**{**SMALL, "linear_num_value_heads": 2}, num_experts=4, num_experts_per_tok=2,
                        moe_intermediate_size=8, shared_expert_intermediate_size=12, mlp_only_layers=(1,)),
    # reflections allowed (beta up to 2), tied embeddings, no top-k renormalisation
    "neg_eigval_tied": HybridConfig(**SMALL, num_experts=3, num_experts_per_tok=2, moe_intermediate_size=8,
                                    shared_expert_intermediate_size=8, norm_topk_prob=False,
                                    tie_word_embeddings=True, allow_neg_eigval=True),
}
MODELS = {name: build_random(config, seed=7) for name, config in CONFIGS.items()}


def rel(a, b):
    return np.linalg.norm(np.asarray(a) - np.asarray(b)) / max(np.linalg.norm(np.asarray(b)), 1e-300)


def assert_caches_close(a, b, tol=1e-12):
    assert a.length == b.length
    for la, lb in zip(a.layers, b.layers):
        for name in ("conv_state", "state") if hasattr(la, "state") else ("keys", "values"):
            assert rel(getattr(la, name), getattr(lb, name)) < tol, name


def snapshot(cache):
    return [{k: v.copy() for k, v in vars(layer).items()} for layer in cache.layers]


@settings(max_examples=25)
@given(name=st.sampled_from(sorted(CONFIGS)), parents=trees(max_nodes=10), prompt_len=st.integers(1, 6),
       seed=st.integers(0, 2**31))
def test_tree_verify_equals_path_decoding_and_commit_equals_plain_decode(name, parents, prompt_len, seed):
    model = MODELS[name]
    rng = np.random.default_rng(seed)
    tree = TokenTree(parents)
    tokens = rng.integers(0, model.vocab_size, tree.num_nodes)
    cache = model.new_cache()
    model.forward(rng.integers(0, model.vocab_size, prompt_len), cache)
    before, version = snapshot(cache), cache.version
    logits = model.verify_tree(tokens, tree, cache)
    assert logits.shape == (tree.num_nodes, model.vocab_size) and logits.dtype == np.float64
    assert cache.version == version and cache.length == prompt_len
    for layer, saved in zip(cache.layers, before):  # untouched, bit for bit
        for key, value in saved.items():
            np.testing.assert_array_equal(getattr(layer, key), value)
    for leaf in tree.leaves:
        path = tree.path(leaf)
        plain = cache.copy()
        decoded = np.concatenate([model.forward([tokens[j]], plain) for j in path])  # [depth + 1, vocab]
        for row, node in enumerate(path):
            assert rel(logits[node], decoded[row]) < 1e-10, (name, node)
    # commit a random node, then decode one more token: identical to having decoded the path plainly
    node = int(rng.integers(0, tree.num_nodes))
    committed, plain = cache.copy(), cache.copy()
    model.verify_tree(tokens, tree, committed)
    model.commit(tokens, tree, node, committed)
    model.forward([tokens[j] for j in tree.path(node)], plain)
    assert_caches_close(committed, plain)
    nxt = [int(rng.integers(0, model.vocab_size))]
    assert rel(model.forward(nxt, committed), model.forward(nxt, plain)) < 1e-10


def test_several_speculation_rounds_track_plain_decoding():
    model = MODELS["moe"]
    rng = np.random.default_rng(3)
    prompt = rng.integers(0, model.vocab_size, 5)
    spec_cache, plain_cache = model.new_cache(), model.new_cache()
    model.forward(prompt, spec_cache)
    model.forward(prompt, plain_cache)
    for round_ in range(4):
        tree = TokenTree([-1, 0, 0, 1, 2, 3], tokens=rng.permutation(model.vocab_size)[:6])
        logits = model.verify_tree(None, tree, spec_cache)
        node = [5, 2, 0, 4][round_]
        model.commit(None, tree, node, spec_cache)
        plain = np.concatenate([model.forward([tree.tokens[j]], plain_cache) for j in tree.path(node)])
        assert rel(logits[tree.path(node)], plain) < 1e-10
        assert_caches_close(spec_cache, plain_cache)
    # commit without a preceding verify recomputes the records
    tree = TokenTree([-1, 0, 1], tokens=[1, 2, 3])
    fresh = spec_cache.copy()
    model.commit(None, tree, 2, fresh)
    model.forward([1, 2, 3], plain_cache)
    assert_caches_close(fresh, plain_cache)


def test_stale_tree_pass_is_refused():
    model = MODELS["dense"]
    cache = model.new_cache()
    model.forward([1, 2], cache)
    tree = TokenTree([-1, 0], tokens=[3, 4])
    tree_pass = model.tree_pass(None, tree, cache)
    model.forward([5], cache)
    with pytest.raises(ValueError, match="different cache state"):
        model.commit_pass(tree_pass, 1, cache)


# ---------------------------------------------------------------------------------------------------- config
def hf_457_config():
    """A config.json in the transformers 4.57 layout (as published with Qwen3-Next), shrunk."""
    return {
        "architectures": ["Qwen3NextForCausalLM"], "model_type": "qwen3_next", "torch_dtype": "bfloat16",
        "transformers_version": "4.57.0.dev0", "bos_token_id": 1, "eos_token_id": 2, "use_cache": True,
        "attention_bias": False, "attention_dropout": 0.0, "decoder_sparse_step": 1, "full_attention_interval": 2,
        "head_dim": 8, "hidden_act": "silu", "hidden_size": 16, "initializer_range": 0.02, "intermediate_size": 24,
        "linear_conv_kernel_dim": 4, "linear_key_head_dim": 4, "linear_num_key_heads": 2,
        "linear_num_value_heads": 4, "linear_value_head_dim": 4, "max_position_embeddings": 4096,
        "mlp_only_layers": [], "moe_intermediate_size": 8, "norm_topk_prob": True, "num_attention_heads": 4,
        "num_experts": 4, "num_experts_per_tok": 2, "num_hidden_layers": 4, "num_key_value_heads": 2,
        "output_router_logits": False, "partial_rotary_factor": 0.25, "rms_norm_eps": 1e-6, "rope_scaling": None,
        "rope_theta": 10000000, "router_aux_loss_coef": 0.001, "shared_expert_intermediate_size": 8,
        "tie_word_embeddings": False, "use_sliding_window": False, "vocab_size": 40,
    }


def test_config_reads_both_hf_layouts_and_round_trips():
    config = HybridConfig.from_dict(hf_457_config())
    assert config.layer_types == ("linear_attention", "full_attention") * 2
    assert config.rope_theta == 10000000 and config.rotary_dim == 2
    assert [config.is_moe_layer(i) for i in range(4)] == [True] * 4
    assert HybridConfig.from_dict(config.to_dict()) == config
    sparse = HybridConfig.from_dict({**hf_457_config(), "decoder_sparse_step": 2, "mlp_only_layers": [3]})
    assert [sparse.is_moe_layer(i) for i in range(4)] == [False, True, False, False]
    v5 = {k: v for k, v in hf_457_config().items() if k not in ("rope_theta", "partial_rotary_factor",
                                                                 "full_attention_interval")}
    v5["rope_parameters"] = {"rope_type": "default", "rope_theta": 500.0, "partial_rotary_factor": 0.5}
    v5["layer_types"] = ["full_attention", "linear_attention", "linear_attention", "linear_attention"]
    config5 = HybridConfig.from_dict(v5)
    assert config5.rope_theta == 500.0 and config5.rotary_dim == 4 and config5.layer_types[0] == "full_attention"
    assert HybridConfig.from_dict({**config.to_dict(), "allow_neg_eigval": True}).allow_neg_eigval


@pytest.mark.parametrize(
    "change, message",
    [
        ({"sliding_windows": 3}, "unknown config key 'sliding_windows'"),
        ({"rope_scaling": {"type": "yarn", "factor": 4.0}}, "'rope_scaling'"),
        ({"hidden_act": "gelu"}, "'hidden_act'"),
        ({"attention_bias": True}, "'attention_bias'"),
        ({"model_type": "llama"}, "'model_type'"),
        ({"rope_parameters": {"rope_type": "yarn"}}, "rope_parameters.rope_type"),
        ({"rope_parameters": {"factor": 2.0}}, "rope_parameters.factor"),
        ({"layer_types": ["full_attention"] * 3}, "layer_types"),
        ({"layer_types": ["mamba"] * 4}, r"layer_types\[0\]"),
        ({"linear_num_value_heads": 3}, "num_v_heads"),
        ({"num_experts_per_tok": 5}, "num_experts_per_tok"),
        ({"hidden_size": 0}, "hidden_size"),
    ],
)
def test_config_errors_name_the_key(change, message):
    base = hf_457_config()
    if "layer_types" in change:
        del base["full_attention_interval"]
    with pytest.raises(ValueError, match=message):
        HybridConfig.from_dict({**base, **change})


def test_layer_types_and_interval_must_agree():
    with pytest.raises(ValueError, match="'layer_types' and 'full_attention_interval' disagree"):
        HybridConfig.from_dict({**hf_457_config(), "layer_types": ["linear_attention"] * 4})


# ---------------------------------------------------------------------------------------------------- checkpoints
@pytest.mark.parametrize("shard", [None, 4000])
def test_save_load_round_trip(tmp_path, shard):
    model = MODELS["moe"]
    save_pretrained(model, tmp_path, max_shard_bytes=shard)
    assert (tmp_path / INDEX_FILE).exists() == (shard is not None)
    loaded = load_pretrained(tmp_path)
    assert loaded.config == model.config
    ids = [3, 1, 4, 1, 5]
    np.testing.assert_array_equal(loaded.forward(ids, loaded.new_cache()), model.forward(ids, model.new_cache()))
    tied = MODELS["neg_eigval_tied"]
    save_pretrained(tied, tmp_path / "tied", dtype="float32")
    reloaded = load_pretrained(tmp_path / "tied")
    assert reloaded.config.allow_neg_eigval and reloaded.weights.lm_head is None
    assert "lm_head.weight" not in read_tensors(tmp_path / "tied")


def corrupt(tmp_path, edit):
    """Save the dense model, apply ``edit`` to its tensors, write them back."""
    model = MODELS["dense"]
    tensors = weights_to_tensors(model.weights, model.config)
    edit(tensors)
    write_checkpoint(tmp_path, model.config.to_dict(), tensors)
    return tmp_path


def test_bad_checkpoints_name_the_tensor(tmp_path):
    def drop(t):
        del t["model.layers.1.self_attn.k_norm.weight"]

    with pytest.raises(ValueError, match=r"missing tensor 'model\.layers\.1\.self_attn\.k_norm\.weight'"):
        load_pretrained(corrupt(tmp_path / "a", drop))

    def reshape(t):
        t["model.layers.0.linear_attn.in_proj_ba.weight"] = t["model.layers.0.linear_attn.in_proj_ba.weight"][:-1]

    with pytest.raises(ValueError, match=r"'model\.layers\.0\.linear_attn\.in_proj_ba\.weight' has shape"):
        load_pretrained(corrupt(tmp_path / "b", reshape))

    def poison(t):
        t["model.layers.2.linear_attn.A_log"] = t["model.layers.2.linear_attn.A_log"].copy()
        t["model.layers.2.linear_attn.A_log"][1] = np.nan

    with pytest.raises(ValueError, match=r"'model\.layers\.2\.linear_attn\.A_log'.*NaN"):
        load_pretrained(corrupt(tmp_path / "c", poison))

    def extra(t):
        t["model.layers.0.linear_attn.conv1d.bias"] = np.zeros(3)

    with pytest.raises(ValueError, match=r"unexpected tensor 'model\.layers\.0\.linear_attn\.conv1d\.bias'"):
        load_pretrained(corrupt(tmp_path / "d", extra))

    # the multi-token-prediction head is kept, so its tensors are checked like the others
    with pytest.raises(ValueError, match=r"'mtp\.fc\.weight' has shape \[2, 2\], expected \[16, 32\]"):
        load_pretrained(corrupt(tmp_path / "f", lambda t: t.update({"mtp.fc.weight": np.zeros((2, 2))})))

    good = corrupt(tmp_path / "e", lambda t: None)
    load_pretrained(good)
    config = json.loads((good / "config.json").read_text())
    (good / "config.json").write_text(json.dumps({**config, "num_nextn_layers": 1}))
    with pytest.raises(ValueError, match="unknown config key 'num_nextn_layers'"):
        load_pretrained(good)
    (good / "config.json").unlink()
    with pytest.raises(FileNotFoundError, match="config.json"):
        load_pretrained(good)


def test_missing_shard_is_named(tmp_path):
    save_pretrained(MODELS["dense"], tmp_path, max_shard_bytes=3000)
    victim = sorted(tmp_path.glob("model-*.safetensors"))[1]
    victim.unlink()
    with pytest.raises(FileNotFoundError, match=victim.name):
        load_pretrained(tmp_path)


def test_hand_built_weights_are_checked_by_hf_name():
    model = MODELS["dense"]
    weights = model.weights
    bad_layer = weights.layers[1]
    saved = bad_layer.mixer.o_proj
    bad_layer.mixer.o_proj = saved[:, :-1]
    try:
        with pytest.raises(ValueError, match=r"'model\.layers\.1\.self_attn\.o_proj\.weight' has shape"):
            HybridModel(model.config, weights)
    finally:
        bad_layer.mixer.o_proj = saved


# ---------------------------------------------------------------------------------------------------- bad input
def test_bad_tokens_and_caches_are_named():
    model = MODELS["dense"]
    cache = model.new_cache()
    with pytest.raises(ValueError, match=r"token_ids\[2\] = 40 is outside the vocabulary"):
        model.forward([1, 2, 40], cache)
    with pytest.raises(ValueError, match=r"token_ids\[0\] = -1"):
        model.forward([-1], cache)
    with pytest.raises(ValueError, match="token_ids must hold integer"):
        model.forward([1.0, 2.0], cache)
    with pytest.raises(ValueError, match="token_ids must be a non-empty"):
        model.forward([], cache)
    assert cache.length == 0 and cache.version == 0  # nothing advanced
    model.forward([1, 2], cache)
    tree = TokenTree([-1, 0, 0])
    with pytest.raises(ValueError, match=r"tokens\[1\] = 99"):
        model.verify_tree([1, 99, 2], tree, cache)
    with pytest.raises(ValueError, match="tokens has 2 entries but the tree has 3 nodes"):
        model.verify_tree([1, 2], tree, cache)
    with pytest.raises(ValueError, match="tokens differ"):
        model.verify_tree([1, 2, 3], TokenTree([-1, 0, 0], tokens=[1, 2, 4]), cache)
    with pytest.raises(ValueError, match=r"tokens\[1\] = 99"):
        model.commit([1, 99, 2], tree, 1, cache)
    with pytest.raises(ValueError, match="node = 5"):
        model.commit([1, 2, 3], tree, 5, cache)
    with pytest.raises(TypeError, match="HybridCache"):
        model.forward([1], [])
    with pytest.raises(ValueError, match=r"cache\.layers\[1\] is GDNLayerCache"):
        model.forward([1], MODELS["moe"].new_cache())  # layers G G G A vs G A G A
    with pytest.raises(ValueError, match=r"cache\.layers\[0\]\.conv_state has shape"):
        MODELS["moe"].forward([1], MODELS["neg_eigval_tied"].new_cache())  # same layout, HV 2 vs 4
    poisoned = cache.copy()
    poisoned.layers[0].conv_state[0, 0] = np.nan
    with pytest.raises(ValueError, match="conv_state"):
        model.verify_tree([1, 2, 3], tree, poisoned)
    poisoned = cache.copy()
    poisoned.layers[1].values[0, 0, 0] = np.inf
    with pytest.raises(ValueError, match="v_cache"):
        model.forward([1], poisoned)
