"""The payoff-predicting router: accepted lengths of draft trees, the decisions against hand-computed payoffs per unit
of verify cost, the merged tree, the online (recursive least squares) update converging on synthetic data, the offline
fit and its file, and greedy speculation through the engine equal to autoregressive decoding (reference backend; one
small case on the optimized model under the interpreter; ``lumotree generate --drafter router``)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from lumotree.cli import main
from lumotree.optimized.engine import Engine, OptimizedTarget, ReferenceTarget, SamplingParams
from lumotree.optimized.engine.drafters import Draft, make_drafter
from lumotree.optimized.engine.mtp import MTPDrafter
from lumotree.optimized.engine.router import (FEATURES, PayoffModel, RouterDrafter, accepted_length, draft_features,
                                              fit_payoff_models, load_router, merge_drafts, save_router,
                                              scaled_confidences)
from lumotree.optimized.engine.router_training import record_drafts
from lumotree.optimized.engine.suffix import SuffixDrafter
from lumotree.reference.config import HybridConfig
from lumotree.reference.model import build_random, save_pretrained

TINY = dict(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
            layer_types=("linear_attention", "full_attention"), num_attention_heads=4, num_key_value_heads=2,
            head_dim=16, linear_key_head_dim=16, linear_value_head_dim=16, linear_num_key_heads=2,
            linear_num_value_heads=4, rope_theta=1000.0, num_experts=0, mtp_num_hidden_layers=1)


pytestmark = pytest.mark.usefixtures("one_torch_thread_no_grad")  # conftest.py


@pytest.fixture(scope="module")
def model():
    return build_random(HybridConfig(**TINY), seed=1)


class Profile:
    """A hand cost profile: verify ``1 + 0.1 n`` seconds, decode 1 second."""

    def verify_time(self, batch: int, nodes: int) -> float:
        return 1.0 + 0.1 * nodes

    def decode_time(self, batch: int) -> float:
        return 1.0


class FixedDrafter:
    """A model drafter proposing the chain ``pending, a, b`` with confidences 0.9, 0.8; counts its calls."""

    name, description, synthetic = "fixed", "fixed chains", False

    def __init__(self, a: int = 50, b: int = 51):
        self.a, self.b, self.calls = a, b, 0

    def admit(self, slot, prompt):
        pass

    def release(self, slot):
        pass

    def advance(self, requests, committed):
        pass

    def propose(self, requests, max_nodes, chain):
        self.calls += 1
        return [Draft([r.context[-1], self.a, self.b], [-1, 0, 1], np.array([1.0, 0.9, 0.8])) for r in requests]


def test_accepted_length_walks_the_tree():
    tokens, parents = [7, 1, 2, 3, 4, 5], [-1, 0, 0, 1, 3, 2]
    assert accepted_length(tokens, parents, [1, 3, 4, 9]) == 3
    assert accepted_length(tokens, parents, [2, 5]) == 2
    assert accepted_length(tokens, parents, [3]) == 0
    assert accepted_length(tokens, parents, []) == 0
    assert accepted_length([7], [-1], [1, 2]) == 0


def test_choices_against_hand_computed_payoffs():
    router = RouterDrafter(SuffixDrafter(), FixedDrafter(), profile=Profile())
    router._model_seconds = 0.5
    # cache: (1 + 2) / (1 + 0.5) = 2.0; model before drafting: (1 + 3) / (1 + 0.9 + 0.5) = 1.667 -> cache
    assert router.choose(1, {"cache": (2.0, 5), "model": (3.0, 9)}, model_pending=True) == "cache"
    # once drafted the model's time is spent: (1 + 3) / 1.9 = 2.105 -> model
    assert router.choose(1, {"cache": (2.0, 5), "model": (3.0, 9)}, model_pending=False) == "model"
    # merged: (1 + 4) / (1 + 1.3) = 2.174 beats the model's 2.105 and the cache's 2.0
    assert router.choose(1, {"cache": (2.0, 5), "model": (3.0, 9), "merged": (4.0, 13)}, False) == "merged"
    # merged with little extra payoff: (1 + 3.1) / 2.3 = 1.78 < 2.105 -> model
    assert router.choose(1, {"cache": (2.0, 5), "model": (3.0, 9), "merged": (3.1, 13)}, False) == "model"
    relative = RouterDrafter(SuffixDrafter(), FixedDrafter(), node_cost=0.05, model_cost=0.2)
    # no profile: cache (1 + 1) / (1 + 0.05 * 4) = 1.667; model (1 + 2) / (1 + 0.05 * 6 + 0.2) = 2.0 -> model
    assert relative.choose(8, {"cache": (1.0, 4), "model": (2.0, 6)}, model_pending=True) == "model"


def test_the_router_skips_the_model_when_the_cache_pays(model):
    """A repetitive prompt: the cache's predicted payoff beats the model's expected rate, the model drafter is not
    run; a prompt without repetition: the cache has nothing, the model drafts and its draft is proposed."""
    from lumotree.optimized.engine.drafters import DraftRequest

    fixed = FixedDrafter()
    router = RouterDrafter(SuffixDrafter(), fixed, profile=Profile())
    repeat = [1, 2, 3, 4, 5, 6] * 4
    router.admit(0, repeat)
    params = SamplingParams()
    draft = router.propose([DraftRequest(0, repeat + [1], params)], 16, False)[0]
    assert fixed.calls == 0 and draft.tokens[:3] == [1, 2, 3] and router.picks["cache"] == 1
    # the draft's confidences sum to the predicted payoff (default model: the cache's confidence sum)
    x = draft_features(draft, 0, 0, 0.0)
    assert x[FEATURES.index("confidence_sum")] == pytest.approx(float(draft.confidence[1:].sum()))
    router.admit(1, [9, 8, 7])
    draft = router.propose([DraftRequest(1, [9, 8, 7, 6], params)], 16, False)[0]
    assert fixed.calls == 1 and draft.tokens == [6, 50, 51] and router.picks["model"] == 1


def test_merged_tree_is_the_union_with_the_larger_confidence():
    a = Draft([7, 1, 2, 3], [-1, 0, 1, 0], np.array([1.0, 0.5, 0.4, 0.3]))
    b = Draft([7, 1, 9], [-1, 0, 1], np.array([1.0, 0.8, 0.6]))
    merged = merge_drafts(a, a.confidence, b, b.confidence)
    assert merged.tokens == [7, 1, 2, 3, 9] and merged.parents == [-1, 0, 1, 0, 1]
    assert np.allclose(merged.confidence, [1.0, 0.8, 0.4, 0.3, 0.6])
    assert np.allclose(scaled_confidences(b, 0.7), [1.0, 0.4, 0.3])
    assert np.allclose(scaled_confidences(b, 10.0), [1.0, 1.0, 1.0])
    with pytest.raises(ValueError, match="roots"):
        merge_drafts(a, a.confidence, Draft([8], [-1], np.ones(1)), np.ones(1))


def test_online_update_converges_on_synthetic_payoffs():
    rng = np.random.default_rng(0)
    w_true = rng.normal(size=len(FEATURES))
    model = PayoffModel(forgetting=1.0)
    X = rng.normal(size=(3000, len(FEATURES)))
    y = X @ w_true + 0.1 * rng.normal(size=3000)
    for x, target in zip(X, y):
        model.update(x, target)
    assert np.abs(model.w - w_true).max() < 0.02
    fitted = PayoffModel(ridge=1e-3).fit(X, y)
    assert np.abs(fitted.w - w_true).max() < 0.02
    # forgetting follows a drift: after the payoff changes, the model tracks the new weights
    drifting = PayoffModel(fitted.w, forgetting=0.98)
    w_new = w_true + 0.5
    for x in rng.normal(size=(1500, len(FEATURES))):
        drifting.update(x, float(x @ w_new))
    assert np.abs(drifting.w - w_new).max() < 0.02
    with pytest.raises(ValueError, match="forgetting"):
        PayoffModel(forgetting=0.0)


def greedy(target, drafter, prompts, mode="tree", max_nodes=8, new=12):
    engine = Engine(target, drafter, mode=mode, budget="fixed", max_nodes=max_nodes)
    return [r.tokens for r in engine.generate(prompts, SamplingParams(max_new_tokens=new))]


PROMPTS = [[3, 4, 5, 6, 3, 4, 5, 6, 3, 4], [9, 1, 9, 1, 9], [17, 30, 2]]


def test_greedy_router_speculation_equals_autoregressive_on_the_reference(model):
    want = greedy(ReferenceTarget(model, 3, 64, 16), None, PROMPTS, "autoregressive")
    for mode in ("chain", "tree"):
        target = ReferenceTarget(model, 3, 64, 16)
        router = RouterDrafter(SuffixDrafter(), MTPDrafter(target, depth=2, top_k=2), record=True)
        assert greedy(target, router, PROMPTS, mode) == want, mode
        assert router.records and router.picks["cache"] > 0 and router.picks["model"] > 0
        summary = router.summary()
        assert summary["drafts_scored"] > 0 and set(summary["mae"]) == {"cache", "model"}


def test_greedy_router_on_the_optimized_model(model):
    from lumotree.optimized.model import from_reference

    prompts = PROMPTS[:2]
    want = greedy(ReferenceTarget(model, 2, 32, 8), None, prompts, "autoregressive", new=5)
    opt = from_reference(model, num_slots=2, max_seq_len=32, max_nodes=8, graphs=False, dtype=torch.float32)
    target = OptimizedTarget(opt)
    router = RouterDrafter(SuffixDrafter(), MTPDrafter(target, depth=2, top_k=2))
    assert greedy(target, router, prompts, new=5) == want


def test_recorded_fit_saves_loads_and_drives_generate(model, tmp_path, capsys):
    target = ReferenceTarget(model, 3, 64, 16)
    records, _ = record_drafts(target, MTPDrafter(target, depth=2, top_k=2), PROMPTS, 10, max_nodes=8)
    sources = {s for s, _, _ in records}
    assert sources == {"cache", "model"}  # explore: both sources drafted and labelled
    models, mae = fit_payoff_models(records)
    assert all(v is not None and v >= 0 for v in mae.values())
    path = save_router(models, tmp_path / "router.json")
    loaded = load_router(path)
    assert np.allclose(loaded["model"].w, models["model"].w)
    (tmp_path / "bad.json").write_text(json.dumps({"format": "other"}))
    with pytest.raises(ValueError, match="payoff-model"):
        load_router(tmp_path / "bad.json")
    save_pretrained(model, tmp_path / "ckpt")
    out = tmp_path / "out.json"
    tokens = {}
    for spec, extra in (("none", []), ("tree", ["--router", str(path)])):
        code = main(["generate", "--model", str(tmp_path / "ckpt"), "--backend", "reference", "--spec", spec,
                     "--drafter", "router", "--budget", "fixed", "--max-nodes", "8", "--max-new-tokens", "8",
                     "--prompt", "3 4 5 6 3 4 5", "--json", str(out), "--quiet", *extra])
        assert code == 0, capsys.readouterr().err
        tokens[spec] = json.loads(out.read_text())["results"][0]["tokens"]
    assert tokens["tree"] == tokens["none"]
    assert main(["generate", "--model", str(tmp_path / "ckpt"), "--backend", "reference", "--drafter", "router",
                 "--router", str(tmp_path / "missing.json"), "--prompt", "1 2"]) == 2
    assert "no such file" in capsys.readouterr().err
    assert isinstance(make_drafter("router", target=target, router=str(path)), RouterDrafter)
