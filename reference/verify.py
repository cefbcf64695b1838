r"""Tree verification: greedy, and lossless sampling by recursive rejection sampling, on any number type.

A draft tree (:class:`~lumotree.reference.tree.TokenTree`) has the pending token at node 0. The target model gives,
for every node u, the distribution ``P_u`` of the token that follows the path root..u (``target: [N, vocab]``).

**Greedy.** Node i is accepted iff its token equals ``argmax P_{parent(i)}`` and its parent is accepted. Siblings
carry distinct tokens, so at most one child of an accepted node is accepted: the accepted nodes form one path, and
its last node (the deepest accepted node) is unique. The argmax there is the next pending token. Argmax ties go to
the lowest token id (as ``numpy.argmax``).

**Lossless sampling** (recursive rejection sampling, SpecInfer). At an accepted node u, start with the residual
``R = P_u``. For each child c of u in draw order (token ``x_c`` drawn from the proposal ``Q_c``)::

    accept c with probability min(1, R(x_c) / Q_c(x_c))  and descend into c;
    on rejection:  R <- norm(max(0, R - Q_c)).

If every child is rejected, emit ``y ~ R``. Then the emitted tokens (accepted path, then y) are distributed exactly as
autoregressive sampling from the target, provided ``Q_c`` is exactly what the drafter sampled ``x_c`` from and the
tree's shape does not depend on the target's randomness. Three proposal variants (:data:`VARIANTS`):

- ``"iid"``: the children of u are i.i.d. draws from the drafter's ``Q_u``, so ``Q_c = Q_u`` (SpecInfer). Two draws
  of the same token become one node, visited once per draw (:attr:`DraftProposal.draws`).
- ``"without_replacement"``: the j-th child of u is drawn from ``Q_u`` with the tokens of children 1..j-1 removed and
  the rest renormalised; ``Q_c`` is that renormalised distribution.
- ``"deterministic"``: the children are chosen without randomness (top-k of ``Q_u``, an n-gram lookup, ...), so
  ``Q_c`` is the point mass at ``x_c``: accept with probability ``R(x_c)``; on rejection zero ``R(x_c)``, renormalise.

**Random coins are passed in** (:mod:`~lumotree.reference.coins`): sampled, or enumerated exactly. With the drafting
side (:func:`draw_tree`) and the composition helpers (:func:`step_distribution`, :func:`speculative_distribution`,
:func:`autoregressive_distribution`) this is what ``lumotree.proofs`` uses to check losslessness exactly.

Probabilities may be Python floats / float64 arrays (sums checked to 1e-9) or exact numbers (``Fraction``, sympy
numbers; sums checked exactly). Comparisons must be decidable, so sympy expressions with free symbols are refused.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .coins import FLOAT_SUM_TOLERANCE, Coins, RandomCoins, enumerate_outcomes, is_float
from .tree import TokenTree, validate_parents

__all__ = ["VARIANTS", "Coins", "RandomCoins", "enumerate_outcomes", "DraftProposal", "VerifyResult",
           "check_distribution", "argmax", "residual", "verify_greedy", "verify_sampling",
           "verify_sampling_lossy_unnormalised_residual", "DraftBuilder", "draw_tree", "speculative_step",
           "step_distribution", "speculative_distribution", "autoregressive_distribution"]

VARIANTS = ("iid", "without_replacement", "deterministic")

Prob = Any  # float, Fraction, sympy number: anything with +, -, *, / and decidable comparisons
Distribution = Sequence[Prob]


# ---------------------------------------------------------------------------------------------------- validation
_VALIDATED_EXACT: set[tuple] = set()  # exact vectors already found valid (equal values are equally valid)
_VALIDATED_EXACT_LIMIT = 1 << 16


def check_distribution(name: str, probs: Any, vocab_size: int | None = None) -> list[Prob]:
    """Validate a probability vector and return it as a list of Python numbers.

    One-dimensional, length ``vocab_size`` (when given), entries non-negative (and finite for floats), one number system
    (all floats or all exact), summing to 1 exactly for exact numbers and within 1e-9 for floats. Errors name ``name``.
    """
    if isinstance(probs, np.ndarray):
        if probs.ndim != 1:
            raise ValueError(f"{name} must be a 1-D probability vector, got shape {probs.shape}")
        if probs.dtype.kind not in "fiuO":
            raise TypeError(f"{name} has dtype {probs.dtype}; expected float, integer or object (exact) entries")
        values = probs.tolist()
    elif isinstance(probs, Sequence) and not isinstance(probs, (str, bytes)):
        values = list(probs)
    else:
        raise TypeError(f"{name} must be a sequence or 1-D array of probabilities, got {type(probs).__name__}")
    if vocab_size is not None and len(values) != vocab_size:
        raise ValueError(f"{name} has {len(values)} entries, expected vocab_size = {vocab_size}")
    if not values:
        raise ValueError(f"{name} is empty")
    key = None
    if not is_float(values[0]):  # exact vectors recur across the enumerator's replays: validate each once
        try:
            key = tuple(values)
            if key in _VALIDATED_EXACT:
                return values
        except TypeError:  # unhashable elements: validate every time
            key = None
    floats = [is_float(x) for x in values]
    if any(floats) and not all(floats):
        i = floats.index(False) if floats[0] else floats.index(True)
        raise TypeError(
            f"{name} mixes floats and exact numbers (e.g. {name}[{i}] = {values[i]!r}); use one number system"
        )
    for i, x in enumerate(values):
        if isinstance(x, (bool, complex)) or not hasattr(x, "__add__"):
            raise TypeError(f"{name}[{i}] = {x!r} is not a real number")
        if floats[0] and not math.isfinite(x):
            raise ValueError(f"{name}[{i}] = {x} is not finite")
        try:
            negative = bool(x < 0)
        except TypeError as exc:
            raise ValueError(f"{name}[{i}] = {x} cannot be compared with 0 (a free symbol?)") from exc
        if negative:
            raise ValueError(f"{name}[{i}] = {x} is negative")
    total = sum(values)
    if floats[0]:
        if abs(total - 1) > FLOAT_SUM_TOLERANCE:
            raise ValueError(f"{name} sums to {total}, not 1 (float tolerance {FLOAT_SUM_TOLERANCE})")
        return [float(x) for x in values]
    if not bool(total == 1):
        raise ValueError(f"{name} sums to {total}, not exactly 1")
    if key is not None:
        if len(_VALIDATED_EXACT) >= _VALIDATED_EXACT_LIMIT:
            _VALIDATED_EXACT.clear()
        _VALIDATED_EXACT.add(key)
    return values


def _check_rows(name: str, rows: Any, num_rows: int, vocab_size: int | None = None) -> list[list[Prob]]:
    """``rows: [num_rows, vocab]`` distributions, validated one by one (errors name ``name[i]``)."""
    if isinstance(rows, np.ndarray):
        if rows.ndim != 2:
            raise ValueError(f"{name} must be [N, vocab], got shape {rows.shape}")
    if len(rows) != num_rows:
        raise ValueError(f"{name} has {len(rows)} rows but the tree has {num_rows} nodes")
    out = []
    for i in range(num_rows):
        out.append(check_distribution(f"{name}[{i}]", rows[i], vocab_size))
        vocab_size = len(out[-1])
    if any(is_float(r[0]) for r in out) and not all(is_float(r[0]) for r in out):
        raise TypeError(f"{name} mixes float rows and exact rows; use one number system")
    return out


def argmax(values: Sequence[Any]) -> int:
    """Index of the largest entry; ties go to the lowest index (as ``numpy.argmax``). Any comparable numbers."""
    best = 0
    for i in range(1, len(values)):
        if values[i] > values[best]:
            best = i
    return best


def residual(R: Sequence[Prob], Q: Sequence[Prob]) -> list[Prob]:
    """``norm(max(0, R - Q))``: the target left over after a rejected proposal from ``Q``.

    The normaliser is positive whenever the rejection had positive probability (``R != Q``). With floats a rejection
    of probability ~1e-16 can leave it at 0; then ``R`` is returned unchanged (what remains is rounding noise).
    """
    excess = [max(0, r - q) for r, q in zip(R, Q)]
    total = sum(excess)
    if total == 0:
        if is_float(total) or any(is_float(r) for r in R):
            return list(R)
        raise ValueError("residual: R equals Q, so a rejection has probability 0 and no residual exists")
    return [x / total for x in excess]


def _unnormalised_excess(R: Sequence[Prob], Q: Sequence[Prob]) -> list[Prob]:
    """The lossy variant's residual: ``max(0, R - Q)`` left unnormalised (``R`` itself once nothing is left)."""
    excess = [max(0, r - q) for r, q in zip(R, Q)]
    return excess if sum(excess) != 0 else list(R)


