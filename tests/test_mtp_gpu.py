"""The MTP drafter on the GPU (``pytest -m gpu``): bf16 with CUDA graphs.

- The head's logits and outputs and the target's hidden states against the float64 reference on the same
  bf16-rounded weights (relative L2 error <= 3e-2, the bound of the model's own bf16 parity test), through a captured
  and a replayed graph of each shape.
- Greedy chain and tree speculation with the MTP drafter emit the autoregressive tokens on a greedy-stable model
  (``successor=True``), both with a head that drafts the continuation (every draft accepted but for bf16 near-ties:
  deep accepted paths) and with a random head (mostly rejected drafts).
- Sampled MTP chains stay lossless with every tensor on the device (chi-square against the exact distribution).
- On the trained organism (``models/organism``, when present), fp32 with CUDA graphs: greedy chain and tree
  speculation with its trained MTP head emit the autoregressive tokens; the accepted lengths are reported.

Results go to ``$OUT/gpu_mtp_*.json`` when ``OUT`` is set.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from lumotree.optimized import model as om
from lumotree.optimized.engine import Engine, MTPDrafter, OptimizedTarget, SamplingParams
from lumotree.reference import model as rm
from lumotree.reference.config import HybridConfig
from lumotree.reference.mtp import MTPHead
from lumotree.reference.tree import TokenTree
from organism_greedy import ORGANISM, organism_greedy
from strategies import chi_square_pvalue
from test_engine_optimized import GPU_CFG, _bf16_rounded_reference, _report
from test_mtp import VOCAB4, exact_autoregressive

pytestmark = pytest.mark.gpu
MTP_CFG = {**GPU_CFG, "mtp_num_hidden_layers": 1}
VOCAB4_KERNELS = {**VOCAB4, "hidden_size": 32, "head_dim": 16, "linear_key_head_dim": 16, "linear_value_head_dim": 16}
BF16_BOUND = 3e-2  # relative L2 error of bf16 activations against float64 (the model's own parity bound)


def rel(got, want) -> float:
    got, want = np.asarray(got, dtype=np.float64), np.asarray(want, dtype=np.float64)
    return float(np.linalg.norm(got - want) / np.linalg.norm(want))


def test_gpu_mtp_head_matches_the_reference_bf16():
    config = HybridConfig(**MTP_CFG)
    ref, tensors = _bf16_rounded_reference(config, seed=7)
    opt = om.OptimizedModel(config, tensors, num_slots=2, max_seq_len=256, max_nodes=32, graphs=True)
    head, ref_head = opt.mtp_head(), MTPHead(ref)
    rng = np.random.default_rng(0)
    prompt = rng.integers(0, config.vocab_size, 70).tolist()
    cache = ref.new_cache()
    _, hidden = ref.forward(prompt, cache, return_hidden=True)  # [T, D]
    opt.prefill(1, prompt)
    got_hidden = opt.hidden_states(1, len(prompt)).double().cpu().numpy()
    report = {"hidden": rel(got_hidden, hidden)}
    head.reset(1)
    head.extend([1], [prompt[1:]], [opt.hidden_states(1, len(prompt))[:-1]])  # chunks of max_nodes pairs
    mtp_cache = ref_head.new_cache()
    ref_head.forward(hidden[:-1], prompt[1:], mtp_cache)
    N = 24
    parents = [-1] + [int(rng.integers(0, i)) for i in range(1, N)]
    tree = TokenTree(parents, [int(t) for t in rng.integers(0, config.vocab_size, N)])
    tree_hidden = torch.from_numpy(hidden[rng.integers(0, len(prompt), N)]).to(torch.bfloat16)  # [N, D]
    tree_hidden[0] = torch.from_numpy(hidden[-1]).to(torch.bfloat16)
    want_logits, want_g = ref_head.tree(tree_hidden.double().numpy(), tree.tokens, tree, mtp_cache)
    dev = opt.device
    args = (torch.tensor([1], device=dev), torch.tensor([tree.tokens], device=dev),
            torch.tensor([tree.parents], dtype=torch.int32, device=dev),
            torch.tensor([N], dtype=torch.int32, device=dev),
            tree_hidden[None].to(dev), torch.arange(N, device=dev)[None])
    for call in ("capture", "replay"):
        g, logits = head.tree(*args)
        report[f"logits_{call}"] = rel(logits[0].double().cpu().numpy(), want_logits)
        report[f"g_{call}"] = rel(g[0].double().cpu().numpy(), want_g)
    _report("gpu_mtp_parity", report)
    assert max(report.values()) < BF16_BOUND, report


@pytest.mark.parametrize("head_kind", ["echo", "random"])
def test_gpu_greedy_mtp_speculation_equals_autoregressive(head_kind):
    config = HybridConfig(**MTP_CFG)
    tensors = om.random_tensors(config, 5, "cuda", torch.float32, successor=True)
    D = config.hidden_size
    if head_kind == "echo":  # fc = [I, 0.05 R]: the head passes the next token's embedding on (argmax pi(x))
        noise = torch.randn((D, D), generator=torch.Generator("cuda").manual_seed(1), device="cuda") / D ** 0.5
        tensors["mtp.fc.weight"] = torch.cat([torch.eye(D, device="cuda"), 0.05 * noise], 1)  # [D, 2D]
    tensors = {name: t.to(torch.bfloat16) for name, t in tensors.items()}
    rng = np.random.default_rng(1)
    prompts = [rng.integers(0, config.vocab_size, size=int(rng.integers(8, 40))).tolist() for _ in range(8)]
    params = SamplingParams(max_new_tokens=48)

    def target():
        return OptimizedTarget(om.OptimizedModel(config, tensors, num_slots=8, max_seq_len=256, max_nodes=32),
                               validate=False)

    ar = [r.tokens for r in Engine(target(), mode="autoregressive").generate(prompts, params)]
    report = {}
    for mode, options in (("chain", dict(depth=4)), ("tree", dict(depth=4, top_k=3))):
        spec_target = target()
        engine = Engine(spec_target, MTPDrafter(spec_target, **options), mode=mode, budget="fixed", max_nodes=32)
        out = [r.tokens for r in engine.generate(prompts, params)]
        report[mode] = {"mean_accepted": engine.stats.summary()["mean_accepted"],
                        "same_tokens": sum(a == b for a, b in zip(out, ar))}
        assert out == ar, (mode, report)
        if head_kind == "echo":
            assert report[mode]["mean_accepted"] > 3.0, report
    _report(f"gpu_mtp_greedy_{head_kind}", report)


def test_gpu_sampled_mtp_chains_are_lossless():
    model = rm.build_random(HybridConfig(**VOCAB4_KERNELS), seed=2)  # four tokens; head dims the kernels take
    prompt, horizon, copies = [1, 2, 3, 1, 2], 3, 2000
    params = [SamplingParams(temperature=1.2, top_p=0.9, seed=10_000 + i, max_new_tokens=horizon)
              for i in range(copies)]
    exact = exact_autoregressive(model, prompt, horizon, params[0])
    keys = sorted(exact)
    opt = om.from_reference(model, num_slots=256, max_seq_len=16, max_nodes=4, dtype=torch.float32, device="cuda")
    target = OptimizedTarget(opt, validate=False)
    engine = Engine(target, MTPDrafter(target, depth=2, sampled=True), mode="chain", budget="fixed", max_nodes=4)
    results = engine.generate([prompt] * copies, params)
    seen: dict[tuple[int, ...], int] = {}
    for r in results:
        seen[tuple(r.tokens)] = seen.get(tuple(r.tokens), 0) + 1
    assert set(seen) <= set(keys)
    pvalue = chi_square_pvalue(np.array([seen.get(k, 0) for k in keys], dtype=np.float64),
                               np.array([exact[k] for k in keys]))
    _report("gpu_mtp_lossless", {"pvalue": pvalue, "accepted": sum(r.accepted for r in results)})
    assert sum(r.accepted for r in results) > copies // 4
    assert pvalue > 1e-3


@pytest.mark.skipif(not (ORGANISM / "config.json").exists(), reason="no trained organism under models/organism")
def test_gpu_mtp_on_the_organism_equals_autoregressive_fp32():
    prompts, params, target, ar = organism_greedy()
    report = {}
    for mode, options in (("chain", dict(depth=3)), ("tree", dict(depth=3, top_k=2)), ("tree-wide",
                                                                                      dict(depth=4, top_k=4))):
        spec_target = target()
        engine = Engine(spec_target, MTPDrafter(spec_target, **options), mode=mode.split("-")[0], budget="fixed",
                        max_nodes=32)
        out = [r.tokens for r in engine.generate(prompts, params)]
        report[mode] = {"mean_accepted": engine.stats.summary()["mean_accepted"], **options}
        assert out == ar, (mode, report)
    _report("gpu_mtp_organism", report)
