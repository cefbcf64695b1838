"""Host work of the engine's steps (issue 7), measured against an instant target: no GPU, no model.

The target is :class:`InstantModel`, which answers :class:`~lumotree.optimized.engine.OptimizedTarget`'s calls at once
with the greedy behaviour of the benchmark's greedy-stable random model (``random_tensors(successor=True)``: the
argmax after token t is ``pi[t]``, the seeded successor permutation), and the engine runs as ``bench/e2e.py`` runs it:
the synthetic drafter with the oracle of an autoregressive run, the cost profile of an e2e JSON (``--profile-json``)
for the budget, every power-of-two batch and node bucket. What the instant model computes (greedy acceptance in
numpy) is timed and subtracted: the rest of a step's wall time is the host work a real step adds to its GPU time.

Per configuration (B, mode, budget) the table gives the median host milliseconds of a speculative step (or of an
autoregressive step), its phases (``draft`` = drafter.propose, ``choose`` = the budget, ``pack`` = TreeBatch.pack,
``target`` = the target's host part of the step, ``rest`` = cuts, outcome, drafter advance, token bookkeeping) and
the host time as a fraction of the GPU time the cost profile gives the same step (the floor of the host share is 0).

Run (CPU): ``PYTHONPATH=$PWD python bench/engine_host.py --out engine_host.json``.
"""

from __future__ import annotations

import argparse
import json
import time
from collections import defaultdict

import numpy as np
import torch

from lumotree.optimized import engine as eng
from lumotree.optimized import sampling as smp
from lumotree.optimized.budget import CostProfile
from lumotree.optimized.drafters import SyntheticDrafter
from lumotree.optimized.model import successor_permutation
from lumotree.optimized.sampling import SamplingParams


class InstantModel:
    """The part of :class:`~lumotree.optimized.model.OptimizedModel`'s interface the engine's target uses, answered
    at once: logits one-hot at ``pi[t]`` and greedy tree acceptance on the host (time spent in ``fake_s``)."""

    def __init__(self, vocab_size: int, num_slots: int, max_seq_len: int, max_nodes: int, seed: int = 0):
        self.vocab_size, self.num_slots = vocab_size, num_slots
        self.max_seq_len, self.max_nodes = max_seq_len, max_nodes
        self.device = torch.device("cpu")
        self.lens = torch.zeros(num_slots, dtype=torch.int32)
        self.pi = successor_permutation(vocab_size, seed).numpy()  # [V] greedy next token of t
        self.fake_s = 0.0

    def _logits(self, last: np.ndarray) -> torch.Tensor:
        logits = torch.zeros((len(last), self.vocab_size))  # [B, V]
        logits[torch.arange(len(last)), torch.from_numpy(self.pi[last])] = 1.0
        return logits

    def prefill(self, slot: int, tokens) -> torch.Tensor:
        self.lens[slot] = len(tokens)
        return self._logits(np.array([tokens[-1]]))[0]

    def decode(self, slots: torch.Tensor, tokens: torch.Tensor, *, validate: bool = True) -> torch.Tensor:
        t0 = time.perf_counter()
        out = self._logits(tokens.numpy())
        self.fake_s += time.perf_counter() - t0
        return out

    def speculate_greedy(self, slots, tokens, parents, num_nodes, *, validate: bool = True) -> torch.Tensor:
        """``[B, 3 + N]`` int64 (:meth:`~lumotree.optimized.sampling.VerifyOutcome.packed`): node i is accepted iff
        its parent is and its token is ``pi`` of its parent's (root always); the deepest accepted node wins."""
        t0 = time.perf_counter()
        tok, par, num = tokens.numpy(), parents.numpy().astype(np.int64), num_nodes.numpy()
        B, N = tok.shape
        accepted = np.zeros((B, N), dtype=bool)  # [B, N]
        depth = np.zeros((B, N), dtype=np.int64)  # [B, N]
        accepted[:, 0] = True
        rows = np.arange(B)
        for i in range(1, N):  # topological: parents first
            p = par[:, i]
            accepted[:, i] = (i < num) & accepted[rows, p] & (tok[:, i] == self.pi[tok[rows, p]])
            depth[:, i] = depth[rows, p] + 1
        node = np.where(accepted, depth, -1).argmax(1)  # [B] deepest (lowest index among equals)
        on_path = np.zeros((B, N), dtype=np.int64)
        walk = node.copy()
        for _ in range(int(depth[rows, node].max()) + 1):
            on_path[rows[walk >= 0], walk[walk >= 0]] = 1
            walk = np.where(walk > 0, par[rows, np.maximum(walk, 0)], -1)
        packed = np.concatenate([node[:, None], depth[rows, node][:, None], self.pi[tok[rows, node]][:, None], on_path],
                                1)
        self.fake_s += time.perf_counter() - t0
        return torch.from_numpy(packed)

    def release(self, slot: int) -> None:
        self.lens[slot] = 0