# ---------------------------------------------------------------------------------------------------- proposals
def _freeze(dist: Any) -> tuple[Prob, ...]:
    return tuple(dist.tolist()) if isinstance(dist, np.ndarray) else tuple(dist)


@dataclass(frozen=True)
class DraftProposal:
    """A draft tree plus what it was sampled from: everything verification needs besides the target.

    - ``tree``: a :class:`TokenTree` carrying tokens; node 0 is the pending token.
    - ``variant``: one of :data:`VARIANTS`.
    - ``proposals[u]``: the drafter's distribution ``Q_u`` (over the vocabulary) that the children of u were drawn from;
      required for every node with children in the ``"iid"`` and ``"without_replacement"`` variants, ``None``
      elsewhere allowed (``"deterministic"`` proposals are point masses and need none).
    - ``draws[u]``: the children of u in the order they were drawn; an ``"iid"`` token drawn twice appears twice.
      ``None`` means each child once, in index order.

    Hashable (distributions are stored as tuples), so drafts can be outcomes of :func:`enumerate_outcomes`.
    """

    tree: TokenTree
    variant: str
    proposals: tuple[tuple[Prob, ...] | None, ...] | None = None
    draws: tuple[tuple[int, ...], ...] | None = None
    vocab_size: int | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        tree = self.tree
        if not isinstance(tree, TokenTree):
            raise TypeError(f"tree must be a TokenTree, got {type(tree).__name__}")
        if tree.tokens is None:
            raise ValueError("tree must carry tokens (TokenTree(parents, tokens))")
        if self.variant not in VARIANTS:
            raise ValueError(f"variant = {self.variant!r} is not one of {VARIANTS}")
        n = tree.num_nodes
        proposals = self.proposals
        if proposals is None:
            proposals = (None,) * n
        if len(proposals) != n:
            raise ValueError(f"proposals has {len(proposals)} entries but the tree has {n} nodes")
        frozen = tuple(None if q is None else _freeze(q) for q in proposals)
        object.__setattr__(self, "proposals", frozen)
        draws = self.draws
        if draws is None:
            draws = tuple(tree.children(u) for u in range(n))
        if len(draws) != n:
            raise ValueError(f"draws has {len(draws)} entries but the tree has {n} nodes")
        draws = tuple(tuple(int(c) for c in d) for d in draws)
        object.__setattr__(self, "draws", draws)
        for u in range(n):
            kids = tree.children(u)
            if set(draws[u]) != set(kids):
                raise ValueError(
                    f"draws[{u}] = {list(draws[u])} must list exactly the children {list(kids)} of node {u}"
                )
            if len(draws[u]) != len(kids) and self.variant != "iid":
                raise ValueError(f"draws[{u}] repeats a child; only the 'iid' variant can draw a token twice")
            if kids and self.variant != "deterministic" and frozen[u] is None:
                raise ValueError(f"proposals[{u}] is missing: node {u} has children drawn from it ({self.variant})")
        for u, q in enumerate(frozen):
            if q is not None:
                check_distribution(f"proposals[{u}]", q, self.vocab_size)
        for c in range(1, n):
            q = frozen[tree.parents[c]]
            token = tree.tokens[c]
            size = self.vocab_size if self.vocab_size is not None else (len(q) if q is not None else None)
            if size is not None and token >= size:
                raise ValueError(f"tree.tokens[{c}] = {token} is outside the vocabulary of size {size}")
            if q is not None and self.variant != "deterministic" and q[token] == 0:
                raise ValueError(
                    f"tree.tokens[{c}] = {token} has probability 0 under proposals[{tree.parents[c]}]: it cannot have "
                    "been drawn from it"
                )

    def child_proposals(self, node: int, vocab_size: int) -> list[tuple[int, list[Prob]]]:
        """``[(child, Q_c)]`` for every draw at ``node`` in draw order, ``Q_c`` as the variant defines it."""
        tokens = self.tree.tokens
        assert tokens is not None
        out: list[tuple[int, list[Prob]]] = []
        if not self.draws[node]:
            return out
        if self.variant == "deterministic":
            for c in self.draws[node]:
                point = [0] * vocab_size
                point[tokens[c]] = 1
                out.append((c, point))
            return out
        base = self.proposals[node]
        assert base is not None
        if len(base) != vocab_size:
            raise ValueError(f"proposals[{node}] has {len(base)} entries but the target's vocabulary has {vocab_size}")
        if self.variant == "iid":
            return [(c, list(base)) for c in self.draws[node]]
        remaining = list(base)  # without replacement: remove tried tokens, renormalise
        for c in self.draws[node]:
            total = sum(remaining)
            out.append((c, [x / total for x in remaining]))
            remaining[tokens[c]] = 0 * remaining[tokens[c]]
        return out


