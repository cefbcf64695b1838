"""Checkpoint layouts and loading: every layout of every model type (split or packed GDN projections, experts one by
one or fused, the text model under ``model.`` or ``model.language_model.``, a vision tower to skip, the MTP head, shards)
loads to the same weights through the streaming loader and the exact reader; the streaming loader reads each tensor
once, straight to the serving dtype (never float64), one host tensor at a time, with a progress bar; the reference
refuses checkpoints above its size limit; a malformed checkpoint ends in one line naming the key or the tensor, with
no tensor data read when the headers already show the fault and nothing left alive when the data does.
"""

from __future__ import annotations

import dataclasses
import gc
import io
import json
import weakref

import numpy as np
import pytest

torch = pytest.importorskip("torch")
safetensors = pytest.importorskip("safetensors")

from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

from lumotree.cli import main  # noqa: E402
from lumotree.optimized.model import ProgressBar, load_checkpoint  # noqa: E402
from lumotree.optimized.model.weights import load_weights  # noqa: E402
from lumotree.reference import model as rm  # noqa: E402
from lumotree.reference.checkpoint import INDEX_FILE, write_checkpoint  # noqa: E402
from lumotree.reference.config import HybridConfig  # noqa: E402
from lumotree.reference.layouts import CheckpointLayout, resolve_checkpoint  # noqa: E402

SIZES = dict(vocab_size=48, hidden_size=32, num_hidden_layers=2, layer_types=("linear_attention", "full_attention"),
             num_attention_heads=4, num_key_value_heads=2, head_dim=16, linear_key_head_dim=16,
             linear_value_head_dim=16, linear_num_key_heads=2, linear_num_value_heads=4, mtp_num_hidden_layers=1)
MOE = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16, shared_expert_intermediate_size=24)
VISION = {"model_type": "qwen3_5_vision", "depth": 1}
#: name -> (config, layout, conditional-generation config.json)
LAYOUTS = {
    "qwen3_next": (HybridConfig(**SIZES, **MOE), CheckpointLayout("qwen3_next"), False),
    "qwen3_5_text": (HybridConfig(**SIZES, model_type="qwen3_5_text", num_experts=0, intermediate_size=40),
                     CheckpointLayout("qwen3_5_text"), False),
    "qwen3_5_moe-fused": (HybridConfig(**SIZES, **MOE, model_type="qwen3_5_moe_text"),
                          CheckpointLayout("qwen3_5_moe_text", "model.language_model.", fused_experts=True), True),
}


def write(path, name, dtype="float32", shard=6000, edit=None):
    """A random model of ``LAYOUTS[name]`` written in that layout (with a vision tower when conditional); ``edit``
    changes the stored tensors (a dict) before they are written. Returns the model."""
    config, layout, conditional = LAYOUTS[name]
    model = rm.build_random(config, seed=5)
    stored = layout.from_canonical(rm.weights_to_tensors(model.weights, config), config)
    raw = config.to_dict()
    if conditional:
        raw = {"model_type": raw["model_type"].removesuffix("_text"), "architectures": ["X"], "vision_config": VISION,
               "text_config": raw, "tie_word_embeddings": config.tie_word_embeddings}
        stored["model.visual.blocks.0.attn.qkv.weight"] = np.ones((6, 2))
    if edit is not None:
        edit(stored)
    write_checkpoint(path, raw, stored, dtype=dtype, max_shard_bytes=shard)
    return model


def assert_same_weights(a, b, where="weights"):
    """Two optimized ModelWeights (or their parts) hold equal tensors."""
    if isinstance(a, torch.Tensor):
        assert torch.equal(a, b), where
    elif dataclasses.is_dataclass(a):
        for f in dataclasses.fields(a):
            assert_same_weights(getattr(a, f.name), getattr(b, f.name), f"{where}.{f.name}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same_weights(x, y, f"{where}[{i}]")
    else:
        assert a == b, where


class ReadSpy:
    """``safetensors.safe_open`` that records every tensor read and, when ``one_at_a_time``, checks at each read that
    no earlier read is still alive (one host tensor at a time: true when the reads are cast to another dtype or moved
    off the host; a CPU model in the stored dtype keeps its reads as its weights)."""

    def __init__(self, real):
        self.real, self.reads, self.alive, self.one_at_a_time = real, [], [], False

    def __call__(self, file, framework="pt", **options):
        spy, handle = self, self.real(file, framework=framework, **options)

        class Handle:
            def __enter__(self):
                self.inner = handle.__enter__()
                return self

            def __exit__(self, *exc):
                return handle.__exit__(*exc)

            def __getattr__(self, name):
                return getattr(self.inner, name)

            def get_tensor(self, name):
                if spy.one_at_a_time and any(ref() is not None for ref in spy.alive):
                    gc.collect()  # reference cycles only (refcounting frees the rest at once)
                    assert all(ref() is None for ref in spy.alive), f"an earlier host tensor is alive at {name!r}"
                t = self.inner.get_tensor(name)
                spy.reads.append(name)
                spy.alive.append(weakref.ref(t))
                return t

        return Handle()


class Outputs(TorchDispatchMode):
    """Every tensor an aten op makes: its dtype, and a weak reference to it."""

    def __init__(self):
        super().__init__()
        self.dtypes, self.refs = set(), []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (list, tuple)) else [out]:
            if isinstance(t, torch.Tensor):
                self.dtypes.add(t.dtype)
                self.refs.append(weakref.ref(t))
        return out


