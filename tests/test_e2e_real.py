"""The end-to-end benchmark on real text and the replay of measured acceptance: acceptance profiles counted by hand
on a small tree, their JSON round trip and errors; the replay drafter's acceptance converging to the profile it
replays (binomial bounds, fixed seed; a wrong profile is rejected by the same bounds) and staying lossless through
the engine; the recorder's counts against the engine's accepted tokens; ``lumotree bench e2e --model`` on a tiny
random checkpoint with a tokenizer trained here (reference backend: every drafter's greedy output equals
autoregressive decoding) and ``--replay`` argument errors."""

from __future__ import annotations

import json

import numpy as np
import pytest

from lumotree.cli import main
from lumotree.optimized.engine import DRAFTERS, Engine, ReferenceTarget
from lumotree.optimized.engine.drafters import Draft, DraftRequest
from lumotree.optimized.engine.replay import (
    AcceptanceProfile,
    ReplayDrafter,
    count_step,
    record_acceptance,
    replay_template,
)
from lumotree.optimized.engine.sampling import SamplingParams
from lumotree.reference.model import HybridConfig, build_random

TABLE = np.array([[0.55, 0.2, 0.1], [0.6, 0.15, 0.05], [0.7, 0.1, 0.0], [0.45, 0.2, 0.1]])  # [D, K]


def profile_of(table: np.ndarray, n: int = 10_000) -> AcceptanceProfile:
    proposed = np.full(table.shape, float(n))
    return AcceptanceProfile(proposed, np.round(table * n), table * n, meta={"drafter": "test"})


# ------------------------------------------------------------------------------------------------ counting
def test_profile_counts_a_small_tree_by_hand():
    # root 5; depth 1: node 1 (tok 7, conf .6), node 2 (tok 8, .3); under 1: node 3 (tok 9, .4), node 4 (tok 10, .5);
    # under 2: node 5 (tok 11, .2). Ranks under node 1 by confidence: node 4 rank 0, node 3 rank 1.
    draft = Draft([5, 7, 8, 9, 10, 11], [-1, 0, 0, 1, 1, 2], np.array([1.0, 0.6, 0.3, 0.4, 0.5, 0.2]))
    profile = AcceptanceProfile.empty(1, 1)
    count_step(profile, draft, [7, 9])  # accepted: node 1 (depth 1 rank 0), node 3 (depth 2 rank 1)
    assert profile.proposed.tolist() == [[1, 1], [1, 1]]  # node 5 is under a rejected node: not counted
    assert profile.accepted.tolist() == [[1, 0], [0, 1]]
    np.testing.assert_allclose(profile.confidence_sum, [[0.6, 0.3], [0.5 / 0.6, 0.4 / 0.6]])
    count_step(profile, draft, [])  # nothing accepted: only the root's children were candidates
    assert profile.proposed.tolist() == [[2, 2], [1, 1]] and profile.accepted.tolist() == [[1, 0], [0, 1]]
    np.testing.assert_allclose(profile.acceptance(), [[0.5, 0.0], [0.0, 1.0]])
    # calibration bins of the path confidences .6 .3 .4 .5 .2 (twice); nodes 1 and 3 on the path once
    assert profile.calibration[:, 0].tolist() == [0, 0, 2, 2, 2, 2, 2, 0, 0, 0]
    assert profile.calibration[:, 1].tolist() == [0, 0, 0, 0, 1, 0, 1, 0, 0, 0]
    with pytest.raises(ValueError, match="not a child"):
        count_step(profile, draft, [7, 11])
    back = AcceptanceProfile.from_dict(json.loads(json.dumps(profile.to_dict())))
    assert (back.proposed == profile.proposed).all() and (back.calibration == profile.calibration).all()


def test_profile_errors(tmp_path):
    with pytest.raises(ValueError, match="accepted must not exceed"):
        AcceptanceProfile([[1.0]], [[2.0]], [[1.0]])
    with pytest.raises(ValueError, match="same depth x rank shape"):
        AcceptanceProfile([[1.0, 1.0]], [[1.0]], [[1.0]])
    with pytest.raises(ValueError, match="kind"):
        AcceptanceProfile.from_dict({"proposed": [[1]]})
    bad = tmp_path / "p.json"
    bad.write_text("{")
    with pytest.raises(ValueError, match="not JSON"):
        AcceptanceProfile.load(bad)
    with pytest.raises(FileNotFoundError, match="path"):
        AcceptanceProfile.load(tmp_path / "missing.json")
    with pytest.raises(ValueError, match="nothing to replay"):
        ReplayDrafter(AcceptanceProfile.empty(2, 2), {(1,): [2]}, 16)


