"""Thirteenth session, runs 1 to 3: the split pipeline's two [N, N] operands stored in less memory, against the
committed layout (two square tiles), and two apply variants that only measure what the tf32 rounding of the apply's
K loop costs. Both layouts were slower at N = 64 and reverted (bench/NOTES-gdn.md, thirteenth session): to run this
again, apply ``triangles.patch`` (runs 2 and 3's working tree) and pass ``--old`` the committed file
(``git show 20d0a04:optimized/gdn_tree.py > OLD.py``).

Variants, each verify + commit and verify alone, CUDA-graph replay, median of do_bench, at Qwen3-Next GDN shapes
(tf32, fp32 inputs, q/k L2 norm in the kernel), with the error against the float64 closed form of the first 4
requests (outputs and committed states) and the peak transient memory of verify + commit:

- ``two_tiles``: the split pipeline as committed before this session (``--old``: that version of
  ``optimized/gdn_tree.py``, loaded as a module of ``lumotree.optimized``);
- ``packed`` (run 1): the working tree of run 1, one square tile per value head (``TB`` below the diagonal,
  ``QKD^T`` on and above it, ``beta`` apart; 6 % slower at B = 64, N = 64 and reverted: bench/NOTES-gdn.md);
  ``triangles`` (run 2): the working tree of run 2, each operand a packed lower triangle (``_lower_triangle``),
  loaded with masks; ``triangles_unmasked`` (run 3, ``--masked``): the working tree of run 3, the same triangles
  loaded without masks (each row reads on into the next rows' elements, then zeros them), against
  ``triangles_masked`` (run 2's loads);
- ``<working tree>_s0_trunc``: the working tree with the apply's ``S0`` tiles fed to the tensor cores unrounded (the
  hardware truncates to tf32), a measurement only;
- ``<working tree>_all_trunc``: also q and k unrounded in the apply's K loop, a measurement only.

Errors: the default launch config of the row's full batch (the split pipeline at B >= 16), on its first requests
(run 1 measured them with the default config of those requests alone, i.e. the fused kernel: not informative).

Run (GPU): PYTHONPATH=$PWD:$PWD/bench python3 bench/results/2026-12-02b/pack_probe.py --old OLD.py --out pack.json
[--name triangles]
"""

import argparse
import importlib.util
import inspect
import json
import os
import sys
import tempfile

import torch

import gdn_tree as T  # bench/gdn_tree.py
from lumotree.optimized import gdn_tree as G

S0_ROUNDED = "s_c = _tf32_round(tl.load(state + kc[:, None] * V + vcols[None, :]), PRECISION)  # [BK, BV]"
S0_TRUNCATED = "s_c = tl.load(state + kc[:, None] * V + vcols[None, :])  # [BK, BV]"
QK_ROUNDED = ("ks = tl.dot(_round_qk(k_c, PRECISION, QK16), s_c, ks, input_precision=PRECISION)",
              "qs = tl.dot(_round_qk(q_c, PRECISION, QK16), s_c, qs, input_precision=PRECISION)")
QK_TRUNCATED = ("ks = tl.dot(k_c, s_c, ks, input_precision=PRECISION)",
                "qs = tl.dot(q_c, s_c, qs, input_precision=PRECISION)")
SHAPES = [(64, 64, "random"), (64, 32, "random"), (64, 128, "random"), (16, 64, "random"), (64, 64, "chain")]


