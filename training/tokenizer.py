"""A byte-level BPE tokenizer trained with the ``tokenizers`` library, saved so transformers' ``AutoTokenizer``
loads it (``tokenizer.json`` + ``tokenizer_config.json``, ``PreTrainedTokenizerFast``).

Byte-level: every string encodes (no unknown token) and decodes back exactly. The special tokens of
:data:`~lumotree.training.formats.SPECIAL_TOKENS` get the first ids (``<|endoftext|>`` = 0: end of text and padding).
Nothing is added around an encoding (no BOS), so ``encode(a + b)`` splits only where the pre-tokenizer does.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

from .formats import EOS, SPECIAL_TOKENS

__all__ = ["train_tokenizer", "save_tokenizer", "load_tokenizer"]


def train_tokenizer(texts: Iterable[str], vocab_size: int, min_frequency: int = 2):
    """A ``tokenizers.Tokenizer`` (byte-level BPE of ``vocab_size`` entries, special tokens included) trained on
    ``texts``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    if not isinstance(vocab_size, int) or vocab_size < 256 + len(SPECIAL_TOKENS):
        raise ValueError(f"vocab_size = {vocab_size!r} must be an integer >= {256 + len(SPECIAL_TOKENS)}")
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=min_frequency,
                                  special_tokens=list(SPECIAL_TOKENS), show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator(texts, trainer)
    return tokenizer


def save_tokenizer(tokenizer, out_dir: str | Path, model_max_length: int) -> None:
    """Write ``tokenizer.json`` and ``tokenizer_config.json`` into ``out_dir``."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(out / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": int(model_max_length),
        "eos_token": EOS, "pad_token": EOS, "bos_token": None, "unk_token": None,
        "additional_special_tokens": [t for t in SPECIAL_TOKENS if t != EOS],
        "add_bos_token": False, "add_eos_token": False, "clean_up_tokenization_spaces": False,
    }
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")


def load_tokenizer(path: str | Path):
    """The ``tokenizers.Tokenizer`` of a directory :func:`save_tokenizer` wrote (or of a ``tokenizer.json``)."""
    from tokenizers import Tokenizer

    path = Path(path)
    file = path / "tokenizer.json" if path.is_dir() else path
    if not file.is_file():
        raise FileNotFoundError(f"path = {str(path)!r} holds no tokenizer.json")
    return Tokenizer.from_file(str(file))
