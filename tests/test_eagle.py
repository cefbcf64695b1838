"""The EAGLE-style draft head: the training model's head equals the exact float64 head; training on a frozen tiny
target lowers EAGLE's loss and raises the head's agreement with the target above an untrained head's; the drafter's
calibrated confidences; greedy speculation through the engine equals autoregressive decoding on the reference and (one
small case) on the optimized model under the interpreter; ``lumotree generate --drafter eagle``."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

pytest.importorskip("safetensors")

from lumotree.cli import main  # noqa: E402
from lumotree.optimized.engine import Engine, OptimizedTarget, ReferenceTarget, SamplingParams  # noqa: E402
from lumotree.optimized.engine.drafters import make_drafter  # noqa: E402
from lumotree.optimized.engine.eagle import (EagleDrafter, ReferenceEagleHead, calibrated_confidences,  # noqa: E402
                                             optimized_eagle_head)
from lumotree.reference.config import HybridConfig  # noqa: E402
from lumotree.reference.eagle import EagleHead, calibrate  # noqa: E402
from lumotree.reference.model import load_pretrained  # noqa: E402
from lumotree.training.eagle import (EagleTraining, eagle_outputs, new_eagle_head, save_eagle,  # noqa: E402
                                     train_eagle)
from lumotree.training.model import HybridLM, load_checkpoint, save_checkpoint  # noqa: E402

TINY = dict(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
            layer_types=("linear_attention", "full_attention"), num_attention_heads=4, num_key_value_heads=2,
            head_dim=16, linear_key_head_dim=16, linear_value_head_dim=16, linear_num_key_heads=2,
            linear_num_value_heads=4, rope_theta=1000.0, num_experts=0, mtp_num_hidden_layers=0,
            model_type="qwen3_5_text", partial_rotary_factor=0.5)


pytestmark = pytest.mark.usefixtures("one_torch_thread")  # conftest.py


def tiny_target(path, seed: int = 0):
    """A random tiny Qwen3.5 checkpoint with peaked next-token distributions (larger init)."""
    model = HybridLM(HybridConfig(**TINY), backend="torch")
    model.initialize(seed, std=0.2)
    save_checkpoint(model, path, dtype=torch.float32)
    return path


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A tiny target and its EAGLE head trained for 30 steps on random token windows: (model dir, record)."""
    path = tiny_target(tmp_path_factory.mktemp("eagle") / "target")
    stream = np.random.default_rng(0).integers(0, 64, 6000)
    cfg = EagleTraining(steps=30, batch_size=4, seq_len=32, lr=3e-3, eval_tokens=660)
    with torch.enable_grad():
        record = train_eagle(path, stream=stream, cfg=cfg, device="cpu", progress=None)
    return path, record


def test_the_training_head_is_the_reference_head(tmp_path):
    """The autograd head (float64 weights; its norms compute in float32, as the training model's do) on the target's
    hidden states equals the exact float64 head on the reference model's hidden states of the saved checkpoint: the
    drafter reads the head under the convention it was trained with."""
    path = tiny_target(tmp_path / "target", seed=3)
    target = load_checkpoint(path, backend="torch", dtype=torch.float64)
    head = new_eagle_head(target, seed=5, std=0.2)
    gen = torch.Generator().manual_seed(4)
    with torch.no_grad():
        for p in head.parameters():  # every norm off its identity, so that each one is checked
            if p.ndim == 1:
                p.add_(0.2 * torch.randn(p.shape, generator=gen, dtype=p.dtype))
            p.copy_(p.float().double())  # what the float32 file holds
    save_eagle(head, target, tmp_path / "eagle")
    tokens = torch.tensor([[3, 17, 9, 41, 9, 2, 60, 33, 8, 12, 12]])
    with torch.no_grad():
        hidden = target.hidden(tokens)  # [1, T, D]
        f = eagle_outputs(target, head, hidden[:, :-1], tokens[:, 1:])[0]  # [T - 1, D]
        logits = target.logits(f)  # [T - 1, V]
    model = load_pretrained(path)
    _, ref_hidden = model.forward(tokens[0].tolist(), model.new_cache(), return_hidden=True)  # [T, D]
    exact = EagleHead(model, tmp_path / "eagle")
    want_logits, want_f = exact.forward(ref_hidden[:-1], tokens[0, 1:].tolist(), exact.new_cache())
    assert rel_error(f.numpy(), want_f) < 1e-5
    assert rel_error(logits.numpy(), want_logits) < 1e-5
    # the float64 head is its own tree pass: the chain's logits as a tree, cache untouched
    from lumotree.reference.tree import TokenTree

    tree_logits, _ = exact.tree(ref_hidden[:-1], tokens[0, 1:].tolist(), TokenTree.chain(10), exact.new_cache())
    assert np.abs(tree_logits - want_logits).max() <= 1e-12 * np.abs(want_logits).max()


