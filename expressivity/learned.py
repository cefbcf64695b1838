r"""Learned separation: small torch models of the four kinds trained on the task, accuracy versus n and m.

Kinds (two layers each, equal parameter budgets up to a few percent, same training recipe):

- ``gdn_beta01``: two GDN layers, ``beta = sigmoid(b)`` in (0, 1) (Qwen3-Next's range);
- ``gdn_beta02``: two GDN layers, ``beta = 2 sigmoid(b)`` in (0, 2) (``allow_neg_eigval``);
- ``attention``: two gated-attention layers (no scratchpad: the answer is the next token after ``q_1``);
- ``hybrid``: a GDN layer (beta in (0, 2)) then a gated-attention layer.

The torch layers follow the reference model's conventions and weight layout exactly (zero-centred RMSNorms, short
conv + SiLU, l2-normalised q/k, ``g = -exp(A_log) softplus(a + dt_bias)``, gated RMSNorm, partial RoPE with
``rotate_half``, output gate, SwiGLU): :func:`to_reference` turns a trained model into a
:class:`~lumotree.reference.model.HybridModel` with the same logits (tested), so the pure-GDN adversary
(:mod:`lumotree.expressivity.adversary`) can attack trained models too.

Training: cross-entropy on the answer token only, Adam (lr 1e-2, warm-up, linear decay), an adaptive length
curriculum (one ``n`` per batch, uniform in ``[1, n_max]``; ``n_max`` grows by one each time the last 50 batches
reach 0.9 accuracy), ``m`` uniform in ``[2, m_train]``, ``M = R = 4``, batch 128. The trained pure-GDN models are
then attacked by the adversary (their vocabulary has only M = 4 keys, so it can only try m <= 4 pairs).
Evaluation: accuracy on fresh instances for every ``(n, m)`` of a grid that extends past the training lengths.
This runs on the CPU in minutes; the command that produced the committed results is recorded in them.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .task import NUM_SPECIAL, TaskSpec, generate, parity_blind_accuracy

__all__ = ["KINDS", "ModelSpec", "build", "train", "evaluate", "to_reference", "run_experiment", "plot",
           "add_arguments", "run"]

KINDS = ("gdn_beta01", "gdn_beta02", "attention", "hybrid")
EPS = 1e-6


@dataclass(frozen=True)
class ModelSpec:
    """Sizes: ``d_model`` D, GDN ``heads`` x (``head_k``, ``head_v``), attention ``att_heads`` x ``att_head_dim``,
    SwiGLU width ``mlp``, vocabulary ``vocab``."""

    kind: str
    vocab: int
    d_model: int = 48
    heads: int = 2
    head_k: int = 16
    head_v: int = 16
    att_heads: int = 2
    att_head_dim: int = 16
    mlp: int = 96

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"kind = {self.kind!r}; expected one of {KINDS}")

    @property
    def layer_types(self) -> tuple[str, str]:
        return {"gdn_beta01": ("linear_attention", "linear_attention"),
                "gdn_beta02": ("linear_attention", "linear_attention"),
                "attention": ("full_attention", "full_attention"),
                "hybrid": ("linear_attention", "full_attention")}[self.kind]

    @property
    def allow_neg_eigval(self) -> bool:
        return self.kind != "gdn_beta01"


def _torch():
    import torch

    return torch


def build(spec: ModelSpec, seed: int = 0):
    """A torch module of ``spec`` (float32), seeded."""
    torch = _torch()
    nn = torch.nn
    F = torch.nn.functional
    torch.manual_seed(seed)

    def rmsnorm0(x, w):
        return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + EPS) * (1.0 + w)

    class GDN(nn.Module):
        def __init__(self):
            super().__init__()
            D, H, K, V = spec.d_model, spec.heads, spec.head_k, spec.head_v
            self.w_q = nn.Parameter(torch.randn(H * K, D) / math.sqrt(D))
            self.w_k = nn.Parameter(torch.randn(H * K, D) / math.sqrt(D))
            self.w_v = nn.Parameter(torch.randn(H * V, D) / math.sqrt(D))
            self.w_z = nn.Parameter(torch.randn(H * V, D) / math.sqrt(D))
            self.w_b = nn.Parameter(torch.randn(H, D) / math.sqrt(D))
            self.w_a = nn.Parameter(torch.randn(H, D) / math.sqrt(D))
            C = 2 * H * K + H * V
            conv = torch.zeros(C, 4)
            conv[:, 3] = 1.0
            self.conv = nn.Parameter(conv + 0.1 * torch.randn(C, 4))
            self.A_log = nn.Parameter(torch.log(torch.empty(H).uniform_(0.1, 1.0)))
            self.dt_bias = nn.Parameter(torch.zeros(H))
            self.norm = nn.Parameter(torch.ones(V))
            self.out = nn.Parameter(torch.randn(D, H * V) / math.sqrt(H * V))

        def forward(self, x):  # x: [B, T, D] normed
            B, T, _ = x.shape
            H, K, V = spec.heads, spec.head_k, spec.head_v
            mixed = torch.cat([x @ self.w_q.T, x @ self.w_k.T, x @ self.w_v.T], dim=-1)  # [B, T, C]
            mixed = F.conv1d(F.pad(mixed.transpose(1, 2), (3, 0)), self.conv[:, None, :], groups=mixed.shape[-1])
            mixed = F.silu(mixed.transpose(1, 2))  # [B, T, C]
            q = mixed[..., : H * K].reshape(B, T, H, K)
            k = mixed[..., H * K : 2 * H * K].reshape(B, T, H, K)
            v = mixed[..., 2 * H * K :].reshape(B, T, H, V)
            q = q * torch.rsqrt((q * q).sum(-1, keepdim=True) + EPS)
            k = k * torch.rsqrt((k * k).sum(-1, keepdim=True) + EPS)
            g = -torch.exp(self.A_log) * F.softplus(x @ self.w_a.T + self.dt_bias)  # [B, T, H]
            beta = torch.sigmoid(x @ self.w_b.T) * (2.0 if spec.allow_neg_eigval else 1.0)  # [B, T, H]
            # the chain closed form (the tree closed form on a path, S0 = 0): one triangular solve, no time loop
            q, k, v = (u.transpose(1, 2) for u in (q, k, v))  # [B, H, T, K|V]
            cum = g.transpose(1, 2).cumsum(-1)  # [B, H, T] log Gamma
            causal = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()
            D = torch.exp((cum[..., :, None] - cum[..., None, :]).masked_fill(~causal, float("-inf")))  # [B, H, T, T]
            beta = beta.transpose(1, 2)[..., None]  # [B, H, T, 1]
            A = beta * ((k @ k.transpose(-1, -2)) * D).tril(-1)  # [B, H, T, T] strictly lower
            eye = torch.eye(T, dtype=x.dtype, device=x.device)
            delta = torch.linalg.solve_triangular(eye + A, beta * v, upper=False, unitriangular=True)  # [B, H, T, V]
            o = (((q @ k.transpose(-1, -2)) * D) @ delta * K**-0.5).transpose(1, 2)  # [B, T, H, V]
            z = (x @ self.w_z.T).reshape(B, T, H, V)
            o = self.norm * o * torch.rsqrt((o * o).mean(-1, keepdim=True) + EPS) * F.silu(z)
            return o.reshape(B, T, H * V) @ self.out.T

    class Attention(nn.Module):
        def __init__(self):
            super().__init__()
            D, Hq, Dh = spec.d_model, spec.att_heads, spec.att_head_dim
            self.w_query = nn.Parameter(torch.randn(Hq * Dh, D) / math.sqrt(D))
            self.w_gate = nn.Parameter(torch.randn(Hq * Dh, D) / math.sqrt(D))
            self.w_k = nn.Parameter(torch.randn(Hq * Dh, D) / math.sqrt(D))
            self.w_v = nn.Parameter(torch.randn(Hq * Dh, D) / math.sqrt(D))
            self.w_o = nn.Parameter(torch.randn(D, Hq * Dh) / math.sqrt(Hq * Dh))
            self.q_norm = nn.Parameter(torch.zeros(Dh))
            self.k_norm = nn.Parameter(torch.zeros(Dh))

        def forward(self, x):
            B, T, _ = x.shape
            Hq, Dh = spec.att_heads, spec.att_head_dim
            rd = Dh // 4
            q = rmsnorm0((x @ self.w_query.T).reshape(B, T, Hq, Dh), self.q_norm)
            k = rmsnorm0((x @ self.w_k.T).reshape(B, T, Hq, Dh), self.k_norm)
            v = (x @ self.w_v.T).reshape(B, T, Hq, Dh)
            inv_freq = 10000.0 ** -(torch.arange(0, rd, 2, dtype=x.dtype) / rd)
            ang = torch.arange(T, dtype=x.dtype)[:, None] * inv_freq[None]
            cos, sin = torch.cat([ang, ang], -1).cos()[:, None], torch.cat([ang, ang], -1).sin()[:, None]

            def rope(u):
                ur, up = u[..., :rd], u[..., rd:]
                rot = torch.cat([-ur[..., rd // 2 :], ur[..., : rd // 2]], -1)
                return torch.cat([ur * cos + rot * sin, up], -1)

            q, k = rope(q), rope(k)
            scores = torch.einsum("bthd,bshd->bhts", q, k) * Dh**-0.5
            mask = torch.ones(T, T, dtype=torch.bool).tril()
            w = torch.softmax(scores.masked_fill(~mask, float("-inf")), -1)
            o = torch.einsum("bhts,bshd->bthd", w, v).reshape(B, T, Hq * Dh)
            return (o * torch.sigmoid(x @ self.w_gate.T)) @ self.w_o.T

    class Block(nn.Module):
        def __init__(self, layer_type):
            super().__init__()
            D, I = spec.d_model, spec.mlp
            self.mixer = GDN() if layer_type == "linear_attention" else Attention()
            self.norm1 = nn.Parameter(torch.zeros(D))
            self.norm2 = nn.Parameter(torch.zeros(D))
            self.gate = nn.Parameter(torch.randn(I, D) / math.sqrt(D))
            self.up = nn.Parameter(torch.randn(I, D) / math.sqrt(D))
            self.down = nn.Parameter(torch.randn(D, I) / math.sqrt(I) * 0.5)

        def forward(self, h):
            h = h + self.mixer(rmsnorm0(h, self.norm1))
            x = rmsnorm0(h, self.norm2)
            return h + (F.silu(x @ self.gate.T) * (x @ self.up.T)) @ self.down.T

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.spec = spec
            self.embed = nn.Parameter(torch.randn(spec.vocab, spec.d_model))
            self.blocks = nn.ModuleList([Block(t) for t in spec.layer_types])
            self.norm = nn.Parameter(torch.zeros(spec.d_model))
            self.lm_head = nn.Parameter(torch.randn(spec.vocab, spec.d_model) / math.sqrt(spec.d_model))

        def forward(self, tokens):  # [B, T] -> logits [B, T, vocab]
            h = self.embed[tokens]
            for block in self.blocks:
                h = block(h)
            return rmsnorm0(h, self.norm) @ self.lm_head.T

    return Model()


def parameter_count(model) -> int:
    return sum(p.numel() for p in model.parameters())


def balanced_specs(vocab: int, budget_width: int = 48) -> dict[str, ModelSpec]:
    """One spec per kind with equal hidden size; the MLP width of each kind is chosen so that every kind's parameter
    count is within a few percent of the hybrid's."""
    base = {k: ModelSpec(k, vocab, d_model=budget_width) for k in KINDS}
    target = parameter_count(build(base["hybrid"]))
    out = {}
    for kind, spec in base.items():
        count = parameter_count(build(spec))
        per_unit = 3 * spec.d_model * len(spec.layer_types)  # gate, up, down rows per MLP unit, every layer
        width = max(4, spec.mlp + round((target - count) / per_unit))
        out[kind] = ModelSpec(kind, vocab, d_model=budget_width, mlp=width)
    return out


