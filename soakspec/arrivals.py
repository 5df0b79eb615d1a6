"""An open loop's arrivals: when they are due (seeded constant, Poisson and gamma schedules,
ramps, a trace's replay) and where they fall -- a level's buckets as exact numbers and as the
run clock's floats. Pure (no I/O, no trio, no soakspec import): the runner sends on these
schedules (`runner/load.py`), and `check` (W517), the plan or the judge can rebuild them from
the plan alone, so none of them can disagree with what was sent.

Constant arrival i is due `i / rate` seconds after the level's start t0; bucket j starts
`warmup + j x bucket` after t0 (`plan.Bucket.start_s`). Comparing the floats of those sums
decides an arrival exactly on an edge by rounding: at 5 rps in 200 ms buckets 3 / 5 = 0.6 but
3 x 0.2 = 0.6000000000000001, so arrival 3 fell in bucket 2 (two arrivals) and bucket 3 got
none -- a constant-rate level with uneven buckets, an empty one INCONCLUSIVE. Here the bucket
is decided in exact arithmetic (`fractions.Fraction`) on the numbers the spec wrote
(`rational`: 0.2 is 1/5), and the arrival's float is then put inside that bucket's float
window (`Grid.place`, a shift of at most the rounding, below a nanosecond): everything that
cuts time by the floats -- the runner's `windows.holding`, its abort windows, the evidence's
bucket windows -- reads the exact bucket, and constant arrivals at r rps in buckets of b s put
exactly r x b in each bucket where r x b is a whole number.
"""

from __future__ import annotations

import functools
import itertools
import math
import random
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Protocol, TypeVar

# a float is read as the fraction with a denominator up to this nearest to it (0.2 -> 1/5,
# 0.1 x 3 = 0.30000000000000004 -> 3/10) where that is within RATIONAL_TOLERANCE of it
# relatively; else as its own exact value (a rate no decimal of the spec would give)
RATIONAL_DENOMINATOR = 10**6
RATIONAL_TOLERANCE = 1e-12


def rational(x: float) -> Fraction:
    """The exact number a plan's float stands for: a spec's decimal (`200ms`, `5rps`, a
    time-scaled one) is within float rounding of a fraction of small denominator."""
    exact = Fraction(x)
    near = exact.limit_denominator(RATIONAL_DENOMINATOR)
    return near if abs(near - exact) <= abs(exact) * RATIONAL_TOLERANCE else exact


