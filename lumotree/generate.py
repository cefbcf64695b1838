"""``lumotree generate``: decode prompts with the engine (autoregressive, chain or tree speculation), streaming.

The model is a HF checkpoint directory (``--model DIR``: Qwen3-Next, Qwen3.5 dense or MoE, or the text model of a
Qwen3.5 conditional-generation checkpoint) or a seeded random model (``--random tiny|small|bench``). The optimized
backend streams the checkpoint to the device tensor by tensor (a loading bar on stderr); the reference backend reads
it in float64 and refuses models above its size limit. Prompts are text when the directory holds a tokenizer
(transformers' ``AutoTokenizer``), else whitespace-separated token ids. One prompt streams its tokens as they are
accepted; several (``--prompt`` repeated, or ``--batch-file`` with one prompt a line) are decoded together with
continuous batching and printed when done. A progress line on stderr shows tokens, live tokens/s and the mean accepted
length (left out while a single answer streams to the same terminal); a summary with the decode tokens/s ends every
run.

Backends: ``optimized`` (the Triton kernels, CUDA graphs; needs a CUDA GPU, or ``TRITON_INTERPRET=1`` to run the
kernels in Triton's CPU interpreter, slowly) and ``reference`` (the exact float64 model on the CPU); ``auto`` takes
the first on a GPU, else the second. The budget's cost profile is cached per model and device (``--profile``); on a
GPU the engine compiles its kernels and captures its CUDA graphs before the first request.

Every option and input is checked before any work: a bad value ends the command with one line ``error: ...`` and
exit code 2 (``lumotree --debug generate ...`` shows the traceback).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from typing import Any

from lumotree.errors import UsageError
from lumotree.optimized.engine.drafters import DRAFTERS
from lumotree.optimized.engine.selfspec import SELF_SPECULATION, self_speculation_layers
from lumotree.optimized.model.presets import RANDOM_CONFIGS
from lumotree.parallel import add_parallel_argument, check_parallel_arguments, join_group, launch_ranks

__all__ = ["add_arguments", "add_model_arguments", "add_speculation_arguments", "run", "build_model", "build_engine",
           "load_prompts", "prompt_ids", "check_arguments", "check_model_arguments"]

SAMPLING_KEYS = ("max_new_tokens", "temperature", "top_p", "top_k", "seed")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.ArgumentDefaultsHelpFormatter
    add_model_arguments(parser)
    inp = parser.add_argument_group("prompts")
    inp.add_argument("--prompt", action="append", default=[], help="a prompt (repeat for several)")
    inp.add_argument("--batch-file", help="a file with one prompt a line, or JSON lines {\"prompt\": ..., "
                                          "\"max_new_tokens\": ...}")
    inp.add_argument("--ids", action="store_true", help="prompts are token ids even if a tokenizer is present")
    gen = parser.add_argument_group("sampling")
    gen.add_argument("--max-new-tokens", type=int, default=64)
    gen.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    gen.add_argument("--top-p", type=float, default=1.0, help="nucleus mass in (0, 1]")
    gen.add_argument("--top-k", type=int, default=0, help="0 = all tokens")
    gen.add_argument("--stop", type=int, action="append", default=[], help="stop token id (repeatable)")
    add_speculation_arguments(parser)
    out = parser.add_argument_group("output")
    out.add_argument("--no-stream", action="store_true", help="print each result when done instead of streaming")
    out.add_argument("--quiet", action="store_true", help="no progress line")
    out.add_argument("--json", help="write results and engine statistics to this JSON file")


def add_model_arguments(parser: argparse.ArgumentParser) -> None:
    """The model's options (checkpoint or random model, backend, slots, context): shared with ``lumotree serve``."""
    src = parser.add_argument_group("model")
    which = src.add_mutually_exclusive_group(required=True)
    which.add_argument("--model", metavar="DIR", help="HF checkpoint directory (config.json + safetensors) of "
                                                      "Qwen3-Next, Qwen3.5 or Qwen3.5-MoE")
    which.add_argument("--random", choices=sorted(RANDOM_CONFIGS), help="a seeded random model of this size instead")
    src.add_argument("--seed", type=int, default=0, help="seed of the random model and of unseeded requests (>= 0)")
    src.add_argument("--backend", choices=("auto", "optimized", "reference"), default="auto",
                     help="optimized: Triton kernels (CUDA GPU; with TRITON_INTERPRET=1 the CPU interpreter, slow); "
                          "reference: the exact float64 model (CPU; checkpoints up to 2^28 parameters); auto: "
                          "optimized on a GPU, else reference")
    src.add_argument("--dtype", choices=("bfloat16", "float32"), default=None,
                     help="optimized backend dtype (default: bfloat16 on GPU, float32 on CPU)")
    src.add_argument("--num-slots", type=_count_or_auto, default=16,
                     help="requests held at once (cache pools); auto: as many as fit the device memory left after "
                          "the weights (optimized backend)")
    src.add_argument("--max-seq-len", type=_count_or_auto, default=2048,
                     help="context length per request; auto: the longest that fits (optimized backend)")
    src.add_argument("--prefix-cache", default="0", metavar="SIZE",
                     help="memory for the hybrid prefix cache (K / V blocks and GDN / conv state snapshots) such as "
                          "512MiB or 4GiB (a bare number: MiB); 0: off. A prompt that extends a cached prefix "
                          "prefills only the rest; on the optimized backend it is kept out of --num-slots auto")
    src.add_argument("--prefix-block", type=int, default=64,
                     help="tokens a prefix-cache block (the grid of the states kept inside a prompt)")
    add_parallel_argument(src)