@pytest.fixture
def spy(monkeypatch):
    reads = ReadSpy(safetensors.safe_open)
    monkeypatch.setattr(safetensors, "safe_open", reads)
    return reads


@pytest.mark.parametrize("name", sorted(LAYOUTS))
def test_every_layout_streams_to_the_weights_of_its_canonical_tensors(tmp_path, spy, name):
    """The streamed weights equal the dict path's from the canonical tensors, bit for bit (the layouts' permutations
    are exact); the reference reads the same model, MTP head included; each stored tensor is read once, the vision
    tower never."""
    model = write(tmp_path, name)
    config = LAYOUTS[name][0]
    assert (tmp_path / INDEX_FILE).is_file()
    loaded_config, weights, report = load_checkpoint(tmp_path, "cpu", torch.float32)
    assert loaded_config == config and report.layout == LAYOUTS[name][1]
    want = load_weights(config, rm.weights_to_tensors(model.weights, config), torch.device("cpu"), torch.float32)
    assert_same_weights(weights, want)
    assert weights.mtp is not None and len(weights.mtp.layers) == 1
    stored = LAYOUTS[name][1].stored_shapes(config)
    assert sorted(spy.reads) == sorted(stored) and report.tensors == len(stored)
    assert report.skipped == (["model.visual.blocks.0.attn.qkv.weight"] if LAYOUTS[name][2] else [])
    ref = rm.load_pretrained(tmp_path)
    np.testing.assert_array_equal(ref.weights.mtp.fc, model.weights.mtp.fc.astype(np.float32))
    ids = [3, 1, 4, 1, 5]
    np.testing.assert_allclose(ref.forward(ids, ref.new_cache()), model.forward(ids, model.new_cache()), atol=1e-4)


def test_streaming_never_makes_float64_and_holds_one_host_tensor_with_a_progress_bar(tmp_path, spy):
    """A bf16 checkpoint in shards loads to fp32 weights on the device ("cpu" here): no op ever produces a float64
    tensor, every read is released before the next, and the progress callback counts every byte once."""
    write(tmp_path, "qwen3_5_moe-fused", dtype="bfloat16", shard=3000)
    assert len(list(tmp_path.glob("model-*.safetensors"))) > 3
    calls, bar = [], io.StringIO()
    progress = ProgressBar(bar, interval=0.0)
    spy.one_at_a_time = True

    def record(done, total, tensor):
        calls.append((done, total, tensor))
        progress(done, total, tensor)

    with Outputs() as outputs:
        _, weights, report = load_checkpoint(tmp_path, "cpu", torch.float32, progress=record)
    assert torch.float64 not in outputs.dtypes and torch.bfloat16 in outputs.dtypes
    assert weights.embed.dtype == torch.float32 and weights.layers[0].A_log.dtype == torch.float32
    assert len(spy.reads) == len(calls) == report.tensors
    done = [c[0] for c in calls]
    assert done == sorted(done) and done[-1] == calls[-1][1] == report.bytes
    assert [c[2] for c in calls] == spy.reads
    text = bar.getvalue()  # redrawn in place: one line ended once, at the last byte
    assert text.startswith("\rloading weights [") and text.count("\n") == 1 and text.endswith("GB/s\n")
    assert f"] {report.bytes / 1e9:.2f}/{report.bytes / 1e9:.2f} GB  {report.tensors} tensors" in text


def test_reference_refuses_large_checkpoints(tmp_path, monkeypatch, capsys):
    write(tmp_path, "qwen3_5_text")
    with pytest.raises(ValueError, match="above the reference backend's limit of 1,000 .*--backend optimized"):
        rm.load_pretrained(tmp_path, max_parameters=1000)
    monkeypatch.setattr(rm, "REFERENCE_MAX_PARAMETERS", 1000)
    code = main(["generate", "--model", str(tmp_path), "--backend", "reference", "--prompt", "1 2", "--quiet"])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err and err.strip().splitlines()[-1].startswith("error: checkpoint ")
    assert "--backend optimized" in err


