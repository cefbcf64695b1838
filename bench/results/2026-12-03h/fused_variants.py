"""Thirty-third session: why the library's fused verify kernel (198.9 us, run 94's profile) is slower than the
probe's FOLD 28 (190.9 us with its preparation kernel). The variants are the library's ``_gdn_fused_gluon.py`` as
of commit ``BASE`` (``git show``: run this from the repository) with three switches (module constants, set by
:func:`variant_source`): ``_STATIC_L`` (the doubling count a constant, its loop unrolled, as in the
probe), ``_PLAIN`` (no ``active`` flag: ``gamma_a`` loaded as is, ``Delta_p`` not masked, the flag not cleared, as
in the probe), ``_SKIP_REAL`` (without ``num_nodes`` no padding masks in the epilogue). Each variant is a copy of
that module with the switches set, run through the library's ``gdn_tree_verify_fused`` (its module swapped in),
checked against the unmodified library on the first call, then timed (CUDA-graph medians, verify + preparation).

**Run 95's result is void**: swapping only the ``sys.modules`` entry did not reach the wrapper, whose ``from .
import _gdn_fused_gluon`` reads the package attribute, so every "variant" ran the unmodified kernel (identical
outputs, times within noise). :func:`main` now swaps both; ``data_probe.py`` (run 100) repeats the question on
the current kernel.

Run (GPU): ``PYTHONPATH=$PWD:$PWD/bench python bench/results/2026-12-03h/fused_variants.py``.
"""
import importlib.util
import json
import os
import subprocess
import sys
import tempfile

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", ".."))
import gdn_tree as bench_gdn  # noqa: E402

from lumotree.optimized import gdn_tree as G  # noqa: E402
from lumotree.optimized import gdn_tree_fused as FV  # noqa: E402
from lumotree.optimized import gdn_tree_pending as PD  # noqa: E402

NAME = "lumotree.optimized._gdn_fused_gluon"
VARIANTS = {"base": (0, False, False), "L4": (4, False, False), "plain": (0, True, False),
            "skip-real": (0, False, True), "all": (4, True, True)}


BASE = "e78a343"  # the library kernel that run 94 profiled


def variant_source(static_l: int, plain: bool, skip_real: bool) -> str:
    """``BASE``'s kernel module with the switches: each edit must match once."""
    src = subprocess.run(["git", "show", f"{BASE}:optimized/_gdn_fused_gluon.py"], capture_output=True, text=True,
                         check=True, cwd=HERE).stdout
    start = src.index("@gluon.jit\ndef _unit_lower_inverse(")
    static = src[start:src.index("@gluon.jit\ndef _loader(")]  # the doubling with its count a constant
    for a, b in (("_unit_lower_inverse(", "_unit_lower_inverse_static("),
                 ("rows_smem, levels):", "rows_smem, L: gl.constexpr):"), ("if levels > 1:", "if L > 1:"), ("range(1, levels)", "gl.static_range(1, L)"),
                 ("step + 1 < levels", "step + 1 < L")):
        assert static.count(a) == 1, a
        static = static.replace(a, b)
    masked = "HAS_NUM or not _SKIP_REAL"
    edits = [
        ("WORD_BITS = 32\n", f"WORD_BITS = 32\n_STATIC_L = gl.constexpr({static_l})\n"
         f"_PLAIN = gl.constexpr({plain})\n_SKIP_REAL = gl.constexpr({skip_real})\n"),
        ("@gluon.jit\ndef _loader(", static + "@gluon.jit\ndef _loader("),
        ("        active = gl.load(active_ptr + pend) != 0\n"
         "        gamma_a = gl.where(active, gl.load(ga_ptr + pend), 1.0)\n",
         "        if _PLAIN:\n            gamma_a = gl.load(ga_ptr + pend)\n        else:\n"
         "            active = gl.load(active_ptr + pend) != 0\n"
         "            gamma_a = gl.where(active, gl.load(ga_ptr + pend), 1.0)\n"),
        ("        dp_t = dp_smem.permute((1, 0)).load(a_bk) * gl.where(active, 1.0, 0.0)",
         "        if _PLAIN:\n            dp_t = dp_smem.permute((1, 0)).load(a_bk)\n        else:\n"
         "            dp_t = dp_smem.permute((1, 0)).load(a_bk) * gl.where(active, 1.0, 0.0)"),
        ("        gl.store(active_ptr + pend, 0)", "        if not _PLAIN:\n            gl.store(active_ptr + pend, 0)"),
        ("        x_t = gl.where(real[None, :], x_t, 0.0)\n",
         f"        if {masked}:\n            x_t = gl.where(real[None, :], x_t, 0.0)\n"),
        ("        delta_t = gl.where(real[None, :], gl.convert_layout(delta_t, mma), 0.0)\n",
         f"        if {masked}:\n"
         "            delta_t = gl.where(real[None, :], gl.convert_layout(delta_t, mma), 0.0)\n"
         "        else:\n            delta_t = gl.convert_layout(delta_t, mma)\n"),
        ("        o_t = gl.where(real[None, :], gl.convert_layout(o_t, mma), 0.0)\n",
         f"        if {masked}:\n            o_t = gl.where(real[None, :], gl.convert_layout(o_t, mma), 0.0)\n"
         "        else:\n            o_t = gl.convert_layout(o_t, mma)\n"),
        ("        levels = gl.load(levels_ptr + b)\n"
         "        inv = _unit_lower_inverse(power, rows, cols, solve_smem, rows_smem, levels)\n",
         "        if _STATIC_L > 0:\n"
         "            inv = _unit_lower_inverse_static(power, rows, cols, solve_smem, rows_smem, _STATIC_L)\n"
         "        else:\n            levels = gl.load(levels_ptr + b)\n"
         "            inv = _unit_lower_inverse(power, rows, cols, solve_smem, rows_smem, levels)\n"),
        ("from .tree_attention import tree_size", "from lumotree.optimized.tree_attention import tree_size"),
        ("    from .gdn_tree_pending import PATH_NODES",
         "    from lumotree.optimized.gdn_tree_pending import PATH_NODES"),
    ]
    for old, new in edits:
        assert src.count(old) == 1, old
        src = src.replace(old, new)
    return src


