"""Probes (GPU) of the bench model's (bench/model_verify.py's config) steps at B = 1, CUDA-graph replays:

- ``pdl``: the decode step with the GEMV launched plainly, as a programmatic dependent launch (``optimized.pdl``),
  and with PDL and the residual add + RMSNorm fused into the GEMVs (``fused_norms``), median of
  ``triton.testing.do_bench``; the logits of each variant, eager and replayed, compared with the plain launch's
  (the unfused ones bit-identical; for the fused one, which rounds elsewhere, the relative difference and whether
  the argmax agrees are recorded). (The run of 2026-12-01 also timed an L2 prefetch of 1-4 weight tiles per program
  before the wait, with the GEMV of commit 4251649; the prefetch was then removed:
  ``bench/results/2026-12-01b/pdl_probe.json``.)
- ``launch``: host time of ``CUDAGraph.replay()`` (the ``cudaGraphLaunch`` call alone, after a synchronisation) and
  wall time of replay + synchronisation, for the decode graph and the verify and commit graphs at N = 1, 16, 64.
- ``speculate``: where the host time of the engine's fused greedy step goes
  (``OptimizedTarget.speculate_greedy`` at N = 16, 64): each host piece timed alone (padding, pending length
  advances, input packing, the input copy, ``cudaGraphLaunch``, the wait + outcome copy), beside the whole call and
  the graph's replay + synchronisation alone.

- ``fused``: the GEMV forms the decode step uses at one row, alone (CUDA graph of 20 calls over distinct weights,
  bench/gemv.py's timing): the plain GEMV beside ``residual_linear`` (the add + sums of squares in the epilogue) and
  the row factor of the norm (``norm=RowNorm``), per projection shape of the bench model.

- ``sweep``: launch configs of those fused forms at one row (broadcast + sum tiles, K splits), and the GDN decode
  kernel's ``block_v`` at B = 1 (Qwen3-Next shapes, gated norm), each a CUDA graph of 20 calls; prints the best.

- ``sweep_rows``: ``residual_linear`` (the add into the residual in the epilogue, split-K reduced in the launch) at
  16 and 64 rows on the ``[2048, K]`` projections (``tl.dot`` tiles x K splits) against cuBLAS's ``x @ w.T``
  followed by the model's add + RMSNorm kernel.

Run: ``PYTHONPATH=$PWD:$PWD/bench python bench/decode_probe.py --out decode_probe.json``.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
import torch
import triton

from lumotree.optimized import model as om
from lumotree.reference.config import HybridConfig
from lumotree.reference.tree import random_parents

from model_verify import CONFIG, set_lengths  # noqa: E402  (bench/ is the script's directory)


def pdl_rows(model: om.OptimizedModel, L: int) -> list[dict]:
    slots, tokens = torch.zeros(1, dtype=torch.int32), torch.tensor([123])
    pools = [*model.state_pools, *model.conv_pools, *model.k_pools, *model.v_pools]
    for pool in pools:
        pool.normal_(0.0, 0.1)
    saved = [p.clone() for p in pools]

    def restore() -> None:
        for pool, copy in zip(pools, saved):
            pool.copy_(copy)
        set_lengths(model, L)

    rows, reference = [], None
    for name, pdl, fused in (("plain", False, False), ("pdl", True, False), ("pdl+fused-norms", True, True)):
        model.set_small_batch_linear(True, pdl=pdl, fused_norms=fused)
        restore()
        logits = model.decode(slots, tokens).clone()  # the eager run (compiles), then the capture
        graph = model._graph_entries[("decode", 1)]["graph"]

        def replay() -> None:
            graph.replay()
            model.lens.fill_(L)

        us = 1e3 * triton.testing.do_bench(replay, warmup=20, rep=200, return_mode="median")
        restore()
        graph.replay()  # the replay's logits too
        torch.cuda.synchronize()
        same_replay = bool(torch.equal(model._graph_entries[("decode", 1)]["result"], logits))
        same = True if reference is None else bool(torch.equal(logits, reference))
        reference = logits if reference is None else reference
        rel = 0.0 if reference is logits else float((logits - reference).norm() / reference.norm())
        rows.append({"variant": name, "pdl": pdl, "fused_norms": fused, "decode_us": us, "logits_equal_plain": same,
                     "logits_rel_diff_plain": rel,
                     "argmax_equal_plain": bool(torch.equal(logits.argmax(-1), reference.argmax(-1))),
                     "replay_equal_eager": same_replay})
    return rows


def fused_rows(model: om.OptimizedModel, L: int) -> list[dict]:
    from gemv import graph_time_us  # noqa: E402  (bench/)

    from lumotree.optimized import gemv as G

    dev, rows = torch.device("cuda"), []
    gen = torch.Generator(device=dev).manual_seed(0)
    for N, K, form in ((2048, 4096, "residual"), (2048, 5632, "residual"), (11264, 2048, "norm+swiglu"),
                       (12352, 2048, "norm"), (9216, 2048, "norm")):
        copies = max(2, int(120e6 // (2 * N * K)) + 1)
        ws = [(torch.randn(N, K, generator=gen, device=dev) / K**0.5).to(torch.bfloat16) for _ in range(copies)]
        x = torch.randn(1, K, generator=gen, device=dev).to(torch.bfloat16)  # [1, K]
        h = torch.randn(1, N, generator=gen, device=dev).to(torch.bfloat16)  # [1, N] residual (producer forms)
        parts = torch.full((1, 512), float(K) / 512, device=dev)  # [1, 512]: rows of mean square 1
        scale = torch.ones(N, device=dev)  # the next norm's weight (producer forms)
        swiglu = form == "norm+swiglu"  # the gate | up projection, SwiGLU in its epilogue
        variants = {"plain": lambda i: G.small_batch_linear(x, ws[i % copies], swiglu=swiglu, pdl=True)}
        if form.startswith("residual"):
            variants["fused"] = lambda i: G.residual_linear(x, ws[i % copies], h, scale=scale, pdl=True)
        else:
            variants["fused"] = lambda i: G.small_batch_linear(x, ws[i % copies], pdl=True, swiglu=swiglu,
                                                               norm=G.RowNorm(parts, 1e-6))
        row = {"N": N, "K": K, "form": form}
        for name, call in variants.items():
            row[f"{name}_us"] = graph_time_us(call, 20, warmup_ms=5.0, rep_ms=25.0)
        rows.append(row)
        del ws
    return rows


def sweep_rows(model: om.OptimizedModel, L: int) -> list[dict]:
    from gemv import graph_time_us  # noqa: E402  (bench/)

    from lumotree.optimized import gemv as G
    from lumotree.optimized.gdn_decode import gdn_decode

    dev, rows = torch.device("cuda"), []
    gen = torch.Generator(device=dev).manual_seed(0)
    tiles = [(2, 1024, 4), (4, 512, 4), (4, 1024, 4), (8, 256, 4), (8, 512, 4), (16, 256, 4), (16, 512, 8),
             (32, 256, 8)]
    for N, K, form in ((2048, 4096, "residual"), (2048, 5632, "residual"), (11264, 2048, "norm+swiglu"),
                       (12352, 2048, "norm+conv")):
        copies = max(2, int(120e6 // (2 * N * K)) + 1)
        ws = [(torch.randn(N, K, generator=gen, device=dev) / K**0.5).to(torch.bfloat16) for _ in range(copies)]
        x = torch.randn(1, K, generator=gen, device=dev).to(torch.bfloat16)
        h = torch.randn(1, N, generator=gen, device=dev).to(torch.bfloat16)
        scale = torch.ones(N, device=dev)
        conv_w = torch.randn(8192, 4, generator=gen, device=dev).to(torch.bfloat16)
        conv_pool = torch.zeros(2, 3, 8192, device=dev)
        slots = torch.zeros(1, dtype=torch.int32, device=dev)
        default = G.gemv_config(1, N, K, dev)
        best = None
        for bn, bk, warps in tiles:
            for split in ((1,) if form == "norm+conv" else (1, 2, 3, 4, 6, 8)):
                cfg = G.GemvConfig(bn, bk, split, warps, 1)
                if form.startswith("residual"):
                    parts = G.residual_linear(x, ws[0], h, scale=scale, config=cfg).parts
                    call = (lambda i, cfg=cfg: G.residual_linear(x, ws[i % copies], h, scale=scale, pdl=True,
                                                                 config=cfg))
                else:
                    parts = torch.full((1, 512), float(K) / 512, device=dev)
                    conv = G.ConvStep(conv_w, conv_pool, slots) if form == "norm+conv" else None
                    call = (lambda i, cfg=cfg, conv=conv: G.small_batch_linear(
                        x, ws[i % copies], pdl=True, norm=G.RowNorm(parts, 1e-6), conv=conv, config=cfg,
                        swiglu=form == "norm+swiglu", validate=False))
                if parts.shape[1] > G.MAX_NORM_PARTS:
                    continue
                try:
                    us = graph_time_us(call, 20, warmup_ms=3.0, rep_ms=15.0)
                except Exception as e:  # a config that fails to compile is a result too
                    print(form, cfg, repr(e)[:200], flush=True)
                    continue
                row = {"form": form, "N": N, "K": K, "config": list(cfg), "us": us, "default": cfg == default}
                rows.append(row)
                if best is None or us < best["us"]:
                    best = row
        print("best", json.dumps(best), flush=True)
        del ws
    # GDN decode kernel, B = 1, Qwen3-Next GDN shapes, gated norm fused
    H, HV, Kd, V = 16, 32, 128, 128
    pool = torch.randn(4, HV, Kd, V, device=dev) * 0.01
    q, k = (torch.randn(1, H, Kd, device=dev).to(torch.bfloat16) for _ in range(2))
    v, z = (torch.randn(1, HV, V, device=dev).to(torch.bfloat16) for _ in range(2))
    a, b = (torch.randn(1, HV, device=dev).to(torch.bfloat16) for _ in range(2))
    A_log, dt_bias, norm_w = torch.zeros(HV, device=dev), torch.zeros(HV, device=dev), torch.ones(V, device=dev)
    for block_v in (16, 32, 64, 128):
        slot_list = [torch.tensor([i % 4], dtype=torch.int32, device=dev) for i in range(4)]
        call = (lambda i, bv=block_v: gdn_decode(q, k, v, a, b, A_log, dt_bias, pool, slot_list[i % 4], z=z,
                                                  norm_weight=norm_w, block_v=bv, validate=False))
        rows.append({"form": "gdn_decode", "block_v": block_v, "us": graph_time_us(call, 20, 3.0, 15.0)})
    return rows


def sweep_rows_rows(model: om.OptimizedModel, L: int) -> list[dict]:
    from gemv import graph_time_us  # noqa: E402  (bench/)

    from lumotree.optimized import gemv as G

    dev, rows = torch.device("cuda"), []
    gen = torch.Generator(device=dev).manual_seed(0)
    tiles = [(32, 128, 4, 4), (64, 128, 4, 4), (64, 64, 4, 4), (128, 64, 4, 3), (128, 128, 8, 4), (32, 256, 4, 3)]
    norm_w = torch.ones(2048, device=dev)
    for M in (16, 64):
        for N, K in ((2048, 4096), (2048, 5632)):
            copies = max(2, int(120e6 // (2 * N * K)) + 1)
            ws = [(torch.randn(N, K, generator=gen, device=dev) / K**0.5).to(torch.bfloat16) for _ in range(copies)]
            x = torch.randn(M, K, generator=gen, device=dev).to(torch.bfloat16)
            h = torch.randn(M, N, generator=gen, device=dev).to(torch.bfloat16)

            def cublas(i: int) -> None:
                y = x @ ws[i % copies].T
                om._add_rmsnorm(h, y, norm_w, 1e-6)

            row = {"M": M, "N": N, "K": K, "cublas_plus_norm_us": graph_time_us(cublas, 20, 3.0, 15.0)}
            best = None
            for bn, bk, warps, stages in tiles:
                for split in (1, 2, 4, 8, 16):
                    cfg = G.GemvConfig(bn, bk, split, warps, stages, True)
                    call = (lambda i, cfg=cfg: G.residual_linear(x, ws[i % copies], h, scale=norm_w, pdl=True,
                                                                 config=cfg))
                    try:
                        us = graph_time_us(call, 20, 3.0, 15.0)
                    except Exception as e:  # a config that fails to compile is a result too
                        print(M, N, cfg, repr(e)[:160], flush=True)
                        continue
                    if best is None or us < best[1]:
                        best = (list(cfg), us)
            row["residual_best_config"], row["residual_best_us"] = best
            rows.append(row)
            del ws
    return rows


def host_and_wall_ms(graph: torch.cuda.CUDAGraph, reset, repeats: int = 30) -> tuple[float, float]:
    host, wall = [], []
    for _ in range(repeats):
        reset()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        graph.replay()
        t1 = time.perf_counter()
        torch.cuda.synchronize()
        host.append(t1 - t0)
        wall.append(time.perf_counter() - t0)
    return 1e3 * float(np.median(host)), 1e3 * float(np.median(wall))


def launch_rows(model: om.OptimizedModel, L: int) -> list[dict]:
    rng = np.random.default_rng(0)
    slots = torch.zeros(1, dtype=torch.int32)
    reset = lambda: set_lengths(model, L)  # noqa: E731
    rows = []
    reset()
    model.decode(slots, torch.tensor([5]))
    model.decode(slots, torch.tensor([5]))
    host, wall = host_and_wall_ms(model._graph_entries[("decode", 1)]["graph"], reset)
    rows.append({"graph": "decode", "N": 1, "host_launch_ms": host, "wall_ms": wall})
    for N in (1, 16, 64):
        parents = torch.tensor([random_parents(N, rng)], dtype=torch.int32)
        tokens = torch.tensor(rng.integers(0, 1000, (1, N)))
        for _ in range(2):  # eager + capture, then a replay: the commit graph captures on the replayed record
            reset()
            model.verify(slots, tokens, parents, validate=False)
            model.commit(slots, torch.zeros(1, dtype=torch.int32), validate=False)
        for kind in ("verify", "commit"):
            host, wall = host_and_wall_ms(model._graph_entries[(kind, 1, N)]["graph"], reset)
            rows.append({"graph": kind, "N": N, "host_launch_ms": host, "wall_ms": wall})
    return rows


def speculate_rows(model: om.OptimizedModel, L: int, repeats: int = 30) -> list[dict]:
    from lumotree.optimized.engine import OptimizedTarget
    from lumotree.optimized.sampling import TreeBatch, VerifyOutcome

    rng = np.random.default_rng(0)
    target = OptimizedTarget(model, batch_buckets=[1], validate=False)
    slots = torch.zeros(1, dtype=torch.int64)
    rows = []
    for N in (16, 64):
        trees = TreeBatch.pack([rng.integers(0, 1000, N).tolist()], [random_parents(N, rng)])
        for _ in range(2):  # eager + capture, then a replay
            set_lengths(model, L)
            target.speculate_greedy(slots, trees)
        entry = model._graph_entries[("greedy", 1, N)]
        pieces: dict[str, list[float]] = {k: [] for k in ("pad", "settle", "pack_input", "copy_in", "launch",
                                                          "wait_and_copy_out", "whole_call", "graph_alone")}
        for _ in range(repeats):
            set_lengths(model, L)
            torch.cuda.synchronize()
            t = [time.perf_counter()]
            padded, _ = target._padded(slots)
            tokens, parents, num_nodes = target._padded_trees(trees, 1)
            t.append(time.perf_counter())
            model._settle_lengths()
            t.append(time.perf_counter())
            step_in = om._step_input(1, tokens, parents, num_nodes, padded)
            t.append(time.perf_counter())
            entry["static"]["step_in"].copy_(step_in)
            t.append(time.perf_counter())
            entry["graph"].replay()
            t.append(time.perf_counter())
            VerifyOutcome.from_packed(entry["result"][0][:1].cpu())
            t.append(time.perf_counter())
            for name, a, b in zip(list(pieces)[:6], t[:-1], t[1:]):
                pieces[name].append(b - a)
            set_lengths(model, L)
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            target.speculate_greedy(slots, trees)
            pieces["whole_call"].append(time.perf_counter() - t0)
            set_lengths(model, L)
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            entry["graph"].replay()
            torch.cuda.synchronize()
            pieces["graph_alone"].append(time.perf_counter() - t0)
        rows.append({"N": N, **{f"{k}_ms": 1e3 * float(np.median(v)) for k, v in pieces.items()}})
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="decode_probe.json")
    ap.add_argument("--L", type=int, default=1024, help="committed context length")
    ap.add_argument("--what", nargs="+", choices=["pdl", "launch", "speculate", "fused", "sweep", "sweep_rows"],
                    default=["pdl", "launch"])
    args = ap.parse_args()
    model = om.build_random(HybridConfig(**CONFIG), seed=0, num_slots=1, max_seq_len=args.L + 512, max_nodes=64,
                            device=torch.device("cuda"))
    result = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
              "L": args.L}
    for what in args.what:
        result[what] = {"pdl": pdl_rows, "launch": launch_rows, "speculate": speculate_rows,
                        "fused": fused_rows, "sweep": sweep_rows, "sweep_rows": sweep_rows_rows}[what](model, args.L)
        for row in result[what]:
            print(json.dumps(row), flush=True)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
