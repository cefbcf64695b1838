"""Training data: corpus files (plus agentic-edit and tool-loop examples made from them) tokenized into one stream,
and the batches cut from it.

The documents of a file list (:func:`documents`) are the files in the file format and, for a seeded share of the
Python files, an edit example and a tool conversation built from them (:mod:`~lumotree.training.formats`), shuffled
with the seed. :func:`encode` concatenates their token ids (``uint16`` when the vocabulary fits). The batch of step
``s`` (:func:`batch`) is ``B`` windows of ``T + 1`` tokens at offsets drawn from ``numpy.random.default_rng([seed,
s])``: a pure function of the seed and the step, so a resumed run sees the batches an uninterrupted one would.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from .corpus import CorpusFile
from .formats import EOS, edit_prompt, file_document, make_edit, render_messages, snippet, tool_loop

__all__ = ["documents", "encode", "batch", "eval_windows"]


def documents(files: Sequence[CorpusFile], seed: int, edit_share: float = 0.0, tool_share: float = 0.0,
              snippet_chars: int = 1500) -> list[str]:
    """The training texts of ``files`` (module docstring); ``edit_share`` / ``tool_share``: the probability that a
    Python file also yields an edit example / a tool conversation."""
    for name, value in (("edit_share", edit_share), ("tool_share", tool_share)):
        if not 0.0 <= value <= 1.0:
            raise ValueError(f"{name} = {value!r} must be in [0, 1]")
    rng = np.random.default_rng(seed)
    docs = []
    for f in files:
        docs.append(file_document(f.name, f.text))
        if not f.name.endswith(".py"):
            continue
        if rng.random() < edit_share:
            piece = snippet(f.text, rng, snippet_chars)
            edit = make_edit(piece, rng)
            if edit is not None:
                docs.append(edit_prompt(f.name, piece, edit[0]) + edit[1] + EOS)
        if rng.random() < tool_share:
            messages = tool_loop(f.name, f.text, rng)
            if messages is not None:
                docs.append(render_messages(messages))
    return [docs[i] for i in rng.permutation(len(docs))]


def encode(tokenizer, docs: Sequence[str], chunk: int = 512) -> np.ndarray:
    """The concatenated token ids of ``docs`` (``tokenizers.Tokenizer``, encoded in parallel chunks)."""
    dtype = np.uint16 if tokenizer.get_vocab_size() <= 2 ** 16 else np.int32
    parts = []
    for i in range(0, len(docs), chunk):
        for encoding in tokenizer.encode_batch(list(docs[i: i + chunk]), add_special_tokens=False):
            parts.append(np.asarray(encoding.ids, dtype=dtype))
    return np.concatenate(parts) if parts else np.zeros(0, dtype)


def batch(stream: np.ndarray, seed: int, step: int, batch_size: int, seq_len: int) -> np.ndarray:
    """``[batch_size, seq_len + 1]`` int64 windows of ``stream`` for step ``step`` (module docstring)."""
    if len(stream) < seq_len + 2:
        raise ValueError(f"the token stream has {len(stream)} tokens; seq_len = {seq_len} needs at least "
                         f"{seq_len + 2}")
    starts = np.random.default_rng([seed, step]).integers(0, len(stream) - seq_len - 1, batch_size)
    return np.stack([stream[s: s + seq_len + 1] for s in starts]).astype(np.int64)


def eval_windows(stream: np.ndarray, seq_len: int, max_tokens: int) -> np.ndarray:
    """Consecutive non-overlapping ``[n, seq_len + 1]`` windows of the first ``max_tokens`` tokens of ``stream``."""
    n = min(len(stream), max_tokens) // (seq_len + 1)
    if n < 1:
        raise ValueError(f"the held-out stream has {len(stream)} tokens, less than one window of {seq_len + 1}")
    return stream[: n * (seq_len + 1)].reshape(n, seq_len + 1).astype(np.int64)
