"""Fourteenth session, runs 1 and 2: where B = 1's verify + commit time goes (issue 5's B = 1 target: <= 3x fla's
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

Run 3 (this version): the inverse's doubling as L dependent products instead of 2 (L - 1) (the library now;
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

FUSED_DEF = "@triton.jit\ndef _gdn_tree_verify_kernel("
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
        (FUSED_DEF, STAMP_HELPER + FUSED_DEF),
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
        ("    t_inv = _inverse_unit_lower(neg_a, depth_ptr, b64, N, n_b, NP, LOG_NP, PRECISION)  # [NP, NP]\n"
         "    delta = tl.dot(",
         "    t_inv = _inverse_unit_lower(neg_a, depth_ptr, b64, N, n_b, NP, LOG_NP, PRECISION)  # [NP, NP]\n"
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
    ]


NEW_INVERSE = """    t_inv = tl.where(nodes[:, None] == nodes[None, :], 1.0, neg_a)  # [NP, NP] T_1 = I - A (A has a zero diagonal)
    if levels > 1:
        power = _tf32_round(neg_a, PRECISION)  # [NP, NP] P_0
        power = tl.dot(power, power, input_precision=PRECISION)  # [NP, NP] P_1
        for _ in range(2, levels):  # T_2 .. T_(L-1) and P_2 .. P_(L-1)
            power = _tf32_round(power, PRECISION)
            t_next = tl.dot(_tf32_round(t_inv, PRECISION), power, t_inv, input_precision=PRECISION)  # T_(l+1)
            power = tl.dot(power, power, input_precision=PRECISION)  # P_(l+1)
            t_inv = t_next
        t_inv = tl.dot(_tf32_round(t_inv, PRECISION), _tf32_round(power, PRECISION), t_inv,
                       input_precision=PRECISION)  # T_L
"""
OLD_INVERSE = """    power = neg_a  # [NP, NP] (-A)^(2^l)
    t_inv = tl.where(nodes[:, None] == nodes[None, :], 1.0, neg_a)  # [NP, NP] I - A (A has a zero diagonal)
    for _ in range(1, levels):
        power = _tf32_round(power, PRECISION)
        power = tl.dot(power, power, input_precision=PRECISION)
        t_inv = tl.dot(_tf32_round(t_inv, PRECISION), _tf32_round(power, PRECISION), t_inv,
                       input_precision=PRECISION)
