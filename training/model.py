r"""The Qwen3.5 text model with its MTP head, in PyTorch autograd, for training.

Parameter names and shapes are transformers' ``Qwen3_5ForCausalLM`` names (``model.embed_tokens``,
``model.layers.{i}.linear_attn.in_proj_qkv`` / ``in_proj_z`` / ``in_proj_b`` / ``in_proj_a`` / ``conv1d`` /
``dt_bias`` / ``A_log`` / ``norm`` / ``out_proj``, ``model.layers.{i}.self_attn.q_proj`` (query and output gate) /
``k_proj`` / ``v_proj`` / ``o_proj`` / ``q_norm`` / ``k_norm``, ``mlp.gate_proj`` / ``up_proj`` / ``down_proj``,
``model.norm``, ``lm_head``) plus the MTP head as the released checkpoints store it (``mtp.pre_fc_norm_embedding``,
``mtp.pre_fc_norm_hidden``, ``mtp.fc``, ``mtp.layers.{j}``, ``mtp.norm``), so :func:`save_checkpoint` writes a
directory that transformers and :func:`lumotree.reference.model.load_pretrained` load.

The MTP head (depth 1, vLLM's convention for this family): position ``i`` reads the target's final normed hidden state
``h_i`` and the embedding of token ``i + 1``: ``x_i = fc([norm_e(E[t_{i+1}]); norm_h(h_i)])``, runs its causal
attention layer over ``x_0 .. x_i`` at RoPE position ``i``, then ``mtp.norm`` and the shared LM head; its logits at
``i`` predict token ``i + 2``.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from ..reference.config import HybridConfig
from .gdn import gated_delta_rule

__all__ = ["HybridLM", "save_checkpoint", "load_checkpoint", "parameter_count", "checkpoint_bytes"]


class ZeroCenteredRMSNorm(nn.Module):
    """``x / rms(x) * (1 + w)`` in float32, cast back (``w`` starts at zero)."""

    def __init__(self, size: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.zeros(size))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x.float()
        y = y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + self.eps)
        return (y * (1.0 + self.weight.float())).type_as(x)


class GatedRMSNorm(nn.Module):
    """GDN output norm: ``w * x / rms(x) * silu(z)`` per value head (``w`` starts at one)."""

    def __init__(self, size: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(size))

    def forward(self, x: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        y = x.float()
        y = y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + self.eps)
        y = self.weight * y.to(dtype)
        return (y * F.silu(z.float())).to(dtype)


class GatedDeltaNet(nn.Module):
    def __init__(self, c: HybridConfig, backend: str):
        super().__init__()
        self.backend = backend
        self.H, self.HV = c.linear_num_key_heads, c.linear_num_value_heads
        self.K, self.V = c.linear_key_head_dim, c.linear_value_head_dim
        self.key_dim, self.value_dim = self.H * self.K, self.HV * self.V
        conv_dim = 2 * self.key_dim + self.value_dim
        D = c.hidden_size
        self.conv1d = nn.Conv1d(conv_dim, conv_dim, c.linear_conv_kernel_dim, groups=conv_dim, bias=False,
                                padding=c.linear_conv_kernel_dim - 1)
        self.dt_bias = nn.Parameter(torch.ones(self.HV))
        self.A_log = nn.Parameter(torch.zeros(self.HV))
        self.norm = GatedRMSNorm(self.V, c.rms_norm_eps)
        self.out_proj = nn.Linear(self.value_dim, D, bias=False)
        self.in_proj_qkv = nn.Linear(D, conv_dim, bias=False)
        self.in_proj_z = nn.Linear(D, self.value_dim, bias=False)
        self.in_proj_b = nn.Linear(D, self.HV, bias=False)
        self.in_proj_a = nn.Linear(D, self.HV, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, _ = x.shape
        mixed = self.in_proj_qkv(x).transpose(1, 2)  # [B, C, T]
        mixed = F.silu(self.conv1d(mixed)[..., :T]).transpose(1, 2)  # [B, T, C] causal depthwise conv
        q, k, v = torch.split(mixed, [self.key_dim, self.key_dim, self.value_dim], dim=-1)
        q = q.reshape(B, T, self.H, self.K)
        k = k.reshape(B, T, self.H, self.K)
        v = v.reshape(B, T, self.HV, self.V)
        beta = self.in_proj_b(x).sigmoid()  # [B, T, HV]
        g = -self.A_log.float().exp() * F.softplus(self.in_proj_a(x).float() + self.dt_bias)  # [B, T, HV]
        o = gated_delta_rule(q, k, v, g, beta, backend=self.backend)  # [B, T, HV, V]
        z = self.in_proj_z(x).reshape(B, T, self.HV, self.V)
        o = self.norm(o, z).reshape(B, T, self.value_dim)
        return self.out_proj(o)


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate-half RoPE on the first ``cos.shape[-1]`` channels of ``x: [B, H, T, hd]``."""
    r = cos.shape[-1]
    x_rot, x_pass = x[..., :r], x[..., r:]
    half = r // 2
    rotated = torch.cat((-x_rot[..., half:], x_rot[..., :half]), dim=-1)
    return torch.cat((x_rot * cos + rotated * sin, x_pass), dim=-1)


