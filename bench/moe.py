"""Benchmark: the routed MoE block (:func:`lumotree.optimized.ops.moe.moe_routed`) and the MoE model steps built on
it, at Qwen3-Next-80B-A3B's and Qwen3.5-MoE's shapes (transformers' ``Qwen3NextConfig`` and ``Qwen3_5MoeTextConfig``
defaults: hidden 2048, 512 experts top 10 / 256 experts top 8, expert and shared-expert width 512, renormalised), one
GPU, bf16 random weights.

**Model steps** (``model`` rows): an :class:`~lumotree.optimized.model.OptimizedModel` of the config's first ``L``
layers, ``L`` the most whole groups of four layers (three GDN, one attention) whose weights fit the free device memory
less ``--reserve-gib`` (stated in each row: ``layers`` of ``depth``), weights drawn one tensor at a time
(:func:`~lumotree.optimized.model.random_weights`), 16 slots holding ``--context`` (128) prompt tokens each. Timed
(CUDA events over ``--steps`` back-to-back calls of the model's API, each a CUDA-graph replay):

- ``decode`` at B = 1 and B = 16: one token per slot, every cache advanced;
- ``verify`` of a random 64-node tree at B = 1 (caches untouched);
- ``prefill`` of one slot's prompt (chunks of 64 tokens, tokens/s only).

Each against ``floor``: the bytes the step must move at the copy rate measured in the same run (a 2 GiB device copy,
bytes read + written / time): every non-expert weight (GDN and attention projections, norms, router, shared expert,
final norm, LM head), the experts the step's tokens route to (each layer's distinct experts, counted on the same
model's routing in an eager pass of the same step shape), the GDN and conv states (read, and written by a decode), the
committed K / V read, and the fp32 logits written. The eager pass also checks every MoE layer's output against
:func:`~lumotree.optimized.ops.moe.moe_routed_ref` on the same inputs (fp32 experts on the same bf16 routing,
norm-wise relative error below 2e-2).

**MoE block** (``block`` rows): one layer's block at T = 1, 16 (decode), 64 and 1024 tokens (64-node trees at B = 1
and 16), as a CUDA-graph replay of ``--calls`` (8) calls on distinct inputs (so no call finds its experts in L2):

- ``ours``: ``moe_routed`` (its default launch, ``moe_config``);
- ``dense``: every expert on every token, weighted by the renormalised top-k probabilities (three einsums), where its
  ``[E, T, 2I]`` and ``[E, T, Dm]`` intermediates fit ``--max-gib``;
- ``gather``: a torch routed baseline: each (token, expert) pair's weights gathered (``w[ids]``) and multiplied in
  batched matmuls, where the gathered weights fit ``--max-gib``;
- ``loop``: transformers' eager expert loop (``moe_routed_ref``, host syncs: timed eagerly);
- ``floor``: the routed experts' bytes (mean over the inputs) + router + shared expert + x and out at the copy rate.

Every variant is checked before timing against ``moe_routed_ref`` on the same routing (fp32 experts); a result above
2e-2 counts as bad and the exit status is 1. ``--sweep`` also times a few other launches of ours per block case.

Run (GPU, about 3 minutes on an H100): ``python bench/moe.py [--models qwen3-next] [--parts model block] [--out
bench/baselines/moe.json]``; ``python bench/moe.py --table bench/baselines/moe.json`` prints the docs' tables of a
saved run. ``--check-only``: every check on a tiny config in fp32, no timing, no JSON (on a CPU under
``TRITON_INTERPRET=1``, which it sets when no GPU is present).
"""

from __future__ import annotations

import argparse
import datetime
import gc
import json
import math
import os
import sys
import time

import torch

MODELS = {"qwen3-next": "qwen3_next", "qwen3.5-moe": "qwen3_5_moe_text"}  # name: model type (its HF defaults)
TOKENS = [1, 16, 64, 1024]
REL_TOL = 2e-2
GROUP = 4  # layers kept in whole groups of three GDN layers and one attention layer
BATCHES = (1, 16)  # decode batch sizes; the model holds max(BATCHES) slots
TREE = 64  # verified tree size
SWEEP = [  # (block_m, gate_up_n, down_n, block_k, num_warps, num_stages) tried by --sweep (route_tokens: default's)
    (16, 16, 32, 128, 4, 3), (16, 32, 64, 128, 4, 3), (16, 64, 64, 128, 4, 4), (16, 128, 128, 64, 4, 3),
    (32, 64, 128, 64, 4, 3), (32, 128, 128, 64, 8, 3), (64, 128, 128, 64, 8, 3), (64, 64, 128, 64, 4, 4),
]


