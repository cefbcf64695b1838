"""The command line end to end (in process, ``lumotree.cli.main``): ``lumotree generate`` on tiny models (prompts,
batch files, ``--json``) and every error a user can cause, each one line ``error: ...`` with exit code 2 and no
traceback; ``lumotree bench e2e``'s argument errors."""

from __future__ import annotations

import json

import numpy as np
import pytest

from lumotree.cli import main
from lumotree.reference.config import HybridConfig
from lumotree.reference.model import build_random, save_pretrained

TINY = ["--random", "tiny", "--backend", "reference", "--max-new-tokens", "4", "--quiet", "--spec", "none"]


def run(capsys, *argv: str) -> tuple[int, str, str]:
    try:
        code = main(list(argv))
    except SystemExit as exc:  # argparse's own errors
        code = exc.code
    out = capsys.readouterr()
    return code, out.out, out.err


def assert_usage_error(code: int, err: str, *words: str) -> None:
    """Exit code 2 and stderr's last line one ``error: ...`` naming ``words``, no traceback."""
    assert code == 2, err
    assert "Traceback" not in err
    last = err.strip().splitlines()[-1]
    assert last.startswith("error: "), err
    for word in words:
        assert word in last, (word, last)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """A tiny Qwen3-Next checkpoint directory (no tokenizer: prompts are ids)."""
    config = HybridConfig(vocab_size=32, hidden_size=16, intermediate_size=24, num_hidden_layers=2,
                          num_attention_heads=2, num_key_value_heads=1, head_dim=8, linear_key_head_dim=8,
                          linear_value_head_dim=8, linear_num_key_heads=1, linear_num_value_heads=2, num_experts=0)
    path = tmp_path_factory.mktemp("ckpt")
    save_pretrained(build_random(config, seed=3), path, dtype="float32")
    return path


def test_generate_decodes_ids_and_writes_json(capsys, tmp_path):
    out_json = tmp_path / "out.json"
    code, out, err = run(capsys, "generate", *TINY, "--prompt", "1 2 3", "--json", str(out_json))
    assert code == 0, err
    tokens = json.loads(out_json.read_text())["results"][0]["tokens"]
    assert len(tokens) == 4 and " ".join(map(str, tokens)) in out


def test_generate_runs_a_checkpoint_with_tree_speculation_and_a_batch_file(capsys, tmp_path, checkpoint):
    batch = tmp_path / "prompts.jsonl"
    batch.write_text('{"prompt": [1, 2, 3], "max_new_tokens": 3}\n4 5 6 4 5\n\n{"prompt": "7 8", "seed": 2}\n')
    code, out, err = run(capsys, "generate", "--model", str(checkpoint), "--backend", "reference", "--quiet",
                         "--batch-file", str(batch), "--max-new-tokens", "5", "--budget", "fixed", "--max-nodes", "4")
    assert code == 0, err
    assert len([line for line in out.splitlines() if line.startswith("[")]) == 3


def test_generate_with_a_prefix_cache_gives_the_same_tokens(capsys, tmp_path):
    """A batch whose second prompt extends the first: with --prefix-cache it restores the first prompt's block-grid
    snapshot and prints the tokens of the run without the cache."""
    batch = tmp_path / "prompts.txt"
    batch.write_text("1 2 3 4 5 6 7 8 9 10\n1 2 3 4 5 6 7 8 9 10 11 12\n")
    results = []
    for options in ([], ["--prefix-cache", "16", "--prefix-block", "4"]):
        out_json = tmp_path / "out.json"
        code, _, err = run(capsys, "generate", *TINY, "--batch-file", str(batch), "--num-slots", "1", "--json",
                           str(out_json), *options)
        assert code == 0, err
        results.append([r["tokens"] for r in json.loads(out_json.read_text())["results"]])
    assert results[0] == results[1]


@pytest.mark.parametrize("argv,words", [
    (["--num-slots", "0"], ["--num-slots"]),
    (["--seed", "-1"], ["--seed"]),
    (["--top-p", "1.5"], ["--top-p"]),
    (["--top-p", "0"], ["--top-p"]),
    (["--max-new-tokens", "-3"], ["--max-new-tokens"]),
    (["--temperature", "nan"], ["--temperature"]),
    (["--max-nodes", "500"], ["--max-nodes"]),
    (["--drafter", "draft-model", "--draft-layers", "x,1"], ["--draft-layers"]),
    (["--drafter", "draft-model", "--draft-layers", "0,9"], ["--draft-layers"]),
    (["--drafter", "synthetic", "--spec", "tree"], ["synthetic"]),
    (["--json", "/no/such/folder/out.json"], ["--json"]),
    (["--save-profile", "/no/such/folder/p.json"], ["--save-profile"]),
    (["--profile", "/no/such/profile.json"], ["--profile"]),
    (["--prompt", "1 999"], ["999", "vocabulary"]),
    (["--prompt", ""], ["empty"]),
    (["--prompt", "one two"], ["token ids"]),
    (["--prompt", "1 2 3 4 5", "--max-seq-len", "4"], ["--max-seq-len"]),
    (["--prefix-cache", "lots"], ["--prefix-cache", "not a size"]),
    (["--prefix-cache", "16", "--prefix-block", "0"], ["--prefix-block"]),
])
def test_generate_option_errors(capsys, argv, words):
    argv = argv if any(a == "--prompt" for a in argv) else [*argv, "--prompt", "1 2"]
    code, _, err = run(capsys, "generate", *[a for a in TINY if a not in ("--spec", "none")], *argv)
    assert_usage_error(code, err, *words)


