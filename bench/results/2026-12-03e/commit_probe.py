"""Twenty-seventh session: how close is the commit to a read-modify-write of the same state tiles? B = 64, N = 64,
random trees, tf32, one H200. Times (CUDA graph, median) the default commit alone, then plain Triton kernels that
only scale the same pool tiles in place (``S <- c S``, the commit without its path terms) at several tilings,
torch's in-place scale and the copy rate; every RMW checked against torch on the same data in the run."""
import os
import sys

import torch
import triton
import triton.language as tl

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
import gdn_tree as bench_gdn  # noqa: E402

from lumotree.optimized import gdn_tree as G  # noqa: E402


@triton.jit
def _scale_tiles(pool_ptr, slots_ptr, scale_ptr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                 BK: tl.constexpr, BV: tl.constexpr):
    pid = tl.program_id(0)
    b = pid // HV
    hv = pid % HV
    slot = tl.load(slots_ptr + b).to(tl.int64)
    rows = tl.program_id(2) * BK + tl.arange(0, BK)
    cols = tl.program_id(1) * BV + tl.arange(0, BV)
    ptrs = pool_ptr + (slot * HV + hv) * (K * V) + rows[:, None] * V + cols[None, :]
    s = tl.load(ptrs)
    tl.store(ptrs, s * tl.load(scale_ptr + hv))


def main():
    x = bench_gdn.make_inputs(64, 64, "random", 0)
    B, HV, K, V = 64, bench_gdn.HV, bench_gdn.K, bench_gdn.V
    _, commit, _, _, pool = bench_gdn.ours_fns(x, "tf32")
    floor_bytes = 2 * B * HV * K * V * 4
    copy = bench_gdn.copy_bandwidth()
    rows = [("commit (default)", bench_gdn.graph_time(commit)[0])]
    scale = torch.full((HV,), 1.0, device="cuda")
    for bk, bv, warps in ((128, 64, 4), (128, 64, 8), (128, 128, 8), (64, 64, 4), (32, 128, 4), (64, 128, 4),
                          (128, 32, 4), (32, 64, 2)):
        grid = (B * HV, V // bv, K // bk)
        fn = lambda: _scale_tiles[grid](pool, x["slots"], scale, HV, K, V, bk, bv, num_warps=warps)  # noqa: E731
        ref = pool.clone()
        scale.fill_(0.5)
        fn()
        torch.cuda.synchronize()
        ok = torch.equal(pool, ref * 0.5)
        scale.fill_(1.0)
        rows.append((f"rmw [{bk},{bv}] {warps}w ok={ok}", bench_gdn.graph_time(fn)[0]))
    rows.append(("torch pool.mul_(1.0)", bench_gdn.graph_time(lambda: pool.mul_(1.0))[0]))
    print(f"copy rate {copy / 1e12:.2f} TB/s; floor {floor_bytes / copy * 1e6:.1f} us for {floor_bytes / 1e6:.0f} MB")
    for name, us in rows:
        print(f"| {name} | {us:.1f} us | {floor_bytes / (us * 1e-6) / 1e12:.2f} TB/s | "
              f"{floor_bytes / copy / (us * 1e-6):.2f} of copy |")


if __name__ == "__main__":
    main()
