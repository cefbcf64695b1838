"""Loading a checkpoint of several GB: throughput from the page cache and peak host memory, against transformers'
``from_pretrained`` of the same files and the copy floor, in one run:
``python bench/load.py --out bench/baselines/load.json``.

The checkpoint: the ``bench`` random preset (2.2 B parameters: hidden 2048, 24 layers = 18 GDN + 6 gated attention,
vocabulary 151936) as a ``qwen3_5_text`` checkpoint with its MTP layer, bf16, written in the Qwen3.5 layout
(``in_proj_qkv`` / ``in_proj_z`` / ``in_proj_b`` / ``in_proj_a``) in shards of ``--shard-gb`` with an index, random
values (the loader checks every value for NaN / inf, so the values are read like real ones). The files are read once
before the timed loads, so every load reads them from the page cache.

Each load runs in a fresh process (its memory is its own) that samples its anonymous resident memory (``RssAnon``,
memory-mapped shards are file cache, not counted) every 5 ms:

- **lumotree**: :func:`lumotree.optimized.model.load_checkpoint` to the device (CUDA when present, else the host) in
  bf16; the bytes it reads (every value is read: the NaN / inf check), seconds, GB/s, and the peak anonymous memory
  above the process's own before the load (on the CPU, tensors kept as they are stored stay views of the mapped
  shards, and only the combined ones, such as the MLP's gate | up, take anonymous memory);
- **transformers**: ``AutoModelForCausalLM.from_pretrained(dtype=bfloat16)`` (``device_map`` the same device); on
  the CPU its weights stay views of the mapped shards, unread, so the time with a first read of every weight (one
  sum each) is what compares with lumotree's;
- **floor**: the stored bytes at the host's copy rate (a 1 GiB ``torch`` copy, read + write), and on CUDA also at
  the host-to-device rate of a 1 GiB pinned copy.

Run (CPU or GPU; about 2 minutes and 10 GB of disk and memory): ``python bench/load.py --out
bench/baselines/load.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from lumotree.optimized.model.presets import RANDOM_CONFIGS
from lumotree.reference.config import HybridConfig
from lumotree.reference.layouts import CheckpointLayout

GIB = 1024**3

#: run in a fresh process: load with lumotree or transformers, sampling RssAnon; prints one JSON line
CHILD = r"""
import json, sys, threading, time
import torch
which, path, device = sys.argv[1], sys.argv[2], sys.argv[3]

def anon():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) * 1024
    return 0

if which == "lumotree":
    from lumotree.optimized.model import load_checkpoint
else:
    import transformers
before = anon()
peak = [before]
done = threading.Event()
def sample():
    while not done.is_set():
        peak[0] = max(peak[0], anon())
        time.sleep(0.005)
thread = threading.Thread(target=sample, daemon=True)
thread.start()
start = time.perf_counter()
if which == "lumotree":
    _, weights, report = load_checkpoint(path, torch.device(device), torch.bfloat16)
    read = report.bytes
else:
    model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16, device_map=device)
    read = None
if device.startswith("cuda"):
    torch.cuda.synchronize()
seconds = time.perf_counter() - start
out = {"seconds": seconds, "bytes_read": read}
if which == "transformers" and device == "cpu":  # its weights are views of the memory-mapped shards: read them once
    with torch.no_grad():
        for p in model.parameters():
            p.sum()
    out["seconds_with_first_read"] = time.perf_counter() - start