@dataclass(frozen=True)
class VerifyResult:
    """The accepted path (``accepted_nodes``, root first), its draft tokens (root excluded) and the next token.

    ``emitted = accepted_tokens + (next_token,)`` are the tokens this step adds to the output; ``next_token`` is also
    the next step's pending root.
    """

    accepted_nodes: tuple[int, ...]
    accepted_tokens: tuple[int, ...]
    next_token: int

    @property
    def last_node(self) -> int:
        return self.accepted_nodes[-1]

    @property
    def accepted_length(self) -> int:
        """Number of draft tokens accepted (the root, already emitted, does not count)."""
        return len(self.accepted_tokens)

    @property
    def emitted(self) -> tuple[int, ...]:
        return self.accepted_tokens + (self.next_token,)


def _result(tree: TokenTree, path: list[int], next_token: int) -> VerifyResult:
    assert tree.tokens is not None
    return VerifyResult(tuple(path), tuple(tree.tokens[i] for i in path[1:]), int(next_token))


# ---------------------------------------------------------------------------------------------------- verification
def verify_greedy(tree: TokenTree, target: Any) -> VerifyResult:
    """Greedy tree verification. ``target: [N, vocab]`` logits or probabilities (only their argmax matters).

    Descends from the root while the child carrying ``argmax target[u]`` exists; that argmax at the last accepted
    node is the next token. Equivalent to the node-wise rule in the module docstring (siblings are distinct).
    """
    if not isinstance(tree, TokenTree) or tree.tokens is None:
        raise ValueError("tree must be a TokenTree carrying tokens")
    if isinstance(target, np.ndarray) and target.dtype.kind == "f":
        if target.ndim != 2 or target.shape[0] != tree.num_nodes:
            raise ValueError(f"target has shape {target.shape}, expected [N, vocab] with N = {tree.num_nodes}")
        if not np.all(np.isfinite(target)):
            raise ValueError("target contains NaN or inf")
        best = np.argmax(target, axis=1).tolist()  # [N]
    else:
        if len(target) != tree.num_nodes:
            raise ValueError(f"target has {len(target)} rows but the tree has {tree.num_nodes} nodes")
        best = [argmax(list(row)) for row in target]
    vocab_size = len(target[0])
    for c in range(tree.num_nodes):
        if tree.tokens[c] >= vocab_size:
            raise ValueError(f"tree.tokens[{c}] = {tree.tokens[c]} is outside the vocabulary of size {vocab_size}")
    path = [0]
    while True:
        child = tree.child_with_token(path[-1], best[path[-1]])
        if child is None:
            return _result(tree, path, best[path[-1]])
        path.append(child)


