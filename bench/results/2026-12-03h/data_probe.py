"""Thirty-third session: why the library's fused verify kernel (202 us in run 98's profile) is slower than the
probe's FOLD 28 (190.2 us in run 95, its preparation kernel included).

Run 95's switch variants (``fused_variants.py``) all ran the unmodified kernel: the library's wrapper imports its
kernel module with ``from . import _gdn_fused_gluon``, which reads the package attribute, not ``sys.modules``, so
swapping the ``sys.modules`` entry alone changed nothing. Here both are swapped (:func:`use_module`), and every
variant is checked against the float64 closed form (``bench/gdn_fused.check_fused``) before it is timed (CUDA-graph
medians of the verify alone and of the step, verify + record). Variants of the library's current kernel source
(each edit must match once):

- ``probe inputs``: the library kernel on the probe's q / k (unit rows times a per-row scale in [1, 4] for q and
  [0.25, 1] for k) instead of ``make_inputs``' ``randn`` rows (norm ~11);
- ``no k_rnorm store``: the norm partition never stores ``k_rnorm`` (the probe's did not);
- ``static L4``: four doubling steps, unrolled (the probe's constant; the bench's trees need at most 4);
- ``no active flag``: ``gamma_a`` loaded as is, ``Delta_p`` not masked, the flag not cleared (as the probe);
- ``no padding masks``: the epilogue's selections by ``num_nodes`` left out (no sizes are given here);
- ``unrolled guarded doubling`` (run 102): the doubling loop unrolled to its largest count (5 steps after the
  first factor, N = 64) with each step guarded by the request's own count, instead of a runtime loop;
- ``lean solve masks`` (run 102): without sizes, ``-A`` and ``QKD`` not selected by the ancestor mask a second
  time (``d`` is already 0 off the paths, and ``K K^T`` / ``Q K^T`` are finite when every node is real): in the
  compile-only SASS the solve partition loses its 46 ``PRMT``, 32 ``SEL`` and 16 ``P2R`` (the mask's 32
  predicates a thread packed into registers to live until the second use), 2635 -> 2549 instructions; the
  probe's solve selects ``QKD`` by the decays alone;
- ``unrolled doubling, lean masks`` (run 102): both.

- ``diag: ...`` (run 103, thirty-fourth session): builds with one part of the work removed (one doubling step, no
  ``log Gamma`` row sum, no ``log_gamma`` store, no depth load, no path update, no state write-back), timed only
  (their results are wrong by design): which partition sets the pace.

Run (GPU): ``PYTHONPATH=$PWD:$PWD/bench python bench/results/2026-12-03h/data_probe.py [OUT [VARIANT ...]]``
(the named variants only, with the library before and after).
"""
import importlib.util
import json
import os
import sys
import tempfile

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", ".."))
import gdn_fused as BF  # noqa: E402
import gdn_tree as bench_gdn  # noqa: E402

import lumotree.optimized as package  # noqa: E402

NAME = "lumotree.optimized._gdn_fused_gluon"
LIBRARY = os.path.join(HERE, "..", "..", "..", "optimized", "_gdn_fused_gluon.py")


def unrolled_doubling(src: str) -> tuple[str, str]:
    """The doubling's runtime loop and the same loop unrolled to 5 steps, each guarded by ``step < levels``."""
    start = src.index("    for step in range(1, levels):\n")
    loop = src[start:src.index("    return inv\n", start)]
    body = loop.split("\n", 1)[1]
    guarded = "".join(("    " + line if line.strip() else line) for line in body.splitlines(True))
    return loop, "    for step in gl.static_range(1, 6):\n        if step < levels:\n" + guarded


