"""32-bit machine integers as Z3 bit-vector terms, with Python-int semantics as proof obligations.

The kernels hold node indices and ancestor words in 32-bit registers; the reference (``reference/tree.py``) computes
with unbounded Python ints. Running the reference's own functions on :class:`Word` values gives the kernels'
arithmetic, and every operation records when it would part from the Python result (a shift by 32 or more, bits
shifted out, a wrap-around, a division by zero, an index out of bounds). A proof shows the obligations hold under the
premises, so the 32-bit result *is* the reference's.
"""

from __future__ import annotations

from typing import Any

import z3

__all__ = ["Machine", "Word", "WordRow", "WordTable"]

WIDTH = 32


class Machine:
    """Makes words and collects obligations ``(description, condition)``."""

    def __init__(self, width: int = WIDTH):
        self.width = width
        self.context = z3.Context()  # a fresh context: queries do not depend on earlier, unrelated ones
        self.obligations: list[tuple[str, Any]] = []

    def var(self, name: str) -> Word:
        return Word(self, z3.BitVec(name, self.width, self.context))

    def const(self, value: int) -> Word:
        if not 0 <= value < 2**self.width:
            raise ValueError(f"value = {value} does not fit {self.width} unsigned bits")
        return Word(self, z3.BitVecVal(value, self.width, self.context))

    def lift(self, value: Word | int | Any) -> Word:
        """A Word from a Word, a Python int or a raw Z3 bit-vector term."""
        if isinstance(value, Word):
            return value
        if z3.is_bv(value):
            return Word(self, value)
        return self.const(int(value))

    def require(self, what: str, condition: Any) -> None:
        self.obligations.append((what, condition))


class Word:
    """An unsigned 32-bit value; operators follow Python ints while the obligations hold."""

    __slots__ = ("machine", "term")

    def __init__(self, machine: Machine, term: Any):
        self.machine = machine
        self.term = term

    def _other(self, other: Word | int) -> Any:
        return self.machine.lift(other).term

    def _new(self, term: Any) -> Word:
        return Word(self.machine, z3.simplify(term))

    # arithmetic
    def __add__(self, other):
        b = self._other(other)
        self.machine.require("no 32-bit wrap-around in +", z3.BVAddNoOverflow(self.term, b, signed=False))
        return self._new(self.term + b)

    __radd__ = __add__

    def __mul__(self, other):
        b = self._other(other)
        self.machine.require("no 32-bit wrap-around in *", z3.BVMulNoOverflow(self.term, b, signed=False))
        return self._new(self.term * b)

    __rmul__ = __mul__

    def __floordiv__(self, other):
        b = self._other(other)
        self.machine.require("no division by zero", b != 0)
        return self._new(z3.UDiv(self.term, b))

    def __mod__(self, other):
        b = self._other(other)
        self.machine.require("no modulo by zero", b != 0)
        return self._new(z3.URem(self.term, b))

    # bits
    def _shift_left(self, value: Any, amount: Any) -> Word:
        self.machine.require("shift amount < 32", z3.ULT(amount, self.machine.width))
        shifted = value << amount
        self.machine.require("no bits shifted out of 32 in <<", z3.LShR(shifted, amount) == value)
        return self._new(shifted)

    def __lshift__(self, other):
        return self._shift_left(self.term, self._other(other))

    def __rlshift__(self, other):
        return self._shift_left(self._other(other), self.term)

    def __rshift__(self, other):
        amount = self._other(other)
        self.machine.require("shift amount < 32", z3.ULT(amount, self.machine.width))
        return self._new(z3.LShR(self.term, amount))

    def __and__(self, other):
        return self._new(self.term & self._other(other))

    __rand__ = __and__

    def __or__(self, other):
        return self._new(self.term | self._other(other))

    __ror__ = __or__

    # comparisons give Z3 booleans (for premises and claims)
    def __lt__(self, other):
        return z3.ULT(self.term, self._other(other))

    def __le__(self, other):
        return z3.ULE(self.term, self._other(other))

    def __gt__(self, other):
        return z3.UGT(self.term, self._other(other))

    def __ge__(self, other):
        return z3.UGE(self.term, self._other(other))

    def eq(self, other) -> Any:
        return self.term == self._other(other)

    def __bool__(self):
        raise TypeError("a symbolic Word has no truth value; the code under proof branched on data")

    def __index__(self):
        raise TypeError("a symbolic Word cannot index a Python list; the code under proof needs a symbolic container")


class WordRow:
    """One node's row of ancestor words: a fixed number of :class:`Word`, indexed by a symbolic word index.

    Reads and writes record ``word index < n_words`` and, for the flat table the kernels address
    (``bits[node * n_words + word]``), ``address < rows * n_words`` computed in 32 bits.
    """

    def __init__(self, machine: Machine, words: list[Word], node: Word | None = None, rows: Word | None = None):
        self.machine = machine
        self.words = list(words)
        self.node = node
        self.rows = rows

    def copy(self) -> WordRow:
        return WordRow(self.machine, self.words, self.node, self.rows)

    def _check(self, index: Word) -> None:
        n_words = len(self.words)
        self.machine.require(f"word index < n_words = {n_words}", index < n_words)
        if self.node is not None and self.rows is not None:
            address = self.node * n_words + index
            self.machine.require("flat address < rows * n_words", address < self.rows * n_words)

    def __getitem__(self, index: Word | int) -> Word:
        index = self.machine.lift(index)
        self._check(index)
        term = self.words[-1].term
        for k in range(len(self.words) - 2, -1, -1):
            term = z3.If(index.term == k, self.words[k].term, term)
        return Word(self.machine, term)

    def __setitem__(self, index: Word | int, value: Word | int) -> None:
        index = self.machine.lift(index)
        value = self.machine.lift(value)
        self._check(index)
        self.words = [Word(self.machine, z3.If(index.term == k, value.term, w.term)) for k, w in enumerate(self.words)]


class WordTable:
    """``words[node]`` for the symbolic nodes a proof holds rows of; each read records ``node < rows``."""

    def __init__(self, machine: Machine, rows: Word):
        self.machine = machine
        self.rows = rows
        self._rows: list[tuple[Word, WordRow]] = []

    def put(self, node: Word, row: WordRow) -> None:
        row = row.copy()
        row.node, row.rows = node, self.rows
        self._rows.append((node, row))

    def __getitem__(self, node: Word) -> WordRow:
        for held, row in self._rows:
            if held is node:
                self.machine.require("node index < N", node < self.rows)
                return row
        raise KeyError("the proof holds no row for this node")
