"""The organism: a small Qwen3.5-text hybrid trained from scratch on the machine's own Python sources, with its MTP
head trained jointly, and drafter heads trained for a frozen target.

:func:`train_organism` runs the whole recipe (:data:`ORGANISM_CONFIG`, :data:`ORGANISM_TRAINING`, :data:`RECIPE`):
collect the corpus (:mod:`~lumotree.training.corpus`), split it by path hash, train the byte-level BPE tokenizer on
training files only, build and tokenize the training documents (files, agentic edits, tool loops:
:mod:`~lumotree.training.data`), train (:mod:`~lumotree.training.trainer`), evaluate on the held-out files, and write
the HF checkpoint (``config.json``, ``model.safetensors`` in bfloat16), the tokenizer, ``recipe.json`` (corpus digest,
sources, step count, timings, held-out numbers), ``training_log.json``, ``loss_curve.png`` (when matplotlib is
installed) and the model card ``README.md``. :func:`train_mtp` trains a fresh MTP head for a frozen target.

Size: the issue asks for 30-60 M parameters and at most 48 MB in the repository; bfloat16 weights of 48 MB hold about
24 M parameters, so the organism is the largest 3:1 hybrid that fits (about 23 M parameters, the embedding tied to the
head as the family's small models do); the card states it.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import IO

import torch

from ..reference.config import HybridConfig
from .corpus import PINNED_PACKAGES, CorpusFile, Source, collect, corpus_digest, default_sources, split
from .data import documents, encode
from .gdn import fla_unusable
from .model import HybridLM, load_checkpoint, parameter_count, save_checkpoint
from .tokenizer import load_tokenizer, save_tokenizer, train_tokenizer
from .trainer import TrainConfig, train

__all__ = ["ORGANISM_CONFIG", "ORGANISM_TRAINING", "RECIPE", "train_organism", "train_mtp", "prepare_corpus",
           "write_model_card", "plot_loss_curve"]

_LAYERS = tuple("full_attention" if (i + 1) % 4 == 0 else "linear_attention" for i in range(12))
#: the organism's architecture: 12 layers (GDN : gated attention 3:1), dense MLPs, one MTP layer, tied head
ORGANISM_CONFIG = HybridConfig(
    model_type="qwen3_5_text", vocab_size=8192, hidden_size=384, intermediate_size=704, num_hidden_layers=12,
    layer_types=_LAYERS, num_attention_heads=6, num_key_value_heads=2, head_dim=64, partial_rotary_factor=0.25,
    rope_theta=10000.0, linear_num_key_heads=6, linear_num_value_heads=6, linear_key_head_dim=64,
    linear_value_head_dim=64, linear_conv_kernel_dim=4, num_experts=0, mtp_num_hidden_layers=1,
    tie_word_embeddings=True, rms_norm_eps=1e-6)
#: the optimisation (the step count is measured against ``seconds`` unless ``steps`` is given)
ORGANISM_TRAINING = TrainConfig(seq_len=1024, batch_size=64, lr=2e-3, min_lr_ratio=0.1, warmup_steps=200,
                                weight_decay=0.1, grad_clip=1.0, mtp_weight=0.3, seconds=300.0, calibration_steps=30,
                                log_every=10, checkpoint_every=500, eval_tokens=1 << 20, seed=0)
#: corpus and data: held-out share, tokenizer size and sample, the share of Python files that also yield an edit
#: example / a tool conversation; items per workload built from held-out files
RECIPE = dict(heldout_fraction=0.03, tokenizer_chars=30_000_000, edit_share=0.3, tool_share=0.1, snippet_chars=1500,
              workload_items=64, packages=PINNED_PACKAGES)


def prepare_corpus(sources: list[Source], heldout_fraction: float) -> tuple[list[CorpusFile], list[CorpusFile], dict]:
    """(train files, held-out files, the corpus record: digest, per-source file counts and bytes)."""
    files = collect(sources)
    if not files:
        raise ValueError("the corpus sources hold no readable file")
    train_files, heldout_files = split(files, heldout_fraction)
    if not train_files or not heldout_files:
        raise ValueError(f"the split of {len(files)} files left {len(train_files)} for training and "
                         f"{len(heldout_files)} held out; add files or change heldout_fraction")
    per_source: dict[str, dict[str, int]] = {}
    for f in files:
        entry = per_source.setdefault(f.name.split("/")[0] if not f.name.startswith("doc/") else
                                      "/".join(f.name.split("/")[:2]), {"files": 0, "bytes": 0})
        entry["files"] += 1
        entry["bytes"] += len(f.text.encode("utf-8"))
    record = {"digest": corpus_digest(files), "train_digest": corpus_digest(train_files),
              "heldout_digest": corpus_digest(heldout_files), "files": len(files), "train_files": len(train_files),
              "heldout_files": len(heldout_files), "heldout_fraction": heldout_fraction,
              "sources": [dict(name=s.name, root=s.root, suffixes=list(s.suffixes), **per_source.get(s.name, {}))
                          for s in sources]}
    return train_files, heldout_files, record


def _tokenizer_sample(files: list[CorpusFile], max_chars: int) -> list[str]:
    """Training files in the order of their names' hashes (a mix of every source) up to ``max_chars``."""
    order = sorted(files, key=lambda f: hashlib.sha256(f.name.encode()).digest())
    out, size = [], 0
    for f in order:
        if size >= max_chars:
            break
        out.append(f.text)
        size += len(f.text)
    return out


