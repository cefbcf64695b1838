"""``lumotree demo``: tree speculative decoding on a small seeded hybrid model, checked against plain decoding.

Builds a seeded random Qwen3-Next-layout model (GDN and gated-attention layers, float64 reference), decodes a seeded
prompt with tree speculation (a drafter proposes token trees, the target verifies every node in one pass, the accepted
path is committed into every cache), prints the draft trees, accepted paths and mean accepted length, then decodes the
same prompt plainly, one token at a time, and compares. Greedy decoding must match token for token (exit code 1
otherwise). With ``--sampling`` the output is a sample; its distribution is what the tests and ``lumotree prove``
check exactly.

Structure (for later backends): :func:`build_target`, :func:`build_drafter`, a ``BACKENDS`` table of decoders
(``"reference"``: :func:`lumotree.reference.speculate.speculative_decode`), :func:`report`.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from .drafters import DraftModelDrafter, NGramDrafter, layer_skip_draft
from .model import HybridConfig, HybridModel, build_random
from .speculate import DecodeResult, Drafter, Sampling, autoregressive_decode, speculative_decode
from .verify import VARIANTS, RandomCoins

__all__ = ["add_arguments", "run", "build_target", "build_drafter", "BACKENDS", "report"]

SAMPLING_CHOICES = ("greedy", *VARIANTS)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.ArgumentDefaultsHelpFormatter
    parser.epilog = (
        "The model has random weights (no training): its tokens mean nothing, but every number is computed exactly "
        "by the float64 reference, so the speculative output can be checked against plain decoding. The reference is "
        "built for exactness, not speed: speculation here saves target passes, not wall time."
    )
    model = parser.add_argument_group("target model")
    model.add_argument("--seed", type=int, default=0, help="seed of the model weights and of the prompt")
    model.add_argument("--vocab-size", type=int, default=64, help="vocabulary size of the random model")
    model.add_argument("--layers", type=int, default=4,
                       help="number of layers; every 4th is gated attention, the others Gated DeltaNet")
    model.add_argument("--moe", action="store_true", help="mixture-of-experts MLPs (4 experts, top 2) instead of dense")
    decode = parser.add_argument_group("decoding")
    decode.add_argument("--prompt-length", type=int, default=12, help="number of random prompt tokens")
    decode.add_argument("--new-tokens", type=int, default=32, help="number of tokens to generate")
    decode.add_argument("--sampling", choices=SAMPLING_CHOICES, default="greedy",
                        help="greedy (checked token for token), or sampling with this draft variant: iid / "
                             "without_replacement draws from the draft model, deterministic (top-k / n-gram) drafts")
    decode.add_argument("--temperature", type=float, default=1.0, help="sampling temperature (not used by greedy)")
    decode.add_argument("--backend", choices=sorted(BACKENDS), default="reference", help="which decoder runs the loop")
    draft = parser.add_argument_group("drafter")
    draft.add_argument("--drafter", choices=("draft-model", "ngram"), default="draft-model",
                       help="draft-model: some of the target's own layers (layer-skip self-speculation); "
                            "ngram: prompt lookup over the request's tokens")
    draft.add_argument("--draft-layers", default=None,
                       help="comma-separated target layers the draft model keeps; None: all but the last")
    draft.add_argument("--tree-budget", type=int, default=8, help="maximum nodes per draft tree (root included)")
    draft.add_argument("--top-k", type=int, default=2,
                       help="draft model: children per expanded node, and nodes expanded per depth")
    draft.add_argument("--max-depth", type=int, default=4, help="maximum draft depth")
    output = parser.add_argument_group("output")
    output.add_argument("--show-trees", type=int, default=3, help="draw the draft trees of the first N steps")


def build_target(args: argparse.Namespace) -> HybridModel:
    """A seeded random hybrid model: hidden 32, GDN (2 key heads, 4 value heads, K = V = 8), attention (2 query heads,
    1 KV head, head_dim 16), dense SwiGLU or MoE MLPs."""
    if args.vocab_size < 2 or args.layers < 1:
        raise ValueError("--vocab-size must be >= 2 and --layers >= 1")
    experts = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, shared_expert_intermediate_size=32)
    config = HybridConfig(
        vocab_size=args.vocab_size, hidden_size=32, intermediate_size=64, num_hidden_layers=args.layers,
        num_attention_heads=2, num_key_value_heads=1, head_dim=16, linear_num_key_heads=2, linear_num_value_heads=4,
        linear_key_head_dim=8, linear_value_head_dim=8, **(experts if args.moe else dict(num_experts=0)),
    )
    return build_random(config, seed=args.seed)


def _describe_target(model: HybridModel, args: argparse.Namespace) -> str:
    kinds = model.config.layer_types
    gdn, attention = kinds.count("linear_attention"), kinds.count("full_attention")
    return (f"seeded random Qwen3-Next-layout model (seed {args.seed}): {len(kinds)} layers ({gdn} Gated DeltaNet, "
            f"{attention} gated attention), hidden {model.config.hidden_size}, vocab {model.vocab_size}, "
            f"{'MoE' if args.moe else 'dense'} MLPs; random weights, not trained")


def build_drafter(model: HybridModel, args: argparse.Namespace) -> Drafter:
    """The drafter the options ask for, with an honest ``description``."""
    variant = "deterministic" if args.sampling == "greedy" else args.sampling
    if args.drafter == "ngram":
        if variant != "deterministic":
            raise ValueError(f"the ngram drafter proposes deterministically; --sampling {args.sampling} needs "
                             "--drafter draft-model (use --sampling deterministic with ngram)")
        return NGramDrafter(budget=args.tree_budget, max_depth=args.max_depth)
    n = model.config.num_hidden_layers
    if args.draft_layers is None:
        layers = list(range(max(1, n - 1)))
    else:
        try:
            layers = [int(x) for x in args.draft_layers.split(",") if x.strip()]
        except ValueError as exc:
            raise ValueError(f"--draft-layers {args.draft_layers!r} is not a comma-separated list of layers") from exc
    draft = layer_skip_draft(model, layers)
    description = (f"the target's layers {','.join(map(str, layers))} of {n} with its embedding, final norm and "
                   "lm_head (layer-skip self-speculation: shared weights, not trained), its own caches; trees grown "
                   "by cumulative draft probability (EAGLE-2 style)")
    return DraftModelDrafter(draft, budget=args.tree_budget, top_k=args.top_k, max_depth=args.max_depth,
                             variant=variant, description=description)


Decoder = Callable[[Any, Drafter, list, int, "Sampling | None", Any], DecodeResult]

#: name -> speculative decoder ``(model, drafter, prompt, max_new_tokens, sampling, coins) -> DecodeResult``
BACKENDS: dict[str, Decoder] = {"reference": speculative_decode}


def _draw(record: Any) -> str:
    tree, accepted = record.tree, set(record.accepted_nodes)
    labels = [f"{tree.tokens[i]}{' (pending)' if i == 0 else ''}{' ✓' if i in accepted and i else ''}"
              for i in range(len(tree))]
    return tree.render(labels)


def report(result: DecodeResult, show_trees: int) -> None:
    """Print every step (tree size, accepted path, emitted tokens), draw the first trees, and the summary."""
    for k, step in enumerate(result.steps):
        tree = step.tree
        accepted = list(step.result.accepted_tokens)
        print(f"step {k + 1:3d}: tree {len(tree):2d} nodes, depth {tree.max_depth}; accepted {step.accepted_length} "
              f"draft token(s) {accepted} + next token {step.result.next_token}")
        if k < show_trees:
            print("          " + _draw(step).replace("\n", "\n          "))


def run(args: argparse.Namespace) -> int:
    for name in ("new_tokens", "prompt_length", "tree_budget", "top_k", "max_depth"):
        if getattr(args, name) < 1:
            print(f"error: --{name.replace('_', '-')} must be >= 1")
            return 2
    try:
        model = build_target(args)
        drafter = build_drafter(model, args)
    except ValueError as exc:
        print(f"error: {exc}")
        return 2
    sampling = None if args.sampling == "greedy" else Sampling(args.temperature)
    prompt = [int(t) for t in np.random.default_rng([args.seed, 1]).integers(0, model.vocab_size, args.prompt_length)]

    print("lumotree demo: tree speculative decoding on the exact float64 reference (CPU)")
    print(f"target : {_describe_target(model, args)}")
    print(f"drafter: {drafter.name}: {drafter.description}; tree budget {args.tree_budget} nodes, depth <= "
          f"{args.max_depth}" + (f", top-k {args.top_k}" if args.drafter == "draft-model" else ""))
    mode = "greedy" if sampling is None else f"sampling, temperature {args.temperature}, {args.sampling} drafts"
    print(f"decoding: {mode}; backend {args.backend}")
    print(f"prompt ({len(prompt)} tokens): {prompt}\n")

    start = time.perf_counter()
    result = BACKENDS[args.backend](model, drafter, prompt, args.new_tokens, sampling, RandomCoins(args.seed))
    speculative_time = time.perf_counter() - start
    report(result, args.show_trees)
    print(f"\noutput ({len(result.tokens)} tokens): {result.tokens}")
    print(f"{len(result.steps)} target verification passes (plus the prompt's prefill) for {len(result.tokens)} "
          f"tokens; mean accepted length {result.mean_accepted_length:.2f} draft tokens per step "
          f"({result.mean_tokens_per_step:.2f} tokens per target pass)")

    start = time.perf_counter()
    plain = autoregressive_decode(model, prompt, args.new_tokens, sampling, RandomCoins(args.seed))
    plain_time = time.perf_counter() - start
    print(f"time: speculative {speculative_time:.2f} s, plain autoregressive {plain_time:.2f} s "
          "(reference implementation: exact, not fast)")
    if sampling is not None:
        print("check: sampled output, not comparable token for token; the distribution of speculative sampling equals "
              "autoregressive sampling (checked exactly by the tests and `lumotree prove`)")
        return 0
    if result.tokens == plain.tokens:
        print(f"check: identical to plain greedy autoregressive decoding, token for token "
              f"({len(plain.tokens)}/{len(plain.tokens)}): OK")
        return 0
    first = next((i for i, (a, b) in enumerate(zip(result.tokens, plain.tokens)) if a != b),
                 min(len(result.tokens), len(plain.tokens)))
    print(f"check: MISMATCH with plain greedy decoding at new token {first}: speculative "
          f"{result.tokens[first:first + 5]} vs plain {plain.tokens[first:first + 5]}")
    return 1
