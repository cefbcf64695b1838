"""Probe (GPU): what the tree conv costs inside the ``w_in`` GEMV's epilogue (``gemv.TreeConv``).

The bench model's ``w_in`` projection (``[12352, 2048]``, bf16; the conv over its first 8192 columns, width 4) on a
B = 1 tree step of N nodes (random tree, committed conv state in the pool), three forms, each a CUDA graph of
``--calls`` launches cycling over enough weight copies (> 120 MB) that every launch streams its weight from DRAM,
median of ``triton.testing.do_bench``, launched with PDL as the model launches them:

- ``gemv``: the plain GEMV (one K split, as with the conv);
- ``epilogue``: the GEMV with the tree conv in its epilogue;
- ``gemv+kernel``: the plain GEMV followed by :func:`~lumotree.optimized.conv_tree.tree_conv`;
- ``gemv_8w``, ``epilogue_8w``: the same at 8 warps (the epilogue: 243 registers at 4 warps, 105 at 8 in the
  sm_90 compile with Triton 3.6).

The epilogue's values are checked against the two-kernel form (bit-identical) in the same run. ``--ncu``: instead,
run each GEMV form once after a warm-up, for Nsight Compute (``ncu -k regex:_gemv_kernel --launch-skip 2``).

Run: ``PYTHONPATH=$PWD:$PWD/bench python bench/treeconv_probe.py --nodes 16 32 64 --out treeconv.json``.
"""

from __future__ import annotations

import argparse
import json
import math

import numpy as np
import torch
import triton

from gemv import graph_time_us  # bench/
from lumotree.optimized import gemv as G
from lumotree.optimized.conv_tree import tree_conv
from lumotree.reference.tree import random_parents

C, WIDTH, N_OUT, K = 8192, 4, 12352, 2048


def inputs(N: int, copies: int, seed: int = 0) -> dict:
    dev = torch.device("cuda")
    gen = torch.Generator(device=dev).manual_seed(seed)
    parents = torch.tensor([random_parents(N, np.random.default_rng(seed))], dtype=torch.int32, device=dev)  # [1, N]
    return dict(
        x=torch.randn(N, K, generator=gen, device=dev).to(torch.bfloat16),  # [N, K]
        ws=[(torch.randn(N_OUT, K, generator=gen, device=dev) / K**0.5).to(torch.bfloat16) for _ in range(copies)],
        weight=torch.randn(C, WIDTH, generator=gen, device=dev).to(torch.bfloat16),  # [C, W]
        pool=torch.randn(2, WIDTH - 1, C, generator=gen, device=dev),  # [P, W - 1, C] fp32
        slots=torch.ones(1, dtype=torch.int32, device=dev),  # [B]
        parents=parents,
        num_nodes=torch.full((1,), N, dtype=torch.int32, device=dev),  # [B]
        out=torch.empty(1, N, C, device=dev).to(torch.bfloat16),  # [B, N, C]
    )


def forms(d: dict) -> dict:
    N = d["x"].shape[0]
    plain_cfg = G.gemv_config(N, N_OUT, K, "cuda")._replace(split_k=1)
    conv = G.TreeConv(d["weight"], d["pool"], d["slots"], d["parents"], d["num_nodes"], d["out"])

    def gemv(i):
        return G.small_batch_linear(d["x"], d["ws"][i % len(d["ws"])], config=plain_cfg, pdl=True)

    def epilogue(i):
        return G.small_batch_linear(d["x"], d["ws"][i % len(d["ws"])], conv=conv, pdl=True, validate=False)

    def two_kernels(i):
        y = gemv(i)
        return tree_conv(y[:, :C].reshape(1, N, C), d["weight"], d["pool"], d["slots"], d["parents"],
                         num_nodes=d["num_nodes"], validate=False)

    cfg_8w = plain_cfg._replace(num_warps=8)

    def gemv_8w(i):
        return G.small_batch_linear(d["x"], d["ws"][i % len(d["ws"])], config=cfg_8w, pdl=True)

    def epilogue_8w(i):
        return G.small_batch_linear(d["x"], d["ws"][i % len(d["ws"])], config=cfg_8w, conv=conv, pdl=True,
                                    validate=False)

    return {"gemv": gemv, "epilogue": epilogue, "gemv+kernel": two_kernels, "gemv_8w": gemv_8w,
            "epilogue_8w": epilogue_8w}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, nargs="+", default=[16, 32, 64])
    ap.add_argument("--calls", type=int, default=20)
    ap.add_argument("--ncu", action="store_true", help="one launch of each GEMV form after a warm-up (see above)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    copies = max(2, math.ceil(120e6 / (N_OUT * K * 2)))
    rows = []
    for N in args.nodes:
        d = inputs(N, 1 if args.ncu else copies)
        f = forms(d)
        if args.ncu:  # warm-up (compile) launches first, then one of each for the profiler
            f["gemv"](0), f["epilogue"](0)
            torch.cuda.synchronize()
            f["gemv"](0), f["epilogue"](0)
            torch.cuda.synchronize()
            continue
        reference = f["gemv+kernel"](0).clone()
        same = {}
        for name in ("epilogue", "epilogue_8w"):
            d["out"].fill_(float("nan"))
            f[name](0)
            same[name] = bool(torch.equal(d["out"], reference))
        row = {"N": N, "bit_identical": same, **{k: graph_time_us(v, args.calls, 5.0, 25.0) for k, v in f.items()}}
        print(json.dumps(row), flush=True)
        rows.append(row)
    if args.out and rows:
        with open(args.out, "w") as fh:
            json.dump(dict(device=torch.cuda.get_device_name(), triton=triton.__version__, rows=rows), fh, indent=1)
    return 0 if all(all(r["bit_identical"].values()) for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