def add_speculation_arguments(parser: argparse.ArgumentParser) -> None:
    """The speculation options (mode, drafter, budget, cost profile): shared with ``lumotree serve``."""
    spec = parser.add_argument_group("speculation")
    spec.add_argument("--spec", choices=("none", "chain", "tree"), default="tree")
    spec.add_argument("--drafter", default="ngram",
                      help=f"one of {', '.join(d for d in DRAFTERS if d != 'synthetic')} (synthetic is for "
                           "benchmarks only)")
    spec.add_argument("--draft-layers", default="0,3",
                      help="draft-model drafter: comma-separated target layers it keeps (with the target's "
                           "embedding, final norm and head)")
    spec.add_argument("--mtp-depth", type=int, default=3,
                      help="mtp drafter: rounds of the checkpoint's MTP head (the deepest draft token)")
    spec.add_argument("--mtp-top-k", type=int, default=2,
                      help="mtp drafter, tree mode: children of each expanded node and nodes expanded a round")
    spec.add_argument("--mtp-sampled", action="store_true",
                      help="mtp drafter, chain mode: draw the chains of sampling requests from the head's "
                           "distribution (verified by rejection sampling) instead of taking its argmax")
    spec.add_argument("--eagle", metavar="DIR",
                      help="eagle drafter: the head's folder (lumotree train eagle; default: MODEL/eagle); router: "
                           "its model drafter (default: MODEL/eagle if present, else the checkpoint's MTP head)")
    spec.add_argument("--router", metavar="FILE",
                      help="router drafter: payoff models (lumotree train router; default: MODEL/router.json if "
                           "present, else confidence sums), updated online")
    spec.add_argument("--exit-layer", type=int, default=None,
                      help="layer-skip drafter: the draft is the target's first EXIT_LAYER layers (default: half)")
    spec.add_argument("--budget", choices=("expected", "ratio", "fixed"), default="expected",
                      help="expected: maximise expected tokens/s from confidences and measured costs; ratio: "
                           "largest N with T_verify <= (1 + eps) T_decode; fixed: always --max-nodes")
    spec.add_argument("--max-nodes", type=int, default=32, help="largest draft tree (root included), 1..128")
    spec.add_argument("--eps", type=float, default=0.1, help="ratio budget's slack")
    spec.add_argument("--profile", default="auto",
                      help="the budget's cost profile: auto (cached per model and device under $LUMOTREE_CACHE or "
                           "~/.cache/lumotree, measured on first use), measure (measure again), or a JSON file")
    spec.add_argument("--profile-time-limit", type=float, default=60.0,
                      help="seconds the start-up measurement may take; the rest is extrapolated")
    spec.add_argument("--save-profile", help="also write the cost profile here")


