"""A capped level's slot queue replayed as an on-time load generator would have driven it.

Under an open loop's `max_concurrency = N` a request may wait for a slot (`admitted`), and the
wait behind the user's declared cap is part of what users see: a failing ttft or latency that
the cap's own queue carries is the server's (and its cap's) FAIL. But a load generator that
sends late also *holds its slot late* -- from the slot's taking to the late send, and the
server's whole service time after it -- so the next request's `admitted` absorbs that lateness:
with a full cap the queue grows from the client's lateness alone, and `admitted -
intended_start` carries it. So the question "did the client's lateness carry this FAIL?"
(`performance.lag_figure`) cannot read the queue from `admitted`; it replays it:

Per load process (a record's process is its `worker` modulo the level's `workers`, its slots
`shares.in_flight_share(cap, (p, parts))`, the runner's own split -- as `judge/capproof.py`
reads them), the process's requests in intended-start order (the runner's `Slots` admits in
arrival order, FIFO, and arrivals come in intended-start order: `runner/load.py` `_arrivals`)
each take the slot that frees first, at max(intended start, that slot's free time), and hold it
for the request's own service time from the send (end - start): an N-slot Lindley recursion
(vectorised where the share is 1 slot, a heap of the share's free times otherwise). Warm-up
requests are in the queue too: they held the level's slots (a counted warm-up drains before the
measured requests are due, and the replay, never later than the run, keeps that). The replayed
admit of a request, less its intended start, is the wait an on-time client would have met; the
figure is that wait plus the time from the send (`gain`: actual send - replayed admit, what the
lateness added, taken out of ttft, latency and first_byte_wait).

Decisions (a request whose service time is unknown must never make the FAIL easier to discount
than the data supports; the replay is never earlier than the records allow):

- A request the server ended (completed, failed, rejected) holds its slot end - start from its
  replayed admit: its service time, assumed the server's alone (a counterfactual: an on-time
  client would have put the same requests in flight, at the same or earlier times; the server's
  times under that load are taken to be those measured).
- A request the client ended (timed out: its deadline counts from the intended start, so it
  ends at the same moment whenever it was sent; disconnected: a reset, a held-back request, or
  one cancelled by an abort) only bounds its service time from below: it holds its slot until
  its recorded end at least (max(end, replayed admit + end - start)), as long as the run held it.
- A request without a start (never sent: the client's own failure, with a pause after it no
  record shows), without an end, or with an end before its start held its slot for a time the
  records do not show: the process's queue from it on is unknown, so it and every later
  request of its process are not replayed -- their gain is 0, the figure as measured from the
  intended start, the FAIL's own. One without an intended start has no place in the queue at
  all: none of its process's requests is replayed, the earlier ones neither.
- Where the replay cannot be made at all -- a level split over processes with a record that
  names no worker (its process, so every process's queue, is unknown), a cap below 1 -- no
  request of the level is replayed: gain 0, the FAIL stands (missing data is never the
  client's excuse).

A replayed admit is never later than the run's own send where the holds are as above (each slot
frees no later than it did in the run, by induction), so the gain is >= 0 and the figure never
exceeds the measured one; it is not clamped (a record that breaks that is read as it says).

The replayed client is an ideal one: it sends at the intended time and frees a slot the moment
its response ends (end - start is the whole hold). A real client's own overhead around each
request -- before the send, after the end -- is counted as its lateness, so near the cap's
capacity, where a queue grows from small differences, a FAIL that a client without overhead
would have passed is INCONCLUSIVE, not the server's: which of the two decided it the records
cannot tell.

Computed only when a failing ttft or latency instance at a capped level is measured again
(`performance.lag_figure`), once per level (`index.LevelIndex.slot_replay`), never on the
common path. Its memory is a few arrays of the level's requests (the columns read, the gains
kept: 12 bytes a request while the judge runs) and a chunk's temporaries.
"""

from __future__ import annotations

import dataclasses
import heapq
import math

import numpy as np

from soakspec.judge.table import MISSING, RequestTable, Rows
from soakspec.shares import in_flight_share, process_of

__all__ = ["SlotReplay", "gains", "level_replay"]

# the outcomes the server ended: their time from the send is the server's service time
SERVER_ENDED = ("completed", "failed", "rejected")


CHUNK = 1 << 16  # requests replayed at a time: a chunk's temporaries, never a whole level's


def gains(worker: np.ndarray, intended: np.ndarray, start: np.ndarray, end: np.ndarray, server_ended: np.ndarray,
          cap: int, parts: int) -> np.ndarray:
    """start - replayed admit for each request of one capped level (aligned arrays, warm-up
    included: `worker` int64, negative where absent; times float64, NaN where absent;
    `server_ended` bool), 0 where it is not replayed (see the module doc)."""
    n = len(worker)
    if cap < 1 or not n:
        return np.zeros(n)
    parts = max(1, min(parts, cap))  # as `workers.processes_for` splits a capped level
    if parts > 1 and (worker < 0).any():
        return np.zeros(n)  # a record of no known process: no process's queue is known
    if parts == 1:  # one process: its queue is the level's, read in place
        return _process(in_flight_share(cap, (0, 1)), intended, start, end, server_ended)
    out = np.zeros(n)
    proc = process_of(worker, parts)
    for p in range(parts):
        sel = np.flatnonzero(proc == p)
        if len(sel):
            out[sel] = _process(in_flight_share(cap, (p, parts)), intended[sel], start[sel], end[sel], server_ended[sel])
    return out


