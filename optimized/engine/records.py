"""What the engine keeps and reports per request and per step: :class:`Request`, :class:`TokenEvent`,
:class:`GenerationResult`, :class:`StepRecord`, :class:`EngineStats`."""

from __future__ import annotations

from dataclasses import dataclass, field

from .sampling import SamplingParams

__all__ = ["Request", "TokenEvent", "GenerationResult", "StepRecord", "EngineStats"]


@dataclass(eq=False)
class Request:
    """A request's state. ``output`` holds every emitted token; the last one is pending while it runs."""

    request_id: int
    prompt: list[int]
    params: SamplingParams
    seed: int
    slot: int = -1
    output: list[int] = field(default_factory=list)
    counter: int = 0  # coins counter: one per model call on this request
    finished: bool = False
    finish_reason: str = ""
    steps: int = 0
    accepted: int = 0  # draft tokens accepted in total
    cached: list[int] = field(default_factory=list)  # the tokens the model's cache holds (kept with a prefix cache)
    prefix_hit: int = 0  # prompt tokens restored from the prefix cache

    def __post_init__(self) -> None:
        self._context = self.prompt + self.output  # kept in step with the output (extend_output): no copy a step

    @property
    def context(self) -> list[int]:
        """``prompt + output`` (one list, grown in place as the output grows: read it, do not keep it)."""
        return self._context

    def extend_output(self, tokens: list[int]) -> None:
        """Append emitted tokens to the output (and the context)."""
        self.output.extend(tokens)
        self._context.extend(tokens)

    @property
    def cache_length(self) -> int:
        return len(self.prompt) + len(self.output) - 1


@dataclass
class TokenEvent:
    """New tokens of one request from one step (streaming); ``finished`` with its ``finish_reason`` at the end."""

    request_id: int
    tokens: list[int]
    finished: bool
    finish_reason: str = ""


@dataclass
class GenerationResult:
    request_id: int
    prompt: list[int]
    tokens: list[int]
    finish_reason: str
    steps: int
    accepted: int

    @property
    def mean_accepted_length(self) -> float:
        """Draft tokens accepted per model step after the prefill."""
        return self.accepted / self.steps if self.steps else 0.0


@dataclass
class StepRecord:
    """One engine step: ``kind`` (``"prefill"``, ``"autoregressive"``, ``"verify"``), batch size, node bucket,
    tokens emitted, draft tokens accepted, predicted tokens, and seconds spent drafting / in the model+verification."""

    kind: str
    batch: int
    nodes: int
    emitted: int
    accepted: int
    predicted_tokens: float
    draft_s: float
    model_s: float
    total_s: float
    reason: str = ""


@dataclass
class EngineStats:
    steps: list[StepRecord] = field(default_factory=list)

    def summary(self) -> dict[str, float]:
        decode_steps = [s for s in self.steps if s.kind != "prefill"]
        spec = [s for s in decode_steps if s.kind == "verify"]
        total = sum(s.total_s for s in decode_steps)
        tokens = sum(s.emitted for s in decode_steps)
        seq_steps = sum(s.batch for s in spec)
        return {
            "decode_steps": len(decode_steps),
            "speculative_steps": len(spec),
            "decode_tokens": tokens,
            "decode_seconds": total,
            "tokens_per_s": tokens / total if total > 0 else 0.0,
            "mean_accepted": (sum(s.accepted for s in spec) / seq_steps) if seq_steps else 0.0,
            "draft_s_per_step": (sum(s.draft_s for s in spec) / len(spec)) if spec else 0.0,
            "verify_s_per_step": (sum(s.model_s for s in spec) / len(spec)) if spec else 0.0,
            "predicted_tokens_per_s": (
                sum(s.predicted_tokens for s in decode_steps) / sum(s.draft_s + s.model_s for s in decode_steps)
                if decode_steps
                else 0.0
            ),
        }


