"""7-8. Lossless tree verification and greedy verification, by exact enumeration of every coin.

``lossless/<variant>`` runs the reference's drafting and verification (``reference/verify.py``:
``step_distribution`` = ``draw_tree`` + ``verify_sampling`` under the exact coin enumerator ``enumerate_outcomes``,
composed over steps by ``speculative_distribution``) and compares the exact distribution of the first 3 emitted tokens
with autoregressive sampling from the target, computed here independently as the product of the target's conditional
probabilities: every tree shape (draw template) up to 4 nodes, vocabularies of 2 to 4 tokens, exact rational target
and draft distributions that depend on the whole context: random (with zeros), p = q, disjoint supports, one-hot q,
one-hot p. Past 4 nodes it checks one step, every emitted position: for every prefix y of the step's emitted tokens,
``P(emit y, then t) = P(emit y and go on) * target(context + y)[t]``, the condition under which repeated steps emit
exactly autoregressive samples whatever follows (every token the step emits is distributed as the target given the
tokens before it). That sweep covers every template of 5 nodes and stars whose root has 5 and 6 children. Since
every coin outcome is enumerated with its exact probability, equality over this finite scope is a proof for it
(``proved``).

``lossless/lossy-residual`` runs the same sweep with the deliberately wrong verifier that skips the residual
renormalisation; it must come out ``refuted``, with the sequence whose probability differs.

``greedy/exhaustive``: for every shape, every labelling with distinct sibling tokens, every argmax at every node
(rows with ties: the lowest token id wins, as for the autoregressive argmax), ``verify_greedy`` emits exactly the
greedy autoregressive tokens, and accepts exactly the longest draft path that agrees with them, both for exact rows
and for the same rows as a float64 array (the path the decoding loop takes with logits).
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable
from fractions import Fraction

import numpy as np

from lumotree.reference.tree import TokenTree

from .core import Context, Outcome, check
from .exact import all_parent_arrays, count_parent_arrays, show

DOCS = "lossless-verification.md"
HORIZON = 3
ROOT_CONTEXT = (0,)
LOSSLESS_MAX_NODES = 4
LOSSLESS_VOCABS = {"quick": (2, 3, 4), "full": (2, 3, 4)}
RANDOM_SEEDS = {"quick": (0,), "full": (0, 1, 2)}
# one step, every emitted position: (templates, vocabularies, root contexts, families); each context seeds its own
# random distributions, so more contexts are more distributions
STEP_SCOPE = {
    "quick": (("5 nodes", (2, 3), ((0,), (1,)), "all"), ("star 6", (5,), ((0,),), "random")),
    "full": (
        ("5 nodes", (2, 3, 4), ((0,), (1,), (0, 1)), "all"),
        ("star 6", (5,), ((0,), (1,)), "all"),
        ("star 6", (6,), ((0,),), "random"),
        ("star 7", (5,), ((0,),), "random"),
    ),
}
# (max nodes, vocab) pairs: every shape up to max nodes, every labelling, every argmax table
GREEDY_SCOPE = {"quick": ((4, 2), (4, 3)), "full": ((5, 2), (5, 3), (4, 4))}

ContextDistribution = Callable[[tuple[int, ...]], list[Fraction]]


# ---------------------------------------------------------------------------------------------------- distributions
def _table(make: Callable[[random.Random], list[int]], seed: str) -> ContextDistribution:
    """A context -> distribution function, exact and deterministic: weights from ``make(rng)`` seeded by context."""
    cache: dict[tuple[int, ...], list[Fraction]] = {}

    def dist(seq: tuple[int, ...]) -> list[Fraction]:
        seq = tuple(seq)
        if seq not in cache:
            weights = make(random.Random(f"{seed}/{seq}"))
            total = sum(weights)
            cache[seq] = [Fraction(w, total) for w in weights]
        return cache[seq]

    return dist


def _random_weights(vocab: int) -> Callable[[random.Random], list[int]]:
    def make(rng: random.Random) -> list[int]:
        w = [rng.randint(0, 5) for _ in range(vocab)]  # zeros included
        if sum(w) == 0:
            w[rng.randrange(vocab)] = 1
        return w

    return make


def _split(rng: random.Random, vocab: int) -> tuple[list[int], list[int]]:
    """A random split of the vocabulary into two non-empty parts."""
    order = list(range(vocab))
    rng.shuffle(order)
    cut = rng.randint(1, vocab - 1)
    return order[:cut], order[cut:]


def distribution_families(vocab: int, seed: int) -> dict[str, tuple[ContextDistribution, ContextDistribution]]:
    """name -> (target, draft): random; p = q; disjoint supports; one-hot q; one-hot p. All depend on the context."""
    random_target = _table(_random_weights(vocab), f"target/{vocab}/{seed}")
    random_draft = _table(_random_weights(vocab), f"draft/{vocab}/{seed}")

    def supported(part: int) -> Callable[[random.Random], list[int]]:
        def make(rng: random.Random) -> list[int]:
            support = _split(rng, vocab)[part]  # the same split for target and draft (same seed string below)
            weights = [0] * vocab
            for t in support:
                weights[t] = 1 + random.Random(f"{rng.random()}/{t}").randint(0, 3)
            return weights

        return make

    def one_hot(rng: random.Random) -> list[int]:
        weights = [0] * vocab
        weights[rng.randrange(vocab)] = 1
        return weights

    return {
        f"random (seed {seed})": (random_target, random_draft),
        f"p = q (seed {seed})": (random_target, random_target),
        f"disjoint supports (seed {seed})": (
            _table(supported(0), f"split/{vocab}/{seed}"),
            _table(supported(1), f"split/{vocab}/{seed}"),
        ),
        f"one-hot q (seed {seed})": (random_target, _table(one_hot, f"onehot-q/{vocab}/{seed}")),
        f"one-hot p (seed {seed})": (_table(one_hot, f"onehot-p/{vocab}/{seed}"), random_draft),
    }


def autoregressive(context: tuple[int, ...], horizon: int, target: ContextDistribution) -> dict[tuple, Fraction]:
    """Exact distribution of ``horizon`` tokens sampled one at a time from ``target`` (zero-probability sequences
    omitted): ``P(y_1..y_H) = prod_t target(context + y_<t)[y_t]``."""
    out: dict[tuple[int, ...], Fraction] = {}
    for seq in itertools.product(range(len(target(context))), repeat=horizon):
        prob = Fraction(1)
        for t in range(horizon):
            prob *= target(context + seq[:t])[seq[t]]
            if prob == 0:
                break
        if prob != 0:
            out[seq] = prob
    return out


# ---------------------------------------------------------------------------------------------------- lossless
def _lossless_sweep(ctx: Context, variant: str, verifier_name: str, what: str) -> Outcome:
    verify = ctx.ref.need("verify")
    verifier = getattr(verify, verifier_name)
    key = "quick" if ctx.quick else "full"
    shapes = [p for n in range(1, LOSSLESS_MAX_NODES + 1) for p in all_parent_arrays(n)]
    vocabs = LOSSLESS_VOCABS[key]
    seeds = RANDOM_SEEDS[key]
    step_scope = STEP_SCOPE[key]
    scope = {
        "trees": f"all {len(shapes)} draw templates with 1..{LOSSLESS_MAX_NODES} nodes, horizon {HORIZON}; one step "
        "(every emitted position) on " + "; ".join(f"{t} (vocab {', '.join(map(str, v))}; root contexts "
                                                   f"{', '.join(map(str, c))}; {f} families)"
                                                   for t, v, c, f in step_scope)
        + f" (variant {variant!r})",
        "dims": f"vocab in {set(vocabs)}, horizon {HORIZON} tokens from context {ROOT_CONTEXT}",
        "numbers": "exact Fractions; every drafting and verification coin enumerated with its exact probability",
        "distributions": "context-dependent random (with zeros), p = q, disjoint supports, one-hot q, one-hot p; "
        f"random seeds {list(seeds)}",
    }
    cases = [(p, v, s) for p in shapes for v in vocabs for s in seeds]
    compared = 0
    for parents, vocab, seed in ctx.cases(cases, note=what):
        for family, (target, draft) in distribution_families(vocab, seed).items():
            truth = autoregressive(ROOT_CONTEXT, HORIZON, target)
            speculative = verify.speculative_distribution(
                ROOT_CONTEXT,
                HORIZON,
                lambda c: verify.step_distribution(c, target, draft, list(parents), variant, verifier),
            )
            speculative = {seq: p for seq, p in speculative.items() if p != 0}
            compared += 1
            if speculative != truth:
                seq = next(s for s in sorted(set(truth) | set(speculative)) if truth.get(s, 0) != speculative.get(s, 0))
                contexts = [ROOT_CONTEXT + seq[:t] for t in range(HORIZON)]
                return Outcome(
                    "refuted",
                    scope,
                    detail=f"P(emit {seq}) = {speculative.get(seq, 0)} by tree verification, {truth.get(seq, 0)} "
                    f"autoregressively ({family}, vocab {vocab}, template {list(parents)})",
                    counterexample={
                        "variant": variant,
                        "verifier": verifier_name,
                        "template": list(parents),
                        "vocab": vocab,
                        "family": family,
                        "context": list(ROOT_CONTEXT),
                        "sequence": list(seq),
                        "speculative": show(speculative.get(seq, 0)),
                        "autoregressive": show(truth.get(seq, 0)),
                        "target": {str(list(c)): show(target(c)) for c in contexts},
                        "draft": {str(list(c)): show(draft(c)) for c in contexts},
                    },
                )
    steps = [(p, v, c, f) for templates, vs, cs, f in step_scope for p in _templates(templates) for v in vs
             for c in cs]
    for parents, vocab, context, families in ctx.cases(steps, note="one step, every position"):
        for family, (target, draft) in distribution_families(vocab, 0).items():
            if families != "all" and not family.startswith(families):
                continue
            step = verify.step_distribution(context, target, draft, list(parents), variant, verifier)
            compared += 1
            failure = step_failure(step, target, context)
            if failure is not None:
                prefix, got, want = failure
                return Outcome(
                    "refuted",
                    scope,
                    detail=f"one step emits {prefix} with probability {got}, not P(reach it) * target = {want} "
                    f"({family}, vocab {vocab}, template {list(parents)})",
                    counterexample={
                        "variant": variant,
                        "verifier": verifier_name,
                        "template": list(parents),
                        "vocab": vocab,
                        "family": family,
                        "context": list(context),
                        "emitted_prefix": list(prefix),
                        "step_probability": show(got),
                        "expected": show(want),
                        "target": {str(list(context + prefix[:t])): show(target(context + prefix[:t]))
                                   for t in range(len(prefix))},
                    },
                )
    return Outcome("proved", scope, detail=f"{compared} (template, vocab, distributions) cases: exactly autoregressive")


def _templates(name: str) -> list[tuple[int, ...]]:
    """``"5 nodes"``: every template of exactly 5 nodes; ``"star n"``: the root with ``n - 1`` children."""
    count = int(name.split()[-1] if name.startswith("star") else name.split()[0])
    return [(-1, *([0] * (count - 1)))] if name.startswith("star") else list(all_parent_arrays(count))


def step_failure(
    step: dict, target: ContextDistribution, context: tuple[int, ...]
) -> tuple[tuple[int, ...], Fraction, Fraction] | None:
    """For one step's exact distribution of emitted tuples from ``context``: the first prefix ``y + (t,)`` with
    ``P(emit y + (t,) ...) != P(emit y and more) * target(context + y)[t]``, or None."""
    reach: dict[tuple[int, ...], Fraction] = {}  # P(the step emits a sequence starting with y)
    more: dict[tuple[int, ...], Fraction] = {}  # P(it emits y and at least one more token)
    for emitted, p in step.items():
        for t in range(len(emitted) + 1):
            reach[emitted[:t]] = reach.get(emitted[:t], 0) + p
            if t < len(emitted):
                more[emitted[:t]] = more.get(emitted[:t], 0) + p
    for prefix in sorted(set(more) | {y[:-1] for y in reach if y}, key=lambda y: (len(y), y)):
        row = target(context + prefix)
        for t in range(len(row)):
            want = more.get(prefix, 0) * row[t]
            if reach.get(prefix + (t,), 0) != want:
                return prefix + (t,), reach.get(prefix + (t,), 0), want
    return None


def _variant_check(variant: str) -> Callable[[Context], Outcome]:
    def run(ctx: Context) -> Outcome:
        return _lossless_sweep(ctx, variant, "verify_sampling", "templates x vocab")

    run.__name__ = f"lossless_{variant}"
    return run


for _variant, _label, _weight in (("iid", "iid", 12), ("without_replacement", "without-replacement", 7),
                                  ("deterministic", "top-k", 2)):
    check(
        f"lossless/{_label}",
        claim=f"tree verification with {_variant} proposals emits tokens distributed exactly as autoregressive "
        f"sampling from the target ({HORIZON}-token horizon, and every position of one step on larger templates)",
        docs=DOCS,
        weight=_weight,
    )(_variant_check(_variant))


@check(
    "lossless/lossy-residual",
    claim="the deliberately wrong verifier (no residual renormalisation) is caught: its emitted distribution differs",
    expected="refuted",
    docs=DOCS,
)
def lossy_variant(ctx: Context) -> Outcome:
    return _lossless_sweep(ctx, "iid", "verify_sampling_lossy_unnormalised_residual", "templates x vocab")


# ---------------------------------------------------------------------------------------------------- greedy
def _labellings(parents: tuple[int, ...], vocab: int, root_token: int):
    """Every token labelling with the given root token and distinct tokens among siblings."""
    n = len(parents)
    for labels in itertools.product(range(vocab), repeat=n - 1):
        tokens = (root_token, *labels)
        seen = set()
        ok = True
        for i in range(1, n):
            key = (parents[i], tokens[i])
            if key in seen:
                ok = False
                break
            seen.add(key)
        if ok:
            yield tokens


def _row_with_argmax(best: int, vocab: int, node: int) -> list[Fraction]:
    """A distribution whose argmax (ties to the lowest id) is ``best``: some higher ids tie with it."""
    weights = [1] * vocab
    weights[best] = 2
    for t in range(best + 1, vocab):
        if (t + node) % 2 == 0:
            weights[t] = 2  # a tie: the lower id ``best`` must still win
    total = sum(weights)
    return [Fraction(w, total) for w in weights]


def _greedy_autoregressive(rows_by_context: dict[tuple, list[Fraction]], length: int, vocab: int) -> list[int]:
    """``length`` greedy tokens from the root context: argmax with ties to the lowest id. Contexts outside the draft
    tree get token 0 (arbitrary: only tokens up to the first one leaving the tree are compared)."""
    seq: tuple[int, ...] = ()
    out = []
    for _ in range(length):
        row = rows_by_context.get(seq)
        best = 0 if row is None else min(t for t in range(vocab) if row[t] == max(row))
        out.append(best)
        seq = seq + (best,)
    return out


@check(
    "greedy/exhaustive",
    claim="verify_greedy emits exactly the greedy autoregressive tokens and accepts the longest agreeing draft path",
    docs=DOCS,
)
def greedy_exhaustive(ctx: Context) -> Outcome:
    verify = ctx.ref.need("verify")
    pairs = GREEDY_SCOPE["quick" if ctx.quick else "full"]
    scope = {
        "trees": "; ".join(
            f"all {count_parent_arrays(n)} shapes with 1..{n} nodes for vocab {v}" for n, v in pairs
        )
        + "; every labelling with distinct sibling tokens",
        "dims": "every argmax at every node (rows with ties, lowest id wins)",
        "numbers": "exact Fractions, and the same rows as a float64 array",
    }
    cases = [(p, v) for n, v in pairs for m in range(1, n + 1) for p in all_parent_arrays(m)]
    runs = 0
    for parents, vocab in ctx.cases(cases, note="shapes x vocab"):
        n = len(parents)
        for tokens in _labellings(parents, vocab, root_token=0):
            tree = TokenTree(parents, tokens)
            # context of node i = draft tokens on the path below the root
            contexts = [tuple(tokens[j] for j in tree.path(i)[1:]) for i in range(n)]
            draft_paths = set(contexts)
            for argmaxes in itertools.product(range(vocab), repeat=n):
                rows = [_row_with_argmax(argmaxes[i], vocab, i) for i in range(n)]
                greedy = _greedy_autoregressive(dict(zip(contexts, rows)), n, vocab)
                longest = max(m for m in range(n) if tuple(greedy[:m]) in draft_paths)
                for number_system in ("exact", "float64"):
                    table = rows if number_system == "exact" else np.array(rows, dtype=np.float64)  # [N, vocab]
                    result = verify.verify_greedy(tree, table)
                    runs += 1
                    emitted = list(result.emitted)
                    if emitted != greedy[: longest + 1] or len(result.accepted_tokens) != longest:
                        break
                if emitted != greedy[: longest + 1] or len(result.accepted_tokens) != longest:
                    return Outcome(
                        "refuted",
                        scope,
                        detail=f"emitted {emitted}, greedy autoregressive {greedy[: longest + 1]}, accepted "
                        f"{len(result.accepted_tokens)} tokens where the longest agreeing draft path has {longest}",
                        counterexample={
                            "tree": list(parents),
                            "tokens": list(tokens),
                            "vocab": vocab,
                            "number_system": number_system,
                            "target_rows": show(rows),
                            "emitted": emitted,
                            "greedy_autoregressive": greedy[: longest + 1],
                            "accepted_nodes": list(result.accepted_nodes),
                            "longest_agreeing_path": longest,
                        },
                    )
    return Outcome("proved", scope, detail=f"{runs} (labelled tree, argmax table) cases, all greedy")

