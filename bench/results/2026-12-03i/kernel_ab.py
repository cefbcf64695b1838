"""Thirty-fourth session: the fused verify's kernel as committed (``fused_head.py``, HEAD 0e30f67), with the
doubling's two products a round issued together (``doubling``: the head with the library's ``_unit_lower_inverse``
and ``QKD`` handed over before it), the library's current kernel (that doubling plus a vector partition: ``log
Gamma``, ``Gamma`` and the doubling count moved out of the solve), and the serial doubling with the vector partition
(``serial``: the library with the head's ``_unit_lower_inverse``), each at a solve register budget (``"form
regs"``), checked against float64 (``bench/gdn_fused.check_fused``) and timed (CUDA-graph medians: the verify alone,
the step = verify + record), in one process. (Run 104 also timed the record alone: meaningless, each replay applied
the previous replay's record first.)

Run (GPU): ``PYTHONPATH=$PWD:$PWD/bench python bench/results/2026-12-03i/kernel_ab.py OUT.json ["form regs,..."]``
"""
import importlib.util
import json
import os
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", ".."))
import gdn_fused as BF  # noqa: E402
import gdn_tree as bench_gdn  # noqa: E402

import lumotree.optimized as package  # noqa: E402

NAME = "lumotree.optimized._gdn_fused_gluon"
LIBRARY = os.path.join(HERE, "..", "..", "..", "optimized", "_gdn_fused_gluon.py")


RUNS = sys.argv[2].split(",") if len(sys.argv) > 2 else ["head 200", "doubling 200", "library 200"] * 2 + [
    f"library {r}" for r in (184, 192, 208, 216)]  # run 104; run 105: the list on the command line


VEC40 = [("[40, SOLVER_REGS, 48]", "[40, SOLVER_REGS, 40]")]  # the vector partition at 40 registers (consumer 144)
LIBRARY_EDITS = {  # run 106: forms of the library kernel (SOLVER_REGS = 184 there)
    "vec40": VEC40,
    "rt40": VEC40 + [("for c0 in gl.static_range(0, N, BK):", "for c0 in range(0, N, BK):")],
}


SOLVE_HEAD = ("    CHUNKS: gl.constexpr = K // BK\n    pid = gl.program_id(0)\n    nprog = gl.num_programs(0)\n"
              "    if pid")
WAIT = ("        mbarrier.wait(tb_empty.index(buf), ((count // 2) & 1) ^ 1)"
        "  # the consumer is done with item count - 2's\n")
TB = "        tb2.index(buf).store((inv * beta_c[None, :]).to(tb2.dtype))  # TB = (I + A)^{-1} diag(beta)\n"
HEAD_DOUBLING = [  # the solve's call of the doubling in the library's form (a_nn, QKD handed over before it)
    (SOLVE_HEAD,
     "    a_nn: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma_nn, k_width=1)\n" + SOLVE_HEAD),
    ("        inv = _unit_lower_inverse(power, rows, cols, solve_smem, rows_smem, levels)\n        buf = count % 2\n"
     + WAIT + TB + "        qkd2.index(buf).store(qk.to(qkd2.dtype))\n",
     "        buf = count % 2\n" + WAIT
     + "        qkd2.index(buf).store(qk.to(qkd2.dtype))  # (before the doubling: QKD's registers free for it)\n"
     "        inv = _unit_lower_inverse(power, rows, cols, solve_smem, rows_smem, levels, a_nn)\n" + TB)]


def inverse_of(src: str) -> str:
    """The text of the kernel module's ``_unit_lower_inverse``."""
    start = src.index("@gluon.jit\ndef _unit_lower_inverse")
    return src[start:src.index("@gluon.jit\ndef _loader", start)]


def form_source(form: str) -> str:
    """The kernel module's source of ``form`` (head, doubling, serial; anything else: the library, with
    ``LIBRARY_EDITS[form]``)."""
    head, library = open(os.path.join(HERE, "fused_head.py")).read(), open(LIBRARY).read()
    if form == "head":
        return head
    if form == "doubling":
        return edited(head.replace(inverse_of(head), inverse_of(library)), HEAD_DOUBLING, form)
    if form == "serial":
        return edited(library.replace(inverse_of(library), inverse_of(head)),
                      [("levels, a_nn)\n", "levels)\n")], form)
    return edited(library, LIBRARY_EDITS.get(form, []), form)


def edited(src: str, edits, tag: str) -> str:
    for old, new in edits:
        assert src.count(old) == 1, (tag, old)
        src = src.replace(old, new)
    return src


def module_from(src: str, tmp, tag, edits=()):
    src = edited(src.replace("from .gdn_tree_pending import", "from lumotree.optimized.gdn_tree_pending import"),
                 edits, tag)
    name = "k_" + "".join(c if c.isalnum() else "_" for c in tag)
    out = os.path.join(tmp, name + ".py")
    with open(out, "w") as fh:
        fh.write(src)
    spec = importlib.util.spec_from_file_location(name, out)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def use_module(mod):
    sys.modules[NAME] = mod
    setattr(package, "_gdn_fused_gluon", mod)


def main():
    x = bench_gdn.make_inputs(64, 64, "random", 0)
    with tempfile.TemporaryDirectory() as tmp:
        mods = {}
        for tag in RUNS:
            form, regs = tag.rsplit(" ", 1)
            if tag not in mods:
                src = form_source(form)
                regs_now = "SOLVER_REGS = 200" if form in ("head", "doubling") else "SOLVER_REGS = 184"
                mods[tag] = module_from(src, tmp, tag, [(regs_now, f"SOLVER_REGS = {regs}")])
        run_forms(x, RUNS, mods, sys.argv[1] if len(sys.argv) > 1 else "kernel_ab.json")


def run_forms(x, runs, mods, out_path):
    """Each tag of ``runs`` in order (repeats allowed): its module ``mods[tag]`` swapped in, checked against
    float64, then timed (the verify alone and the step); a line printed each, the results written to
    ``out_path``."""
    out = {}
    for i, tag in enumerate(runs):
        use_module(mods[tag])
        try:
            check = BF.check_fused(x)
            step, verify, _, _, _, _ = BF.fused_fns(x)
            r = dict(verify_us=bench_gdn.graph_time(verify)[0], step_us=bench_gdn.graph_time(step)[0], check=check)
        except Exception as exc:  # noqa: BLE001
            print(f"{tag}: {type(exc).__name__}: {str(exc)[:1500]}", flush=True)
            continue
        out[f"{i}:{tag}"] = r
        print(f"{tag:20s} verify {r['verify_us']:6.1f} us  step {r['step_us']:6.1f} us  errors o / Delta / "
              "state " + " / ".join(f"{v:.1e}" for v in check.values()), flush=True)
    with open(out_path, "w") as fh:
        json.dump(out, fh, indent=1)


if __name__ == "__main__":
    main()
