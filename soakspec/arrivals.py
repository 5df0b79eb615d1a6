"""Where an open loop's arrivals fall: a level's buckets as exact numbers and as the run clock's
floats. Pure (no I/O, no soakspec import): the runner places arrivals with it, `check` (W517)
counts a bucket's arrivals with it, so the two cannot disagree.

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

import math
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction

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
        k = self.bucket_of(offset)
        hi = self.starts[k + 1] if k + 1 < len(self.starts) else self.stop
        if k >= 0 and t < self.starts[k]:
            return self.starts[k]
        if t >= hi:
            return math.nextafter(hi, -math.inf)
        return t


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