class GatedAttention(nn.Module):
    def __init__(self, c: HybridConfig):
        super().__init__()
        self.H, self.KV, self.hd = c.num_attention_heads, c.num_key_value_heads, c.head_dim
        D = c.hidden_size
        self.q_proj = nn.Linear(D, self.H * self.hd * 2, bias=False)
        self.k_proj = nn.Linear(D, self.KV * self.hd, bias=False)
        self.v_proj = nn.Linear(D, self.KV * self.hd, bias=False)
        self.o_proj = nn.Linear(self.H * self.hd, D, bias=False)
        self.q_norm = ZeroCenteredRMSNorm(self.hd, c.rms_norm_eps)
        self.k_norm = ZeroCenteredRMSNorm(self.hd, c.rms_norm_eps)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        B, T, _ = x.shape
        q, gate = torch.chunk(self.q_proj(x).view(B, T, self.H, 2 * self.hd), 2, dim=-1)  # [B, T, H, hd] each
        q = rope(self.q_norm(q).transpose(1, 2), cos, sin)  # [B, H, T, hd]
        k = rope(self.k_norm(self.k_proj(x).view(B, T, self.KV, self.hd)).transpose(1, 2), cos, sin)
        v = self.v_proj(x).view(B, T, self.KV, self.hd).transpose(1, 2)  # [B, KV, T, hd]
        if self.KV != self.H:
            k = k.repeat_interleave(self.H // self.KV, dim=1)
            v = v.repeat_interleave(self.H // self.KV, dim=1)
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=self.hd ** -0.5)  # [B, H, T, hd]
        o = o.transpose(1, 2).reshape(B, T, self.H * self.hd)
        return self.o_proj(o * torch.sigmoid(gate.reshape(B, T, -1)))


class MLP(nn.Module):
    def __init__(self, c: HybridConfig):
        super().__init__()
        self.gate_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=False)
        self.up_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=False)
        self.down_proj = nn.Linear(c.intermediate_size, c.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, c: HybridConfig, kind: str, backend: str):
        super().__init__()
        self.kind = kind
        if kind == "linear_attention":
            self.linear_attn = GatedDeltaNet(c, backend)
        else:
            self.self_attn = GatedAttention(c)
        self.mlp = MLP(c)
        self.input_layernorm = ZeroCenteredRMSNorm(c.hidden_size, c.rms_norm_eps)
        self.post_attention_layernorm = ZeroCenteredRMSNorm(c.hidden_size, c.rms_norm_eps)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        h = self.input_layernorm(x)
        h = self.linear_attn(h) if self.kind == "linear_attention" else self.self_attn(h, cos, sin)
        x = x + h
        return x + self.mlp(self.post_attention_layernorm(x))


class TextModel(nn.Module):
    def __init__(self, c: HybridConfig, backend: str):
        super().__init__()
        self.embed_tokens = nn.Embedding(c.vocab_size, c.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(c, kind, backend) for kind in c.layer_types)
        self.norm = ZeroCenteredRMSNorm(c.hidden_size, c.rms_norm_eps)


class MTPHead(nn.Module):
    def __init__(self, c: HybridConfig, backend: str):
        super().__init__()
        D = c.hidden_size
        self.pre_fc_norm_embedding = ZeroCenteredRMSNorm(D, c.rms_norm_eps)
        self.pre_fc_norm_hidden = ZeroCenteredRMSNorm(D, c.rms_norm_eps)
        self.fc = nn.Linear(2 * D, D, bias=False)
        self.layers = nn.ModuleList(DecoderLayer(c, "full_attention", backend) for _ in range(c.mtp_num_hidden_layers))
        self.norm = ZeroCenteredRMSNorm(D, c.rms_norm_eps)


