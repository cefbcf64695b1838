"""Benchmark: the learned drafters against the cache drafter on the trained organism's held-out workloads: the table of
the seed papers (per workload and batch size, each drafter's mean accepted length, decode tokens/s and speed-up over
autoregressive decoding, all in one run) and the router's payoff predictions against the measured accepted lengths.

Model: a trained checkpoint (``--model``, default ``models/organism``) with its held-out workloads
(``DIR/workloads/{completion,edit,tool_loop}.jsonl``, written by ``lumotree train organism``), its EAGLE head
(``DIR/eagle``, ``lumotree train eagle``) and router payoff models (``DIR/router.json``, ``lumotree train router``)
when present. Workloads: ``completion``, ``edit``, ``tool_loop`` and ``mix`` (their items interleaved); each at
every batch size of ``--batches`` (B requests decoded together with continuous batching, greedy, ``--new-tokens``
each). Drafters: ``suffix``, ``mtp`` (when the checkpoint has a head), ``eagle`` and ``router`` (suffix + the EAGLE
head, else + the MTP head). Every run is checked token for token against the autoregressive output of the same
workload (bf16 near-ties may differ: the share of equal outputs is reported). The target keeps its hidden states
only during the runs of drafters that read them (autoregressive and suffix runs are timed without that work). The router's predicted vs measured
accepted lengths: mean absolute error per source and a binned calibration table.

Run (GPU): ``python bench/drafter_suite.py --model models/organism`` (writes ``bench/baselines/drafter_suite.json``;
about 3 minutes on one H100 with the defaults). On a CPU, ``--backend reference --per-workload 2 --new-tokens 8
--batches 1`` runs the same code on the float64 reference (a smoke test; small models only).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from lumotree.optimized.engine import Engine, OptimizedTarget, ReferenceTarget, SamplingParams, make_drafter

WORKLOADS = ("completion", "edit", "tool_loop", "mix")
LEARNED = ("mtp", "eagle", "router")  # drafters that read the target's hidden states


def build_target(args: argparse.Namespace, slots: int, max_seq_len: int) -> Any:
    if args.backend == "reference" or (args.backend == "auto" and not torch.cuda.is_available()):
        from lumotree.reference.model import load_pretrained

        return ReferenceTarget(load_pretrained(args.model), slots, max_seq_len, args.max_nodes)
    from lumotree.optimized.model import OptimizedModel, load_checkpoint

    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    config, weights, _ = load_checkpoint(args.model, dev, None)
    model = OptimizedModel(config, weights, max_nodes=args.max_nodes, num_slots=slots, max_seq_len=max_seq_len,
                           device=dev, dtype=weights.embed.dtype)
    return OptimizedTarget(model, validate=dev.type != "cuda")


def load_prompts(args: argparse.Namespace) -> dict[str, list[list[int]]]:
    from lumotree.training.tokenizer import load_tokenizer
    from lumotree.workloads import WORKLOADS as BUILT, load_workload

    tokenizer = load_tokenizer(args.model)
    prompts = {}
    for name in BUILT:
        items = load_workload(Path(args.model) / "workloads", name)[: args.per_workload]
        prompts[name] = [item.prompt_ids(tokenizer)[-args.max_prompt_tokens:] for item in items]
    mixed = [p for group in zip(*(prompts[n] for n in BUILT)) for p in group]
    prompts["mix"] = mixed[: args.per_workload]
    return prompts


def available_drafters(args: argparse.Namespace) -> list[str]:
    from lumotree.reference.checkpoint import tensor_table

    names = ["suffix"]
    if any(n.startswith("mtp.") for n in tensor_table(args.model)):
        names.append("mtp")
    if (Path(args.model) / "eagle" / "config.json").is_file():
        names.append("eagle")
    if len(names) > 1:
        names.append("router")
    return [n for n in names if n in args.drafters]


def new_drafter(name: str, target: Any, args: argparse.Namespace) -> Any:
    if name == "suffix":
        return make_drafter("suffix")
    if name == "mtp":
        return make_drafter("mtp", target=target, depth=3, top_k=2)
    if name == "eagle":
        return make_drafter("eagle", target=target, eagle=str(Path(args.model) / "eagle"))
    router = Path(args.model) / "router.json"
    return make_drafter("router", target=target, model_dir=args.model, router=str(router) if router.is_file() else None)


def calibration_table(errors: list[tuple[str, float, int]], bins: int = 8) -> list[dict]:
    """Predicted vs measured accepted length of the router's chosen drafts, binned by prediction."""
    if not errors:
        return []
    pred = np.array([p for _, p, _ in errors])
    meas = np.array([y for _, _, y in errors], dtype=np.float64)
    edges = np.unique(np.quantile(pred, np.linspace(0, 1, bins + 1)))
    if len(edges) == 1:  # one predicted value
        return [{"predicted": float(pred.mean()), "measured": float(meas.mean()), "drafts": int(len(pred))}]
    rows = []
    for lo, hi in zip(edges[:-1], edges[1:]):
        sel = (pred >= lo) & ((pred < hi) | (hi == edges[-1]))
        if sel.any():
            rows.append({"predicted": float(pred[sel].mean()), "measured": float(meas[sel].mean()),
                         "drafts": int(sel.sum())})
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="models/organism")
    parser.add_argument("--backend", choices=("auto", "optimized", "reference"), default="auto")
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--per-workload", type=int, default=16, help="prompts per workload (B = 1: the first 4)")
    parser.add_argument("--new-tokens", type=int, default=96)
    parser.add_argument("--max-prompt-tokens", type=int, default=1024)
    parser.add_argument("--max-nodes", type=int, default=32)
    parser.add_argument("--budget", choices=("expected", "ratio", "fixed"), default="expected")
    parser.add_argument("--drafters", nargs="+", default=["suffix", "mtp", "eagle", "router"])
    parser.add_argument("--out", default="bench/baselines/drafter_suite.json")
    args = parser.parse_args()
    if not os.path.isdir(args.model):
        sys.exit(f"error: --model {args.model}: no such directory (train the organism first)")
    start = time.perf_counter()
    prompts = load_prompts(args)
    slots = max(args.batches)
    target = build_target(args, slots, args.max_prompt_tokens + args.new_tokens + args.max_nodes + 8)
    drafters = available_drafters(args)
    params = SamplingParams(max_new_tokens=args.new_tokens)
    profile = None
    if args.budget != "fixed":
        profile = Engine(target, make_drafter("suffix"), mode="tree", budget="fixed").measure_profile(
            repeats=3 if target.device.type == "cuda" else 1, time_limit=40.0)
    rows: list[dict] = []
    router_stats: dict[str, Any] = {}
    for workload in WORKLOADS:
        for B in args.batches:
            batch_prompts = prompts[workload] if B > 1 else prompts[workload][:4]
            if not batch_prompts:
                continue
            runs: dict[str, Any] = {}
            for name in ["autoregressive", *drafters]:
                keep = getattr(getattr(target, "model", None), "keep_hidden", None)
                if keep is not None and keep != (name in LEARNED):  # hidden states kept only where read: fair timing
                    target.model.keep_hidden_states(name in LEARNED)
                drafter = None if name == "autoregressive" else new_drafter(name, target, args)
                mode = "autoregressive" if drafter is None else "tree"
                engine = Engine(target, drafter, mode=mode, budget=args.budget if drafter else "fixed",
                                max_nodes=args.max_nodes, profile=profile, max_batch=B)
                if name == "router":
                    drafter.profile = engine.profile
                if target.device.type == "cuda":
                    engine.warm_up()
                results = engine.generate(batch_prompts, params)
                summary = engine.stats.summary()
                runs[name] = {"tokens": [r.tokens for r in results], "summary": summary}
                if name == "router":
                    router_stats[f"{workload}/B={B}"] = {**drafter.summary(),
                                                         "calibration": calibration_table(drafter.errors)}
            ar = runs["autoregressive"]
            for name, run in runs.items():
                s = run["summary"]
                same = np.mean([a == b for a, b in zip(run["tokens"], ar["tokens"])])
                rows.append({"workload": workload, "batch": B, "drafter": name, "prompts": len(batch_prompts),
                             "mean_accepted": s["mean_accepted"], "tokens_per_s": s["tokens_per_s"],
                             "speedup": s["tokens_per_s"] / ar["summary"]["tokens_per_s"]
                             if ar["summary"]["tokens_per_s"] else 0.0,
                             "equal_to_autoregressive": float(same)})
                print(f"{workload:10s} B={B:3d} {name:15s} accepted {s['mean_accepted']:5.2f}  "
                      f"{s['tokens_per_s']:9.1f} tok/s  x{rows[-1]['speedup']:.2f}  equal {same:.2f}", flush=True)
    out = {"model": args.model, "device": str(target.device),
           "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
           "budget": args.budget, "new_tokens": args.new_tokens, "max_nodes": args.max_nodes, "rows": rows,
           "router": router_stats, "seconds": time.perf_counter() - start}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {args.out} in {out['seconds']:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
