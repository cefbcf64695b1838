"""Fourteenth session, run 1: where B = 1's verify + commit time goes (issue 5's B = 1 target: <= 3x fla's decode
step; 28.2 against 7.6 us in the thirteenth session's run 7), and the launch forms that could shorten it.

One process, Qwen3-Next GDN shapes (H=16, HV=32, K=V=128), B = 1, N = 64 (random / EAGLE trees), fp32 inputs, tf32,
q/k L2 norm in the kernel. Each variant: verify + commit, verify alone and commit alone as CUDA-graph replays
(median of do_bench), the rounds interleaved (three rounds, median of the three), and its errors against the float64
closed form (outputs and committed state) run the same way:

- ``fused``: the library's default at B = 1 (fused verify, then the commit);
- ``split_<solve>_bv<BV>[_nopdl]``: the split pipeline (solve kernel, then the apply as a PDL launch behind it):
  ``pair`` two value heads per 4-warp solve program (the B >= 16 default), ``head8`` / ``head4`` one value head
  per 8- / 4-warp program;
- ``fused_w8``: the fused kernel at 8 warps;
- ``pdl`` / ``pdl_split_head8``: a variant module (source substitution) in which every verify kernel signals
  ``griddepcontrol.launch_dependents`` at its start and the commit is a PDL launch that loads its state tile and
  its path before ``griddepcontrol.wait`` (the verify writes neither) and the factors after it;
- ``empty`` / ``empty2``: one / two empty Triton kernels in one graph (the launch floor of this harness);
- ``fla_decode``: fla 0.6.0's single-token decode step (``fused_recurrent_gated_delta_rule``, beta by keyword).

Then a timeline: the fused verify and the commit with ``%globaltimer`` / ``%clock64`` stamps at phase boundaries
(each stamp waits on a reduction of the phase's result, so it perturbs the kernel slightly), replayed in a graph,
without and with the PDL commit: per-program phase durations and the launch gap between the kernels.

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


STAMP_HELPER = '''
@triton.jit
def _stamp(buf, row, i: tl.constexpr, dep):
    """Timeline probe: %globaltimer and %clock64 (after ``dep``, an int32 that depends on the phase's result) into
    ``buf[row, i]`` and ``buf[row, 8 + i]``; the SM id into ``buf[row, 16]`` at the first stamp."""
    t = tl.inline_asm_elementwise("mov.u64 $0, %globaltimer; // $1", "=l,r", [dep], dtype=tl.int64, is_pure=False,
                                  pack=1)
    c = tl.inline_asm_elementwise("mov.u64 $0, %clock64; // $1", "=l,r", [dep], dtype=tl.int64, is_pure=False,
                                  pack=1)
    tl.store(buf + row * 24 + i, t)
    tl.store(buf + row * 24 + 8 + i, c)
    if i == 0:
        tl.store(buf + row * 24 + 16, tl.extra.cuda.smid().to(tl.int64))


'''

FUSED_DEF = "@triton.jit\ndef _gdn_tree_verify_kernel("
FUSED_START = "    pid_bh = tl.program_id(0)\n    pid_v = tl.program_id(1)\n    b = pid_bh // HV\n"
APPLY_START = "    pid_v = tl.program_id(0)  # fastest"
COMMIT_LOADS = ("    lg_a = tl.load(log_gamma_ptr + (b64 * N + node) * HV + hv)\n"
                "    state_ptrs = pool_ptr + (slot * HV + hv) * (K * V) + kcols[:, None] * V + vcols[None, :]"
                "  # [BK, BV]\n"
                "    s = tl.load(state_ptrs) * tl.exp(lg_a)  # [BK, BV] Gamma_a S0\n")
COMMIT_LOADS_PDL = ("    state_ptrs = pool_ptr + (slot * HV + hv) * (K * V) + kcols[:, None] * V + vcols[None, :]"
                    "  # [BK, BV]\n"
                    "    s = tl.load(state_ptrs)  # [BK, BV] S0: the verify does not write the pool\n"
                    "    tl.extra.cuda.gdc_wait()  # the verify's factors are complete and visible from here on\n"
                    "    lg_a = tl.load(log_gamma_ptr + (b64 * N + node) * HV + hv)\n"
                    "    s = s * tl.exp(lg_a)  # [BK, BV] Gamma_a S0\n")
COMMIT_LAUNCH_END = ("        num_warps=cfg.num_warps, num_stages=cfg.num_stages,\n    )\n"
                     "    return state_pool if layered else state_pool[0]")


def pdl_pairs():
    """Every verify kernel signals at its start; the commit is a PDL launch with its state tile loaded first."""
    return [
        (FUSED_START, FUSED_START + "    tl.extra.cuda.gdc_launch_dependents()  # probe: the commit may launch\n"),
        (APPLY_START, "    tl.extra.cuda.gdc_launch_dependents()  # probe: the commit may launch\n" + APPLY_START),
        (COMMIT_LOADS, COMMIT_LOADS_PDL),
        (COMMIT_LAUNCH_END, COMMIT_LAUNCH_END.replace("num_stages=cfg.num_stages,\n",
                                                      "num_stages=cfg.num_stages, launch_pdl=True,\n")),
    ]


def stamp_pairs(pdl: bool):
    """Stamps in the fused verify (start, K loop done, inverse, Delta, O, end) and the commit (start, path, products,
    end); the stamp buffers are the module globals ``STAMPS_V`` / ``STAMPS_C``."""
    row_v = "pid_bh * (V // BV) + pid_v"
    row_c = "(pid * tl.num_programs(1) + pid_v) * tl.num_programs(2) + pid_k"
    f32 = lambda e: f"tl.sum({e}).to(tl.int32, bitcast=True)"  # noqa: E731
    commit_loads = COMMIT_LOADS_PDL if pdl else COMMIT_LOADS
    pairs = [
        (FUSED_DEF, STAMP_HELPER + FUSED_DEF),
        ("o_ptr, delta_ptr, log_gamma_ptr, k_rnorm_ptr, z_ptr, gate_w_ptr, gate_parts_ptr,\n    scale, N,",
         "o_ptr, delta_ptr, log_gamma_ptr, k_rnorm_ptr, z_ptr, gate_w_ptr, gate_parts_ptr, stamp_ptr,\n    scale, N,"),
        ("o, delta, log_gamma, k_rnorm_arg, *gate_args, scale, N,",
         "o, delta, log_gamma, k_rnorm_arg, *gate_args, STAMPS_V, scale, N,"),
        ("    pid_v = tl.program_id(1)\n    b = pid_bh // HV\n",
         f"    pid_v = tl.program_id(1)\n    _stamp(stamp_ptr, {row_v}, 0, pid_bh)\n    b = pid_bh // HV\n"),
        ("    if L2NORM:\n        if QK16:\n            k_sq = _diagonal(kk, NP)\n        k_rn = 1.0 / tl.sqrt",
         f"    _stamp(stamp_ptr, {row_v}, 1, {f32('qs')})\n"
         "    if L2NORM:\n        if QK16:\n            k_sq = _diagonal(kk, NP)\n        k_rn = 1.0 / tl.sqrt"),
        ("    t_inv = _inverse_unit_lower(neg_a, depth_ptr, b64, N, n_b, NP, LOG_NP, PRECISION)  # [NP, NP]\n"
         "    delta = tl.dot(",
         "    t_inv = _inverse_unit_lower(neg_a, depth_ptr, b64, N, n_b, NP, LOG_NP, PRECISION)  # [NP, NP]\n"
         f"    _stamp(stamp_ptr, {row_v}, 2, {f32('t_inv')})\n    delta = tl.dot("),
        ("                   input_precision=PRECISION)  # [NP, BV]\n    o = (gamma[:, None] * qs + tl.dot(",
         "                   input_precision=PRECISION)  # [NP, BV]\n"
         f"    _stamp(stamp_ptr, {row_v}, 3, {f32('delta')})\n    o = (gamma[:, None] * qs + tl.dot("),
        ("    out_off, rows = _store_output(o, o_ptr, b64, nodes, hv, pid_v, N, gate, gate_parts_ptr, HV, V, NP, BV,"
         " GATE,\n                                  PIECE)  # padding rows: zeros\n"
         "    tl.store(delta_ptr + out_off, delta, mask=rows[:, None])\n    first_v",
         f"    _stamp(stamp_ptr, {row_v}, 4, {f32('o')})\n"
         "    out_off, rows = _store_output(o, o_ptr, b64, nodes, hv, pid_v, N, gate, gate_parts_ptr, HV, V, NP, BV,"
         " GATE,\n                                  PIECE)  # padding rows: zeros\n"
         "    tl.store(delta_ptr + out_off, delta, mask=rows[:, None])\n    first_v"),
        ("                 mask=rows & first_v & ((nodes * 0 + hv) % (HV // H) == 0))\n",
         "                 mask=rows & first_v & ((nodes * 0 + hv) % (HV // H) == 0))\n"
         f"    _stamp(stamp_ptr, {row_v}, 5, pid_bh)\n"),
        ("    delta_ptr, log_gamma_ptr, k_ptr, k_rnorm_ptr,\n    B, N,",
         "    delta_ptr, log_gamma_ptr, k_ptr, k_rnorm_ptr, stamp_ptr,\n    B, N,"),
        ("delta, log_gamma, k, kr,\n", "delta, log_gamma, k, kr, STAMPS_C,\n"),
        ("    pid_k = tl.program_id(2)\n", f"    pid_k = tl.program_id(2)\n    _stamp(stamp_ptr, {row_c}, 0, pid)\n"),
        ("    on_path, rank, path_len = accepted_path(words_ptr + (b64 * N + node) * W, n_b, NP, WORD_BITS)"
         "  # path(node)\n",
         "    on_path, rank, path_len = accepted_path(words_ptr + (b64 * N + node) * W, n_b, NP, WORD_BITS)"
         f"  # path(node)\n    _stamp(stamp_ptr, {row_c}, 1, path_len)\n"),
        (commit_loads, commit_loads + f"    _stamp(stamp_ptr, {row_c}, 2, {f32('s')})\n"),
        ("    tl.store(state_ptrs, s)\n",
         f"    _stamp(stamp_ptr, {row_c}, 3, {f32('s')})\n    tl.store(state_ptrs, s)\n"
         f"    _stamp(stamp_ptr, {row_c}, 4, pid)\n"),
    ]
    return pairs


def build_modules(tmp: str) -> dict:
    src = inspect.getsource(G)
    pdl_src = substituted(src, pdl_pairs())
    return dict(
        base=G,
        pdl=load_module("probe_pdl", pdl_src, tmp),
        stamps=load_module("probe_stamps", substituted(src, stamp_pairs(False)), tmp),
        stamps_pdl=load_module("probe_stamps_pdl", substituted(pdl_src, stamp_pairs(True)), tmp),
    )


@triton.jit
def _empty_kernel(x_ptr):
    pass


def split(solve_heads: int, solve_warps: int, block_v: int = 32, apply_pdl: bool = True):
    return G.KernelConfig(block_v, 32, 4, 2, True, solve_warps, solve_heads=solve_heads, solve_stages=3,
                          apply_pdl=apply_pdl)


VARIANTS = {  # name: (module key, verify config or None for the default)
    "fused": ("base", None),
    "split_pair_bv32": ("base", split(2, 4)),
    "split_head8_bv32": ("base", split(1, 8)),
    "split_head4_bv32": ("base", split(1, 4)),
    "split_pair_bv16": ("base", split(2, 4, 16)),
    "split_head8_bv16": ("base", split(1, 8, 16)),
    "split_head8_bv32_nopdl": ("base", split(1, 8, apply_pdl=False)),
    "fused_w8": ("base", G.KernelConfig(32, 32, 8, 3, False)),
    "pdl": ("pdl", None),
    "pdl_split_head8": ("pdl", split(1, 8)),
}


def fns(x, mod, config, mode="tf32"):
    meta = G.tree_meta(x["parents"])
    pool = x["pool"].clone()

    def verify():
        return mod.gdn_tree_verify(x["q"], x["k"], x["v"], x["g"], x["beta"], pool, x["slots"], x["parents"],
                                   use_qk_l2norm_in_kernel=True, input_precision=mode, meta=meta, validate=False,
                                   config=config)

    _, factors = verify()

    def commit():
        mod.gdn_tree_commit(pool, x["slots"], factors, x["parents"], x["accepted"], input_precision=mode, meta=meta,
                            validate=False)

    def both():
        _, f = verify()
        mod.gdn_tree_commit(pool, x["slots"], f, x["parents"], x["accepted"], input_precision=mode, meta=meta,
                            validate=False)

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


def timeline(x, mod, rows_v: int, rows_c: int) -> dict:
    """Replay verify + commit with stamps in a graph; phase durations per program and the kernels' spans."""
    mod.STAMPS_V = torch.zeros(rows_v, 24, dtype=torch.int64, device="cuda")
    mod.STAMPS_C = torch.zeros(rows_c, 24, dtype=torch.int64, device="cuda")
    graph = graph_of(fns(x, mod, None)["both"])
    for _ in range(20):
        graph.replay()
    torch.cuda.synchronize()
    out = {}
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
        spans.append(dict(verify_first_start=0.0, verify_last_start=(sv[:, 0].max() - t0) / 1e3,
                          verify_first_end=(sv[:, 5].min() - t0) / 1e3, verify_last_end=(sv[:, 5].max() - t0) / 1e3,
                          commit_first_start=(sc[:, 0].min() - t0) / 1e3,
                          commit_last_start=(sc[:, 0].max() - t0) / 1e3,
                          commit_first_path=(sc[:, 1].min() - t0) / 1e3,
                          commit_last_loaded=(sc[:, 2].max() - t0) / 1e3,
                          commit_last_end=(sc[:, 4].max() - t0) / 1e3))
    out["spans_us"] = {k: float(np.median([s[k] for s in spans])) for k in spans[0]}
    sv, sc = np.concatenate(samples_v), np.concatenate(samples_c)
    names_v = ["K loop", "inverse", "delta", "o", "stores"]
    out["verify_phase_us"] = {n: float(np.median(sv[:, i + 1] - sv[:, i]) / 1e3) for i, n in enumerate(names_v)}
    out["verify_phase_cycles"] = {n: float(np.median(sv[:, 9 + i] - sv[:, 8 + i])) for i, n in enumerate(names_v)}
    out["verify_program_us"] = dict(median=float(np.median(sv[:, 5] - sv[:, 0]) / 1e3),
                                    max=float(np.max(sv[:, 5] - sv[:, 0]) / 1e3))
    names_c = ["path", "state tile (+ wait)", "path products", "store"]
    out["commit_phase_us"] = {n: float(np.median(sc[:, i + 1] - sc[:, i]) / 1e3) for i, n in enumerate(names_c)}
    out["commit_phase_cycles"] = {n: float(np.median(sc[:, 9 + i] - sc[:, 8 + i])) for i, n in enumerate(names_c)}
    out["verify_sms"] = int(len(set(sv[:rows_v, 16].tolist())))
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
        for name, (key, config) in VARIANTS.items():
            start = time.time()
            config = mods[key].KernelConfig(*config) if config is not None else None  # the module's own class
            f = fns(x, mods[key], config)
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
            for key in ("stamps", "stamps_pdl"):
                try:
                    tl_out = timeline(x, mods[key], rows_v, rows_c)
                except Exception as exc:  # noqa: BLE001 - a probe: record and go on
                    tl_out = dict(error=repr(exc)[-500:])
                result[f"timeline_{key}"] = tl_out
                print(f"timeline {key}: {json.dumps(tl_out, indent=1)}", flush=True)
                save()
    save()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