def _batch(rng: np.random.Generator, count: int, n_max: int, m_max: int, M: int, R: int):
    """One ``(n, m)`` per batch (``n`` uniform in ``[1, n_max]``, ``m`` in ``[2, m_max]``), so no padding:
    ``tokens [count, n + 2m + 5]`` and the answers ``[count]``."""
    n = int(rng.integers(1, n_max + 1))
    m = int(rng.integers(2, m_max + 1))
    instances = generate(TaskSpec(n, m, M, R), count, seed=rng)
    return np.stack([inst.tokens for inst in instances]), np.asarray([inst.answer for inst in instances])


def train(model, steps: int, n_train: int, m_train: int, M: int, R: int, seed: int, batch: int = 128,
          lr: float = 1e-2, log=None) -> list[dict[str, float]]:
    """Adam on the answer's cross-entropy with an adaptive length curriculum: ``n`` is drawn uniformly from
    ``[1, n_max]``; ``n_max`` starts at 1 and grows by one whenever the mean batch accuracy of the last 50 steps
    reaches 0.9 (up to ``n_train``). Returns the curve (every 50 steps: loss, batch accuracy, ``n_max``)."""
    torch = _torch()
    rng = np.random.default_rng(seed)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 100) * (1 - 0.9 * s / steps))
    curve = []
    n_max, recent = 1, []
    for step in range(steps):
        tokens, answers = _batch(rng, batch, n_max, m_train, M, R)
        logits = model(torch.from_numpy(tokens))[:, -1]
        loss = torch.nn.functional.cross_entropy(logits, torch.from_numpy(answers))
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        acc = float((logits.argmax(-1) == torch.from_numpy(answers)).float().mean())
        recent.append(acc)
        if len(recent) >= 50 and np.mean(recent[-50:]) >= 0.9 and n_max < n_train:
            n_max, recent = n_max + 1, []
        if step % 50 == 0 or step == steps - 1:
            curve.append({"step": step, "loss": float(loss.detach()), "batch_accuracy": acc, "n_max": n_max})
            if log:
                log(f"step {step:5d} n_max {n_max:3d} loss {float(loss.detach()):.3f} acc {acc:.2f}")
    return curve


