"""Thirty-fourth session, run 108: the record's launch (warps, a register cap) and a form with its value-head loop
not unrolled, each in the step (the library's fused verify + the record variant; CUDA-graph medians), checked
against float64 first (``bench/gdn_fused.check_fused``: the pool the next verify writes is the recorded commit);
then the fused verify with a 3-slot solve ring (``kernel_ab.py``'s mechanism).

Run (GPU): ``PYTHONPATH=$PWD:$PWD/bench python bench/results/2026-12-03i/record_ab.py OUT.json``
"""
import importlib.util
import json
import os
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", ".."))
sys.path.insert(0, HERE)
import gdn_fused as BF  # noqa: E402
import gdn_tree as bench_gdn  # noqa: E402
import kernel_ab as KA  # noqa: E402

from lumotree.optimized import gdn_tree_pending as PD  # noqa: E402

PENDING = os.path.join(HERE, "..", "..", "..", "optimized", "gdn_tree_pending.py")
RUNTIME_G = [("        for j in tl.static_range(G):\n            hv = h * G + j\n"
              "            lg_a = tl.load(log_gamma_ptr + (b64 * N + node) * HV + hv)\n            lg = ",
              "        for jr in range(G):\n            hv = h * G + jr\n            lg_a = tl.load(log_gamma_ptr + "
              "(b64 * N + node) * HV + hv)\n            lg = ")]


def record_kernel(tmp, edits):
    src = open(PENDING).read().replace("from ._checks", "from lumotree.optimized._checks").replace(
        "from .gdn_tree ", "from lumotree.optimized.gdn_tree ").replace(
        "from .tree_attention", "from lumotree.optimized.tree_attention")
    for old, new in edits:
        assert src.count(old) == 1, old
        src = src.replace(old, new)
    path = os.path.join(tmp, "record_variant.py")
    with open(path, "w") as fh:
        fh.write(src)
    spec = importlib.util.spec_from_file_location("record_variant", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod._record_kernel


def step_time(x):
    check = BF.check_fused(x)
    step, verify, _, _, _, _ = BF.fused_fns(x)
    return dict(verify_us=bench_gdn.graph_time(verify)[0], step_us=bench_gdn.graph_time(step)[0], check=check)


def main():
    x = bench_gdn.make_inputs(64, 64, "random", 0)
    out = {}
    base = PD._record_kernel
    with tempfile.TemporaryDirectory() as tmp:
        runtime_g = record_kernel(tmp, RUNTIME_G)
        runs = [("record 2 warps", base, 2, None), ("record cap 128", base, 2, 128), ("record cap 96", base, 2, 96),
                ("record G loop", runtime_g, 2, None), ("record G loop cap 128", runtime_g, 2, 128),
                ("record 4 warps cap 64", base, 4, 64), ("record 2 warps", base, 2, None),
                ("record cap 128", base, 2, 128)]
        for i, (tag, kernel, warps, cap) in enumerate(runs):
            PD._record_kernel, PD.RECORD_WARPS, PD.RECORD_MAX_REGISTERS = kernel, warps, cap
            try:
                r = step_time(x)
            except Exception as exc:  # noqa: BLE001
                print(f"{tag}: {type(exc).__name__}: {str(exc)[:1500]}", flush=True)
                continue
            out[f"{i}:{tag}"] = r
            print(f"{tag:22s} verify {r['verify_us']:6.1f} us  step {r['step_us']:6.1f} us  record "
                  f"{r['step_us'] - r['verify_us']:5.1f}  errors o / Delta / state "
                  + " / ".join(f"{v:.1e}" for v in r["check"].values()), flush=True)
        PD._record_kernel, PD.RECORD_WARPS, PD.RECORD_MAX_REGISTERS = base, 2, None
        for tag, edits in (("library", []), ("solve ring 3", [("SOLVER_SLOTS = 2", "SOLVER_SLOTS = 3")]),
                           ("library", []), ("solve ring 3", [("SOLVER_SLOTS = 2", "SOLVER_SLOTS = 3")])):
            KA.use_module(KA.module_from(KA.form_source("library"), tmp, tag + str(len(out)), edits))
            try:
                r = step_time(x)
            except Exception as exc:  # noqa: BLE001
                print(f"{tag}: {type(exc).__name__}: {str(exc)[:1500]}", flush=True)
                continue
            out[f"{len(out)}:{tag}"] = r
            print(f"{tag:22s} verify {r['verify_us']:6.1f} us  step {r['step_us']:6.1f} us  errors o / Delta / "
                  "state " + " / ".join(f"{v:.1e}" for v in r["check"].values()), flush=True)
    with open(sys.argv[1] if len(sys.argv) > 1 else "record_ab.json", "w") as fh:
        json.dump(out, fh, indent=1)


if __name__ == "__main__":
    main()
