"""The EAGLE head and the router on the GPU (``pytest -m gpu``).

- The optimized EAGLE head in bf16 with CUDA graphs against the float64 reference head on the same bf16-rounded
  weights (relative L2 <= 3e-2, the model's own bf16 parity bound), through a captured and a replayed graph.
- On the trained organism (``models/organism`` with its ``eagle/`` head, when present), fp32 with CUDA graphs: greedy
  tree speculation with the EAGLE drafter and with the router emits the autoregressive tokens; the accepted lengths
  and the router's picks and payoff errors are reported (``$OUT/gpu_eagle_router_organism.json``).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from lumotree.optimized import model as om
from lumotree.optimized.engine import Engine
from lumotree.optimized.engine.eagle import EagleDrafter, optimized_eagle_head
from lumotree.optimized.engine.router_training import learned_drafter
from lumotree.reference.config import HybridConfig
from lumotree.reference.eagle import EagleHead
from lumotree.reference.tree import TokenTree
from organism_greedy import ORGANISM, organism_greedy
from test_engine_optimized import GPU_CFG, _bf16_rounded_reference, _report
from test_mtp_gpu import BF16_BOUND, rel

pytestmark = pytest.mark.gpu


def test_gpu_eagle_head_matches_the_reference_bf16(tmp_path):
    from safetensors.torch import save_file

    from lumotree.reference.eagle import EAGLE_FORMAT, eagle_tensor_shapes

    config = HybridConfig(**GPU_CFG)
    ref, tensors = _bf16_rounded_reference(config, seed=7)
    rng = np.random.default_rng(1)
    shapes = eagle_tensor_shapes(config, config.intermediate_size)
    head_tensors = {name: torch.from_numpy(rng.standard_normal(shape) * (0.1 if len(shape) == 1 else
                                                                         shape[-1] ** -0.5))
                    .to(torch.bfloat16).float() for name, shape in shapes.items()}
    save_file({k: v.contiguous() for k, v in head_tensors.items()}, str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text(
        f'{{"format": "{EAGLE_FORMAT}", "hidden_size": {config.hidden_size}, '
        f'"intermediate_size": {config.intermediate_size}, "vocab_size": {config.vocab_size}}}')
    opt = om.OptimizedModel(config, tensors, num_slots=2, max_seq_len=256, max_nodes=32, graphs=True)
    head, _ = optimized_eagle_head(opt, tmp_path)
    exact = EagleHead(ref, tmp_path)
    prompt = rng.integers(0, config.vocab_size, 70).tolist()
    _, hidden = ref.forward(prompt, ref.new_cache(), return_hidden=True)  # [T, D]
    cache = exact.new_cache()
    exact.forward(hidden[:-1], prompt[1:], cache)
    parents = [-1, 0, 0, 1, 1, 2, 3]
    tokens = rng.integers(0, config.vocab_size, len(parents)).tolist()
    node_hidden = rng.standard_normal((len(parents), config.hidden_size))
    want_logits, want_g = exact.tree(node_hidden, tokens, TokenTree(parents, tokens), cache)
    head.reset(0)
    head.extend([0], [prompt[1:]], [torch.from_numpy(hidden[:-1]).to("cuda", torch.bfloat16)])
    for _ in range(2):  # captured, then replayed
        g, logits = head.tree(torch.tensor([0]), torch.tensor([tokens]), torch.tensor([parents], dtype=torch.int32),
                              torch.tensor([len(parents)], dtype=torch.int32),
                              torch.from_numpy(node_hidden)[None].to("cuda", torch.bfloat16),
                              torch.arange(len(parents))[None])
        assert rel(g[0].float().cpu(), want_g) <= BF16_BOUND
        assert rel(logits[0].float().cpu(), want_logits) <= BF16_BOUND


@pytest.mark.skipif(not (ORGANISM / "eagle" / "config.json").exists(),
                    reason="no trained organism with an EAGLE head under models/organism")
def test_gpu_eagle_and_router_on_the_organism_equal_autoregressive_fp32():
    prompts, params, target, ar = organism_greedy()
    report = {}
    for name in ("eagle", "router"):
        spec_target = target()
        drafter = EagleDrafter(spec_target, ORGANISM / "eagle") if name == "eagle" else \
            learned_drafter("router", spec_target, model_dir=ORGANISM,
                            router=ORGANISM / "router.json" if (ORGANISM / "router.json").exists() else None)
        engine = Engine(spec_target, drafter, mode="tree", budget="fixed", max_nodes=32)
        out = [r.tokens for r in engine.generate(prompts, params)]
        report[name] = {"mean_accepted": engine.stats.summary()["mean_accepted"]}
        if name == "router":
            report[name].update(drafter.summary())
        assert out == ar, (name, report)
    _report("gpu_eagle_router_organism", report)