def _log(progress: IO[str] | None, text: str) -> None:
    if progress is not None:
        progress.write(text + "\n")
        progress.flush()


def train_organism(out_dir: str | Path, device: str = "cuda", seconds: float | None = None, steps: int | None = None,
                   seed: int = 0, checkpoint_dir: str | Path | None = None, resume: bool = False,
                   sources: list[Source] | None = None, config: HybridConfig = ORGANISM_CONFIG,
                   training: TrainConfig = ORGANISM_TRAINING, recipe: dict | None = None,
                   progress: IO[str] | None = sys.stderr) -> dict:
    """Run the organism recipe (module docstring) and write the model into ``out_dir``; returns ``recipe.json``'s
    dict. ``seconds``: the budget of corpus, tokenizer, encoding and training together (the training loop gets what
    is left and measures its step count against it); without it the loop gets ``training.seconds``. ``steps``: an exact
    step count instead (reproducible)."""
    recipe = {**RECIPE, **(recipe or {})}
    if seconds is not None and not seconds > 0:
        raise ValueError(f"seconds = {seconds!r} must be positive")
    if steps is not None:
        training = replace(training, seconds=None, steps=steps)
    training = replace(training, seed=seed)
    timings: dict[str, float] = {}
    t0 = time.perf_counter()
    sources = default_sources(tuple(recipe["packages"])) if sources is None else sources
    train_files, heldout_files, corpus = prepare_corpus(sources, recipe["heldout_fraction"])
    timings["corpus_s"] = time.perf_counter() - t0
    _log(progress, f"corpus: {corpus['train_files']} training files, {corpus['heldout_files']} held out, digest "
                   f"{corpus['digest'][:16]}")
    t = time.perf_counter()
    tokenizer = train_tokenizer(_tokenizer_sample(train_files, recipe["tokenizer_chars"]), config.vocab_size)
    if tokenizer.get_vocab_size() != config.vocab_size:
        raise ValueError(f"the corpus is too small for vocab_size = {config.vocab_size} (the tokenizer learned "
                         f"{tokenizer.get_vocab_size()} entries)")
    timings["tokenizer_s"] = time.perf_counter() - t
    t = time.perf_counter()
    docs = documents(train_files, seed, recipe["edit_share"], recipe["tool_share"], recipe["snippet_chars"])
    stream = encode(tokenizer, docs)
    heldout = encode(tokenizer, documents(heldout_files, seed))
    timings["encode_s"] = time.perf_counter() - t
    _log(progress, f"tokens: {len(stream):,} training, {len(heldout):,} held out ({timings['encode_s']:.0f} s)")
    cuda = str(device).startswith("cuda")
    reason = fla_unusable() if cuda else None
    kernel = ("fla" if reason is None else f"chunk (torch; {reason})") if cuda else "torch recurrence"
    _log(progress, f"GDN kernel: {kernel}")
    if steps is None and (seconds is not None or training.steps is None):  # the loop gets what the budget left
        budget = seconds if seconds is not None else training.seconds + time.perf_counter() - t0
        timings["budget_s"] = budget
        left = budget - (time.perf_counter() - t0)
        if left < 30:
            raise ValueError(f"seconds = {budget}: only {left:.0f} s are left for training after the corpus, the "
                             "tokenizer and the encoding; give more")
        training = replace(training, seconds=left, steps=None)
    torch.manual_seed(seed)
    model = HybridLM(config)
    model.initialize(seed)
    history = train(model, stream, heldout, training, device, checkpoint_dir, resume, progress)
    timings["train_s"] = history["train_seconds"]
    timings["total_s"] = time.perf_counter() - t0
    out = Path(out_dir)
    save_checkpoint(model, out, extra_config={"bos_token_id": None, "eos_token_id": 0, "pad_token_id": 0})
    save_tokenizer(tokenizer, out, model_max_length=training.seq_len)
    record = {
        "model": {"parameters": parameter_count(model), "config": config.to_dict()},
        "training": {**asdict(training), "steps": history["total"], "tokens": history["tokens"],
                     "device": torch.cuda.get_device_name() if cuda else str(device), "gdn_kernel": kernel,
                     "seed": seed},
        "corpus": corpus, "data": {k: v for k, v in recipe.items() if k != "packages"} | {
            "packages": list(recipe["packages"]), "train_tokens": int(len(stream)), "heldout_tokens": int(len(heldout))},
        "heldout": history.get("eval"), "timings": timings,
        "versions": {"torch": torch.__version__, "python": sys.version.split()[0]},
    }
    (out / "recipe.json").write_text(json.dumps(record, indent=2) + "\n")
    (out / "training_log.json").write_text(json.dumps({"columns": ["step", "loss", "mtp_loss", "lr", "seconds"],
                                                       "rows": history["steps"]}) + "\n")
    from ..workloads import write_workloads

    record["workloads"] = {"items_each": recipe["workload_items"], "seed": seed,
                           "sha256": write_workloads(out / "workloads", heldout_files, recipe["workload_items"], seed)}
    (out / "recipe.json").write_text(json.dumps(record, indent=2) + "\n")
    plot = plot_loss_curve(history["steps"], out / "loss_curve.png")
    write_model_card(out, record, plot)
    return record