"""
K_DIAG = [("            if not QK16:  # 16-bit keys: |k|^2 is K K^T's diagonal (exact products), read after the loop",
           "            if False:  # probe: |k|^2 from K K^T's diagonal in every mode"),
          ("        if QK16:\n            k_sq = _diagonal(kk, NP)", "        if True:\n            k_sq = _diagonal(kk, NP)")]


def replaced_all(src: str, pairs) -> str:
    """``src`` with every occurrence of each ``old`` replaced (at least one must be there)."""
    for old, new in pairs:
        assert old in src, old
        src = src.replace(old, new)
    return src


def build_modules(tmp: str) -> dict:
    src = inspect.getsource(G)
    return dict(
        base=G,
        old_inverse=load_module("probe_old_inverse", substituted(src, [(NEW_INVERSE, OLD_INVERSE)]), tmp),
        k_diag=load_module("probe_k_diag", replaced_all(src, K_DIAG), tmp),
        stamps=load_module("probe_stamps", substituted(src, stamp_pairs()), tmp),
    )


@triton.jit
def _empty_kernel(x_ptr):
    pass


def split(solve_heads: int, solve_warps: int, block_v: int = 32, apply_pdl: bool = True, solve_stages: int = 3,
          num_stages: int = 2):
    return G.KernelConfig(block_v, 32, 4, num_stages, True, solve_warps, solve_heads=solve_heads,
                          solve_stages=solve_stages, apply_pdl=apply_pdl)


FUSED = G.KernelConfig(32, 32, 4, 3, False)
VARIANTS = {  # name: (module key, verify config or None for the default, PDL commit behind a signalling verify)
    "fused": ("base", None, False),
    "fused_old_inverse_pdl": ("old_inverse", None, True),
    "fused_pdl": ("base", None, True),
    "fused_k_diag_pdl (tf32 |k| from K K^T)": ("k_diag", None, True),
    "split_head4_a3_old_inverse_pdl": ("old_inverse", split(1, 4, num_stages=3), True),
    "split_head4_a3_pdl": ("base", split(1, 4, num_stages=3), True),
    "split_head4_pdl": ("base", split(1, 4), True),
    "split_head4_a3_k_diag_pdl": ("k_diag", split(1, 4, num_stages=3), True),
}


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


def timeline(x, mod, rows_v: int, rows_c: int, pdl: bool) -> dict:
    """Replay verify + commit with stamps in a graph; phase durations per program and the kernels' spans."""
    mod.STAMPS_V = torch.zeros(rows_v, 40, dtype=torch.int64, device="cuda")
    mod.STAMPS_C = torch.zeros(rows_c, 40, dtype=torch.int64, device="cuda")
    graph = graph_of(fns(x, mod, None, pdl)["both"])
    for _ in range(20):
        graph.replay()
    torch.cuda.synchronize()
    samples_v, samples_c = [], []
    for _ in range(5):  # five replays, each read back
        mod.STAMPS_V.zero_()
        mod.STAMPS_C.zero_()
        graph.replay()
        torch.cuda.synchronize()
        samples_v.append(mod.STAMPS_V.cpu().numpy())
        samples_c.append(mod.STAMPS_C.cpu().numpy())
    spans = []
    for sv, sc in zip(samples_v, samples_c):
        t0 = sv[:, 0].min()
        rel = lambda col: (col - t0) / 1e3  # noqa: E731
        spans.append(dict(verify_last_start=rel(sv[:, 0].max()), verify_first_end=rel(sv[:, 10].min()),
                          verify_last_end=rel(sv[:, 10].max()), commit_first_start=rel(sc[:, 0].min()),
                          commit_last_start=rel(sc[:, 0].max()), commit_first_tile=rel(sc[:, 1].min()),
                          commit_first_after_wait=rel(sc[:, 2].min()), commit_last_end=rel(sc[:, 4].max())))
    out = dict(spans_us={k: float(np.median([s[k] for s in spans])) for k in spans[0]})
    sv, sc = np.concatenate(samples_v), np.concatenate(samples_c)
    names_v = ["mask, gates, decay", "K chunk 1", "K chunk 2", "K chunk 3", "K chunk 4", "norms", "inverse", "delta",
               "o", "stores"]
    out["verify_phase_us"] = {n: float(np.median(sv[:, i + 1] - sv[:, i]) / 1e3) for i, n in enumerate(names_v)}
    out["verify_phase_cycles"] = {n: float(np.median(sv[:, 17 + i] - sv[:, 16 + i])) for i, n in enumerate(names_v)}
    out["verify_program_us"] = dict(median=float(np.median(sv[:, 10] - sv[:, 0]) / 1e3),
                                    max=float(np.max(sv[:, 10] - sv[:, 0]) / 1e3))
    names_c = ["state tile", "wait + path", "path products", "store"]
    out["commit_phase_us"] = {n: float(np.median(sc[:, i + 1] - sc[:, i]) / 1e3) for i, n in enumerate(names_c)}
    out["commit_phase_cycles"] = {n: float(np.median(sc[:, 17 + i] - sc[:, 16 + i])) for i, n in enumerate(names_c)}
    out["verify_sms"] = int(len(set(samples_v[0][:, 32].tolist())))
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="b1_probe.json")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--kinds", nargs="+", default=["random", "eagle"])
    args = parser.parse_args()
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
    for kind in args.kinds:
        x = T.make_inputs(1, 64, kind, seed=1064)
        row = dict(B=1, N=64, kind=kind, max_depth=x["max_depth"], variants={})
        graphs = {}
        for name, (key, config, pdl) in VARIANTS.items():
            start = time.time()
            config = mods[key].KernelConfig(*config) if config is not None else None  # the module's own class
            f = fns(x, mods[key], config, pdl)
            graphs[name] = {what: graph_of(fn) for what, fn in f.items()}
            err_o, err_s = T.errors(x, "tf32", 1, mod=mods[key], config=config)
            row["variants"][name] = dict(err_o=err_o, err_s=err_s, times={})
            print(f"{kind} {name}: built and checked in {time.time() - start:.1f} s, err o {err_o:.2e} s {err_s:.2e}",
                  flush=True)
        if fla is not None:
            ar = T.fla_fns(x, fla)[0]
            graphs["fla_decode"] = {"both": graph_of(ar)}
            row["variants"]["fla_decode"] = dict(err_o=T.fla_error(x, "ar", ar, sub=1), times={})
        for name, g in empties.items():
            graphs[name] = {"both": g}
            row["variants"][name] = dict(times={})
        for r in range(args.rounds):
            for name, gs in graphs.items():
                for what, g in gs.items():
                    us = 1e3 * triton.testing.do_bench(g.replay, warmup=10, rep=100, return_mode="median")
                    row["variants"][name]["times"].setdefault(what, []).append(us)
        for name, v in row["variants"].items():
            v["us"] = {what: float(np.median(ts)) for what, ts in v["times"].items()}
        ref = row["variants"].get("fla_decode", {}).get("us", {}).get("both")
        print(f"\nB = 1, N = 64, {kind} (max depth {x['max_depth']}), tf32, median of {args.rounds} rounds:")
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
        if kind == args.kinds[0]:
            cfg_v = G.verify_config(1, 32, 64, 128, 128, x["q"].device, 16, "tf32", False)
            cfg_c = G.commit_config(1, 32, 64, 128, 128, x["q"].device)
            rows_v = 32 * (128 // cfg_v.block_v)
            rows_c = 32 * (128 // cfg_c.block_v) * (128 // cfg_c.block_k)
            for pdl in (True,):
                try:
                    tl_out = timeline(x, mods["stamps"], rows_v, rows_c, pdl)
                except Exception as exc:  # noqa: BLE001 - a probe: record and go on
                    tl_out = dict(error=repr(exc)[-500:])
                result[f"timeline_{'pdl' if pdl else 'plain'}"] = tl_out
                print(f"timeline {'pdl' if pdl else 'plain'}: {json.dumps(tl_out, indent=1)}", flush=True)
                save()
    save()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
