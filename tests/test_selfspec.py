"""Self-speculation drafters (layer-skip early exit, the GDN-only subgraph) and the acceptance study: layer choice,
losslessness through the engine (reference backend; the optimized backend under the Triton interpreter for one small
case, with the suffix drafter too), teacher-forced log-probabilities against the model's own forward, the study's
alpha and perplexity ratio (exactly 1 when the draft is the whole target), and the ``generate`` options."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from lumotree.cli import main
from lumotree.optimized import model as om
from lumotree.optimized.engine import Engine, OptimizedTarget, ReferenceTarget, make_drafter
from lumotree.optimized.engine.sampling import SamplingParams
from lumotree.optimized.engine.selfspec import (
    SelfSpeculationDrafter,
    acceptance_study,
    attention_ablated_tensors,
    self_speculation_layers,
    sequence_log_probs,
)
from lumotree.reference.drafters import layer_skip_draft
from lumotree.reference.model import HybridConfig, build_random

CONFIG = dict(vocab_size=48, hidden_size=32, intermediate_size=48, num_hidden_layers=4, num_attention_heads=2,
              num_key_value_heads=1, head_dim=16, linear_num_key_heads=2, linear_num_value_heads=4,
              linear_key_head_dim=8, linear_value_head_dim=8, num_experts=0,
              layer_types=("linear_attention", "full_attention", "linear_attention", "full_attention"))


@pytest.fixture(scope="module")
def model():
    return build_random(HybridConfig(**CONFIG), seed=5)


def test_self_speculation_layers():
    config = HybridConfig(**CONFIG)
    assert self_speculation_layers(config, "gdn-only") == [0, 2]
    assert self_speculation_layers(config, "layer-skip") == [0, 1]
    assert self_speculation_layers(config, "layer-skip", 3) == [0, 1, 2]
    for kind, exit_layer, words in (("layer-skip", 0, "exit_layer"), ("layer-skip", 5, "exit_layer"),
                                    ("gdn-only", 2, "exit_layer"), ("skip", None, "kind")):
        with pytest.raises(ValueError, match=words):
            self_speculation_layers(config, kind, exit_layer)
    pure = HybridConfig(**{**CONFIG, "layer_types": ("linear_attention",) * 4})
    with pytest.raises(ValueError, match="no attention layers"):
        self_speculation_layers(pure, "gdn-only")


def test_self_speculation_drafters_are_lossless_on_the_reference(model):
    rng = np.random.default_rng(0)
    prompts = [rng.integers(0, 48, size=n).tolist() for n in (4, 7, 3)]
    params = SamplingParams(max_new_tokens=8)
    reference = Engine(ReferenceTarget(model, num_slots=2, max_seq_len=64), mode="autoregressive").generate(prompts,
                                                                                                            params)
    for kind in ("layer-skip", "gdn-only"):
        layers = self_speculation_layers(model.config, kind)
        draft = ReferenceTarget(layer_skip_draft(model, layers), num_slots=2, max_seq_len=64)
        drafter = make_drafter(kind, draft_model=draft, top_k=2, max_depth=3)
        assert isinstance(drafter, SelfSpeculationDrafter) and drafter.name == kind
        for mode in ("chain", "tree"):
            engine = Engine(ReferenceTarget(model, num_slots=2, max_seq_len=64), drafter, mode=mode, budget="fixed",
                            max_nodes=8)
            assert [r.tokens for r in engine.generate(prompts, params)] == [r.tokens for r in reference], (kind, mode)
    with pytest.raises(ValueError, match="draft_model"):
        make_drafter("gdn-only")


def test_gdn_only_and_suffix_drafters_are_lossless_on_the_optimized_model_fp32():
    """The optimized model (fp32, Triton interpreter on the CPU): the GDN-only draft (its checkpoint-level subgraph)
    and the suffix drafter emit the greedy autoregressive tokens; the study's log-probabilities match the reference."""
    config = HybridConfig(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                          layer_types=("linear_attention", "full_attention"), num_attention_heads=4,
                          num_key_value_heads=2, head_dim=16, linear_key_head_dim=16, linear_value_head_dim=16,
                          linear_num_key_heads=2, linear_num_value_heads=4, num_experts=0, rope_theta=1000.0)
    ref = build_random(config, seed=1)
    prompts = [[5, 9, 2, 5, 9, 2]]
    params = SamplingParams(max_new_tokens=3)

    def target(reference_model):
        m = om.from_reference(reference_model, num_slots=1, max_seq_len=24, max_nodes=4, graphs=False,
                              dtype=torch.float32)
        return OptimizedTarget(m, batch_buckets=(1,))

    ar = Engine(target(ref), mode="autoregressive").generate(prompts, params)
    draft = target(layer_skip_draft(ref, self_speculation_layers(config, "gdn-only")))
    for drafter in (make_drafter("gdn-only", draft_model=draft, top_k=2, max_depth=2), make_drafter("suffix")):
        engine = Engine(target(ref), drafter, mode="tree", budget="fixed", max_nodes=4)
        if drafter.name == "gdn-only":  # the draft model's own shapes too, its slot free after
            engine.warm_up()
            assert draft.busy == set() and engine.free_slots == [0]
        assert [r.tokens for r in engine.generate(prompts, params)] == [r.tokens for r in ar], drafter.name
    # teacher-forced log-probabilities through the optimized model (two chunks of its 4-node trees) = the reference's
    seq = [5, 9, 2, 5, 9, 2, 7]
    logits = ref.forward(seq, ref.new_cache())  # [T, V] float64
    want = torch.log_softmax(torch.from_numpy(logits), -1)[torch.arange(len(seq) - 1), seq[1:]].numpy()
    assert np.allclose(sequence_log_probs(target(ref), seq), want, atol=1e-4)