def rel_error(got, want) -> float:
    got, want = np.asarray(got, dtype=np.float64), np.asarray(want, dtype=np.float64)
    return float(np.abs(got - want).max() / np.abs(want).max())


def test_training_lowers_the_loss_and_beats_an_untrained_head(trained):
    path, record = trained
    before, after = record["heldout_before"], record["heldout"]
    assert after["loss"] < 0.95 * before["loss"]
    assert after["feature"] < before["feature"] and after["token"] < before["token"]
    assert after["agreement"] > 2 * before["agreement"] and after["agreement"] > 0.05
    config = json.loads((path / "eagle" / "config.json").read_text())
    values = config["calibration"]["values"]
    assert len(values) == 10 and all(0 <= v <= 1 for v in values) and values == sorted(values)


def test_calibration_is_monotone_and_maps_path_products():
    p = np.array([0.05, 0.15, 0.15, 0.95, 0.95, 0.95, 0.55])
    hits = np.array([1, 0, 0, 1, 1, 0, 0])
    cal = calibrate(p, hits)
    assert np.all(np.diff(cal["values"]) >= 0)
    assert abs(cal["values"][9] - (2 + 0.95 + 0.85) / 5) < 1e-12  # 2 hits of 3 + the pseudo-hit, pooled with bin 8
    assert abs(cal["values"][0] - (1 + 0.05 + 0.15) / 5) < 1e-12  # bins 0 and 1 pooled
    flat = {"edges": [0.0, 0.5, 1.0], "values": [0.2, 0.6]}
    conf = calibrated_confidences([-1, 0, 1, 0], np.array([1.0, 0.8, 0.2, 0.1]), flat)
    # node 1: q = 0.8 -> 0.6; node 2: q = 0.25 -> 0.2 under node 1; node 3: q = 0.1 -> 0.2
    assert np.allclose(conf, [1.0, 0.6, 0.12, 0.2])


def greedy(target_factory, drafter_factory, prompts, mode, max_nodes=8, new=10):
    params = SamplingParams(max_new_tokens=new)
    target = target_factory()
    drafter = drafter_factory(target) if drafter_factory else None
    engine = Engine(target, drafter, mode=mode, budget="fixed", max_nodes=max_nodes)
    return [r.tokens for r in engine.generate(prompts, params)], engine


def test_greedy_eagle_speculation_equals_autoregressive_on_the_reference(trained):
    path, _ = trained
    model = load_pretrained(path)
    prompts = [[3, 17, 9, 41, 9, 2], [60, 33], [5, 5, 5, 5, 5]]
    make = lambda: ReferenceTarget(model, 3, 64, 16)  # noqa: E731
    want, _ = greedy(make, None, prompts, "autoregressive")
    for mode in ("chain", "tree"):
        for calibrated in (True, False):
            got, engine = greedy(make, lambda t: EagleDrafter(t, path / "eagle", depth=3, top_k=3,
                                                              calibrated=calibrated), prompts, mode)
            assert got == want, (mode, calibrated)
    assert isinstance(make_drafter("eagle", target=make(), eagle=path / "eagle"), EagleDrafter)


