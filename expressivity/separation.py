r"""The separation on PCR-S, run: the fixed-width hybrid, the lower bound for pure GDN, the pure-GDN models that
must fail, write strength, and each claim with its status.

:func:`run_separation` returns one JSON-able report; :func:`claims` turns a report into the list of claims with a
status each: ``proved for all sizes`` (a proof whose scope is every n / every m / every key length), ``bounded``
(exhaustive or Z3 over a stated finite scope), ``measured`` (runs on stated inputs), ``argued`` (a cited theorem or
an argument on paper, not checked here).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from ..reference.fixedpoint import FixedFormat
from . import adversary, lower_bound, string_hybrid, string_memory, string_proof
from .hybrid import final_logits
from .string_task import StringInstance, StringTaskSpec, generate, parity_blind_accuracy, score

__all__ = ["near_keys", "hybrid_accuracy", "near_key_accuracy", "longest_key_length", "cache_precision",
           "memory_within_range", "pure_gdn_attacks", "ablation", "lower_bounds", "run_separation", "claims",
           "STATUSES"]

Progress = Callable[[str], None]
STATUSES = ("proved for all sizes", "bounded", "measured", "argued")


def _quiet(_: str) -> None:
    pass


def near_keys(key_length: int) -> tuple[str, ...]:
    """Keys whose encodings crowd where the angle gap is smallest (ratios near 1): ``b^L`` first, then its
    neighbours ``a b^(L-1)``, ``b a b^(L-2)``, ``a a b^(L-2)`` (ratios ``2^-L``, ``2 * 2^-L``, ``3 * 2^-L`` below),
    then ``b^(L-1) a`` and ``a^L`` (far away)."""
    L = key_length
    candidates = ["b" * L, "a" + "b" * (L - 1), "ba" + "b" * (L - 2), "aa" + "b" * (L - 2), "b" * (L - 1) + "a",
                  "a" * L]
    return tuple(dict.fromkeys(k for k in candidates if len(k) == L))


def near_instances(key_length: int, num_values: int, pairs_limit: int | None = None) -> list[StringInstance]:
    """Hard instances of one key length: the target ``b^L`` holds value 0 while its crowded neighbours all hold
    value 1 (a too-flat attention averages them and answers 1), asked under both parities; then ordered query pairs
    of :func:`near_keys` with values ``0, 1, 2, ..`` (at most ``pairs_limit`` pairs)."""
    keys = near_keys(key_length)
    crowded = tuple(0 if i == 0 else (1 if i < 4 else 2 % num_values) for i in range(len(keys)))
    out = [StringInstance(bits, keys, crowded, q, num_values) for bits in ((1, 0), (1, 1, 1))
           for q in ((keys[0], keys[1]), (keys[1], keys[0]))]
    values = tuple(i % num_values for i in range(len(keys)))
    pairs = [(a, b) for a in keys for b in keys if a != b][:pairs_limit]
    return out + [StringInstance(bits, keys, values, q, num_values) for bits in ((1, 0), (1, 1, 1)) for q in pairs]


def hybrid_accuracy(construction: string_hybrid.StringHybrid, grid: list[tuple[int, int, int, int]], seed: int,
                    progress: Progress = _quiet) -> list[dict[str, Any]]:
    """Chain-path float64 accuracy on ``count`` random instances per ``(n, m, L, count)``."""
    R = construction.layout.num_values
    rows = []
    for n, m, L, count in grid:
        progress(f"string hybrid: n = {n}, m = {m}, L = {L}")
        start = time.perf_counter()
        instances = generate(StringTaskSpec(n, m, L, R), count, seed=seed + 7919 * L + 31 * m + n)
        s = score(string_hybrid.predict(construction, instances), instances)
        rows.append({"n": n, "m": m, "L": L, **s.as_dict(), "seconds": round(time.perf_counter() - start, 1)})
    return rows


def near_key_accuracy(construction: string_hybrid.StringHybrid, key_length: int) -> float:
    """Accuracy on the hard instances of one key length (:func:`near_keys`: crowded neighbours, every ordered query
    pair, both parities)."""
    instances = near_instances(key_length, construction.layout.num_values)
    return score(string_hybrid.predict(construction, instances), instances).accuracy


def longest_key_length(lengths: list[int], num_values: int = 6, progress: Progress = _quiet) -> dict[str, Any]:
    """For each L, the construction built for ``max_key_length = L`` on the near keys of length L (float64): where
    float64 stops being enough."""
    rows = []
    for L in lengths:
        progress(f"string hybrid: near keys of length {L} (float64)")
        rows.append({"L": L, "accuracy": near_key_accuracy(string_hybrid.build_string_hybrid(num_values, L), L)})
    solved = [r["L"] for r in rows if r["accuracy"] == 1.0]
    longest = max((L for L in solved if all(r["accuracy"] == 1.0 for r in rows if r["L"] <= L)), default=0)
    return {"rows": rows, "longest_solved": longest}


def right_at_precision(construction: string_hybrid.StringHybrid, instances: list[StringInstance],
                        fmt: FixedFormat) -> bool:
    """Every instance right with every cache array rounded to ``fmt`` after each token (prefixes shared)."""
    runner = adversary.RoundedRunner(construction.model, fmt, pure_gdn=False)
    prefixes: dict[tuple[int, ...], Any] = {}
    for inst in instances:
        cut = inst.prefix_length
        key = tuple(inst.tokens[:cut].tolist())
        if key not in prefixes:
            cache = runner.new_cache()
            runner.feed(inst.tokens[:cut], cache)
            prefixes[key] = cache
        logits = runner.feed(inst.tokens[cut:], prefixes[key].copy())
        if int(np.argmax(logits)) != inst.answer:
            return False
    return True


def cache_precision(lengths: list[int], num_values: int = 4, int_bits: int = 10, max_frac_bits: int = 43,
                    progress: Progress = _quiet) -> dict[str, Any]:
    """For each key length L: the fewest fraction bits f such that the hybrid (built for ``max_key_length = L``),
    with every cache number (GDN conv and recurrent states, attention keys and values) stored in
    ``fx<int_bits + f>.<f>`` after each token, answers the hard instances of length L (crowded neighbours and 3 query
    pairs of :func:`near_keys`, both parities); found by bisection, then confirmed at f and refuted at ``f - 1``."""
    rows = []
    for L in lengths:
        progress(f"string hybrid: cache precision for L = {L}")
        construction = string_hybrid.build_string_hybrid(num_values, L)
        instances = near_instances(L, num_values, pairs_limit=3)

        def ok(f: int) -> bool:
            return right_at_precision(construction, instances, FixedFormat(int_bits + f, f))

        lo, hi = 0, max_frac_bits
        if not ok(hi):
            rows.append({"L": L, "frac_bits": None, "bits": None})
            continue
        while lo < hi:
            mid = (lo + hi) // 2
            if ok(mid):
                hi = mid
            else:
                lo = mid + 1
        below = hi == 0 or not ok(hi - 1)
        rows.append({"L": L, "frac_bits": hi, "bits": int_bits + hi, "format": FixedFormat(int_bits + hi, hi).name,
                     "fails_one_bit_below": bool(below)})
    fits = [(r["L"], r["frac_bits"]) for r in rows if r["frac_bits"] is not None]
    slope = None
    if len(fits) >= 2:  # from the two longest lengths
        (l0, f0), (l1, f1) = fits[-2], fits[-1]
        slope = (f1 - f0) / (l1 - l0) if l1 != l0 else None
    return {"int_bits": int_bits, "rows": rows, "frac_bits_per_letter": slope}


def memory_within_range(slot_bits: int, num_values: int, count: int, seed: int,
                        progress: Progress = _quiet) -> dict[str, Any]:
    """The hand-built pure-GDN memory: accuracy for every key length up to ``slot_bits`` (where it is exact) and one
    beyond (where its slots alias)."""
    memory = string_memory.build_string_memory(num_values, slot_bits)
    rows = []
    for L in range(1, slot_bits + 2):
        progress(f"pure-GDN memory: L = {L}")
        m = min(1 << L, 6)
        instances = generate(StringTaskSpec(5, m, L, num_values), count, seed=seed + L)
        rows.append({"L": L, "m": m, **score(string_memory.predict(memory, instances), instances).as_dict()})
    inside = [r for r in rows if r["L"] <= slot_bits]
    return {"slot_bits": slot_bits, "hidden_size": memory.model.config.hidden_size, "rows": rows,
            "exact_within_range": all(r["accuracy"] == 1.0 for r in inside),
            "fails_beyond": rows[-1]["accuracy"] < 1.0}


def pure_gdn_attacks(models: list[tuple[str, Any]], precisions: list[str], num_values: int, key_length: int,
                     seed: int, progress: Progress = _quiet) -> list[dict[str, Any]]:
    """:func:`~lumotree.expressivity.adversary.string_attack` on each ``(name, model)`` at each precision."""
    out = []
    for name, model in models:
        for precision in precisions:
            progress(f"adversary (PCR-S): {name} at {precision}")
            start = time.perf_counter()
            report = adversary.string_attack(model, precision, num_values, key_length, seed=seed)
            out.append({"model": name, **report, "seconds": round(time.perf_counter() - start, 1)})
    return out


def ablation(betas: list[float], count: int, seed: int, num_values: int = 4) -> dict[str, Any]:
    """The string hybrid with the parity head's write strength in (0, 1] (Qwen3-Next's range): accuracy against the
    parity-blind level, and the Z3 proof that its readout sign never flips."""
    chance = parity_blind_accuracy(num_values)
    rows, proofs = [], []
    for beta in betas:
        construction = string_hybrid.build_string_hybrid(num_values, 8, reflection_beta=beta)
        proofs.append(string_proof.prove_parity(construction, expect_flip=False).as_dict())
        instances = generate(StringTaskSpec(6, 4, 3, num_values), count, seed=seed)
        s = score(string_hybrid.predict(construction, instances), instances)
        upper = chance + 3.0 * math.sqrt(chance * (1 - chance) / count)
        rows.append({"reflection_beta": beta, **s.as_dict(), "chance_plus_3_sigma": upper,
                     "at_or_below_chance": s.accuracy <= upper})
    return {"rows": rows, "sign_proofs": proofs, "at_chance": all(r["at_or_below_chance"] for r in rows),
            "sign_never_flips": all(p["status"] == "proved" for p in proofs)}


def lower_bounds(quick: bool) -> dict[str, Any]:
    """The pure-GDN lower bound's checks and the write-strength lemma."""
    parts = [lower_bound.prove_fooling_lemma(), lower_bound.check_fooling_set(3, 4, 2, 2),
             lower_bound.check_prefix_classes(), lower_bound.prove_pigeonhole(),
             lower_bound.prove_transition_spectrum()]
    if not quick:
        parts.append(lower_bound.check_fooling_set(2, 8, 3, 2))
    return {"parts": [p.as_dict() for p in parts],
            "status": "proved" if all(p.status == "proved" for p in parts) else "refuted"}


