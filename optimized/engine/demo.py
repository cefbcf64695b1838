r"""The GPU path of ``lumotree demo``: the demo's seeded model and drafter through the optimized engine.

Same model as the CPU path (:func:`lumotree.reference.demo.build_target`, converted once with
:func:`lumotree.optimized.model.from_reference`), same prompt, same drafter kind (the target's own layers as a
layer-skip draft model with EAGLE-2 style trees, or prompt lookup), decoded by
:class:`~lumotree.optimized.engine.Engine`
with tree speculation at a fixed tree size (``--tree-budget``), then by the same engine autoregressively. Printed:
every step's tree size and accepted path (the first trees drawn), the mean accepted length, tokens per second of both
runs (after a warm-up run that compiles the kernels and captures the CUDA graphs), and the check:

- greedy, float32: speculative output must equal autoregressive output token for token (exit code 1 otherwise);
- greedy, bfloat16: verify (N rows at once) and decode (one row) round differently, so a near-tie may flip; the first
  difference is reported with the top-2 logit gap there (of the engine and of the float64 reference), not failed;
- sampling (``--sampling deterministic``: temperature sampling with deterministic drafts): not comparable token for
  token; losslessness is what the engine's chi-square tests check.

:func:`run_engine` takes ``device="cpu"`` for tests: the same code under the Triton interpreter (``TRITON_INTERPRET=1``,
float32).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from lumotree.demo import ENGINE_SAMPLING
from lumotree.reference import demo as reference_demo
from lumotree.reference.model import HybridModel, build_random, weights_to_tensors
from lumotree.reference.speculate import DecodeResult, StepRecord
from lumotree.reference.tree import TokenTree
from lumotree.reference.verify import DraftProposal, VerifyResult

from ..model import OptimizedModel, from_reference
from ..ops.checks import MAX_NODES, interpreting
from .drafters import DraftModelDrafter, EngineDrafter, PromptLookupDrafter
from .selfspec import layer_skip_checkpoint
from .engine import Engine, OptimizedTarget
from .sampling import SamplingParams, TreeBatch, VerifyOutcome

__all__ = ["run_engine", "build_engine_target", "RecordingTarget", "DTYPES", "MIN_KERNEL_HEAD_DIM"]

DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32}


class RecordingTarget:
    """A target model (:class:`~lumotree.optimized.engine.TargetModel`) that remembers, per committed step, the
    verified trees and the accepted node of each request (host copies), for printing; everything else passes
    through."""

    def __init__(self, inner: OptimizedTarget):
        self.inner = inner
        self.vocab_size, self.max_seq_len = inner.vocab_size, inner.max_seq_len
        self.num_slots, self.max_nodes, self.device = inner.num_slots, inner.max_nodes, inner.device
        self.commits: list[tuple[TreeBatch, list[int]]] = []

    def prefill(self, slot: int, tokens: Sequence[int]) -> torch.Tensor:
        return self.inner.prefill(slot, tokens)

    def decode(self, slots: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        return self.inner.decode(slots, tokens)

    def verify(self, slots: torch.Tensor, trees: TreeBatch) -> torch.Tensor:
        return self.inner.verify(slots, trees)

    def commit(self, slots: torch.Tensor, trees: TreeBatch, accepted: torch.Tensor) -> None:
        self.commits.append((trees, [int(a) for a in accepted.tolist()]))
        self.inner.commit(slots, trees, accepted)

    def speculate_greedy(self, slots: torch.Tensor, trees: TreeBatch) -> VerifyOutcome:
        outcome = self.inner.speculate_greedy(slots, trees)
        self.commits.append((trees, [int(a) for a in outcome.accepted_node.tolist()]))
        return outcome

    def release(self, slot: int) -> None:
        self.inner.release(slot)


#: the smallest head size the GDN kernels take (powers of two in [16, 256])
MIN_KERNEL_HEAD_DIM = 16


def build_engine_target(args: argparse.Namespace) -> tuple[HybridModel, str]:
    """The CPU path's seeded model (:func:`lumotree.reference.demo.build_target`: same seed, layout, widths and weight
    distributions) with every head size raised to a power of two >= 16, the smallest the kernels take (the demo's GDN
    heads have K = V = 8). Returns (float64 reference model, what changed, for the printout)."""
    config = reference_demo.build_target(args).config
    sizes = {name: getattr(config, name) for name in ("linear_key_head_dim", "linear_value_head_dim", "head_dim")}
    raised = {name: max(MIN_KERNEL_HEAD_DIM, _pow2(size)) for name, size in sizes.items()}
    changed = {name: (sizes[name], raised[name]) for name in sizes if raised[name] != sizes[name]}
    note = ", ".join(f"{name} {old} -> {new}" for name, (old, new) in changed.items())
    model = build_random(config.replace(**raised), seed=args.seed) if changed else reference_demo.build_target(args)
    return model, (f"head sizes raised to the kernels' minimum ({note})" if changed else "")


def _draft_layers(args: argparse.Namespace, num_layers: int) -> list[int]:
    """The layers of ``--draft-layers`` (already validated by the reference's ``build_drafter``)."""
    if args.draft_layers is None:
        return list(range(max(1, num_layers - 1)))
    return [int(x) for x in args.draft_layers.split(",") if x.strip()]


def _pow2(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()


def _build(ref: HybridModel, args: argparse.Namespace, device: torch.device, dtype: torch.dtype
           ) -> tuple[OptimizedTarget, EngineDrafter | None, str]:
    """(target, drafter, drafter description): the optimized twins of the CPU path's target and drafter."""
    described = reference_demo.build_drafter(ref, args)  # validates the drafter options exactly as the CPU path does
    max_seq_len = args.prompt_length + args.new_tokens + args.tree_budget + args.max_depth + 4
    graphs = device.type == "cuda"
    common = dict(num_slots=1, max_seq_len=max_seq_len, device=device, dtype=dtype, graphs=graphs)
    target = OptimizedTarget(from_reference(ref, max_nodes=args.tree_budget, **common), validate=not graphs)
    if args.drafter == "ngram":
        return target, PromptLookupDrafter(max_depth=args.max_depth), described.description
    config = ref.config
    draft_config, draft_tensors = layer_skip_checkpoint(config, weights_to_tensors(ref.weights, config),
                                                        _draft_layers(args, config.num_hidden_layers))
    # room for every round of EAGLE-2 growth before the cut: the root, top_k children, then top_k^2 per depth
    pool = min(MAX_NODES, _pow2(1 + args.top_k + (args.max_depth - 1) * args.top_k ** 2))
    draft = OptimizedTarget(OptimizedModel(draft_config, draft_tensors, max_nodes=pool, **common), validate=not graphs)
    drafter = DraftModelDrafter(draft, top_k=args.top_k, max_depth=args.max_depth, description=described.description)
    return target, drafter, described.description


def _speculate(target: OptimizedTarget, drafter: EngineDrafter, prompt: list[int], args: argparse.Namespace,
               params: SamplingParams) -> tuple[DecodeResult, float]:
    """Tree speculation of one request, stepped until ``--new-tokens`` are out (the last step's extra tokens are cut,
    as in the reference loop); every step recorded as a reference :class:`StepRecord`. Returns (result, seconds)."""
    recorder = RecordingTarget(target)
    engine = Engine(recorder, drafter, mode="tree", budget="fixed", max_nodes=args.tree_budget, seed=args.seed)
    # room for a whole last step, so no step's emission is cut short by the engine
    request_id = engine.submit(prompt, SamplingParams(**{**params.__dict__,
                                                          "max_new_tokens": args.new_tokens + args.tree_budget}))
    output: list[int] = []
    steps: list[StepRecord] = []
    start = time.perf_counter()
    while len(output) < args.new_tokens:
        before = len(recorder.commits)
        events = [e.tokens for e in engine.step() if e.request_id == request_id]  # [prefill's,] the step's
        output.extend(t for tokens in events for t in tokens)
        if len(recorder.commits) > before:  # a verification step (prefill and autoregressive steps commit nothing)
            emitted = events[-1]
            trees, accepted = recorder.commits[-1]
            n = int(trees.num_nodes[0])
            tree = TokenTree(trees.parents[0, :n].tolist(), trees.tokens[0, :n].tolist())
            path = tree.path(accepted[0])
            result = VerifyResult(tuple(path), tuple(tree.tokens[i] for i in path[1:]), emitted[len(path) - 1])
            steps.append(StepRecord(DraftProposal(tree, "deterministic"), result))
    if target.device.type == "cuda":
        torch.cuda.synchronize(target.device)
    seconds = time.perf_counter() - start
    for request in list(engine.running):  # still holding its slot: hand it back for the next run
        target.release(request.slot)
        drafter.release(request.slot)
    return DecodeResult(output[: args.new_tokens], steps), seconds


def autoregressive_decode(target: OptimizedTarget, prompt: list[int], args: argparse.Namespace,
                    params: SamplingParams) -> tuple[list[int], float]:
    engine = Engine(target, None, mode="autoregressive", seed=args.seed)
    start = time.perf_counter()
    result = engine.generate([prompt], params)[0]
    if target.device.type == "cuda":
        torch.cuda.synchronize(target.device)
    return result.tokens, time.perf_counter() - start


def _top2_gap(logits: Any) -> float:
    top2 = np.sort(np.asarray(logits, dtype=np.float64))[-2:]
    return float(top2[1] - top2[0])


def _describe_path(device: torch.device, dtype: torch.dtype) -> str:
    name = str(dtype).replace("torch.", "")
    if device.type == "cuda":
        return (f"path: GPU (optimized engine: Triton kernels, {name}, CUDA graphs) on "
                f"{torch.cuda.get_device_name(device)}")
    return (f"path: GPU code path on the CPU under the Triton interpreter (optimized engine, {name}; "
            "for tests, slow)")


def run_engine(args: argparse.Namespace, device: str | torch.device | None = None, warmup: bool | None = None) -> int:
    """``lumotree demo`` on the optimized engine (module docstring). ``args``: the demo's options plus ``dtype``
    (``"bfloat16"`` | ``"float32"``, None: bfloat16 on CUDA, float32 elsewhere). ``device``: default CUDA; ``"cpu"``
    only under the Triton interpreter. ``warmup`` (default: on CUDA) runs both decodes once before the timed runs.
    Returns the exit code (0 ok, 1 float32 greedy mismatch, 2 bad options)."""
    for name in ("new_tokens", "prompt_length", "tree_budget", "top_k", "max_depth"):
        if getattr(args, name) < 1:
            print(f"error: --{name.replace('_', '-')} must be >= 1")
            return 2
    if args.tree_budget > MAX_NODES:
        print(f"error: --tree-budget {args.tree_budget} exceeds the kernels' largest tree ({MAX_NODES} nodes)")
        return 2
    if args.sampling not in ENGINE_SAMPLING:
        print(f"error: --sampling {args.sampling} draws sampled draft trees, which only the reference drafters do; "
              f"the GPU path runs {' / '.join(ENGINE_SAMPLING)} (or use --path cpu)")
        return 2
    dev = torch.device(device if device is not None else "cuda")
    if dev.type == "cuda" and not torch.cuda.is_available():
        print("error: the GPU path needs a CUDA GPU (torch.cuda.is_available() is False); use --path cpu")
        return 2
    if dev.type == "cpu" and not interpreting():
        print("error: the GPU path on the CPU needs the Triton interpreter (TRITON_INTERPRET=1 before triton loads)")
        return 2
    dtype = DTYPES[args.dtype] if getattr(args, "dtype", None) else (
        torch.bfloat16 if dev.type == "cuda" else torch.float32)
    warmup = dev.type == "cuda" if warmup is None else warmup
    try:
        ref, resized = build_engine_target(args)
        target, drafter, _ = _build(ref, args, dev, dtype)
        params = SamplingParams(temperature=0.0 if args.sampling == "greedy" else args.temperature, seed=args.seed,
                                max_new_tokens=args.new_tokens)
    except ValueError as exc:
        print(f"error: {exc}")
        return 2
    assert drafter is not None
    prompt = [int(t) for t in np.random.default_rng([args.seed, 1]).integers(0, ref.vocab_size, args.prompt_length)]

    print(_describe_path(dev, dtype))
    print("lumotree demo: tree speculative decoding through the optimized engine")
    print(f"target : {reference_demo._describe_target(ref, args)}" + (f"; {resized}" if resized else "")
          + "; converted to the optimized model")
    print(f"drafter: {drafter.name}: {drafter.description}; tree budget {args.tree_budget} nodes (fixed), depth <= "
          f"{args.max_depth}" + (f", top-k {args.top_k}" if args.drafter == "draft-model" else ""))
    mode = "greedy" if params.greedy else f"sampling, temperature {args.temperature}, deterministic drafts"
    print(f"decoding: {mode}; engine tree speculation vs the same engine autoregressive")
    print(f"prompt ({len(prompt)} tokens): {prompt}\n")

    if warmup:  # compiles the kernels and captures the CUDA graphs of every shape the timed runs meet
        _speculate(target, drafter, prompt, args, params)
        autoregressive_decode(target, prompt, args, params)
    result, speculative_time = _speculate(target, drafter, prompt, args, params)
    reference_demo.report(result, args.show_trees)
    print(f"\noutput ({len(result.tokens)} tokens): {result.tokens}")
    print(f"{len(result.steps)} target verification passes (plus the prompt's prefill) for {len(result.tokens)} "
          f"tokens; mean accepted length {result.mean_accepted_length:.2f} draft tokens per step "
          f"({result.mean_tokens_per_step:.2f} tokens per target pass)")
    plain, plain_time = autoregressive_decode(target, prompt, args, params)
    n = len(result.tokens)
    print(f"time: speculative {speculative_time:.3f} s ({n / speculative_time:.1f} tokens/s), autoregressive "
          f"{plain_time:.3f} s ({len(plain) / plain_time:.1f} tokens/s), prefill included"
          + ("; after a warm-up run" if warmup else "; no warm-up (first calls include compilation)"))
    if not params.greedy:
        print("check: sampled output, not comparable token for token; the engine's lossless sampling is checked by "
              "its chi-square tests")
        return 0
    if result.tokens == plain:
        print(f"check: identical to greedy autoregressive decoding of the same engine, token for token "
              f"({n}/{n}): OK")
        return 0
    first = next(i for i, (a, b) in enumerate(zip(result.tokens, plain)) if a != b)
    context = prompt + plain[:first]
    engine_gap = _top2_gap(target.model.prefill(0, context).float().cpu().numpy())
    target.release(0)
    exact_gap = _top2_gap(ref.forward(context, ref.new_cache())[-1])
    where = (f"at new token {first}: speculative {result.tokens[first:first + 5]} vs autoregressive "
             f"{plain[first:first + 5]}; top-2 logit gap there {engine_gap:.4g} (engine), {exact_gap:.4g} "
             "(float64 reference)")
    if dtype == torch.float32:
        print(f"check: MISMATCH with greedy autoregressive decoding {where}")
        return 1
    print(f"check: {str(dtype).replace('torch.', '')} outputs differ {where}. Verify (N rows) and decode (1 row) "
          "round differently, so a near-tie can flip; after it the two continuations diverge (not compared further). "
          "Reported, not failed (with --dtype float32 a difference fails the check).")
    return 0
