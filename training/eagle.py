r"""Training the EAGLE-style draft head (:mod:`lumotree.reference.eagle`) on a frozen target's own outputs.

The target runs teacher-forced on the corpus windows ``t_0 .. t_{T-1}`` (no gradient); its final-normed hidden
states ``h_i`` and next-token distributions ``p_i = softmax(h_i W^T)`` are the teacher. The head reads ``(h_i,
t_{i+1})`` at position i and outputs ``f_i`` with logits ``f_i W^T``; EAGLE's loss::

    L = mean_i SmoothL1(f_i, h_{i+1})  +  w_token * mean_i CE(p_{i+1}, softmax(f_i W^T))

(feature regression plus cross-entropy against the target's distribution, not the corpus token: the head learns what
the target would say). Following EAGLE, the input features get uniform noise ``U(-noise, noise)`` during training so
the head tolerates its own (imperfect) features when it drafts several levels. The head's final norm is a copy of the
target's, frozen; the embedding and LM head are the target's, frozen.

After training, on held-out windows: the loss, the *top-1 agreement* (how often the head's argmax equals the target's
argmax for the token after next: the acceptance of a first greedy draft token), and the confidence calibration
(:func:`~lumotree.reference.eagle.calibrate`: head probability of its argmax -> agreement rate), saved into the head's
``config.json``.
"""

from __future__ import annotations

import json
import math
import sys
import time
from pathlib import Path
from typing import IO

import numpy as np
import torch
import torch.nn.functional as F

from ..reference.eagle import EAGLE_FORMAT, calibrate
from .data import batch as batch_at
from .data import eval_windows
from .model import HybridLM, MTPHead, load_checkpoint

__all__ = ["EagleTraining", "new_eagle_head", "eagle_outputs", "eagle_losses", "train_eagle_head", "save_eagle",
           "train_eagle"]


class EagleTraining:
    """Hyper-parameters: ``steps`` (or ``seconds``: the step count measured after 5 steps), ``batch_size``,
    ``seq_len``, ``lr`` (AdamW, warm-up then cosine to 10 %), ``token_weight`` (w_token), ``noise``."""

    def __init__(self, steps: int | None = None, seconds: float | None = None, batch_size: int = 16,
                 seq_len: int = 256, lr: float = 1e-3, token_weight: float = 0.1, noise: float = 0.05,
                 warmup_steps: int = 20, seed: int = 0, eval_tokens: int = 1 << 16):
        if (steps is None) == (seconds is None):
            raise ValueError("give exactly one of steps and seconds")
        if steps is not None and (isinstance(steps, bool) or not isinstance(steps, int) or steps < 1):
            raise ValueError(f"steps = {steps!r} must be a positive integer")
        if seconds is not None and not seconds > 0:
            raise ValueError(f"seconds = {seconds!r} must be positive")
        for name, value in (("batch_size", batch_size), ("seq_len", seq_len), ("warmup_steps", warmup_steps),
                            ("eval_tokens", eval_tokens)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} = {value!r} must be a positive integer")
        if seq_len < 3:
            raise ValueError(f"seq_len = {seq_len} must be >= 3")
        if not (lr > 0 and token_weight >= 0 and noise >= 0):
            raise ValueError("lr > 0, token_weight >= 0 and noise >= 0 are required")
        self.steps, self.seconds, self.batch_size, self.seq_len = steps, seconds, batch_size, seq_len
        self.lr, self.token_weight, self.noise, self.warmup_steps = lr, token_weight, noise, warmup_steps
        self.seed, self.eval_tokens = seed, eval_tokens

    def as_dict(self) -> dict:
        return dict(self.__dict__)


def new_eagle_head(target: HybridLM, seed: int = 0, std: float = 0.02) -> MTPHead:
    """A fresh head for ``target`` (seeded ``N(0, std)`` matrices, zero-centred norms at identity, the final norm a
    frozen copy of the target's), on the target's device and dtype."""
    c = target.config
    if "full_attention" not in c.layer_types:
        raise ValueError("the target has no attention layer: the EAGLE head takes its attention shapes")
    head = MTPHead(c.replace(mtp_num_hidden_layers=1), backend="torch")
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in head.named_parameters():
            if p.ndim == 1:
                p.zero_()
            else:
                scale = 1.0 / math.sqrt(2) if name.endswith(("o_proj.weight", "down_proj.weight")) else 1.0
                p.copy_(torch.randn(p.shape, generator=gen) * std * scale)
        head.norm.weight.copy_(target.model.norm.weight)
    head.norm.weight.requires_grad_(False)
    return head.to(device=target.model.norm.weight.device, dtype=target.model.norm.weight.dtype)


