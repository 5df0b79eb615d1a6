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

Cost: one walk of the schedule in Python (the same generator the runner ran: a few
microseconds an arrival, about 0.3 s for 10^5) and one sort of the level's intended starts;
closed loops cost nothing.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np

from soakspec import windows
from soakspec.arrivals import Grid, schedule

__all__ = ["TOLERANCE_US", "Proof", "expected", "measured_arrivals", "prove"]

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


def expected(entry: Mapping[str, Any]) -> Iterator[float]:
    """The level's arrivals as the runner sent them (see the module docstring); `entry` must
    pass `why_unproven`."""
    s = entry["schedule"]
    rate, arrival, seed, b = float(s["rate"]), s["arrival"], s["seed"], float(s["burstiness"])
    t0, m = float(entry["started_at"]), float(entry["measure_start"])
    duration, bucket = float(entry["planned_duration_s"]), float(entry["bucket_s"])
    starts = [k * bucket for k in range(len(windows.lengths(duration, bucket)))]
    warm_n = _count(entry.get("warmup_requests"))
    if warm_n is not None:  # `_warm_open`: the first N from t0, then afresh from m
        yield from itertools.islice(schedule(rate, arrival, seed, t0, math.inf, b), warm_n)
        origin, grid = m, Grid.of(m, 0.0, duration, bucket, starts)
    else:
        origin, grid = t0, Grid.of(t0, float(entry["warmup_s"]), duration, bucket, starts)
    times = schedule(rate, arrival, seed, origin, grid.stop, b, grid)
    n = _count(entry.get("requests_per_level"))
    if n is None:
        yield from times
        return
    least = _num(entry.get("min_duration_s"))
    until = None if least is None else m + least
    k = 0
    for t in times:  # `Quota.first`: up to the n-th at or after the measured window's start --
        if until is not None and k >= n and t >= until:  # and with a min_duration, each due before m + it
            return
        yield t
        k += t >= m
        if k >= n and (until is None or t >= until):
            return


def measured_arrivals(entry: Mapping[str, Any]) -> int | None:
    """How many measured arrivals (at or after `measure_start`) the level's schedule holds as the
    runner sends it (`expected`); None where the manifest does not determine the schedule
    (`why_unproven`). A counted level with a min_duration sends exactly its N when its schedule
    has no arrival after its N-th that is due before measure_start + D: a level that then
    drains before D is complete as scheduled (`validity._count_problems`)."""
    if why_unproven(entry) is not None:
        return None
    m = float(entry["measure_start"])
    return sum(1 for t in expected(entry) if t >= m)


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
    want = _us(np.fromiter(expected(entry), dtype=np.float64))
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