def run_separation(quick: bool = False, seed: int = 0, progress: Progress = _quiet) -> dict[str, Any]:
    """Everything about PCR-S (``quick``: smaller grids and scopes, about a minute on two cores)."""
    start = time.perf_counter()
    out: dict[str, Any] = {}
    R = 4
    construction = string_hybrid.build_string_hybrid(R, 16)
    grid = [(1, 2, 1, 20), (8, 4, 2, 20), (12, 16, 6, 10), (100, 32, 12, 5), (1000, 64, 16, 2)]
    if quick:
        grid = [(1, 2, 1, 10), (8, 4, 2, 10), (12, 16, 6, 5), (40, 24, 12, 2)]
    accuracy = hybrid_accuracy(construction, grid, seed, progress)
    progress("string hybrid: tree path")
    tree = _tree_agreement(construction, 2 if quick else 6, seed)
    out["hybrid"] = {
        "construction": {"layers": list(construction.model.config.layer_types),
                         "hidden_size": construction.model.config.hidden_size, "R": R, "max_key_length": 16,
                         "logit_scale": string_hybrid.logit_scale(16), "scratchpad_tokens": 0},
        "accuracy": accuracy, "accuracy_min": min(r["accuracy"] for r in accuracy), "tree_path": tree,
        "float64_key_length": longest_key_length([8, 16] if quick else [16, 20, 22, 24, 25, 26, 28], 6, progress),
        "cache_precision": cache_precision([2, 4] if quick else [2, 4, 8, 12, 16], R, progress=progress),
    }
    progress("string hybrid: proof")
    out["proof"] = string_proof.prove_string_hybrid(R, 16, quick=quick)
    out["ablation"] = ablation([0.5, 0.9] if quick else [0.5, 0.9, 0.999], 80 if quick else 200, seed)
    progress("lower bound")
    bounds = lower_bounds(quick)
    bounds["log_precision"] = [{"cache_numbers": s, "c": c, **lower_bound.log_precision_threshold(s, c)}
                               for s, c in ((312, 1.0), (19_759_104, 2.0))]
    out["lower_bound"] = bounds
    slot_bits = 2
    out["memory"] = memory_within_range(slot_bits, R, 10 if quick else 40, seed, progress)
    memory = string_memory.build_string_memory(R, slot_bits).model
    models = [(f"hand-built memory ({1 << slot_bits} slots)", memory),
              ("random pure GDN, 1 layer, D = 16, 1 head 4x4",
               adversary.random_pure_gdn(3, R, hidden_size=16, layers=1, heads=1, head_dim=4, seed=seed))]
    if not quick:
        models.append(("random pure GDN, 2 layers, D = 32, 2 heads 8x8",
                       adversary.random_pure_gdn(3, R, hidden_size=32, layers=2, heads=2, head_dim=8, seed=seed)))
    precisions = ["fx16.8", "bf16"] if quick else ["fx16.8", "fx24.12", "bf16", "fp8"]
    attacks = pure_gdn_attacks(models, precisions, R, slot_bits + 1, seed, progress)
    out["attacks"] = {"rows": attacks, "all_found_verified_within_bound": all(a["within_bound"] for a in attacks)}
    out["claims"] = claims(out)
    out["ok"] = bool(all(c["holds"] for c in out["claims"]))
    out["seconds"] = round(time.perf_counter() - start, 1)
    return out