def test_sequence_log_probs_match_the_models_own_forward(model):
    seq = np.random.default_rng(2).integers(0, 48, size=11).tolist()
    logits = model.forward(seq, model.new_cache())  # [T, V]
    shifted = logits - logits.max(-1, keepdims=True)
    logp = shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))
    want = logp[np.arange(len(seq) - 1), seq[1:]]
    for max_nodes in (3, 16):  # chunks of 3 verified chains, or one
        got = sequence_log_probs(ReferenceTarget(model, num_slots=1, max_nodes=max_nodes), seq)
        assert np.allclose(got, want, atol=1e-10)
    with pytest.raises(ValueError, match="tokens"):
        sequence_log_probs(ReferenceTarget(model, num_slots=1), [3])


def test_acceptance_study(model):
    """alpha(k) and mean accepted length per k, losslessness, and the perplexity-ablation ratio; a draft that is the
    whole target accepts every token with ratio 1, the GDN-only subgraph less."""
    prompts = [[1, 2, 3], [4, 5, 6, 7]]
    full = acceptance_study(ReferenceTarget(model, num_slots=2), ReferenceTarget(
        layer_skip_draft(model, self_speculation_layers(model.config, "layer-skip", 4)), num_slots=2), prompts,
        ks=(1, 3), max_new_tokens=8)
    assert full["lossless"] and full["alpha"] == {1: 1.0, 3: 1.0} and full["ppl_ratio"] == pytest.approx(1.0)
    assert full["mean_accepted"][1] == pytest.approx(1.0) and full["mean_accepted"][3] > 1.0
    gdn = acceptance_study(ReferenceTarget(model, num_slots=2), ReferenceTarget(
        layer_skip_draft(model, self_speculation_layers(model.config, "gdn-only")), num_slots=2), prompts,
        ks=(1, 2), max_new_tokens=8)
    assert gdn["lossless"] and all(0.0 <= a < 1.0 for a in gdn["alpha"].values())
    assert gdn["ppl_ratio"] > 0 and gdn["ppl_draft"] != pytest.approx(gdn["ppl_target"])
    with pytest.raises(ValueError, match="ks"):
        acceptance_study(ReferenceTarget(model), ReferenceTarget(model), prompts, ks=(0,))


def test_generate_with_the_new_drafters(capsys):
    base = ["generate", "--random", "tiny", "--backend", "reference", "--max-new-tokens", "6", "--quiet",
            "--budget", "fixed", "--max-nodes", "4", "--prompt", "1 2 3 1 2 3"]
    outputs = []
    for extra in ([], ["--drafter", "suffix"], ["--drafter", "gdn-only"], ["--drafter", "layer-skip", "--exit-layer",
                                                                          "1"]):
        assert main(base + (["--spec", "none"] if not extra else extra)) == 0
        outputs.append(capsys.readouterr().out)
    assert len(set(outputs)) == 1
    for extra, words in ((["--drafter", "layer-skip", "--exit-layer", "9"], "--exit-layer"),
                         (["--drafter", "suffix", "--exit-layer", "1"], "--exit-layer")):
        assert main(base + extra) == 2
        last = capsys.readouterr().err.strip().splitlines()[-1]
        assert last.startswith("error:") and words in last, last


def test_attention_ablation_is_the_gdn_and_mlp_subgraph(model):
    """Zeroing the attention output projections skips the attention mixers exactly: with the attention layers' MLPs
    zeroed too, the model is the GDN-only draft (layers dropped) logit for logit; with them kept it is not."""
    from lumotree.reference import model as rm

    config = model.config
    tensors = rm.weights_to_tensors(model.weights, config)
    ablated = attention_ablated_tensors(config, tensors)
    assert all(ablated[k] is tensors[k] for k in tensors if "o_proj" not in k)
    attention = [i for i, t in enumerate(config.layer_types) if t == "full_attention"]
    no_mlp = dict(ablated)
    for i in attention:
        no_mlp[f"model.layers.{i}.mlp.down_proj.weight"] = tensors[f"model.layers.{i}.mlp.down_proj.weight"] * 0
    seq = [3, 1, 4, 1, 5, 9, 2, 6]

    def logits(m):
        return m.forward(seq, m.new_cache())

    gdn_only = layer_skip_draft(model, self_speculation_layers(config, "gdn-only"))
    assert np.allclose(logits(rm.HybridModel(config, rm.weights_from_tensors(no_mlp, config))), logits(gdn_only),
                       atol=1e-12)
    kept = logits(rm.HybridModel(config, rm.weights_from_tensors(ablated, config)))
    assert not np.allclose(kept, logits(gdn_only)) and not np.allclose(kept, logits(model))
