"""Tensor-parallel scaling: the autoregressive decode step against its floor and the step's collectives, and
tokens/s of autoregressive and tree-speculative decoding, at each batch size, for each tensor-parallel size.

Per rank and batch size ``B`` (a seeded greedy-stable random model of ``--config``, :mod:`lumotree.optimized.parallel`):

- ``ar_ms``: one decode step (its CUDA graph replayed a fixed number of times on every rank: an adaptive count
  would let the ranks disagree on how many collectives they make);
- ``floor_ms``: this rank's bytes of one step (its weight shard, the embedding aside, plus reading and writing its
  GDN states of ``B`` requests) at the copy bandwidth measured in the same run;
- ``collective_ms``: the step's collectives alone (two all-reduces of ``[B, Dm]`` a layer, the gather of the logit
  shards), replayed as one CUDA graph; the target is ``ar_ms <= 1.6 floor_ms + collective_ms``;
- ``ar_tok_s`` / ``tree_tok_s``: the engine's decode tokens/s, greedy, autoregressive and tree speculation (the
  synthetic drafter, acceptance ``--acceptance``, fed the autoregressive output; fixed budget of ``--nodes``);
  ``spec_speedup = tree_tok_s / ar_tok_s``.

    torchrun --nproc-per-node 4 bench/tp.py --config bench --json tp4.json     # one size, ranks from torchrun
    python bench/tp.py --tensor-parallel 1,2,4 --config bench --json tp.json  # each size in turn, ranks started here
    python bench/tp.py --smoke --json smoke.json                              # CPU, gloo, tiny model, sizes 1 and 2

(``bench/tp.py ARGS`` = ``lumotree bench tp ARGS``.)

Every launched process keeps NVLink multicast off (``NCCL_NVLS_ENABLE=0``, ``TORCH_SYMM_MEM_DISABLE_MULTICAST=1``).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import socket
import subprocess
import sys
import tempfile
import time

import torch

from lumotree.reference.config import HybridConfig

from ..engine import Engine, OptimizedTarget, SamplingParams
from ..engine.drafters import SyntheticDrafter
from ..engine.e2e import copy_bandwidth
from ..model import OptimizedModel, random_tensors
from ..model.presets import RANDOM_CONFIGS
from .context import SINGLE, init_parallel
from .launch import rank_env

__all__ = ["add_arguments", "run", "main", "measure", "table"]

REPS = 50  # replays of a timed graph (fixed: every rank makes the same collectives)


def _tensor_bytes(obj) -> int:
    """Bytes of every tensor in a weights dataclass (nested dataclasses and lists)."""
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if dataclasses.is_dataclass(obj):
        return sum(_tensor_bytes(getattr(obj, f.name)) for f in dataclasses.fields(obj))
    if isinstance(obj, (list, tuple)):
        return sum(_tensor_bytes(x) for x in obj)
    return 0


def _timed_ms(fn, device: torch.device, reps: int) -> float:
    """Mean ms of ``fn`` over ``reps`` calls after 3 warm-up calls (CUDA events on a GPU)."""
    for _ in range(3):
        fn()
    if device.type != "cuda":
        start = time.perf_counter()
        for _ in range(reps):
            fn()
        return 1e3 * (time.perf_counter() - start) / reps
    torch.cuda.synchronize(device)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        fn()
    end.record()
    torch.cuda.synchronize(device)
    return start.elapsed_time(end) / reps


def _graphed(fn, device: torch.device):
    """``fn`` as one CUDA graph replay (on the CPU: ``fn`` itself)."""
    if device.type != "cuda":
        return fn
    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        fn()
    torch.cuda.current_stream(device).wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph.replay


def _decode_ms(model, B: int, prompt_len: int, reps: int) -> float:
    """One decode step of ``B`` requests (the model's CUDA graph replayed; the lengths put back after each)."""
    gen = torch.Generator().manual_seed(7)
    slots = torch.arange(B, dtype=torch.int32, device=model.device)
    for s in range(B):
        model.prefill(s, torch.randint(model.vocab_size, (prompt_len,), generator=gen).tolist())
    tokens = torch.randint(model.vocab_size, (B,), generator=gen).to(model.device)
    committed = model.lens.index_select(0, slots.long()).clone()
    model.decode(slots, tokens, validate=False)  # compiles (and captures, with graphs)
    model.lens.index_copy_(0, slots.long(), committed)
    step = (lambda: model.captured_graph(("decode", B)).replay()) if model.graphs else \
        (lambda: model.decode(slots, tokens, validate=False))

    def once() -> None:
        step()
        model.lens.index_copy_(0, slots.long(), committed)

    ms = _timed_ms(once, model.device, reps)
    for s in range(B):
        model.release(s)
    return ms


def _collective_ms(model, B: int, reps: int) -> float:
    """The decode step's collectives alone: two all-reduces of ``[B, Dm]`` a layer and the logits' gather."""
    par = model.parallel
    if not par.active:
        return 0.0
    x = torch.zeros((B, model.config.hidden_size), dtype=model.dtype, device=model.device)
    local = torch.zeros((B, model.weights.lm_head.shape[0]), dtype=torch.float32, device=model.device)

    def collectives() -> None:
        for _ in range(2 * model.config.num_hidden_layers):
            par.all_reduce(x)
        par.gather_vocab(local, model.vocab_size)

    return _timed_ms(_graphed(collectives, model.device), model.device, reps)


def _tokens_per_s(target, drafter, mode: str, B: int, prompts: list, new: int, nodes: int) -> tuple[float, list]:
    engine = Engine(target, drafter, mode=mode, budget="fixed", max_nodes=nodes, max_batch=B)
    if target.device.type == "cuda":
        engine.warm_up()
    results = engine.generate(prompts, SamplingParams(max_new_tokens=new))
    return float(engine.stats.summary()["tokens_per_s"]), [r.tokens for r in results]


def measure(args: argparse.Namespace) -> list[dict]:
    """This rank's rows (every rank runs the same calls; rank 0's rows are the ones reported)."""
    par, device = init_parallel() if "WORLD_SIZE" in os.environ else (
        SINGLE, torch.device("cpu" if args.smoke or not torch.cuda.is_available() else "cuda"))
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    config = HybridConfig(**RANDOM_CONFIGS[args.config])
    batches = [int(b) for b in args.batches.split(",")]
    tensors = random_tensors(config, args.seed, device, dtype, successor=True)
    model = OptimizedModel(config, tensors, num_slots=max(batches), max_seq_len=args.prompt_len + args.new + 2 *
                           args.nodes + 8, max_nodes=args.nodes, device=device, dtype=dtype, parallel=par)
    del tensors
    w = model.weights
    shard_bytes = _tensor_bytes(w) - _tensor_bytes(w.embed) - (_tensor_bytes(w.mtp) if w.mtp else 0)
    state_bytes = 0
    if w.gdn_dims is not None:
        _, HV, K, V, _ = w.gdn_dims
        state_bytes = sum(k == "linear_attention" for k in config.layer_types) * HV * K * V * 4  # one request
    bandwidth = copy_bandwidth(device) if device.type == "cuda" else float("nan")
    target = OptimizedTarget(model, validate=device.type != "cuda")
    gen = torch.Generator().manual_seed(args.seed)
    rows = []
    for B in batches:
        ar_ms = _decode_ms(model, B, args.prompt_len, args.reps)
        coll_ms = _collective_ms(model, B, args.reps)
        floor_ms = 1e3 * (shard_bytes + 2 * B * state_bytes) / bandwidth
        prompts = [torch.randint(config.vocab_size, (args.prompt_len,), generator=gen).tolist() for _ in range(B)]
        ar_tok_s, outputs = _tokens_per_s(target, None, "autoregressive", B, prompts, args.new, args.nodes)
        oracle = {tuple(p): o for p, o in zip(prompts, outputs)}
        drafter = SyntheticDrafter(args.acceptance, oracle, config.vocab_size, seed=args.seed)
        tree_tok_s, tree_out = _tokens_per_s(target, drafter, "tree", B, prompts, args.new, args.nodes)
        rows.append(dict(tensor_parallel=par.world, B=B, ar_ms=ar_ms, floor_ms=floor_ms, collective_ms=coll_ms,
                         ar_target_ms=1.6 * floor_ms + coll_ms, ar_target_met=ar_ms <= 1.6 * floor_ms + coll_ms,
                         shard_bytes=shard_bytes, ar_tok_s=ar_tok_s, tree_tok_s=tree_tok_s,
                         spec_speedup=tree_tok_s / ar_tok_s if ar_tok_s else float("nan"),
                         tree_equals_ar=tree_out == outputs, device=torch.cuda.get_device_name(device)
                         if device.type == "cuda" else "cpu", copy_bandwidth_bytes_per_s=bandwidth))
    if par.active:
        torch.distributed.destroy_process_group()
    return rows if par.rank == 0 else []


def _run_size(world: int, argv: list[str]) -> list[dict]:
    """Rows of ``world`` ranks of ``lumotree ARGV``, started here (``world`` 1: one process)."""
    with tempfile.TemporaryDirectory() as tmp:
        part = os.path.join(tmp, "part.json")
        cmd = [sys.executable, "-m", "lumotree", *argv, "--part", part]
        if world == 1:
            envs = [{k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK", "LOCAL_RANK")}]
        else:
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                port = s.getsockname()[1]
            envs = [rank_env(r, world, port) for r in range(world)]
        procs = [subprocess.Popen(cmd, env=env) for env in envs]
        codes = [p.wait() for p in procs]
        if any(codes):
            raise RuntimeError(f"tensor_parallel = {world}: the ranks exited with {codes}")
        with open(part) as f:
            return json.load(f)


def table(rows: list[dict]) -> str:
    lines = ["| TP | B | AR step ms | floor ms | collectives ms | target ms | met | AR tok/s | tree tok/s | "
             "speed-up |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['tensor_parallel']} | {r['B']} | {r['ar_ms']:.3f} | {r['floor_ms']:.3f} | "
                     f"{r['collective_ms']:.3f} | {r['ar_target_ms']:.3f} | {'yes' if r['ar_target_met'] else 'no'} | "
                     f"{r['ar_tok_s']:.1f} | {r['tree_tok_s']:.1f} | {r['spec_speedup']:.2f} |")
    return "\n".join(lines)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", default="bench", choices=sorted(RANDOM_CONFIGS))
    parser.add_argument("--tensor-parallel", default=None, help="sizes to run, e.g. 1,2,4 (ranks started here; "
                                                                "unset: this process, or each torchrun rank)")
    parser.add_argument("--batches", default="1,16,64")
    parser.add_argument("--prompt-len", type=int, default=64)
    parser.add_argument("--new", type=int, default=64, help="new tokens a request")
    parser.add_argument("--nodes", type=int, default=16, help="tree nodes (fixed budget)")
    parser.add_argument("--acceptance", type=float, default=0.8)
    parser.add_argument("--reps", type=int, default=REPS)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--smoke", action="store_true",
                        help="CPU (gloo, Triton interpreter), tiny model, batch 1, sizes 1,2 unless given")
    parser.add_argument("--json", help="write the rows here")
    parser.add_argument("--part", help=argparse.SUPPRESS)


SMOKE = ["--config", "tiny", "--batches", "1", "--prompt-len", "6", "--new", "3", "--nodes", "4", "--reps", "1"]


def run(args: argparse.Namespace) -> int:
    if args.smoke:
        os.environ["TRITON_INTERPRET"] = "1"
        os.environ["CUDA_VISIBLE_DEVICES"] = ""
        args.config, args.batches, args.prompt_len, args.new, args.nodes, args.reps = "tiny", "1", 6, 3, 4, 1
        args.tensor_parallel = args.tensor_parallel or "1,2"
    if "WORLD_SIZE" in os.environ or args.part or not args.tensor_parallel:  # one size: this process is a rank
        rows = measure(args)
        out = args.part or args.json
        if rows and out:
            with open(out, "w") as f:
                json.dump(rows, f, indent=1)
        if rows and not args.part:
            print(table(rows))
        return 0
    line = list(getattr(args, "command_line", None) or ["bench", "tp"])
    argv = [a for i, a in enumerate(line) if a not in ("--smoke", "--tensor-parallel")
            and not (i and line[i - 1] in ("--tensor-parallel", "--json"))]
    argv = [a for a in argv if a != "--json"] + (SMOKE if args.smoke else [])
    rows = [r for world in (int(n) for n in args.tensor_parallel.split(",")) for r in _run_size(world, argv)]
    print(table(rows))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"rows": rows, "command": line}, f, indent=1)
    return 0


def main(argv: list[str] | None = None) -> int:
    """``lumotree bench tp ARGV``."""
    from lumotree.cli import main as cli_main

    return cli_main(["bench", "tp", *(sys.argv[1:] if argv is None else argv)])
