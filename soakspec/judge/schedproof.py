"""The load generator proves its own numbers: an open loop's records are its schedule's arrivals.

Every open-loop figure -- offered load, latency from `intended_start`, schedule lag, the count
sent -- rests on the records' `intended_start`, which the runner writes. For a level whose
schedule the manifest fully determines (an open loop at a fixed rate: constant, Poisson or
gamma, its `schedule` entry -- rate, arrival, seed, burstiness -- with `started_at`,
`measure_start`, `warmup_s`, `planned_duration_s`, `bucket_s`, `warmup_requests` and
`requests_per_level`), the judge rebuilds the seeded schedule with the runner's own function
(`soakspec.arrivals.schedule`, the same code `runner/load.py` `_open` / `_warm_open` send on, so
the two cannot disagree) and proves that the level's records -- warmup and measured, held back
and never sent alike: the runner writes exactly one record per arrival, whatever became of it
-- carry exactly the schedule's arrivals within the level's bound: nothing dropped, nothing
added, nothing shifted.

What the rebuild follows (`expected`), as the runner does:
  - a timed warmup: one schedule from the level's start t0 (`started_at`) to its measured
    window's end (measure_start + planned_duration_s), constant arrivals placed in their
    buckets in exact arithmetic (`arrivals.level_grid`);
  - a counted warmup of N: the schedule's first N arrivals from t0 (no grid), then the schedule
    afresh from `measure_start` (the warmup's end) to measure_start + planned_duration_s;
  - a count of n (`requests_per_level`): the arrivals up to the n-th at or after the measured
    window's start (`Quota.first`) -- with a min_duration D (`min_duration_s`), every one due
    before measure_start + D as well;
  - `--workers`: every process reads the same schedule and sends every `parts`-th arrival, so
    the level's records together are the schedule, split however they were.

Tolerance: **1 µs**, on whole microseconds. The runner rounds each time it records to 1 µs
(`evidence/record.py` `_round_us`) and the judge holds them exactly (`table.MicroColumn`).
Rebuilt from the same double `started_at` with the same operations, the float is bit for bit
the runner's, and the judge rounds it to whole microseconds (`rint(t x 1e6)`, vectorised: at
a tie it may round the other way from `round(t, 6)`); a libm that rounds a log or exp one ulp
apart (about 0.24 µs at epoch seconds) moves a value by far less than a microsecond. Either
way the two sides are the floor or the ceiling of the same microsecond count: one apart at
most, never two. So a record within 1 µs of its arrival is that arrival; a record off by more
-- the smallest shift the records can show -- is not.

A level that did not complete (an abort, Ctrl-C, a partial run) is not proven: the arrivals
queued behind its cap when it was cancelled leave no record. So is every level the manifest
does not determine -- a closed loop (no schedule: its intended start is its start), a ramp or
step (`open_ramp`), a replay, a sweep's level without the field, and evidence written before
the manifest recorded `schedule` (judged as it ran: no proof, said so, no new failure).

Cost: constant arrivals are rebuilt in numpy (`expected_times`, `Grid.constant_array`: the
runner's float operations, element by element, so bit for bit the generator's floats, which a
property test holds against the walk `expected`), a few nanoseconds an arrival -- a day at
1000 rps (86 M) in seconds, not minutes; Poisson and gamma schedules are walked in Python, the
same generator the runner ran (about 0.4-2.5 µs an arrival: numpy cannot reproduce them bit for
bit, `_chunks` says why); then one sort of the level's intended starts. Memory: the arrivals'
float64, the size of the records' own column. Closed loops cost nothing.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Iterator, Mapping
from typing import Any, NamedTuple

import numpy as np

from soakspec import windows
from soakspec.arrivals import CountedArrivals, Grid, schedule

__all__ = ["TOLERANCE_US", "Proof", "expected", "expected_times", "measured_arrivals", "prove"]

TOLERANCE_US = 1  # the records' precision: see the module docstring

PROVEN, BROKEN, UNPROVEN = "proven", "broken", "unproven"


@dataclasses.dataclass(frozen=True)
class Proof:
    """One level's proof. status "proven" (`arrivals` records, each an arrival of the schedule),
    "broken" (`reason`: the first mismatching arrival) or "unproven" (`reason`: why the
    manifest does not determine its schedule, or the level did not complete)."""

    status: str
    reason: str = ""
    arrivals: int = 0


def _num(v: Any) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) else None


def _count(v: Any) -> int | None:
    return v if type(v) is int and v >= 1 else None


def why_unproven(entry: Mapping[str, Any]) -> str | None:
    """Why the level's schedule is not determined by its manifest entry (None: it is)."""
    mode = entry.get("mode")
    if mode != "open":
        return f"a {mode} loop has no arrival schedule" if isinstance(mode, str) else "no arrival schedule"
    shape = entry.get("shape")
    kind = shape.get("kind") if isinstance(shape, Mapping) else None
    if kind not in (None, "open"):
        return {"open_ramp": "a ramp's or step's rate varies", "replay": "a replay follows its trace"}.get(
            kind, f"a {kind} level") + ": its schedule is not proven"
    s = entry.get("schedule")
    if not isinstance(s, Mapping):
        return "the manifest records no schedule (evidence written before the schedule proof)"
    if _num(s.get("rate")) is None or s.get("arrival") not in ("constant", "poisson") or type(s.get("seed")) is not int \
            or _num(s.get("burstiness")) is None or s["rate"] <= 0 or s["burstiness"] <= 0:
        return "the manifest's schedule entry is not a rate, arrival, seed and burstiness"
    for key in ("started_at", "measure_start", "planned_duration_s", "bucket_s", "warmup_s"):
        if _num(entry.get(key)) is None:
            return f"the manifest records no {key}"
    if entry.get("completed") is not True:
        return "the level did not complete (arrivals queued when it was cut short leave no record)"
    return None


