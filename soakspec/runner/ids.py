"""Request ids and indices, defined once.

A backend's requests are numbered 0, 1, 2, ... in the order they start, and the id is
`<run prefix>-<backend index>-<index, 7 digits>`. (The prompt and max_tokens are chosen by the
request's position in its level, not by this index: runner/load.py, README "How a run works".)
With `--workers N` a level's indices are interleaved: process p of N takes first + k·N + p, so
ids stay unique; afterwards the backend's sequence continues after the largest index any
process used.
"""

from __future__ import annotations

import dataclasses


def request_id(prefix: str, index: int) -> str:
    return f"{prefix}-{index:07d}"


@dataclasses.dataclass
class IdSequence:
    """`ids()` -> (index, request id): `first + k·parts + part` for the k-th call."""

    prefix: str
    first: int = 0
    part: int = 0
    parts: int = 1
    issued: int = 0

    def __call__(self) -> tuple[int, str]:
        i = self.first + self.issued * self.parts + self.part
        self.issued += 1
        return i, request_id(self.prefix, i)

    @property
    def end(self) -> int:
        """One past the largest index issued (`first` when none was)."""
        return self.first + (self.issued - 1) * self.parts + self.part + 1 if self.issued else self.first

    def share(self, part: int, parts: int) -> IdSequence:
        """Process `part` of `parts`' interleaved share of what comes next."""
        return IdSequence(self.prefix, self.end, part, parts)

    def continue_after(self, shares: list[IdSequence]) -> None:
        """Go on after every index the shares issued."""
        self.first = max((s.end for s in shares), default=self.end)
        self.part, self.parts, self.issued = 0, 1, 0


__all__ = ["IdSequence", "request_id"]