# ------------------------------------------------------------------------------------------------------ checks
def _writable(path: str, option: str) -> None:
    """``path`` can be written (its folder exists and takes files): checked before any decoding."""
    folder = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path) or not os.path.isdir(folder) or not os.access(folder, os.W_OK):
        raise UsageError(f"{option} {path}: cannot write there (no such folder, or not writable)")


def prefix_cache_bytes(args: argparse.Namespace) -> int:
    """``--prefix-cache`` in bytes (0: off)."""
    from lumotree.optimized.engine.prefix_cache import parse_size

    try:
        return parse_size(args.prefix_cache)
    except ValueError as exc:
        raise UsageError(f"--prefix-cache {args.prefix_cache}: {exc}") from None


def _count_or_auto(text: str) -> int | None:
    """An integer option that also takes ``auto`` (None: planned from the device memory)."""
    if text == "auto":
        return None
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid value {text!r}: want an integer or auto") from None


def check_arguments(args: argparse.Namespace) -> None:
    """Every option's value, before anything is loaded."""
    if args.max_new_tokens < 1:
        raise UsageError(f"--max-new-tokens = {args.max_new_tokens}: must be at least 1")
    check_model_arguments(args)
    if not (math.isfinite(args.temperature) and args.temperature >= 0):
        raise UsageError(f"--temperature = {args.temperature}: must be finite and >= 0 (0 = greedy)")
    if not (0 < args.top_p <= 1):
        raise UsageError(f"--top-p = {args.top_p}: must lie in (0, 1]")
    if args.top_k < 0:
        raise UsageError(f"--top-k = {args.top_k}: must be >= 0 (0 = all tokens)")
    if args.json:
        _writable(args.json, "--json")
    if args.batch_file and not os.path.isfile(args.batch_file):
        raise UsageError(f"--batch-file {args.batch_file}: no such file")
    if not args.prompt and not args.batch_file:
        raise UsageError("no prompt given (use --prompt or --batch-file)")


