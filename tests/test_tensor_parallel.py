"""Tensor and expert parallel decoding (:mod:`lumotree.optimized.parallel`): on the CPU, 2 and 4 gloo processes
decode the tiny models of every model type exactly as one process does (greedy tokens, a sampled request, prefill
logits to fp32 rounding) in every mode, with the model drafters running in lockstep and the others on rank 0;
``lumotree generate --tensor-parallel 2`` launches its ranks and prints one process's tokens. The sharding plan
refuses sizes that do not split, and the expert-parallel MoE blocks sum to the whole block. On a machine with at
least two GPUs, ``pytest -m multigpu``: the same over NCCL with CUDA graphs holding the collectives, and the scaling
benchmark's short form."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys

import pytest
import torch

import parallel_cases as cases
from lumotree.cli import main
from lumotree.optimized.model import load_checkpoint, random_weights
from lumotree.optimized.ops.gemv import Fp8Weight
from lumotree.optimized.ops.moe import moe_routed
from lumotree.optimized.parallel import SINGLE, check_shardable, shard_weights, vocab_range
from lumotree.optimized.parallel.launch import rank_env
from lumotree.reference.config import HybridConfig
from lumotree.reference.model import build_random, save_pretrained

HERE = os.path.dirname(os.path.abspath(__file__))
_SINGLE: dict = {}  # the one-process results of the cases, computed once for both sizes


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _ranks(world: int, out: str, *extra: str) -> list[subprocess.Popen]:
    port = _free_port()
    cpu = {} if "cuda" in extra else {"CUDA_VISIBLE_DEVICES": "", "TRITON_INTERPRET": "1"}  # gloo on the CPU
    return [subprocess.Popen([sys.executable, os.path.join(HERE, "parallel_cases.py"), out, str(world), *extra],
                             env={**rank_env(r, world, port), **cpu}, stderr=subprocess.PIPE) for r in range(world)]


#: the gloo tests run the kernels in the Triton interpreter on the CPU; a GPU machine runs the multigpu ones instead
cpu_only = pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU path (gloo); pytest -m multigpu on GPUs")


def _wait(procs: list[subprocess.Popen], timeout: float = 300) -> None:
    for rank, p in enumerate(procs):
        _, err = p.communicate(timeout=timeout)
        assert p.returncode == 0, f"rank {rank} failed:\n{err.decode()[-3000:]}"


def test_sizes_that_do_not_split_are_refused_naming_tensor_parallel():
    base = HybridConfig(**cases.BASE)
    for config, world, key in ((base, 3, "linear_num_key_heads"),
                               (HybridConfig(**{**cases.BASE, "num_attention_heads": 6, "num_key_value_heads": 3}),
                                2, "num_key_value_heads"),
                               (HybridConfig(**cases.MODELS["qwen3_5_moe_text"], ), 8, "linear_num_key_heads"),
                               (HybridConfig(**{**cases.MODELS["qwen3_5_moe_text"], "num_experts": 6}), 4,
                                "num_experts")):
        with pytest.raises(ValueError, match=f"tensor_parallel = {world} .*{key}"):
            check_shardable(config, world)
    check_shardable(base, 4)  # 2 KV heads over 4 ranks: each holds the one its query heads read
    weights = random_weights(base, 0, "cpu", torch.float32)
    part = shard_weights(weights, base, 1, 2)
    assert (part.gdn_dims, part.attn_dims, part.shard) == ((2, 2, 16, 16, 4), (2, 1, 16), (1, 2))
    assert part.lm_head.shape[0] == 32 and torch.equal(part.lm_head, weights.lm_head[32:])
    assert torch.equal(part.layers[0].w_out, weights.layers[0].w_out[:, 32:])
    assert shard_weights(weights, base, 0, 1) is weights
    with pytest.raises(ValueError, match="already the part"):
        shard_weights(part, base, 0, 2)
    assert [vocab_range(10, r, 4) for r in range(4)] == [(0, 3), (3, 6), (6, 9), (9, 10)]
    x = torch.randn(3, 5)
    assert SINGLE.all_reduce(x) is x and SINGLE.gather_vocab(x, 5) is x and SINGLE.argmax(x, 5).tolist() == \
        x.argmax(-1).tolist()


def _leaves(obj, at: str = "") -> dict:
    """Every tensor and size of a weights dataclass by its path."""
    if dataclasses.is_dataclass(obj):
        return {k: v for f in dataclasses.fields(obj)
                for k, v in _leaves(getattr(obj, f.name), f"{at}.{f.name}").items()}
    if isinstance(obj, list):
        return {k: v for i, x in enumerate(obj) for k, v in _leaves(x, f"{at}[{i}]").items()}
    return {at: obj}


@pytest.mark.parametrize("name", ["qwen3_next", "qwen3_5_moe_text"])
def test_a_checkpoint_streams_each_rank_its_part(name, tmp_path):
    """``load_checkpoint(part=(rank, P))`` cuts each layer as it arrives: the same part as the whole model cut after
    (packed Qwen3-Next projections with an MTP head; split Qwen3.5 projections with experts)."""
    config = HybridConfig(**cases.MODELS[name])
    save_pretrained(build_random(config, seed=1), tmp_path, dtype="float32")
    _, whole, _ = load_checkpoint(tmp_path, "cpu", torch.float32)
    for rank in range(2):
        expected = _leaves(shard_weights(whole, config, rank, 2))
        got = _leaves(load_checkpoint(tmp_path, "cpu", torch.float32, part=(rank, 2))[1])
        assert got.keys() == expected.keys()
        for key, value in expected.items():
            assert torch.equal(got[key], value) if isinstance(value, torch.Tensor) else got[key] == value, key


def test_block_fp8_weights_split_on_whole_scale_blocks():
    """Block-FP8 projections (an FP8 ``w_in`` with a float tail, as a release stores ``in_proj_ba``; FP8 experts and
    shared expert) split into the parts of their dequantised weights; a cut inside a scale block is refused."""
    config = HybridConfig(**{**cases.MODELS["qwen3_5_moe_text"], "hidden_size": 64, "head_dim": 64,
                             "linear_key_head_dim": 64, "linear_value_head_dim": 64, "moe_intermediate_size": 32,
                             "shared_expert_intermediate_size": 256, "mtp_num_hidden_layers": 0})
    plain = random_weights(config, 0, "cpu", torch.float32)
    fp8 = lambda w: Fp8Weight.quantize(w)  # noqa: E731
    H, HV, K, V, _ = plain.gdn_dims
    gdn = plain.layers[0]
    rows = 2 * H * K + 2 * HV * V  # q | k | v | z in FP8, b | a a float tail
    layers = [dataclasses.replace(gdn, w_in=fp8(gdn.w_in[:rows])._replace(tail=gdn.w_in[rows:].contiguous()),
                                  w_out=fp8(gdn.w_out)),
              dataclasses.replace(plain.layers[1], w_qkv=fp8(plain.layers[1].w_qkv), w_o=fp8(plain.layers[1].w_o))]
    mlps = [dataclasses.replace(m, w_gate_up=fp8(m.w_gate_up), w_down=fp8(m.w_down),
                                shared_gate_up=fp8(m.shared_gate_up), shared_down=fp8(m.shared_down))
            for m in plain.mlps]
    quantised = dataclasses.replace(plain, layers=layers, mlps=mlps)
    dense = lambda w: w.dequantize() if isinstance(w, Fp8Weight) else w  # noqa: E731
    exact = dataclasses.replace(plain, layers=[dataclasses.replace(w, **{f.name: dense(getattr(w, f.name))
                                                                        for f in dataclasses.fields(w)})
                                               for w in layers],
                                mlps=[dataclasses.replace(m, **{f.name: dense(getattr(m, f.name))
                                                                for f in dataclasses.fields(m)}) for m in mlps])
    for rank in range(2):
        got, want = _leaves(shard_weights(quantised, config, rank, 2)), _leaves(shard_weights(exact, config, rank, 2))
        assert got.keys() == want.keys()
        for key, value in want.items():
            part = got[key]
            if isinstance(value, torch.Tensor):
                assert torch.equal(dense(part), value), key
                assert isinstance(part, Fp8Weight) == (key.rsplit(".", 1)[-1] in (
                    "w_in", "w_out", "w_qkv", "w_o", "w_gate_up", "w_down", "shared_gate_up", "shared_down")), key
    with pytest.raises(ValueError, match="tensor_parallel: columns .* scale blocks"):
        shard_weights(quantised, config, 0, 4)  # 256 / 4 = 64 columns of the shared expert's down projection


def test_expert_blocks_sum_to_the_whole_moe_block():
    """Each rank's experts (``first_expert``) and its columns of the shared expert: the blocks' outputs sum to the
    block of all experts; a block that does not fit the router is refused."""
    gen = torch.Generator().manual_seed(0)
    T, Dm, E, I, Is = 5, 32, 4, 16, 16
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    draw = lambda *shape, scale=1.0: (torch.randn(*shape, generator=gen) * scale).to(dev)  # noqa: E731
    x, router, s_gate = draw(T, Dm), draw(E, Dm), draw(1, Dm)
    gate_up, down = draw(E, 2 * I, Dm, scale=1 / 6), draw(E, Dm, I, scale=1 / 4)
    s_gate_up, s_down = draw(2 * Is, Dm, scale=1 / 6), draw(Dm, Is, scale=1 / 4)
    whole = moe_routed(x, router, gate_up, down, top_k=2, norm_topk_prob=True, shared_gate_up=s_gate_up,
                       shared_down=s_down, shared_gate=s_gate)
    parts = []
    for r in range(2):
        rows = torch.cat([torch.arange(r * 8, r * 8 + 8), Is + torch.arange(r * 8, r * 8 + 8)])
        parts.append(moe_routed(x, router, gate_up[2 * r : 2 * r + 2].contiguous(), down[2 * r : 2 * r + 2]
                                .contiguous(), top_k=2, norm_topk_prob=True, shared_gate_up=s_gate_up[rows]
                                .contiguous(), shared_down=s_down[:, r * 8 : r * 8 + 8].contiguous(),
                                shared_gate=s_gate, first_expert=2 * r))
    torch.testing.assert_close(parts[0] + parts[1], whole, rtol=1e-5, atol=1e-5)
    assert (parts[0] - whole).abs().max() > 1e-2  # each part alone is not the block
    with pytest.raises(ValueError, match="first_expert"):
        moe_routed(x, router, gate_up[:2].contiguous(), down[:2].contiguous(), top_k=2, norm_topk_prob=True,
                   first_expert=3)


@cpu_only
@pytest.mark.parametrize("world", [2, 4])
def test_ranks_decode_exactly_as_one_process(world, tmp_path, one_torch_thread):
    out = str(tmp_path / "rank0.pt")
    procs = _ranks(world, out)
    missing = [key for key in cases.CASES[world] if key not in _SINGLE]
    _SINGLE.update(cases.run_cases(missing, SINGLE))  # while the ranks run
    _wait(procs)
    got = torch.load(out, weights_only=False)
    assert got["collectives_agree"]
    for key in cases.CASES[world]:
        one, many = _SINGLE[key], got["results"][key]
        assert many["tokens"] == one["tokens"], key
        assert many["accepted"] == one["accepted"], key
        torch.testing.assert_close(many["logits"], one["logits"], rtol=1e-5, atol=1e-5)
    assert got["rank1_tokens"] == [got["results"][k]["tokens"] for k in cases.CASES[world]]
    speculative = [got["results"][k]["accepted"] for k in cases.CASES[world] if k[1] != "autoregressive"]
    assert sum(speculative) > 0  # drafts were accepted (and committed) on the ranks too
    if world == 2:  # lumotree serve's ranks: the follower made rank 0's steps and freed the same slots
        steps, free, tokens = got["served"]
        assert got["follower"][:2] == (steps, free) and free == [0, 1, 2, 3] and steps >= 2
        assert tokens[:4] == _SINGLE[("qwen3_next", "tree", "ngram", True)]["tokens"][0]


@cpu_only
def test_generate_launches_tensor_parallel_ranks(tmp_path, capsys):
    argv = ["--random", "tiny", "--backend", "optimized", "--prompt", "3 1 4 1 5 3 1 4", "--max-new-tokens", "4",
            "--spec", "tree", "--drafter", "ngram", "--budget", "fixed", "--max-nodes", "4", "--num-slots", "2",
            "--max-seq-len", "32", "--no-stream", "--quiet"]
    env = {**os.environ, "TRITON_INTERPRET": "1", "CUDA_VISIBLE_DEVICES": ""}
    two = subprocess.Popen([sys.executable, "-m", "lumotree", "generate", *argv, "--tensor-parallel", "2", "--json",
                            str(tmp_path / "two.json")], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert main(["generate", *argv, "--json", str(tmp_path / "one.json")]) == 0
    out, err = two.communicate(timeout=300)
    assert two.returncode == 0, err.decode()[-2000:]
    one = json.loads((tmp_path / "one.json").read_text())["results"][0]["tokens"]
    assert json.loads((tmp_path / "two.json").read_text())["results"][0]["tokens"] == one
    assert out.decode().count("(max_new_tokens)") == 1  # rank 0 prints; the other rank's output is dropped
    capsys.readouterr()
    assert main(["generate", *argv, "--backend", "reference", "--tensor-parallel", "2"]) == 2
    assert "--tensor-parallel 2 needs --backend optimized" in capsys.readouterr().err


# ================================================================================================== multi-GPU
@pytest.mark.multigpu
@pytest.mark.parametrize("world", [2, 4])
def test_nccl_ranks_with_cuda_graphs_decode_as_one_gpu(world, tmp_path):
    if torch.cuda.device_count() < world:
        pytest.skip(f"needs {world} GPUs")
    out = str(tmp_path / "rank0.pt")
    procs = _ranks(world, out, "cuda")
    _wait(procs, timeout=1200)
    one = cases.run_cases(cases.CASES[world], SINGLE, "cuda")
    got = torch.load(out, weights_only=False)
    assert got["collectives_agree"]
    for key in cases.CASES[world]:
        assert got["results"][key]["tokens"] == one[key]["tokens"], key
        torch.testing.assert_close(got["results"][key]["logits"], one[key]["logits"], rtol=1e-4, atol=1e-4)


@pytest.mark.multigpu
def test_scaling_benchmark_short_form(tmp_path, capsys):
    sizes = "1,2" + (",4" if torch.cuda.device_count() >= 4 else "")
    assert main(["bench", "tp", "--config", "small", "--tensor-parallel", sizes, "--batches", "1,16", "--new", "16",
                 "--prompt-len", "16", "--json", str(tmp_path / "tp.json")]) == 0
    rows = json.loads((tmp_path / "tp.json").read_text())["rows"]
    print(json.dumps(rows, indent=1))
    assert {r["tensor_parallel"] for r in rows} == {int(n) for n in sizes.split(",")}
    assert all(r["tree_equals_ar"] and r["collective_ms"] >= 0 for r in rows)