def _recursive_rejection(
    proposal: DraftProposal, target: Any, coins: Coins, on_reject: Callable[[list, list], list]
) -> VerifyResult:
    if not isinstance(proposal, DraftProposal):
        raise TypeError(f"proposal must be a DraftProposal, got {type(proposal).__name__}")
    tree = proposal.tree
    P = _check_rows("target", target, tree.num_nodes, proposal.vocab_size)
    vocab_size = len(P[0])
    tokens = tree.tokens
    assert tokens is not None
    for c in range(tree.num_nodes):
        if tokens[c] >= vocab_size:
            raise ValueError(f"tree.tokens[{c}] = {tokens[c]} is outside the vocabulary of size {vocab_size}")
    path = [0]
    while True:
        node = path[-1]
        R = P[node]
        for child, Q in proposal.child_proposals(node, vocab_size):
            x = tokens[child]
            if coins.bernoulli(min(1, R[x] / Q[x])):
                path.append(child)
                break
            R = on_reject(R, Q)
        else:
            total = sum(R)
            return _result(tree, path, coins.categorical([r / total for r in R]))


def verify_sampling(proposal: DraftProposal, target: Any, coins: Coins) -> VerifyResult:
    """Lossless tree verification (recursive rejection sampling) of ``proposal`` against ``target: [N, vocab]``.

    ``target[u]`` is the target distribution after the path root..u. Coins decide every acceptance and the final
    token; see the module docstring for the rule and the variants.
    """
    return _recursive_rejection(proposal, target, coins, residual)


