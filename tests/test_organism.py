"""The committed organism (``models/organism``, skipped while absent): transformers loads it and its greedy
continuation of a held-out prompt equals lumotree's; its card, recipe, size and workloads are consistent."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from lumotree.reference.model import load_pretrained  # noqa: E402
from lumotree.workloads import WORKLOADS, load_workload  # noqa: E402

ORGANISM = Path(__file__).resolve().parents[1] / "models" / "organism"
pytestmark = [pytest.mark.skipif(not (ORGANISM / "config.json").is_file(), reason="models/organism is not committed"),
              pytest.mark.usefixtures("one_torch_thread")]  # conftest.py
NEW_TOKENS = 12
PROMPT_TOKENS = 48


def test_transformers_greedy_equals_lumotree_on_a_heldout_prompt():
    tokenizer = transformers.AutoTokenizer.from_pretrained(ORGANISM)
    item = load_workload(ORGANISM / "workloads", "completion")[0]
    prompt = item.prompt_ids(tokenizer)[-PROMPT_TOKENS:]
    hf = transformers.AutoModelForCausalLM.from_pretrained(ORGANISM, dtype=torch.float32,
                                                           attn_implementation="eager")
    with torch.no_grad():
        want = hf.generate(torch.tensor([prompt]), max_new_tokens=NEW_TOKENS, do_sample=False, eos_token_id=None,
                           pad_token_id=0)[0, len(prompt):].tolist()
    ref = load_pretrained(ORGANISM)
    cache = ref.new_cache()
    logits = ref.forward(prompt, cache)
    got = []
    for _ in range(NEW_TOKENS):
        got.append(int(np.argmax(logits[-1])))
        logits = ref.forward([got[-1]], cache)
    assert got == want


def test_card_recipe_size_and_workloads_agree():
    recipe = json.loads((ORGANISM / "recipe.json").read_text())
    card = (ORGANISM / "README.md").read_text()
    assert recipe["corpus"]["digest"] in card and f"{recipe['heldout']['perplexity']:.2f}" in card
    assert recipe["heldout"]["loss"] < 4.0  # far below log(vocab) = 9.0: the model learned the corpus
    assert sum(p.stat().st_size for p in ORGANISM.rglob("*") if p.is_file()) <= 48_000_000
    assert json.loads((ORGANISM / "config.json").read_text())["model_type"] == "qwen3_5_text"
    for name in WORKLOADS:
        items = load_workload(ORGANISM / "workloads", name)
        assert len(items) == recipe["workloads"]["items_each"]


def test_greedy_mtp_speculation_with_the_trained_head_equals_autoregressive():
    """The reference engine on the organism with its jointly trained MTP head: chain and tree speculation emit the
    greedy autoregressive tokens of a held-out prompt, and the head's drafts are accepted (a trained head, unlike a
    random one over 8192 ids, predicts the token after next)."""
    from lumotree.optimized.engine import Engine, MTPDrafter, ReferenceTarget, SamplingParams

    tokenizer = transformers.AutoTokenizer.from_pretrained(ORGANISM)
    prompt = load_workload(ORGANISM / "workloads", "edit")[0].prompt_ids(tokenizer)[-PROMPT_TOKENS:]
    ref = load_pretrained(ORGANISM)
    params = SamplingParams(max_new_tokens=NEW_TOKENS)
    ar = Engine(ReferenceTarget(ref, 1, 128, 16), mode="autoregressive").generate([prompt], params)[0]
    for mode in ("chain", "tree"):
        target = ReferenceTarget(ref, 1, 128, 16)
        engine = Engine(target, MTPDrafter(target, depth=3, top_k=2), mode=mode, budget="fixed", max_nodes=8)
        result = engine.generate([prompt], params)[0]
        assert result.tokens == ar.tokens, mode
        assert result.accepted >= 2, (mode, result.accepted, result.steps)  # 3 and 5 of 12; a random head: ~0
