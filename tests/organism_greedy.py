"""The trained organism (``models/organism``) for the GPU drafter tests: where it is, the prompts they decode, and
the greedy autoregressive baseline every speculative run on it must reproduce."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from lumotree.optimized import model as om
from lumotree.optimized.engine import Engine, OptimizedTarget, SamplingParams

ORGANISM = Path(__file__).resolve().parents[1] / "models" / "organism"
ORGANISM_PROMPTS = (
    "import os\nimport sys\n\n\ndef main(argv):\n    \"\"\"Parse the arguments and run.\"\"\"\n    ",
    "class Queue:\n    def __init__(self, maxsize=0):\n        self.maxsize = maxsize\n        self.queue = []\n\n"
    "    def put(self, item):\n        ",
    "The module provides functions for working with paths. Each function takes a path as a string and ",
)


def organism_greedy() -> tuple[list[list[int]], Any, Callable[[], OptimizedTarget], list[list[int]]]:
    """``(prompts, params, target, ar)``: the tokenized :data:`ORGANISM_PROMPTS`, greedy sampling of 64 new tokens,
    a factory of fresh fp32 targets (4 slots of 512 tokens, trees of up to 32 nodes, CUDA graphs) and the tokens that
    autoregressive decoding emits."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(ORGANISM)
    prompts = [tokenizer.encode(text) for text in ORGANISM_PROMPTS]
    params = SamplingParams(max_new_tokens=64)

    def target() -> OptimizedTarget:
        model = om.load_pretrained(ORGANISM, num_slots=4, max_seq_len=512, max_nodes=32, dtype=torch.float32)
        return OptimizedTarget(model, validate=False)

    ar = [r.tokens for r in Engine(target(), mode="autoregressive").generate(prompts, params)]
    return prompts, params, target, ar
