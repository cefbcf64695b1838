"""Probe: the default tree attention launch against its variants, side by side with a single-query SDPA decode.

Points (B, N, L) at Qwen3-Next attention shapes (16 q heads, 2 kv heads, head_dim 256, bf16): B in {1, 16}, N in
{8, 64}, L = 8192, and B = 1, N = 64, L = 1024. For each point and variant it

1. fills ``out`` with NaN, runs the variant and checks it against a float64 torch oracle on the same bf16 inputs
   (the first two requests; committed keys all visible, tree keys under the ancestor mask, sigmoid gate): relative
   error < 1e-2 and every output finite;
2. times it as a CUDA-graph replay, median of ``triton.testing.do_bench``;

next to ``decode_sdpa``: one single-query ``scaled_dot_product_attention`` per request over the same committed KV plus
one key (the issue's unit; target: tree attention <= 1.3x). Variants (keywords of ``tree_attention``):
``tree_slack`` w (the last split gives up w committed key tiles per tree tile it walks), explicit split counts,
64-row tiles with 4 warps and two CTAs per SM, narrower combine column blocks, 64-key tiles at one split (B = 16).
A breakdown at B = 1, N = 64 times single-split launches (one kernel, no combine) at L = 0 and 512 and with a
16-node tree, to separate the fixed cost of a program from the per-tile cost.

``--cold``: every timed call cycles through enough copies of the KV cache (at least 256 MiB in all, each request's
copy at its own slots) that each launch reads its keys from DRAM, as in the model, where the weights stream through
L2 between two uses of a layer; times are per launch, the SDPA baseline cycled the same way. Without it every
launch reads the same cache, warm in L2 (what the earlier sweeps measured).

Every variant has its own try/except (errors are recorded, the run goes on) and a wall-clock budget (``--budget-s``,
default 95 s including compilation): the Triton kernels are compiled first in parallel worker processes, and
variants left when the budget runs out are recorded as skipped. ``--tiny`` runs small float32 shapes under the
Triton interpreter (no GPU) to check the script itself. Run: ``python bench/attention_probe.py --out probe.json``.
"""

from __future__ import annotations

import os
import sys

if "--tiny" in sys.argv:  # the interpreter must be chosen before Triton kernels are defined
    import torch as _torch

    if not _torch.cuda.is_available():
        os.environ["TRITON_INTERPRET"] = "1"

import argparse  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import triton  # noqa: E402

import worker_pool  # noqa: E402  bench/: on sys.path when this file runs as a script
from lumotree.reference.tree import random_parents  # noqa: E402
from lumotree.optimized import tree_attention as ta  # noqa: E402

FULL = dict(HQ=16, HKV=2, D=256, dtype=torch.bfloat16,
            points=[(1, 64, 8192), (1, 8, 8192), (16, 64, 8192), (16, 8, 8192), (1, 64, 1024)])
TINY = dict(HQ=16, HKV=2, D=16, dtype=torch.float32, points=[(1, 16, 70), (2, 4, 0), (1, 20, 33)], tiny=True)
REL_TOL = 1e-2




