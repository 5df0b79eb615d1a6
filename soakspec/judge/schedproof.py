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

Cost: constant and Poisson arrivals are rebuilt in numpy, bit for bit the generator's floats
(property tests hold both against the walk `expected`): constant ones by the runner's float
operations element by element (`Grid.constant_array`), a few nanoseconds an arrival; Poisson
ones (`_poisson`) from Python's own MT19937 state handed to numpy, the log through libm (the
function `random.expovariate` calls: numpy's own rounds some values an ulp apart) and the
running time as a left-to-right cumulative sum, about 0.1-0.2 µs an arrival -- the log through
Python floats is most of it -- against the walk's 0.3-0.6 µs (measured on a shared 2-vCPU VM:
a day at 1000 rps, 86 M arrivals, in 10-20 s rather than 25-50 s; benchmarks/README.md).
Guarded: where this interpreter's expovariate is not the formula vectorised, or a chunk's first
arrivals are not a short walk's, the schedule is walked. Gamma schedules (burstiness != 1) are walked in Python,
the same generator the runner ran (about 1-2.5 µs an arrival): rejection sampling takes a
varying number of uniforms a draw (`_chunks`). Then one sort of the level's intended starts.
Memory: the records' column and its sorted copy; the arrivals are compared chunk by chunk as
they are rebuilt (`arrival_chunks`, CHUNK at a time), never held whole. Closed loops cost
nothing.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import itertools
import math
import random
from collections.abc import Iterator, Mapping
from typing import Any, NamedTuple

import numpy as np

from soakspec import windows
from soakspec.arrivals import CountedArrivals, Grid, schedule

__all__ = ["TOLERANCE_US", "Proof", "arrival_chunks", "expected", "expected_times", "measured_arrivals", "prove"]

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


LOG_BLOCK = 1 << 16  # logs taken at a time through Python floats (`_gaps`): bounded temporaries
CHECKED = 8  # arrivals of each Poisson chunk checked against a short walk (`_poisson`)
_EXPOVARIATE = "return -_log(1.0 - self.random()) / lambd"  # CPython 3.11-3.13's `random.expovariate`


def _mt(rng: random.Random) -> np.random.RandomState | None:
    """A numpy legacy MT19937 in `rng`'s state: its `random_sample` doubles are `rng.random()`'s,
    the same 53 bits of the same two 32-bit words in the same operations. None where the state
    is not CPython's version 3 (624 words and a position)."""
    version, words, _ = rng.getstate()
    if version != 3 or len(words) != 625:
        return None
    mt = np.random.RandomState()
    mt.set_state(("MT19937", np.array(words[:624], dtype=np.uint32), words[624]))
    return mt


def _python(mt: np.random.RandomState) -> random.Random:
    """A `random.Random` in `mt`'s state (`_mt` the other way)."""
    _, keys, pos = mt.get_state()[:3]
    rng = random.Random()
    rng.setstate((3, (*(int(k) for k in keys), int(pos)), None))
    return rng


def _gaps(mt: np.random.RandomState, rate: float, n: int) -> np.ndarray:
    """The next `n` of `random.Random.expovariate(rate)`, -log(1.0 - random()) / rate, bit for
    bit: the uniforms and 1.0 - u, the negation and the division in numpy (single IEEE
    operations, the same in any implementation); the log through the very function
    `expovariate` calls (`random._log`, libm's log), for numpy's own log (SIMD) rounds some
    values an ulp apart from libm's -- and each such ulp is carried by every later cumulative
    time. The log is the cost: about 80-110 ns a value through Python floats on an idle core
    (200 on a shared one), against the walk's 270-560 ns an arrival (benchmarks/README.md)."""
    x = 1.0 - mt.random_sample(n)
    log = random._log  # type: ignore[attr-defined]
    for lo in range(0, n, LOG_BLOCK):
        x[lo:lo + LOG_BLOCK] = np.fromiter(map(log, x[lo:lo + LOG_BLOCK].tolist()), dtype=np.float64)
    np.negative(x, out=x)
    return np.divide(x, rate, out=x)


@functools.lru_cache(maxsize=1)
def _exponential_vectorises() -> bool:
    """Whether this interpreter's `random.expovariate` is the formula `_gaps` vectorises: its
    source says -_log(1.0 - self.random()) / lambd with `_log` math.log (CPython 3.11 to 3.13),
    and a seeded draw of a thousand is `_gaps`'s bit for bit. Else (another Python, a
    patched `random`) Poisson schedules are walked."""
    try:
        source = inspect.getsource(random.Random.expovariate)
    except (OSError, TypeError):
        return False
    if _EXPOVARIATE not in source or vars(random).get("_log") is not math.log:
        return False
    rng = random.Random(20261207)
    mt = _mt(rng)
    if mt is None:
        return False
    return np.array([rng.expovariate(3.7) for _ in range(1024)]).tobytes() == _gaps(mt, 3.7, 1024).tobytes()


