"""Time cut into windows: one definition for everything that cuts a level's measured part.

A level's measured part (`duration` seconds from `origin`) is cut into windows of `length`
seconds -- its buckets (`plan.Bucket`), a `per window` rule's windows -- starting at
`origin + k * length`, k = 0 .. count - 1; the last one may be shorter and ends at the level's
end. The window that holds time t is the last whose start is <= t: [start, next start), the
last window holding everything after its start, -1 before the first (a warm-up time).

Computing k as floor((t - origin) / length) instead rounds one off an edge for a t exactly on
it (an open-loop arrival, a time-scaled bucket); comparing t with the starts themselves
cannot. The runner's bucket of a request (`runner/load.py`), its abort rules' windows
(`runner/abort.py`) and the judge's per-window slots (`judge/table.py`, `WindowSlots`:
the same starts, vectorized with numpy's `searchsorted`) cut time this way.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence


def count(duration: float, length: float) -> int:
    """How many windows of `length` cut `duration` (the last may be shorter; at least one).
    The 1e-9 keeps a duration that is a whole number of windows up to float rounding
    (0.3 / 0.1 = 2.9999999999999996) from growing a last window of no length."""
    return max(1, math.ceil(duration / length - 1e-9))


def lengths(duration: float, length: float) -> tuple[float, ...]:
    """The windows' lengths, in order: `length` each, the last one what is left of `duration`
    (the plan's buckets, `plan._buckets`, and what `check` expects of them, W517)."""
    return tuple(min(length, duration - k * length) for k in range(count(duration, length)))


def starts(origin: float, duration: float, length: float) -> tuple[float, ...]:
    """The windows' starts, in order: origin + k * length."""
    return tuple(origin + k * length for k in range(count(duration, length)))


def holding(window_starts: Sequence[float], t: float) -> int:
    """The index of the window that holds time `t` (-1: before the first)."""
    return bisect.bisect_right(window_starts, t) - 1


def counted_span(duration: float, rate: float, count: int | None, min_duration: float | None = None) -> float:
    """How long a level at `rate` requests a second sends its measured requests: its `duration`
    for a timed level (`count` None); a counted level (`requests_per_level`) until it has sent
    `count` and, with `min_duration` (MLPerf LoadGen's min_query_count and min_duration), until
    that long has passed too -- max(count / rate, min_duration) -- never past its duration, the
    bound. One rule for check (W509, W517, W511), `plan` and their estimates of a level's length."""
    if count is None:
        return duration
    need = count / rate if rate > 0 else math.inf
    return min(duration, max(need, min_duration or 0.0))