def verify_sampling_lossy_unnormalised_residual(proposal: DraftProposal, target: Any, coins: Coins) -> VerifyResult:
    """DELIBERATELY WRONG: recursive rejection sampling that skips the residual renormalisation.

    On rejection it keeps ``R = max(0, R - Q_c)`` unnormalised, so later siblings are accepted with probability
    ``min(1, R(x)/Q(x))`` computed from too little mass (the final ``y`` is still drawn from ``norm(R)``; should the
    excess vanish, ``R`` is kept). This is
    lossy as soon as a node has two or more draws. It exists so that tests and proofs can show their checks fail.
    """
    return _recursive_rejection(proposal, target, coins, _unnormalised_excess)


# ---------------------------------------------------------------------------------------------------- drafting side
def _top_tokens(dist: Sequence[Prob]) -> list[int]:
    """Tokens of positive probability, most probable first, ties to the lower id."""
    return [t for t in sorted(range(len(dist)), key=lambda t: (-dist[t], t)) if dist[t] != 0]


class DraftBuilder:
    """Grows a draft tree one draw at a time and records what :class:`DraftProposal` needs (proposals, draw order).

    ``draw(node, Q, coins)`` draws one child token at ``node`` from ``Q`` (the drafter's distribution after the path
    root..node) as the variant says:

    - ``"iid"``: ``coins.categorical(Q)``; a token already drawn at ``node`` merges into that child (drawn twice);
    - ``"without_replacement"``: from ``Q`` with the node's earlier draws removed and renormalised;
    - ``"deterministic"``: the next most probable token of ``Q`` (ties to the lower id, positive mass only; no coins).

    It returns the child's node index, or None when no token is left to draw (nothing is recorded then). Every draw at
    one node must use the same ``Q``. Lossless verification needs the decision to draw to depend only on the drafter's
    side (earlier draws, draft probabilities), never on the target, and a drawn child is never removed again.
    """

    def __init__(self, root_token: int, variant: str):
        if variant not in VARIANTS:
            raise ValueError(f"variant = {variant!r} is not one of {VARIANTS}")
        self.variant = variant
        self.parents: list[int] = [-1]
        self.tokens: list[int] = [int(root_token)]
        self.proposals: list[list[Prob] | None] = [None]
        self.draws: list[list[int]] = [[]]
        self.vocab_size: int | None = None

    @property
    def num_nodes(self) -> int:
        return len(self.parents)

    def path_tokens(self, node: int) -> tuple[int, ...]:
        """Tokens from the root to ``node`` inclusive."""
        out = []
        while node >= 0:
            out.append(self.tokens[node])
            node = self.parents[node]
        return tuple(out[::-1])

    def draw(self, node: int, Q: Distribution, coins: Coins | None) -> int | None:
        if not 0 <= node < self.num_nodes:
            raise ValueError(f"node = {node} is not a node of the draft (0..{self.num_nodes - 1})")
        if self.proposals[node] is None:
            self.proposals[node] = check_distribution(f"Q at draft node {node}", Q, self.vocab_size)
            self.vocab_size = len(self.proposals[node])
        Q = self.proposals[node]
        drawn = [self.tokens[c] for c in self.draws[node]]
        if self.variant == "deterministic":
            ranked = [t for t in _top_tokens(Q) if t not in drawn]
            if not ranked:
                return None
            token = ranked[0]
        else:
            if coins is None:
                raise ValueError(f"the {self.variant!r} variant draws with coins; coins is None")
            if self.variant == "iid":
                token = coins.categorical(Q)
            else:
                remaining = [0 * q if t in drawn else q for t, q in enumerate(Q)]
                total = sum(remaining)
                if total == 0:
                    return None
                token = coins.categorical([q / total for q in remaining])
        child = next((c for c in self.draws[node] if self.tokens[c] == token), None)
        if child is None:
            child = self.num_nodes
            self.parents.append(node)
            self.tokens.append(int(token))
            self.proposals.append(None)
            self.draws.append([])
        self.draws[node].append(child)
        return child

    def proposal(self) -> DraftProposal:
        return DraftProposal(
            tree=TokenTree(self.parents, self.tokens),
            variant=self.variant,
            proposals=tuple(None if q is None else tuple(q) for q in self.proposals),
            draws=tuple(tuple(d) for d in self.draws),
            vocab_size=self.vocab_size,
        )


