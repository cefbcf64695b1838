"""Twelfth session, compile-only (no GPU): does Triton's automatic warp specialisation (``tl.range(...,
warp_specialize=True)``) apply on Hopper to a persistent loop shaped like the GDN apply (per item: BK-row chunks of a
[NP, K] tile and a [K, BV] tile through tensor descriptors, one tf32 product per chunk, one store per item)?

Result with Triton 3.6.0 (installed aside: ``pip install --no-deps --target /tmp/t36 triton==3.6.0``) and 3.9.0,
sm_90, 4 warps, 3 stages:

- a nested loop (items, then chunks) with ``warp_specialize=True`` fails to compile, in ``ConvertNVGPUToLLVM``;
- one flat loop over (item, chunk) compiles with and without it to the same code: no ``setmaxnreg``, and the same
  ``mbarrier`` / ``cp.async.bulk`` / ``wgmma`` counts. The flag does nothing there.

So a producer / consumer form of the single-pass verify would have to be written with Gluon's explicit
``gl.warp_specialize`` (present in 3.6: ``triton.experimental.gluon``, with Hopper's ``tma``, ``mbarrier`` and
``warpgroup_mma``).

Run: ``PYTHONPATH=/tmp/t36 python bench/results/2026-12-02/ws_probe.py``
"""
import re, subprocess, tempfile, os, sys
import triton, triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

@triton.jit
def apply_like(q_ptr, s_ptr, o_ptr, n_items, NP: tl.constexpr, K: tl.constexpr, BV: tl.constexpr, BK: tl.constexpr,
               WS: tl.constexpr, NESTED: tl.constexpr):
    q_desc = tl.make_tensor_descriptor(q_ptr, shape=[n_items * NP, K], strides=[K, 1], block_shape=[NP, BK])
    s_desc = tl.make_tensor_descriptor(s_ptr, shape=[n_items * K, BV], strides=[BV, 1], block_shape=[BK, BV])
    o_desc = tl.make_tensor_descriptor(o_ptr, shape=[n_items * NP, BV], strides=[BV, 1], block_shape=[NP, BV])
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    if NESTED:
        for item in tl.range(pid, n_items, nprog, warp_specialize=WS):
            acc = tl.zeros([NP, BV], dtype=tl.float32)
            for k0 in range(0, K, BK):
                a = q_desc.load([item * NP, k0])
                b = s_desc.load([item * K + k0, 0])
                acc = tl.dot(a, b, acc, input_precision="tf32")
            o_desc.store([item * NP, 0], acc)
    else:
        n_k = K // BK
        acc = tl.zeros([NP, BV], dtype=tl.float32)
        for it in tl.range(0, tl.cdiv(n_items - pid, nprog) * n_k, warp_specialize=WS):
            item = pid + (it // n_k) * nprog
            k0 = (it % n_k) * BK
            a = q_desc.load([item * NP, k0])
            b = s_desc.load([item * K + k0, 0])
            acc = tl.dot(a, b, acc, input_precision="tf32")
            if it % n_k == n_k - 1:
                o_desc.store([item * NP, 0], acc)
                acc = tl.zeros([NP, BV], dtype=tl.float32)

for nested in (True, False):
    for ws in (False, True):
        sig = {"q_ptr": "*fp32", "s_ptr": "*fp32", "o_ptr": "*fp32", "n_items": "i32", "NP": "constexpr", "K": "constexpr",
               "BV": "constexpr", "BK": "constexpr", "WS": "constexpr", "NESTED": "constexpr"}
        cons = dict(NP=64, K=128, BV=32, BK=32, WS=ws, NESTED=nested)
        names = apply_like.arg_names
        src = ASTSource(fn=apply_like, signature=sig, constexprs={(names.index(n),): v for n, v in cons.items()})
        try:
            c = triton.compile(src, target=GPUTarget("cuda", 90, 128), options=dict(num_warps=4, num_stages=3))
            ptx = c.asm["ptx"]
            print(f"nested={nested} ws={ws}: ok, setmaxnreg={ptx.count('setmaxnreg')} mbarrier={ptx.count('mbarrier')} "
                  f"cp.async.bulk={ptx.count('cp.async.bulk')} wgmma={ptx.count('wgmma.mma_async')} n_warps={c.metadata.num_warps}")
        except Exception as e:
            print(f"nested={nested} ws={ws}: FAILED {type(e).__name__}: {str(e)[:300]}")
