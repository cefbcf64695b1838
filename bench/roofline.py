"""What the hardware allows: lower bounds on the time of each speed target of issues 5 and 6 (no GPU needed).

Every target of those issues is a ratio to a baseline measured in the same run (``ratio x baseline`` = the time the
target allows). For each one this script sets that allowance against the least time *any* exact implementation needs
on the card, from two counts of the work:

- the dense matrix products every exact implementation performs (tensor-core FLOPs at the peak rate): the
  projections, MLP and LM head of every token (a tree step needs logits at every node), each query against each
  committed key and value (tree attention), ``K S0`` and ``Q S0`` per value head (GDN: every node's output reads the
  committed state through its query, every node's update through its key);
- the bytes it must move at least once (at the peak bandwidth): the weights, the KV cache, the recurrent state read
  and written, the token tensors.

``bound = max(flops / peak_flops, bytes / peak_bandwidth)``, at the H200 datasheet peaks (the most favourable to the
target: 989.4 TFLOP/s dense bf16, 494.7 TFLOP/s dense tf32, 4.8 TB/s) and at the rates measured on the card in the
same runs as the baselines. A target whose allowance is below its bound at the datasheet peaks cannot be met by any
implementation on this card: no kernel work closes it. One above its bound says how much of the peak it asks for.

The measured baselines are read from the committed result files (``--results``; the source of each is printed):
``bench/model_verify.py`` (whole model), ``bench/attention_probe.py --cold`` (tree attention against SDPA),
``bench/gdn_tree.py`` (one GDN layer against flash-linear-attention's decode step).

    python bench/roofline.py [--json roofline.json]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any, NamedTuple

from lumotree.reference.config import HybridConfig
from lumotree.reference.model import hf_tensor_shapes

RESULTS = Path(__file__).resolve().parent / "results"

#: H200 SXM datasheet peaks (dense, no sparsity): the most favourable rates a bound can assume.
DATASHEET = {"bf16_flops": 989.4e12, "tf32_flops": 494.7e12, "bandwidth": 4.8e12}

#: the attention probe's shapes (bench/attention_probe.py: Qwen3-Next's gated attention)
ATTENTION = {"q_heads": 16, "kv_heads": 2, "head_dim": 256}

#: committed result files the baselines come from (relative to bench/results)
SOURCES = {
    "model_b16": "2026-12-01j/run5_mv_pairs_B16_N64.json",
    "model_b1": "2026-12-01j/run5_mv_nogate_B1_N64.json",
    "attention": "2026-12-01j/attention_probe_cold_run5.json",
    "gdn": "2026-12-03/gdn_tree_run38.json",  # twenty-first session, the tensor-descriptor defaults (H200)
}


class Target(NamedTuple):
    """One speed target: ``ours <= ratio x baseline``; ``flops`` at ``flops_kind`` and ``bytes`` lower-bound the
    work of ours."""

    issue: int
    name: str
    ratio: float
    baseline_us: float
    baseline: str
    ours_us: float | None
    flops: float
    flops_kind: str  # "bf16_flops" | "tf32_flops"
    bytes: float
    measured_rates: dict[str, float]
    source: str


def matmul_params_per_token(config: HybridConfig) -> int:
    """Weights one token multiplies by: every 2-D weight of the checkpoint except the embedding (a row gather) and,
    in MoE layers, only the router, the shared expert and ``num_experts_per_tok`` experts."""
    total = 0
    expert_params = 0
    for name, shape in hf_tensor_shapes(config).items():
        if len(shape) != 2 or name == "model.embed_tokens.weight":
            continue
        if ".mlp.experts." in name:
            if name.split(".mlp.experts.")[1].startswith("0."):  # count one expert's three matrices per layer
                expert_params += shape[0] * shape[1]
            continue
        total += shape[0] * shape[1]
    return total + expert_params * config.num_experts_per_tok


def weight_bytes(config: HybridConfig, bytes_per_weight: int = 2) -> int:
    """Bytes of the weights a decode step reads (dense MLP: all of them but the embedding's unused rows)."""
    if config.num_experts:
        raise ValueError("weight_bytes: a dense-MLP config only (an MoE decode reads only the experts it routes to)")
    return matmul_params_per_token(config) * bytes_per_weight


def tree_step_flops(config: HybridConfig, tokens: int) -> float:
    """Projection, MLP and LM-head products of ``tokens`` tokens: 2 FLOPs per weight per token."""
    return 2.0 * matmul_params_per_token(config) * tokens


def attention_flops(B: int, N: int, L: int, q_heads: int, head_dim: int) -> float:
    """``q k^T`` and ``p v`` of ``N`` queries per head against ``L`` committed keys (the tree's own keys left out:
    a lower bound)."""
    return 4.0 * B * q_heads * N * L * head_dim


def kv_bytes(B: int, L: int, kv_heads: int, head_dim: int, bytes_per_value: int = 2) -> float:
    """The committed K and V, read once."""
    return 2.0 * B * L * kv_heads * head_dim * bytes_per_value


def gdn_flops(B: int, N: int, HV: int, K: int, V: int) -> float:
    """``K S0`` and ``Q S0`` of every value head (``[N, K] x [K, V]`` each)."""
    return 2.0 * 2.0 * B * HV * N * K * V


def gdn_bytes(B: int, N: int, H: int, HV: int, K: int, V: int, token_bytes: int = 4) -> float:
    """The fp32 state read once and written once, q / k / v in and o out at ``token_bytes``, and each node's fp32
    ``delta`` (what a commit after sampling needs per value head: ``V`` numbers; the rest of the factors, one or two
    numbers a node, left out)."""
    state = 2.0 * B * HV * K * V * 4
    tokens = B * N * (2 * H * K + 2 * HV * V) * token_bytes
    delta = B * N * HV * V * 4
    return state + tokens + delta


def bound_us(flops: float, nbytes: float, rates: dict[str, float], flops_kind: str) -> float:
    return max(flops / rates[flops_kind], nbytes / rates["bandwidth"]) * 1e6


def _load(results: Path, key: str) -> dict[str, Any]:
    return json.loads((results / SOURCES[key]).read_text())


def targets(results: Path = RESULTS) -> list[Target]:
    """The targets of issues 5 and 6 with the baselines of the committed runs."""
    out: list[Target] = []
    for key in ("model_b1", "model_b16"):
        run = _load(results, key)
        config = HybridConfig(**run["config"])
        (row,) = run["rows"]
        B, N = row["B"], row["N"]
        flops = tree_step_flops(config, B * N) + config.layer_types.count("full_attention") * attention_flops(
            B, N, row["L"], config.num_attention_heads, config.head_dim)
        out.append(Target(6, f"whole-model verify, B = {B}, N = {N}, L = {row['L']}", 1.5, row["decode_us"],
                          "the model's decode step", row["verify_us"], flops, "bf16_flops", weight_bytes(config),
                          {"bf16_flops": run["bf16_flops"], "bandwidth": run["copy_bw"]}, SOURCES[key]))
    probe = _load(results, "attention")
    for point in probe["points"]:
        if point["N"] != 64 or point["L"] != 8192:
            continue
        B, N, L = point["B"], point["N"], point["L"]
        out.append(Target(6, f"tree attention, B = {B}, N = {N}, L = {L}", 1.3, point["decode_sdpa_us"],
                          "one SDPA decode over the same cache", point["variants"]["default"]["us"],
                          attention_flops(B, N, L, ATTENTION["q_heads"], ATTENTION["head_dim"]), "bf16_flops",
                          kv_bytes(B, L, ATTENTION["kv_heads"], ATTENTION["head_dim"]), {},
                          SOURCES["attention"]))
    gdn = _load(results, "gdn")
    shapes = gdn["shapes"]
    measured = {"tf32_flops": gdn["tf32_TFLOPs"] * 1e12, "bandwidth": gdn["copy_TBps"] * 1e12}
    for row in gdn["rows"]:
        if row["kind"] != "random" or row["N"] != 64 or row["B"] not in (1, 64):
            continue
        B, N = row["B"], row["N"]
        out.append(Target(5, f"GDN verify + commit, B = {B}, N = {N}, fp32", 3.0 if B == 1 else 2.0, row["ar_us"],
                          "fla's decode step", row["ours_tf32_us"],
                          gdn_flops(B, N, shapes["HV"], shapes["K"], shapes["V"]), "tf32_flops",
                          gdn_bytes(B, N, shapes["H"], shapes["HV"], shapes["K"], shapes["V"]), measured,
                          SOURCES["gdn"]))
    return out


def assess(target: Target) -> dict[str, Any]:
    """The allowance, the bounds and the verdict of one target."""
    allowed = target.ratio * target.baseline_us
    at_datasheet = bound_us(target.flops, target.bytes, DATASHEET, target.flops_kind)
    rates = {**DATASHEET, **target.measured_rates}
    at_measured = bound_us(target.flops, target.bytes, rates, target.flops_kind)
    return {**target._asdict(), "allowed_us": allowed, "bound_datasheet_us": at_datasheet,
            "bound_measured_us": at_measured, "feasible": at_datasheet <= allowed,
            "peak_share_needed": at_datasheet / allowed,
            "met": None if target.ours_us is None else target.ours_us <= allowed}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--results", type=Path, default=RESULTS, help="folder of the committed result files")
    parser.add_argument("--json", type=Path, help="write the table as JSON here")
    args = parser.parse_args()
    rows = [assess(t) for t in targets(args.results)]
    print(f"{'issue':>5} | {'target':<44} | {'allowed':>9} | {'bound (sheet)':>13} | {'bound (meas.)':>13} | "
          f"{'ours':>9} | verdict")
    for r in rows:
        verdict = ("infeasible on this card" if not r["feasible"]
                   else f"feasible: needs {100 * r['peak_share_needed']:.0f} % of peak")
        ours = "-" if r["ours_us"] is None else f"{r['ours_us']:.1f}"
        print(f"{r['issue']:>5} | {r['name']:<44} | {r['allowed_us']:>9.1f} | {r['bound_datasheet_us']:>13.1f} | "
              f"{r['bound_measured_us']:>13.1f} | {ours:>9} | {verdict} ({r['source']})")
    if args.json:
        args.json.write_text(json.dumps({"datasheet": DATASHEET, "rows": rows}, indent=1, default=str))


if __name__ == "__main__":
    main()