def plot_loss_curve(rows: list, path: str | Path) -> bool:
    """Plot ``training_log.json``'s rows (both heads' training loss per step) to ``path``; False without
    matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    if not rows:
        return False
    steps = [r[0] for r in rows]
    fig, ax = plt.subplots(figsize=(6, 3.5), dpi=100)
    ax.plot(steps, [r[1] for r in rows], label="next token")
    if rows[0][2] is not None:
        ax.plot(steps, [r[2] for r in rows], label="MTP (token after next)")
    ax.set_xlabel("step")
    ax.set_ylabel("training loss (nats)")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return True


def write_model_card(out: Path, record: dict, plot: bool) -> None:
    """The model card ``README.md`` from ``recipe.json``'s dict."""
    m, tr, corpus, ev = record["model"], record["training"], record["corpus"], record["heldout"] or {}
    c = m["config"]
    sources = "\n".join(f"| `{s['name']}` | {s.get('files', 0)} | {s.get('bytes', 0) / 1e6:.1f} MB |"
                        for s in corpus["sources"])
    mtp = (f"| MTP head loss (token after next) | {ev['mtp_loss']:.3f} |\n| MTP head top-1 accuracy | "
           f"{ev['mtp_accuracy']:.3f} |\n") if "mtp_loss" in ev else ""
    held = (f"| held-out loss (nats / token) | {ev['loss']:.3f} |\n| held-out perplexity | {ev['perplexity']:.2f} |\n"
            f"| held-out top-1 accuracy | {ev['accuracy']:.3f} |\n{mtp}| held-out tokens | {ev['tokens']:,} |"
            if ev else "| held-out | not evaluated |")
    curve = "![training loss](loss_curve.png)" if plot else "The loss curve is in `training_log.json`."
    text = f"""# lumotree organism

A small Qwen3.5-text hybrid (`model_type: qwen3_5_text`: Gated DeltaNet and gated attention 3:1, dense SwiGLU MLPs)
with its multi-token-prediction head (`mtp.*`) trained jointly, from scratch, on Python sources and documentation
that the training machine held. It loads in transformers (`AutoModelForCausalLM`, `AutoTokenizer`) and in lumotree
(`lumotree generate --model DIR`). Written by `lumotree train organism`.

| | |
|---|---|
| parameters | {m['parameters']:,} (embedding tied to the head; MTP layer included) |
| layers | {c['num_hidden_layers']} ({c['layer_types'].count('linear_attention')} GDN, \
{c['layer_types'].count('full_attention')} gated attention), hidden {c['hidden_size']}, MLP {c['intermediate_size']} |
| vocabulary | {c['vocab_size']} (byte-level BPE) |
| training | {tr['steps']} steps of {tr['batch_size']} x {tr['seq_len']} tokens ({tr['tokens']:,} tokens), \
{record['timings']['train_s']:.0f} s on {tr['device']}, seed {tr['seed']} |
| corpus digest | `{corpus['digest']}` |

## Held-out results

Files held out by the hash of their path (never trained on): {corpus['heldout_files']} of {corpus['files']}.

| metric | value |
|---|---|
{held}

{curve}

## Corpus

| source | files | size |
|---|---|---|
{sources}

Size: 30-60 M parameters were asked for together with at most 48 MB in the repository. bfloat16 weights of 48 MB
hold about 24 M parameters, so this model is the largest 3:1 hybrid of the recipe that fits the size limit.
Reproduce with `lumotree train organism --steps {tr['steps']} --seed {tr['seed']}` (`recipe.json` holds the rest).
"""
    (out / "README.md").write_text(text)


