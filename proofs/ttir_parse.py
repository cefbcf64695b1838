"""A reader for the TTIR the Triton compiler prints (``module.str()``, locations stripped): the ops of one kernel,
their operands, attributes, result types and nested regions (``scf.for``, ``scf.if``, ``tt.reduce``, ``tt.scan``).

One op per line, as MLIR prints them; a region opens with a line ending in ``{`` (or ``({`` for the generic form of
``tt.reduce`` / ``tt.scan``) and closes with ``}`` (``} else {`` / ``} do {`` start an ``scf.if``'s /
``scf.while``'s second region). Types are read as ``(shape, element)``: ``tensor<64x32xi32>`` is
``((64, 32), "i32")``, ``!tt.ptr<f32>`` is ``((), "ptr")``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

__all__ = ["Op", "Kernel", "parse_kernel", "parse_type", "split_top"]


@dataclass
class Op:
    """One TTIR op: ``results`` (``%x``, or ``%x#0, %x#1`` for several), ``name``, ``operands`` (``%`` names in
    order), ``body`` (the text after the name), ``result_types`` (one ``(shape, element)`` per result), nested
    ``regions`` (lists of ops) with their block arguments, and the op's printed ``line``."""

    results: list[str]
    name: str
    operands: list[str]
    body: str
    result_types: list[tuple[tuple[int, ...], str]]
    line: str
    regions: list[list[Op]] = field(default_factory=list)
    region_args: list[list[str]] = field(default_factory=list)


@dataclass
class Kernel:
    """A kernel's name, parameters (name without ``%``, type) in order and the ops of its body."""

    name: str
    params: list[tuple[str, tuple[tuple[int, ...], str]]]
    ops: list[Op]


def split_top(text: str, sep: str = ",") -> list[str]:
    """``text`` split at ``sep`` outside brackets, parentheses and braces."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch in "<([{":
            depth += 1
        elif ch in ">)]}":
            depth -= 1
        elif ch == sep and depth == 0:
            parts.append(text[start:i].strip())
            start = i + 1
    parts.append(text[start:].strip())
    return [p for p in parts if p]


def parse_type(text: str) -> tuple[tuple[int, ...], str]:
    """``(shape, element)`` of a printed type; element ``ptr`` for pointers, ``desc`` for tensor descriptors."""
    text = text.strip()
    if text.startswith("tensor<"):
        inner = text[len("tensor<"):-1]
        dims = []
        while True:
            match = re.match(r"(\d+)x", inner)
            if not match:
                break
            dims.append(int(match.group(1)))
            inner = inner[match.end():]
        return tuple(dims), parse_type(inner)[1]
    if text.startswith("!tt.ptr"):
        return (), "ptr"
    if text.startswith("!tt.tensordesc"):
        return (), "desc"
    return (), text


def _result_names(text: str) -> list[str]:
    names = []
    for part in split_top(text):
        match = re.fullmatch(r"(%[\w.$-]+)(?::(\d+))?", part.strip())
        if not match:
            raise ValueError(f"cannot read the results {text!r}")
        count = match.group(2)
        names += [f"{match.group(1)}#{i}" for i in range(int(count))] if count else [match.group(1)]
    return names


def _result_types(name: str, body: str, count: int) -> list[tuple[tuple[int, ...], str]]:
    """The result types printed after the op's last top-level `` : `` (after ``->`` or `` to `` where present)."""
    if count == 0:
        return []
    if name == "arith.constant" and body.strip() in ("true", "false"):
        return [((), "i1")]
    head = body.split(" {", 1)[0] if name in ("scf.for", "scf.if") else body
    if name in ("scf.for", "scf.if"):
        match = re.search(r"-> \((.*)\)\s*(?::\s*\w+)?\s*$", head) or re.search(r"-> (\S+)", head)
        types = split_top(match.group(1)) if match else []
        return [parse_type(t) for t in types]
    colon = _last_top(body, " : ")
    tail = body[colon + 3:] if colon >= 0 else ""
    for arrow in (" -> ", " to "):
        at = _last_top(tail, arrow)
        if at >= 0:
            tail = tail[at + len(arrow):]
            break
    tail = tail.strip()
    if tail.startswith("(") and tail.endswith(")"):
        tail = tail[1:-1]
    if name == "tt.load":  # printed with the pointer type: the result holds the pointee
        tail = re.sub(r"!tt\.ptr<(\w+)>", r"\1", tail)
    types = [parse_type(t) for t in split_top(tail)]
    if name == "arith.cmpi":
        return [(types[0][0], "i1")]
    return types[-count:] if len(types) >= count else types * count


def _last_top(text: str, needle: str) -> int:
    depth, found = 0, -1
    for i, ch in enumerate(text):
        if ch in "<([{":
            depth += 1
        elif ch in ">)]}":
            depth -= 1
        elif depth == 0 and text.startswith(needle, i):
            found = i
    return found


def _parse_op(line: str) -> Op:
    results: list[str] = []
    rest = line.strip()
    match = re.match(r"((?:%[\w.$-]+(?::\d+)?)(?:\s*,\s*%[\w.$-]+(?::\d+)?)*)\s*=\s*", rest)
    if match:
        results = _result_names(match.group(1))
        rest = rest[match.end():]
    generic = re.match(r'"([\w.]+)"', rest)
    if generic:
        name, body = generic.group(1), rest[generic.end():]
    else:
        name, _, body = rest.partition(" ")
    operands = [m for m in re.findall(r"%[\w.$-]+(?:#\d+)?", body) if m not in results]
    return Op(results, name, operands, body, _result_types(name, body, len(results)), line.strip())


def parse_kernel(text: str) -> Kernel:
    """The one ``tt.func`` of a module's TTIR."""
    lines = [ln for ln in text.splitlines() if ln.strip()]
    start = next(i for i, ln in enumerate(lines) if ln.strip().startswith("tt.func"))
    header = lines[start]
    name = re.search(r"@(\w+)\(", header).group(1)
    signature = header[header.index("(") + 1: _matching(header, header.index("("))]
    params = []
    for part in split_top(signature):
        pname, _, ptype = part.partition(":")
        params.append((pname.strip().lstrip("%"), parse_type(ptype.strip())))
    ops, end = _parse_block(lines, start + 1)
    return Kernel(name, params, ops)


def _matching(text: str, open_at: int) -> int:
    depth = 0
    for i in range(open_at, len(text)):
        depth += text[i] == "("
        depth -= text[i] == ")"
        if depth == 0:
            return i
    raise ValueError(f"unbalanced parentheses in {text[:80]!r}")


def _parse_block(lines: list[str], i: int) -> tuple[list[Op], int]:
    """Ops from line ``i`` to the ``}`` that closes the block; returns them and the index of that line."""
    ops: list[Op] = []
    while i < len(lines):
        stripped = lines[i].strip()
        if stripped.startswith("}"):
            return ops, i
        if stripped.startswith("^bb"):
            i += 1
            continue
        op = _parse_op(stripped)
        i += 1
        if stripped.endswith("{"):
            while True:
                args = re.findall(r"(%[\w.$-]+):", lines[i].strip()) if lines[i].strip().startswith("^bb") else []
                region, i = _parse_block(lines, i)
                op.regions.append(region)
                op.region_args.append(args)
                closing = lines[i].strip()
                if closing.startswith(("} else {", "} do {")):
                    i += 1
                    continue
                if closing.startswith("})"):  # the generic form: the result types follow the region
                    op.result_types = _result_types(op.name, closing[2:], len(op.results))
                i += 1
                break
        ops.append(op)
    return ops, i
