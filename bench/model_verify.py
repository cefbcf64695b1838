"""Benchmark: whole-model tree verify (N nodes) against the same model's single-token decode step, one GPU.

Model (random weights, bf16, Qwen3-Next shapes with fewer layers and a dense MLP so it fits one H200 next to its
pools; the same size as the transformers peer of DESIGN.md §7): hidden 2048, 24 layers (18 GDN + 6 gated attention,
every 4th), attention 16 q / 2 kv heads x 256 (rotary 64, theta 1e7), GDN 16 q/k heads, 32 value heads, K = V = 128,
conv 4, dense SwiGLU MLP 5632, vocabulary 151936 (2.2 B parameters, 4.4 GB of bf16 weights).

For each batch B and committed context length L: the pools are filled with random values and every request's length
set to L (a prefill of that length would only be slower to set up; one short real prefill runs first as a check).
CUDA-graph replays are timed with ``triton.testing.do_bench`` (median):

- ``decode_us``: one decode step (tree step on one-node trees + commit of the root), all layers, logits;
- ``verify_us``: verify of one random N-node tree per request (logits of every node);
- ``commit_us``: commit of an accepted path (depth ~4) after that verify;
- ``weights_floor_us``: reading all weights once (embedding table included, as in the first run) at the copy
  bandwidth measured in the same run; ``decode_floor_us``: the bytes a decode step must move — the matmul weights
  (everything but the embedding table, of which one row is read) once, every request's GDN state read and written,
  conv state read and written, and its KV cache read — at the same rate (issue 7's "weight + state read floor");
  ``verify_flop_floor_us``: the projection/MLP/LM-head matrix work of B * N tokens at the measured bf16 rate.
- ``--profile``: per-kernel GPU time of one eager decode step, one eager verify and its commit per tree size of
  ``--profile-nodes`` (torch profiler), top kernels by time, at the first B and L.

Writes JSON (``--out``) and prints a table. Run: ``python bench/model_verify.py --out m.json``.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
import torch
import triton

from lumotree.reference.tree import random_parents
from lumotree.optimized import model as om
from lumotree.reference.config import HybridConfig

CONFIG = dict(vocab_size=151936, hidden_size=2048, intermediate_size=5632, num_hidden_layers=24,
              num_attention_heads=16, num_key_value_heads=2, head_dim=256, partial_rotary_factor=0.25,
              rope_theta=10_000_000.0, linear_key_head_dim=128, linear_value_head_dim=128, linear_num_key_heads=16,
              linear_num_value_heads=32, linear_conv_kernel_dim=4, num_experts=0)




def bench(fn, rep_ms: int = 100) -> float:
    return triton.testing.do_bench(fn, warmup=20, rep=rep_ms, return_mode="median") * 1e3


def fill_pools(model: om.OptimizedModel, length: int) -> None:
    """Random (non-zero) states and caches, every slot at committed length ``length``."""
    for pool in (*model.state_pools, *model.conv_pools):
        pool.normal_(0.0, 0.1)
    for pool in (*model.k_pools, *model.v_pools):
        pool.normal_()
    set_lengths(model, length)


SEQUENCE_KERNELS = 60  # launches of each profiled step listed in issue order


def set_lengths(model: om.OptimizedModel, length: int) -> None:
    """Every slot at committed length ``length`` (device and host; earlier commits' advances dropped)."""
    model._settle_lengths()
    model.lens.fill_(length)
    model._host_lens = [length] * model.num_slots


def profile_steps(model: om.OptimizedModel, B: int, L: int, node_counts: list[int], rng: np.random.Generator
                  ) -> dict:
    """GPU time per kernel name of one eager decode step, one eager verify per tree size in ``node_counts`` and the
    eager commit of an accepted node at depth ~4 after each verify (each after a warm-up of the same call)."""
    from torch.profiler import ProfilerActivity, profile

    dev = model.device
    slots = torch.arange(B, dtype=torch.int32, device=dev)
    steps = {"decode": lambda: model._decode_step(torch.tensor(rng.integers(0, model.vocab_size, B), device=dev),
                                                  slots)}
    for N in node_counts:
        parents = torch.tensor([random_parents(N, rng)] * B, dtype=torch.int32, device=dev)
        tokens = torch.tensor(rng.integers(0, model.vocab_size, (B, N)), device=dev)
        num_nodes = torch.full((B,), N, dtype=torch.int32, device=dev)
        accepted = torch.full((B,), min(N - 1, 4), dtype=torch.int32, device=dev)
        records: list = []

        def verify(tokens=tokens, parents=parents, num_nodes=num_nodes, records=records):
            records[:] = [model._step(tokens, slots, parents, num_nodes)]

        steps[f"verify_N{N}"] = verify
        steps[f"commit_N{N}"] = lambda records=records, accepted=accepted: model._commit(records[0], accepted)
    out = {}
    for name, fn in steps.items():
        for _ in range(2):  # a warm-up call, then the profiled one, both from the same pool contents
            fill_pools(model, L)
            if name.startswith("commit"):  # its verify's record, made again on the refilled pools
                steps["verify" + name[len("commit"):]]()
            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                fn()
                torch.cuda.synchronize()
        table = []
        for evt in prof.key_averages():
            us = getattr(evt, "self_device_time_total", None)
            if us is None:
                us = evt.self_cuda_time_total
            if us > 0:
                table.append({"name": evt.key, "us": float(us), "count": int(evt.count)})
        table.sort(key=lambda r: -r["us"])
        # the first launches in issue order (one GDN layer, one attention layer and more): which call costs what
        try:
            kernels = sorted((e for e in prof.events()
                              if getattr(e, "device_type", None) == torch.autograd.DeviceType.CUDA),
                             key=lambda e: e.time_range.start)
            sequence = [{"name": e.name[:60], "us": float(e.time_range.elapsed_us())}
                        for e in kernels[:SEQUENCE_KERNELS]]
        except Exception as e:  # pragma: no cover - a profiler API difference: reported, not hidden
            sequence = [{"name": "error " + repr(e)[:80], "us": 0.0}]
        out[name] = {"kernels": sum(r["count"] for r in table), "kernel_us": sum(r["us"] for r in table),
                     "top": table[:25], "sequence": sequence}
    fill_pools(model, L)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="model_verify_bench.json")
    ap.add_argument("--B", type=int, nargs="*", default=[1, 16])
    ap.add_argument("--L", type=int, nargs="*", default=[1024, 8192])
    ap.add_argument("--N", type=int, default=64)
    ap.add_argument("--compile-only", action="store_true", help="run each step once eagerly (warm the Triton cache)")
    ap.add_argument("--profile", action="store_true", help="per-kernel times of one eager decode, verify, commit")
    ap.add_argument("--profile-nodes", type=int, nargs="*", default=None,
                    help="tree sizes of the profiled verifies and commits (default: --N)")
    ap.add_argument("--gdn-precisions", nargs="+", default=["ieee"], choices=["ieee", "tf32x3", "tf32"],
                    help="verify/commit GDN precision; the first is the row's verify_us, each gets verify_us_<name>")
    ap.add_argument("--linear", choices=["gemv", "cublas"], default="gemv",
                    help="projections of steps with <= 8 token rows: the split-K GEMV (the model's GPU default) or cuBLAS")
    ap.add_argument("--pdl", choices=["on", "off", "both"], default="on",
                    help="the GEMV as a programmatic dependent launch; both: the decode step timed each way (the "
                         "row's decode_us is the first, 'on')")
    ap.add_argument("--gemv-rows", type=int, default=0,
                    help="also route every projection of steps with at most this many token rows (tree steps: "
                         "B * N) to the GEMV, with the residual add + RMSNorm fused into it (an A / B knob of this "
                         "bench: the model's own rule is gemv.preferred)")
    ap.add_argument("--pdl-trigger", choices=["auto", "early", "late"], default="auto",
                    help="a PDL-launched GEMV signals the next kernel before (early) or after (late) its wait for "
                         "the previous one; auto: the library's rule (gemv.EARLY_TRIGGER_MAX_ROWS; an A / B knob)")
    ap.add_argument("--gdn-pdl", choices=["on", "off"], default="on",
                    help="the fused GDN verify kernel launched with PDL where its config asks for it, S0 "
                         "prefetched before its wait (model.GDN_VERIFY_PDL; an A / B knob)")
    ap.add_argument("--attention-pdl", choices=["auto", "off"], default="auto",
                    help="tree attention launched with PDL, the committed K / V prefetched before its wait: the "
                         "library's rule (auto, model.ATTENTION_PDL_MAX_BATCH) or never (an A / B knob)")
    ap.add_argument("--gdn-gate", choices=["on", "off"], default="on",
                    help="a tree step's gated RMSNorm split between the GDN verify kernel and the w_out GEMV "
                         "(model.GDN_GATE_IN_GEMV) or its own launch (off; an A / B knob)")
    ap.add_argument("--segment-warps", type=int, default=0,
                    help="warps of the w_out GEMV with the per-head norm factors (gemv.SEGMENT_NORM_WARPS; 0: the "
                         "library's default; an A / B knob)")
    args = ap.parse_args()
    from lumotree.optimized import gemv as G
    from lumotree.optimized import model as model_module

    model_module.GDN_VERIFY_PDL = args.gdn_pdl == "on"
    model_module.GDN_GATE_IN_GEMV = args.gdn_gate == "on"
    if args.segment_warps:
        G.SEGMENT_NORM_WARPS = args.segment_warps
    if args.attention_pdl == "off":
        model_module.ATTENTION_PDL_MAX_BATCH = 0

    G.PDL_EARLY_TRIGGER = None if args.pdl_trigger == "auto" else args.pdl_trigger == "early"
    if args.gemv_rows:
        rule = om.gemv_preferred
        om.gemv_preferred = lambda M, N: rule(M, N) or M <= args.gemv_rows
    dev = torch.device("cuda")
    x = torch.empty(1024**3, dtype=torch.bfloat16, device=dev).normal_()
    y = torch.empty_like(x)
    bw = 4 * x.numel() / (bench(lambda: y.copy_(x)) * 1e-6)
    del x, y
    a = torch.randn(8192, 8192, dtype=torch.bfloat16, device=dev)
    flops = 2 * 8192**3 / (bench(lambda: a @ a) * 1e-6)
    del a
    config = HybridConfig(**CONFIG)
    max_b, max_l = max(args.B), max(args.L)
    t0 = time.time()
    model = om.build_random(config, seed=0, num_slots=max_b, max_seq_len=max_l + 4096, max_nodes=args.N,
                            device=dev, small_batch_linear=args.linear == "gemv",
                            pdl=args.pdl != "off")
    params = sum(t.numel() for t in [model.embed, model.lm_head] +
                 [w for layer in model.layers for w in vars(layer).values()] +
                 [w for m in model.mlps for w in vars(m).values() if isinstance(w, torch.Tensor)])
    weight_bytes = 2 * params
    # the projection, MLP and LM-head matmuls per token (2 flops per weight, embeddings are a gather)
    matmul_params = params - model.embed.numel()
    print(f"{torch.cuda.get_device_name()}  bw {bw / 1e12:.2f} TB/s  bf16 {flops / 1e12:.0f} TFLOP/s  "
          f"params {params / 1e9:.2f} B  build {time.time() - t0:.1f}s", flush=True)

    # a real prefill first, as a sanity check of the whole path (chunks of N tokens through verify + commit)
    rng = np.random.default_rng(0)
    logits = model.prefill(0, rng.integers(0, config.vocab_size, 3 * args.N + 5).tolist())
    assert torch.isfinite(logits).all(), "prefill produced non-finite logits"

    if args.compile_only:
        for B in args.B:
            fill_pools(model, min(args.L))
            slots = torch.arange(B, dtype=torch.int32, device=dev)
            parents = torch.tensor([random_parents(args.N, rng) for _ in range(B)], dtype=torch.int32, device=dev)
            model._decode_step(torch.tensor(rng.integers(0, config.vocab_size, B), device=dev), slots)
            for prec in args.gdn_precisions:
                model.gdn_precision = prec
                rec = model._step(torch.tensor(rng.integers(0, config.vocab_size, (B, args.N)), device=dev), slots,
                                  parents, torch.full((B,), args.N, dtype=torch.int32, device=dev))
                model._commit(rec, torch.full((B,), 3, dtype=torch.int32, device=dev))
        torch.cuda.synchronize()
        return 0
    H, HV, K, V, W = model._gdn_dims
    HQ, HKV, D = model._attn_dims
    n_gdn, n_attn = len(model.state_pools), len(model.k_pools)
    state_bytes = n_gdn * (2 * HV * K * V * 4 + 2 * (W - 1) * (2 * H * K + HV * V) * 4)  # per request, read + write
    rows = []
    for B in args.B:
        for L in args.L:
            fill_pools(model, L)
            slots = torch.arange(B, dtype=torch.int32, device=dev)
            tokens1 = torch.tensor(rng.integers(0, config.vocab_size, B), device=dev)
            parents = torch.tensor([random_parents(args.N, rng) for _ in range(B)], dtype=torch.int32, device=dev)
            tokens = torch.tensor(rng.integers(0, config.vocab_size, (B, args.N)), device=dev)
            depth = [0] * args.N
            for i in range(1, args.N):
                depth[i] = depth[int(parents[0, i])] + 1
            accepted_node = min(range(args.N), key=lambda i: (abs(depth[i] - 4), i))  # a node at depth ~4
            accepted = torch.full((B,), accepted_node, dtype=torch.int32, device=dev)
            for b in range(B):  # the same depth-4 node index for every request: give all trees request 0's shape
                parents[b] = parents[0]

            decode_variants = {}
            for pdl in ([True, False] if args.pdl == "both" else [args.pdl != "off"]):
                model.set_small_batch_linear(model.small_batch_linear, pdl=pdl)
                model.decode(slots, tokens1)  # eager + capture
                model.decode(slots, tokens1)  # replay
                dec_graph = model._graph_entries[("decode", B)]["graph"]
                model.lens.fill_(L)
                decode_variants[f"decode_us_pdl_{'on' if pdl else 'off'}"] = bench(dec_graph.replay)
            model.set_small_batch_linear(model.small_batch_linear, pdl=args.pdl != "off")
            decode_us = next(iter(decode_variants.values()))
            set_lengths(model, L)
            variants = {}
            for prec in args.gdn_precisions:
                model.gdn_precision = prec
                model._graph_entries.clear()  # graphs of the other precision
                model.verify(slots, tokens, parents)  # eager + capture
                model.commit(slots, accepted)
                set_lengths(model, L)
                model.verify(slots, tokens, parents)  # replay: the record now lives in the graph
                model.commit(slots, accepted)  # capture + replay of the commit graph
                ver_graph = model._graph_entries[("verify", B, args.N)]["graph"]
                com_graph = model._graph_entries[("commit", B, args.N)]["graph"]
                model.lens.fill_(L)
                variants[f"verify_us_{prec}"] = bench(ver_graph.replay)
                variants[f"commit_us_{prec}"] = bench(com_graph.replay, rep_ms=50)  # advances the lengths
                set_lengths(model, L)
            model.gdn_precision = args.gdn_precisions[0]
            model._graph_entries.clear()
            verify_us = variants[f"verify_us_{args.gdn_precisions[0]}"]
            commit_us = variants[f"commit_us_{args.gdn_precisions[0]}"]
            row = {
                "B": B, "L": L, "N": args.N, "decode_us": decode_us, **decode_variants, "verify_us": verify_us,
                "commit_us": commit_us,
                **variants, "gdn_precision": args.gdn_precisions[0],
                "ratio_verify_vs_decode": verify_us / decode_us,
                "ratio_verify_commit_vs_decode": (verify_us + commit_us) / decode_us,
                "weights_floor_us": weight_bytes / bw * 1e6,  # as the anchors: bytes over the copy rate
                "decode_floor_us": (2 * matmul_params + B * (state_bytes + n_attn * 2 * HKV * L * D * 2)) / bw * 1e6,
                "verify_flop_floor_us": 2 * matmul_params * B * args.N / flops * 1e6,
                "decode_flop_floor_us": 2 * matmul_params * B / flops * 1e6,
            }
            rows.append(row)
            print(json.dumps(row), flush=True)
    result = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
              "copy_bw": bw, "bf16_flops": flops, "params": params, "config": CONFIG, "fla": model.use_fla,
              "linear": args.linear, "pdl": args.pdl, "gemv_rows": args.gemv_rows,
              "pdl_trigger": args.pdl_trigger, "gdn_pdl": args.gdn_pdl, "attention_pdl": args.attention_pdl,
              "gdn_gate": args.gdn_gate, "segment_warps": args.segment_warps or None,
              "rows": rows}
    with open(args.out, "w") as f:  # written before the profile too: the timings survive a profiler failure
        json.dump(result, f, indent=1)
    if args.profile:
        try:
            result["profile"] = profile_steps(model, args.B[0], args.L[0], args.profile_nodes or [args.N], rng)
        except Exception as e:  # pragma: no cover - reported, not hidden
            result["profile"] = {"error": repr(e)}
            print("profile failed:", repr(e))
        for name, prof in result["profile"].items():
            if name == "error":
                continue
            print(f"{name}: {prof['kernels']} kernels, {prof['kernel_us']:.0f} us of kernel time")
            for row in prof["top"][:12]:
                print(f"   {row['us']:8.1f} us  x{row['count']:<4} {row['name'][:90]}")
            if name.startswith("verify"):
                print("   in issue order: " + ", ".join(f"{k['name'][:14]} {k['us']:.1f}" for k in prof["sequence"]))
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    for r in rows:
        print(f"B={r['B']} L={r['L']}: " + "  ".join(f"{k} {v:.1f}" for k, v in r.items()
                                                      if k.startswith(("verify_us_", "commit_us_"))))
    print(f"{'B':>4} {'L':>6} {'N':>4} {'decode':>9} {'verify':>9} {'commit':>8} {'x_ver':>6} {'x_v+c':>6} "
          f"{'w_floor':>8} {'d_floor':>8} {'x_dfl':>6} {'vflop':>8}")
    for r in rows:
        print(f"{r['B']:>4} {r['L']:>6} {r['N']:>4} {r['decode_us']:>9.1f} {r['verify_us']:>9.1f} "
              f"{r['commit_us']:>8.1f} {r['ratio_verify_vs_decode']:>6.2f} {r['ratio_verify_commit_vs_decode']:>6.2f} "
              f"{r['weights_floor_us']:>8.1f} {r['decode_floor_us']:>8.1f} {r['decode_us'] / r['decode_floor_us']:>6.2f} "
              f"{r['verify_flop_floor_us']:>8.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
