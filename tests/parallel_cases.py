"""Decoding cases run alike on one process and on each rank of a tensor-parallel group (gloo on the CPU): the
tiny models of every model type and the engine's modes with its deterministic drafters. Used by
``tests/test_tensor_parallel.py``; ``python parallel_cases.py OUT WORLD [cuda]`` runs as one rank of a launch
(:func:`lumotree.optimized.parallel.launch.rank_env`; gloo on the CPU, or NCCL and CUDA graphs with ``cuda``) and
rank 0 saves the results to ``OUT``."""

from __future__ import annotations

import os
import sys

if "cuda" not in sys.argv[3:]:
    os.environ.setdefault("TRITON_INTERPRET", "1")

import torch  # noqa: E402

from lumotree.optimized.engine import Engine, OptimizedTarget, SamplingParams  # noqa: E402
from lumotree.optimized.engine.drafters import DraftModelDrafter, make_drafter  # noqa: E402
from lumotree.optimized.engine.selfspec import layer_skip_checkpoint  # noqa: E402
from lumotree.optimized.model import OptimizedModel, random_tensors  # noqa: E402
from lumotree.optimized.model.weights import successor_permutation  # noqa: E402
from lumotree.optimized.parallel import Parallel, init_parallel, vocab_range  # noqa: E402
from lumotree.reference.config import HybridConfig  # noqa: E402

# heads, kv heads, columns and experts that split over 2 and 4 ranks (attention: 2 KV heads, so 4 ranks each hold a
# copy of one); 2 layers: one GDN, one attention
BASE = dict(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
            layer_types=("linear_attention", "full_attention"), num_attention_heads=4, num_key_value_heads=2,
            head_dim=16, linear_key_head_dim=16, linear_value_head_dim=16, linear_num_key_heads=4,
            linear_num_value_heads=4, num_experts=0, rope_theta=1000.0)
MODELS = {
    "qwen3_next": dict(BASE, mtp_num_hidden_layers=1),
    "qwen3_5_text": dict(BASE, model_type="qwen3_5_text"),
    "qwen3_5_moe_text": dict(BASE, model_type="qwen3_5_moe_text", num_experts=4, num_experts_per_tok=2,
                             moe_intermediate_size=16, shared_expert_intermediate_size=16),
}
SEED = 3


def _chain(start: int, length: int) -> list[int]:
    """``start, pi(start), pi(pi(start)), ...`` then ``start`` again: the greedy continuation of a successor model
    (:func:`~lumotree.optimized.model.weights.random_tensors`) is the chain seen before, which the n-gram and suffix
    drafters propose, so drafts are accepted as well as rejected."""
    pi = successor_permutation(BASE["vocab_size"], SEED).tolist()
    out = [start]
    for _ in range(length - 1):
        out.append(pi[out[-1]])
    return out + [start]


PROMPTS = [_chain(5, 5), _chain(7, 3)]
GREEDY = SamplingParams(max_new_tokens=4)
SAMPLED = SamplingParams(max_new_tokens=4, temperature=16.0, seed=11)  # hot: the draws matter

#: (model, mode, drafter, sampled second request); 4 ranks: one of the cases of 2 (one expert, one GDN key head
#: and one query head a rank, the two KV heads held twice)
CASES = {
    2: [("qwen3_next", "autoregressive", None, False), ("qwen3_next", "chain", "ngram", False),
        ("qwen3_next", "tree", "ngram", True), ("qwen3_next", "tree", "mtp", False),
        ("qwen3_5_text", "tree", "draft-model", False), ("qwen3_5_moe_text", "tree", "suffix", True)],
    4: [("qwen3_5_moe_text", "tree", "suffix", True)],
}


def run_cases(cases: list, par: Parallel, device: str | torch.device = "cpu") -> dict:
    """Each case's tokens per prompt and the first prompt's prefill logits (every case on fresh models; fp32; on
    a GPU with CUDA graphs)."""
    out, device = {}, torch.device(device)
    for model_name, mode, drafter_name, sampled in cases:
        config = HybridConfig(**MODELS[model_name])
        tensors = random_tensors(config, seed=SEED, device=device, successor=True)
        common = dict(num_slots=4, max_seq_len=48, graphs=device.type == "cuda", dtype=torch.float32, device=device,
                      parallel=par)
        model = OptimizedModel(config, tensors, max_nodes=8, **common)
        logits = model.prefill(0, PROMPTS[0]).cpu()
        model.release(0)
        target = OptimizedTarget(model, batch_buckets=(2, 4))
        drafter = None
        if drafter_name == "draft-model":
            dc, dt = layer_skip_checkpoint(config, tensors, [0])
            drafter = DraftModelDrafter(OptimizedTarget(OptimizedModel(dc, dt, max_nodes=8, **common)))
        elif drafter_name is not None:
            drafter = make_drafter(drafter_name, target=target, **({"depth": 1, "top_k": 1} if drafter_name == "mtp"
                                                                   else {}))
        engine = Engine(target, drafter, mode=mode, budget="fixed", max_nodes=8)
        results = engine.generate(PROMPTS, [GREEDY, SAMPLED if sampled else GREEDY])
        out[(model_name, mode, drafter_name, sampled)] = {
            "tokens": [r.tokens for r in results], "accepted": sum(r.accepted for r in results), "logits": logits}
    return out