def evaluate(model, ns: list[int], ms: list[int], M: int, R: int, count: int, seed: int) -> list[dict[str, Any]]:
    """Accuracy on ``count`` fresh instances per ``(n, m)``."""
    torch = _torch()
    rows = []
    with torch.no_grad():
        for n in ns:
            for m in ms:
                instances = generate(TaskSpec(n, m, M, R), count, seed=seed + 7919 * n + m)
                tokens = torch.from_numpy(np.stack([inst.tokens for inst in instances]))
                predicted = model(tokens)[:, -1].argmax(-1).numpy()
                correct = int(sum(int(p) == inst.answer for p, inst in zip(predicted, instances)))
                rows.append({"n": n, "m": m, "accuracy": correct / count, "count": count})
    return rows


def to_reference(model):
    """The trained torch model as a float64 :class:`~lumotree.reference.model.HybridModel` (same logits)."""
    from ..reference.attention import AttentionWeights, pack_query_gate
    from ..reference.config import HybridConfig
    from ..reference.gdn import GDNWeights, pack_ba, pack_qkvz
    from ..reference.model import DecoderLayerWeights, HybridModel, MLPWeights, ModelWeights

    spec = model.spec

    def a(p):
        return p.detach().double().numpy()

    config = HybridConfig(
        vocab_size=spec.vocab, hidden_size=spec.d_model, intermediate_size=spec.mlp, num_hidden_layers=2,
        layer_types=spec.layer_types, num_attention_heads=spec.att_heads, num_key_value_heads=spec.att_heads,
        head_dim=spec.att_head_dim, partial_rotary_factor=0.25, linear_num_key_heads=spec.heads,
        linear_num_value_heads=spec.heads, linear_key_head_dim=spec.head_k, linear_value_head_dim=spec.head_v,
        linear_conv_kernel_dim=4, num_experts=0, allow_neg_eigval=spec.allow_neg_eigval, rms_norm_eps=EPS,
    )
    layers = []
    for block in model.blocks:
        mx = block.mixer
        if spec.layer_types[len(layers)] == "linear_attention":
            mixer = GDNWeights(pack_qkvz(a(mx.w_q), a(mx.w_k), a(mx.w_v), a(mx.w_z), spec.heads),
                               pack_ba(a(mx.w_b), a(mx.w_a), spec.heads), a(mx.conv), a(mx.A_log), a(mx.dt_bias),
                               a(mx.norm), a(mx.out))
        else:
            mixer = AttentionWeights(pack_query_gate(a(mx.w_query), a(mx.w_gate), spec.att_heads), a(mx.w_k),
                                     a(mx.w_v), a(mx.w_o), a(mx.q_norm), a(mx.k_norm))
        layers.append(DecoderLayerWeights(a(block.norm1), mixer, a(block.norm2),
                                          MLPWeights(a(block.gate), a(block.up), a(block.down))))
    return HybridModel(config, ModelWeights(a(model.embed), layers, a(model.norm), a(model.lm_head)))