done.set()
thread.join()
peak[0] = max(peak[0], anon())
print(json.dumps({**out, "anon_before": before, "anon_peak": peak[0]}))
"""


def bench_config() -> HybridConfig:
    return HybridConfig(**RANDOM_CONFIGS["bench"], model_type="qwen3_5_text", mtp_num_hidden_layers=1)


def write_random_checkpoint(path: Path, config: HybridConfig, shard_bytes: int, seed: int) -> tuple[int, int]:
    """The config's stored tensors (Qwen3.5 layout) as random bf16 values in shards of at most ``shard_bytes``, with
    ``config.json`` and the index; returns (stored bytes, shards). One shard is in memory at a time."""
    from safetensors.torch import save_file

    shapes = CheckpointLayout("qwen3_5_text").stored_shapes(config)
    gen = torch.Generator().manual_seed(seed)
    groups: list[list[str]] = [[]]
    size = 0
    for name in sorted(shapes):
        nbytes = 2 * int(torch.Size(shapes[name]).numel())
        if groups[-1] and size + nbytes > shard_bytes:
            groups.append([])
            size = 0
        groups[-1].append(name)
        size += nbytes
    weight_map, total = {}, 0
    for k, group in enumerate(groups):
        file = f"model-{k + 1:05d}-of-{len(groups):05d}.safetensors"
        shard = {name: (torch.randn(shapes[name], generator=gen) * 0.02).to(torch.bfloat16) for name in group}
        save_file(shard, str(path / file), metadata={"format": "pt"})
        for name, t in shard.items():
            weight_map[name] = file
            total += t.numel() * t.element_size()
        del shard
    (path / "model.safetensors.index.json").write_text(json.dumps({"metadata": {"total_size": total},
                                                                    "weight_map": weight_map}, indent=1))
    (path / "config.json").write_text(json.dumps({**config.to_dict(), "dtype": "bfloat16"}, indent=1))
    return total, len(groups)


def copy_rates(device: str) -> dict[str, float]:
    """Bytes per second (read + write) of a 1 GiB host copy, and on CUDA of a 1 GiB pinned host-to-device copy
    (median of 5)."""
    out = {}
    x = torch.empty(GIB // 2, dtype=torch.bfloat16)
    y = torch.empty_like(x)
    times = []
    for _ in range(5):
        start = time.perf_counter()
        y.copy_(x)
        times.append(time.perf_counter() - start)
    out["host_copy_bytes_per_s"] = 2 * GIB / sorted(times)[2]
    if device.startswith("cuda"):
        pinned = x.pin_memory()
        z = torch.empty_like(x, device=device)
        times = []
        for _ in range(5):
            torch.cuda.synchronize()
            start = time.perf_counter()
            z.copy_(pinned, non_blocking=True)
            torch.cuda.synchronize()
            times.append(time.perf_counter() - start)
        out["host_to_device_bytes_per_s"] = GIB / sorted(times)[2]
    return out


def child(which: str, path: Path, device: str) -> dict:
    proc = subprocess.run([sys.executable, "-c", CHILD, which, str(path), device], capture_output=True, text=True,
                          env={**os.environ, "TOKENIZERS_PARALLELISM": "false"})
    if proc.returncode != 0:
        return {"error": proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else f"exit {proc.returncode}"}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="bench/baselines/load.json")
    parser.add_argument("--dir", default=None, help="where to write the checkpoint (default: a temporary folder)")
    parser.add_argument("--shard-gb", type=float, default=2.0)
    parser.add_argument("--repeats", type=int, default=2, help="timed loads each (the fastest is kept)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args(argv)
    config = bench_config()
    root = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="lumotree-load-"))
    root.mkdir(parents=True, exist_ok=True)
    try:
        start = time.perf_counter()
        stored, shards = write_random_checkpoint(root, config, int(args.shard_gb * GIB), seed=0)
        print(f"wrote {stored / 1e9:.2f} GB in {time.perf_counter() - start:.1f} s", file=sys.stderr)
        for file in sorted(root.glob("*.safetensors")):  # into the page cache
            with open(file, "rb") as f:
                while f.read(64 << 20):
                    pass
        runs = {}
        for which in ("lumotree", "transformers"):
            tries = [child(which, root, args.device) for _ in range(args.repeats)]
            good = [t for t in tries if "error" not in t]
            runs[which] = min(good, key=lambda t: t["seconds"]) if good else tries[0]
            print(f"{which}: {runs[which]}", file=sys.stderr)
        rates = copy_rates(args.device)
    finally:
        if not args.dir:
            shutil.rmtree(root, ignore_errors=True)
    floor_rate = rates["host_copy_bytes_per_s"] / 2  # each stored byte read once and written once
    if args.device.startswith("cuda"):
        floor_rate = min(floor_rate, rates["host_to_device_bytes_per_s"])
    result = {
        "device": args.device, "device_name": torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu",
        "torch": torch.__version__, "checkpoint": {"preset": "bench", "model_type": "qwen3_5_text", "mtp_layers": 1,
                                                   "stored_bytes": stored, "shards": shards,
                                                   "shard_gb": args.shard_gb},
        "copy_rates": rates, "floor_seconds": stored / floor_rate,
        "date": time.strftime("%Y-%m-%d"), "command": "python bench/load.py --out " + args.out,
    }
    for which, r in runs.items():
        if "error" in r:
            result[which] = r
            continue
        peak = r["anon_peak"] - r["anon_before"]
        result[which] = {"seconds": r["seconds"], "gb_per_s": stored / r["seconds"] / 1e9,
                         "peak_anon_bytes": peak, "x_floor": r["seconds"] / result["floor_seconds"]}
        if "seconds_with_first_read" in r:
            result[which]["seconds_with_first_read"] = r["seconds_with_first_read"]
    if "seconds" in result.get("lumotree", {}) and "seconds" in result.get("transformers", {}):
        hf = result["transformers"]
        result["transformers_over_lumotree"] = hf.get("seconds_with_first_read", hf["seconds"]) / \
            result["lumotree"]["seconds"]
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
