"""Reference speculative decoding loop (tree drafts, greedy or lossless sampling) and plain autoregressive decoding.

Model API used (``lumotree.reference.model``): ``model.new_cache()``; ``model.forward(token_ids, cache)`` -> float64
logits ``[T, vocab]``, advancing the cache; ``model.verify_tree(tokens, tree, cache)`` -> ``[N, vocab]`` logits of every
node without touching the cache (node 0 is the pending token); ``model.commit(tokens, tree, node, cache)`` advances the
cache along the path root..node; ``model.vocab_size``.

One speculative step, with ``context`` = prompt + emitted tokens, whose last token is the pending root (sampled, not
yet run through the target, so the cache holds ``context[:-1]``)::

    proposal = drafter.propose(context, sampling, coins)       # tree rooted at the pending token + its proposals
    logits   = model.verify_tree(tree.tokens, tree, cache)     # [N, vocab]
    result   = verify_greedy(tree, logits) | verify_sampling(proposal, softmax(logits / T), coins)
    model.commit(tree.tokens, tree, result.last_node, cache)   # cache now holds context[:-1] + accepted path
    drafter.advance(proposal, result)
    emit result.emitted  (accepted draft tokens, then the next pending token)

Greedy speculative decoding emits exactly the tokens of greedy autoregressive decoding; sampling emits tokens with
exactly the distribution of autoregressive sampling (see :mod:`lumotree.reference.verify`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from numbers import Integral
from typing import Any, Protocol, runtime_checkable

import numpy as np

from .tree import TokenTree
from .verify import Coins, DraftProposal, RandomCoins, VerifyResult, verify_greedy, verify_sampling

__all__ = [
    "Sampling",
    "Drafter",
    "StepRecord",
    "DecodeResult",
    "check_prompt",
    "next_token",
    "autoregressive_decode",
    "speculative_decode",
]


@dataclass(frozen=True)
class Sampling:
    """Sampling from ``softmax(logits / temperature)``; ``None`` in place of a ``Sampling`` means greedy (argmax)."""

    temperature: float = 1.0

    def __post_init__(self) -> None:
        t = self.temperature
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not np.isfinite(t) or t <= 0:
            raise ValueError(
                f"sampling.temperature = {t!r} must be a positive finite number (use sampling=None for greedy)"
            )

    def probabilities(self, logits: np.ndarray) -> np.ndarray:
        """``softmax(logits / temperature)`` along the last axis, float64 (``[..., vocab]``).

        The row maximum is subtracted *before* dividing by the temperature, so no temperature overflows: where
        ``(logit - max) / temperature`` underflows to ``-inf`` the probability is 0, and a temperature so small that
        every other logit vanishes gives the greedy limit (all mass on the maximum, split evenly between exact ties).
        ``logits`` holding NaN or ``+inf``, or a row without a finite entry, raise ``ValueError``.
        """
        x = np.asarray(logits, dtype=np.float64)  # [..., vocab]
        if np.isnan(x).any() or np.isposinf(x).any():
            raise ValueError("logits contain NaN or +inf")
        top = x.max(axis=-1, keepdims=True)  # [..., 1]
        if not np.isfinite(top).all():
            raise ValueError("logits have a row without a finite entry (every token masked to -inf)")
        with np.errstate(over="ignore", under="ignore"):
            e = np.exp((x - top) / self.temperature)  # [..., vocab] in [0, 1], 1 at the maximum
        return e / e.sum(axis=-1, keepdims=True)


@runtime_checkable
class Drafter(Protocol):
    """What the loop needs from a drafter. ``name`` and ``description`` say honestly what it is (the demo prints them).

    - ``start(prompt)``: reset per-request state (e.g. prefill the draft model's caches with the prompt).
    - ``propose(context, sampling, coins)``: a :class:`DraftProposal` whose root token is ``context[-1]`` (the pending
      token). With ``sampling=None`` (greedy) only the tokens matter; with sampling, the proposal must record exactly
      the distributions its tokens were drawn from, and its shape must not depend on the target.
    - ``advance(proposal, result)``: the target accepted ``result.accepted_nodes`` of ``proposal``; update the state.
    """

    name: str
    description: str

    def start(self, prompt: Sequence[int]) -> None: ...

    def propose(self, context: Sequence[int], sampling: Sampling | None, coins: Coins | None) -> DraftProposal: ...

    def advance(self, proposal: DraftProposal, result: VerifyResult) -> None: ...


@dataclass(frozen=True)
class StepRecord:
    """One speculative step: the draft it verified and what was accepted."""

    proposal: DraftProposal
    result: VerifyResult

    @property
    def tree(self) -> TokenTree:
        return self.proposal.tree

    @property
    def accepted_nodes(self) -> tuple[int, ...]:
        return self.result.accepted_nodes

    @property
    def accepted_length(self) -> int:
        """Draft tokens accepted in this step (the step emits one more: the next pending token)."""
        return self.result.accepted_length


@dataclass
class DecodeResult:
    """``tokens``: the ``max_new_tokens`` new tokens; ``steps``: one record per speculative step (empty for plain
    autoregressive decoding)."""

    tokens: list[int]
    steps: list[StepRecord] = field(default_factory=list)

    @property
    def mean_accepted_length(self) -> float:
        """Mean number of draft tokens accepted per step (0 when there were no steps)."""
        return float(np.mean([s.accepted_length for s in self.steps])) if self.steps else 0.0

    @property
    def mean_tokens_per_step(self) -> float:
        """Mean tokens emitted per target verification: accepted draft tokens + 1."""
        return self.mean_accepted_length + 1.0 if self.steps else 0.0


def check_prompt(prompt: Any, vocab_size: int) -> list[int]:
    """A non-empty list of token ids in ``[0, vocab_size)``; raises ``ValueError`` naming the bad entry."""
    items = prompt.tolist() if isinstance(prompt, np.ndarray) else list(prompt)
    if not items:
        raise ValueError("prompt must hold at least one token")
    for i, t in enumerate(items):
        if isinstance(t, bool) or not isinstance(t, Integral) or not 0 <= int(t) < vocab_size:
            raise ValueError(f"prompt[{i}] = {t!r} is not a token id in [0, {vocab_size})")
    return [int(t) for t in items]


def _check_request(model: Any, prompt: Any, max_new_tokens: Any, sampling: Any, coins: Any) -> tuple[list[int], Any]:
    tokens = check_prompt(prompt, model.vocab_size)
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, Integral) or max_new_tokens < 0:
        raise ValueError(f"max_new_tokens = {max_new_tokens!r} must be a non-negative integer")
    if sampling is not None and not isinstance(sampling, Sampling):
        raise TypeError(f"sampling must be a Sampling or None (greedy), got {type(sampling).__name__}")
    if coins is None:
        coins = RandomCoins(0)
    elif not isinstance(coins, Coins):
        raise TypeError("coins must provide bernoulli(p) and categorical(probs)")
    return tokens, coins


def next_token(logits: np.ndarray, sampling: Sampling | None, coins: Coins) -> int:
    """The token after one logits row ``[vocab]``: argmax (greedy, ties to the lowest id) or a draw from the softmax."""
    if sampling is None:
        return int(np.argmax(logits))
    return int(coins.categorical(sampling.probabilities(logits)))


def autoregressive_decode(
    model: Any,
    prompt: Sequence[int],
    max_new_tokens: int,
    sampling: Sampling | None = None,
    coins: Coins | None = None,
) -> DecodeResult:
    """Plain decoding: prefill the prompt, then one ``model.forward`` per token (``coins`` default ``RandomCoins(0)``)."""
    tokens, coins = _check_request(model, prompt, max_new_tokens, sampling, coins)
    out: list[int] = []
    if max_new_tokens == 0:
        return DecodeResult(out)
    cache = model.new_cache()
    logits = model.forward(tokens, cache)  # [T, vocab]
    out.append(next_token(logits[-1], sampling, coins))
    while len(out) < max_new_tokens:
        logits = model.forward([out[-1]], cache)  # [1, vocab]
        out.append(next_token(logits[-1], sampling, coins))
    return DecodeResult(out)


def speculative_decode(
    model: Any,
    drafter: Drafter,
    prompt: Sequence[int],
    max_new_tokens: int,
    sampling: Sampling | None = None,
    coins: Coins | None = None,
    sampling_verifier: Callable[[DraftProposal, Any, Coins], VerifyResult] = verify_sampling,
) -> DecodeResult:
    """Tree speculative decoding (loop in the module docstring). ``coins`` drive drafting and verification.

    ``sampling_verifier`` (default :func:`~lumotree.reference.verify.verify_sampling`) lets tests and proofs swap in a
    mutant such as :func:`~lumotree.reference.verify.verify_sampling_lossy_unnormalised_residual`.

    The first new token comes from the prompt's prefill, exactly as in :func:`autoregressive_decode`; every later
    token from a verification step. The last step may emit past ``max_new_tokens``; the output is cut there.
    """
    tokens, coins = _check_request(model, prompt, max_new_tokens, sampling, coins)
    out: list[int] = []
    steps: list[StepRecord] = []
    if max_new_tokens == 0:
        return DecodeResult(out, steps)
    cache = model.new_cache()
    logits = model.forward(tokens, cache)  # [T, vocab]
    out.append(next_token(logits[-1], sampling, coins))
    drafter.start(tokens)
    while len(out) < max_new_tokens:
        context = tokens + out
        proposal = drafter.propose(context, sampling, coins)
        tree = proposal.tree
        if tree.tokens is None or tree.tokens[0] != context[-1]:
            raise ValueError(
                f"drafter {drafter.name!r} proposed a tree whose root is not the pending token {context[-1]}"
            )
        tree_logits = model.verify_tree(list(tree.tokens), tree, cache)  # [N, vocab]
        if sampling is None:
            result = verify_greedy(tree, tree_logits)
        else:
            result = sampling_verifier(proposal, sampling.probabilities(tree_logits), coins)
        model.commit(list(tree.tokens), tree, result.last_node, cache)
        drafter.advance(proposal, result)
        steps.append(StepRecord(proposal, result))
        out.extend(result.emitted)
    return DecodeResult(out[:max_new_tokens], steps)