def _tree_agreement(construction: string_hybrid.StringHybrid, count: int, seed: int) -> dict[str, Any]:
    R = construction.layout.num_values
    leaves = correct = 0
    diff = 0.0
    for inst in generate(StringTaskSpec(5, 3, 3, R), count, seed=seed):
        tree_logits, pairs = string_hybrid.tree_predictions(construction, inst)
        for node, (q0, q1) in enumerate(pairs):
            if q0:
                full = StringInstance(inst.bits, inst.keys, inst.values, (q0, q1), R)
                diff = max(diff, float(np.abs(final_logits(construction.model, full.tokens) - tree_logits[node]).max()))
                leaves += 1
                correct += int(np.argmax(tree_logits[node])) == full.answer
    return {"instances": count, "leaves": leaves, "accuracy": correct / leaves,
            "max_abs_logit_difference_tree_vs_chain": diff}


def _part(report: dict[str, Any], name: str) -> dict[str, Any]:
    return next(p for p in report["parts"] if p["name"] == name)


def claims(out: dict[str, Any]) -> list[dict[str, Any]]:
    """Each claim about PCR-S with its status (one of :data:`STATUSES`), its evidence and whether it held."""
    proof, bounds, h = out["proof"], out["lower_bound"], out["hybrid"]
    retrieval = _part(proof, "string_retrieval_exhaustive")
    fx_parity, fx_encoding = _part(proof, "fixed_point_parity"), _part(proof, "fixed_point_encoding")
    longest = h["float64_key_length"]["longest_solved"]
    table = h["cache_precision"]
    per_letter = table["frac_bits_per_letter"]
    rows = [
        ("The hybrid's parity head: readout sign = parity of the bits so far, for every n (exact arithmetic on its "
         "float64 inputs)", "proved for all sizes", "Z3 induction over token kinds",
         _part(proof, "parity_invariant")["status"] == "proved"),
        ("The hybrid's encode head: readout = (G sum_i u_i 2^-(L-i+1), G), the exact binary encoding of the "
         "reversed key, for every key length", "proved for all sizes", "Z3 induction; Fraction run on every key "
         "up to the stated length", all(_part(proof, n)["status"] == "proved"
                                        for n in ("encoding_invariant", "encoding_exhaustive_exact"))),
        ("Distinct keys of length <= L have directions at least atan(1) - atan(1 - 2^-L) apart",
         "bounded", f"exhaustive, {_part(proof, 'angle_gap_exhaustive')['scope']} (paper: atan concave, all L)",
         _part(proof, "angle_gap_exhaustive")["status"] == "proved"),
        (f"The hybrid (GDN, GDN, attention; width {h['construction']['hidden_size']} for R = 4, fixed in n, m, L; 0 "
         "scratchpad tokens) answers every input in the stated scope (float64)", "bounded",
         f"exhaustive: {retrieval['scope']}; softmax step by Z3",
         retrieval["status"] == "proved" and _part(proof, "softmax_margin")["status"] == "proved"),
        (f"In {fx_parity['details']['format']} fixed-point arithmetic the parity head is exact for every n",
         "proved for all sizes", "every state of the invariant set (finite induction)",
         fx_parity["status"] == "proved"),
        (f"In {fx_encoding['details']['format']} arithmetic the encode head is exact and injective for keys up to "
         f"{fx_encoding['details']['exact_up_to']} letters", "bounded", "every key up to the stated length",
         fx_encoding["status"] == "proved"),
        (f"float64: right on random inputs up to n = {max(r['n'] for r in h['accuracy'])}, m = "
         f"{max(r['m'] for r in h['accuracy'])}, L = {max(r['L'] for r in h['accuracy'])}; tree path = chain path; "
         f"the hardest keys solved up to L = {longest}", "measured", "random and near-key instances",
         h["accuracy_min"] == 1.0 and h["tree_path"]["accuracy"] == 1.0 and longest >= 8),
        ("At a p-bit fixed-point cache the hybrid needs about "
         f"{None if per_letter is None else round(per_letter, 2)}"
         " fraction bits per key letter (p logarithmic in the number of keys)", "measured",
         "smallest fx<p>.<f> per L on near keys", all(r["frac_bits"] is not None for r in table["rows"])),
        ("Pure GDN: any model whose cache is s numbers at p bits answers some PCR-S input wrongly once m >= "
         "floor(s p / log2 R) + 1 (keys of ceil(log2 m) letters, any n)", "proved for all sizes",
         "pigeonhole (Z3) + fooling lemma (Z3) on paper; fooling set and prefix classes exhaustive",
         bounds["status"] == "proved"),
        ("... also at log precision p = c log2 T: computed thresholds, checked to hold beyond",
         "proved for all sizes", "closed form; m / log2 T(m) grows",
         all(r["found"] and r["holds_beyond"] for r in bounds["log_precision"])),
        ("No pure-GDN model of ours solves PCR-S beyond the bound: the hand-built associative memory (exact for keys "
         f"up to {out['memory']['slot_bits']} letters) and random pure GDNs fail, each failure verified (bitwise-equal "
         "caches and logits on two inputs with different answers, or a re-run wrong answer) and within the bound",
         "measured", "adversary at fixed-point and float caches",
         out["attacks"]["all_found_verified_within_bound"] and out["memory"]["exact_within_range"]),
        ("A GDN transition with beta in [0, 1] has spectrum in [0, 1] (any K): the parity head's sign flip needs "
         "beta > 1; with beta in (1, 2] the reflection exists", "proved for all sizes", "Z3 on the Rayleigh quotient",
         _part(bounds, "transition_spectrum")["status"] == "proved"),
        ("With Qwen3-Next's beta = sigmoid(b) in (0, 1) the hybrid's parity head never flips (Z3) and the hybrid is "
         "at the parity-blind level", "measured", "ablation", out["ablation"]["at_chance"]
         and out["ablation"]["sign_never_flips"]),
        ("Whether any hybrid with beta <= 1 solves PCR-S: open (pure LRNN stacks with non-negative eigenvalues "
         "cannot compute parity at finite precision, Grazzi et al. 2025; with attention layers not shown)",
         "argued", "cited", True),
    ]
    return [{"claim": c, "status": s, "evidence": e, "holds": bool(ok)} for c, s, e, ok in rows]