class _Setup(NamedTuple):
    rate: float
    arrival: str
    seed: Any
    burstiness: float
    t0: float  # the level's start (`started_at`)
    m: float  # its measured window's start
    warm_n: int | None  # a counted warmup's N
    origin: float  # where the measured schedule starts: t0, or m after a counted warmup
    grid: Grid  # its buckets


def _setup(entry: Mapping[str, Any]) -> _Setup:
    """What `expected` and `expected_times` rebuild a level's schedule from: a counted warmup
    (`_warm_open`) sends the schedule's first N from t0, then the schedule afresh from m, its
    grid without a warmup; otherwise one schedule from t0, its grid after the timed warmup."""
    s = entry["schedule"]
    t0, m = float(entry["started_at"]), float(entry["measure_start"])
    duration, bucket = float(entry["planned_duration_s"]), float(entry["bucket_s"])
    starts = [k * bucket for k in range(len(windows.lengths(duration, bucket)))]
    warm_n = _count(entry.get("warmup_requests"))
    origin, warmup = (m, 0.0) if warm_n is not None else (t0, float(entry["warmup_s"]))
    return _Setup(float(s["rate"]), s["arrival"], s["seed"], float(s["burstiness"]), t0, m, warm_n, origin,
                  Grid.of(origin, warmup, duration, bucket, starts))


def expected(entry: Mapping[str, Any]) -> Iterator[float]:
    """The level's arrivals as the runner sent them (see the module docstring); `entry` must
    pass `why_unproven`."""
    rate, arrival, seed, b, t0, m, warm_n, origin, grid = _setup(entry)
    if warm_n is not None:  # `_warm_open`: the first N from t0, then afresh from m
        yield from itertools.islice(schedule(rate, arrival, seed, t0, math.inf, b), warm_n)
    times = schedule(rate, arrival, seed, origin, grid.stop, b, grid)
    n = _count(entry.get("requests_per_level"))
    if n is None:
        yield from times
        return
    yield from CountedArrivals(n, m, _num(entry.get("min_duration_s"))).cut(times)  # as `Quota.first` sends them