def variants(B: int, N: int, L: int, shape: dict, device: torch.device) -> dict[str, dict]:
    """Variant name -> keywords of ``tree_attention`` (besides the inputs). ``default`` passes only ``max_len``."""
    HQ, HKV, D = shape["HQ"], shape["HKV"], shape["D"]
    bm, bn, nw, ns, splits = ta.default_launch(B, N, HQ, HKV, D, L, device, shape["dtype"])
    out: dict[str, dict] = {"default": {"max_len": L}}
    if shape.get("tiny") and splits == 1:  # the interpreter's 4 "SMs" give one split: force some to cover the code
        splits = 4 if N > 16 else splits
        base = {"num_splits": 3}
    else:
        base = {"max_len": L}
    if splits > 1 or base.get("num_splits"):
        for w in (1, 2, 4, 8):
            out[f"slack{w}"] = {**base, "tree_slack": w}
        out["combine_d128"] = {**base, "combine_block_d": min(128, triton.next_power_of_2(D))}
        for s in sorted({max(2, splits // 2), max(2, splits * 3 // 4)} - {splits}):
            out[f"splits{s}"] = {"num_splits": s}
            out[f"splits{s}_slack2"] = {"num_splits": s, "tree_slack": 2}
    G = HQ // HKV
    if G * N > 64:  # 64-row tiles, 4 warps, 2 stages: two CTAs per SM (98 KiB shared memory), splits for two waves
        rb = triton.cdiv(N, 64 // G)
        s2 = ta.choose_num_splits(B, HKV, rb, L, device, block_n=32, waves=2.0)
        cfg = dict(block_m=64, block_n=32, num_warps=4, num_stages=2, num_splits=s2)
        out["m64w4s2"] = cfg
        if s2 > 1:
            out["m64w4s2_slack2"] = {**cfg, "tree_slack": 2}
    if bm == 128 and bn == 32:  # deeper K/V pipelines (more bytes in flight per SM): 4 stages 194 KiB, 5 226 KiB
        for stages in (4, 5):
            out[f"st{stages}"] = dict(block_m=bm, block_n=bn, num_warps=nw, num_stages=stages, num_splits=splits)
    if splits == 1 and G * N > 128:  # one split: 64-key tiles read the q tile from shared memory half as often
        out["n64w8s2"] = dict(block_m=128, block_n=64, num_warps=8, num_stages=2, num_splits=1)
    return out


class Point:
    """Inputs of one (B, N, L) point, the float64 oracle of its first requests and the SDPA decode baseline."""

    def __init__(self, B: int, N: int, L: int, shape: dict, device: torch.device, seed: int, cold: bool = False):
        rng = np.random.default_rng(seed)
        gen = torch.Generator(device="cpu").manual_seed(seed)
        HQ, HKV, D, dtype = shape["HQ"], shape["HKV"], shape["D"], shape["dtype"]
        self.B, self.N, self.L = B, N, L
        C = L + N
        copy_bytes = 2 * B * HKV * C * D * torch.tensor([], dtype=dtype).element_size()
        self.copies = min(64, max(2, math.ceil(256 * 2**20 / copy_bytes))) if cold else 1
        P = B * self.copies
        self.k_cache = torch.randn(P, HKV, C, D, generator=gen).to(device, dtype)  # [P = B copies, HKV, C, D]
        self.v_cache = torch.randn(P, HKV, C, D, generator=gen).to(device, dtype)
        self.slot_sets = [torch.arange(c * B, (c + 1) * B, dtype=torch.int32, device=device)
                          for c in range(self.copies)]  # copy c's slots [B]
        self.slots = self.slot_sets[0]  # [B] the checked call's
        self.lens = torch.full((B,), L, dtype=torch.int32, device=device)  # [B]
        self.parents = torch.tensor([random_parents(N, rng) for _ in range(B)], dtype=torch.int32, device=device)
        self.words = ta.tree_metadata(self.parents).words  # [B, N, W]
        self.q = torch.randn(B, N, HQ, D, generator=gen).to(device, dtype)  # [B, N, HQ, D]
        self.gate = (2 * torch.randn(B, N, HQ, D, generator=gen)).to(device, dtype)  # [B, N, HQ, D]
        self.out = torch.empty_like(self.q)  # [B, N, HQ, D]

    def oracle(self, nb: int) -> torch.Tensor:
        """Float64 ``softmax(q K^T / sqrt(D)) V * sigmoid(gate)`` of the first ``nb`` requests: ``[nb, N, HQ, D]``."""
        B, N, L = self.B, self.N, self.L
        HQ, D = self.q.shape[2], self.q.shape[3]
        G = HQ // self.k_cache.shape[1]
        j = torch.arange(N, device=self.q.device)
        words = self.words.to(torch.int64) & 0xFFFFFFFF  # [B, N, W]
        tree_mask = ((words[:, :, j // 32] >> (j % 32)) & 1).bool()  # [B, N, N]
        outs = []
        for b in range(nb):
            k = self.k_cache[b, :, : L + N].double().repeat_interleave(G, dim=0)  # [HQ, L + N, D]
            v = self.v_cache[b, :, : L + N].double().repeat_interleave(G, dim=0)
            qb = self.q[b].double().transpose(0, 1)  # [HQ, N, D]
            s = qb @ k.transpose(1, 2) * D**-0.5  # [HQ, N, L + N]
            visible = torch.cat([torch.ones(N, L, dtype=torch.bool, device=s.device), tree_mask[b]], dim=1)
            s = s.masked_fill(~visible[None], float("-inf"))
            o = torch.softmax(s, dim=-1) @ v  # [HQ, N, D]
            outs.append(o.transpose(0, 1) * torch.sigmoid(self.gate[b].double()))
        return torch.stack(outs)

    def call(self, kw: dict, lens: torch.Tensor | None = None, q=None, words=None, gate=None, slots=None):
        return ta.tree_attention(self.q if q is None else q, self.k_cache, self.v_cache,
                                 self.slots if slots is None else slots,
                                 self.lens if lens is None else lens, self.words if words is None else words,
                                 gate=self.gate if gate is None else gate, out=self.out if q is None else None,
                                 validate=False, **kw)

    def cycled(self, kw: dict, **extra):
        """A call per copy of the cache, in one function (time it and divide by ``copies``)."""
        def run():
            for slots in self.slot_sets:
                self.call(kw, slots=slots, **extra)
        return run


def graph_time(fn, rep_ms: int) -> float:
    """Median microseconds of a CUDA-graph replay of ``fn`` (eager when capture fails, which is reported)."""
    fn()
    torch.cuda.synchronize()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    t = triton.testing.do_bench(graph.replay, warmup=5, rep=rep_ms, return_mode="median") * 1e3
    torch.cuda.synchronize()
    return t


def run_variant(point: Point, kw: dict, ref: torch.Tensor, timed: bool, rep_ms: int) -> dict:
    """Correctness against the oracle (NaN-poisoned output first), then the graph-replay time."""
    res: dict = {"kw": {k: v for k, v in kw.items() if k != "max_len"}}
    point.out.fill_(float("nan"))
    point.call(kw)
    if point.q.is_cuda:
        torch.cuda.synchronize()
    got = point.out[: ref.shape[0]].double()
    res["finite"] = bool(torch.isfinite(point.out).all())
    res["rel_err"] = float((got - ref).norm() / ref.norm())
    res["ok"] = res["finite"] and res["rel_err"] < REL_TOL
    if timed:
        res["us"] = graph_time(point.cycled(kw), rep_ms) / point.copies
    return res


def _warm(args: tuple) -> str:
    """Worker: build one point and call each of its variants once (fills the Triton cache); returns a status."""
    return worker_pool.warm_calls(_warm_calls(*args))


def _warm_calls(point_shape: tuple, names: list, seed: int):
    B, N, L = point_shape
    device = torch.device("cuda")
    point = Point(B, N, L, FULL, device, seed)
    kws = variants(B, N, L, FULL, device)
    for name in names:
        yield f"{B},{N},{L} {name}", lambda name=name: point.call(kws[name])
    yield f"{B},{N},{L} one split", lambda: point.call({"num_splits": 1})


def precompile(points: list, timeout_s: float) -> dict:
    """Compile every point's kernels in parallel processes (one per point and variant group), at most ``timeout_s``."""
    jobs = []
    for i, (B, N, L) in enumerate(points):
        names = list(variants(B, N, L, FULL, torch.device("cuda")))
        half = (len(names) + 1) // 2  # two workers per point: the variants with other tiles compile in parallel
        tiles = [n for n in names if n.startswith(("m64", "n64"))]
        rest = [n for n in names if n not in tiles]
        jobs += [((B, N, L), rest[:half] or ["default"], i), ((B, N, L), tiles or ["default"], i)]
    seconds, results = worker_pool.run_tasks(_warm, jobs, timeout_s)
    return {"seconds": seconds, "status": {str(job[0]) + str(job[1][:1]): r for job, r in zip(jobs, results)}}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="attention_probe.json")
    ap.add_argument("--tiny", action="store_true", help="small float32 shapes (interpreter without a GPU)")
    ap.add_argument("--budget-s", type=float, default=95.0)
    ap.add_argument("--rep-ms", type=int, default=25)
    ap.add_argument("--no-precompile", action="store_true")
    ap.add_argument("--cold", action="store_true", help="every launch's KV cache cold in L2 (see the docstring)")
    args = ap.parse_args()
    t0 = time.time()
    shape = TINY if args.tiny else FULL
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    timed = device.type == "cuda"
    result: dict = {"device": torch.cuda.get_device_name() if timed else "cpu (interpreter)",
                    "torch": torch.__version__, "triton": triton.__version__, "budget_s": args.budget_s,
                    "cold": args.cold, "points": [], "breakdown": {}}

    def save():
        result["elapsed_s"] = time.time() - t0
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)

    if timed and not args.tiny and not args.no_precompile:
        try:
            result["precompile"] = precompile(shape["points"], timeout_s=min(60.0, 0.55 * args.budget_s))
        except Exception as e:
            result["precompile"] = {"error": repr(e)[:200]}
        print("precompile:", json.dumps(result["precompile"])[:400], flush=True)

    def left() -> float:
        return args.budget_s - (time.time() - t0)

    for i, (B, N, L) in enumerate(shape["points"]):
        row: dict = {"B": B, "N": N, "L": L, "variants": {}}
        result["points"].append(row)
        try:
            point = Point(B, N, L, shape, device, seed=i, cold=args.cold)
            row["copies"] = point.copies
            ref = point.oracle(min(B, 2))
        except Exception as e:
            row["error"] = repr(e)[:300]
            save()
            continue
        if timed and left() > 3:
            try:
                q1 = point.q[:, :1].transpose(1, 2).contiguous()  # [B, HQ, 1, D]
                caches = [(point.k_cache[c * B : (c + 1) * B, :, : L + 1],
                           point.v_cache[c * B : (c + 1) * B, :, : L + 1]) for c in range(point.copies)]

                def sdpa():
                    for kd, vd in caches:
                        F.scaled_dot_product_attention(q1, kd, vd, enable_gqa=True)

                row["decode_sdpa_us"] = graph_time(sdpa, args.rep_ms) / point.copies
            except Exception as e:
                row["decode_sdpa_error"] = repr(e)[:200]
        for name, kw in variants(B, N, L, shape, device).items():
            if left() < 2:
                row["variants"][name] = {"skipped": "budget"}
                continue
            try:
                row["variants"][name] = run_variant(point, kw, ref, timed, args.rep_ms)
            except Exception as e:
                row["variants"][name] = {"error": repr(e)[:300]}
            if timed:
                torch.cuda.synchronize()
        row["default_cfg"] = list(ta.default_launch(B, N, shape["HQ"], shape["HKV"], shape["D"], L, device,
                                                    shape["dtype"]))
        if i == 0:  # single-split launches (one kernel) at B = 1: fixed cost of a program vs cost per key tile
            for name, lens_value, nodes in (("S1_L0_N64", 0, N), ("S1_L512_N64", 512, N), ("S1_L0_N16", 0, 16)):
                if not timed or left() < 3:
                    break
                try:
                    lens = torch.full((B,), min(lens_value, L), dtype=torch.int32, device=device)
                    q, gate, words = point.q[:, :nodes].contiguous(), point.gate[:, :nodes].contiguous(), \
                        point.words[:, :nodes, : math.ceil(nodes / 32)].contiguous()
                    result["breakdown"][name] = graph_time(
                        point.cycled({"num_splits": 1}, lens=lens, q=q, words=words, gate=gate),
                        args.rep_ms) / point.copies
                except Exception as e:
                    result["breakdown"][name] = repr(e)[:200]
        del point
        if timed:
            torch.cuda.empty_cache()
        save()
    save()
    print_table(result)
    return 0


def print_table(result: dict) -> None:
    print(f"{result['device']}  torch {result['torch']}  triton {result['triton']}  {result['elapsed_s']:.1f} s")
    for row in result["points"]:
        dec = row.get("decode_sdpa_us")
        head = f"B={row['B']} N={row['N']} L={row['L']}  decode_sdpa " + (f"{dec:.1f} us" if dec else "-")
        print(head, " default cfg", row.get("default_cfg"), row.get("error", ""))
        for name, r in row["variants"].items():
            us = r.get("us")
            ratio = f"{us / dec:5.2f}x" if us and dec else "   - "
            status = r.get("error") or r.get("skipped") or ("ok" if r.get("ok") else "WRONG")
            err = r.get("rel_err")
            print(f"  {name:16s} {us if us is None else round(us, 1)!s:>8} us {ratio}  "
                  f"rel_err {err if err is None else f'{err:.1e}'}  {status}")
    if result["breakdown"]:
        print("breakdown (one split, one kernel):", {k: round(v, 1) if isinstance(v, float) else v
                                                      for k, v in result["breakdown"].items()})


if __name__ == "__main__":
    raise SystemExit(main())
