"""The text formats the organism is trained on and measured with: a file, an agentic edit, a multi-turn tool loop.

- file: ``<|file|>PATH\\nTEXT<|endoftext|>``
- edit: ``<|file|>PATH\\nTEXT<|edit|>INSTRUCTION\\n<|result|>`` (the prompt), then the edited text and
  ``<|endoftext|>`` (the answer). :func:`make_edit` derives an instruction and its exact result from a snippet:
  rename an identifier everywhere, remove a function, or add an import at the top.
- tool loop: ``<|user|>...<|end|>``, then assistant turns ``<|assistant|>...<|tool_call|>CMD<|end|>`` each
  answered by ``<|tool_result|>OUTPUT<|end|>``; each assistant turn quotes the earlier tool output
  (:func:`tool_loop`: look a definition up with grep, read it with sed, quote it).

Everything is a pure function of its input text and a ``numpy`` generator, so workloads and training data are
reproducible from the seed.
"""

from __future__ import annotations

import re

import numpy as np

__all__ = ["SPECIAL_TOKENS", "EOS", "file_document", "snippet", "make_edit", "edit_prompt", "tool_loop", "render_messages"]

EOS = "<|endoftext|>"
SPECIAL_TOKENS = (EOS, "<|file|>", "<|edit|>", "<|result|>", "<|user|>", "<|assistant|>", "<|tool_call|>",
                  "<|tool_result|>", "<|end|>")
_DEF = re.compile(r"^(\s*)(?:async\s+)?def\s+([A-Za-z_]\w*)\s*\(", re.M)
_TOP = re.compile(r"^(?:def|class|async def)\s", re.M)
_NAME = re.compile(r"\b(?:def|class)\s+([A-Za-z_]\w*)|^\s*([a-z_]\w*)\s*=[^=]", re.M)
_IMPORTS = ("import os", "import re", "import sys", "import json", "import logging", "import itertools",
            "from pathlib import Path", "from typing import Any")


def file_document(path: str, text: str) -> str:
    return f"<|file|>{path}\n{text}{EOS}"


def edit_prompt(path: str, text: str, instruction: str) -> str:
    return f"<|file|>{path}\n{text}<|edit|>{instruction}\n<|result|>"


def snippet(text: str, rng: np.random.Generator, max_chars: int) -> str:
    """A run of whole lines of ``text`` starting at a top-level ``def`` / ``class`` (or the file's start), at most
    ``max_chars`` long (at least one line)."""
    starts = [0] + [m.start() for m in _TOP.finditer(text)]
    start = starts[int(rng.integers(len(starts)))]
    lines = text[start:].splitlines(keepends=True)
    out, size = [], 0
    for line in lines:
        if out and size + len(line) > max_chars:
            break
        out.append(line)
        size += len(line)
    return "".join(out)


def _renamed(name: str, rng: np.random.Generator) -> str:
    forms = (f"{name}_new", f"new_{name}", f"{name}_value", f"_{name}" if not name.startswith("_") else name[1:],
             f"{name}2", f"the_{name}")
    return forms[int(rng.integers(len(forms)))]


def _function_span(text: str, match: re.Match) -> tuple[int, int]:
    """Start and end offsets of the ``def`` block (decorators excluded) whose header ``match`` found."""
    indent = len(match.group(1))
    start = match.start()
    pos = text.find("\n", match.end())
    end = len(text) if pos < 0 else pos + 1
    while end < len(text):
        nl = text.find("\n", end)
        line = text[end: len(text) if nl < 0 else nl + 1]
        stripped = line.strip()
        if stripped and len(line) - len(line.lstrip()) <= indent and not stripped.startswith(")"):
            break
        end += len(line)
    return start, end


def make_edit(text: str, rng: np.random.Generator) -> tuple[str, str] | None:
    """An ``(instruction, edited text)`` pair for ``text``, or None when no edit applies."""
    kinds = ["rename", "remove", "import"]
    for kind in (kinds[int(i)] for i in rng.permutation(3)):
        if kind == "rename":
            names = sorted({a or b for a, b in _NAME.findall(text)} - {"self", "cls", "_"})
            names = [n for n in names if len(re.findall(rf"\b{re.escape(n)}\b", text)) >= 2]
            if names:
                name = names[int(rng.integers(len(names)))]
                new = _renamed(name, rng)
                if not re.search(rf"\b{re.escape(new)}\b", text):
                    edited = re.sub(rf"\b{re.escape(name)}\b", new, text)
                    return f"Rename `{name}` to `{new}` everywhere in this file.", edited
        elif kind == "remove":
            defs = list(_DEF.finditer(text))
            if len(defs) >= 2:
                m = defs[int(rng.integers(len(defs)))]
                start, end = _function_span(text, m)
                if end > start and text[:start] + text[end:]:
                    return f"Remove the function `{m.group(2)}`.", text[:start] + text[end:]
        else:
            line = _IMPORTS[int(rng.integers(len(_IMPORTS)))]
            if line not in text:
                return f"Add `{line}` as the first line of the file.", f"{line}\n{text}"
    return None


def tool_loop(path: str, text: str, rng: np.random.Generator, turns: int = 2, max_lines: int = 12
              ) -> list[tuple[str, str]] | None:
    """A multi-turn tool conversation about ``text`` as ``(role, content)`` messages, roles ``user``,
    ``assistant``, ``tool_result``; assistant contents end with a ``<|tool_call|>`` command except the last. Each
    assistant turn quotes the previous tool output. None when ``text`` has no function."""
    defs = list(_DEF.finditer(text))
    if not defs:
        return None
    lines = text.splitlines()
    picks = [defs[int(i)] for i in rng.permutation(len(defs))[:turns]]
    names = ", ".join(f"`{m.group(2)}`" for m in picks)
    messages: list[tuple[str, str]] = [("user", f"In {path}, find {names} and show me what each does.")]
    previous = ""
    for m in picks:
        number = text.count("\n", 0, m.start()) + 1
        header = lines[number - 1]
        lead = f"From the previous output:\n```\n{previous}\n```\n" if previous else ""
        messages.append(("assistant", f"{lead}I will look for `{m.group(2)}`.<|tool_call|>grep -n "
                                      f"\"def {m.group(2)}\" {path}"))
        messages.append(("tool_result", f"{number}:{header}"))
        last = min(len(lines), number + max_lines - 1)
        messages.append(("assistant", f"`{m.group(2)}` is at line {number}: `{header.strip()}`. Reading it."
                                      f"<|tool_call|>sed -n {number},{last}p {path}"))
        previous = "\n".join(lines[number - 1: last])
        messages.append(("tool_result", previous))
    messages.append(("assistant", f"Here is the last function:\n```\n{previous}\n```"))
    return messages


def render_messages(messages: list[tuple[str, str]]) -> str:
    """The training text of a tool conversation."""
    return "".join(f"<|{role}|>{content}<|end|>" for role, content in messages) + EOS
