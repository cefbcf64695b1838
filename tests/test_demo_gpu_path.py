"""``lumotree demo``'s two paths: the dispatch says which it took, and the GPU path (optimized engine) runs the demo's
seeded model with tree speculation and checks it against the same engine's autoregressive output.

On CPU the GPU path's code runs under the Triton interpreter in float32 (tiny sizes); ``pytest -m gpu`` runs
``lumotree demo --path gpu`` on the device in bfloat16 and float32."""

from __future__ import annotations

import argparse
import re

import pytest
import torch

from lumotree import demo as dispatch
from lumotree.cli import main

# small enough for the Triton interpreter: 4 layers (3 GDN + 1 attention), a 1-layer draft, 3-node trees
TINY = ["--prompt-length", "4", "--new-tokens", "4", "--draft-layers", "0", "--max-depth", "1", "--top-k", "2",
        "--tree-budget", "3", "--show-trees", "1", "--dtype", "float32"]


def _args(options: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    dispatch.add_arguments(parser)
    return parser.parse_args(options)


def test_gpu_path_on_the_interpreter_matches_autoregressive_fp32(capsys):
    from lumotree.optimized.engine.demo import run_engine

    assert run_engine(_args(TINY), device="cpu") == 0
    out = capsys.readouterr().out
    assert out.startswith("path: GPU code path on the CPU under the Triton interpreter (optimized engine, float32")
    assert "linear_key_head_dim 8 -> 16" in out  # the head-size change is stated, not hidden
    assert "(pending)" in out and "tokens/s" in out
    assert "same engine, token for token (4/4): OK" in out
    steps = [int(n) for n in re.findall(r"accepted (\d+) draft token", out)]
    mean = float(re.search(r"mean accepted length ([0-9.]+)", out).group(1))
    assert steps and mean == pytest.approx(sum(steps) / len(steps), abs=0.005)
    assert sum(steps) + len(steps) + 1 >= 4  # prefill token + every step's accepted tokens and next token


def test_gpu_path_reports_a_fp32_mismatch_with_the_gap_and_exit_code_1(capsys, monkeypatch):
    from lumotree.optimized.engine import demo as engine_demo

    honest = engine_demo.autoregressive_decode

    def off_by_one(target, prompt, args, params):
        tokens, seconds = honest(target, prompt, args, params)
        tokens[1] = (tokens[1] + 1) % target.vocab_size
        return tokens, seconds

    monkeypatch.setattr(engine_demo, "autoregressive_decode", off_by_one)
    options = [*TINY, "--new-tokens", "2", "--drafter", "ngram", "--show-trees", "0"]
    assert engine_demo.run_engine(_args(options), device="cpu") == 1
    out = capsys.readouterr().out
    assert "MISMATCH" in out and "at new token 1" in out
    gaps = re.search(r"top-2 logit gap there ([0-9.e+-]+) \(engine\), ([0-9.e+-]+) \(float64 reference\)", out)
    assert gaps and float(gaps.group(1)) >= 0 and float(gaps.group(2)) >= 0


def test_dispatch_without_cuda(capsys, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert main(["demo", "--path", "gpu"]) == 2
    assert "--path gpu needs a CUDA GPU" in capsys.readouterr().out
    assert main(["demo", "--new-tokens", "4", "--show-trees", "0"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("path: CPU reference (float64) (no CUDA GPU)\n")
    assert "(4/4): OK" in out


def test_dispatch_with_cuda_picks_the_engine_unless_options_need_the_reference(capsys, monkeypatch):
    from lumotree.optimized.engine import demo as engine_demo

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    taken = []
    monkeypatch.setattr(engine_demo, "run_engine", lambda args: taken.append(args.sampling) or 7)
    assert main(["demo"]) == 7 and taken == ["greedy"]
    assert main(["demo", "--path", "gpu", "--sampling", "deterministic"]) == 7
    assert dispatch.choose_path(_args(["--sampling", "iid"]))[0] == "cpu"  # sampled drafts: reference only
    assert dispatch.choose_path(_args(["--path", "cpu"])) == ("cpu", "--path cpu")
    assert main(["demo", "--path", "cpu", "--new-tokens", "3", "--show-trees", "0", "--dtype", "float32"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("path: CPU reference (float64) (--path cpu)") and "applies to the GPU path only" in out
    assert taken == ["greedy", "deterministic"]


def test_gpu_path_rejects_what_it_cannot_run(capsys, monkeypatch):
    from lumotree.optimized.engine.demo import run_engine

    assert run_engine(_args(["--sampling", "iid"]), device="cpu") == 2
    assert "only the reference drafters" in capsys.readouterr().out
    assert run_engine(_args(["--tree-budget", "129"]), device="cpu") == 2
    assert "largest tree" in capsys.readouterr().out
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    assert run_engine(_args([]), device="cpu") == 2
    assert "Triton interpreter" in capsys.readouterr().out


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_demo_takes_the_gpu_path_on_a_gpu(capsys, dtype):
    assert main(["demo", "--dtype", dtype]) == 0  # --path auto
    out = capsys.readouterr().out
    print(out)
    assert out.startswith(f"path: GPU (optimized engine: Triton kernels, {dtype}, CUDA graphs) on ")
    assert "after a warm-up run" in out
    speculative, autoregressive = (float(x) for x in re.findall(r"\(([0-9.]+) tokens/s\)", out))
    assert speculative > 0 and autoregressive > 0
    if dtype == "float32":
        assert "token for token (32/32): OK" in out
    else:  # bf16: identical, or a reported near-tie flip
        assert "token for token (32/32): OK" in out or "outputs differ at new token" in out
