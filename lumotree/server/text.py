"""A request's output text as its tokens arrive: incremental detokenization, stop strings, the text a stream may send.

Detokenization decodes a short window at each event: the tokens from the last text boundary on, beside the same
window without the new tokens; the difference is the new text, taken only when it does not end in a replacement
character (an incomplete UTF-8 sequence, completed by a later token), so a character split across tokens appears once
complete and the work per event does not grow with the output. While the request runs, the text handed out also holds
back the longest suffix that begins a stop string. A stop string ends the output at its first occurrence: the text is
cut before it (the stop string is not part of the output, as in OpenAI's API).
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
        self.longest_stop = max((len(s) for s in self.stop), default=0)
        self.tokens: list[int] = []  # every token received (a final stop token included)
        self.ids: list[int] = []  # the tokens the text is made of
        self.prefix_offset = 0  # ids[prefix_offset:read_offset]: the window's context, decoded already
        self.read_offset = 0
        self.text = ""
        self.sent = 0  # characters of ``text`` handed out
        self.stopped = False  # a stop string was found

    def add(self, tokens: Sequence[int], final: bool, drop_last: bool = False) -> str:
        """Take new tokens and return the text that may be sent now. ``final``: the output ends here (everything left
        is sent); ``drop_last``: the last token is a stop token, left out of the text."""
        if self.stopped:
            return ""
        tokens = [int(t) for t in tokens]
        self.tokens += tokens
        self.ids += tokens[:-1] if drop_last and tokens else tokens
        searched = max(len(self.text) - self.longest_stop + 1, 0)
        self.text += self._new_text(final)
        hits = [i for i in (self.text.find(s, searched) for s in self.stop) if i >= 0]
        if hits:
            self.text, self.stopped, final = self.text[: min(hits)], True, True
        end = len(self.text) if final else len(self.text) - self._stop_prefix(self.text)
        if end <= self.sent:
            return ""
        delta, self.sent = self.text[self.sent:end], end
        return delta

    def _new_text(self, final: bool) -> str:
        context = self.decode(self.ids[self.prefix_offset:self.read_offset])
        window = self.decode(self.ids[self.prefix_offset:])
        if len(window) > len(context) and (final or not window.endswith(_INCOMPLETE)):
            self.prefix_offset, self.read_offset = self.read_offset, len(self.ids)
            return window[len(context):]
        return ""

    def _stop_prefix(self, text: str) -> int:
        """Length of the longest suffix of ``text`` that is a proper prefix of a stop string."""
        longest = 0
        for stop in self.stop:
            for n in range(min(len(stop) - 1, len(text)), longest, -1):
                if text.endswith(stop[:n]):
                    longest = n
                    break
        return longest
