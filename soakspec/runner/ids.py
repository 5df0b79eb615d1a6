"""Request ids and indices, defined once.

A backend's requests are numbered 0, 1, 2, ... in the order they start, and the id is
`<run prefix>-<backend index>-<index, 7 digits>`. (The prompt and max_tokens are chosen by the
request's position in its level, not by this index: runner/load.py, README "How a run works".)
With `--workers N` a level's indices are interleaved: process p of N takes first + k·N + p, so
ids stay unique; afterwards the backend's sequence continues after the largest index any
process used.

A closed-loop level's prompt index is not the id's: the k-th request to start in the level gets
index k whichever process starts it, claimed from the level's `SharedCount` (one file the
processes share) as each request starts.
"""

from __future__ import annotations

import dataclasses
import fcntl
import os
import struct
import tempfile


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


_COUNT = struct.Struct("<Q")
_TIME = struct.Struct("<d")  # a time on the run clock, in a slot of its own (8 bytes, as a count's)


class SharedCount:
    """A count shared by a level's `--workers` processes: `claim()` returns 0, 1, 2, ... across all
    of them, in the order the claims are made. The processes are plain subprocesses (no inherited
    lock), so the count is 8 bytes in a file the parent creates per level (`create`; its path
    travels in each worker's job), read and rewritten under `flock` -- four system calls, a few
    microseconds a claim (closed loop: once per request; measured in the commit that added it).
    Not picklable with its descriptor: send `path`, `SharedCount(path).open()` in the worker; the
    parent `remove()`s the file once every worker has opened it (a runner SIGKILLed later leaves
    no file behind), the workers' descriptors keep the count."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._fd: int | None = None

    # 0: the level's requests started (their prompt index); 1: its conversations begun (multi-turn);
    # 2: a count-bounded closed loop's measured requests sent (`take`, `give_back`: `load.Quota`);
    # 3: a counted warmup's closed-loop requests sent; 4: the processes that ended their part of a
    # counted warmup; 5: when the last of them did (a float's bits: `warmup_done`, `warmup_end`)
    SLOTS = 6

    @classmethod
    def create(cls) -> SharedCount:
        """A new count at 0 in each slot, in a file of its own (the caller `remove()`s it)."""
        fd, path = tempfile.mkstemp(prefix="soakspec-level-", suffix=".count")
        try:
            os.pwrite(fd, _COUNT.pack(0) * cls.SLOTS, 0)
        finally:
            os.close(fd)
        return cls(path)

    def open(self) -> SharedCount:
        """Open the file now (each process its own descriptor: `flock` excludes between open
        files, not between a file's inherited copies)."""
        if self._fd is None:
            self._fd = os.open(self.path, os.O_RDWR)
        return self

    MEASURED = 2  # the slot of a count-bounded closed loop's measured requests (`take`, `give_back`)
    WARMUP = 3  # the slot of a counted warmup's closed-loop requests (`take`, `give_back`)
    WARMUP_DONE, WARMUP_END = 4, 5

    def warmup_done(self, parts: int, now: float) -> float | None:
        """A process ended its part of a counted warmup at `now`: the warmup's end -- `now` when
        it is the last of the level's `parts` processes to end (it writes the time, in the same
        locked step), else the time the last one wrote, or None while some have not ended."""
        return self._locked(lambda fd: self._done_step(fd, parts, now))

    def warmup_end(self, parts: int) -> float | None:
        """The counted warmup's end once all `parts` processes have ended it (`warmup_done`), else None."""
        return self._locked(lambda fd: self._done_step(fd, parts, None))

    def _done_step(self, fd: int, parts: int, now: float | None) -> float | None:
        at_done, at_end = self.WARMUP_DONE * _COUNT.size, self.WARMUP_END * _COUNT.size
        (done,) = _COUNT.unpack(os.pread(fd, _COUNT.size, at_done))
        if now is not None:
            done += 1
            os.pwrite(fd, _COUNT.pack(done), at_done)
            if done == parts:
                os.pwrite(fd, _TIME.pack(now), at_end)
        if done < parts:
            return None
        return _TIME.unpack(os.pread(fd, _TIME.size, at_end))[0]

    def _locked(self, step):
        fd = self.open()._fd
        assert fd is not None
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            return step(fd)
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)

    def claim(self, slot: int = 0) -> int:
        """The next number of the count in `slot` (the caller's), and that count moves on by one."""
        return self._update(slot, lambda n: n + 1)

    def take(self, slot: int, limit: int) -> bool:
        """One of `limit` places (a count-bounded closed loop's requests_per_level): True, and the
        count moves on by one, while it is below `limit`; False, the count unchanged, once all
        are taken. Never past `limit`, so a place given back (`give_back`) is taken again by the
        next caller, whichever process it is in."""
        return self._update(slot, lambda n: n + 1 if n < limit else n) < limit

    def give_back(self, slot: int) -> None:
        """A place `take` gave whose request was not sent (runner/load.py `counts_toward`): the
        count moves back by one, so another request takes it."""
        self._update(slot, lambda n: max(0, n - 1))

    def value(self, slot: int) -> int:
        """The count in `slot` now, unchanged (the parent reads a level's measured requests sent
        from it: the processes' own `Quota.reached` can disagree, `workers._sum_up`)."""
        return self._update(slot, lambda n: n)

    def _update(self, slot: int, step) -> int:
        """The count in `slot` before `step` (old -> new) moved it, under the file's lock."""
        fd = self.open()._fd
        assert fd is not None and 0 <= slot < self.SLOTS
        at = slot * _COUNT.size
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            (n,) = _COUNT.unpack(os.pread(fd, _COUNT.size, at))
            new = step(n)
            if new != n:
                os.pwrite(fd, _COUNT.pack(new), at)
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
        return n

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def remove(self) -> None:
        self.close()
        self.unlink()

    def unlink(self) -> None:
        """The file's name gone, this process's descriptor (if open) kept: every process that
        opened it still reads and moves the count."""
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass


__all__ = ["IdSequence", "SharedCount", "request_id"]
