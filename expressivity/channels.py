"""Named residual-channel layouts for hand-built weights: blocks of channels addressed by name."""

from __future__ import annotations

from functools import cached_property

__all__ = ["ChannelLayout"]


class ChannelLayout:
    """A residual stream cut into named blocks. Subclasses define :meth:`blocks` (``[(name, size), ...]`` in order);
    ``layout.NAME`` is the first channel of block NAME and :attr:`hidden_size` the total."""

    def blocks(self) -> list[tuple[str, int]]:
        raise NotImplementedError

    @cached_property
    def offsets(self) -> dict[str, int]:
        out, start = {}, 0
        for name, size in self.blocks():
            if name in out:
                raise ValueError(f"channel block {name!r} appears twice")
            out[name] = start
            start += size
        out[""] = start
        return out

    def __getattr__(self, name: str) -> int:
        if name.isupper() or (name[:1].isupper() and "_" in name):
            offsets = self.offsets
            if name in offsets:
                return offsets[name]
        raise AttributeError(f"{type(self).__name__} has no channel block {name!r}")

    @property
    def hidden_size(self) -> int:
        return self.offsets[""]