def model_config(name: str):
    """``(config, source)``: the model type's config at transformers' defaults (read from transformers' own config
    class where installed, else lumotree's copy of its defaults, which equals it); ``tiny`` for ``--check-only``."""
    from lumotree.reference.config import HybridConfig

    if name == "tiny":
        return HybridConfig(vocab_size=96, hidden_size=64, intermediate_size=0, num_hidden_layers=4,
                            num_attention_heads=4, num_key_value_heads=2, head_dim=16, linear_key_head_dim=16,
                            linear_value_head_dim=16, linear_num_key_heads=2, linear_num_value_heads=4,
                            num_experts=16, num_experts_per_tok=4, moe_intermediate_size=32,
                            shared_expert_intermediate_size=32), "tiny"
    ours = HybridConfig.from_dict({"model_type": MODELS[name]})
    try:
        import transformers

        cls = transformers.Qwen3NextConfig if name == "qwen3-next" else \
            transformers.models.qwen3_5_moe.Qwen3_5MoeTextConfig
    except (ImportError, AttributeError):
        return ours, "lumotree's copy of transformers' defaults"
    theirs = HybridConfig.from_dict(cls().to_dict())
    if theirs != ours:
        raise SystemExit(f"{name}: transformers {transformers.__version__}'s {cls.__name__} defaults differ from "
                         "lumotree's copy")
    return theirs, f"transformers {transformers.__version__} {cls.__name__}()"


def block_shape(config) -> tuple:
    """``(hidden, experts, expert width, top k, shared width, norm_topk_prob)`` of a config's MoE block."""
    return (config.hidden_size, config.num_experts, config.moe_intermediate_size, config.num_experts_per_tok,
            config.shared_expert_intermediate_size, config.norm_topk_prob)


def graph_time_us(call, calls: int) -> float:
    """Median time of one ``call(i)`` in a CUDA graph of ``calls`` back-to-back calls (i = 0 .. calls - 1)."""
    import triton.testing

    for i in range(calls):  # compile, warm the allocator (the graph allocates from its own pool)
        call(i)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(calls):
            call(i)
    ms = triton.testing.do_bench(graph.replay, warmup=10, rep=50, return_mode="median")
    del graph
    return ms * 1e3 / calls


def eager_time_us(call, calls: int) -> float:
    import triton.testing

    def all_calls():
        for i in range(calls):
            call(i)

    all_calls()
    return triton.testing.do_bench(all_calls, warmup=5, rep=50, return_mode="median") * 1e3 / calls


def make_block(shape: tuple, T: int, calls: int, dtype: torch.dtype, device: torch.device, seed: int) -> dict:
    """Random weights (unit-scale outputs) and ``calls`` distinct inputs ``xs: [calls, T, Dm]``."""
    Dm, E, I, _, Is, _ = shape
    gen = torch.Generator(device=device).manual_seed(seed)

    def rand(*s, scale=1.0):
        return (torch.randn(*s, generator=gen, device=device) * scale).to(dtype)

    return dict(xs=rand(calls, T, Dm), router=rand(E, Dm), w_gate_up=rand(E, 2 * I, Dm, scale=Dm**-0.5),
                w_down=rand(E, Dm, I, scale=I**-0.5), shared_gate_up=rand(2 * Is, Dm, scale=Dm**-0.5),
                shared_down=rand(Dm, Is, scale=Is**-0.5), shared_gate=rand(1, Dm, scale=Dm**-0.5))


def weights_of(block: dict) -> dict:
    return {n: t for n, t in block.items() if n != "xs"}


