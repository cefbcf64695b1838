r"""``lumotree bench e2e --model DIR --workload NAME``: the engine end to end on real text, with the drafters a user
would run (also ``python bench/e2e.py --model DIR``).

The model is a checkpoint directory (``config.json``, safetensors, ``tokenizer.json``: e.g. the trained organism,
``lumotree train organism``). The workloads are those of :mod:`lumotree.workloads` (``completion``, ``edit``,
``tool_loop``): by name, the model directory's ``workloads/NAME.jsonl``; or a path to a JSONL file. Prompts are
tokenised with the model's tokenizer (transformers' ``AutoTokenizer``); a batch of B takes the workload's first B
items (cycled when it has fewer; the run notes it). Every request decodes greedily up to ``--new-tokens`` tokens,
stopping at the end-of-text token unless ``--ignore-eos``.

Per workload and batch size (``--batches``, default 1 16 64):

- ``autoregressive``: the baseline, and the oracle every other run's output is compared with, token for token;
- for each drafter of ``--drafters`` that the checkpoint supports (``ngram`` prompt lookup, ``suffix``, ``layer-skip``
  and ``gdn-only`` self-speculation, ``mtp`` when the checkpoint has ``mtp.*`` weights and the drafter is
  registered): chain and tree, both under the expected-throughput budget (``--max-nodes``).

Per run: decode tokens/s (prefill excluded), speed-up over autoregressive, mean accepted draft tokens per speculative
step, the budget's choices (how many steps it verified a tree of each node bucket and how many it decoded instead),
draft and model milliseconds per step, and whether the greedy output equals the autoregressive one (``equal_to_ar``,
with the requests that differ; in bfloat16 a near-tie of two logits can be decided differently by a tree step and a
decode step, ``--dtype float32`` rules that out).

Besides the timed runs, each drafter's **acceptance profile** on each workload is recorded
(:mod:`~lumotree.optimized.engine.replay`: per depth and sibling rank, the probability that the target accepts the
candidate) in an untimed tree run at the fixed size ``--record-nodes`` over the workload's distinct prompts; with
``--profile-dir`` each is written as ``WORKLOAD-DRAFTER.json``, the input of ``lumotree bench e2e --replay``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

from lumotree.errors import UsageError

__all__ = ["REAL_DRAFTERS", "resolve_workload", "encode_prompts", "build_real_target", "run_real"]

REAL_DRAFTERS = ("ngram", "suffix", "layer-skip", "gdn-only", "mtp")


def resolve_workload(model_dir: str | os.PathLike, spec: str) -> tuple[str, Path]:
    """(name, JSONL path) of ``--workload spec``: a workload name (the model directory's ``workloads/NAME.jsonl``) or
    a path to a workload file."""
    from lumotree.workloads import WORKLOADS

    if spec in WORKLOADS:
        path = Path(model_dir) / "workloads" / f"{spec}.jsonl"
        if not path.is_file():
            raise UsageError(f"--workload {spec}: {path} does not exist (build it with the organism's workloads, or "
                             "pass a JSONL path)")
        return spec, path
    path = Path(spec)
    if not path.is_file():
        raise UsageError(f"--workload {spec!r} is neither one of {WORKLOADS} nor a workload file")
    return path.stem, path


def encode_prompts(items: list[Any], tokenizer: Any, max_prompt_tokens: int | None = None) -> list[list[int]]:
    """Every item's prompt as token ids (the last ``max_prompt_tokens`` of them when given)."""
    out = []
    for item in items:
        ids = item.prompt_ids(tokenizer)
        if not ids:
            raise UsageError(f"workload item {item.id}: its prompt encodes to no tokens")
        out.append(ids[-max_prompt_tokens:] if max_prompt_tokens else ids)
    return out


def _stop_ids(tokenizer: Any) -> tuple[int, ...]:
    """The end-of-text and end-of-turn ids the tokenizer has (``<|endoftext|>``, ``<|end|>``)."""
    ids = []
    for token in ("<|endoftext|>", "<|end|>"):
        tid = tokenizer.convert_tokens_to_ids(token) if hasattr(tokenizer, "convert_tokens_to_ids") \
            else tokenizer.token_to_id(token)
        unk = getattr(tokenizer, "unk_token_id", None)
        if tid is not None and tid != unk and tid >= 0:
            ids.append(int(tid))
    return tuple(ids)


def build_real_target(model_dir: str, backend: str, device: Any, dtype: Any, num_slots: int, max_seq_len: int,
                      max_nodes: int) -> dict[str, Any]:
    """The target and what the drafters need: ``{"target", "config", "draft" (kind -> draft target factory),
    "has_mtp"}``. ``backend``: ``"optimized"`` (the runtime, on ``device`` in ``dtype``) or
    ``"reference"`` (the exact float64 model, CPU, small models)."""
    from lumotree.reference.checkpoint import tensor_table
    from lumotree.reference.drafters import layer_skip_config, layer_skip_draft

    from .selfspec import self_speculation_layers
    from .targets import OptimizedTarget, ReferenceTarget

    has_mtp = any(name.startswith("mtp.") for name in tensor_table(model_dir))
    if backend == "reference":
        from lumotree.reference.model import load_pretrained

        model = load_pretrained(model_dir)
        config = model.config
        target = ReferenceTarget(model, num_slots, max_seq_len, max_nodes)

        def draft(kind: str) -> Any:
            layers = self_speculation_layers(config, kind)
            return ReferenceTarget(layer_skip_draft(model, layers), num_slots, max_seq_len, 128)

        return dict(target=target, config=config, draft=draft, has_mtp=has_mtp)
    from ..model import OptimizedModel, load_checkpoint, select_layers

    config, weights, _ = load_checkpoint(model_dir, device, dtype)
    common = dict(num_slots=num_slots, max_seq_len=max_seq_len, device=device, dtype=dtype)
    validate = device.type != "cuda"
    target = OptimizedTarget(OptimizedModel(config, weights, max_nodes=max_nodes, **common), validate=validate)

    def draft(kind: str) -> Any:
        dc, chosen = layer_skip_config(config, self_speculation_layers(config, kind))
        return OptimizedTarget(OptimizedModel(dc, select_layers(weights, chosen), max_nodes=128, **common),
                               validate=validate)

    return dict(target=target, config=config, draft=draft, has_mtp=has_mtp)


def _drafter_factory(name: str, built: dict[str, Any], args: argparse.Namespace) -> Any:
    """A function making a fresh drafter ``name`` (drafters keep per-slot state), or None when it cannot run here."""
    from .drafters import DRAFTERS, make_drafter

    if name in ("ngram", "suffix"):
        return lambda: make_drafter(name)
    if name in ("layer-skip", "gdn-only"):
        try:
            model = built["draft"](name)
        except ValueError:  # e.g. gdn-only on a model without attention layers
            return None
        return lambda: make_drafter(name, draft_model=model)
    if name == "mtp":
        if "mtp" not in DRAFTERS or not built["has_mtp"]:
            return None
        return lambda: make_drafter("mtp", target=built["target"], depth=args.mtp_depth, top_k=args.mtp_top_k)
    raise UsageError(f"--drafters: {name!r} is not one of {REAL_DRAFTERS}")


def _run(engine_factory: Any, prompts: list[list[int]], params: Any, repeats: int, warm: bool) -> tuple[Any, Any]:
    """(engine, outputs) of the fastest of ``repeats`` generations (decode seconds), after an untimed short one."""
    from .sampling import SamplingParams

    if warm:
        engine_factory().generate(prompts, SamplingParams(max_new_tokens=min(8, params.max_new_tokens),
                                                          stop_token_ids=params.stop_token_ids))
    best = None
    for _ in range(repeats):
        engine = engine_factory()
        out = engine.generate(prompts, params)
        if best is None or engine.stats.summary()["decode_seconds"] < best[0].stats.summary()["decode_seconds"]:
            best = (engine, out)
    return best


class DifferenceExplainer:
    """Why greedy outputs differ from autoregressive decoding: the float64 reference
    (:func:`lumotree.reference.model.load_pretrained`, loaded on first use) gives the top-2 logit gap at the first
    differing position, next to the runtime's own logit error on a prompt (:meth:`logit_error`). A gap within that
    error is a near-tie that rounding may flip; a larger one is a wrong token."""

    def __init__(self, model_dir: str, limit: int):
        self.model_dir, self.limit, self._ref = model_dir, int(limit), None

    def reference(self) -> Any:
        if self._ref is None:
            from lumotree.reference.model import load_pretrained

            self._ref = load_pretrained(self.model_dir)
        return self._ref

    def logit_error(self, target: Any, prompt: list[int]) -> float:
        """Largest |runtime - float64| of the logits after ``prompt`` (slot 0, released after)."""
        import numpy as np

        ref = self.reference()
        got = target.prefill(0, prompt).double().cpu().numpy().reshape(-1)  # [V]
        target.release(0)
        return float(np.abs(got - ref.forward(prompt, ref.new_cache())[-1]).max())

    def explain(self, prompts: list[list[int]], tokens: list[list[int]], ar_tokens: list[list[int]],
                differ: list[int]) -> list[dict[str, Any]]:
        import numpy as np

        out = []
        for i in differ[: self.limit]:
            j = next(k for k, (a, b) in enumerate(zip(tokens[i], ar_tokens[i])) if a != b)
            ref = self.reference()
            logits = ref.forward(prompts[i] + ar_tokens[i][:j], ref.new_cache())[-1]  # [V] before position j
            top2 = np.sort(logits)[-2:]
            out.append({"request": i, "position": j, "autoregressive_token": ar_tokens[i][j],
                        "token": tokens[i][j], "top2_gap_float64": float(top2[1] - top2[0])})
        return out


def _mean_ms(seconds: list[float]) -> float:
    return 1e3 * sum(seconds) / len(seconds) if seconds else 0.0


def _record(engine: Any, out: list[Any], ar_tokens: list[list[int]] | None) -> dict[str, Any]:
    s = engine.stats.summary()
    steps = [x for x in engine.stats.steps if x.kind != "prefill"]
    spec = [x for x in steps if x.kind == "verify"]
    choices = Counter("autoregressive" if x.kind == "autoregressive" else str(x.nodes) for x in steps)
    tokens = [r.tokens for r in out]
    differ = [] if ar_tokens is None else [i for i, (a, b) in enumerate(zip(tokens, ar_tokens)) if a != b]
    return {
        "tokens_per_s": s["tokens_per_s"], "decode_tokens": s["decode_tokens"], "decode_seconds": s["decode_seconds"],
        "steps": len(steps), "speculative_steps": len(spec),
        "mean_accepted": (sum(x.accepted for x in spec) / sum(x.batch for x in spec)) if spec else 0.0,
        "mean_nodes": (sum(x.nodes for x in spec) / len(spec)) if spec else 1.0,
        "budget_choices": dict(sorted(choices.items(), key=lambda kv: (kv[0] != "autoregressive",
                                                                        int(kv[0]) if kv[0].isdigit() else 0))),
        "model_ms_per_step": _mean_ms([x.model_s for x in steps]),
        "model_ms_per_spec_step": _mean_ms([x.model_s for x in spec]),
        "model_ms_per_ar_step": _mean_ms([x.model_s for x in steps if x.kind == "autoregressive"]),
        "slowest_step_ms": 1e3 * max((x.total_s for x in steps), default=0.0),
        "host_ms_per_step": _mean_ms([x.total_s - x.model_s - x.draft_s for x in steps]),  # budget, drafter's advance,
        # bookkeeping: the step but its draft and model call
        "declined_drafts": sum(1 for x in steps if x.kind == "autoregressive" and x.draft_s > 0),
        "declined_draft_ms": 1e3 * sum(x.draft_s for x in steps if x.kind == "autoregressive"),
        "draft_ms_per_spec_step": 1e3 * s["draft_s_per_step"],
        "equal_to_ar": not differ, "requests_differing": differ,
    }


def run_real(args: argparse.Namespace) -> int:
    import torch

    from lumotree.workloads import load_workload

    from ..ops.checks import interpreting
    from .engine import Engine
    from .replay import record_acceptance
    from .sampling import SamplingParams

    t_start = time.perf_counter()

    def log(msg: str) -> None:
        sys.stderr.write(f"[e2e real {time.perf_counter() - t_start:7.1f}s] {msg}\n")
        sys.stderr.flush()

    if not os.path.isdir(args.model) or not os.path.isfile(os.path.join(args.model, "config.json")):
        raise UsageError(f"--model {args.model}: not a checkpoint directory (no config.json)")
    for name in args.drafters:
        if name not in REAL_DRAFTERS:
            raise UsageError(f"--drafters: {name!r} is not one of {REAL_DRAFTERS}")
    workloads = [resolve_workload(args.model, spec) for spec in args.workload]
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(args.model)
    except Exception as exc:  # noqa: BLE001 - a missing or malformed tokenizer is the user's input
        raise UsageError(f"--model {args.model}: its tokenizer does not load ({str(exc).splitlines()[0][:120]})") \
            from None
    stop = () if args.ignore_eos else _stop_ids(tokenizer)
    try:
        dev = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    except RuntimeError:
        raise UsageError(f"--device {args.device!r} is not a device (cuda, cuda:1, cpu)") from None
    cuda = dev.type == "cuda"
    if args.backend == "optimized" and not cuda and not interpreting():
        raise UsageError(f"--device {dev}: the optimized backend needs a CUDA GPU, or TRITON_INTERPRET=1 to run its "
                         "kernels in the interpreter (slow); --backend reference runs the float64 reference")
    if cuda and not torch.cuda.is_available():
        raise UsageError(f"--device {dev}: no CUDA GPU is available")
    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}.get(args.dtype) or \
        (torch.bfloat16 if cuda else torch.float32)
    batches = sorted(set(args.batches or [1, 16, 64]))
    encoded = {}
    for name, path in workloads:
        try:
            items = load_workload(path)
        except ValueError as exc:
            raise UsageError(f"--workload {path}: {exc}") from None
        if not items:
            raise UsageError(f"--workload {path}: no items")
        encoded[name] = encode_prompts(items, tokenizer, args.max_prompt_tokens)
    longest = max(len(p) for prompts in encoded.values() for p in prompts)
    max_seq_len = longest + args.new_tokens + max(args.max_nodes, args.record_nodes) + 8
    num_slots = max(max(batches), max(min(len(p), max(batches)) for p in encoded.values()))
    built = build_real_target(args.model, args.backend, dev, dtype, num_slots, max_seq_len,
                              max(args.max_nodes, args.record_nodes))
    target = built["target"]
    log(f"model {args.model} ({args.backend}, {dtype}, {dev}); workloads {[w for w, _ in workloads]}; "
        f"longest prompt {longest} tokens")
    factories = {}
    notes: list[str] = []
    for name in args.drafters:
        factory = _drafter_factory(name, built, args)
        if factory is None:
            notes.append(f"drafter {name}: not available for this checkpoint (skipped)")
            log(notes[-1])
        else:
            factories[name] = factory
    node_buckets = tuple(n for n in (1, 2, 4, 8, 16, 32, 64, 128) if n <= args.max_nodes)
    profile_engine = Engine(target, None, mode="autoregressive", max_nodes=args.max_nodes, node_buckets=node_buckets)
    if args.cost_profile:
        from .budget import CostProfile

        try:
            with open(args.cost_profile) as f:
                data = json.load(f)
            cost = CostProfile.from_dict(data.get("cost_profile", data))  # a profile, or an earlier --out file
        except (OSError, ValueError, KeyError, AttributeError) as exc:
            raise UsageError(f"--cost-profile {args.cost_profile}: not a cost profile ({exc})") from None
    else:
        cost = profile_engine.measure_profile(repeats=9 if cuda else 1, time_limit=args.profile_time_limit)
    measured_cost = cost.to_dict()  # as measured (the budgets' calibration updates it as the runs go)
    log("cost profile ready")
    if cuda and factories:  # every step shape compiled and captured before the timed runs (a profile cut short by
        # --profile-time-limit extrapolates shapes it never ran, and a capture inside a timed run costs a step ~0.1 s)
        seconds = sum(Engine(target, factory(), mode="tree", max_nodes=args.max_nodes,
                             node_buckets=node_buckets).warm_up()
                      for factory in factories.values())  # each drafter's own shapes too (heads, draft models)
        log(f"every step shape warmed up ({seconds:.1f} s)")
    explainer = DifferenceExplainer(args.model, args.explain_differences) if args.explain_differences else None
    logit_error = None
    if explainer is not None:  # the runtime's logit error on the first prompt: the scale of a near-tie
        logit_error = explainer.logit_error(target, next(iter(encoded.values()))[0])
        log(f"logit error against the float64 reference: {logit_error:.3g}")
    params = SamplingParams(max_new_tokens=args.new_tokens, stop_token_ids=stop)
    results: list[dict[str, Any]] = []
    profiles: dict[str, dict[str, Any]] = {}

    def save() -> dict[str, Any]:
        """The results so far, written to ``--out`` (after every run: a run cut short keeps the ones before)."""
        summary = {
            "model": os.path.abspath(args.model), "backend": args.backend, "dtype": str(dtype), "device": str(dev),
            "device_name": torch.cuda.get_device_name(dev) if cuda else "cpu",
            "workloads": {w: str(p) for w, p in workloads}, "batches": batches, "new_tokens": args.new_tokens,
            "max_nodes": args.max_nodes, "record_nodes": args.record_nodes, "stop_token_ids": list(stop),
            "logit_error": logit_error,
            "drafters": list(factories), "cost_profile": measured_cost, "results": results,
            "draft_seconds": cost.to_dict().get("draft_s", {}),  # each drafter's draft time as the runs measured it
            "acceptance_profiles": profiles, "notes": notes, "elapsed_s": time.perf_counter() - t_start,
        }
        with open(args.out + ".part", "w") as f:  # replaced whole: a reader never sees half a file
            json.dump(summary, f, indent=1, default=lambda x: None if isinstance(x, float) and math.isnan(x) else x)
        os.replace(args.out + ".part", args.out)
        return summary

    for wname, prompts_all in encoded.items():
        for B in batches:
            if time.perf_counter() - t_start > args.time_limit:
                notes.append(f"skipped {wname} B={B} (time limit)")
                continue
            prompts = [prompts_all[i % len(prompts_all)] for i in range(B)]
            if B > len(prompts_all):
                notes.append(f"{wname}: {len(prompts_all)} items, B={B} repeats them")

            def engine_for(mode: str, factory: Any = None) -> Any:
                return lambda: Engine(target, factory() if factory else None, mode=mode,
                                      budget="expected" if factory else "none", max_nodes=args.max_nodes,
                                      profile=cost, node_buckets=node_buckets, seed=args.seed)

            engine, out = _run(engine_for("autoregressive"), prompts, params, args.repeats, cuda)
            ar = {"workload": wname, "B": B, "label": "autoregressive", "mode": "autoregressive", "drafter": "-",
                  **_record(engine, out, None), "speedup_vs_ar": 1.0}
            ar_tokens = [r.tokens for r in out]
            results.append(ar)
            save()
            log(f"{wname} B={B:3d} autoregressive {ar['tokens_per_s']:9.1f} tok/s")
            for dname, factory in factories.items():
                for mode in ("chain", "tree"):
                    if time.perf_counter() - t_start > args.time_limit:
                        notes.append(f"skipped {wname} B={B} {mode} {dname} (time limit)")
                        continue
                    try:
                        engine, out = _run(engine_for(mode, factory), prompts, params, args.repeats, cuda)
                    except Exception as exc:  # keep going: report what failed
                        notes.append(f"{wname} B={B} {mode} {dname} failed: {exc!r}")
                        log(notes[-1])
                        continue
                    rec = {"workload": wname, "B": B, "label": f"{mode} {dname}", "mode": mode, "drafter": dname,
                           **_record(engine, out, ar_tokens)}
                    rec["speedup_vs_ar"] = rec["tokens_per_s"] / ar["tokens_per_s"] if ar["tokens_per_s"] else math.nan
                    if explainer is not None and rec["requests_differing"]:
                        rec["first_differences"] = explainer.explain(prompts, [r.tokens for r in out], ar_tokens,
                                                                     rec["requests_differing"])
                    results.append(rec)
                    save()
                    log(f"{wname} B={B:3d} {mode:5s} {dname:10s} {rec['tokens_per_s']:9.1f} tok/s "
                        f"x{rec['speedup_vs_ar']:.2f} accepted {rec['mean_accepted']:.2f} "
                        f"{'equal' if rec['equal_to_ar'] else 'DIFFERS'} {rec['budget_choices']}")
        # the acceptance profiles: an untimed tree run of each drafter over the workload's distinct prompts
        distinct = prompts_all[: min(len(prompts_all), num_slots)]
        ar_engine = Engine(target, None, mode="autoregressive", budget="none", profile=cost, seed=args.seed)
        reference = [r.tokens for r in ar_engine.generate(distinct, params)]
        for dname, factory in factories.items():
            if time.perf_counter() - t_start > args.time_limit:
                notes.append(f"skipped the {wname} {dname} acceptance profile (time limit)")
                continue
            try:
                profile, outputs = record_acceptance(target, factory(), distinct, args.new_tokens, args.record_nodes,
                                                     stop_token_ids=stop, seed=args.seed, workload=wname,
                                                     model=os.path.abspath(args.model))
            except Exception as exc:
                notes.append(f"{wname} {dname} acceptance profile failed: {exc!r}")
                log(notes[-1])
                continue
            entry = profile.to_dict()
            entry["meta"]["equal_to_ar"] = [r.tokens for r in outputs] == reference
            profiles.setdefault(wname, {})[dname] = entry
            if args.profile_dir:
                os.makedirs(args.profile_dir, exist_ok=True)
                with open(os.path.join(args.profile_dir, f"{wname}-{dname}.json"), "w") as f:
                    json.dump(entry, f, indent=1)
            save()
            log(f"{wname} {dname}: acceptance profile, depth-1 ranks {entry['acceptance'][0][:4]}")
    summary = save()
    table = markdown_table(summary)
    print(table)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(table + "\n")
    return 0


def markdown_table(summary: dict[str, Any]) -> str:
    """One row per run: workload, B, run, tokens/s, speed-up, accepted length, the budget's choices, equality."""
    lines = ["| workload | B | run | tok/s | x AR | accepted/step | budget's choices (steps per tree size) | "
             "draft ms/step | = AR |", "|" + "---|" * 9]
    for r in summary["results"]:
        choices = ", ".join(f"{k}: {v}" for k, v in r["budget_choices"].items())
        lines.append(f"| {r['workload']} | {r['B']} | {r['label']} | {r['tokens_per_s']:.1f} | "
                     f"{r.get('speedup_vs_ar', float('nan')):.2f} | {r['mean_accepted']:.2f} | {choices} | "
                     f"{r['draft_ms_per_spec_step']:.2f} | {'yes' if r['equal_to_ar'] else 'NO'} |")
    return "\n".join(lines)
