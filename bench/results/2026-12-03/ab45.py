"""Twenty-second session, run 45: why the descriptors win in the benchmark (fp32, contiguous, one launch per graph)
and lose as the model launches the verify (bf16 strided views, 48 launches back to back; runs 43-44). At B = 1,
verify alone with the default config, descriptors on (the default's ``tma`` / ``solve_tma``) and off, for inputs
fp32 contiguous, bf16 contiguous and bf16 strided (views of a ``[B, N, 2 H K + HV V]`` conv output, as the model
passes them), each timed as one launch per graph replay and as 48 launches back to back in one graph (per launch),
state hot (the same pool every launch); median of three interleaved rounds.

Run (GPU): PYTHONPATH=$PWD:$PWD/bench python3 bench/results/2026-12-03/ab45.py
"""

import numpy as np
import torch
import triton

import gdn_tree as T  # bench/gdn_tree.py
from lumotree.optimized import gdn_tree as G

H, HV, K, V, ROUNDS, BACK_TO_BACK = 16, 32, 128, 128, 3, 48
dev = torch.device("cuda")


def inputs(N, form):
    x = T.make_inputs(1, N, "random", seed=N)
    if form == "bf16 strided":
        conv = torch.cat([x["q"].flatten(2), x["k"].flatten(2), x["v"].flatten(2)], -1).bfloat16()  # [1, N, C]
        x["q"] = conv[..., : H * K].unflatten(-1, (H, K))
        x["k"] = conv[..., H * K : 2 * H * K].unflatten(-1, (H, K))
        x["v"] = conv[..., 2 * H * K :].unflatten(-1, (HV, V))
    elif form == "bf16":
        x = dict(x, q=x["q"].bfloat16(), k=x["k"].bfloat16(), v=x["v"].bfloat16())
    return x


def run(N):
    graphs, keep = {}, []
    default = G.verify_config(1, HV, N, K, V, dev, H, "tf32")
    for form in ("fp32", "bf16", "bf16 strided"):
        x = inputs(N, form)
        meta = G.tree_meta(x["parents"])
        for tma in ("on", "off"):
            cfg = default if tma == "on" else default._replace(tma=False, solve_tma=False)
            pool = x["pool"].clone()
            keep.append((x, pool))

            def verify(x=x, pool=pool, cfg=cfg, meta=meta):
                return G.gdn_tree_verify(x["q"], x["k"], x["v"], x["g"], x["beta"], pool, x["slots"], x["parents"],
                                         use_qk_l2norm_in_kernel=True, input_precision="tf32", meta=meta,
                                         validate=False, config=cfg)

            o_ref = verify()[0]
            for count in (1, BACK_TO_BACK):
                torch.cuda.synchronize()
                g = torch.cuda.CUDAGraph()
                with torch.cuda.graph(g):
                    for _ in range(count):
                        o = verify()[0]
                g.replay()
                torch.cuda.synchronize()
                assert torch.equal(o, o_ref)
                graphs[(form, tma, count)] = g
    times = {k: [] for k in graphs}
    for _ in range(ROUNDS):
        for key, g in graphs.items():
            times[key].append(1e3 * triton.testing.do_bench(g.replay, warmup=10, rep=100, return_mode="median")
                              / key[2])
    print(f"\nB = 1, N = {N}, random, tf32, verify alone, default {'split' if default.split else 'fused'} "
          f"(tma {default.tma}, solve_tma {default.solve_tma}), us per launch:\n"
          "| inputs | one per graph, on | off | 48 back to back, on | off |\n|---|---|---|---|---|")
    for form in ("fp32", "bf16", "bf16 strided"):
        row = " | ".join(f"{np.median(times[(form, t, c)]):.2f}" for c in (1, BACK_TO_BACK) for t in ("on", "off"))
        print(f"| {form} | {row} |", flush=True)
    del graphs, keep


for N in (8, 64, 128):
    run(N)
