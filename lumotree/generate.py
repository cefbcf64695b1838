"""``lumotree generate``: decode prompts with the engine (autoregressive, chain or tree speculation), streaming.

The model is a HF ``Qwen3NextForCausalLM`` checkpoint directory (``--model DIR``) or a seeded random model
(``--random tiny|small|bench``). Prompts are text when the directory holds a tokenizer (transformers'
``AutoTokenizer``), else whitespace-separated token ids. One prompt streams its tokens as they are accepted; several
(``--prompt`` repeated, or ``--batch-file`` with one prompt a line) are decoded together with continuous batching and
printed when done. A progress line on stderr shows tokens, live tokens/s and the mean accepted length (left out while a
single answer streams to the same terminal); a summary with the decode tokens/s ends every run.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

from lumotree.optimized.engine.drafters import DRAFTERS
from lumotree.optimized.model.presets import RANDOM_CONFIGS

__all__ = ["add_arguments", "run", "build_model", "RANDOM_CONFIGS"]

def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.ArgumentDefaultsHelpFormatter
    src = parser.add_argument_group("model")
    which = src.add_mutually_exclusive_group(required=True)
    which.add_argument("--model", metavar="DIR", help="HF Qwen3-Next checkpoint directory (config.json + safetensors)")
    which.add_argument("--random", choices=sorted(RANDOM_CONFIGS), help="a seeded random model of this size instead")
    src.add_argument("--seed", type=int, default=0, help="seed of the random model and of unseeded requests")
    src.add_argument("--backend", choices=("optimized", "reference"), default="optimized",
                     help="optimized: Triton kernels (GPU; the Triton interpreter on CPU is slow); reference: the "
                          "exact float64 model (CPU)")
    src.add_argument("--dtype", choices=("bfloat16", "float32"), default=None,
                     help="optimized backend dtype (default: bfloat16 on GPU, float32 on CPU)")
    src.add_argument("--num-slots", type=int, default=16, help="requests held at once (cache pools)")
    src.add_argument("--max-seq-len", type=int, default=2048, help="context length per request")
    inp = parser.add_argument_group("prompts")
    inp.add_argument("--prompt", action="append", default=[], help="a prompt (repeat for several)")
    inp.add_argument("--batch-file", help="a file with one prompt a line, or JSON lines {\"prompt\": ..., "
                                          "\"max_new_tokens\": ...}")
    inp.add_argument("--ids", action="store_true", help="prompts are token ids even if a tokenizer is present")
    gen = parser.add_argument_group("sampling")
    gen.add_argument("--max-new-tokens", type=int, default=64)
    gen.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    gen.add_argument("--top-p", type=float, default=1.0)
    gen.add_argument("--top-k", type=int, default=0)
    gen.add_argument("--stop", type=int, action="append", default=[], help="stop token id (repeatable)")
    spec = parser.add_argument_group("speculation")
    spec.add_argument("--spec", choices=("none", "chain", "tree"), default="tree")
    spec.add_argument("--drafter", default="ngram",
                      help=f"one of {', '.join(d for d in DRAFTERS if d != 'synthetic')} (synthetic is for "
                           "benchmarks only)")
    spec.add_argument("--draft-layers", default="0,3",
                      help="draft-model drafter: comma-separated target layers it keeps (with the target's "
                           "embedding, final norm and head)")
    spec.add_argument("--budget", choices=("expected", "ratio", "fixed"), default="expected",
                      help="expected: maximise expected tokens/s from confidences and measured costs; ratio: "
                           "largest N with T_verify <= (1 + eps) T_decode; fixed: always --max-nodes")
    spec.add_argument("--max-nodes", type=int, default=32, help="largest draft tree (root included)")
    spec.add_argument("--eps", type=float, default=0.1, help="ratio budget's slack")
    spec.add_argument("--profile", help="cost profile JSON to load (skips the start-up measurement)")
    spec.add_argument("--save-profile", help="write the measured cost profile here")
    out = parser.add_argument_group("output")
    out.add_argument("--no-stream", action="store_true", help="print each result when done instead of streaming")
    out.add_argument("--quiet", action="store_true", help="no progress line")
    out.add_argument("--json", help="write results and engine statistics to this JSON file")


def _parse_ids(text: str, where: str) -> list[int]:
    try:
        return [int(t) for t in text.replace(",", " ").split()]
    except ValueError as exc:
        raise SystemExit(f"error: {where}: {text!r} is not a list of token ids (no tokenizer in the model directory; "
                         "pass ids like '1 2 3')") from exc


def _load_prompts(args: argparse.Namespace, tokenizer: Any) -> list[tuple[list[int], dict[str, Any]]]:
    raw: list[tuple[str | list, dict[str, Any], str]] = [(p, {}, f"--prompt #{i + 1}") for i, p in
                                                         enumerate(args.prompt)]
    if args.batch_file:
        with open(args.batch_file) as f:
            for n, line in enumerate(f, 1):
                line = line.rstrip("\n")
                if not line.strip():
                    continue
                if line.lstrip().startswith("{"):
                    item = json.loads(line)
                    prompt = item.pop("prompt", None)
                    if prompt is None:
                        raise SystemExit(f"error: {args.batch_file}:{n}: JSON line without \"prompt\"")
                    raw.append((prompt, item, f"{args.batch_file}:{n}"))
                else:
                    raw.append((line, {}, f"{args.batch_file}:{n}"))
    if not raw:
        raise SystemExit("error: no prompt given (use --prompt or --batch-file)")
    out = []
    for prompt, extra, where in raw:
        if isinstance(prompt, list):
            ids = [int(t) for t in prompt]
        elif tokenizer is not None and not args.ids:
            ids = tokenizer.encode(prompt)
        else:
            ids = _parse_ids(prompt, where)
        out.append((ids, extra))
    return out


def build_model(args: argparse.Namespace) -> tuple[Any, Any, Any, Any]:
    """(target, draft target or None, tokenizer or None, config) for the command-line options."""
    import torch

    from lumotree.reference.checkpoint import read_config, read_tensors
    from lumotree.reference.config import HybridConfig

    from lumotree.optimized.engine import OptimizedTarget, ReferenceTarget, layer_skip_checkpoint

    tokenizer = None
    if args.model:
        config = HybridConfig.from_dict(read_config(args.model))
        tensors: dict[str, Any] = read_tensors(args.model)
        if any(os.path.exists(os.path.join(args.model, f)) for f in ("tokenizer.json", "tokenizer_config.json")):
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(args.model)
    else:
        from lumotree.reference.model import build_random, weights_to_tensors

        config = HybridConfig(**RANDOM_CONFIGS[args.random])
        if args.backend == "reference":
            tensors = weights_to_tensors(build_random(config, seed=args.seed).weights, config)
        else:
            from lumotree.optimized.model import random_tensors

            tensors = random_tensors(config, args.seed, _device(), _dtype(args))
    draft_layers = [int(x) for x in args.draft_layers.split(",") if x.strip()] if args.drafter == "draft-model" else []
    if args.backend == "reference":
        from lumotree.reference.model import HybridModel, weights_from_tensors

        target = ReferenceTarget(HybridModel(config, weights_from_tensors(tensors, config)), args.num_slots,
                                 args.max_seq_len, args.max_nodes)
        draft = None
        if draft_layers:
            dc, dt = layer_skip_checkpoint(config, tensors, draft_layers)
            draft = ReferenceTarget(HybridModel(dc, weights_from_tensors(dt, dc)), args.num_slots, args.max_seq_len,
                                    128)
        return target, draft, tokenizer, config
    from lumotree.optimized.model import OptimizedModel

    dev, dtype = _device(), _dtype(args)
    tensors = {k: (torch.from_numpy(v) if not isinstance(v, torch.Tensor) else v).to(dev, dtype)
               for k, v in tensors.items()}  # converted once: the draft model shares embedding and head
    common = dict(num_slots=args.num_slots, max_seq_len=args.max_seq_len, device=dev, dtype=dtype)
    target = OptimizedTarget(OptimizedModel(config, tensors, max_nodes=max(args.max_nodes, 1), **common),
                             validate=dev.type != "cuda")
    draft = None
    if draft_layers:
        dc, dt = layer_skip_checkpoint(config, tensors, draft_layers)
        draft = OptimizedTarget(OptimizedModel(dc, dt, max_nodes=64, **common), validate=dev.type != "cuda")
    return target, draft, tokenizer, config


def _device():
    import torch

    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def _dtype(args: argparse.Namespace):
    import torch

    if args.dtype:
        return getattr(torch, args.dtype)
    return torch.bfloat16 if _device().type == "cuda" else torch.float32


class Progress:
    """A one-line progress display on stderr: tokens done / total, live tokens/s, mean accepted length."""

    def __init__(self, total: int, enabled: bool):
        self.total, self.enabled = total, enabled
        self.done = 0
        self.start = time.perf_counter()
        self.last = 0.0

    def update(self, engine: Any, new: int, final: bool = False) -> None:
        self.done += new
        now = time.perf_counter()
        if not self.enabled or (not final and now - self.last < 0.1):
            return
        self.last = now
        width = 28
        filled = int(width * min(1.0, self.done / max(self.total, 1)))
        rate = self.done / max(now - self.start, 1e-9)
        acc = engine.stats.summary()["mean_accepted"]
        sys.stderr.write(f"\r[{'#' * filled}{'.' * (width - filled)}] {self.done}/{self.total} tokens  "
                         f"{rate:8.1f} tok/s  accepted/step {acc:4.2f}  running {len(engine.running):3d}")
        if final:
            sys.stderr.write("\n")
        sys.stderr.flush()


def run(args: argparse.Namespace) -> int:
    from lumotree.optimized.engine import Engine, SamplingParams, make_drafter

    if args.drafter not in DRAFTERS:
        raise SystemExit(f"error: unknown drafter {args.drafter!r}; expected one of "
                         f"{', '.join(d for d in DRAFTERS if d != 'synthetic')}")
    if args.drafter == "synthetic" and args.spec != "none":
        raise SystemExit("error: the synthetic drafter reads an oracle continuation; it exists for system "
                         "benchmarks only (lumotree bench e2e), not for decoding")
    try:
        base = SamplingParams(temperature=args.temperature, top_p=args.top_p, top_k=args.top_k,
                              max_new_tokens=args.max_new_tokens, stop_token_ids=tuple(args.stop))
    except ValueError as exc:
        raise SystemExit(f"error: {exc}") from exc
    target, draft, tokenizer, config = build_model(args)
    prompts = _load_prompts(args, tokenizer)
    params = []
    for _, extra in prompts:
        unknown = set(extra) - {"max_new_tokens", "temperature", "top_p", "top_k", "seed"}
        if unknown:
            raise SystemExit(f"error: --batch-file keys {sorted(unknown)} are not sampling parameters")
        try:
            params.append(SamplingParams(**{**base.__dict__, **extra}))
        except (ValueError, TypeError) as exc:
            raise SystemExit(f"error: {exc}") from exc
    mode = {"none": "autoregressive", "chain": "chain", "tree": "tree"}[args.spec]
    drafter = None
    if mode != "autoregressive":
        drafter = make_drafter(args.drafter, draft_model=draft)
    engine = Engine(target, drafter, mode=mode, budget=args.budget, max_nodes=args.max_nodes, eps=args.eps,
                    profile=args.profile, seed=args.seed)
    if args.save_profile and engine.profile is not None:
        engine.profile.save(args.save_profile)
    decode = (lambda ids: tokenizer.decode(ids)) if tokenizer is not None else (lambda ids: " ".join(map(str, ids)))
    total = sum(p.max_new_tokens for p in params)
    stream = len(prompts) == 1 and not args.no_stream
    # a streamed answer and a progress line cannot share one terminal line: with both on the terminal, the progress
    # line is left out while tokens stream, and the summary (with tokens/s) follows the answer
    shared_terminal = stream and sys.stdout.isatty() and sys.stderr.isatty()
    progress = Progress(total, enabled=not args.quiet and not shared_terminal)
    sys.stderr.write(f"lumotree generate: {len(prompts)} prompt(s), spec={args.spec}, drafter="
                     f"{drafter.name if drafter else '-'}, budget={args.budget}, backend={args.backend} on "
                     f"{getattr(target, 'device', 'cpu')}\n")
    try:
        ids = engine.submit_all([p for p, _ in prompts], params)
    except ValueError as exc:
        raise SystemExit(f"error: {exc}") from exc
    outputs: dict[int, list[int]] = {i: [] for i in ids}
    while engine.has_work():
        new = 0
        for event in engine.step():
            outputs[event.request_id].extend(event.tokens)
            new += len(event.tokens)
            if stream:
                sys.stdout.write(decode(event.tokens) + ("" if tokenizer is not None else " "))
                sys.stdout.flush()
            elif event.finished:
                if progress.enabled:
                    sys.stderr.write("\r\033[K")
                r = engine.finished[event.request_id]
                sys.stdout.write(f"[{event.request_id}] ({r.finish_reason}) {decode(outputs[event.request_id])}\n")
                sys.stdout.flush()
        progress.update(engine, new)
    if stream:
        sys.stdout.write("\n")
    progress.update(engine, 0, final=True)
    summary = engine.stats.summary()
    sys.stderr.write(
        f"decode: {summary['decode_tokens']} tokens in {summary['decode_seconds']:.3f} s = "
        f"{summary['tokens_per_s']:.1f} tok/s; {summary['speculative_steps']}/{summary['decode_steps']} speculative "
        f"steps, mean accepted {summary['mean_accepted']:.2f} per request-step\n")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"results": [{"id": i, "prompt": engine.finished[i].prompt, "tokens": outputs[i],
                                    "finish_reason": engine.finished[i].finish_reason} for i in ids],
                       "summary": summary}, f, indent=1)
    return 0
