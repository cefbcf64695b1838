"""Probe (GPU): the ``w_out`` GEMV of a GDN layer in a tree step with the gated RMSNorm's per-head factors applied
to its tiles' products (a per-segment ``gemv.RowNorm``, the other half of ``gdn_tree.OutputGate``), per launch
config, against the plain GEMV and against the separate gated RMSNorm kernel + the plain GEMV. (Runs 4-5 of
``bench/results/2026-12-01j`` also timed a form that took the K tiles in pairs, since removed: slower.)

The bench model's ``w_out`` (``[2048, 4096]``, bf16; 32 value heads of 128 columns) adding into the residual with the
next norm's scale (``gemv.residual_linear``, as the model launches it, PDL), M rows (the nodes of a B = 1 step), each
form a CUDA graph of ``--calls`` launches cycling over enough weight copies (> 120 MB) that every launch streams its
weight from DRAM, median of ``triton.testing.do_bench``. Each segmented config's result is checked against the
separate-kernel form (bf16 relative error) in the same run.

Run: ``PYTHONPATH=$PWD:$PWD/bench python bench/gate_norm_probe.py --rows 64 32 --out gate_norm.json``.
"""

from __future__ import annotations

import argparse
import json
import math

import torch
import triton

from gemv import graph_time_us, rel_err  # bench/
from lumotree.optimized import gemv as G
from lumotree.optimized.gdn_decode import gated_rmsnorm
from lumotree.optimized.gdn_tree import GATE_PIECE

HV, V, D_MODEL = 32, 128, 2048
# (block_n, block_k, split_k, num_warps, num_stages) of the segmented form besides the default
CONFIGS = [(64, 128, 4, 4, 4), (64, 128, 4, 8, 4), (64, 128, 4, 8, 3), (64, 128, 2, 8, 4), (64, 128, 8, 8, 4),
           (128, 128, 4, 8, 4), (32, 128, 4, 4, 4), (64, 128, 4, 4, 5)]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, nargs="+", default=[64, 32])
    ap.add_argument("--calls", type=int, default=20)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    dev = torch.device("cuda")
    K = HV * V
    copies = max(2, math.ceil(120e6 / (D_MODEL * K * 2)))
    gen = torch.Generator(device=dev).manual_seed(0)
    ws = [torch.randn(D_MODEL, K, generator=gen, device=dev).div_(K**0.5).to(torch.bfloat16) for _ in range(copies)]
    rows = []
    for M in args.rows:
        o = torch.randn(M, HV, V, generator=gen, device=dev).to(torch.bfloat16)  # [M, HV, V] the verify's output
        z = torch.randn(M, HV, V, generator=gen, device=dev).to(torch.bfloat16)  # [M, HV, V]
        w_norm = torch.rand(V, generator=gen, device=dev) + 0.5  # [V]
        scale = torch.rand(D_MODEL, generator=gen, device=dev) + 0.5  # [Dm] the next norm's 1 + w
        h0 = torch.randn(M, D_MODEL, generator=gen, device=dev).to(torch.bfloat16)  # [M, Dm]
        of = o.float()
        gated = (w_norm * of * torch.nn.functional.silu(z.float())).to(torch.bfloat16).view(M, K)  # [M, K]
        parts = (of * of).view(M, HV, V // GATE_PIECE, GATE_PIECE).sum(-1).contiguous()  # [M, HV, V / 16]
        norm = G.RowNorm(parts, 1e-6)
        h = h0.clone()

        def separate(i):
            x = gated_rmsnorm(o, z, w_norm, eps=1e-6).view(M, K)
            return G.residual_linear(x, ws[i % copies], h, scale=scale, pdl=True)

        def plain(i):
            return G.residual_linear(gated, ws[i % copies], h, scale=scale, pdl=True)

        def segmented(cfg):
            return lambda i: G.residual_linear(gated, ws[i % copies], h, scale=scale, norm=norm, config=cfg, pdl=True)

        h.copy_(h0)
        separate(0)
        want = h.float() - h0.float()  # the product as the separate kernels add it
        forms = {"separate": separate, "plain": plain, "default": segmented(None)}
        errs = {}
        for c in CONFIGS:
            forms[f"{c[0]}x{c[1]}/s{c[2]}/w{c[3]}/st{c[4]}"] = segmented(G.GemvConfig(*c, use_dot=True))
        for name, fn in forms.items():
            if name not in ("separate", "plain"):
                h.copy_(h0)
                fn(0)
                errs[name] = rel_err(h.float() - h0.float(), want)
        times = {name: graph_time_us(fn, args.calls, 5.0, 25.0) for name, fn in forms.items()}
        row = {"M": M, "us": times, "rel_err_vs_separate": errs}
        print(json.dumps(row), flush=True)
        rows.append(row)
    if args.out:
        with open(args.out, "w") as fh:
            json.dump(dict(device=torch.cuda.get_device_name(), triton=triton.__version__, rows=rows), fh, indent=1)
    return 0 if all(e < 2e-2 for r in rows for e in r["rel_err_vs_separate"].values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