def test_replay_template_is_best_first():
    parents, ranks, conf, depth = replay_template(20, TABLE)
    assert all(a >= b for a, b in zip(conf[1:], conf[2:]))
    for i in range(1, len(parents)):
        assert conf[i] == pytest.approx(conf[parents[i]] * TABLE[depth[i] - 1, ranks[i]])
    assert max(depth) <= TABLE.shape[0]
    chain = replay_template(20, TABLE, chain=True)
    assert chain[0] == [-1, 0, 1, 2, 3] and chain[1] == [-1, 0, 0, 0, 0]  # rank 0 only, as deep as the profile


# ------------------------------------------------------------------------------------------------ replay statistics
def simulate(profile: AcceptanceProfile, table_nodes: int, chain: bool, steps: int, seed: int) -> AcceptanceProfile:
    """Greedy verification without a model: the target's continuation is the oracle; each step accepts the path of
    draft tokens that follow it, counted into a fresh profile."""
    vocab, requests = 1000, 16
    rng = np.random.default_rng(seed)
    oracle = {(i,): rng.integers(0, vocab, size=steps * 8 + 8).tolist() for i in range(requests)}
    drafter = ReplayDrafter(profile, oracle, vocab, seed=seed)
    measured = AcceptanceProfile.empty(1, 1)
    contexts = {i: [i, oracle[(i,)][0]] for i in range(requests)}
    for i in range(requests):
        drafter.admit(i, [i])
    for _ in range(steps):
        reqs = [DraftRequest(i, contexts[i], SamplingParams()) for i in range(requests)]
        for r, d in zip(reqs, drafter.propose(reqs, table_nodes, chain)):
            truth = oracle[(r.slot,)][len(r.context) - 1:]
            accepted, node = [], 0
            while True:
                kids = [c for c in range(1, d.num_nodes) if d.parents[c] == node]
                nxt = next((c for c in kids if d.tokens[c] == truth[len(accepted)]), None)
                if nxt is None:
                    break
                accepted.append(d.tokens[nxt])
                node = nxt
            count_step(measured, d, accepted)
            contexts[r.slot] = r.context + accepted + [truth[len(accepted)]]
    return measured


@pytest.mark.parametrize("chain", [False, True])
def test_replay_acceptance_converges_to_the_profile(chain):
    profile = profile_of(TABLE)
    measured = simulate(profile, 24, chain, steps=250, seed=1)
    n, k = measured.proposed, measured.accepted
    expected = TABLE[: n.shape[0], : n.shape[1]]
    seen = n > 0
    assert seen[:, 0].all()  # every depth's rank 0 proposed
    if not chain:
        assert seen.sum() >= 8
    # binomial bounds, 5 sigma (+1 for tiny counts): a replay off by a few per cent fails them
    bound = 5 * np.sqrt(n * expected * (1 - expected)) + 1
    assert (np.abs(k - n * expected)[seen] <= bound[seen]).all(), (k / np.maximum(n, 1), expected)
    # the same bounds reject a profile that is not the one replayed
    wrong = expected.copy()
    wrong[0, 0] -= 0.05
    assert (np.abs(k - n * wrong) > bound)[0, 0]


def test_replay_is_lossless_through_the_engine_and_the_recorder_counts_it():
    config = HybridConfig(vocab_size=40, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                          num_attention_heads=2, num_key_value_heads=1, head_dim=16, linear_num_key_heads=2,
                          linear_num_value_heads=2, linear_key_head_dim=8, linear_value_head_dim=8, num_experts=0,
                          layer_types=("linear_attention", "full_attention"))
    model = build_random(config, seed=2)
    target = ReferenceTarget(model, num_slots=3, max_seq_len=64)
    rng = np.random.default_rng(0)
    prompts = [rng.integers(0, 40, size=n).tolist() for n in (5, 3, 6)]
    params = SamplingParams(max_new_tokens=14)
    ar = [r.tokens for r in Engine(target, mode="autoregressive").generate(prompts, params)]
    oracle = {tuple(p): t for p, t in zip(prompts, ar)}
    profile = profile_of(TABLE)
    for mode in ("chain", "tree"):
        out = Engine(target, ReplayDrafter(profile, oracle, 40, seed=3), mode=mode, budget="fixed",
                     max_nodes=8).generate(prompts, params)
        assert [r.tokens for r in out] == ar
    recorded, results = record_acceptance(target, ReplayDrafter(profile, oracle, 40, seed=4), prompts, 14, 8)
    assert [r.tokens for r in results] == ar
    # every accepted token the engine counted is one accepted candidate of the profile, and every step's root
    # candidates were counted once at depth 1
    assert recorded.accepted.sum() == sum(r.accepted for r in results) > 0
    assert recorded.proposed[0, 0] == recorded.meta["steps"] == sum(r.steps for r in results)