def run_experiment(steps: int = 2000, n_train: int = 12, m_train: int = 2, eval_ns: list[int] | None = None,
                   eval_ms: list[int] | None = None, count: int = 256, seeds: list[int] | None = None,
                   M: int = 4, R: int = 4, width: int = 48, attack_precisions: tuple[str, ...] = ("fp8", "bf16"),
                   log=None) -> dict[str, Any]:
    """Train every kind (one model per seed) and evaluate on the grid; the trained pure-GDN models are then handed
    to the adversary (:func:`lumotree.expressivity.adversary.attack`) at ``attack_precisions``. Returns the results
    document."""
    torch = _torch()
    torch.set_num_threads(1)
    eval_ns = eval_ns or [1, 2, 3, 4, 6, 8, 12, 16, 24]
    eval_ms = eval_ms or [2, 3, 4]
    seeds = seeds or [0]
    vocab = NUM_SPECIAL + M + R
    specs = balanced_specs(vocab, width)
    results: dict[str, Any] = {"task": {"M": M, "R": R, "n_train": n_train, "m_train": m_train,
                                        "chance_parity_blind": parity_blind_accuracy(R), "chance_uniform": 1 / R},
                               "training": {"steps": steps, "batch": 128, "lr": 1e-2, "optimizer": "Adam",
                                            "curriculum": "n ~ U[1, n_max]; n_max += 1 when the last 50 batches "
                                                          "average >= 0.9 accuracy (up to n_train)",
                                            "seeds": seeds},
                               "models": {}}
    for kind, spec in specs.items():
        entry = {"spec": asdict(spec), "parameters": parameter_count(build(spec)), "runs": []}
        for seed in seeds:
            start = time.perf_counter()
            model = build(spec, seed)
            if log:
                log(f"{kind} seed {seed}: {entry['parameters']} parameters")
            curve = train(model, steps, n_train, m_train, M, R, seed, log=log)
            rows = evaluate(model, eval_ns, eval_ms, M, R, count, seed=10_000 + seed)
            run = {"seed": seed, "seconds": round(time.perf_counter() - start, 1),
                   "curriculum_n_max_reached": curve[-1]["n_max"], "curve": curve, "eval": rows}
            if "full_attention" not in spec.layer_types:
                from . import adversary

                reference = to_reference(model)
                run["adversary"] = []
                for precision in attack_precisions:
                    report = adversary.attack(reference, precision, M, R, seed=seed)
                    run["adversary"].append({k: report[k] for k in ("precision", "state_bits", "found",
                                                                    "counterexample")})
            entry["runs"].append(run)
        results["models"][kind] = entry
    return results