EDITS = {
    "unrolled guarded doubling": [unrolled_doubling(open(LIBRARY).read())],
    "lean solve masks": [(
        "        power = gl.where(anc & (rows[:, None] != cols[None, :]), kk * decay * row_a[:, None], 0.0)  # -A\n"
        "        if NORM:\n"
        "            qk = gl.where(anc, qk * decay * rq_r[:, None], 0.0)  # QKD = diag(rq) scale Q K^T ⊙ D\n"
        "        else:\n"
        "            qk = gl.where(anc, qk * decay, 0.0)  # QKD = scale Q K^T ⊙ D\n",
        "        if HAS_NUM:\n"
        "            power = gl.where(anc & (rows[:, None] != cols[None, :]), kk * decay * row_a[:, None], 0.0)\n"
        "            qk = gl.where(anc, qk * decay, 0.0)\n"
        "        else:\n"
        "            power = gl.where(rows[:, None] != cols[None, :], kk * decay * row_a[:, None], 0.0)\n"
        "            qk = qk * decay\n"
        "        if NORM:\n"
        "            qk = qk * rq_r[:, None]\n")],
    "no k_rnorm store": [("        if hv % (HV // H) == 0:  # (0 on padding nodes)", "        if hv < 0:")],
    "static L4": [("    for step in range(1, levels):", "    for step in gl.static_range(1, 4):"),
                  ("        if step + 1 < levels:", "        if step + 1 < 4:"),
                  ("    if levels > 1:\n", "    if True:\n")],
    "no active flag": [
        ("        active = gl.load(active_ptr + pend) != 0\n"
         "        gamma_a = gl.where(active, gl.load(ga_ptr + pend), 1.0)", "        gamma_a = gl.load(ga_ptr + pend)"),
        (" * gl.where(active, 1.0, 0.0)  # [V, PATH]", "  # [V, PATH]"),
        ("        gl.store(active_ptr + pend, 0)  # applied: this item owns its entry\n", "")],
    "no padding masks": [("        x_t = gl.where(real[None, :], x_t, 0.0)\n", ""),
                         ("gl.where(real[None, :], gl.convert_layout(delta_t, mma), 0.0)",
                          "gl.convert_layout(delta_t, mma)"),
                         ("gl.where(real[None, :], gl.convert_layout(o_t, mma), 0.0)", "gl.convert_layout(o_t, mma)")],
}
EDITS["unrolled doubling, lean masks"] = EDITS["unrolled guarded doubling"] + EDITS["lean solve masks"]
# run 103: diagnostics (timing only; each removes work, most break the results): which partition sets the pace
EDITS.update({
    "diag: one doubling": [("        beta_c = gl.where(cols < n_b, beta_c, 0.0)  # [N]\n",
                            "        levels = 1\n        beta_c = gl.where(cols < n_b, beta_c, 0.0)  # [N]\n")],
    "diag: no row sum": [("log_gamma = _row_sum(gl.where(anc, g_c[None, :], 0.0), 1)",
                          "log_gamma = gl.convert_layout(g_c, gl.SliceLayout(1, mma_nn))")],
    "diag: no log_gamma store": [("        gl.store(log_gamma_ptr + ((b * N + rows) * HV + hv), log_gamma)\n", "")],
    "diag: no depth load": [("depth = gl.load(depth_ptr + b * N + rows, mask=rows < n_b, other=0)",
                             "depth = rows * 0 + 15")],
    "diag: no path update": [("s_t = s_t * gamma_a + gl.convert_layout(upd, a_op)", "s_t = s_t * gamma_a")],
    "diag: no write-back": [("            _tma_store(pool_desc, [pend * K + k0, 0], s_ring.index(s))"
                             "  # written back in place\n", ""), ("            tma.store_wait(0)\n            mbarrier.arrive(empty.index(s))",
                                   "            mbarrier.arrive(empty.index(s))")],
})
EDITS["diag: no row sum, store, depth"] = (EDITS["diag: no row sum"] + EDITS["diag: no log_gamma store"]
                                           + EDITS["diag: no depth load"])


def probe_inputs(x):
    """The probe's q / k: unit rows times a per-row scale in [1, 4] (q) / [0.25, 1] (k)."""
    gen = torch.Generator(device=x["q"].device).manual_seed(7)
    out = dict(x)
    for name, lo, hi in (("q", 1.0, 4.0), ("k", 0.25, 1.0)):
        unit = x[name] / x[name].norm(dim=-1, keepdim=True)
        scale = lo + (hi - lo) * torch.rand(unit.shape[:3] + (1, ), generator=gen, device=unit.device)
        out[name] = (unit * scale).contiguous()
    return out


def variant(tag, tmp):
    """The library kernel module with ``EDITS[tag]`` applied, loaded from a file of its own."""
    src = open(LIBRARY).read()
    for old, new in EDITS[tag] + [("from .gdn_tree_pending import", "from lumotree.optimized.gdn_tree_pending import")]:
        assert src.count(old) == 1, (tag, old)
        src = src.replace(old, new)
    name = "fused_" + tag.replace(" ", "_")
    path = os.path.join(tmp, name + ".py")
    with open(path, "w") as fh:
        fh.write(src)
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def use_module(mod):
    """The module that ``gdn_tree_verify_fused`` launches from (package attribute and ``sys.modules``)."""
    sys.modules[NAME] = mod
    setattr(package, "_gdn_fused_gluon", mod)


def timed(x):
    check = BF.check_fused(x)
    step, verify, _, _, _, _ = BF.fused_fns(x)
    return dict(verify_us=bench_gdn.graph_time(verify)[0], step_us=bench_gdn.graph_time(step)[0], check=check)


def main():
    x = bench_gdn.make_inputs(64, 64, "random", 0)
    from lumotree.optimized import _gdn_fused_gluon as lib  # noqa: PLC0415
    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        only = sys.argv[2:]
        runs = [("library", x, lib)] + ([] if only else [("probe inputs", probe_inputs(x), lib)])
        runs += [(tag, x, variant(tag, tmp)) for tag in (only or EDITS)] + [("library again", x, lib)]
        for tag, inputs, mod in runs:
            use_module(mod)
            try:
                out[tag] = r = timed(inputs)
            except Exception as exc:  # noqa: BLE001
                print(f"{tag}: {type(exc).__name__}: {str(exc)[:1500]}", flush=True)
                continue
            print(f"{tag:20s} verify {r['verify_us']:6.1f} us  step {r['step_us']:6.1f} us  errors o / Delta / "
                  "state " + " / ".join(f"{v:.1e}" for v in r["check"].values()), flush=True)
    use_module(lib)
    with open(sys.argv[1] if len(sys.argv) > 1 else "data_probe.json", "w") as fh:
        json.dump(out, fh, indent=1)


if __name__ == "__main__":
    main()
