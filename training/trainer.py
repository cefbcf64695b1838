r"""The training loop: AdamW, linear warm-up then cosine decay, bf16 autocast on CUDA, checkpoints and resume, a
progress line with the loss and tokens/s.

Loss: ``L = CE(next token) + mtp_weight * CE_mtp(token after next)`` (``trainable="all"``: the MTP head trained
jointly with the model, as the family's released models train theirs), or ``CE_mtp`` alone with every other
parameter frozen (``trainable="mtp"``: a drafter head for a frozen target).

Learning rate at step ``s`` (0-based) of ``N``: ``lr (s + 1) / W`` for ``s < W``, then
``lr (r + (1 - r) (1 + cos(pi p)) / 2)`` with ``p = (s - W) / max(1, N - W)`` and ``r = min_lr_ratio``. The step count
``N`` is ``steps`` when given; otherwise it is measured: after ``calibration_steps`` warm-up steps (whose learning
rates do not depend on ``N``) the mean step time sets ``N`` so the run ends within ``seconds``. The chosen ``N`` is
recorded; passing it back as ``steps`` reproduces the run (the batches are a function of the seed and the step:
:func:`~lumotree.training.data.batch`). AdamW without weight decay on vectors (norms, gates' biases).
"""

from __future__ import annotations

import math
import os
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO

import numpy as np
import torch

from .data import batch, eval_windows
from .model import HybridLM

__all__ = ["TrainConfig", "lr_at", "train", "evaluate", "CHECKPOINT_FILE"]

CHECKPOINT_FILE = "checkpoint.pt"


@dataclass(frozen=True)
class TrainConfig:
    """Hyper-parameters of a run (module docstring)."""

    seq_len: int = 1024
    batch_size: int = 32
    lr: float = 3e-3
    min_lr_ratio: float = 0.1
    warmup_steps: int = 100
    weight_decay: float = 0.1
    betas: tuple[float, float] = (0.9, 0.95)
    grad_clip: float = 1.0
    mtp_weight: float = 0.3
    steps: int | None = None
    seconds: float | None = None
    calibration_steps: int = 30
    max_steps: int = 1_000_000
    log_every: int = 10
    checkpoint_every: int = 500
    eval_tokens: int = 1 << 20
    seed: int = 0
    trainable: str = "all"
    extra: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name in ("seq_len", "batch_size", "warmup_steps", "calibration_steps", "max_steps", "log_every",
                     "checkpoint_every", "eval_tokens"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} = {value!r} must be a positive integer")
        if (self.steps is None) == (self.seconds is None):
            raise ValueError("give exactly one of steps and seconds")
        if self.steps is not None and (not isinstance(self.steps, int) or self.steps < 1):
            raise ValueError(f"steps = {self.steps!r} must be a positive integer")
        if self.seconds is not None and not self.seconds > 0:
            raise ValueError(f"seconds = {self.seconds!r} must be positive")
        if self.calibration_steps > self.warmup_steps:
            raise ValueError(f"calibration_steps = {self.calibration_steps} must not exceed warmup_steps = "
                             f"{self.warmup_steps} (the step count is chosen during warm-up)")
        if not (self.lr > 0 and 0 <= self.min_lr_ratio <= 1 and self.grad_clip > 0 and self.mtp_weight >= 0):
            raise ValueError("lr > 0, 0 <= min_lr_ratio <= 1, grad_clip > 0 and mtp_weight >= 0 are required")
        if self.trainable not in ("all", "mtp"):
            raise ValueError(f"trainable = {self.trainable!r} is not one of 'all', 'mtp'")


def lr_at(step: int, total: int | None, cfg: TrainConfig) -> float:
    """The learning rate of 0-based ``step`` of ``total`` (module docstring; ``total`` unknown only in warm-up)."""
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    if total is None:
        raise ValueError("the step count must be known after warm-up")
    p = min(1.0, (step - cfg.warmup_steps) / max(1, total - cfg.warmup_steps))
    return cfg.lr * (cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * p)))