class Phases:
    """Wall time per phase of the current step (wrapped callables add to it)."""

    def __init__(self):
        self.now: dict[str, float] = defaultdict(float)

    def wrap(self, name: str, fn):
        def timed(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.now[name] += time.perf_counter() - t0
        return timed


def run(model: InstantModel, profile: CostProfile, B: int, mode: str, budget: str, nodes: int, prompts, oracle,
        new_tokens: int, acceptance: float) -> dict:
    """One generation; per step its host time (wall minus the instant model's), phases, kind and tree size."""
    phases = Phases()
    target = eng.OptimizedTarget(model, validate=False)
    target.speculate_greedy = phases.wrap("target", target.speculate_greedy)
    drafter = None
    if mode != "autoregressive":
        drafter = SyntheticDrafter(acceptance, oracle, model.vocab_size, seed=0)
        drafter.propose = phases.wrap("draft", drafter.propose)
    engine = eng.Engine(target, drafter, mode=mode, budget=budget, max_nodes=nodes, profile=profile, seed=0)
    engine.budget.choose = phases.wrap("choose", engine.budget.choose)
    pack = smp.TreeBatch.pack
    smp.TreeBatch.pack = phases.wrap("pack", pack)
    try:
        for p in prompts[:B]:
            engine.submit(p, SamplingParams(max_new_tokens=new_tokens))
        engine.step()  # the prefills
        steps = []
        while engine.has_work():
            phases.now.clear()
            fake0 = model.fake_s
            t0 = time.perf_counter()
            engine.step()
            wall = time.perf_counter() - t0
            fake = model.fake_s - fake0
            rec = engine.stats.steps[-1]
            if rec.batch != B:  # the tail of the run (requests finished): not the batch under test
                continue
            host = wall - fake
            ph = {k: v - (fake if k == "target" else 0.0) for k, v in phases.now.items()}
            ph["rest"] = host - sum(ph.values())
            gpu = profile.verify_time(B, rec.nodes) if rec.kind == "verify" else profile.decode_time(B)
            steps.append((rec.kind, rec.nodes, host, ph, gpu))
    finally:
        smp.TreeBatch.pack = pack
    return {"steps": steps}


def summarise(steps: list, kind: str) -> dict | None:
    chosen = [s for s in steps if s[0] == kind]
    if not chosen:
        return None
    names = sorted({k for s in chosen for k in s[3]})
    return {"steps": len(chosen), "mean_nodes": float(np.mean([s[1] for s in chosen])),
            "host_ms": 1e3 * float(np.median([s[2] for s in chosen])),
            "phases_ms": {k: 1e3 * float(np.median([s[3].get(k, 0.0) for s in chosen])) for k in names},
            "host_over_gpu": float(np.median([s[2] / s[4] for s in chosen]))}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 64])
    ap.add_argument("--vocab", type=int, default=4096)
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--acceptance", type=float, default=0.8)
    ap.add_argument("--repeats", type=int, default=3, help="generations per configuration (steps pooled)")
    ap.add_argument("--profile-json", default="bench/results/2026-12-01e/e2e_run3.json",
                    help="an e2e JSON whose cost profile the budget uses (the H200's measured step times)")
    ap.add_argument("--out", default="engine_host.json")
    args = ap.parse_args()
    with open(args.profile_json) as f:
        profile = CostProfile.from_dict(json.load(f)["profile"])
    P = max(args.batches)
    rng = np.random.default_rng(0)
    prompts = [rng.integers(0, args.vocab, args.prompt_len).tolist() for _ in range(P)]
    model = InstantModel(args.vocab, P, args.prompt_len + args.new_tokens + 256, 64)
    ar = eng.Engine(eng.OptimizedTarget(model, validate=False), None, mode="autoregressive", profile=profile)
    oracle = {tuple(p): r.tokens for p, r in zip(prompts, ar.generate(prompts, SamplingParams(
        max_new_tokens=args.new_tokens + 64)))}
    configs = [("autoregressive", "none", 1)] + [("tree", "fixed", n) for n in (8, 64)] + [("tree", "expected", 64),
                                                                                          ("chain", "expected", 64)]
    rows = []
    print(f"{'B':>3} {'mode':>14} {'budget':>8} {'N':>5} {'steps':>5} {'host ms':>8} {'host/GPU':>8}  phases (ms)")
    for B in args.batches:
        for mode, budget, nodes in configs:
            steps = []
            for _ in range(args.repeats):
                steps += run(model, profile, B, mode, budget, nodes, prompts, oracle, args.new_tokens,
                             args.acceptance)["steps"]
            for kind in ("verify", "autoregressive"):
                s = summarise(steps, kind)
                if s is None:
                    continue
                row = {"B": B, "mode": mode, "budget": budget, "max_nodes": nodes, "kind": kind, **s}
                rows.append(row)
                print(f"{B:>3} {mode:>14} {budget:>8} {s['mean_nodes']:>5.1f} {s['steps']:>5} {s['host_ms']:>8.3f} "
                      f"{s['host_over_gpu']:>8.3f}  " + ", ".join(f"{k} {v:.3f}" for k, v in s["phases_ms"].items()),
                      flush=True)
    with open(args.out, "w") as f:
        json.dump({"device": "cpu (instant target)", "torch": torch.__version__, "profile_json": args.profile_json,
                   "acceptance": args.acceptance, "vocab": args.vocab, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