def dense_moe(x, router, w_gate_up, w_down, *, top_k, norm_topk_prob, shared_gate_up, shared_down, shared_gate):
    """Every expert on every token, weighted by the top-k probabilities (zero elsewhere): ``[E, T, *]`` products."""
    probs = torch.softmax((x @ router.T).float(), dim=-1)  # [T, E]
    top_p, top_i = torch.topk(probs, top_k, dim=-1)  # [T, k]
    if norm_topk_prob:
        top_p = top_p / top_p.sum(-1, keepdim=True)
    weights = torch.zeros_like(probs).scatter(1, top_i, top_p).to(x.dtype)  # [T, E]
    g, u = torch.einsum("td,efd->etf", x, w_gate_up).chunk(2, dim=-1)  # [E, T, I] each
    y = torch.einsum("eti,edi->etd", torch.nn.functional.silu(g) * u, w_down)  # [E, T, Dm]
    return torch.einsum("etd,te->td", y, weights) + shared_part(x, shared_gate_up, shared_down, shared_gate)


def gather_moe(x, router, w_gate_up, w_down, *, top_k, norm_topk_prob, shared_gate_up, shared_down, shared_gate):
    """Each (token, expert) pair's weights gathered and applied in batched matmuls (graph safe, no host sync)."""
    probs = torch.softmax((x @ router.T).float(), dim=-1)  # [T, E]
    top_p, top_i = torch.topk(probs, top_k, dim=-1)  # [T, k]
    if norm_topk_prob:
        top_p = top_p / top_p.sum(-1, keepdim=True)
    T, Dm = x.shape
    ids = top_i.reshape(-1)  # [T k]
    xs = x.repeat_interleave(top_k, dim=0)[:, None, :]  # [T k, 1, Dm]
    g, u = torch.bmm(xs, w_gate_up[ids].transpose(1, 2)).chunk(2, dim=-1)  # [T k, 1, I] each
    y = torch.bmm(torch.nn.functional.silu(g) * u, w_down[ids].transpose(1, 2))  # [T k, 1, Dm]
    y = (y.view(T, top_k, Dm) * top_p.to(x.dtype)[..., None]).sum(1)  # [T, Dm]
    return y + shared_part(x, shared_gate_up, shared_down, shared_gate)


def shared_part(x, shared_gate_up, shared_down, shared_gate):
    g, u = (x @ shared_gate_up.T).chunk(2, dim=-1)  # [T, Is] each
    return torch.sigmoid(x @ shared_gate.T) * ((torch.nn.functional.silu(g) * u) @ shared_down.T)  # [T, Dm]


def fits(shape: tuple, T: int, variant: str, max_gib: float) -> bool:
    """Whether a torch variant's intermediates fit ``max_gib`` (bf16)."""
    Dm, E, I, k, _, _ = shape
    if variant == "dense":
        need = E * T * (2 * I + I + Dm) * 2
    else:  # gather: the gathered gate | up and down weights of every pair
        need = T * k * (2 * I * Dm + Dm * I) * 2
    return need <= max_gib * 2**30


def floor_bytes(shape: tuple, T: int, block: dict) -> float:
    """Mean over the inputs of the bytes one call must read and write: the routed experts, router, shared expert,
    x and out."""
    from lumotree.optimized.ops.moe import route_ref

    Dm, E, I, k, Is, norm = shape
    expert = 3 * I * Dm * 2
    touched = [int(torch.unique(route_ref(x, block["router"], k, norm)[0]).numel()) for x in block["xs"]]
    fixed = E * Dm * 2 + (3 * Is * Dm + Dm) * 2 + 2 * T * Dm * 2
    return fixed + expert * sum(touched) / len(touched)


def check(fn, block: dict, shape: tuple, ref: torch.Tensor) -> float:
    _, _, _, k, _, norm = shape
    y = fn(block["xs"][0], **weights_of(block), top_k=k, norm_topk_prob=norm)
    return float((y.float() - ref).norm() / ref.norm())


