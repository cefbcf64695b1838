"""The values of the TTIR model (:mod:`~lumotree.proofs.ttir_model`): an SSA value's term and facts, an integer op
whose range is claimed, a memory access, what the launch gives a parameter."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import z3

__all__ = ["Val", "Access", "ConeOp", "ParamFact", "Unsupported", "names_in", "INT_BITS", "MAX_RANK", "type_range"]

MAX_RANK = 8
INT_BITS = {"i8": 8, "i16": 16, "i32": 32, "i64": 64}


class Unsupported(Exception):
    """A TTIR construct the model does not read."""


@dataclass(frozen=True)
class Val:
    """One SSA value: ``shape``, ``kind`` (``int``, ``bool``, ``ptr``, ``desc``, ``float``), integer ``bits``,
    ``term`` (int / bool term; a pointer's element offset), ``base`` (a pointer's argument, or after a select
    between two tensors the ``(condition, argument)`` pairs it may point into), ``iv`` (numeric
    interval or None), ``gathered`` (depends on non-contract data) and ``cone`` (ids of the integer ops it is made
    of, each with that op's term renamed into this value's lanes)."""

    shape: tuple[int, ...]
    kind: str
    bits: int = 0
    term: Any = None
    base: Any = None
    iv: tuple[int, int] | None = None
    gathered: bool = False
    cone: tuple[tuple[int, Any], ...] = ()


@dataclass(frozen=True)
class ConeOp:
    """An integer op whose range is claimed: its printed line, width, term over its own lanes, shape, context and
    ``kind`` (``arith``: no signed overflow; ``trunc``: the value fits the narrower type)."""

    line: str
    bits: int
    term: Any
    shape: tuple[int, ...]
    context: tuple[Any, ...]
    kind: str = "arith"


@dataclass
class Access:
    """A load, store or atomic through a pointer (``offset`` from ``base``), or a descriptor load / store
    (``coords``), with its ``mask``, the ``context`` it runs in, its ``cone`` and whether it is ``gathered``."""

    kind: str
    base: Any
    shape: tuple[int, ...]
    mask: Any
    context: tuple[Any, ...]
    cone: dict[int, Any]
    gathered: bool
    line: str
    offset: Any = None
    coords: list[Any] = field(default_factory=list)


@dataclass(frozen=True)
class ParamFact:
    """What the launch gives a kernel parameter: ``kind`` (``int``: ``term`` with numeric ``iv``; ``ptr``: a tensor
    with its span ``term`` and the ``contract`` (lo, hi, numeric iv) its elements satisfy, or None; ``desc``;
    ``float``)."""

    kind: str
    term: Any = None
    iv: tuple[int, int] | None = None
    contract: tuple[Any, Any, tuple[int, int]] | None = None


def names_in(term: Any) -> set[str]:
    """The names of the constants and functions a term applies."""
    out, seen, stack = set(), set(), [term]
    while stack:
        t = stack.pop()
        if t.get_id() in seen:
            continue
        seen.add(t.get_id())
        if z3.is_app(t) and t.decl().kind() == z3.Z3_OP_UNINTERPRETED:
            out.add(t.decl().name())
        stack.extend(t.children())
    return out


def type_range(bits: int) -> tuple[int, int]:
    return -(2 ** (bits - 1)), 2 ** (bits - 1) - 1