def _poisson(rate: float, seed: int, origin: float, stop: float, count: float) -> Iterator[np.ndarray]:
    """`schedule(rate, "poisson", seed, origin, stop)` (burstiness 1)'s first `count` arrivals
    (math.inf: all) in float64 chunks, vectorised bit for bit: Python's MT19937 state handed to
    numpy (`_mt`), the exponential gaps (`_gaps`), and the running time t + gap -- the first
    arrival origin + gap -- as `np.cumsum`, which adds left to right, one addition an element,
    the walk's own additions; t carried from chunk to chunk. Guarded: where this interpreter's
    expovariate is not that formula (`_exponential_vectorises`), or a chunk's first CHECKED
    arrivals are not a short walk's (the first chunk against `schedule` itself, a later one
    against Python's generator in the chunk's state), the schedule is walked from there."""

    def walk(skip: int) -> Iterator[np.ndarray]:
        times = schedule(rate, "poisson", seed, origin, stop)
        return _walked(itertools.islice(times, skip, None if count == math.inf else int(count)))

    mt = _mt(random.Random(seed)) if _exponential_vectorises() else None
    if mt is None:
        yield from walk(0)
        return
    t, done = origin, 0
    while done < count:
        due = max(stop - t, 0.0) * rate  # the arrivals left before stop on average: no chunk of logs taken past it
        n = int(min(CHUNK, count - done, due + 6 * math.sqrt(due) + 64 if math.isfinite(due) else math.inf))
        if done == 0:
            short = list(itertools.islice(schedule(rate, "poisson", seed, origin, math.inf), min(CHECKED, n)))
        else:
            rng, short, s = _python(mt), [], t
            for _ in range(min(CHECKED, n)):
                s = s + rng.expovariate(rate)
                short.append(s)
        times = _gaps(mt, rate, n)
        times[0] = t + times[0]
        np.cumsum(times, out=times)
        if times[: len(short)].tobytes() != np.array(short, dtype=np.float64).tobytes():
            yield from walk(done)  # never seen: a numpy or libm that differs from the walk's
            return
        end = int(np.searchsorted(times, stop, side="left"))  # the first at or after stop: times never decrease
        done, t = done + n, float(times[-1])  # before the yield: the reader may scale the chunk in place (`prove`)
        if end:
            yield times[:end]
        if end < n:
            return


def _chunks(rate: float, arrival: str, seed: int, origin: float, b: float, grid: Grid | None, count: float) -> Iterator[np.ndarray]:
    """The first `count` arrivals (math.inf: all) of `schedule(rate, arrival, seed, origin, ...)`
    in float64 chunks. Constant arrivals (`_constant`) and Poisson ones (`_poisson`) are
    vectorised bit for bit; gamma ones (burstiness != 1) are walked: `random.gammavariate` is
    rejection sampling, a varying number of `random()`s a draw through several branches (and
    for shape < 1 a `pow`), which numpy cannot follow draw for draw."""
    stop = grid.stop if grid is not None else math.inf
    if arrival == "poisson" and b == 1.0:
        yield from _poisson(rate, seed, origin, stop, count)
        return
    if arrival != "poisson":
        n = 2**62 if count == math.inf else int(count)
        vec = _constant(rate, origin, grid, n)
        if vec is not None:
            yield from vec
            return
    times = schedule(rate, arrival, seed, origin, stop, b, grid)
    yield from _walked(times if count == math.inf else itertools.islice(times, int(count)))


def _sized(rate: float, arrival: str, grid: Grid | None, count: float) -> int | None:
    """How many arrivals `_chunks` yields, where that is known before building them (constant
    arrivals, vectorised); None otherwise."""
    if arrival == "poisson" or (grid is not None and grid.constant_array(rate, 0, 0) is None):
        return None
    return int(count) if grid is None else min(grid.constant_count(rate), 2**62 if count == math.inf else int(count))


def _runs(entry: Mapping[str, Any]) -> tuple[_Setup, list[tuple[float, Grid | None, float]]]:
    """The level's setup and its schedules as (origin, grid, count): a counted warmup's first N
    from t0 (`_warm_open`), then the level's from its origin."""
    setup = _setup(entry)
    runs: list[tuple[float, Grid | None, float]] = [] if setup.warm_n is None else [(setup.t0, None, setup.warm_n)]
    runs.append((setup.origin, setup.grid, math.inf))
    return setup, runs


