"""A request's output text as its tokens arrive: detokenization, stop strings, the text a stream may send.

The whole output is decoded again at each event (``decode(tokens)``), so a character split across tokens appears once
complete. While the request runs, the text sent holds back a trailing replacement character (an incomplete UTF-8
sequence) and the longest suffix that begins a stop string. A stop string ends the output at its first occurrence:
the text is cut before it (the stop string is not part of the output, as in OpenAI's API).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

__all__ = ["OutputText"]

_INCOMPLETE = "\ufffd"


class OutputText:
    """The text of one output (module docstring). ``decode`` maps token ids to text."""

    def __init__(self, decode: Callable[[list[int]], str], stop: Sequence[str] = ()):
        self.decode = decode
        self.stop = tuple(s for s in stop if s)
        self.tokens: list[int] = []
        self.text = ""
        self.sent = 0  # characters of ``text`` handed out
        self.stopped = False  # a stop string was found

    def add(self, tokens: Sequence[int], final: bool, drop_last: bool = False) -> str:
        """Take new tokens and return the text that may be sent now. ``final``: the output ends here (everything left
        is sent); ``drop_last``: the last token is a stop token, left out of the text."""
        if self.stopped:
            return ""
        self.tokens.extend(int(t) for t in tokens)
        text = self.decode(self.tokens[:-1] if drop_last and self.tokens else self.tokens)
        hits = [i for i in (text.find(s) for s in self.stop) if i >= 0]
        if hits:
            text, self.stopped, final = text[: min(hits)], True, True
        self.text = text
        end = len(text)
        if not final:
            while end > self.sent and text[end - 1] == _INCOMPLETE:
                end -= 1
            end -= self._stop_prefix(text[:end])
        if end <= self.sent:
            return ""
        delta, self.sent = text[self.sent:end], end
        return delta

    def _stop_prefix(self, text: str) -> int:
        """Length of the longest suffix of ``text`` that is a proper prefix of a stop string."""
        longest = 0
        for stop in self.stop:
            for n in range(min(len(stop) - 1, len(text)), longest, -1):
                if text.endswith(stop[:n]):
                    longest = n
                    break
        return longest
