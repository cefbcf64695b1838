"""bench/roofline.py: its work counts against the model's real weights, and the verdicts the docs quote."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
from pathlib import Path

import numpy as np

from lumotree.reference.config import HybridConfig
from lumotree.reference.model import build_random, weights_to_tensors

BENCH = Path(__file__).resolve().parents[1] / "bench"
_spec = importlib.util.spec_from_file_location("roofline", BENCH / "roofline.py")
roofline = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(roofline)

TINY = dict(vocab_size=37, hidden_size=16, intermediate_size=24, num_hidden_layers=4, num_attention_heads=4,
            num_key_value_heads=2, head_dim=8, linear_key_head_dim=8, linear_value_head_dim=8,
            linear_num_key_heads=2, linear_num_value_heads=4, num_experts=0)


def matrix_sizes(config: HybridConfig) -> dict[str, int]:
    """Sizes of the 2-D arrays of a real (random) model of ``config``, embedding left out."""
    tensors = weights_to_tensors(build_random(config, seed=1).weights, config)
    return {n: int(np.asarray(t).size) for n, t in tensors.items()
            if np.asarray(t).ndim == 2 and n != "model.embed_tokens.weight"}


def test_dense_matmul_params_are_the_models_matrices():
    config = HybridConfig(**TINY)
    assert roofline.matmul_params_per_token(config) == sum(matrix_sizes(config).values())
    assert roofline.weight_bytes(config) == 2 * sum(matrix_sizes(config).values())


def test_moe_counts_only_the_routed_experts():
    """All experts active: every matrix; one active: the other experts' three matrices per MoE layer drop out."""
    moe = dict(TINY, num_experts=4, moe_intermediate_size=6, shared_expert_intermediate_size=10)
    everything = HybridConfig(**moe, num_experts_per_tok=4)
    sizes = matrix_sizes(everything)
    assert roofline.matmul_params_per_token(everything) == sum(sizes.values())
    one = dataclasses.replace(everything, num_experts_per_tok=1)
    per_expert = 3 * one.hidden_size * one.moe_intermediate_size
    moe_layers = sum(one.is_moe_layer(i) for i in range(one.num_hidden_layers))
    assert moe_layers == one.num_hidden_layers
    assert roofline.matmul_params_per_token(one) == sum(sizes.values()) - moe_layers * 3 * per_expert


def test_bench_model_count_matches_the_gpu_runs_parameter_count():
    """The bench model's parameter count as ``bench/model_verify.py`` counted the GPU model's tensors (embedding, LM
    head, layers, MLPs: the final norm is not in that count), less the tensors that are no matmul."""
    run = json.loads((roofline.RESULTS / roofline.SOURCES["model_b16"]).read_text())
    config = HybridConfig(**run["config"])
    D, layers = config.hidden_size, config.num_hidden_layers
    gdn_layers = config.layer_types.count("linear_attention")
    spec = config.gdn_spec()
    conv = spec.weight_shapes()["conv1d"]
    not_matmul = (config.vocab_size * D + 2 * layers * D  # embedding, per-layer norms
                  + gdn_layers * (conv[0] * conv[1] + 2 * config.linear_num_value_heads + config.linear_value_head_dim)
                  + (layers - gdn_layers) * 2 * config.head_dim)  # attention q / k norms
    assert roofline.matmul_params_per_token(config) == run["params"] - not_matmul


def test_committed_verdicts():
    """The docs' reading of the committed runs: the B = 16 targets of issue 6 are below the H200's bounds, the
    B = 1 ones and issue 5's are not."""
    verdicts = {(t.issue, t.name.split(",")[0], t.name.split(",")[1].strip()): roofline.assess(t)["feasible"]
                for t in roofline.targets()}
    assert verdicts[(6, "whole-model verify", "B = 16")] is False
    assert verdicts[(6, "tree attention", "B = 16")] is False
    assert verdicts[(6, "whole-model verify", "B = 1")] is True
    assert verdicts[(6, "tree attention", "B = 1")] is True
    assert verdicts[(5, "GDN verify + commit", "B = 64")] is True
    assert verdicts[(5, "GDN verify + commit", "B = 1")] is True