# ------------------------------------------------------------------------------------------------ real text
@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """A tiny random qwen3_5_text checkpoint (with an MTP head) and a tokenizer trained here, with workloads built
    from standard-library files."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("tokenizers")
    pytest.importorskip("transformers")
    import sysconfig

    from lumotree.training.corpus import Source, collect
    from lumotree.training.model import HybridLM, save_checkpoint
    from lumotree.training.tokenizer import save_tokenizer, train_tokenizer
    from lumotree.workloads import write_workloads

    stdlib = sysconfig.get_paths()["stdlib"]
    files = collect([Source("json", f"{stdlib}/json")])
    tokenizer = train_tokenizer([f.text for f in files], vocab_size=300)
    config = HybridConfig(model_type="qwen3_5_text", vocab_size=tokenizer.get_vocab_size(), hidden_size=32,
                          num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                          linear_key_head_dim=16, linear_value_head_dim=16, linear_num_key_heads=2,
                          linear_num_value_heads=4, intermediate_size=48, num_experts=0, mtp_num_hidden_layers=1,
                          tie_word_embeddings=True, partial_rotary_factor=0.5)
    model = HybridLM(config, backend="torch")
    model.initialize(0, std=0.3)
    path = tmp_path_factory.mktemp("organism")
    save_checkpoint(model, path, dtype=torch.float32)
    save_tokenizer(tokenizer, path, model_max_length=512)
    write_workloads(path / "workloads", files, n=2, seed=0)
    return path


def test_real_text_every_drafter_equals_autoregressive(checkpoint, tmp_path, capsys):
    drafters = ("ngram", "suffix", "layer-skip", *(("mtp",) if "mtp" in DRAFTERS else ()))  # mtp: when registered
    out, profiles = tmp_path / "e2e_real.json", tmp_path / "profiles"
    code = main(["bench", "e2e", "--model", str(checkpoint), "--backend", "reference", "--workload", "edit",
                 str(checkpoint / "workloads" / "completion.jsonl"), "--batches", "1", "2", "--new-tokens", "8",
                 "--max-prompt-tokens", "24", "--drafters", *drafters, "--repeats", "1",
                 "--max-nodes", "8", "--record-nodes", "8", "--profile-time-limit", "5", "--out", str(out),
                 "--profile-dir", str(profiles)])
    assert code == 0
    summary = json.loads(out.read_text())
    runs = summary["results"]
    assert {(r["workload"], r["B"], r["label"]) for r in runs} == {
        (w, b, label) for w in ("edit", "completion") for b in (1, 2)
        for label in ("autoregressive", *(f"{m} {d}" for d in drafters
                                          for m in ("chain", "tree")))}
    assert all(r["equal_to_ar"] for r in runs)
    assert {key.split(",")[0] for key in summary["draft_seconds"]} == set(drafters)  # every drafter's time kept
    for r in runs:
        assert sum(r["budget_choices"].values()) == r["steps"] and r["tokens_per_s"] > 0
        assert r["host_ms_per_step"] >= 0 and r["declined_draft_ms"] >= 0  # the step but its draft and model call
        assert r["declined_drafts"] <= r["budget_choices"].get("autoregressive", 0)
    assert not (tmp_path / "e2e_real.json.part").exists()  # written whole after every run, then replaced
    for w in ("edit", "completion"):
        for d in drafters:
            entry = summary["acceptance_profiles"][w][d]
            assert entry["meta"]["equal_to_ar"] and entry["meta"]["drafter"] == d
            loaded = AcceptanceProfile.load(profiles / f"{w}-{d}.json")
            assert (loaded.proposed == np.array(entry["proposed"])).all()
    assert "| edit | 1 | tree layer-skip |" in capsys.readouterr().out
    # the cost profile of the first run reused (no measurement), one drafter, one batch
    again = tmp_path / "again.json"
    assert main(["bench", "e2e", "--model", str(checkpoint), "--backend", "reference", "--workload", "tool_loop",
                 "--batches", "2", "--new-tokens", "6", "--max-prompt-tokens", "24", "--drafters", "ngram",
                 "--repeats", "1", "--max-nodes", "8", "--record-nodes", "8", "--cost-profile", str(out),
                 "--explain-differences", "2", "--out", str(again)]) == 0
    second = json.loads(again.read_text())
    assert second["logit_error"] == 0.0  # the reference backend against the reference: the same float64 sums
    assert second["cost_profile"] == summary["cost_profile"]
    assert [r["label"] for r in second["results"]] == ["autoregressive", "chain ngram", "tree ngram"]
    assert all(r["equal_to_ar"] for r in second["results"])


def test_difference_explainer_reports_the_reference_gap_at_the_first_difference(checkpoint):
    from lumotree.optimized.engine.e2e_real import DifferenceExplainer
    from lumotree.reference.model import load_pretrained

    ref = load_pretrained(checkpoint)
    prompt = [5, 17, 42, 7, 99, 3]
    ar, cache = [], ref.new_cache()
    logits = ref.forward(prompt, cache)
    for _ in range(4):
        ar.append(int(np.argmax(logits[-1])))
        logits = ref.forward([ar[-1]], cache)
    other = (ar[2] + 1) % ref.config.vocab_size
    explainer = DifferenceExplainer(str(checkpoint), limit=1)
    got = explainer.explain([prompt, prompt, prompt], [ar, ar[:2] + [other, 0], ar[:1] + [0]], [ar, ar, ar], [1, 2])
    before = np.sort(ref.forward(prompt + ar[:2], ref.new_cache())[-1])  # the logits that chose ar[2]
    assert got == [{"request": 1, "position": 2, "autoregressive_token": ar[2], "token": other,
                    "top2_gap_float64": float(before[-1] - before[-2])}]  # the limit: request 2 not explained
    assert got[0]["top2_gap_float64"] > 0


@pytest.mark.gpu
def test_real_text_on_the_runtime_equals_autoregressive(checkpoint, tmp_path):
    """The optimized backend (CUDA graphs, fp32) on the same checkpoint: every drafter's chain and tree output equals
    autoregressive decoding at B = 1 and 4, and the acceptance profiles are recorded."""
    drafters = ("ngram", "suffix", "layer-skip", *(("mtp",) if "mtp" in DRAFTERS else ()))
    out = tmp_path / "e2e_real.json"
    assert main(["bench", "e2e", "--model", str(checkpoint), "--device", "cuda", "--dtype", "float32", "--workload",
                 "edit", "tool_loop", "--batches", "1", "4", "--new-tokens", "24", "--max-prompt-tokens", "64",
                 "--drafters", *drafters, "--repeats", "1", "--max-nodes", "16", "--record-nodes", "16",
                 "--out", str(out)]) == 0
    summary = json.loads(out.read_text())
    assert len(summary["results"]) == 2 * 2 * (1 + 2 * len(drafters))
    assert not [n for n in summary["notes"] if "failed" in n or "not available" in n], summary["notes"]
    assert all(r["equal_to_ar"] for r in summary["results"]), [r["label"] for r in summary["results"]
                                                               if not r["equal_to_ar"]]
    assert all(summary["acceptance_profiles"][w][d]["meta"]["equal_to_ar"] for w in ("edit", "tool_loop")
               for d in drafters)


def test_real_text_cost_profile_error(checkpoint, tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text('{"decode_s": 1}')
    assert main(["bench", "e2e", "--model", str(checkpoint), "--backend", "reference", "--workload", "edit",
                 "--cost-profile", str(bad), "--out", str(tmp_path / "o.json")]) != 0
    assert "--cost-profile" in capsys.readouterr().err


@pytest.mark.parametrize("argv, words", [
    (["--model", "/nonexistent"], "not a checkpoint directory"),
    (["--replay", "/nonexistent.json"], "--replay"),
    (["--model", "/nonexistent", "--replay", "p.json"], "--model"),
])
def test_real_text_argument_errors(capsys, argv, words):
    assert main(["bench", "e2e", "--config", "tiny", *argv]) != 0
    assert words in capsys.readouterr().err
