"""Build, write and load the workloads: prompts and their reference continuations from held-out corpus files.

- ``completion``: a file's first lines in the file format (``<|file|>PATH\\n`` + prefix, cut at a line boundary
  between 30 % and 70 % of the file); the reference is the next lines (up to ``reference_chars``).
- ``edit``: a snippet of a file and an edit instruction in the edit format; the reference is the edited snippet and
  ``<|endoftext|>`` (the organism is trained on this format from training files).
- ``tool_loop``: a multi-turn tool conversation whose assistant turns quote earlier tool output; the prompt is the
  conversation up to the last assistant turn, the reference that turn; ``meta["messages"]`` holds every turn.

The formats are :mod:`lumotree.training.formats`'. Items are a pure function of the files, the workload's name and
the seed: the same held-out files give the same JSONL bytes. :func:`load_workload` reads one file back (a bad line
raises naming the file and line).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from ..training.corpus import CorpusFile
from ..training.formats import EOS, edit_prompt, make_edit, snippet, tool_loop

__all__ = ["WORKLOADS", "Item", "build_workload", "write_workloads", "load_workload"]

WORKLOADS = ("completion", "edit", "tool_loop")


@dataclass(frozen=True)
class Item:
    """One request: ``prompt`` (text), the ``reference`` continuation, the held-out ``source`` file."""

    workload: str
    id: str
    source: str
    prompt: str
    reference: str
    meta: dict = field(default_factory=dict)

    def prompt_ids(self, tokenizer) -> list[int]:
        """The prompt's token ids (a ``tokenizers.Tokenizer`` or a transformers tokenizer)."""
        encoded = tokenizer.encode(self.prompt, add_special_tokens=False)
        return list(encoded.ids if hasattr(encoded, "ids") else encoded)


def _completion(f: CorpusFile, rng: np.random.Generator, prompt_chars: int, reference_chars: int) -> tuple | None:
    lines = f.text.splitlines(keepends=True)
    if len(lines) < 20:
        return None
    cut = int(rng.integers(int(0.3 * len(lines)), int(0.7 * len(lines))))
    prefix = "".join(lines[:cut])[-prompt_chars:]
    prefix = prefix[prefix.find("\n") + 1:] if len(prefix) == prompt_chars else prefix  # whole lines only
    reference = ""
    for line in lines[cut:]:
        if reference and len(reference) + len(line) > reference_chars:
            break
        reference += line
    if not reference.strip():
        return None
    return f"<|file|>{f.name}\n{prefix}", reference, {"line": cut + 1}


def _edit(f: CorpusFile, rng: np.random.Generator, prompt_chars: int) -> tuple | None:
    piece = snippet(f.text, rng, prompt_chars)
    edit = make_edit(piece, rng)
    if edit is None or edit[1] == piece:
        return None
    return edit_prompt(f.name, piece, edit[0]), edit[1] + EOS, {"instruction": edit[0]}


def _tool_loop(f: CorpusFile, rng: np.random.Generator) -> tuple | None:
    messages = tool_loop(f.name, f.text, rng)
    if messages is None:
        return None
    history = "".join(f"<|{role}|>{content}<|end|>" for role, content in messages[:-1])
    return history + "<|assistant|>", messages[-1][1] + "<|end|>", {"messages": [list(m) for m in messages]}


def build_workload(name: str, files: Sequence[CorpusFile], n: int, seed: int = 0, prompt_chars: int = 1500,
                   reference_chars: int = 600) -> list[Item]:
    """Up to ``n`` items of workload ``name`` from the Python files of ``files`` (each file used once)."""
    if name not in WORKLOADS:
        raise ValueError(f"workload = {name!r} is not one of {WORKLOADS}")
    if not isinstance(n, int) or n < 1:
        raise ValueError(f"n = {n!r} must be a positive integer")
    python = sorted((f for f in files if f.name.endswith(".py")), key=lambda f: f.name)
    rng = np.random.default_rng([seed, WORKLOADS.index(name)])
    items = []
    for index in rng.permutation(len(python)):
        f = python[int(index)]
        if name == "completion":
            made = _completion(f, rng, prompt_chars, reference_chars)
        elif name == "edit":
            made = _edit(f, rng, prompt_chars)
        else:
            made = _tool_loop(f, rng)
        if made is None:
            continue
        prompt, reference, meta = made
        items.append(Item(name, f"{name}-{len(items):04d}", f.name, prompt, reference, meta))
        if len(items) == n:
            break
    return items


def write_workloads(out_dir: str | Path, files: Sequence[CorpusFile], n: int, seed: int = 0) -> dict[str, str]:
    """Write ``{name}.jsonl`` for every workload into ``out_dir``; returns name -> sha256 of the file."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    digests = {}
    for name in WORKLOADS:
        text = "".join(json.dumps(asdict(item), ensure_ascii=False) + "\n"
                       for item in build_workload(name, files, n, seed))
        (out / f"{name}.jsonl").write_text(text, encoding="utf-8")
        digests[name] = hashlib.sha256(text.encode("utf-8")).hexdigest()
    return digests


def load_workload(path: str | Path, name: str | None = None) -> list[Item]:
    """The items of a workload file, or of ``name`` (:data:`WORKLOADS`) in the directory ``path``."""
    path = Path(path)
    if name is not None:
        if name not in WORKLOADS:
            raise ValueError(f"name = {name!r} is not one of {WORKLOADS}")
        path = path / f"{name}.jsonl"
    if not path.is_file():
        raise FileNotFoundError(f"path = {str(path)!r} is not a workload file")
    items = []
    keys = {f for f in Item.__dataclass_fields__}
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}:{number}: not JSON ({exc.msg})") from None
        if not isinstance(row, dict) or set(row) != keys:
            raise ValueError(f"{path}:{number}: expected the keys {sorted(keys)}")
        if row["workload"] not in WORKLOADS or not all(isinstance(row[k], str) for k in keys - {"meta"}):
            raise ValueError(f"{path}:{number}: workload must be one of {WORKLOADS} and text fields strings")
        items.append(Item(**row))
    return items
