"""The memory planner: exact pool sizes, the largest request that fits, one-line refusals before any allocation."""

from __future__ import annotations

import pytest
import torch

from lumotree.cli import main
from lumotree.optimized.model import OptimizedModel, random_tensors
from lumotree.optimized.model.caches import Caches
from lumotree.optimized.model.memory import plan_memory, pool_bytes, step_bytes, step_shapes
from lumotree.optimized.model.presets import RANDOM_CONFIGS
from lumotree.reference.config import HybridConfig

GIB = 1 << 30
BENCH = HybridConfig(**RANDOM_CONFIGS["bench"])
BENCH_DIMS = ((16, 32, 128, 128, 4), (16, 2, 256))  # (H, HV, K, V, conv width), (HQ, HKV, D)
TINY = HybridConfig(**RANDOM_CONFIGS["tiny"])
TINY_35 = HybridConfig(**{**RANDOM_CONFIGS["tiny"], "model_type": "qwen3_5_text"})  # what the training model builds


def _tensors(caches: Caches) -> list[torch.Tensor]:
    out = [t for t in vars(caches).values() if isinstance(t, torch.Tensor)]
    for pending in caches.pending or []:
        out += [pending.kpt, pending.dp, pending.gamma_a, pending.active]
    return out


@pytest.mark.parametrize("deferred", [False, True])
def test_the_layout_is_what_the_pools_allocate(deferred):
    gdn, attn = (2, 4, 16, 16, 4), (4, 2, 8)
    caches = Caches(3, 40, 3, 1, gdn, attn, torch.float16, torch.device("cpu"), deferred)
    layout = Caches.layout(3, 40, 3, 1, gdn, attn, torch.float16, deferred)
    for name, (shape, dtype, count) in layout.items():
        if name.startswith("pending."):
            tensors = [getattr(p, name.split(".")[1]) for p in caches.pending]
        else:
            tensors = [getattr(caches, name)]
        assert len(tensors) == count and all(t.shape == shape and t.dtype == dtype for t in tensors), name
    allocated = sum(t.numel() * t.element_size() for t in _tensors(caches))
    config = HybridConfig(**{**RANDOM_CONFIGS["tiny"], "num_hidden_layers": 4})  # 3 GDN + 1 attention layer
    assert pool_bytes(config, gdn, attn, num_slots=3, capacity=40, dtype=torch.float16, deferred=deferred) == allocated


def test_step_shapes_are_the_engine_buckets():
    assert step_shapes(1, 1) == [(1, 1)]
    assert step_shapes(3, 4, speculative=False) == [(1, 1), (2, 1), (3, 1)]
    shapes = step_shapes(48, 64)
    assert (48, 64) in shapes and (32, 2) in shapes and (64, 64) not in shapes
    assert len(shapes) == 7 + 7 * 6  # 7 batches (1..32, 48) decode + 6 tree sizes each


def test_step_bytes_grow_with_the_step_and_count_the_logits():
    small = step_bytes(BENCH, *BENCH_DIMS, 1, 2, torch.bfloat16)
    big = step_bytes(BENCH, *BENCH_DIMS, 64, 64, torch.bfloat16)
    assert 0 < small < big
    assert big >= 64 * 64 * BENCH.vocab_size * 4  # fp32 logits of every node


def test_an_explicit_request_fits_or_is_refused_with_what_would_fit():
    common = dict(dtype=torch.bfloat16, max_nodes=64, graphs=True)
    plan = plan_memory(BENCH, *BENCH_DIMS, free_bytes=75 * GIB, num_slots=16, max_seq_len=4096, **common)
    assert (plan.num_slots, plan.max_seq_len) == (16, 4096)
    assert plan.pool_bytes + plan.step_bytes <= 0.9 * 75 * GIB
    with pytest.raises(ValueError) as refused:
        plan_memory(BENCH, *BENCH_DIMS, free_bytes=20 * GIB, num_slots=64, max_seq_len=32768, **common)
    message = str(refused.value)
    assert "\n" not in message and "num_slots = 64" in message and "20.0 GiB free" in message
    most = int(message.split("at most ")[1].split(" slots")[0])
    assert plan_memory(BENCH, *BENCH_DIMS, free_bytes=20 * GIB, num_slots=most, max_seq_len=32768, **common)
    with pytest.raises(ValueError):
        plan_memory(BENCH, *BENCH_DIMS, free_bytes=20 * GIB, num_slots=most + 1, max_seq_len=32768, **common)