class HybridLM(nn.Module):
    """Qwen3.5 text model (GDN / gated attention per ``config.layer_types``, dense MLPs) with an optional MTP head
    (``config.mtp_num_hidden_layers``). ``backend`` picks the GDN kernel (:func:`~lumotree.training.gdn.gated_delta_rule`).
    """

    def __init__(self, config: HybridConfig, backend: str = "auto"):
        super().__init__()
        if config.model_type != "qwen3_5_text" or config.num_experts:
            raise ValueError(f"config.model_type = {config.model_type!r}: the training model is qwen3_5_text (dense)")
        if config.allow_neg_eigval:
            raise ValueError("config.allow_neg_eigval: transformers has no such switch; the training model refuses it")
        self.config = config
        self.model = TextModel(config, backend)
        self.mtp = MTPHead(config, backend) if config.mtp_num_hidden_layers else None
        self.lm_head = None if config.tie_word_embeddings else nn.Linear(config.hidden_size, config.vocab_size,
                                                                         bias=False)
        inv_freq = 1.0 / (config.rope_theta ** (torch.arange(0, config.rotary_dim, 2).float() / config.rotary_dim))
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    # ------------------------------------------------------------------------------------------------ init
    def initialize(self, seed: int, std: float = 0.02) -> None:
        """Seeded initialisation: linear and embedding weights ``N(0, std)`` (output projections scaled by
        ``1 / sqrt(2 L)``), norms at identity, the GDN decay ``A = U(1, 16)`` and ``dt = exp(U(log 1e-3, log 0.1))``
        through ``dt_bias = softplus^{-1}(dt)`` (fla's and Mamba-2's initialisation)."""
        gen = torch.Generator().manual_seed(seed)
        depth_scale = 1.0 / math.sqrt(2 * (self.config.num_hidden_layers + self.config.mtp_num_hidden_layers))
        with torch.no_grad():
            for name, p in self.named_parameters():
                if name.endswith("A_log"):
                    p.copy_(torch.empty(p.shape).uniform_(1, 16, generator=gen).log())
                elif name.endswith("dt_bias"):
                    dt = torch.empty(p.shape).uniform_(math.log(1e-3), math.log(0.1), generator=gen).exp()
                    p.copy_(dt + torch.log(-torch.expm1(-dt)))
                elif name.endswith("linear_attn.norm.weight"):
                    p.fill_(1.0)
                elif p.ndim == 1:
                    p.zero_()
                elif name.endswith("conv1d.weight"):
                    bound = 1.0 / math.sqrt(p.shape[-1])
                    p.copy_(torch.empty(p.shape).uniform_(-bound, bound, generator=gen))
                else:
                    scale = depth_scale if name.endswith(("out_proj.weight", "o_proj.weight", "down_proj.weight")) \
                        else 1.0
                    p.copy_(torch.randn(p.shape, generator=gen) * std * scale)

    # ------------------------------------------------------------------------------------------------ forward
    def head_weight(self) -> torch.Tensor:
        return self.model.embed_tokens.weight if self.lm_head is None else self.lm_head.weight

    def rotary(self, T: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        freqs = torch.arange(T, device=device, dtype=torch.float32)[:, None] * self.inv_freq.to(device)[None]
        emb = torch.cat((freqs, freqs), dim=-1)  # [T, rotary_dim]
        return emb.cos(), emb.sin()

    def hidden(self, tokens: torch.Tensor) -> torch.Tensor:
        """Final normed hidden states ``[B, T, D]`` of ``tokens: [B, T]``."""
        x = self.model.embed_tokens(tokens)
        cos, sin = self.rotary(tokens.shape[1], tokens.device)
        for layer in self.model.layers:
            x = layer(x, cos, sin)
        return self.model.norm(x)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return F.linear(hidden, self.head_weight())

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """Next-token logits ``[B, T, V]``."""
        return self.logits(self.hidden(tokens))

    def mtp_hidden(self, hidden: torch.Tensor, next_tokens: torch.Tensor) -> torch.Tensor:
        """The MTP head's normed output ``[B, T, D]`` from the target's ``hidden: [B, T, D]`` and the tokens one
        position later ``next_tokens: [B, T]`` (module docstring)."""
        if self.mtp is None:
            raise ValueError("config.mtp_num_hidden_layers = 0: the model has no MTP head")
        e = self.mtp.pre_fc_norm_embedding(self.model.embed_tokens(next_tokens))
        x = self.mtp.fc(torch.cat((e, self.mtp.pre_fc_norm_hidden(hidden)), dim=-1))  # [B, T, D]
        cos, sin = self.rotary(x.shape[1], x.device)
        for layer in self.mtp.layers:
            x = layer(x, cos, sin)
        return self.mtp.norm(x)

    def losses(self, tokens: torch.Tensor, mtp: bool = True, detach_trunk: bool = False
               ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Mean next-token cross-entropy over ``tokens: [B, T]`` and the MTP head's mean cross-entropy on the
        token after next (``None`` without a head or with ``mtp=False``). ``detach_trunk`` stops the MTP loss's
        gradient at the target's hidden states (training a head for a frozen target)."""
        if tokens.ndim != 2 or tokens.shape[1] < 3:
            raise ValueError(f"tokens has shape {list(tokens.shape)}; expected [B, T] with T >= 3")
        hidden = self.hidden(tokens)
        V = self.config.vocab_size
        main = F.cross_entropy(self.logits(hidden[:, :-1]).float().reshape(-1, V), tokens[:, 1:].reshape(-1))
        if not mtp or self.mtp is None:
            return main, None
        h = hidden[:, :-2].detach() if detach_trunk else hidden[:, :-2]
        m = self.mtp_hidden(h, tokens[:, 1:-1])
        second = F.cross_entropy(self.logits(m).float().reshape(-1, V), tokens[:, 2:].reshape(-1))
        return main, second


def parameter_count(model: nn.Module) -> int:
    """Distinct parameters (a tied head counted once)."""
    return sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())


def checkpoint_bytes(config: HybridConfig, bytes_per_value: int = 2) -> int:
    """Bytes of the stored tensors of ``config`` (text model, head unless tied, MTP head) at ``bytes_per_value``."""
    with torch.device("meta"):
        model = HybridLM(config, backend="torch")
    return parameter_count(model) * bytes_per_value


def save_checkpoint(model: HybridLM, out_dir: str | Path, dtype: torch.dtype = torch.bfloat16,
                    extra_config: dict | None = None) -> Path:
    """Write ``config.json`` (``model_type: qwen3_5_text``) and ``model.safetensors`` (transformers' names, the
    MTP head under ``mtp.``; a tied head not stored) into ``out_dir``."""
    from safetensors.torch import save_file

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tensors = {name: p.detach().to("cpu", dtype).contiguous() for name, p in model.state_dict().items()}
    if model.config.tie_word_embeddings:
        tensors.pop("lm_head.weight", None)
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    config = model.config.to_dict()
    config["dtype"] = str(dtype).removeprefix("torch.")
    config.update(extra_config or {})
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return out


def load_checkpoint(path: str | Path, backend: str = "auto", dtype: torch.dtype = torch.float32) -> HybridLM:
    """A :class:`HybridLM` from a directory :func:`save_checkpoint` (or transformers) wrote; every stored tensor must
    be a parameter of the model and every parameter stored."""
    from safetensors.torch import load_file

    path = Path(path)
    if not (path / "config.json").is_file():
        raise FileNotFoundError(f"path = {str(path)!r} has no config.json")
    config = HybridConfig.from_dict(json.loads((path / "config.json").read_text()))
    model = HybridLM(config, backend=backend)
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"path = {str(path)!r} has no *.safetensors file")
    stored: dict[str, torch.Tensor] = {}
    for file in files:
        stored.update(load_file(str(file)))
    if config.tie_word_embeddings:
        stored.pop("lm_head.weight", None)
    want = model.state_dict()
    missing, unexpected = sorted(set(want) - set(stored)), sorted(set(stored) - set(want))
    if missing or unexpected:
        raise ValueError(f"checkpoint {str(path)!r}: missing {missing[:3]}, unexpected {unexpected[:3]}")
    for name, t in stored.items():
        if tuple(t.shape) != tuple(want[name].shape):
            raise ValueError(f"tensor {name!r} has shape {list(t.shape)}, expected {list(want[name].shape)}")
    model.load_state_dict({k: v.to(dtype) for k, v in stored.items()})
    return model.to(dtype)
