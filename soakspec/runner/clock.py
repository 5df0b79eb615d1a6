"""The run clock: epoch seconds that never jump.

Every timestamp in a run (request records, bucket edges, deadlines) comes from one `RunClock`.
It reads a monotonic high-resolution timer and anchors it once to the wall clock, so its values
are epoch-second floats that are comparable to server trace timestamps, yet an NTP step during a
soak cannot make a latency negative.

A server stamps its traces with its own wall clock, which a step moves and the run clock does
not follow. So the run records the step: `wall_step()` is the wall clock less the run clock (0
until the wall clock is stepped), sampled once a second into client.jsonl
(runner/clienthealth.py), and trace matching places a trace across a recorded step
(`soakspec.evidence.traces.wall_steps`).
"""

from __future__ import annotations

import time
from collections.abc import Callable

import trio


class RunClock:
    """Monotonic epoch seconds: `now() = wall time at creation + (timer() - timer at creation)`.

    `timer` defaults to `time.perf_counter`. Tests running under `trio.testing.MockClock` pass
    `timer=trio.current_time` to make the run clock follow virtual time.
    """

    __slots__ = ("_offset", "_timer", "_wall")

    def __init__(
        self, timer: Callable[[], float] = time.perf_counter, *, epoch: float | None = None, offset: float | None = None,
        wall: Callable[[], float] | None = None,
    ) -> None:
        self._timer = timer
        self._offset = offset if offset is not None else (time.time() if epoch is None else epoch) - timer()
        # the wall clock a step is measured against: the machine's, when this clock reads the
        # machine's monotonic timer from the machine's time (a virtual clock has no wall clock)
        real = timer is time.perf_counter and epoch is None
        self._wall = wall if wall is not None else (time.time if real else None)

    @property
    def offset(self) -> float:
        """`now() - timer()`. `perf_counter` is the system-wide CLOCK_MONOTONIC on Linux, so
        `RunClock(offset=clock.offset)` in another process reads the same times (`--workers`)."""
        return self._offset

    def now(self) -> float:
        """The current time in epoch seconds."""
        return self._offset + self._timer()

    def wall_step(self) -> float | None:
        """The wall clock less this clock, now, in seconds: ~0 (microseconds) until the wall
        clock is stepped (NTP, an operator, a resumed VM), then the step. A slew moves neither
        clock apart (CLOCK_REALTIME and CLOCK_MONOTONIC are slewed alike). None: this clock has
        no wall clock to compare (a virtual one in tests)."""
        if self._wall is None:
            return None
        return self._wall() - self.now()

    def to_trio(self, epoch: float) -> float:
        """Convert a run-clock time to trio's clock, for `trio.move_on_at` / `trio.sleep_until`.

        Must be called inside a trio run. Infinite times stay infinite.
        """
        if epoch == float("inf") or epoch == float("-inf"):
            return epoch
        return trio.current_time() + (epoch - self.now())
