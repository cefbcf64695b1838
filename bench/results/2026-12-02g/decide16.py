"""Eighteenth session, run 16: pick the large-batch commit that ``ab15c.py 64``'s table (log given as argv) shows
faster in verify + commit, if it gains >= 2 us over the library's default and loses <= 1 us at B = 16 (second
log), and write it into this copy's ``commit_config`` (tf32 only) before the benchmark of the same run (the device
copy only; the library gets the same edit by hand, with its tests, when the numbers hold). Prints what it chose.
"""

import re
import sys

PATH = "optimized/gdn_tree.py"
CONFIGS = {"c64_cap128": "min(V, 64), K, 4, 1, max_registers=128, chunk_rows=64",
           "c32_cap128": "min(V, 64), K, 4, 1, max_registers=128, chunk_rows=32",
           "c16": "min(V, 64), K, 4, 1, chunk_rows=16",
           "bv128_c16_cap128": "min(V, 128), K, 4, 1, max_registers=128, chunk_rows=16",
           "bv32_c32": "min(V, 32), K, 4, 1, chunk_rows=32",
           "bv32_c16": "min(V, 32), K, 4, 1, chunk_rows=16",
           "bv32_c32_w2": "min(V, 32), K, 2, 1, chunk_rows=32"}


def table(log: str) -> dict[str, float]:
    """variant -> verify + commit (us) of the last table in ``log``."""
    rows = re.findall(r"^\| (\w+) \| ([\d.]+) \| ([\d.]+) \| ([\d.]+) \|$", open(log).read(), re.M)
    return {name: float(both) for name, both, _, _ in rows}


big, mid = table(sys.argv[1]), table(sys.argv[2])
best = min(CONFIGS, key=lambda n: big.get(n, 1e9))
chosen = "default"
if big.get(best, 1e9) <= big["default"] - 2.0 and mid.get(best, 1e9) <= mid["default"] + 1.0:
    chosen = best
    src = open(PATH).read()
    old = "    if B * HV * 2 >= 2 * _num_sms(device):\n"
    assert src.count(old) == 1
    src = src.replace(old, old + f"        if precision == \"tf32\":  # run 16\n"
                      f"            return KernelConfig({CONFIGS[best]})\n")
    open(PATH, "w").write(src)
print(f"chosen: commit {chosen} ({big.get(best)} against {big['default']} us at B = 64; "
      f"{mid.get(best)} against {mid['default']} at B = 16)")