def run_case(model: str, shape: tuple, T: int, args, copy_bw: float | None, device: torch.device) -> dict:
    from lumotree.optimized.ops.moe import MoEConfig, moe_config, moe_routed, moe_routed_ref

    Dm, E, I, k, Is, norm = shape
    dtype = torch.float32 if args.check_only else torch.bfloat16
    block = make_block(shape, T, args.calls, dtype, device, seed=T)
    wts = weights_of(block)
    ref = moe_routed_ref(block["xs"][0].float(), **wts, top_k=k, norm_topk_prob=norm,
                         route_dtype=dtype)  # [T, Dm] fp32 experts on the bf16 routing
    default = moe_config(T, k, E, I, Dm, device)
    row = dict(model=model, T=T, hidden=Dm, experts=E, width=I, top_k=k, shared=Is, config=list(default))
    outs = torch.empty((args.calls, T, Dm), dtype=dtype, device=device)  # [calls, T, Dm]

    def ours(cfg):
        return lambda i: moe_routed(block["xs"][i], **wts, top_k=k, norm_topk_prob=norm, config=cfg,
                                    validate=False, out=outs[i])

    def torch_call(fn):
        return lambda i: fn(block["xs"][i], **wts, top_k=k, norm_topk_prob=norm)

    variants = {"ours": (ours(None), True, lambda x, **kw: moe_routed(x, **kw, validate=False))}
    for name, fn in (("dense", dense_moe), ("gather", gather_moe)):  # name: (call, in a graph, checked function)
        if fits(shape, T, name, args.max_gib):
            variants[name] = (torch_call(fn), True, fn)
        else:
            row[name] = dict(skipped=f"intermediates above --max-gib {args.max_gib}")
    variants["loop"] = (torch_call(moe_routed_ref), False, None)  # the reference itself, in bf16
    bad = 0
    for name, (call, in_graph, fn) in variants.items():
        entry = {}
        if fn is not None:
            entry["rel_err"] = check(fn, block, shape, ref)
            entry["ok"] = entry["rel_err"] < REL_TOL
            bad += not entry["ok"]
        if not args.check_only:
            entry["us"] = graph_time_us(call, args.calls) if in_graph else eager_time_us(call, args.calls)
        row[name] = entry
    if args.sweep and not args.check_only:
        row["sweep"] = []
        for cfg in SWEEP:
            c = MoEConfig(*cfg[:4], default.route_tokens, *cfg[4:])
            try:
                err = check(lambda x, c=c, **kw: moe_routed(x, **kw, config=c, validate=False), block, shape, ref)
                row["sweep"].append(dict(config=list(c), rel_err=err, ok=err < REL_TOL,
                                         us=graph_time_us(ours(c), args.calls)))
            except Exception as exc:  # a launch that fails to compile is a result too
                row["sweep"].append(dict(config=list(c), error=repr(exc)[:300]))
    row["floor"] = dict(bytes=floor_bytes(shape, T, block))
    if copy_bw is not None:
        row["floor"]["us"] = row["floor"]["bytes"] / copy_bw * 1e6
        row["ours"]["x_floor"] = row["ours"]["us"] / row["floor"]["us"]
    row["bad"] = bad
    return row


# ------------------------------------------------------------------------------------------------ model steps
def layers_that_fit(config, free_bytes: int, reserve_bytes: int) -> int:
    """The most layers, whole groups of :data:`GROUP`, whose bf16 weights fit ``free_bytes - reserve_bytes``
    (at least one group, at most the config's depth)."""
    from lumotree.reference.layouts import canonical_shapes

    def weight_bytes(layers: int) -> int:
        cut = config.replace(num_hidden_layers=layers, layer_types=config.layer_types[:layers])
        return 2 * sum(math.prod(shape) for shape in canonical_shapes(cut).values())

    layers = GROUP
    while layers + GROUP <= config.num_hidden_layers and weight_bytes(layers + GROUP) <= free_bytes - reserve_bytes:
        layers += GROUP
    return min(layers, config.num_hidden_layers)


class RoutingProbe:
    """Stands in for ``moe_routed`` in the model's layers during an eager step: calls it, then records the layer's
    distinct routed experts and the output's error against ``moe_routed_ref`` on the same inputs."""

    def __init__(self, layers_module):
        self.module, self.routed, self.records = layers_module, layers_module.moe_routed, []

    def __enter__(self):
        self.module.moe_routed = self
        return self

    def __exit__(self, *exc):
        self.module.moe_routed = self.routed

    def __call__(self, x, router, w_gate_up, w_down, *, top_k, norm_topk_prob, **kw):
        from lumotree.optimized.ops.moe import moe_routed_ref, route_ref

        y = self.routed(x, router, w_gate_up, w_down, top_k=top_k, norm_topk_prob=norm_topk_prob, **kw)
        shared = {n: kw[n] for n in ("shared_gate_up", "shared_down", "shared_gate")}
        ref = moe_routed_ref(x.float(), router, w_gate_up, w_down, top_k=top_k, norm_topk_prob=norm_topk_prob,
                             route_dtype=x.dtype, **shared)  # [T, Dm] fp32 experts, the block's routing
        touched = int(torch.unique(route_ref(x, router, top_k, norm_topk_prob)[0]).numel())
        self.records.append((touched, float((y.float() - ref).norm() / ref.norm())))
        return y