def collectives_agree(par: Parallel, device: torch.device) -> bool:
    """The vocabulary-parallel gather and argmax against one process's ``cat`` and ``argmax`` of every rank's
    shard (a vocabulary of ``5 P - 2``: the last shard is short), with ties inside and across shards."""
    vocab = 5 * par.world - 2
    full = torch.zeros((4, vocab), device=device)  # row 0: all tied (id 0 wins)
    full[1, [1, 6, vocab - 1]] = 2.0  # a tie across shards: the lowest id
    full[2, vocab - 1] = 3.0  # in the short last shard
    full[3] = torch.arange(vocab, device=device) % 4  # ties in every shard
    first, end = vocab_range(vocab, par.rank, par.world)
    local = full[:, first:end].contiguous()
    ok = bool(torch.equal(par.gather_vocab(local, vocab), full)) and \
        par.argmax(local, vocab).tolist() == full.argmax(-1).tolist()
    if device.type != "cuda":
        return ok
    # the same collectives captured in one CUDA graph and replayed on new inputs (as the model's step graphs hold them)
    x = torch.full((3, 8), float(par.rank + 1), device=device)
    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        par.all_reduce(x.clone())  # warm-up outside the capture
    torch.cuda.current_stream(device).wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        summed = par.all_reduce(x.clone())
        gathered, best = par.gather_vocab(local, vocab), par.argmax(local, vocab)
    x.fill_(2.0 * (par.rank + 1))
    local.copy_(full[:, first:end].flip(0))
    graph.replay()
    torch.cuda.synchronize(device)
    total = float(par.world * (par.world + 1))  # sum over ranks of 2 (rank + 1)
    return ok and bool((summed == total).all()) and bool(torch.equal(gathered, full.flip(0))) and \
        best.tolist() == full.flip(0).argmax(-1).tolist()


def served(par: Parallel, device: torch.device) -> tuple:
    """``lumotree serve``'s ranks: rank 0 drives a :class:`~lumotree.server.follow.LeaderEngine` (requests submitted
    between steps, one aborted), the others :func:`~lumotree.server.follow.follow` it. Returns (steps, the rank's
    free slots at the end, rank 0's tokens of the first request)."""
    from lumotree.server.follow import LeaderEngine, follow

    config = HybridConfig(**MODELS["qwen3_next"])
    model = OptimizedModel(config, random_tensors(config, seed=SEED, device=device, successor=True), num_slots=4,
                           max_seq_len=48, max_nodes=8, graphs=False, dtype=torch.float32, device=device,
                           parallel=par)
    engine = Engine(OptimizedTarget(model, batch_buckets=(2, 4)), make_drafter("ngram"), mode="tree",
                    budget="fixed", max_nodes=8)
    if par.rank:
        return follow(engine), sorted(engine.free_slots), None
    leader, steps, tokens = LeaderEngine(engine), 0, {}
    first = leader.submit(PROMPTS[0], SamplingParams(max_new_tokens=8))
    while leader.has_work():
        if steps == 1:
            leader.submit(PROMPTS[1], SAMPLED)
            leader.abort(leader.submit(PROMPTS[1], GREEDY))
        for event in leader.step():
            tokens.setdefault(event.request_id, []).extend(event.tokens)
        steps += 1
    leader.close()
    return steps, sorted(engine.free_slots), tokens[first]


def main(path: str, world: int, device_kind: str = "cpu") -> int:
    torch.set_num_threads(1)
    par, device = init_parallel(world)
    agree = collectives_agree(par, device)
    results = run_cases(CASES[world], par, device)
    mine = [v["tokens"] for v in results.values()]
    every = par.broadcast_object(mine, src=1)  # rank 1's tokens, to check that the ranks agree
    serving = served(par, device) if world == 2 else None
    follower = par.broadcast_object(serving, src=1)
    if par.rank == 0:
        torch.save({"results": results, "rank1_tokens": every, "collectives_agree": agree, "served": serving,
                    "follower": follower}, path)
    torch.distributed.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], int(sys.argv[2]), *sys.argv[3:]))
