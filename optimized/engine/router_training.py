"""``lumotree train router``: record drafts from engine runs on the training workloads and fit the router's payoff
models (:mod:`~lumotree.optimized.engine.router`).

The workloads (code completion, agentic edit, multi-turn tool loop: :mod:`lumotree.workloads`) are built from the
corpus files the model was *trained* on, so the held-out workloads of the benchmarks stay unseen. Each prompt is
decoded greedily by the engine with the router in recording mode: every step both sources draft (``explore``), the
drafts' features are kept with their true payoffs (the walk of each tree along the target's tokens), and the fit is
ridge least squares per source. The models go to ``router.json`` beside the model unless ``out`` says otherwise.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from .router import FEATURES, RouterDrafter, fit_payoff_models, save_router

__all__ = ["record_drafts", "train_router", "model_drafter", "learned_drafter"]


def model_drafter(target: Any, model_dir: str | os.PathLike | None, eagle: str | os.PathLike | None) -> Any:
    """The router's model drafter: the EAGLE head in ``eagle`` (default ``model_dir/eagle`` when it exists), else the
    checkpoint's MTP head."""
    from .eagle import EagleDrafter
    from .mtp import MTPDrafter

    if eagle is None and model_dir is not None and (Path(model_dir) / "eagle" / "config.json").is_file():
        eagle = Path(model_dir) / "eagle"
    if eagle is not None:
        return EagleDrafter(target, eagle)
    return MTPDrafter(target)


def learned_drafter(name: str, target: Any, eagle: str | os.PathLike | None = None,
                    model_dir: str | os.PathLike | None = None, router: str | os.PathLike | None = None,
                    **options: Any) -> Any:
    """``make_drafter``'s ``"eagle"`` (needs ``eagle``, the head's folder) and ``"router"`` (its model drafter from
    ``eagle`` / ``model_dir``: :func:`model_drafter`; ``router``: a payoff-model file, default confidence sums)."""
    from .eagle import EagleDrafter
    from .router import load_router
    from .suffix import SuffixDrafter

    if name == "eagle":
        if eagle is None:
            raise ValueError("drafter 'eagle' needs eagle (the head's folder, lumotree train eagle)")
        return EagleDrafter(target, eagle, **options)
    return RouterDrafter(SuffixDrafter(), model_drafter(target, model_dir, eagle),
                         models=load_router(router) if router else None, **options)


def record_drafts(target: Any, model: Any, prompts: list[list[int]], max_new_tokens: int, max_nodes: int = 32
                  ) -> tuple[list, dict]:
    """Decode ``prompts`` greedily with a recording router over a fresh suffix cache and ``model``; returns the
    records ``(source, features, payoff)`` and the engine's summary."""
    from .engine import Engine
    from .sampling import SamplingParams
    from .suffix import SuffixDrafter

    router = RouterDrafter(SuffixDrafter(), model, online=False, record=True, explore=True)
    engine = Engine(target, router, mode="tree", budget="fixed", max_nodes=max_nodes)
    engine.generate(prompts, SamplingParams(max_new_tokens=max_new_tokens))
    return router.records, engine.stats.summary()


def _target(model_dir: str, device: str, num_slots: int, max_seq_len: int) -> Any:
    from .targets import OptimizedTarget, ReferenceTarget

    if device == "cpu":
        from lumotree.reference.model import load_pretrained

        return ReferenceTarget(load_pretrained(model_dir), num_slots, max_seq_len, 64)
    import torch

    from ..model import OptimizedModel, load_checkpoint

    config, weights, _ = load_checkpoint(model_dir, torch.device(device), None)
    model = OptimizedModel(config, weights, max_nodes=64, num_slots=num_slots, max_seq_len=max_seq_len,
                           device=torch.device(device), dtype=weights.embed.dtype)
    return OptimizedTarget(model)


def train_router(model_dir: str, eagle: str | None = None, out: str | None = None, device: str = "cuda",
                 per_workload: int = 8, max_new_tokens: int = 128, seed: int = 0, max_prompt_tokens: int = 768,
                 num_slots: int = 8) -> dict:
    """Record drafts on ``per_workload`` prompts of each training workload and fit the payoff models (module
    docstring); returns ``{"out", "records", "mae", "per_source", "summary"}``."""
    from lumotree.training.corpus import default_sources
    from lumotree.training.organism import RECIPE, prepare_corpus
    from lumotree.training.tokenizer import load_tokenizer
    from lumotree.workloads import WORKLOADS, build_workload

    tokenizer = load_tokenizer(model_dir)
    train_files, _, _ = prepare_corpus(default_sources(tuple(RECIPE["packages"])), RECIPE["heldout_fraction"])
    prompts = []
    for name in WORKLOADS:
        for item in build_workload(name, train_files, per_workload, seed):
            prompts.append(item.prompt_ids(tokenizer)[-max_prompt_tokens:])
    target = _target(model_dir, device, num_slots, max_prompt_tokens + max_new_tokens + 80)
    model = model_drafter(target, model_dir, eagle)
    records, summary = record_drafts(target, model, prompts, max_new_tokens)
    models, mae = fit_payoff_models(records)
    path = Path(out) if out else Path(model_dir) / "router.json"
    per_source = {s: sum(1 for r in records if r[0] == s) for s in mae}
    save_router(models, path, {"records": len(records), "mae": mae, "per_source": per_source,
                               "workloads": list(WORKLOADS), "per_workload": per_workload, "features": list(FEATURES),
                               "model_drafter": model.name, "max_new_tokens": max_new_tokens,
                               "backend": "reference" if device == "cpu" else "optimized"})
    return {"out": str(path), "records": len(records), "mae": mae, "per_source": per_source, "summary": summary}