def _autocast(device: torch.device):
    if device.type == "cuda":
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return torch.autocast("cpu", enabled=False)


def _optimizer(model: HybridLM, cfg: TrainConfig, device: torch.device) -> torch.optim.Optimizer:
    params = [p for p in model.parameters() if p.requires_grad]
    decay = [p for p in params if p.ndim >= 2]
    plain = [p for p in params if p.ndim < 2]
    groups = [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": plain, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=cfg.betas, fused=device.type == "cuda")


@torch.no_grad()
def evaluate(model: HybridLM, stream: np.ndarray, cfg: TrainConfig, device: torch.device) -> dict[str, float]:
    """Mean held-out next-token loss (nats), its perplexity and top-1 accuracy, and the MTP head's loss and top-1
    accuracy on the token after next, over the first ``cfg.eval_tokens`` tokens of ``stream``."""
    was_training = model.training
    model.eval()
    windows = eval_windows(stream, cfg.seq_len, cfg.eval_tokens)
    sums = dict(loss=0.0, correct=0.0, n=0, mtp_loss=0.0, mtp_correct=0.0, mtp_n=0)
    ce = torch.nn.functional.cross_entropy
    for i in range(0, len(windows), cfg.batch_size):
        tokens = torch.from_numpy(windows[i: i + cfg.batch_size]).to(device)
        with _autocast(device):
            hidden = model.hidden(tokens)
            logits = model.logits(hidden[:, :-1]).float()
            target = tokens[:, 1:]
            sums["loss"] += ce(logits.flatten(0, 1), target.flatten(), reduction="sum").item()
            sums["correct"] += (logits.argmax(-1) == target).sum().item()
            sums["n"] += target.numel()
            if model.mtp is not None:
                m = model.logits(model.mtp_hidden(hidden[:, :-2], tokens[:, 1:-1])).float()
                target = tokens[:, 2:]
                sums["mtp_loss"] += ce(m.flatten(0, 1), target.flatten(), reduction="sum").item()
                sums["mtp_correct"] += (m.argmax(-1) == target).sum().item()
                sums["mtp_n"] += target.numel()
    model.train(was_training)
    out = {"loss": sums["loss"] / sums["n"], "accuracy": sums["correct"] / sums["n"], "tokens": sums["n"]}
    out["perplexity"] = math.exp(out["loss"])
    if sums["mtp_n"]:
        out["mtp_loss"] = sums["mtp_loss"] / sums["mtp_n"]
        out["mtp_accuracy"] = sums["mtp_correct"] / sums["mtp_n"]
    return out


def _save(path: Path, model: HybridLM, optimizer, step: int, total: int | None, history: dict) -> None:
    tmp = path.with_suffix(".tmp")
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": step, "total": total,
                "history": history}, tmp)
    os.replace(tmp, path)


def _progress(out: IO[str] | None, step: int, total: int | None, loss: float, mtp: float | None, lr: float,
              tokens_per_s: float, left_s: float | None, end: bool = False) -> None:
    if out is None:
        return
    width = 24
    done = int(width * step / total) if total else 0
    bar = "#" * done + "-" * (width - done)
    mtp_text = f" mtp {mtp:.3f}" if mtp is not None else ""
    left = f" {int(left_s) // 60}:{int(left_s) % 60:02d} left" if left_s is not None else ""
    out.write(f"\r[{bar}] {step}/{total or '?'} loss {loss:.3f}{mtp_text} lr {lr:.2e} "
              f"{tokens_per_s / 1e3:.0f}k tok/s{left}" + ("\n" if end else ""))
    out.flush()


