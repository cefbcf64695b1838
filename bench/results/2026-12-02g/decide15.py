"""Eighteenth session, run 15: pick the large-batch apply form that ``ab13.py B cap``'s table at B = 64 (log given
as argv) shows faster, and write it into this copy's ``verify_config`` before the benchmark of the same run (the
device copy only; the library gets the same edit by hand, with its tests, when the numbers hold).

Candidates (the 64-column apply from ``B * HV >= 8`` SMs): capped at 128 registers, 2 or 3 stages, the commit
launched as the apply exits or early. Chosen if it gains >= 2 us in verify + commit over the library's form.
Prints what it chose.
"""

import re
import sys

PATH = "optimized/gdn_tree.py"


def table(log: str) -> dict[str, float]:
    """variant -> verify + commit (us) of the last table in ``log``."""
    rows = re.findall(r"^\| (\w+) \| ([\d.]+) \| ([\d.]+) \|$", open(log).read(), re.M)
    return {name: float(both) for name, both, _ in rows}


def edit(src: str, old: str, new: str) -> str:
    assert src.count(old) == 1, old
    return src.replace(old, new)


big = table(sys.argv[1])
src = open(PATH).read()
best = min(("wide_cap128", "wide_cap128_early", "wide_s2_cap128", "wide_s2_cap128_early"),
           key=lambda n: big.get(n, 1e9))
chosen = "default"
if big.get(best, 1e9) <= big["default"] - 2.0:
    chosen = best
    src = edit(src, "max_registers=128 if fp16_scratch and not wide else 0", "max_registers=128 if fp16_scratch else 0")
    if "_s2" in best:
        src = edit(src, "num_warps, 3 if fp16_scratch else 2, True,", "num_warps, 3 if fp16_scratch and not wide else 2, True,")
    if best.endswith("_early"):
        src = edit(src, "early_signal=not wide)", "early_signal=True)")
open(PATH, "w").write(src)
print(f"chosen: large {chosen} ({big.get(best)} against {big['default']} us)")
