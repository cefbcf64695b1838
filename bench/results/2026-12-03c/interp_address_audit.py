"""Twenty-fifth session: an address audit under the Triton interpreter (CPU) of the case that faulted on the GPU
in run 60 (tests/test_gdn_kernels.py::test_gpu_qwen_shapes_error_bounds's six gated trees of mixed sizes, Qwen3-Next
shapes) with the small-batch split rows config of ``row_halves.patch``: every load, store and atomic whose mask is
true must address one of its launch's tensor arguments. Result: none outside, in any of the call's launches (the
rows solve, and the apply through pointers: the interpreter has no tensor descriptors). A deliberate offset in the ready
flag's address is caught (384 atomics outside). So the GPU fault lies in what the interpreter does not model:
most likely the compiled rows solve (the error surfaced while the apply was being loaded, before it ran).

Run: ``git apply bench/results/2026-12-03c/row_halves.patch`` then
``TRITON_INTERPRET=1 python bench/results/2026-12-03c/interp_address_audit.py gated`` (about 40 s).
"""
import sys, numpy as np, torch
import triton.runtime.interpreter as I

RANGES = []
_orig_cvt = I._implicit_cvt
def _cvt(arg):
    if isinstance(arg, torch.Tensor):
        start = arg.data_ptr()
        RANGES.append((start, start + arg.untyped_storage().nbytes() - arg.storage_offset() * arg.element_size()))
    return _orig_cvt(arg)
I._implicit_cvt = _cvt
_orig_call = I.GridExecutor.__call__
CURRENT = [None]
def _call(self, *a, **k):
    RANGES.clear()
    CURRENT[0] = getattr(self.fn, "__name__", str(self.fn))
    return _orig_call(self, *a, **k)
I.GridExecutor.__call__ = _call
BAD = []
def check(ptrs, mask, what):
    addr = np.asarray(ptrs.data).astype(np.uint64).ravel()
    m = np.asarray(mask.data).astype(bool).ravel() if mask is not None else np.ones_like(addr, dtype=bool)
    if m.size == 1 and addr.size > 1:
        m = np.broadcast_to(m, addr.shape)
    a = addr[m]
    if a.size == 0:
        return
    ok = np.zeros(a.shape, dtype=bool)
    for s, e in RANGES:
        ok |= (a >= s) & (a < e)
    if not ok.all():
        BAD.append((CURRENT[0], what, int((~ok).sum()), I.interpreter_builder.grid_idx))
        if len(BAD) < 5:
            print("OOB", CURRENT[0], what, int((~ok).sum()), I.interpreter_builder.grid_idx, flush=True)
B = I.InterpreterBuilder
_l, _s, _r = B.create_masked_load, B.create_masked_store, B.create_atomic_rmw
def load(self, ptrs, mask, other, cp, v):
    check(ptrs, mask, "load"); return _l(self, ptrs, mask, other, cp, v)
def store(self, ptrs, value, mask, cp):
    check(ptrs, mask, "store"); return _s(self, ptrs, value, mask, cp)
def rmw(self, op, ptr, val, mask, sem, scope):
    check(ptr, mask, "atomic"); return _r(self, op, ptr, val, mask, sem, scope)
B.create_masked_load, B.create_masked_store, B.create_atomic_rmw = load, store, rmw

sys.path.insert(0, "tests")
import test_gdn_kernels as T
from lumotree.optimized import gdn_tree as G
rows = T._gpu_rows(7)
gated = sys.argv[1] == "gated"
case = T.make_case(rows, **T.QWEN, gated=gated, seed=11)
cfg = G.KernelConfig(64, 32, 8, 2, True, 8, solve_stages=2, apply_pdl=True, tma=False, halves=True, row_halves=True)
o, f = T.run_verify(case, l2norm=True, gated=gated, neg=gated, precision="tf32", config=cfg)
print("bad", len(BAD), BAD[:3], flush=True)