@dataclass(frozen=True)
class Grid:
    """One level's buckets from its start `t0`: `starts` and `stop` as the runner's floats
    (`t0 + warmup` + each `Bucket.start_s`, and + the duration), `warmup`, `bucket` and `end`
    (warmup + duration) as exact offsets from t0."""

    t0: float
    starts: tuple[float, ...]
    stop: float
    warmup: Fraction
    bucket: Fraction
    end: Fraction

    @classmethod
    def of(cls, t0: float, warmup_s: float, duration_s: float, bucket_s: float, bucket_starts_s: Sequence[float]) -> Grid:
        m = t0 + warmup_s
        w = rational(warmup_s)
        return cls(t0, tuple(m + s for s in bucket_starts_s), m + duration_s, w, rational(bucket_s), w + rational(duration_s))

    def bucket_of(self, offset: Fraction) -> int:
        """The bucket holding an exact offset from t0 (-1: the warmup; the last bucket holds
        everything after its start)."""
        if offset < self.warmup:
            return -1
        return min(math.floor((offset - self.warmup) / self.bucket), len(self.starts) - 1)

    def place(self, t: float, offset: Fraction) -> float:
        """`t` (the float of t0 + offset) inside the float window of the bucket that holds
        `offset` exactly ([its start, the next start), the last ending at `stop`), moved by
        at most the rounding that put it outside."""
        return self._inside(t, self.bucket_of(offset))

    def _inside(self, t: float, k: int) -> float:
        hi = self.starts[k + 1] if k + 1 < len(self.starts) else self.stop
        if k >= 0 and t < self.starts[k]:
            return self.starts[k]
        if t >= hi:
            return math.nextafter(hi, -math.inf)
        return t

    def constant_placer(self, rate: float) -> Callable[[int, float], float | None]:
        """`place(i, t)` for constant arrival i at `rate` (t: the float of t0 + i / rate): `t`
        moved into the bucket that holds i / rate exactly, or None from the first arrival at
        or after the level's end. `Grid.place` in whole numbers: every offset counted in ticks
        of 1/q s, q the least common multiple of the denominators, so each arrival costs a
        few integer operations, not Fractions (a level start reads millions: `workers._holds`)."""
        step, w, b, end = self.constant_ticks(rate)
        last = len(self.starts) - 1

        def place(i: int, t: float) -> float | None:
            x = i * step
            if x >= end:
                return None
            return self._inside(t, -1 if x < w else min((x - w) // b, last))

        return place

    def constant_ticks(self, rate: float) -> tuple[int, int, int, int]:
        """(step, warmup, bucket, end) in whole ticks of 1/q s (`constant_placer`): constant
        arrival i is at i x step ticks from t0, in the warmup below `warmup`, in bucket
        (x - warmup) // bucket (the last holding the rest) and past the level from `end`."""
        r = rational(rate)
        q = math.lcm(r.numerator, self.warmup.denominator, self.bucket.denominator, self.end.denominator)
        step = r.denominator * (q // r.numerator)  # ticks from one arrival to the next: q / rate
        return step, int(self.warmup * q), int(self.bucket * q), int(self.end * q)

    def constant_array(self, rate: float, lo: int, hi: int):
        """Constant arrivals lo..hi-1 at `rate` as `schedule` yields them with this grid (t0 +
        i / rate, placed by `constant_placer`), as a numpy float64 array: the same IEEE
        operations on the same doubles (int -> double, divide, add, compare, nextafter), so
        bit for bit the walk's floats, a few nanoseconds an arrival instead of microseconds.
        Arrivals at or past the level's end are the caller's to leave out (`constant_count`).
        None where the ticks do not fit in int64 (a rate or bucket no spec decimal gives):
        walk `schedule` instead."""
        import numpy as np  # the judge's rebuild (judge/schedproof.py); the runner walks `schedule`

        step, w, b, end = self.constant_ticks(rate)
        if end + step >= 2**62 or hi >= 2**53:
            return None
        i = np.arange(lo, hi, dtype=np.int64)
        t = self.t0 + i.astype(np.float64) / rate
        x = i * step
        last = len(self.starts) - 1
        k = np.where(x < w, -1, np.minimum((x - w) // b, last))
        edges = np.array((*self.starts, self.stop), dtype=np.float64)
        top = edges[k + 1]  # the next bucket's start (the last's: stop; the warmup's: the first start)
        low = edges[np.maximum(k, 0)]
        return np.where((k >= 0) & (t < low), low, np.where(t >= top, np.nextafter(top, -np.inf), t))

    def constant_count(self, rate: float) -> int:
        """How many constant arrivals at `rate` the level holds: those before its end, exactly."""
        step, _, _, end = self.constant_ticks(rate)
        return max(0, -(-end // step))


class LevelShape(Protocol):
    """What `level_grid` reads of a `plan.Level` (and its `plan.Bucket`s)."""

    warmup_s: float
    warmup_requests: int | None
    duration_s: float
    bucket_s: float
    buckets: Sequence


def level_grid(level: LevelShape, t0: float) -> Grid:
    """A planned level's buckets from its start t0 on the run clock: the bucket windows' starts
    `t0 + warmup + Bucket.start_s` (the runner's `drive_level`, `LevelRun.bucket_windows`) and,
    exactly, where each constant arrival falls. After a counted warmup (`warmup_requests`) t0
    is the measured window's start m, where the schedule starts afresh: no warmup before it."""
    warmup = 0.0 if level.warmup_requests is not None else level.warmup_s
    return Grid.of(t0, warmup, level.duration_s, level.bucket_s, [b.start_s for b in level.buckets])


def constant_counts(rate: float, warmup_s: float, duration_s: float, bucket_s: float, n_buckets: int) -> list[int]:
    """How many constant arrivals at `rate` each of a level's `n_buckets` measured buckets
    holds, as `Grid.place` puts them: arrivals i with warmup + j x bucket <= i / rate < the
    next bucket's start (the last: warmup + duration)."""
    r, w = rational(rate), rational(warmup_s)
    edges = [w + j * rational(bucket_s) for j in range(n_buckets)] + [w + rational(duration_s)]
    first = [math.ceil(e * r) for e in edges]  # the first arrival at or after each edge
    return [max(0, first[j + 1] - first[j]) for j in range(n_buckets)]


def constant_nth(rate: float, warmup_s: float, n: int) -> Fraction:
    """The exact offset from the level's start of its n-th constant arrival after the warmup."""
    r = rational(rate)
    return (math.ceil(rational(warmup_s) * r) + n - 1) / r


class RampShape(Protocol):
    """What `ramp_schedule` reads of a `plan.OpenRamp`."""

    start: float
    arrival: str
    seed: int
    burstiness: float

    def time_of(self, s: float, length_s: float) -> float | None: ...


class ReplayShape(Protocol):
    """What `replay_schedule` reads of a `plan.Replay`."""

    speed: float
    offsets_s: tuple[float, ...]
    input_lens: tuple[int, ...]
    output_lens: tuple[int, ...]
    hash_ids: tuple[tuple[int, ...], ...]


def schedule(rate: float, arrival: str, seed: int, start: float, stop: float, burstiness: float = 1.0,
             grid: Grid | None = None):
    """Intended send times in [start, stop): constant spacing or a seeded Poisson process; with
    `burstiness` b != 1, gamma inter-arrival times of shape b and scale 1/(rate·b) (vLLM's
    `--burstiness`: the mean gap stays 1/rate, b < 1 burstier, b > 1 more even).

    With the level's `grid` (its buckets from `start`, which is `grid.t0`, to `stop`, which is
    `grid.stop`), constant arrival i is placed in its bucket -- and before the stop or not --
    by exact arithmetic (`arrivals.Grid.place`), not by how the floats of start + i/rate and of
    the bucket edges happened to round; random arrivals are floats either way."""
    rng = random.Random(seed)
    place = grid.constant_placer(rate) if grid is not None and arrival != "poisson" else None
    t = start
    i = 0
    while True:
        if arrival == "poisson" and burstiness != 1.0:
            t = (t if i else start) + rng.gammavariate(burstiness, 1.0 / (rate * burstiness))
        elif arrival == "poisson":
            t = t + rng.expovariate(rate) if i else start + rng.expovariate(rate)
        else:
            t = start + i / rate
        if place is not None:
            placed = place(i, t)
            if placed is None:
                return
            t = placed
        elif t >= stop:
            return
        yield t
        i += 1


# nth_arrival_s walks the schedule up to this many (a tenth of a second or so): every --workers
# process works the bound out itself, after its level's start, so the walk delays its first arrivals
WALKED_ARRIVALS = 100_000
NTH_ARRIVAL_SIGMAS = 8.0  # past it: the bound's standard deviations


@functools.lru_cache(maxsize=256)
def nth_arrival_s(rate: float, arrival: str, seed: int, n: int, burstiness: float = 1.0) -> float:
    """The offset from the level's start of its schedule's n-th arrival (n >= 1): constant
    (n - 1) / rate; Poisson or gamma, the seeded schedule's own n-th time, which lands about
    sqrt(n) / rate either side of n / rate -- so a counted warmup's wall bound
    (`plan._warmup_bound_s`, which the plan prints and the runner stops the warmup's arrivals
    at) is computed from it, not from n / rate, and every one of the warmup's n arrivals is
    due before it. It walks the schedule (about a microsecond an arrival; cached) up to
    WALKED_ARRIVALS; past that (a warmup of hundreds of thousands, which `plan` and each process
    must not spend seconds on)
    it is an upper bound: n / rate plus NTH_ARRIVAL_SIGMAS standard deviations of the n-th
    arrival's time (sqrt(n / burstiness) / rate), which a seeded schedule passes with
    probability below 1e-15."""
    if arrival != "poisson":
        return (n - 1) / rate
    if n > WALKED_ARRIVALS:
        return (n + NTH_ARRIVAL_SIGMAS * math.sqrt(n / burstiness)) / rate
    return next(itertools.islice(schedule(rate, arrival, seed, 0.0, math.inf, burstiness), n - 1, None))


def unit_arrivals(arrival: str, seed: int, burstiness: float = 1.0):
    """A unit-rate arrival process in "operational time": 0, 1, 2, ... (constant), or seeded
    exponential gaps (poisson), or gamma gaps of shape b and mean 1 (burstiness b != 1)."""
    rng = random.Random(seed)
    s, i = 0.0, 0
    while True:
        if arrival == "poisson":
            s += rng.gammavariate(burstiness, 1.0 / burstiness) if burstiness != 1.0 else rng.expovariate(1.0)
        else:
            s = float(i)
        yield s
        i += 1


def ramp_schedule(shape: RampShape, start: float, stop: float, warmup: float = 0.0):
    """Intended send times in [start, stop) for a rate ramp or staircase over the measured window
    [start + warmup, stop), the rate held at `shape.start` in the warmup before it: one unit-rate
    process mapped through the inverse of that whole cumulative rate (time rescaling), so the
    arrivals run on across the warmup's end as one process."""
    length = stop - start - warmup
    held = shape.start * warmup if shape.start > 0 else 0.0  # unit arrivals the warmup takes
    for s in unit_arrivals(shape.arrival, shape.seed, shape.burstiness):
        if s < held:
            off: float | None = s / shape.start
        else:
            ramp = shape.time_of(s - held, length)
            off = None if ramp is None else warmup + ramp
        if off is None or start + off >= stop:
            return
        yield start + off


def replay_schedule(shape: ReplayShape, start: float, stop: float):
    """(intended send time, (input length, output length, hash_ids)) of each trace request before
    `stop` (hash_ids () without prefix sharing)."""
    ids = shape.hash_ids or itertools.repeat(())
    for off, n_in, n_out, h in zip(shape.offsets_s, shape.input_lens, shape.output_lens, ids):
        t = start + off / shape.speed
        if t >= stop:
            return
        yield t, (n_in, n_out, h)


_Item = TypeVar("_Item")


class CountedArrivals:
    """Which arrivals a count-bounded level sends (`requests_per_level` n, and a `min_duration`
    D beside it, MLPerf LoadGen's pair): those up to its n-th at or after the measured window's
    start m -- with D, also every one due before m + D, and none due at or after it once n are
    sent. A schedule that ends first (the level's bound) with n sent has passed D too (check:
    min_duration <= duration). One rule for the runner (`runner/load.py` `Quota.first`, as it
    sends) and the judge (`judge/schedproof.py`, as it rebuilds what was sent). `reached`: the
    count (with D passed) ended the arrivals, set once `cut` has stopped."""

    def __init__(self, n: int, measure: float, least_s: float | None = None) -> None:
        self.n, self.measure = n, measure
        self.until = None if least_s is None else measure + least_s
        self.reached = False

    def cut(self, due: Iterable[_Item], at: Callable[[_Item], float] = float) -> Iterator[_Item]:  # type: ignore[assignment]
        """`due` (arrivals in time order, `at` their time) as far as the level sends them."""
        k, until = 0, self.until
        for item in due:
            t = at(item)
            if until is not None and k >= self.n and t >= until:
                self.reached = True
                return
            k += t >= self.measure
            yield item
            if k >= self.n and (until is None or t >= until):
                self.reached = True
                return
        self.reached = until is not None and k >= self.n
