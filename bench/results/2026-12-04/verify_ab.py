"""Thirty-fifth session: forms of the library's fused verify kernel, each built from the library source with text
edits (``VARIANTS``), checked against float64 (``bench/gdn_fused.check_fused``) and timed in the step (CUDA-graph
medians: the verify alone, the step = verify + record) in one process, at B = 64, N = 64 (random trees).

- ``ov``: O leaves through v's buffer after Delta (its own 32 KiB staging tile dropped); the loader's next ``v``
  waits for the O store's read (the next item's first state-chunk ``store_wait``);
- ``s4`` / ``s6``: the solve's q / k ring at 4 / 6 slots (its Gram loop latency-bound at 2: traces of run 79);
- ``st4``: the loader's ring at 4 stages.
- run 112: ``pow2``: the doubling's last square added (``L`` rounds cover depth ``2^L``, not ``2^L - 1``); ``h16``:
  the doubling's operands in fp16; ``d16``: Delta stored in fp16 (timing only: the descriptor's fp16 view of the
  fp32 buffer, so its check fails).

Runs 111-112 edited the library kernel of 458b66c (``git show 458b66c:optimized/_gdn_fused_gluon.py``); run 113
edits the one that adopted ``pow2``, ``h16`` (with tf32 past ``FP16_DOUBLING_MAX_DEPTH``) and ``d16``:
``f16only`` (the doubling's tf32 branch dropped: timing only, unsafe past that depth), ``r176`` / ``r192`` (the
solve's register budget). Run 114 edits the library with the operand type a launch constant (``FP16_DOUBLING``,
from ``max_depth``): ``tf32`` (the doubling's operands tf32 whatever the launch says), ``r176`` / ``r192``.

Run (GPU): ``PYTHONPATH=$PWD:$PWD/bench python bench/results/2026-12-04/verify_ab.py OUT.json "lib,ov+s4,..."``
"""
import os
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(HERE, "..", "2026-12-03i"))
import kernel_ab as KA  # noqa: E402

OV = [
    ("    o_smem = gl.allocate_shared_memory(gl.float32, [N, V], o_desc.layout)\n",
     "    o_smem = v_smem  # (variant ov) O leaves through v's buffer too\n"),
    ("            tma.store_wait(0)\n            mbarrier.arrive(empty.index(s))\n",
     "            tma.store_wait(0)\n"
     "            if k0 == 0:\n"
     "                if count > 0:  # the previous item's O store has read v's buffer\n"
     "                    mbarrier.arrive(ep_empty)\n"
     "            mbarrier.arrive(empty.index(s))\n"),
    ("        tma.store_wait(1)  # the previous item's O store has read o_smem\n",
     "        tma.store_wait(0)  # Delta's store has read v's buffer\n"),
    ("        tma.store_wait(1)  # Delta's store has read v's buffer\n        mbarrier.arrive(ep_empty)\n", ""),
]
POW2 = [  # the last round's square added: L rounds cover depth 2^L (not 2^L - 1)
    ("        for e in gl.static_range(6):  # bit_length(max depth); N = 64: depths < 64\n"
     "            levels += (depth_max >= (1 << e)).to(gl.int32)\n",
     "        for e in gl.static_range(6):  # bit_length(max depth - 1)\n"
     "            levels += (depth_max > (1 << e)).to(gl.int32)\n"
     "        levels = gl.where(depth_max > 1, gl.maximum(levels, 2), 1)\n"),
    ("        power, inv = warpgroup_mma_wait(0, deps=(power, inv))\n    return ",
     "        power, inv = warpgroup_mma_wait(0, deps=(power, inv))\n"
     "    inv = inv + gl.where(levels > 1, power, 0.0)  # + P^(2^L): the last square\n    return "),
]
H16_BODY = '''    N: gl.constexpr = rows.shape[0]
    mma_nn: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, N, 8])
    acc: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, N, 16])
    a16: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=acc, k_width=2)
    half: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)
    r16 = rows_smem._reinterpret(gl.float16, [N, N], half)
    c16 = cols_smem._reinterpret(gl.float16, [N, N], half)
    inv = gl.convert_layout(gl.where(rows[:, None] == cols[None, :], 1.0, 0.0) + power, acc)  # I + P_0
    power = gl.convert_layout(power, acc)
    if levels > 1:
        _barrier()
        r16.store(power.to(gl.float16))
        c16.permute((1, 0)).store(power.to(gl.float16))
        _barrier()
        fence_async_shared()
        power = warpgroup_mma(r16, c16.permute((1, 0)), power, use_acc=False)  # P_1
    for step in range(1, levels):
        _barrier()
        r16.store(power.to(gl.float16))
        c16.permute((1, 0)).store(power.to(gl.float16))
        _barrier()
        fence_async_shared()
        power = warpgroup_mma(r16, c16.permute((1, 0)), power, use_acc=False, is_async=True)
        inv = warpgroup_mma(gl.convert_layout(inv.to(gl.float16), a16), c16.permute((1, 0)), inv, is_async=True)
        power, inv = warpgroup_mma_wait(0, deps=(power, inv))
    return gl.convert_layout(inv, mma_nn)
'''
D16 = [
    ("        v_smem.permute((1, 0)).store(delta_t)  # Delta leaves through v's buffer (v is in registers)\n"
     "        _barrier()\n        fence_async_shared()\n        _tma_store(delta_desc, [b * N, hv * V], v_smem)\n",
     "        d16_smem = v_smem._reinterpret(gl.float16, [N, V], delta_desc.layout)\n"
     "        d16_smem.permute((1, 0)).store(delta_t.to(gl.float16))\n"
     "        _barrier()\n        fence_async_shared()\n        _tma_store(delta_desc, [b * N, hv * V], d16_smem)\n"),
    ("            TensorDescriptor.from_tensor(d2, [N, V], _layout([N, V], f32)),\n",
     "            TensorDescriptor.from_tensor(d2.view(__import__('torch').float16), [N, V],\n"
     "                                         _layout([N, V], gl.float16)),\n"),
]