@pytest.mark.parametrize("graphs", [True, False])
def test_auto_sizes_are_the_largest_that_fit(graphs):
    common = dict(dtype=torch.bfloat16, max_nodes=64, graphs=graphs, free_bytes=40 * GIB)
    plan = plan_memory(BENCH, *BENCH_DIMS, num_slots=None, max_seq_len=8192, **common)
    assert plan.num_slots >= 1
    with pytest.raises(ValueError):
        plan_memory(BENCH, *BENCH_DIMS, num_slots=plan.num_slots + 1, max_seq_len=8192, **common)
    longest = plan_memory(BENCH, *BENCH_DIMS, num_slots=8, max_seq_len=None, **common)
    assert 1 <= longest.max_seq_len < 1 << 24
    with pytest.raises(ValueError):
        plan_memory(BENCH, *BENCH_DIMS, num_slots=8, max_seq_len=longest.max_seq_len + 1, **common)


def test_graphs_keep_every_step_shape_and_headroom_is_kept_back():
    common = dict(dtype=torch.bfloat16, max_nodes=64, free_bytes=75 * GIB, num_slots=16, max_seq_len=2048)
    with_graphs = plan_memory(BENCH, *BENCH_DIMS, graphs=True, **common)
    eager = plan_memory(BENCH, *BENCH_DIMS, graphs=False, **common)
    assert with_graphs.step_bytes > eager.step_bytes == step_bytes(BENCH, *BENCH_DIMS, 16, 64, torch.bfloat16)
    with pytest.raises(ValueError, match="both None"):
        plan_memory(BENCH, *BENCH_DIMS, graphs=True, **{**common, "num_slots": None, "max_seq_len": None})
    with pytest.raises(ValueError, match="headroom"):
        plan_memory(BENCH, *BENCH_DIMS, graphs=True, headroom=1.0, **common)


def test_the_model_refuses_an_impossible_request_before_allocating(monkeypatch):
    tensors = random_tensors(TINY, 0, "cpu", torch.float32)
    monkeypatch.setattr("lumotree.optimized.model.model.free_memory", lambda device: 64 << 20)
    with pytest.raises(ValueError, match="num_slots = 100000 and max_seq_len = 65536"):
        OptimizedModel(TINY, tensors, num_slots=100_000, max_seq_len=65536, device="cpu", graphs=False)
    model = OptimizedModel(TINY, tensors, num_slots=None, max_seq_len=512, device="cpu", graphs=False)
    assert model.num_slots == model.memory_plan.num_slots >= 1
    assert model.caches.k_stack.shape[1] == model.num_slots and model.capacity == 512 + model.max_nodes
    assert model.memory_plan.pool_bytes + model.memory_plan.step_bytes <= 0.9 * (64 << 20)


def test_cli_auto_sizes(capsys, monkeypatch):
    base = ["generate", "--random", "tiny", "--max-new-tokens", "2", "--spec", "none", "--prompt", "1 2 3"]
    code = _run(capsys, *base, "--backend", "reference", "--num-slots", "auto")
    assert code[0] == 2 and code[2].strip().splitlines()[-1].startswith("error: --num-slots auto")
    code = _run(capsys, *base, "--num-slots", "many")
    assert code[0] == 2 and "--num-slots" in code[2]
    monkeypatch.setattr("lumotree.optimized.model.model.free_memory", lambda device: 32 << 20)
    code, out, err = _run(capsys, *base, "--backend", "optimized", "--num-slots", "auto", "--max-seq-len", "128")
    assert code == 0, err
    assert "memory plan:" in err and "x 128 tokens" in err


def _run(capsys, *argv: str) -> tuple[int, str, str]:
    try:
        code = main(list(argv))
    except SystemExit as exc:
        code = exc.code
    out = capsys.readouterr()
    return code, out.out, out.err