@pytest.mark.parametrize("line,words", [
    ('{"prompt": [1.5, 2]}', ["prompts.jsonl:1", "integers"]),
    ('{"prompt": [true, false]}', ["prompts.jsonl:1", "integers"]),
    ('{"prompt": 42}', ["prompts.jsonl:1", "string or a list"]),
    ('{"prompt": [1, 2], "temperatur": 0.5}', ["prompts.jsonl:1", "temperatur"]),
    ('{"prompt": [1, 2]', ["prompts.jsonl:1", "JSON"]),
    ('{"max_new_tokens": 3}', ["prompts.jsonl:1", "prompt"]),
    ('{"prompt": [1, 2], "max_new_tokens": -1}', ["max_new_tokens"]),
    ('{"prompt": [1, 2], "top_p": 2}', ["top_p"]),
])
def test_batch_file_errors_name_file_and_line(capsys, tmp_path, line, words):
    batch = tmp_path / "prompts.jsonl"
    batch.write_text(line + "\n")
    code, _, err = run(capsys, "generate", *TINY, "--batch-file", str(batch))
    assert_usage_error(code, err, *words)


def test_checkpoint_errors_name_the_file_or_tensor(capsys, tmp_path, checkpoint):
    import shutil

    def copy(name: str):
        target = tmp_path / name
        shutil.copytree(checkpoint, target)
        return target

    bad = copy("bad_json")
    (bad / "config.json").write_text('{"vocab_size": 32,\n  "hidden_size": }\n')
    assert_usage_error(*run(capsys, "generate", "--model", str(bad), "--prompt", "1 2")[::2], "config.json:2")
    empty = copy("empty")
    (empty / "config.json").write_text("")
    assert_usage_error(*run(capsys, "generate", "--model", str(empty), "--prompt", "1 2")[::2], "empty")
    other = copy("llama")
    cfg = json.loads((other / "config.json").read_text())
    (other / "config.json").write_text(json.dumps({**cfg, "model_type": "llama", "rope_scaling": None}))
    assert_usage_error(*run(capsys, "generate", "--model", str(other), "--prompt", "1 2")[::2], "llama", "qwen3_next")
    truncated = copy("truncated")
    data = (truncated / "model.safetensors").read_bytes()
    (truncated / "model.safetensors").write_bytes(data[: len(data) // 2])
    assert_usage_error(*run(capsys, "generate", "--model", str(truncated), "--prompt", "1 2")[::2],
                       "model.safetensors")
    missing = copy("missing")
    from safetensors.numpy import load_file, save_file

    tensors = load_file(str(missing / "model.safetensors"))
    del tensors["model.norm.weight"]
    save_file(tensors, str(missing / "model.safetensors"))
    assert_usage_error(*run(capsys, "generate", "--model", str(missing), "--prompt", "1 2")[::2], "model.norm.weight")
    nan = copy("nan")
    tensors = load_file(str(nan / "model.safetensors"))
    tensors["model.norm.weight"] = np.full_like(tensors["model.norm.weight"], np.nan)
    save_file(tensors, str(nan / "model.safetensors"))
    assert_usage_error(*run(capsys, "generate", "--model", str(nan), "--prompt", "1 2")[::2], "model.norm.weight")
    assert_usage_error(*run(capsys, "generate", "--model", str(tmp_path / "nowhere"), "--prompt", "1 2")[::2],
                       "nowhere")


def test_profile_file_with_missing_fields_is_refused(capsys, tmp_path):
    profile = tmp_path / "profile.json"
    profile.write_text('{"batch_buckets": [1], "node_buckets": [1]}')
    code, _, err = run(capsys, "generate", *[a for a in TINY if a not in ("--spec", "none")], "--prompt", "1 2",
                       "--profile", str(profile))
    assert_usage_error(code, err, "--profile")


def test_debug_shows_the_traceback(capsys):
    with pytest.raises(ValueError, match="--top-p"):
        main(["--debug", "generate", *TINY, "--prompt", "1", "--top-p", "3"])


def test_optimized_backend_without_a_gpu_says_how_to_choose(monkeypatch):
    import argparse

    from lumotree import generate

    monkeypatch.setattr("torch.cuda.is_available", lambda: False)
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(ValueError, match="--backend reference.*TRITON_INTERPRET=1"):
        generate.choose_backend(argparse.Namespace(backend="optimized"))
    assert generate.choose_backend(argparse.Namespace(backend="auto")) == "reference"


@pytest.mark.parametrize("argv,words", [
    (["--batches", "0"], ["--batches"]),
    (["--acceptance", "2"], ["--acceptance"]),
    (["--sweep", "-4"], ["--sweep"]),
])
def test_bench_e2e_argument_errors(capsys, argv, words):
    code, _, err = run(capsys, "bench", "e2e", "--config", "tiny", *argv)
    assert_usage_error(code, err, *words)