def draw_tree(
    template: Sequence[int] | TokenTree,
    root_token: int,
    proposal_at: Callable[[tuple[int, ...]], Distribution],
    variant: str,
    coins: Coins,
) -> DraftProposal:
    """Draw a draft tree of a fixed shape: the drafting side that matches :func:`verify_sampling`.

    ``template`` is the parent array of draw slots (node 0 = the pending ``root_token``). Slots are filled in index
    order; slot s makes one :meth:`DraftBuilder.draw` at its parent slot's node u with
    ``Q_u = proposal_at(path tokens root..u)``. A slot with nothing left to draw is dropped with its sub-slots; iid
    duplicates merge (so the tree can be smaller than the template). Run under :func:`enumerate_outcomes` it gives the
    exact probability of every draft.
    """
    slot_parents = template.parents if isinstance(template, TokenTree) else validate_parents(template, "template")
    builder = DraftBuilder(root_token, variant)
    slot_node: list[int | None] = [0]
    for s in range(1, len(slot_parents)):
        u = slot_node[slot_parents[s]]
        if u is None:  # the parent slot was dropped
            slot_node.append(None)
            continue
        Q = builder.proposals[u]
        slot_node.append(builder.draw(u, proposal_at(builder.path_tokens(u)) if Q is None else Q, coins))
    return builder.proposal()


# ---------------------------------------------------------------------------------------------------- exact analysis
ContextDistribution = Callable[[tuple[int, ...]], Distribution]


