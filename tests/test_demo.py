"""``lumotree demo``: runs on the CPU in seconds, draws trees, accepts non-trivially, checks itself, explains itself."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from lumotree.cli import main
from lumotree.reference import demo
from lumotree.reference.speculate import DecodeResult


def test_default_demo_checks_out_and_accepts_drafts(capsys):
    assert main(["demo"]) == 0
    out = capsys.readouterr().out
    assert "(pending)" in out and "✓" in out  # trees drawn, accepted nodes marked
    assert "layer-skip self-speculation" in out and "random weights, not trained" in out  # honest about both models
    assert "token for token (32/32): OK" in out
    mean = float(re.search(r"mean accepted length ([0-9.]+)", out).group(1))
    assert mean >= 1.0  # measured 1.36 on the default seed: speculation really accepts draft tokens


@pytest.mark.parametrize(
    "options",
    [
        ["--drafter", "ngram", "--vocab-size", "16", "--new-tokens", "24"],
        ["--moe", "--layers", "4", "--draft-layers", "0,3", "--tree-budget", "5", "--new-tokens", "10"],
    ],
)
def test_demo_options_greedy(capsys, options):
    assert main(["demo", "--show-trees", "1", *options]) == 0
    assert ": OK" in capsys.readouterr().out


def test_demo_sampling_mode(capsys):
    assert main(["demo", "--sampling", "without_replacement", "--temperature", "0.7", "--new-tokens", "10"]) == 0
    out = capsys.readouterr().out
    assert "sampled output" in out and "output (10 tokens)" in out


def test_demo_reports_a_mismatch_with_exit_code_1(capsys, monkeypatch):
    honest = demo.BACKENDS["reference"]

    def off_by_one(model, drafter, prompt, n, sampling, coins) -> DecodeResult:
        result = honest(model, drafter, prompt, n, sampling, coins)
        result.tokens[3] = (result.tokens[3] + 1) % model.vocab_size
        return result

    monkeypatch.setitem(demo.BACKENDS, "reference", off_by_one)
    assert main(["demo", "--new-tokens", "6", "--show-trees", "0"]) == 1
    out = capsys.readouterr().out
    assert "MISMATCH" in out and "at new token 3" in out


def test_demo_rejects_inconsistent_options(capsys):
    assert main(["demo", "--drafter", "ngram", "--sampling", "iid"]) == 2
    assert "proposes deterministically" in capsys.readouterr().out
    assert main(["demo", "--tree-budget", "0"]) == 2
    assert main(["demo", "--draft-layers", "0,x"]) == 2


def test_demo_help_explains_the_options(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["demo", "--help"])
    assert exit_info.value.code == 0
    text = capsys.readouterr().out
    for option in ("--seed", "--prompt-length", "--new-tokens", "--drafter", "--tree-budget", "--sampling",
                   "--temperature", "--draft-layers"):
        assert option in text


def test_console_entry_point_runs_the_demo():
    done = subprocess.run([sys.executable, "-m", "lumotree", "demo", "--new-tokens", "8", "--show-trees", "0"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "(8/8): OK" in done.stdout
