"""Benchmark: the drafters side by side through the engine: autoregressive, prompt lookup (``ngram``), suffix decoding
(``suffix``), LayerSkip early exit (``layer-skip``) and the GDN-only subgraph (``gdn-only``), plus the self-speculation
acceptance study (alpha at k = 1..4 and the perplexity-ablation ratio; for the two drafters' subgraphs and for the
component-level ablation: every GDN sublayer and MLP, the attention mixers skipped).

Model: a seeded random hybrid (``--config small``: 8 layers = 6 GDN + 2 gated attention, hidden 512, vocabulary 8192)
with *greedy-stable* weights (``random_tensors(..., successor=True)``: the greedy next token of t is a fixed
permutation of t with a wide logit margin, so speculative and autoregressive bf16 outputs agree and the timings compare
equal work). Its text is not language: the self-speculation drafts of such a model predict its trivial continuation
almost always, so their acceptance here measures the system, not the drafter; the real-text numbers come from a
trained model.

Workloads (each at every batch size ``--batches``; B requests decoded together, ``--new-tokens`` each, greedy):

- ``fresh``: random prompts: what a drafter costs when there is nothing to copy;
- ``copy``: each prompt followed by the first ``--new-tokens / 2`` tokens of its own autoregressive continuation and
  the prompt again (a request that re-reads what it is about to write: code edits, tool loops);
- ``rerun``: the fresh prompts decoded a second time by the same drafter (its global state, e.g. the suffix cache of
  finished outputs, warm from the first pass; agentic workloads repeat calls).

Per (workload, B, drafter): decode tokens/s (prefill excluded), speed-up over autoregressive in the same workload,
mean accepted draft tokens per request-step, and whether the output equals the autoregressive one token for token.
The budget is ``--budget`` (default: the expected-throughput budget on a cost profile measured at start-up).

Run (GPU): ``python bench/drafters.py [--out bench/baselines/drafters.json]`` (about 2 minutes on one H100). On a CPU,
``--backend reference --config tiny --budget fixed`` runs the same code on the float64 reference (a smoke test).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

import numpy as np
import torch

from lumotree.optimized.engine import Engine, OptimizedTarget, ReferenceTarget, layer_skip_checkpoint, make_drafter
from lumotree.optimized.engine.sampling import SamplingParams
from lumotree.optimized.engine.selfspec import (SELF_SPECULATION, acceptance_study, attention_ablated_tensors,
                                                self_speculation_layers)
from lumotree.optimized.model import RANDOM_CONFIGS, OptimizedModel, random_tensors
from lumotree.reference import model as rm
from lumotree.reference.config import HybridConfig

DRAFTERS = ("ngram", "suffix", "layer-skip", "gdn-only")
WORKLOADS = ("fresh", "copy", "rerun")
ABLATED = "attention-ablated"  # study only: every GDN sublayer and every MLP, the attention mixers skipped


def build(args: argparse.Namespace, max_seq_len: int, slots: int) -> tuple[Any, dict[str, Any], HybridConfig]:
    """(target, {self-speculation kind: draft target, and the attention-ablated model of the study}, config) on the
    chosen backend, the drafts sharing the target's weights."""
    config = HybridConfig(**RANDOM_CONFIGS[args.config])
    optimized = args.backend == "optimized"
    cuda = optimized and torch.cuda.is_available()  # optimized on a CPU: the Triton interpreter (TRITON_INTERPRET=1)
    dev = torch.device("cuda" if cuda else "cpu")
    dtype = torch.bfloat16 if cuda else (torch.float32 if optimized else torch.float64)
    tensors = random_tensors(config, args.seed, dev, dtype, successor=True)
    layers = {"layer-skip": self_speculation_layers(config, "layer-skip", args.exit_layer),
              "gdn-only": self_speculation_layers(config, "gdn-only")}
    ablated = attention_ablated_tensors(config, tensors)  # the study's third subgraph: attention mixers skipped
    if optimized:
        common = dict(num_slots=slots, max_seq_len=max_seq_len, device=dev, dtype=dtype)
        target = OptimizedTarget(OptimizedModel(config, tensors, max_nodes=args.max_nodes, **common), validate=False)
        drafts = {kind: OptimizedTarget(OptimizedModel(*layer_skip_checkpoint(config, tensors, chosen), max_nodes=32,
                                                       **common), validate=False)
                  for kind, chosen in layers.items()}
        drafts[ABLATED] = OptimizedTarget(OptimizedModel(config, ablated, max_nodes=32, **common), validate=False)
        return target, drafts, config
    model = rm.HybridModel(config, rm.weights_from_tensors({k: v.numpy() for k, v in tensors.items()}, config))
    target = ReferenceTarget(model, slots, max_seq_len, args.max_nodes)
    from lumotree.reference.drafters import layer_skip_draft

    drafts = {kind: ReferenceTarget(layer_skip_draft(model, chosen), slots, max_seq_len, 32)
              for kind, chosen in layers.items()}
    ablated_model = rm.HybridModel(config, rm.weights_from_tensors({k: v.numpy() for k, v in ablated.items()},
                                                                   config))
    drafts[ABLATED] = ReferenceTarget(ablated_model, slots, max_seq_len, 32)
    return target, drafts, config


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", choices=sorted(RANDOM_CONFIGS), default="small")
    parser.add_argument("--backend", choices=("auto", "optimized", "reference"), default="auto")
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--prompt-len", type=int, default=32)
    parser.add_argument("--max-nodes", type=int, default=16)
    parser.add_argument("--budget", choices=("expected", "ratio", "fixed"), default="expected")
    parser.add_argument("--exit-layer", type=int, default=None, help="layer-skip: layers kept (default: half)")
    parser.add_argument("--ks", type=int, nargs="+", default=[1, 2, 3, 4], help="chain lengths of the study")
    parser.add_argument("--study-prompts", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="bench/baselines/drafters.json")
    args = parser.parse_args()
    if args.backend == "auto":
        args.backend = "optimized" if torch.cuda.is_available() else "reference"
    if min(args.batches) < 1 or args.new_tokens < 2 or args.prompt_len < 1 or not 2 <= args.max_nodes <= 128:
        parser.error("--batches >= 1, --new-tokens >= 2, --prompt-len >= 1 and --max-nodes in [2, 128]")
    start = time.perf_counter()

    def log(msg: str) -> None:
        sys.stderr.write(f"[drafters {time.perf_counter() - start:6.1f}s] {msg}\n")
        sys.stderr.flush()

    slots = max(max(args.batches), args.study_prompts)
    copy_len = args.new_tokens // 2
    max_seq_len = 2 * args.prompt_len + copy_len + args.new_tokens + args.max_nodes + 16
    target, drafts, config = build(args, max_seq_len, slots)
    node_buckets = tuple(n for n in (1, 2, 4, 8, 16, 32, 64, 128) if n <= args.max_nodes)
    ar_engine = Engine(target, mode="autoregressive", max_nodes=args.max_nodes, node_buckets=node_buckets)
    profile = None
    if args.budget != "fixed":
        profile = ar_engine.measure_profile(repeats=5 if args.backend == "optimized" else 1, time_limit=30.0)
        log("cost profile measured")

    def engine(drafter: Any) -> Engine:
        if drafter is None:
            return Engine(target, mode="autoregressive", max_nodes=args.max_nodes, node_buckets=node_buckets)
        return Engine(target, drafter, mode="tree", budget=args.budget, max_nodes=args.max_nodes, profile=profile,
                      node_buckets=node_buckets, seed=args.seed)

    def new_drafter(name: str) -> Any:
        if name in SELF_SPECULATION:  # binary trees up to depth 6: deeper than the default 4-ary ones
            return make_drafter(name, draft_model=drafts[name], top_k=2, max_depth=6)
        return make_drafter(name)

    if torch.cuda.is_available() and args.backend == "optimized":
        engine(new_drafter("ngram")).warm_up()
        log("target graphs captured")
    rng = np.random.default_rng(args.seed)
    params = SamplingParams(max_new_tokens=args.new_tokens)
    rows: list[dict[str, Any]] = []
    for B in sorted(set(args.batches)):
        fresh = [rng.integers(0, config.vocab_size, size=args.prompt_len).tolist() for _ in range(B)]
        continuations = [r.tokens for r in engine(None).generate(fresh, params)]
        prompts = {"fresh": fresh, "rerun": fresh,
                   "copy": [p + c[:copy_len] + p for p, c in zip(fresh, continuations)]}
        for workload in WORKLOADS:
            ar = engine(None)
            ar_out = [r.tokens for r in ar.generate(prompts[workload], params)]
            base = ar.stats.summary()["tokens_per_s"]
            rows.append({"workload": workload, "B": B, "drafter": "autoregressive", "tokens_per_s": base,
                         "speedup": 1.0, "mean_accepted": 0.0, "equal_to_autoregressive": True})
            for name in DRAFTERS:
                # untimed: compiles and captures the draft model's shapes, with a drafter thrown away after
                engine(new_drafter(name)).generate(prompts[workload], SamplingParams(max_new_tokens=8))
                drafter = new_drafter(name)
                if workload == "rerun":  # the first pass fills the drafter's state across requests
                    engine(drafter).generate(prompts[workload], params)
                e = engine(drafter)
                out = [r.tokens for r in e.generate(prompts[workload], params)]
                s = e.stats.summary()
                rows.append({"workload": workload, "B": B, "drafter": name, "tokens_per_s": s["tokens_per_s"],
                             "speedup": s["tokens_per_s"] / base if base else float("nan"),
                             "mean_accepted": s["mean_accepted"], "equal_to_autoregressive": out == ar_out,
                             "speculative_steps": s["speculative_steps"], "decode_steps": s["decode_steps"]})
                log(f"{workload:6s} B={B:3d} {name:11s} {s['tokens_per_s']:9.1f} tok/s  x{rows[-1]['speedup']:.2f}  "
                    f"accepted {s['mean_accepted']:.2f}  equal {out == ar_out}")
    study_prompts = [rng.integers(0, config.vocab_size, size=args.prompt_len).tolist()
                     for _ in range(args.study_prompts)]
    study = {}
    for kind, draft in drafts.items():
        study[kind] = acceptance_study(target, draft, study_prompts, ks=args.ks, max_new_tokens=32)
        study[kind]["layers"] = "all (attention mixers skipped)" if kind == ABLATED else self_speculation_layers(
            config, kind, args.exit_layer if kind == "layer-skip" else None)
        log(f"study {kind}: alpha {study[kind]['alpha']}  PPL ratio {study[kind]['ppl_ratio']:.3f}")
    device = torch.cuda.get_device_name() if torch.cuda.is_available() else f"cpu ({args.backend} backend)"
    summary = {"config": args.config, "backend": args.backend, "device": device, "budget": args.budget,
               "max_nodes": args.max_nodes, "new_tokens": args.new_tokens, "prompt_len": args.prompt_len,
               "weights": "random, greedy-stable (successor=True): acceptance is not that of a trained model",
               "rows": rows, "study": study, "seconds": time.perf_counter() - start}
    with open(args.out, "w") as f:
        json.dump(summary, f, indent=1)
    print(markdown(summary))
    log(f"written {args.out}")
    return 0


def markdown(summary: dict[str, Any]) -> str:
    lines = ["| workload | B | drafter | tokens/s | speed-up | mean accepted | = AR |", "|---|---|---|---|---|---|---|"]
    for r in summary["rows"]:
        equal = "yes" if r["equal_to_autoregressive"] else "no"
        lines.append(f"| {r['workload']} | {r['B']} | {r['drafter']} | {r['tokens_per_s']:.1f} | "
                     f"{r['speedup']:.2f}x | {r['mean_accepted']:.2f} | {equal} |")
    lines += ["", "| drafter | layers | " + " | ".join(f"alpha k={k}" for k in next(iter(summary["study"].values()))[
        "ks"]) + " | PPL ratio |", "|---" * (3 + len(next(iter(summary["study"].values()))["ks"])) + "|"]
    for kind, s in summary["study"].items():
        lines.append(f"| {kind} | {s['layers']} | " + " | ".join(f"{a:.3f}" for a in s["alpha"].values())
                     + f" | {s['ppl_ratio']:.3f} |")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