def test_greedy_eagle_trees_on_the_optimized_model(trained):
    """fp32 optimized model and head under the interpreter: tree speculation emits the reference's greedy tokens, and
    the head's features and logits on a cached context and a branching tree match the exact head's."""
    from lumotree.optimized.model import load_pretrained as load_optimized

    path, _ = trained
    prompts = [[3, 17, 9, 41], [60, 33]]
    want, _ = greedy(lambda: ReferenceTarget(load_pretrained(path), 2, 32, 8), None, prompts, "autoregressive",
                     new=4)
    model = load_optimized(path, num_slots=2, max_seq_len=32, max_nodes=8, graphs=False, dtype=torch.float32)
    got, _ = greedy(lambda: OptimizedTarget(model), lambda t: EagleDrafter(t, path / "eagle", depth=2, top_k=2),
                    prompts, "tree", new=4)
    assert got == want
    # the optimized head (fp32 kernels) against the exact one: 5 cached entries, then a branching 4-node tree
    head, _ = optimized_eagle_head(model, path / "eagle")
    exact = ReferenceEagleHead(load_pretrained(path), path / "eagle", 2, 8)
    rng = np.random.default_rng(2)
    cached = torch.from_numpy(rng.standard_normal((5, 32)))  # [5, D]
    nodes = torch.from_numpy(rng.standard_normal((1, 4, 32)))  # [1, 4, D]
    tokens, parents = torch.tensor([[7, 1, 2, 3]]), torch.tensor([[-1, 0, 0, 1]], dtype=torch.int32)
    outs = []
    for h in (head, exact):
        h.reset(1)
        h.extend([1], [[4, 8, 15, 16, 23]], [cached.to(getattr(h, "dtype", torch.float64))])
        outs.append(h.tree(torch.tensor([1]), tokens, parents, torch.tensor([4], dtype=torch.int32),
                           nodes.to(h.dtype), torch.tensor([[0, 1, 2, 3]])))
    assert rel_error(outs[0][0].double().numpy(), outs[1][0].numpy()) < 1e-5  # features
    assert rel_error(outs[0][1].double().numpy(), outs[1][1].numpy()) < 1e-5  # logits


def test_generate_with_the_eagle_drafter(trained, tmp_path, capsys):
    path, _ = trained
    out = tmp_path / "out.json"
    tokens = {}
    for spec in ("none", "tree"):
        code = main(["generate", "--model", str(path), "--backend", "reference", "--spec", spec, "--drafter", "eagle",
                     "--budget", "fixed", "--max-nodes", "8", "--max-new-tokens", "8", "--prompt", "3 17 9 41",
                     "--json", str(out), "--quiet"])
        assert code == 0, capsys.readouterr().err
        tokens[spec] = json.loads(out.read_text())["results"][0]["tokens"]
    assert tokens["tree"] == tokens["none"] and len(tokens["none"]) == 8
    assert main(["generate", "--model", str(path), "--backend", "reference", "--drafter", "eagle", "--eagle",
                 str(tmp_path), "--prompt", "1 2"]) == 2
    assert "no EAGLE head" in capsys.readouterr().err
    assert main(["generate", "--model", str(path), "--backend", "reference", "--drafter", "ngram", "--eagle",
                 str(path / "eagle"), "--prompt", "1 2"]) == 2
    assert "--eagle applies to" in capsys.readouterr().err


def test_bad_heads_are_refused(trained, tmp_path):
    path, _ = trained
    with pytest.raises(FileNotFoundError, match="eagle"):
        EagleHead(load_pretrained(path), tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"format": "something-else"}))
    with pytest.raises(ValueError, match="not an EAGLE head"):
        EagleHead(load_pretrained(path), tmp_path)
    with pytest.raises(ValueError, match="top_k"):
        EagleDrafter(ReferenceTarget(load_pretrained(path), 1, 32, 8), path / "eagle", top_k=0)
    with pytest.raises(ValueError, match="steps"):
        EagleTraining()