CHUNK = 1 << 20  # arrivals rebuilt at a time: a count's quota stops the rebuild within a chunk of its end


def _walked(times: Iterator[float]) -> Iterator[np.ndarray]:
    """A schedule's Python walk in float64 chunks (never a Python list of millions)."""
    while True:
        a = np.fromiter(itertools.islice(times, CHUNK), dtype=np.float64)
        if len(a):
            yield a
        if len(a) < CHUNK:
            return


def _constant(rate: float, origin: float, grid: Grid | None, count: int) -> Iterator[np.ndarray] | None:
    """`schedule`'s first `count` constant arrivals from `origin` (`grid`: placed in the level's
    buckets, up to its end), vectorised bit for bit (`Grid.constant_array`); None where the
    grid's ticks do not fit in int64 (then walked)."""
    if grid is None:
        if count >= 2**53:
            return None
        return (origin + np.arange(lo, min(lo + CHUNK, count), dtype=np.float64) / rate for lo in range(0, count, CHUNK))
    count = min(count, grid.constant_count(rate))
    if grid.constant_array(rate, 0, 0) is None:
        return None
    return (grid.constant_array(rate, lo, min(lo + CHUNK, count)) for lo in range(0, count, CHUNK))


def _chunks(rate: float, arrival: str, seed: int, origin: float, b: float, grid: Grid | None, count: float) -> Iterator[np.ndarray]:
    """The first `count` arrivals (math.inf: all) of `schedule(rate, arrival, seed, origin, ...)`
    in float64 chunks. Constant arrivals are vectorised; Poisson and gamma ones are walked, for
    numpy cannot give the walk's floats bit for bit: `random.expovariate` is -log(1 - random())
    / rate through libm's log, numpy's log (SIMD) may round an ulp apart, and each such ulp is
    carried by every later cumulative time -- at 10^7 arrivals the drifts add past the proof's
    microsecond; a gamma draw takes a varying number of `random()`s (rejection sampling)."""
    if arrival != "poisson":
        n = 2**62 if count == math.inf else int(count)
        vec = _constant(rate, origin, grid, n)
        if vec is not None:
            yield from vec
            return
    times = schedule(rate, arrival, seed, origin, grid.stop if grid is not None else math.inf, b, grid)
    yield from _walked(times if count == math.inf else itertools.islice(times, int(count)))


def _sized(rate: float, arrival: str, grid: Grid | None, count: float) -> int | None:
    """How many arrivals `_chunks` yields, where that is known before building them (constant
    arrivals, vectorised); None otherwise."""
    if arrival == "poisson" or (grid is not None and grid.constant_array(rate, 0, 0) is None):
        return None
    return int(count) if grid is None else min(grid.constant_count(rate), 2**62 if count == math.inf else int(count))


def expected_times(entry: Mapping[str, Any]) -> np.ndarray:
    """`expected` as one float64 array, bit for bit (tests/test_schedule_proof.py holds them
    equal): constant arrivals computed in numpy, a few nanoseconds each, where `expected` walks
    the generator at a microsecond or two (a day at 1000 rps is 86 M arrivals); Poisson and
    gamma walked as `expected` does (`_chunks` says why). Memory: a timed constant level's
    arrivals are written into one array of their known size (the float64 the records' column
    takes, and one chunk's temporaries); a count's quota (`Quota.first`) is applied chunk by
    chunk, so no more than its arrivals and one chunk are built; a walked schedule's chunks are
    joined at the end (twice its float64 for a moment, beside the walk's own seconds)."""
    rate, arrival, seed, b, t0, m, warm_n, origin, grid = _setup(entry)
    runs: list[tuple[float, Grid | None, float]] = [] if warm_n is None else [(t0, None, warm_n)]  # `_warm_open`'s first N
    runs.append((origin, grid, math.inf))
    n = _count(entry.get("requests_per_level"))
    sizes = [_sized(rate, arrival, g, c) for _, g, c in runs]
    if n is None and None not in sizes:  # known size: filled in place
        out = np.empty(sum(sizes), dtype=np.float64)
        at = 0
        for o, g, c in runs:
            for t in _chunks(rate, arrival, seed, o, b, g, c):
                out[at:at + len(t)] = t
                at += len(t)
        return out
    parts = [t for o, g, c in runs[:-1] for t in _chunks(rate, arrival, seed, o, b, g, c)]
    least = _num(entry.get("min_duration_s"))
    until = None if least is None else m + least
    k = 0  # arrivals at or after m so far
    for t in _chunks(rate, arrival, seed, origin, b, grid, math.inf):
        if n is None:
            parts.append(t)
            continue
        ge = t >= m
        after = k + np.cumsum(ge)  # `expected`'s k after each arrival
        done = after >= n if until is None else (after >= n) & (t >= until)
        if done.any():  # `expected` returns at the first j where it is done: after yielding j,
            j = int(np.argmax(done))  # or before it where k had reached n already and t_j >= until
            stop_before = until is not None and after[j] - ge[j] >= n
            parts.append(t[: j if stop_before else j + 1])
            break
        parts.append(t)
        k = int(after[-1])
    return np.concatenate(parts) if parts else np.empty(0, dtype=np.float64)