def h16_edits(src: str):
    """The doubling's products in fp16 (fp32 accumulation): its body replaced."""
    start = src.index("    inv = gl.where(rows[:, None] == cols[None, :], 1.0, 0.0) + power  # I + P_0\n")
    end = src.index("    return inv\n", start) + len("    return inv\n")
    return [(src[start:end], H16_BODY)]


VARIANTS = {
    "lib": [],
    "ov": OV,
    "s4": [("SOLVER_SLOTS = 2", "SOLVER_SLOTS = 4")],
    "s6": [("SOLVER_SLOTS = 2", "SOLVER_SLOTS = 6")],
    "st4": [("STAGES = 3  #", "STAGES = 4  #")],
    "pow2": POW2,
    "d16": D16,
    "h16": "h16",
    "f16only": [("    if (code >> 4) != 0:\n", "    if False:\n")],
    "tf32": [("    if not FP16:\n", "    if True:\n")],
    "r176": [("SOLVER_REGS = 184", "SOLVER_REGS = 176")],
    "r192": [("SOLVER_REGS = 184", "SOLVER_REGS = 192")],
}


def variant_source(tag: str) -> str:
    """The library kernel's source with the edits of every ``+``-joined part of ``tag``."""
    src = KA.form_source("library")
    for part in sorted(tag.split("+"), key=lambda part: part != "h16"):  # h16 replaces the doubling's body
        src = KA.edited(src, h16_edits(src) if VARIANTS[part] == "h16" else VARIANTS[part], tag)
    return src


def variant_module(tag: str, tmp):
    return KA.module_from(variant_source(tag), tmp, tag)


def main():
    import gdn_tree as bench_gdn  # noqa: PLC0415

    runs = sys.argv[2].split(",")
    x = bench_gdn.make_inputs(64, 64, "random", 0)
    with tempfile.TemporaryDirectory() as tmp:
        KA.run_forms(x, runs, {tag: variant_module(tag, tmp) for tag in dict.fromkeys(runs)}, sys.argv[1])


if __name__ == "__main__":
    main()