def _ascending(a: np.ndarray) -> bool:
    """Whether `a` (no NaN) never decreases, looked at a chunk at a time (a differences' array
    of a chunk, not of the level)."""
    return all(not (np.diff(a[lo:lo + CHUNK + 1]) < 0).any() for lo in range(0, len(a), CHUNK))


def _process(share: int, intended: np.ndarray, start: np.ndarray, end: np.ndarray, server_ended: np.ndarray) -> np.ndarray:
    """One process's gains: its queue replayed in intended-start order a chunk at a time (the
    one-slot recursion's running max and sum, or the slots' heap, carried from chunk to chunk:
    the same figures as over the whole level at once), up to its first unknown hold."""
    n = len(intended)
    out = np.zeros(n)
    if np.isnan(intended).any():
        return out  # a request with no place in the queue: the process's queue is unknown
    order = None if _ascending(intended) else np.argsort(intended, kind="stable")  # the runner's records: in order already
    x, carry, last_floor = -math.inf, 0.0, -math.inf  # one slot: the running max, the hold sum, the last floor
    free = [-math.inf] * share  # several: the slots' free times (a heap)
    for lo in range(0, n, CHUNK):
        at = slice(lo, min(n, lo + CHUNK)) if order is None else order[lo:lo + CHUNK]
        i, s, e, srv = intended[at], start[at], end[at], server_ended[at]
        unknown = np.isnan(s) | np.isnan(e) | (e < s)
        stop = bool(unknown.any())
        k = int(np.argmax(unknown)) if stop else len(i)  # replayed up to the first unknown hold
        i, s, e, srv = i[:k], s[:k], e[:k], srv[:k]
        hold = e - s
        floor = np.where(srv, -np.inf, e)  # a slot the client ended frees no earlier than its end
        if not k:
            break
        if share == 1:
            # admit_j = max(i_j, admit_{j-1} + hold_{j-1}, floor_{j-1}); with c_j = hold_0 + ... +
            # hold_{j-1}, x_j = admit_j - c_j = max(x_{j-1}, i_j - c_j, floor_{j-1} - c_j)
            sums = np.cumsum(np.concatenate(([carry], hold)))  # left to right from the carried sum
            c, carry = sums[:-1], float(sums[-1])
            prev = np.concatenate(([last_floor], floor[:-1]))
            last_floor = float(floor[-1])
            v = np.maximum(i - c, prev - c)
            v[0] = max(v[0], x)
            xs = np.maximum.accumulate(v)
            x = float(xs[-1])
            admit = xs + c
        else:
            admit = np.empty(k)
            for j, (ij, hj, fj) in enumerate(zip(i.tolist(), hold.tolist(), floor.tolist())):
                a = max(ij, heapq.heappop(free))
                admit[j] = a
                heapq.heappush(free, max(a + hj, fj))
        if order is None:
            out[lo:lo + k] = s - admit
        else:
            out[order[lo:lo + k]] = s - admit
        if stop:
            break
    return out


@dataclasses.dataclass(frozen=True)
class SlotReplay:
    """One capped level's replay (`level_replay`): per table of its records, the table, its row
    numbers (ascending) and each one's gain (actual send - replayed admit; 0: not replayed).
    Found by the table itself (`is`), not a map keyed by `id()`."""

    parts: tuple[tuple[RequestTable, np.ndarray, np.ndarray], ...]

    def col(self, t: RequestTable, idx: np.ndarray) -> np.ndarray:
        """The gain of rows `idx` of `t`, NaN where the row is none of the level's."""
        rows_idx = np.flatnonzero(idx) if idx.dtype == bool else idx  # a selection: its rows
        out = np.full(len(rows_idx), np.nan)
        got = next(((rows, gain) for held, rows, gain in self.parts if held is t), None)
        if got is None or not len(rows_idx):
            return out
        rows, gain = got
        pos = np.minimum(np.searchsorted(rows, rows_idx), max(len(rows) - 1, 0))
        hit = (rows[pos] == rows_idx) if len(rows) else np.zeros(len(rows_idx), dtype=bool)
        out[hit] = gain[pos[hit]]
        return out


def level_replay(warmup: Rows, records: Rows, cap: int, workers: object) -> SlotReplay:
    """The replay of a capped level's requests (its warm-up and its measured ones: the slots'
    holders), by table and row (see the module doc)."""
    recs = warmup + records
    parts = workers if type(workers) is int and workers >= 1 else 1
    worker = recs.ints("worker")
    srv = recs.map(lambda t, idx: np.logical_or.reduce([t.label_is("outcome", o, idx) for o in SERVER_ENDED]),
                   lambda r: r.get("outcome") in SERVER_ENDED, dtype=bool)
    gain = gains(np.where(worker == MISSING, -1, worker), recs.floats("intended_start"), recs.floats("start"),
                 recs.floats("end"), srv.astype(bool), cap, parts)
    by: list[tuple[RequestTable, list[np.ndarray], list[np.ndarray]]] = []
    at = 0
    for t, idx in recs.parts:
        held = next((b for b in by if b[0] is t), None)
        if held is None:
            held = (t, [], [])
            by.append(held)
        rows = np.flatnonzero(idx) if idx.dtype == bool else np.asarray(idx)  # row numbers as held (4 bytes)
        held[1].append(rows)
        held[2].append(gain[at:at + len(rows)])
        at += len(rows)
    out = []
    for t, rows, gs in by:
        r, g = np.concatenate(rows), np.concatenate(gs)
        order = np.argsort(r, kind="stable")
        out.append((t, r[order], g[order]))
    return SlotReplay(tuple(out))