def train_mtp(model_dir: str | Path, out_dir: str | Path, device: str = "cuda", seconds: float | None = None,
              steps: int | None = None, seed: int = 0, sources: list[Source] | None = None,
              training: TrainConfig = ORGANISM_TRAINING, recipe: dict | None = None,
              progress: IO[str] | None = sys.stderr) -> dict:
    """Train a fresh MTP head (seeded initialisation) for the frozen model in ``model_dir`` on the recipe's corpus,
    encoded with the model's tokenizer; write the model with the new head, its tokenizer and ``mtp_recipe.json``
    into ``out_dir`` and return the record."""
    recipe = {**RECIPE, **(recipe or {})}
    if seconds is None and steps is None:
        raise ValueError("give seconds or steps")
    training = replace(training, seconds=None if steps is not None else seconds, steps=steps, seed=seed,
                       trainable="mtp")
    model = load_checkpoint(model_dir)
    if model.mtp is None:
        raise ValueError(f"model_dir = {str(model_dir)!r}: config.mtp_num_hidden_layers = 0 (no MTP head to train)")
    fresh = HybridLM(model.config, backend="torch")
    fresh.initialize(seed)
    model.mtp.load_state_dict(fresh.mtp.state_dict())
    tokenizer = load_tokenizer(model_dir)
    sources = default_sources(tuple(recipe["packages"])) if sources is None else sources
    train_files, heldout_files, corpus = prepare_corpus(sources, recipe["heldout_fraction"])
    stream = encode(tokenizer, documents(train_files, seed, recipe["edit_share"], recipe["tool_share"],
                                         recipe["snippet_chars"]))
    heldout = encode(tokenizer, documents(heldout_files, seed))
    history = train(model, stream, heldout, training, device, None, False, progress)
    out = Path(out_dir)
    save_checkpoint(model, out, extra_config={"bos_token_id": None, "eos_token_id": 0, "pad_token_id": 0})
    for name in ("tokenizer.json", "tokenizer_config.json"):
        if (Path(model_dir) / name).is_file() and Path(model_dir).resolve() != out.resolve():
            shutil.copy(Path(model_dir) / name, out / name)
    record = {"target": str(model_dir), "steps": history["total"], "tokens": history["tokens"],
              "corpus_digest": corpus["digest"], "heldout": history.get("eval"), "seed": seed,
              "train_s": history["train_seconds"]}
    (out / "mtp_recipe.json").write_text(json.dumps(record, indent=2) + "\n")
    return record

