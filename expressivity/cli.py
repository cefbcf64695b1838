"""``lumotree expressivity``: the parity-conditioned retrieval claims, runnable.

Subcommands: ``check`` (every claim, ``--json`` for the machine-readable report), ``sample`` (one instance and the
hybrid construction's answer), ``learned`` (train the small models of the learned separation, write results + plot).
"""

from __future__ import annotations

import argparse
import json

__all__ = ["add_arguments", "run"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    check = sub.add_parser("check", help="run every claim (PCR-1: hybrid, proof, ablation, scratchpad, adversary; "
                                         "PCR-S: the separation) and list each claim's status")
    check.add_argument("--json", action="store_true", help="print the full report as JSON on stdout")
    check.add_argument("--quick", action="store_true", help="small grids and proof scope (about a minute)")
    check.add_argument("--max-n", type=int, default=10_000, help="largest number of bits to run (default 10000)")
    check.add_argument("--seed", type=int, default=0)
    check.add_argument("--sections", default="pcr1,separation",
                       help="comma-separated: pcr1 (single-token keys), separation (string keys); default both")
    sample = sub.add_parser("sample", help="print one random instance and the hybrid construction's answer")
    sample.add_argument("--n", type=int, default=8, help="bits")
    sample.add_argument("--m", type=int, default=4, help="key-value pairs")
    sample.add_argument("--keys", type=int, default=8, help="key vocabulary size M")
    sample.add_argument("--values", type=int, default=8, help="value vocabulary size R")
    sample.add_argument("--seed", type=int, default=0)
    learned = sub.add_parser("learned", help="train small pure-GDN / pure-attention / hybrid models on the task")
    from . import learned as learned_module

    learned_module.add_arguments(learned)


def _summary(report: dict) -> str:
    lines = []
    if "hybrid" in report:
        lines += _pcr1_summary(report)
    if "separation" in report:
        lines += _separation_summary(report["separation"])
    lines.append("claims:")
    for c in report["claims"]:
        mark = "ok " if c["holds"] else "NO "
        lines.append(f"  {mark} [{c['status']}] {c['claim']}")
    lines.append(f"ok = {report['ok']}  ({report['seconds']} s)")
    return "\n".join(lines)


def _separation_summary(s: dict) -> list[str]:
    lines = []
    h = s["hybrid"]
    c = h["construction"]
    lines.append(f"PCR-S hybrid: layers {c['layers']}, hidden size {c['hidden_size']} (R = {c['R']}), "
                 f"max_key_length {c['max_key_length']}, scratchpad tokens 0")
    for row in h["accuracy"]:
        lines.append(f"  n={row['n']:>5} m={row['m']:>3} L={row['L']:>3} accuracy {row['accuracy']:.3f} "
                     f"({row['correct']}/{row['total']})")
    t = h["tree_path"]
    lines.append(f"  tree path: {t['leaves']} leaves, accuracy {t['accuracy']:.3f}, "
                 f"max |logit tree - chain| = {t['max_abs_logit_difference_tree_vs_chain']:.2e}")
    lines.append("  float64, near keys: " + ", ".join(f"L={r['L']}: {r['accuracy']:.2f}"
                                                     for r in h["float64_key_length"]["rows"]))
    lines.append("  cache precision: " + ", ".join(f"L={r['L']}: {r.get('format')}"
                                                   for r in h["cache_precision"]["rows"]))
    lines.append(f"  proof {s['proof']['status']}:")
    for part in s["proof"]["parts"]:
        lines.append(f"    {part['name']:<28} {part['status']:<8} {part['scope']}")
    lines.append(f"  ablation beta<=1: at chance = {s['ablation']['at_chance']}, "
                 f"sign never flips (Z3) = {s['ablation']['sign_never_flips']}")
    lines.append(f"lower bound {s['lower_bound']['status']}:")
    for part in s["lower_bound"]["parts"]:
        lines.append(f"    {part['name']:<28} {part['status']:<8} {part['scope']}")
    m = s["memory"]
    lines.append(f"pure-GDN memory ({1 << m['slot_bits']} slots, hidden {m['hidden_size']}): "
                 + ", ".join(f"L={r['L']}: {r['accuracy']:.2f}" for r in m["rows"]))
    for a in s["attacks"]["rows"]:
        ce = a["counterexample"]
        found = f"fails at m={ce['pairs']} ({ce['strategy']}), verified={ce['verified']}" if ce else "none found"
        lines.append(f"  {a['model']:<46} {a['precision']:<8} bound m*={a['counting']['pairs_for_a_collision']:>6}: "
                     f"{found}")
    return lines


def _pcr1_summary(report: dict) -> list[str]:
    lines = []
    h = report["hybrid"]
    for row in h["accuracy"]:
        lines.append(f"hybrid   n={row['n']:>6} m={row['m']:>3} {row['path']:<27} accuracy {row['accuracy']:.3f} "
                     f"({row['correct']}/{row['total']})")
    t = h["tree_path"]
    lines.append(f"hybrid   tree path: {t['leaves']} leaves, accuracy {t['accuracy']:.3f}, "
                 f"max |logit tree - chain| = {t['max_abs_logit_difference_tree_vs_chain']:.2e}")
    o = h["optimized_path"]
    lines.append(f"hybrid   optimized kernels ({o['device']}, {o['dtype']}): prefill accuracy "
                 f"{o['prefill_accuracy']:.3f}, tree accuracy {o['tree_accuracy']:.3f}, max |logit - reference| = "
                 f"{o['max_abs_logit_difference_vs_reference']:.1e}")
    p = report["proof"]
    lines.append(f"proof    {p['status']}: {p['scope']}")
    for part in p["parts"]:
        lines.append(f"         {part['name']:<28} {part['status']:<8} {part['scope']}")
    a = report["ablation"]
    lines.append(f"ablation beta<1: at chance = {a['at_chance']}, "
                 f"readout sign never flips (Z3) = {a['sign_never_flips']}")
    for row in a["rows"]:
        lines.append(f"         beta={row['reflection_beta']:<6} n={row['n']:>4} accuracy {row['accuracy']:.3f} "
                     f"(chance {row['chance']:.3f})")
    s = report["scratchpad"]
    for row in s["rows"]:
        lines.append(f"scratch  n={row['n']:>5} accuracy {row['accuracy']:.3f} scratchpad tokens "
                     f"{row['scratchpad_lengths']}")
    for attack in report["adversary"]["attacks"]:
        ce = attack["counterexample"]
        found = (f"counterexample with m={ce['pairs']} ({ce['strategy']}), verified={ce['verified']}" if ce
                 else "none found")
        lines.append(f"gdn-adv  {attack['model']['layers']}L h={attack['model']['hidden_size']} "
                     f"{attack['precision']:<5} state {attack['state_bits']} bits: {found}")
    return lines


def run(args: argparse.Namespace) -> int:
    if args.action == "check":
        from .check import run_check, stderr_progress

        sections = tuple(x.strip() for x in args.sections.split(",") if x.strip())
        report = run_check(quick=args.quick, max_n=args.max_n, seed=args.seed, progress=stderr_progress,
                           sections=sections)
        print(json.dumps(report, indent=2, default=str) if args.json else _summary(report))
        return 0 if report["ok"] else 1
    if args.action == "sample":
        import numpy as np

        from . import hybrid
        from .task import TaskSpec, generate

        inst = generate(TaskSpec(args.n, args.m, args.keys, args.values), 1, seed=args.seed)[0]
        construction = hybrid.build_hybrid(args.keys, args.values)
        predicted = int(np.argmax(hybrid.final_logits(construction.model, inst.tokens)))
        vocab = inst.vocab
        print(f"input     {inst.render()}")
        print(f"parity    {inst.parity}  ->  query q_{inst.parity} = K{inst.queries[inst.parity]}")
        print(f"answer    {vocab.name(inst.answer)}")
        print(f"hybrid    {vocab.name(predicted)}")
        return 0 if predicted == inst.answer else 1
    from . import learned

    return learned.run(args)
