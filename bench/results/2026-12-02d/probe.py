"""Fifteenth session (2026-12-02d), run 3: B = 16 with ``--trace`` (which graph faults: runs 1 and 2 faulted at
B = 16 and 64 in the timing loop, while every launch form alone replayed 300 times clean, ``crash64.py``), and B = 64
without fla's graph (``--no-fla``).

Run 2: the library now forms the solve's ancestor mask before its K loop
(``mask_late``: after it, as before); the gram split of the split solve (``gram2`` / ``gram4``: K K^T, Q K^T and
the norms from a gram kernel of B H splits programs that the solve, a PDL launch, sums); fp16 against fp32 scratch;
QKD loaded beside TB. One shape per process (``--shape``), so that a fault loses one shape only.

Run 1: the fp16 scratch of the split pipeline (``KernelConfig.scratch16``, the
library's default now) against fp32 scratch (``scratch32``), and the two loads-ahead-of-a-wait variants prepared in
the fourteenth session, and (``qkd_early``) the apply's QKD loaded beside TB, at B = 1, 16, 64 (N = 64, fp32 and bf16 inputs). This file began as the fourteenth
session's ``2026-12-02c/b1_probe.py``; its history follows.

Fourteenth session, runs 1 and 2: where B = 1's verify + commit time goes (issue 5's B = 1 target: <= 3x fla's
decode step; 28.2 against 7.6 us in the thirteenth session's run 7), and the launch forms that could shorten it.

One process, Qwen3-Next GDN shapes (H=16, HV=32, K=V=128), B = 1, N = 64 (random / EAGLE trees), fp32 inputs, tf32,
q/k L2 norm in the kernel. Each variant: verify + commit, verify alone and commit alone as CUDA-graph replays
(median of do_bench), the rounds interleaved (three rounds, median of the three), and its errors against the float64
closed form (outputs and committed state) run the same way. ``empty`` / ``empty2``: one / two empty Triton kernels
in one graph (the launch floor of this harness); ``fla_decode``: fla 0.6.0's single-token decode step
(``fused_recurrent_gated_delta_rule``, beta by keyword).

Run 1 (this file at commit "b1 probe: configs as the variant module's own KernelConfig"): the library's kernels
then launched a ``torch.full`` of the tree sizes before the verify and before the commit when ``num_nodes`` was not
given; variants: the split pipeline's solve forms and apply widths, the fused kernel at 8 warps, and a PDL commit
behind a signalling verify built by source substitution (it could not launch early: the fill kernel sat between).

Run 2 (the library now reads no sizes when none are given, and has ``gdn_tree_commit(pdl=True)`` and
``gdn_tree_verify(launch_dependents=True)``): ``*_pdl`` variants launch the commit with PDL behind a signalling
verify; ``split_head4`` one value head per 4-warp solve program (the best split form of run 1), ``_s2`` 2 solve
stages, ``_a3`` 3 apply stages, ``head2w`` 2 warps, ``pair`` two heads per program; the fused kernel with 64-row K
chunks, 4 stages, its mask / gates / decay after the K loop (``mask_late``, source substitution), and (measurement
only) q, k and S0 unrounded in the K loop (``trunc``).

Run 4: the split pipeline's forms at B = 1 and the fused kernel at other shapes (this file's history).

Run 5: the fused kernel with its Gram products from a gram kernel (``gram_splits``; the library
now) against the fused kernel and the best split form (``split_head4_a3``), at B = 1, 4, 8, N = 32 / 64, bf16;
a timeline of the gram-split form.

This version (prepared for a run 7 that the session's device time did not allow; compile-checked only, Triton 3.6,
sm_90): two loads moved ahead of a wait, against the library's default at B = 1 and 64: the apply's v before its
wait for the solve (``v_early``: apply registers 208 -> 203), the solve's ancestor mask before its K loop
(``mask_early``: one-head solve 0 -> 72 bytes of stack, paired 984 -> 864), both (``both_early``). Timelines with
``--timeline``.

Run 3: the inverse's doubling as L dependent products instead of 2 (L - 1) (the library now;
``old_inverse``: the previous loop, by source substitution), against the best forms of run 2; ``k_diag``: |k|^2 from
K K^T's diagonal in every mode (source substitution; the 16-bit path's rule), a candidate for tf32 mode. The
mask-late and truncation variants of run 2 are in this file's history.

Then a timeline: the fused verify and the commit with ``%globaltimer`` / ``%clock64`` stamps at phase boundaries
(each stamp waits on a reduction of the phase's result, so it perturbs the kernel slightly), replayed in a graph,
plain and with the PDL commit: per-program phase durations and the kernels' spans.

Run (GPU): PYTHONPATH=$PWD:$PWD/bench python3 bench/results/2026-12-02c/b1_probe.py --out b1.json
"""