def plot(results: dict[str, Any], path: str | Path) -> None:
    """Accuracy versus n (one panel per m), mean over seeds, with the chance levels."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ms = sorted({row["m"] for e in results["models"].values() for r in e["runs"] for row in r["eval"]})
    fig, axes = plt.subplots(1, len(ms), figsize=(4.2 * len(ms), 3.6), sharey=True)
    axes = np.atleast_1d(axes)
    n_train, m_train = results["task"]["n_train"], results["task"]["m_train"]
    styles = {"gdn_beta01": ("o", "-"), "gdn_beta02": ("s", "--"), "attention": ("^", "-"), "hybrid": ("D", ":")}
    for ax, m in zip(axes, ms):
        for kind, entry in results["models"].items():
            ns = sorted({row["n"] for r in entry["runs"] for row in r["eval"] if row["m"] == m})
            acc = [np.mean([row["accuracy"] for r in entry["runs"] for row in r["eval"] if row["m"] == m
                            and row["n"] == n]) for n in ns]
            marker, line = styles.get(kind, ("o", "-"))
            ax.plot(ns, acc, marker=marker, ls=line, ms=5, label=f"{kind} ({entry['parameters']} params)")
        ax.axhline(results["task"]["chance_parity_blind"], color="gray", ls="--", lw=1, label="parity-blind chance")
        ax.axvline(n_train, color="gray", ls=":", lw=1, label="longest training n")
        ax.set_xscale("log", base=2)
        ax.set_title(f"m = {m} pairs" + ("" if m <= m_train else f" (trained on m <= {m_train})"))
        ax.set_xlabel("n (bits)")
        ax.set_ylim(0, 1.02)
    axes[0].set_ylabel("accuracy")
    axes[-1].legend(fontsize=7, loc="lower left")
    fig.suptitle("Parity-conditioned retrieval, learned (M = R = %d)" % results["task"]["M"], fontsize=10)
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--n-train", type=int, default=12)
    parser.add_argument("--m-train", type=int, default=2)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--count", type=int, default=256, help="evaluation instances per (n, m)")
    parser.add_argument("--out", default="docs/expressivity/learned.json", help="results JSON")
    parser.add_argument("--plot", default="docs/expressivity/learned.png", help="matplotlib PNG")


def run(args: argparse.Namespace) -> int:
    def log(message: str) -> None:
        print(f"[learned] {message}", file=sys.stderr, flush=True)

    results = run_experiment(steps=args.steps, n_train=args.n_train, m_train=args.m_train, seeds=args.seeds,
                             count=args.count, log=log)
    results["command"] = (f"lumotree expressivity learned --steps {args.steps} --n-train {args.n_train} --m-train "
                          f"{args.m_train} --seeds {' '.join(map(str, args.seeds))} --count {args.count} "
                          f"--out {args.out} --plot {args.plot}")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(results, indent=1))
    plot(results, args.plot)
    print(f"wrote {args.out} and {args.plot}")
    return 0