def eagle_outputs(target: HybridLM, head: MTPHead, hidden: torch.Tensor, next_tokens: torch.Tensor) -> torch.Tensor:
    """The head's features ``f: [B, T, D]`` from the target's ``hidden: [B, T, D]`` and ``next_tokens: [B, T]``
    (position i reads ``(hidden[:, i], next_tokens[:, i])``)."""
    e = head.pre_fc_norm_embedding(target.model.embed_tokens(next_tokens))
    x = head.fc(torch.cat((e, head.pre_fc_norm_hidden(hidden)), dim=-1))  # [B, T, D]
    cos, sin = target.rotary(x.shape[1], x.device)
    for layer in head.layers:
        x = layer(x, cos, sin)
    return head.norm(x)


def eagle_losses(target: HybridLM, head: MTPHead, tokens: torch.Tensor, token_weight: float, noise: float = 0.0,
                 generator: torch.Generator | None = None) -> dict[str, torch.Tensor]:
    """EAGLE's loss on ``tokens: [B, T]`` (module docstring): ``{"loss", "feature", "token", "agreement"}``
    (agreement: share of positions where the head's argmax is the target's)."""
    if tokens.ndim != 2 or tokens.shape[1] < 3:
        raise ValueError(f"tokens has shape {list(tokens.shape)}; expected [B, T] with T >= 3")
    with torch.no_grad():
        hidden = target.hidden(tokens)  # [B, T, D]
        teacher = target.logits(hidden[:, 1:-1]).float()  # [B, T - 2, V] over t_{i+2}
    inputs = hidden[:, :-2]
    if noise > 0:
        inputs = inputs + (torch.rand(inputs.shape, generator=generator).to(inputs) * 2 - 1) * noise
    f = eagle_outputs(target, head, inputs, tokens[:, 1:-1])  # [B, T - 2, D]
    logits = target.logits(f).float()  # [B, T - 2, V]
    feature = F.smooth_l1_loss(f.float(), hidden[:, 1:-1].float())
    token = -(teacher.softmax(-1) * logits.log_softmax(-1)).sum(-1).mean()
    agreement = (logits.argmax(-1) == teacher.argmax(-1)).float().mean()
    return {"loss": feature + token_weight * token, "feature": feature, "token": token, "agreement": agreement}


@torch.no_grad()
def _heldout(target: HybridLM, head: MTPHead, windows: np.ndarray, cfg: EagleTraining, device) -> dict:
    """Held-out loss, agreement and the calibration of the head's top-1 probability."""
    totals = {"loss": 0.0, "feature": 0.0, "token": 0.0, "agreement": 0.0}
    probs, hits = [], []
    for start in range(0, len(windows), cfg.batch_size):
        tokens = torch.from_numpy(windows[start:start + cfg.batch_size]).long().to(device)
        out = eagle_losses(target, head, tokens, cfg.token_weight)
        for k in totals:
            totals[k] += float(out[k]) * tokens.shape[0]
        hidden = target.hidden(tokens)
        f = eagle_outputs(target, head, hidden[:, :-2], tokens[:, 1:-1])
        p = target.logits(f).float().softmax(-1)  # [B, T - 2, V]
        top = p.max(-1)
        probs.append(top.values.reshape(-1).cpu().numpy())
        hits.append((top.indices == target.logits(hidden[:, 1:-1]).argmax(-1)).reshape(-1).cpu().numpy())
    n = max(len(windows), 1)
    result = {k: v / n for k, v in totals.items()}
    result["windows"] = int(len(windows))
    result["calibration"] = calibrate(np.concatenate(probs), np.concatenate(hits))
    return result


