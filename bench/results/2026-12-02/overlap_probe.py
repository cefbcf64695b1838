"""Twelfth session, run 2: the deferred commit on a second stream beside the solve (side stream at default and at
high priority) and the apply launched with PDL behind the solve, against plain verify + commit, at Qwen3-Next GDN
shapes, random trees, tf32 (``--shapes B:N:dtype``; by default N = 64, fp32 inputs, bf16 at B = 64 too). Every form is checked against plain
commit-then-verify in the same run (``diff``: 0 expected). CUDA-graph replay, median of do_bench.

Ran (run 2, run 3) on this session's working tree while the deferred commit still existed, on a second stream
(``gdn_tree_defer_commit``, ``verify(commit=...)``; removed after these runs: bench/NOTES-gdn.md, twelfth session);
it no longer runs against the library as committed. Kept as the record of what was timed.

Run (GPU): PYTHONPATH=$PWD:$PWD/bench python3 bench/results/2026-12-02/overlap_probe.py --out overlap.json
"""

import argparse
import json

import torch

import gdn_tree as T  # bench/gdn_tree.py
from lumotree.optimized import gdn_tree as G


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default="overlap.json")
    parser.add_argument("--shapes", nargs="+", default=["64:64:float32", "64:64:bfloat16", "16:64:float32",
                                                         "1:64:float32"], help="B:N:dtype")
    args = parser.parse_args()
    rows = []
    for shape in args.shapes:
        B, N, dtype = int(shape.split(":")[0]), int(shape.split(":")[1]), getattr(torch, shape.split(":")[2])
        x = T.make_inputs(B, N, "random", seed=B * 1000 + N, dtype=dtype)
        verify, commit, both, deferred, pdl, _ = T.ours_fns(x, "tf32")
        row = dict(B=B, N=N, dtype=str(dtype).split(".")[-1])
        row["both_us"], _ = T.graph_time(both)
        row["deferred_us"], row["deferred_graph"] = T.graph_time(deferred)
        G._SIDE_STREAMS[torch.cuda.current_device()] = torch.cuda.Stream(priority=-1)
        row["deferred_hi_us"], _ = T.graph_time(deferred)
        del G._SIDE_STREAMS[torch.cuda.current_device()]
        row["pdl_us"], row["pdl_graph"] = T.graph_time(pdl)
        row["verify_us"], _ = T.graph_time(verify)
        row["commit_us"], _ = T.graph_time(commit)
        with_pdl = T.pdl_config(x, "tf32")
        row["verify_pdl_us"], _ = T.graph_time(lambda: verify(config=with_pdl))
        row["split"] = bool(with_pdl.split)
        if dtype == torch.float32:
            row.update({f"diff_{k}": v for k, v in T.deferred_difference(x, "tf32").items()})
        rows.append(row)
        print({k: round(v, 2) if isinstance(v, float) else v for k, v in row.items()}, flush=True)
        torch.cuda.empty_cache()
    json.dump(dict(card=torch.cuda.get_device_name(), rows=rows), open(args.out, "w"), indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