def tensor_bytes(*objs) -> int:
    """Bytes of every tensor field of the weight dataclasses ``objs``."""
    return sum(t.numel() * t.element_size() for o in objs for t in vars(o).values() if isinstance(t, torch.Tensor))


def step_floor_bytes(model, B: int, N: int, touched: list[int], context: int, decode: bool) -> dict:
    """The bytes a step of ``B`` requests of ``N`` tokens must move (the module docstring's list), by part;
    ``touched``: each MoE layer's distinct routed experts."""
    w, c = model.weights, model.caches
    experts = [m for m in w.mlps if m.router is not None]
    per_expert = (experts[0].w_gate_up[0].numel() + experts[0].w_down[0].numel()) * experts[0].w_down.element_size()
    other = tensor_bytes(*w.layers) + sum(tensor_bytes(m) - m.w_gate_up.numel() * m.w_gate_up.element_size()
                                          - m.w_down.numel() * m.w_down.element_size() for m in w.mlps)
    states = 0
    if c.state_pools:  # one slot's recurrent and conv state per GDN layer, read (and written by a decode)
        per_slot = sum(t[0, 0].numel() * t.element_size() for t in (c.state_stack, c.conv_stack))
        states = B * len(c.state_pools) * per_slot * (2 if decode else 1)
    kv = 2 * B * len(c.k_pools) * context * c.k_stack[0, 0, :, 0].numel() * c.k_stack.element_size() \
        if c.k_pools else 0
    Dm, V = w.lm_head.shape[1], w.lm_head.shape[0]
    head = w.lm_head.numel() * w.lm_head.element_size() + w.final_norm.numel() * 4
    return dict(experts=per_expert * sum(touched), other_weights=other + head, states=states, kv=kv,
                logits=B * N * V * 4, tokens=B * N * Dm * w.embed.element_size())