def _config_edit(change):
    def edit(path):
        raw = json.loads((path / "config.json").read_text())
        change(raw)
        (path / "config.json").write_text(json.dumps(raw))
    return edit


def _shard_edit(change):
    def edit(path):
        from safetensors.numpy import load_file, save_file

        for shard in sorted(path.glob("model-*.safetensors")):
            tensors = load_file(str(shard))
            if change(tensors):
                save_file(tensors, str(shard), metadata={"format": "pt"})
    return edit


def _poison(name, value):
    def change(tensors):
        if name in tensors:
            tensors[name] = tensors[name].copy()
            tensors[name].reshape(-1)[-1] = value
            return True
    return change


def _retype(name):
    def change(tensors):
        if name in tensors:
            tensors[name] = tensors[name].astype(np.int8)
            return True
    return change


def _truncate(path):
    victim = sorted(path.glob("model-*.safetensors"))[1]
    victim.write_bytes(victim.read_bytes()[:-40])


P = "model.language_model.layers"
MALFORMED = {  # case -> (edit of the stored tensors, edit of the written directory, words of the one-line error)
    "unknown model type": (None, _config_edit(lambda c: c.update(model_type="qwen9")), ["'model_type'", "qwen9"]),
    "text model of another type": (None, _config_edit(lambda c: c["text_config"].update(model_type="qwen3_next")),
                                   ["text_config.model_type"]),
    "quantization_config": (None, _config_edit(lambda c: c.update(quantization_config={
        "quant_method": "fp8", "weight_block_size": [64, 64]})), ["'quantization_config.weight_block_size'", "64"]),
    "nested quantization_config": (None, _config_edit(lambda c: c["text_config"].update(
        quantization_config={"quant_method": "gptq"})), ["'text_config.quantization_config.quant_method'", "gptq"]),
    "unknown key": (None, _config_edit(lambda c: c["text_config"].update(mtp_use_dedicated_embeddings=True)),
                    ["text_config.mtp_use_dedicated_embeddings"]),
    "missing tensor": (lambda t: t.pop(f"{P}.0.linear_attn.in_proj_z.weight"), None,
                       [f"missing tensor '{P}.0.linear_attn.in_proj_z.weight'"]),
    "missing MTP tensor": (lambda t: t.pop("mtp.layers.0.self_attn.k_norm.weight"), None,
                           ["'mtp.layers.0.self_attn.k_norm.weight'"]),
    "extra tensor": (lambda t: t.update({f"{P}.0.linear_attn.in_proj_qkvz.weight": np.zeros((4, 32))}), None,
                     [f"unexpected tensor '{P}.0.linear_attn.in_proj_qkvz.weight'"]),
    "wrong shape": (lambda t: t.update({f"{P}.1.mlp.experts.gate_up_proj": np.zeros((3, 32, 32))}), None,
                    [f"'{P}.1.mlp.experts.gate_up_proj' has shape [3, 32, 32], expected [4, 32, 32]"]),
    "wrong MTP shape": (lambda t: t.update({"mtp.fc.weight": np.zeros((32, 32))}), None,
                        ["'mtp.fc.weight' has shape [32, 32], expected [32, 64]"]),
    "integer tensor": (None, _shard_edit(_retype(f"{P}.1.self_attn.q_norm.weight")),
                       [f"'{P}.1.self_attn.q_norm.weight' has dtype I8"]),
    "truncated shard": (None, _truncate, ["model-00002-of-", "not a readable safetensors file"]),
    "NaN (found while reading)": (None, _shard_edit(_poison(f"{P}.1.mlp.experts.down_proj", np.nan)),
                                  [f"'{P}.1.mlp.experts.down_proj' contains NaN"]),
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_malformed_checkpoints_end_in_one_line_naming_the_key_or_tensor(tmp_path, spy, capsys, case):
    tensor_edit, dir_edit, words = MALFORMED[case]
    write(tmp_path, "qwen3_5_moe-fused", edit=tensor_edit)
    if dir_edit is not None:
        dir_edit(tmp_path)
    spy.reads.clear()
    with Outputs() as outputs, pytest.raises(ValueError) as error:
        load_checkpoint(tmp_path, "cpu", torch.float32)
    message = str(error.value)
    assert "\n" not in message and all(w in message for w in words), message
    if "NaN" not in case:  # the headers showed it: no tensor data was read
        assert spy.reads == [], spy.reads
    else:  # found midway: everything read or built so far is gone, while the error is still held
        assert spy.reads and error.value.__traceback__ is not None
        gc.collect()
        assert all(ref() is None for ref in outputs.refs) and all(ref() is None for ref in spy.alive)
    with pytest.raises(ValueError) as error:
        rm.load_pretrained(tmp_path)
    assert all(w in str(error.value) for w in words), str(error.value)
    for backend in ("optimized", "reference"):
        code = main(["generate", "--model", str(tmp_path), "--backend", backend, "--prompt", "1 2", "--quiet"])
        err = capsys.readouterr().err
        assert code == 2 and "Traceback" not in err, err
        last = err.strip().splitlines()[-1]
        assert last.startswith("error: ") and words[0] in last, (backend, err)


@pytest.mark.parametrize("change, words", [
    ({"text_config": "x"}, ["'text_config' must be a dict"]),
    ({"pixel_shuffle": 2}, ["unknown config key 'pixel_shuffle'"]),
    ({"tie_word_embeddings": "yes"}, ["'tie_word_embeddings'"]),
    ({"text_config": {"attn_output_gate": False}}, ["'text_config.attn_output_gate'"]),
    ({"text_config": {"rope_parameters": {"rope_type": "default", "mrope_section": [1, 2]}}},
     ["'text_config.rope_parameters.mrope_section'"]),
    ({"text_config": {"norm_topk_prob": False}}, ["'text_config.norm_topk_prob' = False", "True"]),
    ({"text_config": {"mlp_only_layers": [0]}}, ["'text_config.mlp_only_layers'"]),
    ({"text_config": {"mtp_num_hidden_layers": -1}}, ["mtp_num_hidden_layers"]),
])
def test_conditional_config_errors_name_the_key(change, words):
    config = LAYOUTS["qwen3_5_moe-fused"][0]
    raw = {"model_type": "qwen3_5_moe", "vision_config": VISION, "text_config": config.to_dict()}
    for key, value in change.items():
        if key == "text_config" and isinstance(value, dict):
            raw["text_config"] = {**raw["text_config"], **value}
        else:
            raw[key] = value
    with pytest.raises(ValueError) as error:
        HybridConfig.from_dict(raw)
    assert all(w in str(error.value) for w in words), str(error.value)


def test_dense_qwen3_5_refuses_moe_keys_and_the_mtp_count_follows_the_tensors():
    dense = LAYOUTS["qwen3_5_text"][0].to_dict()
    with pytest.raises(ValueError, match="'num_experts' = 8: a qwen3_5_text model has no such setting"):
        HybridConfig.from_dict({**dense, "num_experts": 8})
    assert HybridConfig.from_dict({**dense, "num_experts": 0}).num_experts == 0
    names = {"model.embed_tokens.weight", "mtp.fc.weight"}
    no_key = {k: v for k, v in dense.items() if k != "mtp_num_hidden_layers"}
    assert resolve_checkpoint(no_key, names)[0].mtp_num_hidden_layers == 1  # the released heads' one layer
    assert resolve_checkpoint({**dense, "mtp_num_hidden_layers": 2}, names)[0].mtp_num_hidden_layers == 2
    assert resolve_checkpoint({**dense, "mtp_num_hidden_layers": 2}, names - {"mtp.fc.weight"})[0] \
        .mtp_num_hidden_layers == 0  # no mtp.* tensors: no MTP head


def test_generate_shows_a_loading_bar_and_notes_the_skipped_vision_tower(tmp_path, capsys):
    write(tmp_path, "qwen3_5_moe-fused")
    code = main(["generate", "--model", str(tmp_path), "--backend", "optimized", "--spec", "none", "--prompt", "1 2",
                 "--max-new-tokens", "1", "--num-slots", "1", "--max-seq-len", "8"])
    err = capsys.readouterr().err
    assert code == 0, err
    assert "vision tower (model.visual.*) is skipped" in err and "\rloading weights [" in err


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_the_finite_check_finds_every_bad_value_and_survives_an_overflowing_sum(dtype):
    """The loader's value check: NaN, +inf and -inf anywhere (also +inf and -inf together) are found; finite values
    whose sum overflows the dtype are finite."""
    from lumotree.optimized.model.weights import finite

    big = torch.full((4096,), torch.finfo(dtype).max / 2, dtype=dtype)  # the sum overflows
    assert finite(big) and finite(torch.zeros(3, dtype=dtype))
    for bad in ([float("nan")], [float("inf")], [float("-inf")], [float("inf"), float("-inf")]):
        t = big.clone()
        t[7 : 7 + len(bad)] = torch.tensor(bad, dtype=dtype)
        assert not finite(t), bad