def speculative_step(
    context: tuple[int, ...],
    target: ContextDistribution,
    draft: ContextDistribution,
    template: Sequence[int] | TokenTree,
    variant: str,
    coins: Coins,
    verify: Callable[[DraftProposal, Any, Coins], VerifyResult] = verify_sampling,
) -> tuple[int, ...]:
    """One speculative step on sequence-level distributions; returns the emitted tokens.

    ``context`` ends with the pending token. ``target(seq)`` / ``draft(seq)`` give the distribution of the token after
    ``seq``. The draft is drawn with :func:`draw_tree` (``Q_u = draft(context + path(u)[1:])``), the target rows are
    ``P_u = target(context + path(u)[1:])``, then ``verify`` (default :func:`verify_sampling`) runs on the same coins.
    """
    context = tuple(context)
    head = context[:-1]
    proposal = draw_tree(template, context[-1], lambda path: draft(head + path), variant, coins)
    tree = proposal.tree
    assert tree.tokens is not None
    node_paths: list[tuple[int, ...]] = []
    for i, p in enumerate(tree.parents):
        node_paths.append((tree.tokens[i],) if p < 0 else node_paths[p] + (tree.tokens[i],))
    rows = [target(head + path) for path in node_paths]
    return verify(proposal, rows, coins).emitted


def step_distribution(
    context: tuple[int, ...],
    target: ContextDistribution,
    draft: ContextDistribution,
    template: Sequence[int] | TokenTree,
    variant: str,
    verify: Callable[[DraftProposal, Any, Coins], VerifyResult] = verify_sampling,
) -> dict[tuple[int, ...], Prob]:
    """Exact distribution of one :func:`speculative_step`'s emitted tokens (drafting and verification coins)."""
    return enumerate_outcomes(
        lambda coins: speculative_step(context, target, draft, template, variant, coins, verify)
    )


def speculative_distribution(
    context: tuple[int, ...],
    horizon: int,
    step: Callable[[tuple[int, ...]], Mapping[tuple[int, ...], Prob]],
) -> dict[tuple[int, ...], Prob]:
    """Exact distribution of the first ``horizon`` emitted tokens of repeated steps from ``context``.

    ``step(context)`` is the exact distribution of one step's emitted tokens (non-empty tuples), e.g. a
    :func:`step_distribution` closure. Steps compose as a Markov chain on the token sequence (memoised per context);
    a step that overshoots the horizon is truncated.
    """
    if horizon < 0:
        raise ValueError(f"horizon = {horizon} must be >= 0")
    step_cache: dict[tuple[int, ...], Mapping[tuple[int, ...], Prob]] = {}
    memo: dict[tuple[tuple[int, ...], int], dict[tuple[int, ...], Prob]] = {}

    def outcomes(ctx: tuple[int, ...], remaining: int) -> dict[tuple[int, ...], Prob]:
        if remaining == 0:
            return {(): 1}
        key = (ctx, remaining)
        if key in memo:
            return memo[key]
        if ctx not in step_cache:
            step_cache[ctx] = step(ctx)
        out: dict[tuple[int, ...], Prob] = {}
        for emitted, p in step_cache[ctx].items():
            if len(emitted) == 0:
                raise ValueError(f"a step from context {ctx} emitted no token")
            head = tuple(emitted[:remaining])
            for rest, q in outcomes(ctx + head, remaining - len(head)).items():
                out[head + rest] = out.get(head + rest, 0) + p * q
        memo[key] = out
        return out

    return outcomes(tuple(context), horizon)


def autoregressive_distribution(
    context: tuple[int, ...], horizon: int, target: ContextDistribution
) -> dict[tuple[int, ...], Prob]:
    """Exact distribution of ``horizon`` tokens sampled one by one from ``target`` after ``context``."""
    if horizon < 0:
        raise ValueError(f"horizon = {horizon} must be >= 0")
    if horizon == 0:
        return {(): 1}
    P = check_distribution(f"target({tuple(context)})", target(tuple(context)))
    out: dict[tuple[int, ...], Prob] = {}
    for token, p in enumerate(P):
        if p == 0:
            continue
        for rest, q in autoregressive_distribution(tuple(context) + (token,), horizon - 1, target).items():
            out[(token,) + rest] = p * q
    return out