def events_us(step, steps: int) -> float:
    """Mean GPU time of ``step()`` over ``steps`` back-to-back calls (CUDA events)."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(steps):
        step()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1e3 / steps


def run_model(name: str, args, copy_bw: float | None, device: torch.device) -> dict:
    """The ``model`` row of one config: layers kept, then decode at each of :data:`BATCHES`, verify of a
    :data:`TREE`-node tree at B = 1 and a prefill, each checked and (on a GPU) timed against its floor."""
    from lumotree.optimized.model import OptimizedModel, random_weights

    config, source = model_config(name)
    release(device)
    dtype = torch.float32 if args.check_only else torch.bfloat16
    free = torch.cuda.mem_get_info(device)[0] if device.type == "cuda" else 1 << 40
    kept = layers_that_fit(config, free, int(args.reserve_gib * 2**30))
    cut = config.replace(num_hidden_layers=kept, layer_types=config.layer_types[:kept])
    t0 = time.perf_counter()
    weights = random_weights(cut, seed=0, device=device, dtype=dtype)
    model = OptimizedModel(cut, weights, num_slots=max(BATCHES), max_seq_len=args.context + 2 * args.steps + 64,
                           max_nodes=TREE, device=device, dtype=dtype)
    row = dict(part="model", model=name, config=source, layers=kept, depth=config.num_hidden_layers,
               experts=config.num_experts, top_k=config.num_experts_per_tok, vocab=config.vocab_size,
               build_s=time.perf_counter() - t0)
    row.update(measure_steps(model, args, copy_bw))
    del model, weights
    release(device)
    return row


def measure_steps(model, args, copy_bw: float | None) -> dict:
    """:func:`run_model`'s measurements of one built model (the row's entries by step)."""
    from lumotree.optimized.model import layers as layers_module

    config, row = model.config, {}
    gen = torch.Generator().manual_seed(1)
    tokens = lambda *shape: torch.randint(0, config.vocab_size, shape, generator=gen)  # noqa: E731
    t0 = time.perf_counter()
    for slot in range(model.num_slots):
        model.prefill(slot, tokens(args.context))
    row["prefill_all_s"] = time.perf_counter() - t0
    parents = torch.tensor([[-1] + [int(torch.randint(0, i, (1,), generator=gen)) for i in range(1, TREE)]],
                           dtype=torch.int32)  # [1, TREE] a random tree
    steps = {f"decode B={B}": (B, 1, True, lambda B=B: model.decode(torch.arange(B, dtype=torch.int32), tokens(B),
                                                                    validate=False)) for B in BATCHES}
    steps[f"verify N={TREE}"] = (1, TREE, False, lambda: model.verify(torch.zeros(1, dtype=torch.int32),
                                                                      tokens(1, TREE), parents, validate=False))
    bad = 0
    for label, (B, N, decode, step) in steps.items():
        graphs, model.graphs = model.graphs, False
        with RoutingProbe(layers_module) as probe:  # eager: the routing and the check of every MoE layer
            step()
        model.graphs = graphs
        touched = [t for t, _ in probe.records]
        err = max(e for _, e in probe.records)
        floor = step_floor_bytes(model, B, N, touched, model.cache_length(0), decode)
        entry = dict(B=B, N=N, rel_err=err, ok=err < REL_TOL, touched_mean=sum(touched) / len(touched),
                     floor_bytes=floor, context=model.cache_length(0))
        bad += not entry["ok"]
        if copy_bw is not None:
            step()  # compile and capture
            entry["us"] = events_us(step, args.steps)
            entry["floor_us"] = sum(floor.values()) / copy_bw * 1e6
            entry["experts_floor_us"] = floor["experts"] / copy_bw * 1e6
            entry["x_floor"] = entry["us"] / entry["floor_us"]
        row[label] = entry
    if copy_bw is not None:
        prompt = tokens(args.context)
        model.prefill(0, prompt)
        us = events_us(lambda: model.prefill(0, prompt), 3)
        row["prefill"] = dict(tokens=args.context, us=us, tokens_per_s=args.context / us * 1e6)
    row["bad"] = bad
    return row


def release(device: torch.device) -> None:
    """Hand the memory of what is no longer referenced back to the device (the next model measures what is free)."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