def load_module(name: str, source: str, tmp: str):
    """``source`` as the module ``lumotree.optimized.<name>`` (a file, so that Triton can read its kernels)."""
    path = os.path.join(tmp, f"{name}.py")
    with open(path, "w") as fh:
        fh.write(source)
    spec = importlib.util.spec_from_file_location(f"lumotree.optimized.{name}", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


MASKED = {  # run 3: the working tree's unmasked triangle loads back to run 2's masked ones
    "tl.where(stored, tl.load(tb_qkd + tri), 0.0)": "tl.load(tb_qkd + tri, mask=stored, other=0.0)",
    "tl.where(stored, tl.load(tb_qkd + TRI + tri), 0.0)": "tl.load(tb_qkd + TRI + tri, mask=stored, other=0.0)",
}


def substituted(src: str, pairs) -> str:
    """``src`` with each ``(old, new)`` of ``pairs`` replaced; every ``old`` must be there."""
    for old, new in pairs:
        assert old in src, old
        src = src.replace(old, new)
    return src


def variants(old_path: str, tmp: str, name: str, masked: bool = False) -> dict:
    src = inspect.getsource(G)
    mods = {"two_tiles": load_module("probe_two_tiles", open(old_path).read(), tmp), name: G}
    if masked:
        mods["triangles_masked"] = load_module("probe_masked", substituted(src, MASKED.items()), tmp)
        return mods
    s0_trunc = substituted(src, [(S0_ROUNDED, S0_TRUNCATED)])  # also the fused kernel's line (not timed here)
    mods[f"{name}_s0_trunc"] = load_module("probe_s0_trunc", s0_trunc, tmp)
    mods[f"{name}_all_trunc"] = load_module("probe_all_trunc", substituted(s0_trunc, zip(QK_ROUNDED, QK_TRUNCATED)),
                                            tmp)
    return mods


def fns(mod, x):
    meta = mod.tree_meta(x["parents"])
    pool = x["pool"].clone()

    def verify():
        return mod.gdn_tree_verify(x["q"], x["k"], x["v"], x["g"], x["beta"], pool, x["slots"], x["parents"],
                                   use_qk_l2norm_in_kernel=True, input_precision="tf32", meta=meta, validate=False)

    def both():
        _, f = verify()
        mod.gdn_tree_commit(pool, x["slots"], f, x["parents"], x["accepted"], input_precision="tf32", meta=meta,
                            validate=False)

    return verify, both


def errors(mod, x, sub: int = 4) -> tuple[float, float]:
    return T.errors(x, "tf32", sub, mod)  # run with the full batch's launch config


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--old", required=True, help="optimized/gdn_tree.py as committed before this session")
    parser.add_argument("--out", default="pack.json")
    parser.add_argument("--name", default="packed", help="the working tree's variant")
    parser.add_argument("--masked", action="store_true", help="run 3: against masked triangle loads, no trunc")
    args = parser.parse_args()
    mods = variants(args.old, tempfile.mkdtemp(), args.name, args.masked)
    rows = []
    for B, N, kind in SHAPES:
        x = T.make_inputs(B, N, kind, seed=B * 1000 + N)
        row = dict(B=B, N=N, kind=kind)
        outs = {}
        for name, mod in mods.items():
            verify, both = fns(mod, x)
            o, f = verify()
            outs[name] = (o.clone(), f.delta.clone())
            row[f"{name}_us"], _ = T.graph_time(both)
            row[f"{name}_verify_us"], _ = T.graph_time(verify, rep_ms=60)
            if (B, N) == (64, 64) and name in ("two_tiles", args.name):
                row[f"{name}_MiB"] = T.peak_mib(both)
            row[f"{name}_err_o"], row[f"{name}_err_s"] = errors(mod, x)
            del verify, both
        # the same numbers in other places: the same outputs and deltas (run 1's packed tile: not bit for bit)
        row[f"{args.name}_vs_two_tiles_max_abs"] = max(float((a - b).abs().max()) for a, b in
                                                      zip(outs[args.name], outs["two_tiles"]))
        rows.append(row)
        print({k: round(v, 2) if isinstance(v, float) and (k.endswith("_us") or k.endswith("MiB")) else v
               for k, v in row.items()}, flush=True)
        del x, outs
        torch.cuda.empty_cache()
    json.dump(dict(card=torch.cuda.get_device_name(), triton=__import__("triton").__version__, rows=rows),
              open(args.out, "w"), indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
