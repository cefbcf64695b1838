"""The learned-separation models: the torch layers compute exactly what the reference model computes on the same
weights, budgets are balanced, and the experiment plumbing (train, evaluate, plot) runs end to end."""

import json

import numpy as np
import pytest
import torch

from lumotree.expressivity import adversary, learned, task
from lumotree.expressivity.task import TaskSpec

VOCAB = task.NUM_SPECIAL + 6 + 5


@pytest.mark.parametrize("kind", learned.KINDS)
def test_torch_model_matches_the_reference_model(kind):
    spec = learned.ModelSpec(kind, VOCAB, d_model=16, heads=2, head_k=4, head_v=4, att_heads=2, att_head_dim=8, mlp=24)
    model = learned.build(spec, seed=1).double()
    with torch.no_grad():  # make the gates non-trivial: beta near 2 for the (0, 2) kinds, real decay
        for block in model.blocks:
            if hasattr(block.mixer, "A_log"):
                block.mixer.w_b.mul_(8.0)
                block.mixer.dt_bias.fill_(1.0)
    reference = learned.to_reference(model)
    for inst in task.generate(TaskSpec(7, 3, 6, 5), 3, seed=2):
        with torch.no_grad():
            ours = model(torch.from_numpy(inst.tokens[None]))[0].numpy()
        theirs = reference.forward(inst.tokens, reference.new_cache())
        assert np.abs(ours - theirs).max() < 1e-10


def test_budgets_are_balanced():
    specs = learned.balanced_specs(VOCAB, 32)
    counts = {k: learned.parameter_count(learned.build(s)) for k, s in specs.items()}
    assert max(counts.values()) / min(counts.values()) < 1.05


def test_experiment_runs_end_to_end(tmp_path):
    results = learned.run_experiment(steps=3, n_train=3, m_train=2, eval_ns=[1, 2], eval_ms=[2], count=4, M=6, R=5,
                                     width=16, attack_precisions=())
    assert set(results["models"]) == set(learned.KINDS)
    for kind, entry in results["models"].items():
        assert ("adversary" in entry["runs"][0]) == kind.startswith("gdn")
        rows = entry["runs"][0]["eval"]
        assert [(r["n"], r["m"]) for r in rows] == [(1, 2), (2, 2)]
        assert all(0.0 <= r["accuracy"] <= 1.0 for r in rows)
    path = tmp_path / "plot.png"
    learned.plot(results, path)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    json.dumps(results)


def test_torch_built_pure_gdn_model_is_attackable():
    M, R = 40, 5
    spec = learned.ModelSpec("gdn_beta02", task.NUM_SPECIAL + M + R, d_model=16, heads=1, head_k=4, head_v=4, mlp=16)
    reference = learned.to_reference(learned.build(spec, seed=0))
    report = adversary.attack(reference, "fp8", M, R, birthday_samples=300)
    assert report["found"] and report["counterexample"]["verified"]
