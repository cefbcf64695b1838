"""Block-FP8 weights against bf16 on the decode step (B = 1): ``python bench/fp8.py --out bench/baselines/fp8.json``.

Model: transformers' ``Qwen3_5TextConfig`` defaults (``qwen3_5_text``: hidden 4096, 32 layers, 3 GDN + 1 gated
attention per 4, dense SwiGLU MLP 12288, vocabulary 248320), full depth unless ``--layers`` says fewer, random
weights drawn on the GPU. The same weights run twice in one process, on the same card:

1. bf16: every weight bf16 (the streamed checkpoint's serving dtype);
2. FP8: every projection (GDN ``w_in`` / ``w_out``, attention ``w_qkv`` / ``w_o``, MLP gate | up and down)
   quantised to block FP8 on the device (:meth:`lumotree.optimized.ops.gemv.Fp8Weight.quantize`, 128 x 128 blocks,
   what a release stores), the embedding, the norms and the LM head kept bf16, as the releases ship them.

For each: the decode step's CUDA-graph replay alone at B = 1 (median of ``triton.testing.do_bench``, the committed
length put back after each replay), the bytes the step must read (weights it multiplies by, the LM head, the GDN
states and the KV cache of the prompt) and their floor at the copy bandwidth measured in the same run. Target: FP8
step <= 0.65 x bf16 step. Also, per projection shape at M = 1: ``small_batch_linear`` bf16 against FP8 (default
launch and a small sweep of the broadcast form's tiles), each checked against the dequantised weight's fp32 product.
The MoE types are not measured here: their expert products move to the routed MoE kernel.

Exit status 1 if a result is above the error tolerance. Run (GPU only, about 2 minutes on an H100):
``PYTHONPATH=$PWD python bench/fp8.py --out bench/baselines/fp8.json``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time

import torch
import triton.testing

from lumotree.optimized.engine.e2e import copy_bandwidth
from lumotree.optimized.model import OptimizedModel, random_tensors
from lumotree.optimized.model.weights import AttentionLayerWeights, GDNLayerWeights, ModelWeights
from lumotree.optimized.ops import gemv as G
from lumotree.reference.config import HybridConfig

TARGET = 0.65
REL_TOL = 2e-2
SUM_TILES = [(8, 512, 1), (16, 512, 1), (16, 256, 1), (32, 256, 1), (8, 1024, 1), (16, 1024, 1), (8, 512, 2),
             (16, 512, 2), (8, 1024, 4), (16, 256, 4)]  # (block_n, block_k, split_k), 4 warps, broadcast + sum


def quantised(weights: ModelWeights) -> ModelWeights:
    """The weights with every projection in block FP8 (embedding, norms, head: as they are)."""
    q = G.Fp8Weight.quantize
    layers = [dataclasses.replace(w, w_in=q(w.w_in), w_out=q(w.w_out)) if isinstance(w, GDNLayerWeights)
              else dataclasses.replace(w, w_qkv=q(w.w_qkv), w_o=q(w.w_o)) for w in weights.layers]
    mlps = [dataclasses.replace(m, w_gate_up=q(m.w_gate_up), w_down=q(m.w_down)) for m in weights.mlps]
    return dataclasses.replace(weights, layers=layers, mlps=mlps)


def step_bytes(weights: ModelWeights, config: HybridConfig, prompt: int) -> int:
    """Bytes a B = 1 decode step reads: the projections, the head, one embedding row, GDN states (fp32, read and
    written) and the attention KV cache of ``prompt`` tokens (bf16)."""
    def size(w) -> int:
        if isinstance(w, G.Fp8Weight):
            return w.weight.numel() + w.scale.numel() * 4 + w.scale_rows.numel() * 4
        return w.numel() * w.element_size()

    total = size(weights.lm_head) + weights.embed.shape[1] * 2
    for layer, m in zip(weights.layers, weights.mlps):
        mats = (layer.w_in, layer.w_out) if isinstance(layer, GDNLayerWeights) else (layer.w_qkv, layer.w_o)
        total += sum(size(w) for w in (*mats, m.w_gate_up, m.w_down))
        if isinstance(layer, GDNLayerWeights):
            total += 2 * config.linear_num_value_heads * config.linear_key_head_dim * config.linear_value_head_dim * 4
        elif isinstance(layer, AttentionLayerWeights):
            total += 2 * prompt * config.num_key_value_heads * config.head_dim * 2
    return total


def decode_ms(model: OptimizedModel, prompt: int) -> float:
    gen = torch.Generator().manual_seed(7)
    model.prefill(0, torch.randint(model.vocab_size, (prompt,), generator=gen).tolist())
    slots = torch.zeros(1, dtype=torch.int32, device="cuda")  # [1]
    tokens = torch.randint(model.vocab_size, (1,), generator=gen).cuda()  # [1]
    model.decode(slots, tokens, validate=False)  # compiles
    model.decode(slots, tokens, validate=False)  # captures
    graph = model.captured_graph(("decode", 1))
    committed = model.lens.index_select(0, slots.long()).clone()  # [1]

    def replay() -> None:
        graph.replay()
        model.lens.index_copy_(0, slots.long(), committed)

    ms = float(triton.testing.do_bench(replay, warmup=10, rep=100, return_mode="median"))
    model.release(0)
    return ms


def projection_table(weights: ModelWeights, fp8: ModelWeights, budget_s: float) -> tuple[list[dict], bool]:
    """Per distinct projection shape at M = 1: bf16 and FP8 GEMV times (us) and errors; the FP8 sweep's best."""
    shapes: dict[tuple[int, int], tuple] = {}
    for layer, m, ql, qm in zip(weights.layers, weights.mlps, fp8.layers, fp8.mlps):
        names = ("w_in", "w_out") if isinstance(layer, GDNLayerWeights) else ("w_qkv", "w_o")
        for name in names:
            shapes.setdefault(tuple(getattr(layer, name).shape), (name, getattr(layer, name), getattr(ql, name)))
        shapes.setdefault(tuple(m.w_down.shape), ("w_down", m.w_down, qm.w_down))
        shapes.setdefault(tuple(m.w_gate_up.shape), ("w_gate_up", m.w_gate_up, qm.w_gate_up))
    rows, ok, start = [], True, time.perf_counter()
    for (N, K), (name, w16, w8) in shapes.items():
        x = torch.randn(1, K, device="cuda").bfloat16()  # [1, K]
        ref = x.float() @ w8.dequantize().T
        ref16 = x.float() @ w16.float().T

        def timed(w, config=None, want=ref):
            y = G.small_batch_linear(x, w, config=config)
            err = float((y.float() - want).norm() / want.norm())
            us = 1e3 * triton.testing.do_bench(lambda: G.small_batch_linear(x, w, config=config), warmup=5, rep=30,
                                               return_mode="median")
            return us, err

        bf16_us, bf16_err = timed(w16, want=ref16)
        fp8_us, fp8_err = timed(w8)
        row = dict(name=name, shape=[N, K], bf16_us=bf16_us, fp8_us=fp8_us, ratio=fp8_us / bf16_us,
                   bf16_err=bf16_err, fp8_err=fp8_err, sweep=[])
        for bn, bk, sk in SUM_TILES:
            if time.perf_counter() - start > budget_s:
                break
            us, err = timed(w8, G.GemvConfig(bn, bk, sk, 4, 1))
            row["sweep"].append(dict(block_n=bn, block_k=bk, split_k=sk, us=us, err=err))
            ok &= err < REL_TOL
        ok &= bf16_err < REL_TOL and fp8_err < REL_TOL
        rows.append(row)
        print(f"  {name:10s} [{N}, {K}]: bf16 {bf16_us:7.1f} us, fp8 {fp8_us:7.1f} us ({fp8_us / bf16_us:.2f}x)"
              + (f", best tile {min(row['sweep'], key=lambda r: r['us'])}" if row["sweep"] else ""), file=sys.stderr)
    return rows, ok


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=None, help="decoder layers kept (default: all 32)")
    parser.add_argument("--prompt", type=int, default=128, help="prompt tokens before the timed decode step")
    parser.add_argument("--sweep-s", type=float, default=40.0, help="seconds for the FP8 tile sweep")
    parser.add_argument("--out", default=None, help="JSON file to write")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench/fp8.py needs a CUDA GPU", file=sys.stderr)
        return 2
    start = time.perf_counter()
    config = HybridConfig.from_dict({"model_type": "qwen3_5_text"})
    if args.layers is not None:
        config = config.replace(num_hidden_layers=args.layers, layer_types=config.layer_types[: args.layers])
    bandwidth = copy_bandwidth(torch.device("cuda"))
    common = dict(num_slots=1, max_seq_len=args.prompt + 64, max_nodes=16, device="cuda", dtype=torch.bfloat16)
    model = OptimizedModel(config, random_tensors(config, 0, "cuda", torch.bfloat16), **common)
    bf16_bytes = step_bytes(model.weights, config, args.prompt)
    bf16_ms = decode_ms(model, args.prompt)
    print(f"bf16 decode step B=1: {bf16_ms:.3f} ms ({bf16_bytes / 1e9:.2f} GB)", file=sys.stderr)
    fp8_weights = quantised(model.weights)
    rows, ok = projection_table(model.weights, fp8_weights, args.sweep_s)
    del model
    torch.cuda.empty_cache()
    fp8_model = OptimizedModel(config, fp8_weights, **common)
    fp8_bytes = step_bytes(fp8_weights, config, args.prompt)
    fp8_ms = decode_ms(fp8_model, args.prompt)
    ratio = fp8_ms / bf16_ms
    print(f"fp8 decode step B=1: {fp8_ms:.3f} ms ({fp8_bytes / 1e9:.2f} GB): {ratio:.3f}x bf16 (target <= {TARGET})",
          file=sys.stderr)
    summary = dict(
        device=torch.cuda.get_device_name(), config="qwen3_5_text defaults", layers=config.num_hidden_layers,
        prompt=args.prompt, copy_bandwidth_gbs=bandwidth / 1e9,
        bf16=dict(step_ms=bf16_ms, bytes=bf16_bytes, floor_ms=1e3 * bf16_bytes / bandwidth),
        fp8=dict(step_ms=fp8_ms, bytes=fp8_bytes, floor_ms=1e3 * fp8_bytes / bandwidth),
        ratio=ratio, target=TARGET, meets_target=ratio <= TARGET, projections=rows,
        seconds=time.perf_counter() - start,
    )
    if args.out:
        with open(args.out, "w") as f:
            json.dump(summary, f, indent=2)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