def load_variant(tag, static_l, plain, skip_real, tmp):
    path = os.path.join(tmp, f"fused_{tag.replace('-', '_')}.py")
    with open(path, "w") as fh:
        fh.write(variant_source(static_l, plain, skip_real))
    spec = importlib.util.spec_from_file_location(f"fused_{tag.replace('-', '_')}", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def main():
    x = bench_gdn.make_inputs(64, 64, "random", 0)
    meta = G.tree_meta(x["parents"])
    args = (x["q"], x["k"], x["v"], x["g"], x["beta"])
    _, first = G.gdn_tree_verify(*args, x["pool"].clone(), x["slots"], x["parents"], use_qk_l2norm_in_kernel=True,
                                 input_precision="tf32", meta=meta, validate=False)
    lib = sys.modules.get(NAME) or importlib.import_module(NAME)
    results, want = {}, None
    with tempfile.TemporaryDirectory() as tmp:
        for tag, flags in [("library", None)] + list(VARIANTS.items()):
            mod = lib if flags is None else load_variant(tag, *flags, tmp)
            sys.modules[NAME] = mod
            setattr(sys.modules["lumotree.optimized"], "_gdn_fused_gluon", mod)
            pool = x["pool"].clone()
            pending = PD.pending_commits(pool)
            PD.gdn_tree_record(pending, pool, x["slots"], first, x["parents"], x["accepted"], meta=meta,
                               validate=False)

            def verify(pool=pool, pending=pending):
                return FV.gdn_tree_verify_fused(*args, pool, x["slots"], x["parents"], pending,
                                                use_qk_l2norm_in_kernel=True, meta=meta, validate=False)
            o, f = verify()
            torch.cuda.synchronize()
            got = (o, f.delta, pool[x["slots"].long()])
            if want is None:
                want = tuple(t.clone() for t in got)
            errs = [bench_gdn.rel_err(a, b) for a, b in zip(got, want)]
            us = bench_gdn.graph_time(verify)[0]
            results[tag] = dict(us=us, diff_vs_library=errs)
            print(f"{tag:10s} {us:6.1f} us   vs library o / Delta / state {errs[0]:.1e} {errs[1]:.1e} {errs[2]:.1e}",
                  flush=True)
    sys.modules[NAME] = lib
    setattr(sys.modules["lumotree.optimized"], "_gdn_fused_gluon", lib)
    with open(sys.argv[1] if len(sys.argv) > 1 else "fused_variants.json", "w") as fh:
        json.dump(results, fh, indent=1)


if __name__ == "__main__":
    main()
