"""Workloads from held-out files: deterministic JSONL for a seed, the loader's round trip and its errors, and items
whose references are what their prompts ask for (the edit applied, the tool turn quoting earlier tool output)."""

from __future__ import annotations

import re
import sysconfig

import numpy as np
import pytest

from lumotree.training.corpus import Source, collect
from lumotree.training.formats import make_edit
from lumotree.workloads import WORKLOADS, build_workload, load_workload, write_workloads


@pytest.fixture(scope="module")
def files():
    stdlib = sysconfig.get_paths()["stdlib"]
    return collect([Source("json", f"{stdlib}/json"), Source("email", f"{stdlib}/email")])


def test_workloads_are_deterministic_and_round_trip(files, tmp_path):
    first = write_workloads(tmp_path / "a", files, n=6, seed=3)
    assert first == write_workloads(tmp_path / "b", files[::-1], n=6, seed=3)
    assert first != write_workloads(tmp_path / "c", files, n=6, seed=4)
    for name in WORKLOADS:
        items = load_workload(tmp_path / "a", name)
        assert len(items) == 6 and items == build_workload(name, files, 6, seed=3)
        assert len({i.source for i in items}) == 6 and all(i.workload == name for i in items)


def test_items_hold_what_their_prompts_ask(files):
    for item in build_workload("completion", files, 5):
        text = next(f.text for f in files if f.name == item.source)
        body = item.prompt.split("\n", 1)[1]
        assert body + item.reference in text and item.prompt.startswith(f"<|file|>{item.source}\n")
    for item in build_workload("edit", files, 8):
        assert item.prompt.endswith("\n<|result|>") and item.reference.endswith("<|endoftext|>")
        rename = re.match(r"Rename `(\w+)` to `(\w+)`", item.meta["instruction"])
        if rename:
            assert not re.search(rf"\b{rename[1]}\b", item.reference) and rename[2] in item.reference
    for item in build_workload("tool_loop", files, 4):
        messages = item.meta["messages"]
        assert messages[0][0] == "user" and messages[-1][0] == "assistant"
        for before, after in zip(messages, messages[1:]):
            if before[0] == "tool_result" and after[0] == "assistant" and "From the previous output" in after[1]:
                assert before[1] in after[1]  # the turn quotes the tool output before it
        assert messages[-2][1] in item.reference


def test_make_edit_applies_exactly():
    text = "def alpha(x):\n    return x + 1\n\n\ndef beta(y):\n    return alpha(y) * 2\n"
    seen = set()
    for seed in range(30):
        instruction, edited = make_edit(text, np.random.default_rng(seed))
        seen.add(instruction.split()[0])
        if instruction.startswith("Remove the function `alpha`"):
            assert edited == "def beta(y):\n    return alpha(y) * 2\n"
        if instruction.startswith("Add"):
            assert edited.endswith(text) and edited.count("\n") == text.count("\n") + 1
    assert seen == {"Rename", "Remove", "Add"}


def test_loader_errors_name_the_problem(tmp_path):
    with pytest.raises(ValueError, match="name"):
        load_workload(tmp_path, "chat")
    with pytest.raises(FileNotFoundError, match="path"):
        load_workload(tmp_path / "none.jsonl")
    bad = tmp_path / "edit.jsonl"
    bad.write_text('{"workload": "edit"}\n')
    with pytest.raises(ValueError, match=r"edit.jsonl:1: expected the keys"):
        load_workload(bad)
    bad.write_text("not json\n")
    with pytest.raises(ValueError, match=r":1: not JSON"):
        load_workload(bad)
    with pytest.raises(ValueError, match="workload"):
        build_workload("chat", [], 1)
