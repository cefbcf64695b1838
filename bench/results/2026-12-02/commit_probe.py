"""Twelfth session, run 3: the GDN commit kernel with its state tile loaded before the path's products (and added
after them), over launch configs, at Qwen3-Next GDN shapes, N = 64 random trees, tf32, B in {64, 16, 1}: commit
alone, CUDA-graph replay, median of do_bench; each config's committed states checked against the default's in the
same run (``rel``). Compare with the commit before this change: 94.0 / 32.1 / 9.7 us (run 2, default configs).

Ran (run 3) on this session's working tree with the commit kernel's state tile loaded first (242 registers at
B = 64; reverted after this run: bench/NOTES-gdn.md, twelfth session). The script still runs against the committed
library (it then times the kernel as committed). Kept as the record of what was timed.

Run (GPU): PYTHONPATH=$PWD:$PWD/bench python3 bench/results/2026-12-02/commit_probe.py --out commit.json
"""

import argparse
import json

import torch

import gdn_tree as T  # bench/gdn_tree.py
from lumotree.optimized import gdn_tree as G

CONFIGS = {  # block_v, block_k, warps, stages
    "bv64_bk128_w4": (64, 128, 4, 1), "bv64_bk128_w8": (64, 128, 8, 1), "bv32_bk128_w4": (32, 128, 4, 1),
    "bv128_bk128_w8": (128, 128, 8, 1), "bv64_bk64_w4": (64, 64, 4, 1), "bv32_bk64_w4": (32, 64, 4, 1),
    "bv32_bk64_w2": (32, 64, 2, 1), "bv32_bk32_w2": (32, 32, 2, 1), "bv64_bk32_w4": (64, 32, 4, 1),
    "bv128_bk32_w4": (128, 32, 4, 1),
}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default="commit.json")
    args = parser.parse_args()
    rows = []
    for B in (64, 16, 1):
        x = T.make_inputs(B, 64, "random", seed=B * 1000 + 64)
        meta = G.tree_meta(x["parents"])
        _, factors = G.gdn_tree_verify(x["q"], x["k"], x["v"], x["g"], x["beta"], x["pool"], x["slots"],
                                       x["parents"], use_qk_l2norm_in_kernel=True, input_precision="tf32", meta=meta)
        default = G.commit_config(B, T.HV, 64, T.K, T.V, x["q"].device)
        row = dict(B=B, default=list(default[:4]))
        want = None
        for name, cfg in {"default": default, **{k: G.KernelConfig(*v) for k, v in CONFIGS.items()}}.items():
            pool = x["pool"].clone()

            def commit(pool=pool, cfg=cfg):
                G.gdn_tree_commit(pool, x["slots"], factors, x["parents"], x["accepted"], input_precision="tf32",
                                  meta=meta, validate=False, config=cfg)

            pool.copy_(x["pool"])
            commit()
            got = pool[x["slots"].long()].clone()
            want = got if want is None else want
            row[f"{name}_rel"] = float((got - want).norm() / want.norm())
            row[f"{name}_us"], _ = T.graph_time(commit, rep_ms=60)
        rows.append(row)
        print({k: round(v, 2) if isinstance(v, float) and k.endswith("_us") else v for k, v in row.items()},
              flush=True)
        torch.cuda.empty_cache()
    json.dump(dict(card=torch.cuda.get_device_name(), rows=rows), open(args.out, "w"), indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
