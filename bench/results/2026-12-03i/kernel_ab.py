"""Thirty-fourth session: the fused verify's kernel as committed (``fused_head.py``, HEAD 0e30f67), with the
doubling's two products a round issued together (``fused_doubling.py``), and the library's current kernel (that
doubling plus a vector partition: ``log Gamma``, ``Gamma`` and the doubling count moved out of the solve), and the
serial doubling with the vector partition (``fused_serial_vectors.py``), each at a solve register budget (``"form
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


def module_from(path, tmp, tag, edits=()):
    src = open(path).read().replace("from .gdn_tree_pending import", "from lumotree.optimized.gdn_tree_pending import")
    for old, new in edits:
        assert src.count(old) == 1, (tag, old)
        src = src.replace(old, new)
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
    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        files = dict(head="fused_head.py", doubling="fused_doubling.py", serial="fused_serial_vectors.py")
        mods = {}
        for tag in RUNS:
            form, regs = tag.rsplit(" ", 1)
            if tag not in mods:
                path = os.path.join(HERE, files[form]) if form in files else LIBRARY
                regs_now = "SOLVER_REGS = 184" if path == LIBRARY else "SOLVER_REGS = 200"
                mods[tag] = module_from(path, tmp, tag, [(regs_now, f"SOLVER_REGS = {regs}")]
                                        + LIBRARY_EDITS.get(form, []))
        for i, tag in enumerate(RUNS):
            use_module(mods[tag])
            try:
                check = BF.check_fused(x)
                step, verify, _, _, _, _ = BF.fused_fns(x)
                r = dict(verify_us=bench_gdn.graph_time(verify)[0], step_us=bench_gdn.graph_time(step)[0],
                         check=check)
            except Exception as exc:  # noqa: BLE001
                print(f"{tag}: {type(exc).__name__}: {str(exc)[:1500]}", flush=True)
                continue
            out[f"{i}:{tag}"] = r
            print(f"{tag:20s} verify {r['verify_us']:6.1f} us  step {r['step_us']:6.1f} us  errors o / Delta / "
                  "state " + " / ".join(f"{v:.1e}" for v in check.values()), flush=True)
    with open(sys.argv[1] if len(sys.argv) > 1 else "kernel_ab.json", "w") as fh:
        json.dump(out, fh, indent=1)


if __name__ == "__main__":
    main()
