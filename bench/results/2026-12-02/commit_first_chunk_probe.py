"""Twelfth session, run 5: the GDN commit with its first path chunk requested before the state tile (both loads in
flight together), side by side with the kernel as committed before (``gdn_tree_before.py``, loaded as a sibling
module of the package), default configs, N = 64, tf32, random and chain trees at B = 64, 16 and 1: commit alone,
CUDA-graph replay, median of do_bench; the committed states of the two kernels compared bit for bit.

What happened in run 5: ``gdn_tree_before.py`` was ``optimized/gdn_tree.py`` as of commit 1588f9f, copied beside this
script for the run and not kept. The probe then failed at its first commit, on the ``TreeFactors`` type check of the
other module (``factors`` came from this module's verify), so nothing was timed side by side. The comparison in
bench/RESULTS.md is between the benchmark rows of runs 4 and 5. The change was reverted.

Run (GPU): PYTHONPATH=$PWD:$PWD/bench python3 bench/results/2026-12-02/commit_first_chunk_probe.py --out c.json
"""

import argparse
import importlib.util
import json
import pathlib
import sys

import torch

import gdn_tree as T  # bench/gdn_tree.py
from lumotree.optimized import gdn_tree as G


def load_before():
    path = pathlib.Path(__file__).with_name("gdn_tree_before.py")
    spec = importlib.util.spec_from_file_location("lumotree.optimized._gdn_tree_before", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default="commit_first_chunk.json")
    args = parser.parse_args()
    before = load_before()
    rows = []
    for B in (64, 16, 1):
        for kind in ("random", "chain"):
            x = T.make_inputs(B, 64, kind, seed=B * 1000 + 64)
            meta = G.tree_meta(x["parents"])
            _, factors = G.gdn_tree_verify(x["q"], x["k"], x["v"], x["g"], x["beta"], x["pool"], x["slots"],
                                           x["parents"], use_qk_l2norm_in_kernel=True, input_precision="tf32",
                                           meta=meta)
            row = dict(B=B, N=64, kind=kind, depth=x["max_depth"])
            states = {}
            for name, module in (("before", before), ("now", G), ("before2", before), ("now2", G)):
                pool = x["pool"].clone()

                def commit(pool=pool, module=module):
                    module.gdn_tree_commit(pool, x["slots"], factors, x["parents"], x["accepted"],
                                           input_precision="tf32", meta=meta, validate=False)

                commit()
                states[name] = pool[x["slots"].long()].clone()
                row[f"{name}_us"], _ = T.graph_time(commit, rep_ms=80)
            row["bit_equal"] = bool(torch.equal(states["before"], states["now"]))
            rows.append(row)
            print({k: round(v, 2) if isinstance(v, float) else v for k, v in row.items()}, flush=True)
            torch.cuda.empty_cache()
    json.dump(dict(card=torch.cuda.get_device_name(), rows=rows), open(args.out, "w"), indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