# ------------------------------------------------------------------------------------------------ tables
def model_table(rows: list[dict]) -> str:
    """Markdown: one line per model step (``x floor``: time / the whole step's floor; ``x experts``: time / the
    floor of its routed experts' bytes alone)."""
    head = ["model", "layers", "step", "us", "floor us", "x floor", "experts floor us", "x experts",
            "experts read / layer", "rel err"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        where = f"| {r['model']} | {r['layers']} of {r['depth']} |"
        for label in [k for k in r if k.startswith(("decode", "verify"))]:
            e = r[label]
            us = lambda key: f"{e[key]:.0f}" if key in e else "-"  # noqa: E731
            xf = f"{e['x_floor']:.2f}" if "x_floor" in e else "-"
            xe = f"{e['us'] / e['experts_floor_us']:.2f}" if "us" in e and e["experts_floor_us"] > 0 else "-"
            lines.append(f"{where} {label} | {us('us')} | {us('floor_us')} | {xf} | {us('experts_floor_us')} | {xe} | "
                         f"{e['touched_mean']:.1f} | {e['rel_err']:.1e} |")
        if "prefill" in r:
            p = r["prefill"]
            lines.append(f"{where} prefill {p['tokens']} ({p['tokens_per_s']:.0f} tok/s) | {p['us']:.0f} |"
                         + " - |" * 6)
    return "\n".join(lines)


def block_table(rows: list[dict]) -> str:
    """Markdown: one line per MoE block case."""
    lines = ["| model | T | ours us | floor us | x floor | dense us | gather us | loop us | rel err ours |",
             "|" + "---|" * 9]

    def us(entry: dict) -> str:
        return f"{entry['us']:.1f}" if "us" in entry else "-"

    for r in rows:
        xf = f"{r['ours']['x_floor']:.2f}" if "x_floor" in r["ours"] else "-"
        lines.append(f"| {r['model']} | {r['T']} | {us(r['ours'])} | {us(r['floor'])} | {xf} | {us(r['dense'])} | "
                     f"{us(r['gather'])} | {us(r['loop'])} | {r['ours']['rel_err']:.1e} |")
    return "\n".join(lines)


def tables(result: dict) -> str:
    """The docs' tables of a saved run (``--table``)."""
    head = (f"{result['card']}, copy {result['copy_TBps']:.2f} TB/s (read + written), torch {result['torch']}, "
            f"triton {result['triton']}, {result['date']}: `{result['command']}`")
    models = [r for r in result["rows"] if r["part"] == "model"]
    blocks = [r for r in result["rows"] if r["part"] == "block"]
    return "\n\n".join([head] + ([model_table(models)] if models else []) + ([block_table(blocks)] if blocks else []))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    ap.add_argument("--parts", nargs="+", default=["model", "block"], choices=["model", "block"])
    ap.add_argument("--tokens", nargs="+", type=int, default=TOKENS, help=f"block: values of T (default {TOKENS})")
    ap.add_argument("--calls", type=int, default=8, help="block: calls per CUDA graph, each on its own input")
    ap.add_argument("--max-gib", type=float, default=16.0, help="block: largest intermediates of the torch variants")
    ap.add_argument("--sweep", action="store_true", help="block: also time the launches of SWEEP")
    ap.add_argument("--reserve-gib", type=float, default=6.0, help="model: device memory kept free of weights")
    ap.add_argument("--context", type=int, default=128, help="model: prompt tokens in each slot")
    ap.add_argument("--steps", type=int, default=20, help="model: timed back-to-back calls per step shape")
    ap.add_argument("--check-only", action="store_true", help="tiny fp32 config, checks only (CPU: interpreter)")
    ap.add_argument("--table", metavar="JSON", help="print the tables of a saved run and exit")
    ap.add_argument("--out", default="bench/baselines/moe.json", help="the JSON written after a timed run")
    args = ap.parse_args(argv)
    if args.table:
        with open(args.table) as fh:
            print(tables(json.load(fh)))
        return 0
    cuda = torch.cuda.is_available()
    if args.check_only and not cuda:
        os.environ.setdefault("TRITON_INTERPRET", "1")  # before the kernels are imported
    elif not cuda:
        raise SystemExit("bench/moe.py needs a CUDA GPU (or --check-only)")
    import triton

    device = torch.device("cuda" if cuda else "cpu")
    names = ["tiny"] if args.check_only else args.models
    if args.check_only:
        args.tokens, args.calls, args.steps, args.context = [1, 3, 17], 2, 1, 8
    from lumotree.optimized.engine.e2e import copy_bandwidth

    copy_bw = None if args.check_only else copy_bandwidth(device)
    if copy_bw is not None:
        print(f"{torch.cuda.get_device_name(device)}: copy {copy_bw / 1e12:.2f} TB/s (read + written), torch "
              f"{torch.__version__}, triton {triton.__version__}", flush=True)
    start, rows = time.perf_counter(), []
    for name in names:
        if "model" in args.parts:
            rows.append(run_model(name, args, copy_bw, device))
            print(model_table(rows[-1:]), flush=True)
        if "block" in args.parts:
            shape = block_shape(model_config(name)[0])
            for T in args.tokens:
                rows.append(dict(part="block", **run_case(name, shape, T, args, copy_bw, device)))
            print(block_table([r for r in rows if r["part"] == "block" and r["model"] == name]), flush=True)
    bad = sum(r["bad"] for r in rows)
    print(f"{bad} results above rel err {REL_TOL}; {time.perf_counter() - start:.0f} s")
    if not args.check_only:
        result = dict(card=torch.cuda.get_device_name(device), date=datetime.date.today().isoformat(),
                      torch=torch.__version__, triton=triton.__version__, dtype="bf16", copy_TBps=copy_bw / 1e12,
                      command="python bench/moe.py " + " ".join(sys.argv[1:] if argv is None else argv), rows=rows)
        result["tables"] = tables(result)
        with open(args.out, "w") as fh:
            json.dump(result, fh, indent=1)
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