def measured_arrivals(entry: Mapping[str, Any]) -> int | None:
    """How many measured arrivals (at or after `measure_start`) the level's schedule holds as the
    runner sends it (`expected`); None where the manifest does not determine the schedule
    (`why_unproven`). A counted level with a min_duration sends exactly its N when its schedule
    has no arrival after its N-th that is due before measure_start + D: a level that then
    drains before D is complete as scheduled (`validity._count_problems`)."""
    if why_unproven(entry) is not None:
        return None
    return int((expected_times(entry) >= float(entry["measure_start"])).sum())


def _us(a: np.ndarray) -> np.ndarray:
    return np.rint(np.asarray(a, dtype=np.float64) * 1e6)


def prove(entry: Mapping[str, Any], intended: np.ndarray) -> Proof:
    """Whether `intended` (the level's records' intended starts, any order; warmup included)
    are exactly its schedule's arrivals, each within TOLERANCE_US."""
    why = why_unproven(entry)
    if why is not None:
        return Proof(UNPROVEN, why)
    t0 = float(entry["started_at"])
    got = np.asarray(intended, dtype=np.float64)
    absent = int(np.isnan(got).sum())
    if absent:
        return Proof(BROKEN, f"{absent} of its {len(got)} records carry no intended_start, which every open-loop arrival has")
    want = expected_times(entry)
    np.rint(np.multiply(want, 1e6, out=want), out=want)  # `_us` in place: the day's arrivals are not copied
    got = np.sort(_us(got))
    n = min(len(got), len(want))
    off = np.flatnonzero(np.abs(got[:n] - want[:n]) > TOLERANCE_US)
    if not len(off) and len(got) == len(want):
        return Proof(PROVEN, arrivals=len(want))
    k = int(off[0]) if len(off) else n
    counts = f" ({len(got)} records, {len(want)} arrivals scheduled)"

    def at(us: float) -> str:
        return f"{(us - round(t0 * 1e6)) / 1e6:.6f} s after the level's start"

    def close(a: np.ndarray, i: int, v: float) -> bool:
        return i < len(a) and abs(a[i] - v) <= TOLERANCE_US

    dropped = k >= len(got) or (k < len(want) and k + 1 < len(want) and close(got, k, want[k + 1]))
    if k < len(want) and dropped:
        return Proof(BROKEN, f"arrival {k} (due {at(want[k])}) has no record: dropped" + counts)
    if k >= len(want) or close(got, k + 1, want[k]):
        return Proof(BROKEN, f"a record intended {at(got[k])} is no arrival of the schedule: added" + counts)
    return Proof(BROKEN, f"arrival {k} was due {at(want[k])} but its record says {at(got[k])}: "
                         f"shifted {(got[k] - want[k]) / 1e3:+.3f} ms" + counts)
