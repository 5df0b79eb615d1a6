"""The load generator proves its own numbers under an open loop's `max_concurrency = N`.

The judge excuses a capped level's wait for a slot from the load generator's schedule lag
(`record.schedule_lag` counts from `admitted`), so it must not take `admitted` on trust: a
runner that sent more than N at once, or kept a request waiting while a slot was free, would
otherwise be hidden -- its queue read as the user's declared cap, its latency FAILed as the
server's. This module re-derives, from the records alone, that each load process kept to its
share of N (`shares.in_flight_share`, the runner's own split; a record's process is its
`worker` modulo the level's `workers`, `shares.process_of`):

(a) **Never over the share.** A request occupies [admitted, end) when it waited for a slot,
    else [start, end). In the runner (`runner/load.py` `_arrivals`, `Slots`) a slot is taken
    before the request's start is read and given back after its end was written, and a
    waiting request's `admitted` is the run clock's read at the very release that handed it
    the slot: each record's interval lies inside the time its slot was held, and one slot's
    consecutive holders never overlap. All these times are one process's `RunClock` (only a
    process's own records are compared) rounded to 1 us on disk, and rounding is monotone, so
    the end of one holder can *equal* the `admitted` or start of the next but never pass it.
    Intervals are therefore half-open with no further tolerance: at one instant ends count
    before starts, and an instant with more than the share in flight is the runner's fault.
(b) **Work-conserving.** A request that waited for a slot (admitted - intended_start above
    `tol`) must have waited behind a full share: at some instant of its wait [intended_start,
    admitted) its process's records show the share in flight. Record intervals leave out the
    moments between a slot's taking and the request's start, and between its end and the
    slot's release (the client's own processing), so the share can look one short for those
    moments; a wait no longer than `tol` (the gate's `client_schedule_lag`, the client
    lateness it already allows) is not checked, and a longer one needs only one full instant.
    A queue that waited while the records never showed the share full -- a slot lost, a cap
    smaller than declared -- is flagged.

Records that name no process: split over `workers` processes, a record's process is read
from its `worker`; one without (the runner always writes it; the request schema allows null,
and `verify` reports it, V108, only where the manifest says the level ran split -- the judge
still reads the record) belongs to no process the judge can name, so no
process's in-flight count is known -- leaving it out could hide a process over its share, and
counting it anywhere could flag a sound one. Such a level cannot prove its cap: a Breach of
kind "unplaced" (INCONCLUSIVE, never a pass by omission); the other records are still checked.
One process needs no `worker`: every record is its.

Records without a usable interval: one with no end, or an end not after its begin (a request
held back at the backend's gate: start = end), occupies no time in (a) -- leaving it out can
only count fewer in flight, never flag a sound run. A request *never sent* (no start: the
client's own connection failure) held its slot until its end and a pause after it
(`NOT_SENT_PAUSE_S`) that no record shows; its process's occupancy is unknown, so (b) is not
judged for that process (client_healthy is INCONCLUSIVE for such a run already, `not_sent`).

Vectorised: per process, the begin and end events are sorted once (ends before starts at a
tie) and the in-flight count is their cumulative sum; (b) is one `searchsorted` of the waits
against the full stretches. No per-request Python loop: the gate path is benchmarked at 10^6 -
10^7 requests.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from soakspec.shares import in_flight_share, process_of

__all__ = ["Breach", "breaches"]


@dataclasses.dataclass(frozen=True)
class Breach:
    """One load process of a capped level that did not keep to its share.

    kind "over": `count` requests started with more than `share` in flight, `peak` at most.
    kind "idle": `count` of the process's `waited` requests waited for a slot although its
    records never showed the share full during the wait. kind "unplaced": `count` records of a
    level split over `parts` processes name no worker, so their process is unknown and no share
    can be proven (`process` -1). `at`: the first such request's begin (over) or intended start
    (idle), run-clock seconds."""

    kind: str
    process: int
    parts: int
    share: int
    count: int
    peak: int = 0
    waited: int = 0
    at: float = float("nan")


def breaches(worker: np.ndarray, intended: np.ndarray, start: np.ndarray, admitted: np.ndarray, end: np.ndarray,
             cap: int, parts: int, tol: float) -> list[Breach]:
    """The processes of one level (its records, warm-up included, as aligned arrays: `worker`
    int64, negative or MISSING where absent; the times float64, NaN where absent) that did not
    keep to their share of `cap` over `parts` processes."""
    parts = max(1, min(parts, cap))  # as `workers.processes_for` splits a capped level
    proc = np.zeros(len(worker), dtype=np.int64) if parts == 1 else np.where(worker >= 0, process_of(worker, parts), -1)
    out: list[Breach] = []
    unplaced = int((proc < 0).sum())
    if unplaced:
        out.append(Breach("unplaced", -1, parts, 0, unplaced))
    for p in range(parts):
        sel = np.flatnonzero(proc == p)
        if not len(sel):
            continue
        out.extend(_process(p, parts, in_flight_share(cap, (p, parts)), intended[sel], start[sel], admitted[sel], end[sel], tol))
    return out


def _process(p: int, parts: int, share: int, intended: np.ndarray, start: np.ndarray, admitted: np.ndarray,
             end: np.ndarray, tol: float) -> list[Breach]:
    begin = np.where(np.isnan(admitted), start, admitted)
    iv = ~np.isnan(begin) & ~np.isnan(end) & (end > begin)
    b, e = begin[iv], end[iv]
    times = np.concatenate([e, b])  # the ends first: a stable sort keeps an end before a start at one instant
    delta = np.concatenate([np.full(len(e), -1, dtype=np.int8), np.ones(len(b), dtype=np.int8)])
    order = np.argsort(times, kind="stable")
    times, delta = times[order], delta[order]
    del order
    count = np.cumsum(delta, dtype=np.int32)  # in flight just after each event
    out: list[Breach] = []
    over = (delta > 0) & (count > share)
    if over.any():
        out.append(Breach("over", p, parts, share, int(over.sum()), peak=int(count.max()), at=float(times[np.argmax(over)])))
    waits = ~np.isnan(admitted) & ~np.isnan(intended) & (admitted - intended > tol)
    if not waits.any() or np.isnan(start).any():  # a request never sent held its slot unseen: (b) not judged
        return out
    # the stretches [times[k], times[k + 1]) of positive length with the share in flight
    full = (count[:-1] >= share) & (times[1:] > times[:-1])
    lo, hi = times[:-1][full], times[1:][full]
    w_lo, w_hi = intended[waits], admitted[waits]
    j = np.searchsorted(hi, w_lo, side="right")  # the first full stretch ending after the wait began
    seen = j < len(lo)
    seen[seen] = lo[j[seen]] < w_hi[seen]  # ... and beginning before it ended
    idle = ~seen
    if idle.any():
        out.append(Breach("idle", p, parts, share, int(idle.sum()), waited=len(w_lo), at=float(w_lo[idle].min())))
    return out