from __future__ import annotations

import argparse
import importlib.util
import inspect
import json
import os
import sys
import tempfile
import time

import numpy as np
import torch
import triton
import triton.language as tl

import gdn_tree as T  # bench/gdn_tree.py
from lumotree.optimized import gdn_tree as G


def substituted(src: str, pairs) -> str:
    """``src`` with each ``(old, new)`` of ``pairs`` replaced once; every ``old`` must be there exactly once."""
    for old, new in pairs:
        assert src.count(old) == 1, (src.count(old), old)
        src = src.replace(old, new)
    return src


def load_module(name: str, source: str, tmp: str):
    """``source`` as the module ``lumotree.optimized.<name>`` (a file, so that Triton can read its kernels)."""
    path = os.path.join(tmp, f"{name}.py")
    with open(path, "w") as fh:
        fh.write(source)
    spec = importlib.util.spec_from_file_location(f"lumotree.optimized.{name}", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


STAMP_HELPER = """
@triton.jit
def _stamp(buf, row, i, dep):
    \"\"\"Timeline probe: %globaltimer and %clock64 (after ``dep``, an int32 that depends on the phase's result) into
    ``buf[row, i]`` and ``buf[row, 16 + i]``, the SM id into ``buf[row, 32]``.\"\"\"
    t = tl.inline_asm_elementwise("mov.u64 $0, %globaltimer; // $1", "=l,r", [dep], dtype=tl.int64, is_pure=False,
                                  pack=1)
    c = tl.inline_asm_elementwise("mov.u64 $0, %clock64; // $1", "=l,r", [dep], dtype=tl.int64, is_pure=False,
                                  pack=1)
    tl.store(buf + row * 40 + i, t)
    tl.store(buf + row * 40 + 16 + i, c)
    tl.store(buf + row * 40 + 32, tl.extra.cuda.smid().to(tl.int64))


"""

SOLVE_DEF = "@triton.jit\ndef _gdn_tree_solve_kernel("
DECAY = ('    decay = tl.exp(tl.where(anc, log_gamma[:, None] - log_gamma[None, :], float("-inf")))  # [NP, NP] D\n'
         '\n    # one pass over S0')
STRICT = "    strict = anc & (nodes[:, None] != nodes[None, :])  # [NP, NP] M°\n    neg_a = tl.where(strict, -(beta"


def stamp_pairs():
    """Stamps in the fused verify (start, mask and gates, each K chunk, norms, inverse, Delta, O, end) and the commit
    (start, state tile, wait + path, products, end); the stamp buffers are the module globals ``STAMPS_V`` /
    ``STAMPS_C``."""
    row_v = "pid_bh * (V // BV) + pid_v"
    row_c = "(pid * tl.num_programs(1) + pid_v) * tl.num_programs(2) + pid_k"
    f32 = lambda e: f"tl.sum({e}).to(tl.int32, bitcast=True)"  # noqa: E731
    stamp = lambda i, dep, row=row_v: f"    _stamp(stamp_ptr, {row}, {i}, {dep})\n"  # noqa: E731
    return [
        (SOLVE_DEF, STAMP_HELPER + SOLVE_DEF),
        ("o_ptr, delta_ptr, log_gamma_ptr, k_rnorm_ptr, z_ptr, gate_w_ptr, gate_parts_ptr,\n    scale, N,",
         "o_ptr, delta_ptr, log_gamma_ptr, k_rnorm_ptr, z_ptr, gate_w_ptr, gate_parts_ptr, stamp_ptr,\n    scale, N,"),
        ("o, delta, log_gamma, k_rnorm_arg, *gate_args, scale, N,",
         "o, delta, log_gamma, k_rnorm_arg, *gate_args, STAMPS_V, scale, N,"),
        ("    pid_v = tl.program_id(1)\n    b = pid_bh // HV\n",
         "    pid_v = tl.program_id(1)\n" + stamp(0, "pid_bh") + "    b = pid_bh // HV\n"),
        (DECAY, DECAY.replace("\n\n", "\n" + stamp(1, f32("decay")) + "\n")),
        ("        qs = tl.dot(q_c, s_c, qs, input_precision=PRECISION)\n    if L2NORM:\n        if QK16:",
         "        qs = tl.dot(q_c, s_c, qs, input_precision=PRECISION)\n"
         + "    " + stamp("2 + k0 // BK", f32("qs")) + "    if L2NORM:\n        if QK16:"),
        (STRICT, stamp(6, f32("qs")) + STRICT),
        ("    t_inv = _inverse_unit_lower(neg_a, depth_ptr, b64, N, n_b, NP, LOG_NP, PRECISION, False)  # [NP, NP]\n"
         "    delta = tl.dot(",
         "    t_inv = _inverse_unit_lower(neg_a, depth_ptr, b64, N, n_b, NP, LOG_NP, PRECISION, False)  # [NP, NP]\n"
         + stamp(7, f32("t_inv")) + "    delta = tl.dot("),
        ("                   input_precision=PRECISION)  # [NP, BV]\n    o = (gamma[:, None] * qs + tl.dot(",
         "                   input_precision=PRECISION)  # [NP, BV]\n" + stamp(8, f32("delta"))
         + "    o = (gamma[:, None] * qs + tl.dot("),
        ("    out_off, rows = _store_output(o, o_ptr, b64, nodes, hv, pid_v, N, gate, gate_parts_ptr, HV, V, NP, BV,"
         " GATE,\n                                  PIECE)  # padding rows: zeros\n"
         "    tl.store(delta_ptr + out_off, delta, mask=rows[:, None])\n    first_v",
         stamp(9, f32("o"))
         + "    out_off, rows = _store_output(o, o_ptr, b64, nodes, hv, pid_v, N, gate, gate_parts_ptr, HV, V, NP, BV,"
         " GATE,\n                                  PIECE)  # padding rows: zeros\n"
         "    tl.store(delta_ptr + out_off, delta, mask=rows[:, None])\n    first_v"),
        ("                 mask=rows & first_v & ((nodes * 0 + hv) % (HV // H) == 0))\n",
         "                 mask=rows & first_v & ((nodes * 0 + hv) % (HV // H) == 0))\n" + stamp(10, "pid_bh")),
        ("    delta_ptr, log_gamma_ptr, k_ptr, k_rnorm_ptr,\n    B, N,",
         "    delta_ptr, log_gamma_ptr, k_ptr, k_rnorm_ptr, stamp_ptr,\n    B, N,"),
        ("delta, log_gamma, k, kr,\n", "delta, log_gamma, k, kr, STAMPS_C,\n"),
        ("    pid_k = tl.program_id(2)\n", "    pid_k = tl.program_id(2)\n" + stamp(0, "pid", row_c)),
        ("    s = tl.load(state_ptrs)  # [BK, BV] S0\n",
         "    s = tl.load(state_ptrs)  # [BK, BV] S0\n" + stamp(1, f32("s"), row_c)),
        ("    on_path, rank, path_len = accepted_path(words_ptr + (b64 * N + node) * W, n_b, NP, WORD_BITS)"
         "  # path(node)\n",
         "    on_path, rank, path_len = accepted_path(words_ptr + (b64 * N + node) * W, n_b, NP, WORD_BITS)"
         "  # path(node)\n" + stamp(2, "path_len", row_c)),
        ("    tl.store(state_ptrs, s)\n",
         stamp(3, f32("s"), row_c) + "    tl.store(state_ptrs, s)\n" + stamp(4, "pid", row_c)),
        # the split pipeline: solve (start, K loop, inverse, end) and apply (start, K loop, wait, end)
        ("    log_gamma_ptr, k_rnorm_ptr, q_rnorm_ptr, tb_ptr, qkd_ptr,\n    N, s_qb",
         "    log_gamma_ptr, k_rnorm_ptr, q_rnorm_ptr, tb_ptr, qkd_ptr, stamp_ptr,\n    N, s_qb"),
        ("meta.words, meta.depth, num_nodes, log_gamma, k_rnorm_arg, q_rnorm, tb, qkd,\n",
         "meta.words, meta.depth, num_nodes, log_gamma, k_rnorm_arg, q_rnorm, tb, qkd, STAMPS_S,\n"),
        ("    pid = tl.program_id(0)\n    b = pid // (HV // HEADS)\n",
         "    pid = tl.program_id(0)\n" + stamp(0, "pid", "pid") + "    b = pid // (HV // HEADS)\n"),
        ("    first = (nodes * 0 + hv0) % (HV // H) == 0",
         stamp(1, f32("qk"), "pid") + "    first = (nodes * 0 + hv0) % (HV // H) == 0"),
        ("        t_inv = _inverse_unit_lower(neg_a, depth_ptr, b64, N, n_b, NP, LOG_NP, PRECISION, True)  # [NP, NP]\n",
         "        t_inv = _inverse_unit_lower(neg_a, depth_ptr, b64, N, n_b, NP, LOG_NP, PRECISION, True)  # [NP, NP]\n"
         + "    " + stamp(2, f32("t_inv"), "pid")),
        ("        _store_scratch(tb_ptr + tile, t_inv * beta[None, :], TB_SCALE, PRECISION, SCRATCH16)\n",
         "        _store_scratch(tb_ptr + tile, t_inv * beta[None, :], TB_SCALE, PRECISION, SCRATCH16)\n"
         + stamp(3, "pid", "pid")),
        ("    tb_ptr, qkd_ptr, o_ptr, delta_ptr, z_ptr, gate_w_ptr, gate_parts_ptr,\n    scale, N,",
         "    tb_ptr, qkd_ptr, o_ptr, delta_ptr, z_ptr, gate_w_ptr, gate_parts_ptr, stamp_ptr,\n    scale, N,"),
        ("q_rnorm, tb, qkd, o, delta, *gate_args,\n", "q_rnorm, tb, qkd, o, delta, *gate_args, STAMPS_A,\n"),
        ("    pid_bh = tl.program_id(1)\n    b = pid_bh // HV\n    hv = pid_bh % HV\n    h = hv // (HV // H)\n"
         "    b64 = b.to(tl.int64)\n    n_b",
         "    pid_bh = tl.program_id(1)\n" + stamp(0, "pid_bh", "pid_bh * (V // BV) + pid_v")
         + "    b = pid_bh // HV\n    hv = pid_bh % HV\n    h = hv // (HV // H)\n    b64 = b.to(tl.int64)\n    n_b"),
        ("    if PDL:\n        tl.extra.cuda.gdc_wait()  # from here on the solve's outputs are complete and visible\n",
         stamp(1, f32("qs"), "pid_bh * (V // BV) + pid_v")
         + "    if PDL:\n        tl.extra.cuda.gdc_wait()  # from here on the solve's outputs are complete and visible\n"
         + stamp(2, "pid_bh", "pid_bh * (V // BV) + pid_v")),
        ("    tl.store(delta_ptr + out_off, delta, mask=rows[:, None])\n\n\n",
         "    tl.store(delta_ptr + out_off, delta, mask=rows[:, None])\n"
         + stamp(3, "pid_bh", "pid_bh * (V // BV) + pid_v") + "\n\n"),
    ]


V_LOAD = ("    v_t = tl.load(v_ptr + b64 * s_vb + nodes[:, None] * s_vn + hv * s_vh + vcols[None, :],\n"
          "                  mask=real[:, None], other=0.0).to(tl.float32)  # [NP, BV]\n")
APPLY_WAIT = "    if PDL:\n        tl.extra.cuda.gdc_wait()  # from here on the solve's outputs are complete and visible\n"
MASK = "    anc = _ancestor_mask(words_ptr, b64, n_b, N, W, NP, WORD_BITS, WORD_VECTORS)  # [NP, NP] M\n"
SOLVE_ZEROS = "    kk = tl.zeros([NP, NP], dtype=tl.float32)  # [NP, NP] K K^T\n"


def v_early(src: str) -> str:
    """The apply loads v (an input the solve does not write) before its wait instead of after it."""
    block = V_LOAD
    apply_tail = APPLY_WAIT + "    if L2NORM:\n        ks = ks * tl.load(k_rnorm_ptr"
    src = substituted(src, [(apply_tail, block + apply_tail)])
    first = src.index(block) + len(block)  # the moved copy; drop the original, the next occurrence
    second = src.index(block, first)
    return src[:second] + src[second + len(block):]


def mask_early(src: str) -> str:
    """The solve forms its ancestor mask (a gather of the tree's bitsets) before its K loop instead of after it."""
    return substituted(src, [(MASK, ""), (SOLVE_ZEROS, MASK + SOLVE_ZEROS)])


TB_LOAD = "    tb = _load_scratch(tb_ptr + tile, TB_SCALE, PRECISION, SCRATCH16)  # [NP, NP]\n"
QKD_LOAD = ("    qkd = _load_scratch(qkd_ptr + tile, QKD_SCALE, PRECISION, SCRATCH16)  # [NP, NP] (late: fewer live "
            "registers)\n")


def qkd_early(src: str) -> str:
    """The apply loads QKD beside TB, before the Delta product (fp16 scratch: half the registers of fp32)."""
    return substituted(src, [(QKD_LOAD, ""), (TB_LOAD, TB_LOAD + QKD_LOAD)])


MASK_FIRST = ("    # the mask first, a gather of the tree's bitsets: its latency runs under the K loop (B = 1: 0.5-1.7 us "
              "less)\n"
              "    anc = _ancestor_mask(words_ptr, b64, n_b, N, W, NP, WORD_BITS, WORD_VECTORS)  # [NP, NP] M\n")
GATES_NOW = "    # the gates only now: fewer tiles live through the K loop (registers)\n"


def mask_late(src: str) -> str:
    """The solve forms its ancestor mask after its K loop (the library before run 2)."""
    return substituted(src, [(MASK_FIRST, ""), (GATES_NOW, GATES_NOW + MASK_FIRST.splitlines(True)[1])])


def build_modules(tmp: str) -> dict:
    src = inspect.getsource(G)
    return dict(base=G,
                mask_late=load_module("probe_mask_late", mask_late(src), tmp),
                qkd_early=load_module("probe_qkd_early", qkd_early(src), tmp))


@triton.jit
def _empty_kernel(x_ptr):
    pass


def split(solve_heads: int, solve_warps: int, block_v: int = 32, apply_pdl: bool = True, solve_stages: int = 3,
          num_stages: int = 2):
    return G.KernelConfig(block_v, 32, 4, num_stages, True, solve_warps, solve_heads=solve_heads,
                          solve_stages=solve_stages, apply_pdl=apply_pdl)


FUSED = G.KernelConfig(32, 32, 4, 3, False)
SPLIT_B1 = split(1, 4, num_stages=3)
VARIANTS = {  # name: (module key, verify config (None: the library's default; a string: its changed copy), PDL commit)
    "default": ("base", None, True),
    "scratch32": ("base", "scratch32", True),
    "mask_late": ("mask_late", None, True),
    "qkd_early": ("qkd_early", None, True),
}
SMALL_ONLY = ()  # run 2's gram2 / gram4 / gram4_scratch32 (B <= 16; the split solve's gram split, removed after it)
SHAPES = [(1, 64, "random"), (1, 64, "random", "bf16"), (16, 64, "random"), (64, 64, "random"), (1, 64, "eagle")]
SMALL = tuple(VARIANTS)  # every variant at every shape


def fns(x, mod, config, pdl: bool, mode="tf32"):
    meta = G.tree_meta(x["parents"])
    pool = x["pool"].clone()

    def verify(signal=False):
        return mod.gdn_tree_verify(x["q"], x["k"], x["v"], x["g"], x["beta"], pool, x["slots"], x["parents"],
                                   use_qk_l2norm_in_kernel=True, input_precision=mode, meta=meta, validate=False,
                                   config=config, launch_dependents=signal)

    _, factors = verify()

    def commit():
        mod.gdn_tree_commit(pool, x["slots"], factors, x["parents"], x["accepted"], input_precision=mode, meta=meta,
                            validate=False)

    def both():
        _, f = verify(signal=pdl)
        mod.gdn_tree_commit(pool, x["slots"], f, x["parents"], x["accepted"], input_precision=mode, meta=meta,
                            validate=False, pdl=pdl)

    return dict(both=both, verify=verify, commit=commit)


def graph_of(fn):
    fn()
    torch.cuda.synchronize()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    torch.cuda.synchronize()
    return graph


def phase_table(samples, names, end_col) -> dict:
    """Median per-program durations between consecutive stamps (us and cycles) of one kernel's stamp rows."""
    sv = np.concatenate(samples)
    return dict(phase_us={n: float(np.median(sv[:, i + 1] - sv[:, i]) / 1e3) for i, n in enumerate(names)},
                phase_cycles={n: float(np.median(sv[:, 17 + i] - sv[:, 16 + i])) for i, n in enumerate(names)},
                program_us=float(np.median(sv[:, end_col] - sv[:, 0]) / 1e3))


def timeline(x, mod, config, pdl: bool) -> dict:
    """Replay verify + commit with stamps in a graph; per-program phase durations and every kernel's span (us from
    the first verify program's start)."""
    B = x["q"].shape[0]
    rows = 2 * B * 32 * 128 * 128 // (16 * 16)  # room for every program of every kernel
    bufs = {k: torch.zeros(rows, 40, dtype=torch.int64, device="cuda") for k in ("V", "S", "A", "C")}
    for k, t in bufs.items():
        setattr(mod, f"STAMPS_{k}", t)
    graph = graph_of(fns(x, mod, config, pdl)["both"])
    for _ in range(20):
        graph.replay()
    torch.cuda.synchronize()
    samples = {k: [] for k in bufs}
    for _ in range(5):  # five replays, each read back
        for t in bufs.values():
            t.zero_()
        graph.replay()
        torch.cuda.synchronize()
        for k, t in bufs.items():
            a = t.cpu().numpy()
            samples[k].append(a[a[:, 0] != 0])
    ends = dict(V=10, S=3, A=3, C=4)
    first = "S" if len(samples["S"][0]) else "V"
    spans = []
    for i in range(5):
        t0 = samples[first][i][:, 0].min()
        span = {}
        for k, end in ends.items():
            a = samples[k][i]
            if len(a):
                span[f"{k}_first_start"] = (a[:, 0].min() - t0) / 1e3
                span[f"{k}_last_start"] = (a[:, 0].max() - t0) / 1e3
                span[f"{k}_last_end"] = (a[:, end].max() - t0) / 1e3
                if k in ("A", "C"):
                    span[f"{k}_first_after_wait"] = (a[:, 2].min() - t0) / 1e3
        spans.append(span)
    out = dict(spans_us={k: float(np.median([s[k] for s in spans])) for k in spans[0]})
    names = dict(V=["mask, gates, decay", "K chunk 1", "K chunk 2", "K chunk 3", "K chunk 4", "norms", "inverse",
                    "delta", "o", "stores"],
                 S=["K loop", "norms, mask, gates, QKD, inverse", "TB store"],
                 A=["K loop", "wait", "tail"],
                 C=["state tile", "wait + path", "path products", "store"])
    for k, end in ends.items():
        if len(samples[k][0]):
            out[k] = phase_table(samples[k], names[k], end)
    return out


def inputs(shape):
    B, N, kind = shape[:3]
    dtype = torch.bfloat16 if shape[3:] == ("bf16",) else torch.float32
    return T.make_inputs(B, N, kind, seed=B * 1000 + N, dtype=dtype)


def fused_config(N: int, bf16: bool):
    """The fused kernel's launch at one wave as verify_config chose it before this session (bench/NOTES-gdn.md)."""
    if N == 32:
        return FUSED._replace(block_k=16, num_stages=4)
    if N == 128:
        return G.KernelConfig(64, 32, 8, 2, False)
    return FUSED._replace(num_warps=8) if bf16 else FUSED


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="b1_probe.json")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--budget-s", type=float, default=400)
    parser.add_argument("--timeline", action="store_true", help="stamped timelines at the first shape")
    parser.add_argument("--shape", type=int, default=-1, help="only SHAPES[i]")
    parser.add_argument("--trace", action="store_true", help="name each graph and synchronise after its timing")
    parser.add_argument("--no-fla", action="store_true", help="no fla decode graph")
    args = parser.parse_args()
    start_all = time.time()
    tmp = tempfile.mkdtemp()
    mods = build_modules(tmp)
    result = dict(card=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__,
                  date=time.strftime("%Y-%m-%d"), rows=[])

    def save():
        json.dump(result, open(args.out, "w"), indent=1)

    floor_x = torch.zeros(1, device="cuda")
    empties = dict(empty=graph_of(lambda: _empty_kernel[(1,)](floor_x)),
                   empty2=graph_of(lambda: (_empty_kernel[(1,)](floor_x), _empty_kernel[(1,)](floor_x))))
    try:
        import fla.ops.gated_delta_rule as fla  # noqa: PLC0415
    except ImportError as exc:
        fla = None
        print(f"fla not available: {exc}", flush=True)
    for shape in SHAPES if args.shape < 0 else SHAPES[args.shape : args.shape + 1]:
        if time.time() - start_all > args.budget_s:
            print(f"budget spent: {shape} not run", flush=True)
            continue
        x = inputs(shape)
        B, N, kind = shape[:3]
        bf16 = shape[3:] == ("bf16",)
        row = dict(B=B, N=N, kind=kind, dtype="bf16" if bf16 else "fp32", max_depth=x["max_depth"], variants={})
        graphs = {}
        main_shape = (B, N) == (1, 64) and not bf16
        for name, (key, config, pdl) in VARIANTS.items():
            if not main_shape and name not in SMALL:
                continue
            if name.startswith("fused") and not main_shape:  # the shape's fused launch, the variant's gram split
                config = fused_config(N, bf16)._replace(gram_splits=config.gram_splits)
            start = time.time()
            if name in SMALL_ONLY and B > 16:
                continue
            if isinstance(config, str):  # the library's default launch, changed
                base = G.verify_config(B, 32, N, 128, 128, torch.device("cuda"), 16, "tf32")
                config = base._replace(scratch16="scratch32" not in config)
            config = mods[key].KernelConfig(*config) if config is not None else None  # the module's own class
            f = fns(x, mods[key], config, pdl)
            graphs[name] = {what: graph_of(fn) for what, fn in f.items()}
            err_o, err_s = T.errors(x, "tf32", min(B, 2), mod=mods[key], config=config)
            row["variants"][name] = dict(err_o=err_o, err_s=err_s, times={})
            print(f"{shape} {name}: built and checked in {time.time() - start:.1f} s, err o {err_o:.2e} "
                  f"s {err_s:.2e}", flush=True)
        if fla is not None and not args.no_fla:
            ar = T.fla_fns(x, fla)[0]
            graphs["fla_decode"] = {"both": graph_of(ar)}
            row["variants"]["fla_decode"] = dict(err_o=T.fla_error(x, "ar", ar, sub=1), times={})
        for name, g in empties.items():
            graphs[name] = {"both": g}
            row["variants"][name] = dict(times={})
        for r in range(args.rounds):
            for name, gs in graphs.items():
                for what, g in gs.items():
                    if args.trace:
                        print(f"timing {name} {what}", flush=True)
                    us = 1e3 * triton.testing.do_bench(g.replay, warmup=10, rep=100, return_mode="median")
                    if args.trace:
                        torch.cuda.synchronize()
                    row["variants"][name]["times"].setdefault(what, []).append(us)
        for name, v in row["variants"].items():
            v["us"] = {what: float(np.median(ts)) for what, ts in v["times"].items()}
        ref = row["variants"].get("fla_decode", {}).get("us", {}).get("both")
        print(f"\nB = {B}, N = {N}, {kind} (max depth {x['max_depth']}), {row['dtype']}, tf32, median of "
              f"{args.rounds} rounds:")
        print("| variant | verify + commit us | verify us | commit us | / fla decode | err o | err S |")
        print("|---|---|---|---|---|---|---|")
        for name, v in row["variants"].items():
            us = v["us"]
            ratio = f"{us['both'] / ref:.2f}" if ref else "-"
            print(f"| {name} | {us['both']:.1f} | {us.get('verify', float('nan')):.1f} | "
                  f"{us.get('commit', float('nan')):.1f} | {ratio} | {v.get('err_o', float('nan')):.1e} | "
                  f"{v.get('err_s', float('nan')):.1e} |", flush=True)
        del graphs
        result["rows"].append(row)
        save()
        if shape == SHAPES[0] and args.timeline:
            for name, config in (("fused_gram2", FUSED._replace(gram_splits=2)),):
                try:
                    tl_out = timeline(x, mods["stamps"], mods["stamps"].KernelConfig(*config), True)
                except Exception as exc:  # noqa: BLE001 - a probe: record and go on
                    tl_out = dict(error=repr(exc)[-500:])
                result[f"timeline_{name}"] = tl_out
                print(f"timeline {name}: {json.dumps(tl_out, indent=1)}", flush=True)
                save()
    save()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