def train(model: HybridLM, stream: np.ndarray, heldout: np.ndarray | None, cfg: TrainConfig, device: str | torch.device,
          checkpoint_dir: str | Path | None = None, resume: bool = False, progress: IO[str] | None = sys.stderr,
          stop_at: int | None = None) -> dict:
    """Train ``model`` in place on ``stream`` (token ids) and return the history: per-step ``steps`` rows
    ``[step, loss, mtp_loss, lr, seconds]``, the step count ``total``, ``tokens`` seen and the held-out
    ``eval`` (:func:`evaluate`) at the end. With ``checkpoint_dir``, ``checkpoint.pt`` is written every
    ``checkpoint_every`` steps and at the end; ``resume`` continues from it. ``stop_at``: leave after that many steps
    (checkpoint written, no evaluation), as an interrupted run would."""
    device = torch.device(device)
    model.to(device).train()
    if cfg.trainable == "mtp":
        if model.mtp is None:
            raise ValueError("trainable = 'mtp' needs a model with an MTP head (config.mtp_num_hidden_layers >= 1)")
        for name, p in model.named_parameters():
            p.requires_grad_(name.startswith("mtp."))
    optimizer = _optimizer(model, cfg, device)
    history: dict = {"steps": [], "total": cfg.steps, "tokens": 0, "config": asdict(cfg)}
    step = 0
    path = Path(checkpoint_dir) / CHECKPOINT_FILE if checkpoint_dir is not None else None
    if resume:
        if path is None or not path.is_file():
            raise FileNotFoundError(f"resume: no {CHECKPOINT_FILE} in checkpoint_dir = {str(checkpoint_dir)!r}")
        state = torch.load(path, map_location=device, weights_only=False)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        step, history = state["step"], state["history"]
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
    total = history["total"]
    tokens_per_step = cfg.batch_size * cfg.seq_len
    start = time.perf_counter() - (history["steps"][-1][4] if history["steps"] else 0.0)
    calibration_start, calibration_from = None, step
    loss_value = mtp_value = float("nan")
    while (total is None or step < total) and (stop_at is None or step < stop_at):
        if total is None and calibration_start is None and step >= 3:
            calibration_start, calibration_from = time.perf_counter(), step  # kernels compiled and tuned by now
        if total is None and calibration_start is not None and step >= max(cfg.calibration_steps,
                                                                            calibration_from + 5):
            per_step = (time.perf_counter() - calibration_start) / (step - calibration_from)
            left = cfg.seconds - (time.perf_counter() - start)
            total = min(cfg.max_steps, max(cfg.warmup_steps + 1, step + int(left / per_step)))
            history["total"] = total
        lr = lr_at(step, total, cfg)
        for group in optimizer.param_groups:
            group["lr"] = lr
        tokens = torch.from_numpy(batch(stream, cfg.seed, step, cfg.batch_size, cfg.seq_len)).to(device)
        with _autocast(device):
            main, mtp = model.losses(tokens, mtp=cfg.mtp_weight > 0 or cfg.trainable == "mtp",
                                     detach_trunk=cfg.trainable == "mtp")
            loss = mtp if cfg.trainable == "mtp" else main + (cfg.mtp_weight * mtp if mtp is not None else 0.0)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_([p for p in model.parameters() if p.requires_grad], cfg.grad_clip)
        optimizer.step()
        step += 1
        history["tokens"] += tokens_per_step
        if step % cfg.log_every == 0 or step == total:
            loss_value, mtp_value = main.item(), (mtp.item() if mtp is not None else None)
            elapsed = time.perf_counter() - start
            history["steps"].append([step, loss_value, mtp_value, lr, elapsed])
            rate = history["tokens"] / max(elapsed, 1e-9)
            left = (total - step) * elapsed / step if total else None
            _progress(progress, step, total, loss_value, mtp_value, lr, rate, left)
        if path is not None and step % cfg.checkpoint_every == 0:
            _save(path, model, optimizer, step, total, history)
        if not math.isfinite(loss.item() if step % cfg.log_every == 0 else 0.0):
            raise FloatingPointError(f"the loss is {loss.item()} at step {step}")
    history["train_seconds"] = time.perf_counter() - start
    if progress is not None:
        progress.write("\n")
    if heldout is not None and step == total:
        history["eval"] = evaluate(model, heldout, cfg, device)
    if path is not None:
        _save(path, model, optimizer, step, total, history)
    return history