def train_eagle_head(target: HybridLM, stream: np.ndarray, heldout: np.ndarray | None, cfg: EagleTraining,
                     device: str | torch.device = "cpu", progress: IO[str] | None = sys.stderr
                     ) -> tuple[MTPHead, dict]:
    """Train a fresh head for the frozen ``target`` on the token ``stream`` (windows of ``cfg.seq_len`` at seeded
    offsets); returns ``(head, record)`` with the loss history, the held-out metrics before and after training and
    the calibration (from ``heldout``, else from the training stream's first windows)."""
    device = torch.device(device)
    target = target.to(device).eval()
    for p in target.parameters():
        p.requires_grad_(False)
    stream = np.asarray(stream)
    if stream.ndim != 1 or len(stream) < cfg.seq_len + 2:
        raise ValueError(f"stream has {len(stream)} tokens: at least seq_len + 2 = {cfg.seq_len + 2} are needed")
    head = new_eagle_head(target, cfg.seed)
    params = [p for p in head.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=cfg.lr, betas=(0.9, 0.95), weight_decay=0.0)
    windows = eval_windows(heldout if heldout is not None and len(heldout) > cfg.seq_len + 1 else stream, cfg.seq_len,
                           cfg.eval_tokens)
    before = _heldout(target, head, windows, cfg, device)
    generator = torch.Generator().manual_seed(cfg.seed)
    total, history, start, step = cfg.steps, [], time.perf_counter(), 0
    while total is None or step < total:
        if total is None and step == 5:
            per_step = (time.perf_counter() - start) / 5
            total = max(6, int(cfg.seconds / per_step))
        horizon = total or 10 ** 9
        warm = min(cfg.warmup_steps, max(1, horizon // 10))
        progress_frac = max(0.0, (step - warm) / max(1, horizon - warm))
        lr = cfg.lr * ((step + 1) / warm if step < warm else 0.1 + 0.9 * (1 + math.cos(math.pi * progress_frac)) / 2)
        for group in optimizer.param_groups:
            group["lr"] = lr
        tokens = torch.from_numpy(batch_at(stream, cfg.seed, step, cfg.batch_size, cfg.seq_len)).long().to(device)
        out = eagle_losses(target, head, tokens, cfg.token_weight, cfg.noise, generator)
        optimizer.zero_grad(set_to_none=True)
        out["loss"].backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        history.append([step, float(out["loss"].detach()), float(out["agreement"])])
        if progress is not None and (step % 10 == 0 or step == (total or 0) - 1):
            progress.write(f"\reagle step {step + 1}/{total or '?'} loss {history[-1][1]:.4f} agreement "
                           f"{float(out['agreement']):.3f}")
            progress.flush()
        step += 1
    if progress is not None:
        progress.write("\n")
    after = _heldout(target, head, windows, cfg, device)
    record = {"steps": step, "train_s": time.perf_counter() - start, "history": history,
              "heldout_before": {k: v for k, v in before.items() if k != "calibration"},
              "heldout": {k: v for k, v in after.items() if k != "calibration"},
              "calibration": after["calibration"], "training": cfg.as_dict()}
    return head, record


def save_eagle(head: MTPHead, target: HybridLM, out_dir: str | Path, record: dict | None = None) -> Path:
    """Write the head (``model.safetensors``, float32, ``eagle.*`` names) and ``config.json`` into ``out_dir``."""
    from safetensors.torch import save_file

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tensors = {f"eagle.{name}": p.detach().to("cpu", torch.float32).contiguous()
               for name, p in head.state_dict().items()}
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    c = target.config
    record = record or {}
    config = {"format": EAGLE_FORMAT, "hidden_size": c.hidden_size, "intermediate_size": c.intermediate_size,
              "vocab_size": c.vocab_size, "num_layers": 1, "calibration": record.get("calibration"),
              "heldout": record.get("heldout"), "heldout_before": record.get("heldout_before"),
              "steps": record.get("steps"), "training": record.get("training")}
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    if record.get("history"):
        (out / "training_log.json").write_text(json.dumps({"rows": record["history"]}) + "\n")
    return out


def train_eagle(model_dir: str | Path, out_dir: str | Path | None = None, *, stream: np.ndarray | None = None,
                heldout: np.ndarray | None = None, cfg: EagleTraining | None = None, device: str = "cuda",
                recipe: dict | None = None, progress: IO[str] | None = sys.stderr) -> dict:
    """Train an EAGLE head for the frozen checkpoint in ``model_dir`` and save it into ``out_dir`` (default
    ``model_dir/eagle``). Without ``stream``, the training data is the organism recipe's corpus encoded with the
    model's tokenizer (held-out files for the metrics). Returns the training record."""
    from .organism import RECIPE

    cfg = cfg or EagleTraining(seconds=300.0)
    target = load_checkpoint(model_dir)
    if stream is None:
        from .corpus import default_sources
        from .data import documents, encode
        from .organism import prepare_corpus
        from .tokenizer import load_tokenizer

        recipe = {**RECIPE, **(recipe or {})}
        tokenizer = load_tokenizer(model_dir)
        train_files, heldout_files, _ = prepare_corpus(default_sources(tuple(recipe["packages"])),
                                                       recipe["heldout_fraction"])
        stream = encode(tokenizer, documents(train_files, cfg.seed, recipe["edit_share"], recipe["tool_share"],
                                             recipe["snippet_chars"]))
        heldout = encode(tokenizer, documents(heldout_files, cfg.seed))
    head, record = train_eagle_head(target, stream, heldout, cfg, device, progress)
    out = Path(out_dir) if out_dir is not None else Path(model_dir) / "eagle"
    save_eagle(head, target, out, record)
    record["out"] = str(out)
    return record
