"""Probe (GPU): the B = 1 decode step of the bench model (bench/model_verify.py's config) as a CUDA-graph replay with
the GEMV launched plainly and as a programmatic dependent launch (``optimized.pdl``); the logits of each variant
(eager and replayed) checked bit-identical to the plain launch. (The run of 2026-12-01 also timed an L2 prefetch of
0-4 weight tiles per program before the wait, with the GEMV of commit 4251649; the prefetch was then removed:
``bench/results/2026-12-01b/pdl_probe.json``.)

Run: ``PYTHONPATH=$PWD python bench/pdl_probe.py --out pdl_probe.json``.
"""

from __future__ import annotations

import argparse
import json

import torch
import triton

from lumotree.optimized import model as om
from lumotree.reference.config import HybridConfig

from model_verify import CONFIG, set_lengths  # noqa: E402  (bench/ is the script's directory)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="pdl_probe.json")
    ap.add_argument("--L", type=int, default=1024)
    args = ap.parse_args()
    dev = torch.device("cuda")
    model = om.build_random(HybridConfig(**CONFIG), seed=0, num_slots=1, max_seq_len=args.L + 512, max_nodes=64,
                            device=dev)
    slots = torch.zeros(1, dtype=torch.int32)
    tokens = torch.tensor([123])
    variants = [("plain", False), ("pdl", True)]
    result = {"device": torch.cuda.get_device_name(), "triton": triton.__version__, "L": args.L, "rows": []}
    pools = [*model.state_pools, *model.conv_pools, *model.k_pools, *model.v_pools]
    for pool in pools:
        pool.normal_(0.0, 0.1)
    saved = [p.clone() for p in pools]

    def restore() -> None:
        for pool, copy in zip(pools, saved):
            pool.copy_(copy)
        set_lengths(model, args.L)

    reference = None
    for name, pdl in variants:
        model.set_small_batch_linear(True, pdl=pdl)
        restore()
        logits = model.decode(slots, tokens).clone()  # the eager run (compiles), then the capture
        graph = model._graph_entries[("decode", 1)]["graph"]

        def replay() -> None:
            graph.replay()
            model.lens.fill_(args.L)

        us = 1e3 * triton.testing.do_bench(replay, warmup=20, rep=200, return_mode="median")
        restore()
        graph.replay()  # the replay's logits too
        torch.cuda.synchronize()
        replayed = model._graph_entries[("decode", 1)]["result"]
        same_replay = bool(torch.equal(replayed, logits))
        same = True if reference is None else bool(torch.equal(logits, reference))
        reference = logits if reference is None else reference
        row = {"variant": name, "pdl": pdl, "decode_us": us, "logits_equal_plain": same,
               "replay_equal_eager": same_replay}
        result["rows"].append(row)
        print(json.dumps(row), flush=True)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