def _assert_the_plan_holds_the_head(model, head, **layers: int) -> None:
    """The plan of ``model`` (3 slots of 24 tokens, 4 nodes, fp32) with the head's ``layers`` (``mtp_layers`` or
    ``eagle_layers``) exceeds the plain plan by exactly the head's pools and the hidden rows the model keeps for it,
    and the model's own plan is that one."""
    extra = sum(t.numel() * t.element_size() for t in _tensors(head.caches)) + \
        model.hidden_rows.numel() * model.hidden_rows.element_size()
    common = dict(dtype=torch.float32, num_slots=3, max_seq_len=24, max_nodes=4, graphs=False, free_bytes=GIB)
    dims = (model.weights.gdn_dims, model.weights.attn_dims)
    plain = plan_memory(model.config, *dims, **common)
    assert extra > 0 and plan_memory(model.config, *dims, **layers, **common).pool_bytes - plain.pool_bytes == extra
    assert model.memory_plan.pool_bytes == plain.pool_bytes + extra


def test_the_mtp_head_pools_are_counted_exactly():
    """A model with an MTP head plans for its KV pools and the hidden states it keeps: the plan's pools exceed the
    plain model's by exactly what ``mtp_head()`` allocates."""
    config = HybridConfig(**{**RANDOM_CONFIGS["tiny"], "mtp_num_hidden_layers": 1})
    tensors = random_tensors(config, 0, "cpu", torch.float32)
    model = OptimizedModel(config, tensors, num_slots=3, max_seq_len=24, max_nodes=4, graphs=False)
    _assert_the_plan_holds_the_head(model, model.mtp_head(), mtp_layers=1)


def _eagle_checkpoint(path) -> None:
    """A random TINY_35 checkpoint in ``path`` with an (untrained) EAGLE head in ``path/eagle``."""
    pytest.importorskip("safetensors")
    from lumotree.training.eagle import new_eagle_head, save_eagle
    from lumotree.training.model import HybridLM, save_checkpoint

    trainable = HybridLM(TINY_35, backend="torch")
    trainable.initialize(0)
    save_checkpoint(trainable, path, dtype=torch.float32)
    save_eagle(new_eagle_head(trainable), trainable, path / "eagle")


def test_the_eagle_head_pools_are_counted_exactly(tmp_path):
    """A model told of an EAGLE head (``eagle_layers=1``) plans for its KV pools and the hidden states it keeps: the
    plan's pools exceed the plain model's by exactly what ``optimized_eagle_head`` allocates."""
    from lumotree.optimized.engine.eagle import optimized_eagle_head
    from lumotree.optimized.model import load_pretrained

    _eagle_checkpoint(tmp_path)
    model = load_pretrained(tmp_path, num_slots=3, max_seq_len=24, max_nodes=4, graphs=False, dtype=torch.float32,
                            eagle_layers=1)
    _assert_the_plan_holds_the_head(model, optimized_eagle_head(model, tmp_path / "eagle")[0], eagle_layers=1)
    with pytest.raises(ValueError, match="eagle_layers = -1 must be an integer"):
        OptimizedModel(TINY_35, random_tensors(TINY_35, 0, "cpu", torch.float32), eagle_layers=-1, device="cpu")


def test_cli_auto_sizes_with_the_eagle_drafter(capsys, monkeypatch, tmp_path):
    """``--num-slots auto`` with ``--drafter eagle`` plans the head's pools (no refusal) and decodes."""
    _eagle_checkpoint(tmp_path)
    monkeypatch.setattr("lumotree.optimized.model.model.free_memory", lambda device: 32 << 20)
    code, out, err = _run(capsys, "generate", "--model", str(tmp_path), "--backend", "optimized", "--drafter", "eagle",
                          "--spec", "chain", "--max-nodes", "4", "--num-slots", "auto", "--max-seq-len", "64",
                          "--max-new-tokens", "2", "--prompt", "1 2 3", "--budget", "fixed")
    assert code == 0, err
    assert "memory plan:" in err and "x 64 tokens" in err