def check_model_arguments(args: argparse.Namespace) -> None:
    """The values of the model and speculation options (:func:`add_model_arguments`,
    :func:`add_speculation_arguments`), before anything is loaded."""
    for name in ("num_slots", "max_seq_len", "max_nodes"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            raise UsageError(f"--{name.replace('_', '-')} = {getattr(args, name)}: must be at least 1")
    if args.max_nodes > 128:
        raise UsageError(f"--max-nodes = {args.max_nodes}: the kernels take trees of at most 128 nodes")
    if args.seed < 0:
        raise UsageError(f"--seed = {args.seed}: must be >= 0")
    prefix_cache_bytes(args)
    if args.prefix_block < 1:
        raise UsageError(f"--prefix-block = {args.prefix_block}: must be at least 1")
    if not (math.isfinite(args.eps) and args.eps >= 0):
        raise UsageError(f"--eps = {args.eps}: must be finite and >= 0")
    if not args.profile_time_limit > 0:
        raise UsageError(f"--profile-time-limit = {args.profile_time_limit}: must be > 0 seconds")
    if args.drafter not in DRAFTERS:
        raise UsageError(f"--drafter {args.drafter!r}: expected one of "
                         f"{', '.join(d for d in DRAFTERS if d != 'synthetic')}")
    if args.drafter == "synthetic" and args.spec != "none":
        raise UsageError("--drafter synthetic reads an oracle continuation; it exists for system benchmarks only "
                         "(lumotree bench e2e), not for decoding")
    for name in ("mtp_depth", "mtp_top_k"):
        if getattr(args, name) < 1:
            raise UsageError(f"--{name.replace('_', '-')} = {getattr(args, name)}: must be at least 1")
    if args.drafter == "mtp" and args.spec != "none" and prefix_cache_bytes(args):
        raise UsageError(f"--prefix-cache {args.prefix_cache} with --drafter mtp: the MTP head reads the target's "
                         "hidden states of the whole prompt, which a prefix-cache hit does not compute; use one of them")
    if args.eagle is not None and args.drafter not in ("eagle", "router"):
        raise UsageError(f"--eagle applies to --drafter eagle or router, not {args.drafter}")
    if args.router is not None and args.drafter != "router":
        raise UsageError(f"--router applies to --drafter router, not {args.drafter}")
    if args.drafter == "eagle" and args.spec != "none":
        folder = args.eagle or (os.path.join(args.model, "eagle") if args.model else None)
        if folder is None or not os.path.isfile(os.path.join(folder, "config.json")):
            raise UsageError(f"--drafter eagle: no EAGLE head at {folder or '(no --eagle DIR)'} (train one with "
                             "lumotree train eagle --model DIR)")
        args.eagle = folder
    if args.drafter == "router" and args.spec != "none":
        if args.router is None and args.model and os.path.isfile(os.path.join(args.model, "router.json")):
            args.router = os.path.join(args.model, "router.json")
        if args.router is not None and not os.path.isfile(args.router):
            raise UsageError(f"--router {args.router}: no such file")
        if args.eagle is not None and not os.path.isfile(os.path.join(args.eagle, "config.json")):
            raise UsageError(f"--eagle {args.eagle}: no EAGLE head there (no config.json)")
    if args.exit_layer is not None and args.drafter != "layer-skip":
        raise UsageError(f"--exit-layer applies to --drafter layer-skip, not {args.drafter}")
    if args.drafter == "draft-model":
        try:
            layers = [int(x) for x in args.draft_layers.split(",") if x.strip()]
        except ValueError:
            raise UsageError(f"--draft-layers {args.draft_layers!r}: want comma-separated layer indices") from None
        if not layers or len(set(layers)) != len(layers) or min(layers) < 0:
            raise UsageError(f"--draft-layers {args.draft_layers!r}: want distinct layer indices >= 0")
    if args.save_profile:
        _writable(args.save_profile, "--save-profile")
    if args.profile not in ("auto", "measure") and not os.path.isfile(args.profile):
        raise UsageError(f"--profile {args.profile}: no such file (or auto / measure)")


def choose_backend(args: argparse.Namespace) -> str:
    """``args.backend`` resolved: ``auto`` is the optimized backend on a CUDA GPU, else the reference; the optimized
    backend without a GPU needs the Triton interpreter."""
    import torch

    cuda = torch.cuda.is_available()
    interpreter = os.environ.get("TRITON_INTERPRET", "0") == "1"
    if args.backend == "auto":
        return "optimized" if cuda else "reference"
    if args.backend == "optimized" and not cuda and not interpreter:
        raise UsageError("--backend optimized needs a CUDA GPU; on a CPU use --backend reference, or set "
                         "TRITON_INTERPRET=1 to run the Triton kernels in the interpreter (slow)")
    return args.backend


def _token_ids(value: Any, where: str) -> list[int]:
    """A prompt given as ids: a list of non-negative Python ints (no floats, booleans or strings in disguise)."""
    if not isinstance(value, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in value):
        raise UsageError(f"{where}: a prompt given as ids must be a list of integers, got {json.dumps(value)[:60]}")
    return list(value)


def _parse_ids(text: str, where: str) -> list[int]:
    try:
        return [int(t) for t in text.replace(",", " ").split()]
    except ValueError:
        raise UsageError(f"{where}: {text[:40]!r} is not a list of token ids (no tokenizer in the model "
                         "directory; pass ids like '1 2 3')") from None


def load_prompts(args: argparse.Namespace, tokenizer: Any, vocab_size: int
                 ) -> list[tuple[list[int], dict[str, Any]]]:
    """``(ids, sampling overrides)`` per prompt, each id checked against the vocabulary and each prompt non-empty."""
    raw: list[tuple[str | list, dict[str, Any], str]] = [(p, {}, f"--prompt #{i + 1}") for i, p in
                                                         enumerate(args.prompt)]
    if args.batch_file:
        with open(args.batch_file) as f:
            for n, line in enumerate(f, 1):
                where = f"{args.batch_file}:{n}"
                line = line.rstrip("\n")
                if not line.strip():
                    continue
                if not line.lstrip().startswith("{"):
                    raw.append((line, {}, where))
                    continue
                try:
                    item = json.loads(line)
                except json.JSONDecodeError as exc:
                    raise UsageError(f"{where}: not valid JSON ({exc.msg} at column {exc.colno})") from None
                if not isinstance(item, dict) or "prompt" not in item:
                    raise UsageError(f"{where}: a JSON line must be an object with a \"prompt\"")
                prompt = item.pop("prompt")
                if not isinstance(prompt, (str, list)):
                    raise UsageError(f"{where}: \"prompt\" must be a string or a list of token ids, got "
                                     f"{type(prompt).__name__}")
                unknown = set(item) - set(SAMPLING_KEYS)
                if unknown:
                    raise UsageError(f"{where}: keys {sorted(unknown)} are not sampling parameters "
                                     f"({', '.join(SAMPLING_KEYS)})")
                raw.append((_token_ids(prompt, where) if isinstance(prompt, list) else prompt, item, where))
    return [(prompt_ids(prompt, None if args.ids else tokenizer, vocab_size, args.max_seq_len, where), extra)
            for prompt, extra, where in raw]


def prompt_ids(prompt: str | list[int], tokenizer: Any, vocab_size: int, max_seq_len: int | None, where: str
               ) -> list[int]:
    """A prompt's token ids: a list of ids as given, text through the tokenizer, or (no tokenizer) whitespace-separated
    ids; checked non-empty, inside the vocabulary and leaving room for one new token under ``max_seq_len`` (None:
    planned with the model, the engine checks it then)."""
    if isinstance(prompt, list):
        ids = _token_ids(prompt, where)
    elif tokenizer is not None:
        ids = list(tokenizer.encode(prompt))
    else:
        ids = _parse_ids(prompt, where)
    if not ids:
        raise UsageError(f"{where}: the prompt is empty")
    bad = [t for t in ids if not 0 <= t < vocab_size]
    if bad:
        raise UsageError(f"{where}: token id {bad[0]} is outside the vocabulary [0, {vocab_size})")
    if max_seq_len is not None and len(ids) >= max_seq_len:
        raise UsageError(f"{where}: the prompt has {len(ids)} tokens, which leaves no room for a new token in the "
                         f"context of {max_seq_len} (--max-seq-len)")
    return ids


# ------------------------------------------------------------------------------------------------------ model
def build_model(args: argparse.Namespace, backend: str) -> tuple[Any, Any, Any, Any]:
    """(target, draft target or None, tokenizer or None, config) for the command-line options. A checkpoint loads
    through the reference's float64 reader (small models only) or streams to the device (optimized backend)."""
    from lumotree.optimized.engine import OptimizedTarget, ReferenceTarget, layer_skip_checkpoint
    from lumotree.reference.checkpoint import read_config, tensor_table
    from lumotree.reference.config import HybridConfig
    from lumotree.reference.drafters import layer_skip_config, layer_skip_draft

    if args.backend == "auto" and backend == "reference":
        sys.stderr.write("no CUDA GPU: the reference backend (exact float64 on the CPU); --backend optimized with "
                         "TRITON_INTERPRET=1 runs the Triton kernels in the interpreter instead\n")
    tokenizer = None
    if args.model:
        raw = read_config(args.model)
        config = HybridConfig.from_dict(raw)  # config errors before anything is read
        tokenizer = _tokenizer(args.model)
    else:  # with --drafter mtp a random model gets a random MTP head too (drawn after the text model's weights)
        config = HybridConfig(**{**RANDOM_CONFIGS[args.random], "mtp_num_hidden_layers": int(args.drafter in ("mtp", "router"))})
    if args.drafter == "mtp" and args.spec != "none" and args.model and \
            not any(name.startswith("mtp.") for name in tensor_table(args.model)):
        raise UsageError(f"--drafter mtp: {args.model} holds no MTP head (no mtp.* tensors); use --drafter ngram or "
                         "draft-model")
    if args.drafter == "router" and args.spec != "none" and args.model and args.eagle is None and \
            not os.path.isfile(os.path.join(args.model, "eagle", "config.json")) and \
            not any(name.startswith("mtp.") for name in tensor_table(args.model)):
        raise UsageError(f"--drafter router: {args.model} has neither an EAGLE head (--eagle DIR, or DIR/eagle) nor an "
                         "MTP head for its model drafter")
    draft_layers = [int(x) for x in args.draft_layers.split(",") if x.strip()] if args.drafter == "draft-model" else []
    if args.drafter in SELF_SPECULATION:
        try:
            draft_layers = self_speculation_layers(config, args.drafter, args.exit_layer)
        except ValueError as exc:
            raise UsageError(f"--drafter {args.drafter}: {exc}".replace("exit_layer", "--exit-layer")) from None
    if draft_layers and max(draft_layers) >= config.num_hidden_layers:
        raise UsageError(f"--draft-layers {args.draft_layers!r}: the model has layers "
                         f"0..{config.num_hidden_layers - 1}")
    if args.model and "vision_config" in raw:
        sys.stderr.write("note: the checkpoint's vision tower (model.visual.*) is skipped: lumotree runs its text "
                         "model\n")
    planned = [f"--{name.replace('_', '-')}" for name in ("num_slots", "max_seq_len") if getattr(args, name) is None]
    if planned and backend == "reference":
        raise UsageError(f"{planned[0]} auto plans device memory: the optimized backend only")
    if len(planned) == 2:
        raise UsageError("--num-slots auto and --max-seq-len auto: give one of them a number (the other is planned)")
    uses_eagle = args.spec != "none" and (args.drafter == "eagle" or (args.drafter == "router" and (
        args.eagle is not None or (args.model and os.path.isfile(os.path.join(args.model, "eagle", "config.json"))))))
    if planned and draft_layers:
        raise UsageError(f"{planned[0]} auto plans one model's memory: give --num-slots and --max-seq-len with "
                         f"--drafter {args.drafter}")
    if backend == "reference":
        from lumotree.reference.model import build_random, load_pretrained

        model = load_pretrained(args.model) if args.model else build_random(config, seed=args.seed)
        target = ReferenceTarget(model, args.num_slots, args.max_seq_len, args.max_nodes)
        draft = ReferenceTarget(layer_skip_draft(model, draft_layers), args.num_slots, args.max_seq_len, 128) \
            if draft_layers else None
        return target, draft, tokenizer, model.config
    from lumotree.optimized.model import OptimizedModel, ProgressBar, load_checkpoint, random_tensors, select_layers

    par, dev = join_group(args)  # one process, or this rank of --tensor-parallel
    common = dict(num_slots=args.num_slots, max_seq_len=args.max_seq_len, device=dev, dtype=_dtype(args),
                  memory_reserved=prefix_cache_bytes(args), parallel=par)
    dtype = common["dtype"]
    draft = None
    if args.model:
        config, weights, _ = load_checkpoint(args.model, dev, dtype, progress=None if args.quiet else ProgressBar(),
                                             part=(par.rank, par.world))  # this rank's part, layer by layer
        target = OptimizedTarget(OptimizedModel(config, weights, max_nodes=max(args.max_nodes, 1),
                                                eagle_layers=int(uses_eagle), **common), validate=dev.type != "cuda")
        _note_plan(args, target.model, planned)
        if draft_layers:  # the draft shares the target's tensors
            dc, chosen = layer_skip_config(config, draft_layers)
            draft = OptimizedTarget(OptimizedModel(dc, select_layers(target.model.weights, chosen), max_nodes=64,
                                                   **common),
                                    validate=dev.type != "cuda")
        return target, draft, tokenizer, config
    tensors = random_tensors(config, args.seed, dev, dtype)
    target = OptimizedTarget(OptimizedModel(config, tensors, max_nodes=max(args.max_nodes, 1),
                                            eagle_layers=int(uses_eagle), **common), validate=dev.type != "cuda")
    _note_plan(args, target.model, planned)
    if draft_layers:
        dc, dt = layer_skip_checkpoint(config, tensors, draft_layers)
        draft = OptimizedTarget(OptimizedModel(dc, dt, max_nodes=64, **common), validate=dev.type != "cuda")
    return target, draft, tokenizer, config


def _note_plan(args: argparse.Namespace, model: Any, planned: list[str]) -> None:
    """With ``auto`` sizes: the planned pools on stderr, and the sizes in ``args`` for what follows."""
    args.num_slots, args.max_seq_len = model.num_slots, model.max_seq_len
    if planned and not getattr(args, "quiet", False):  # lumotree serve has no --quiet
        sys.stderr.write(f"note: memory plan: {model.memory_plan.summary()}\n")


def _tokenizer(model_dir: str) -> Any:
    """transformers' tokenizer of the checkpoint directory, or None when it holds none."""
    if not any(os.path.exists(os.path.join(model_dir, f)) for f in ("tokenizer.json", "tokenizer_config.json")):
        return None
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(model_dir)
    except Exception as exc:  # noqa: BLE001 - a malformed tokenizer file is the user's input
        raise UsageError(f"{model_dir}: its tokenizer does not load ({str(exc).splitlines()[0][:120]})") from None


def _device():
    import torch

    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def _dtype(args: argparse.Namespace):
    import torch

    if args.dtype:
        return getattr(torch, args.dtype)
    return torch.bfloat16 if _device().type == "cuda" else torch.float32


def cost_profile(args: argparse.Namespace, engine: Any) -> Any:
    """The engine's cost profile (``--profile``): loaded from a file or the cache, else measured (bounded by
    ``--profile-time-limit``) and cached; one line on stderr says which."""
    from lumotree.optimized.engine.budget import CostProfile, profile_cache_path

    path = args.profile if args.profile not in ("auto", "measure") else profile_cache_path(engine.profile_key())
    if args.profile != "measure" and os.path.isfile(path):
        try:
            profile = CostProfile.load(path)
        except (ValueError, KeyError, TypeError, json.JSONDecodeError) as exc:
            raise UsageError(f"--profile {path}: not a cost profile ({exc})") from None
        sys.stderr.write(f"cost profile: {path}\n")
        return profile
    start = time.perf_counter()
    profile = engine.measure_profile(repeats=5 if engine.model.device.type == "cuda" else 1,
                                     time_limit=args.profile_time_limit)
    if engine.parallel.rank == 0:  # tensor parallel: rank 0's times (its budget decides)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        profile.save(path)
    sys.stderr.write(f"cost profile: measured in {time.perf_counter() - start:.1f} s, cached in {path}\n")
    return profile


def build_engine(args: argparse.Namespace, target: Any, draft: Any, sampling: bool) -> Any:
    """The engine of the speculation options over ``target`` (and ``draft``, the draft-model drafter's model): its
    cost profile loaded or measured (:func:`cost_profile`) and saved where asked, and on a GPU its kernels compiled
    and CUDA graphs captured (with ``sampling``, those of sampled steps too) before the first request."""
    from lumotree.optimized.engine import Engine, make_drafter

    mode = {"none": "autoregressive", "chain": "chain", "tree": "tree"}[args.spec]
    options = dict(depth=args.mtp_depth, top_k=args.mtp_top_k, sampled=args.mtp_sampled) if args.drafter == "mtp" \
        else {}
    if args.drafter == "eagle":
        options = {"eagle": args.eagle}
    elif args.drafter == "router":
        options = {"eagle": args.eagle, "model_dir": args.model, "router": args.router}
    drafter = make_drafter(args.drafter, draft_model=draft, target=target, **options) \
        if mode != "autoregressive" else None
    engine = Engine(target, drafter, mode=mode, budget="fixed", max_nodes=args.max_nodes, eps=args.eps,
                    seed=args.seed)
    if mode != "autoregressive" and args.budget != "fixed":
        engine = Engine(target, drafter, mode=mode, budget=args.budget, max_nodes=args.max_nodes, eps=args.eps,
                        profile=cost_profile(args, engine), seed=args.seed)
    if args.drafter == "router" and drafter is not None:
        drafter.profile = engine.profile  # the router weighs payoffs by the budget's verify costs
    if args.save_profile and engine.profile is not None and engine.parallel.rank == 0:
        engine.profile.save(args.save_profile)
    if target.device.type == "cuda":
        sys.stderr.write("warming up: compiling kernels and capturing CUDA graphs ...")
        sys.stderr.flush()
        seconds = engine.warm_up(sampling=sampling)
        sys.stderr.write(f" done in {seconds:.1f} s\n")
    if prefix_cache_bytes(args):  # after the warm-up and the profile: their prompts are not kept
        from lumotree.optimized.engine import PrefixCache

        engine.set_prefix_cache(PrefixCache(prefix_cache_bytes(args), args.prefix_block))
    return engine


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


# ------------------------------------------------------------------------------------------------------ command
def run(args: argparse.Namespace) -> int:
    from lumotree.optimized.engine import SamplingParams

    check_arguments(args)
    try:
        base = SamplingParams(temperature=args.temperature, top_p=args.top_p, top_k=args.top_k,
                              max_new_tokens=args.max_new_tokens, stop_token_ids=tuple(args.stop))
    except (ValueError, TypeError) as exc:
        raise UsageError(str(exc)) from None
    backend = choose_backend(args)
    check_parallel_arguments(args, backend)
    code = launch_ranks(args)
    if code is not None:  # --tensor-parallel: this process started the ranks
        return code
    target, draft, tokenizer, config = build_model(args, backend)
    prompts = load_prompts(args, tokenizer, config.vocab_size)
    params = []
    for (_, extra), where in zip(prompts, range(len(prompts))):
        try:
            params.append(SamplingParams(**{**base.__dict__, **extra}))
        except (ValueError, TypeError) as exc:
            raise UsageError(f"prompt #{where + 1}: {exc}") from None
    engine = build_engine(args, target, draft, sampling=any(p.temperature > 0 for p in params))
    drafter = engine.drafter
    decode = (lambda ids: tokenizer.decode(ids)) if tokenizer is not None else (lambda ids: " ".join(map(str, ids)))
    total = sum(p.max_new_tokens for p in params)
    stream = len(prompts) == 1 and not args.no_stream
    # a streamed answer and a progress line cannot share one terminal line: with both on the terminal, the progress
    # line is left out while tokens stream, and the summary (with tokens/s) follows the answer
    shared_terminal = stream and sys.stdout.isatty() and sys.stderr.isatty()
    progress = Progress(total, enabled=not args.quiet and not shared_terminal)
    sys.stderr.write(f"lumotree generate: {len(prompts)} prompt(s), spec={args.spec}, drafter="
                     f"{drafter.name if drafter else '-'}, budget={args.budget}, backend={backend} on "
                     f"{getattr(target, 'device', 'cpu')}\n")
    try:
        ids = engine.submit_all([p for p, _ in prompts], params)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
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
    if args.json and engine.parallel.rank == 0:
        with open(args.json, "w") as f:
            json.dump({"results": [{"id": i, "prompt": engine.finished[i].prompt, "tokens": outputs[i],
                                    "finish_reason": engine.finished[i].finish_reason} for i in ids],
                       "summary": summary}, f, indent=1)
    return 0