def arrival_chunks(entry: Mapping[str, Any]) -> Iterator[np.ndarray]:
    """`expected` in float64 chunks, bit for bit (tests/test_schedule_proof.py holds them equal),
    each at most CHUNK long and built as it is read: a count's quota (`Quota.first`) is applied
    chunk by chunk, so no more than its arrivals and one chunk are built."""
    (rate, arrival, seed, b, t0, m, warm_n, origin, grid), runs = _runs(entry)
    for o, g, c in runs[:-1]:
        yield from _chunks(rate, arrival, seed, o, b, g, c)
    n = _count(entry.get("requests_per_level"))
    if n is None:
        yield from _chunks(rate, arrival, seed, origin, b, grid, math.inf)
        return
    least = _num(entry.get("min_duration_s"))
    until = None if least is None else m + least
    k = 0  # arrivals at or after m so far
    for t in _chunks(rate, arrival, seed, origin, b, grid, math.inf):
        ge = t >= m
        after = k + np.cumsum(ge)  # `expected`'s k after each arrival
        done = after >= n if until is None else (after >= n) & (t >= until)
        if done.any():  # `expected` returns at the first j where it is done: after yielding j,
            j = int(np.argmax(done))  # or before it where k had reached n already and t_j >= until
            stop_before = until is not None and after[j] - ge[j] >= n
            yield t[: j if stop_before else j + 1]
            return
        yield t
        k = int(after[-1])


def expected_times(entry: Mapping[str, Any]) -> np.ndarray:
    """`expected` as one float64 array, bit for bit: constant and Poisson arrivals computed in
    numpy (`_chunks`), where `expected` walks the generator at a microsecond or so (a day at
    1000 rps is 86 M arrivals); gamma walked. Memory: a timed constant level's arrivals are
    written into one array of their known size; any other level's chunks (`arrival_chunks`)
    are joined at the end (twice its float64 for a moment). `prove` reads the chunks instead."""
    (rate, arrival, *_), runs = _runs(entry)
    sizes = [_sized(rate, arrival, g, c) for _, g, c in runs]
    if _count(entry.get("requests_per_level")) is None and None not in sizes:  # known size: filled in place
        out = np.empty(sum(sizes), dtype=np.float64)  # type: ignore[arg-type]
        at = 0
        for t in arrival_chunks(entry):
            out[at:at + len(t)] = t
            at += len(t)
        return out
    parts = list(arrival_chunks(entry))
    return np.concatenate(parts) if parts else np.empty(0, dtype=np.float64)


def measured_arrivals(entry: Mapping[str, Any]) -> int | None:
    """How many measured arrivals (at or after `measure_start`) the level's schedule holds as the
    runner sends it (`expected`); None where the manifest does not determine the schedule
    (`why_unproven`). A counted level with a min_duration sends exactly its N when its schedule
    has no arrival after its N-th that is due before measure_start + D: a level that then
    drains before D is complete as scheduled (`validity._count_problems`)."""
    if why_unproven(entry) is not None:
        return None
    m = float(entry["measure_start"])
    return sum(int(np.count_nonzero(t >= m)) for t in arrival_chunks(entry))


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
    got = np.sort(_us(got))
    k, near, scheduled = _first_mismatch(got, arrival_chunks(entry))
    if k is None:
        return Proof(PROVEN, arrivals=scheduled)
    counts = f" ({len(got)} records, {scheduled} arrivals scheduled)"

    def at(us: float) -> str:
        return f"{(us - round(t0 * 1e6)) / 1e6:.6f} s after the level's start"

    def close(a: np.ndarray, i: int, v: float) -> bool:
        return i < len(a) and abs(a[i] - v) <= TOLERANCE_US

    dropped = k >= len(got) or (len(near) == 2 and close(got, k, near[1]))  # near: the arrivals k and k + 1
    if near and dropped:
        return Proof(BROKEN, f"arrival {k} (due {at(near[0])}) has no record: dropped" + counts)
    if not near or close(got, k + 1, near[0]):
        return Proof(BROKEN, f"a record intended {at(got[k])} is no arrival of the schedule: added" + counts)
    return Proof(BROKEN, f"arrival {k} was due {at(near[0])} but its record says {at(got[k])}: "
                         f"shifted {(got[k] - near[0]) / 1e3:+.3f} ms" + counts)


def _first_mismatch(got: np.ndarray, chunks: Iterator[np.ndarray]) -> tuple[int | None, list[float], int]:
    """Where the sorted record times `got` (whole µs) first part from the arrivals `chunks`
    (seconds, in time order), read chunk by chunk so the day's arrivals are never held at once:
    (k, the arrivals k and k + 1 in µs where they exist, how many arrivals there are); k None
    where every record is its arrival and there are as many of each."""
    k: int | None = None
    near: list[float] = []
    at = 0
    for want in chunks:
        us = np.rint(np.multiply(want, 1e6, out=want), out=want)  # `_us` in place: a chunk built for this
        if k is None:
            g = got[at:at + len(us)]
            off = np.flatnonzero(np.abs(g - us[:len(g)]) > TOLERANCE_US)
            k = at + int(off[0]) if len(off) else (at + len(g) if len(g) < len(us) else None)
        if k is not None and len(near) < 2:
            near += us[max(k - at, 0):][:2 - len(near)].tolist()
        at += len(us)
    if k is None and len(got) > at:
        k = at
    return k, near, at
