"""A backend's client.jsonl as the judge holds it: one column per field it reads, not rows.

The load generator samples its own health once a second for the whole soak
(`runner/clienthealth.py`): one line per process and second. Held as decoded JSON a sample
costs ~1.6 KB of memory (tracemalloc), ~140 MB a day whatever the request rate; as columns, 88
bytes. `ClientBuilder` takes the
rows one at a time, as verification decodes them, and keeps only what `client_healthy` reads
(judge/validity.py), as 8-byte floats (NaN: the row has no number there):

  t, start            the sample's window (epoch seconds; a row without a finite numeric `t`
                      is not kept)
  weight_s, lag_p99   the window's time weight and its event-loop lag p99
  lag_max, stall_s, tick_s, cpu, host_cpu
  held_s              worker-seconds the window's closed-loop workers waited at the backend's
                      backoff gate (absent before soakspec tallied it)
  process             the load process (an integer; 0 when the row has none)
  stalls              every stalled wake-up's lag, flat, with each sample's offset into them

and, not a column, the distinct wall-clock steps the rows' `wall_step_s` record (the wall clock
less the run clock: trace matching places traces across them, `steps`; a few floats).

A number is a JSON number that is not a boolean, as the row-by-row reading had it (an integer
is held as a float). The samples are in time order (stable: one time in file order), and the
judge's per-bucket figures read a window's samples back as Python values, in that order, so
they are exactly what the rows gave (tests/test_clienthealth_columns.py holds them equal).
"""

from __future__ import annotations

import dataclasses
import math
from array import array
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from soakspec.evidence.traces import WallSteps

__all__ = ["FIELDS", "SAMPLE_SPAN_S", "ClientBuilder", "ClientSamples", "build_client", "samples_of"]

FIELDS = ("t", "start", "weight_s", "lag_p99", "lag_max", "stall_s", "tick_s", "cpu", "host_cpu", "held_s")
SAMPLE_SPAN_S = 60.0  # no client.jsonl window is longer (runner/clienthealth.py writes one a second)


def _number(v: Any) -> float:
    """A sample's number as a float; NaN (absent) for anything else. Unlike `table.num`, an
    infinity is kept: client.jsonl is read as Python JSON, where `Infinity` parses, and an
    infinite lag must read as an unhealthy client (INCONCLUSIVE), never as a missing value a
    healthy window beside it could outvote."""
    if type(v) not in (int, float):
        return math.nan
    try:
        return float(v)
    except OverflowError:  # an integer beyond any float: not a measurement
        return math.nan


def _timed(row: Mapping[str, Any]) -> bool:
    """Has the row a time the samples can be ordered by (a finite number)?"""
    return math.isfinite(_number(row.get("t")))


def _some(v: float) -> bool:
    return v == v  # not NaN


@dataclasses.dataclass(frozen=True, eq=False)
class ClientSamples:
    """One backend's client-health samples, in time order, as columns (see the module doc)."""

    cols: Mapping[str, np.ndarray]  # FIELDS -> float64 (NaN: none)
    process: np.ndarray  # int64
    stall_off: np.ndarray  # int64, len + 1: sample i's stalls are stalls[stall_off[i]:stall_off[i + 1]]
    stalls: np.ndarray  # float64
    # the wall-clock steps the samples recorded (`soakspec.evidence.traces.WallSteps`): what trace
    # matching places a server's trace across
    steps: tuple[float, ...] = ()

    def __len__(self) -> int:
        return len(self.process)

    def __bool__(self) -> bool:
        return len(self) > 0

    def within(self, start: float, end: float) -> list[int]:
        """The samples whose window's midpoint lies in [start, end), in time order: found by
        bisection, so judging every bucket of a day-long soak stays linear."""
        t, st = self.cols["t"], self.cols["start"]
        lo = int(np.searchsorted(t, start, side="left"))
        hi = int(np.searchsorted(t, end + SAMPLE_SPAN_S, side="right"))
        out = []
        for i, (ti, si) in enumerate(zip(t[lo:hi].tolist(), st[lo:hi].tolist()), lo):
            if _some(si) and start <= (si + ti) / 2 < end:
                out.append(i)
        return out

    def covered(self, start: float, end: float) -> bool:
        """Does a sample's own window (its `start` to `t`) overlap [start, end)? A sample spans
        about a second, so a shorter bucket may hold none and still be measured. Only the
        samples ending after `start` are looked at."""
        t, st = self.cols["t"], self.cols["start"]
        lo = int(np.searchsorted(t, start, side="right"))
        return bool(np.any(st[lo:] < end))  # NaN compares false: a sample without a start is none

    def values(self, field: str, idx: list[int]) -> list[float]:
        """`field` of the samples `idx` that have a number there, in their order."""
        col = self.cols[field]
        return [v for v in col[idx].tolist() if _some(v)] if idx else []

    def pooled_lag_p99(self, idx: list[int]) -> float | None:
        """The time-weighted p99 of event-loop lag over the samples `idx`, pooled exactly: the
        smallest lag v such that wake-ups later than v cover at most 1 % of the windows' total
        weight. Lags at or below a sample's `stall_s` are not kept one by one: when the stalls
        do not reach 1 %, the answer is the largest window p99 capped at stall_s, an upper
        bound. None without usable samples."""
        c = self.cols
        use = [i for i in idx if _some(c["weight_s"][i]) and _some(c["lag_p99"][i])]
        total = sum(c["weight_s"][i] for i in use)
        if not use or total <= 0:
            return None
        stalls = []
        off = self.stall_off
        for i in use:
            tick = c["tick_s"][i]
            tick = float(tick) if _some(tick) and tick else 0.0
            stalls.extend((tick, x) for x in self.stalls[off[i]:off[i + 1]].tolist())
        stalls.sort(key=lambda p: -p[1])  # stable: equal lags in sample order
        acc = 0.0
        for tick, lag in stalls:
            acc += tick + lag
            if acc > 0.01 * total:
                return float(lag)
        caps = []
        for i in use:
            p99, cap = float(c["lag_p99"][i]), float(c["stall_s"][i])
            caps.append(min(p99, cap if _some(cap) and cap else p99))
        return max(caps)

    def mean_cpu_by_process(self, idx: list[int]) -> dict[int, float]:
        """Each load process's CPU over the samples `idx`, weighted by their windows' lengths."""
        c = self.cols
        acc: dict[int, list[tuple[float, float]]] = {}
        for i in idx:
            cpu, start, t = float(c["cpu"][i]), float(c["start"][i]), float(c["t"][i])
            if _some(cpu) and _some(start) and t > start:
                acc.setdefault(int(self.process[i]), []).append((cpu, t - start))
        return {p: sum(x * w for x, w in xs) / sum(w for _, w in xs) for p, xs in acc.items()}


class ClientBuilder:
    """`ClientSamples` of every backend, built a client.jsonl row at a time (no row held)."""

    def __init__(self) -> None:
        self._by: dict[str, _Backend] = {}

    def add(self, row: Any) -> None:
        if not isinstance(row, Mapping) or not isinstance(name := row.get("backend"), str) or not _timed(row):
            return
        b = self._by.get(name)
        if b is None:
            b = self._by[name] = _Backend()
        b.add(row)

    def finish(self) -> dict[str, ClientSamples]:
        return {name: b.finish() for name, b in self._by.items()}


def build_client(rows: Iterable[Any]) -> dict[str, ClientSamples]:
    """client.jsonl rows (of any backends) as each backend's samples."""
    b = ClientBuilder()
    for r in rows:
        b.add(r)
    return b.finish()


def samples_of(rows: Iterable[Mapping[str, Any]]) -> ClientSamples:
    """One backend's rows (their `backend` field not read) as its samples."""
    b = _Backend()
    for r in rows:
        if isinstance(r, Mapping) and _timed(r):
            b.add(r)
    return b.finish()


class _Backend:
    def __init__(self) -> None:
        self.cols = {f: array("d") for f in FIELDS}
        self.process = array("q")
        self.stall_off = array("q", [0])
        self.stalls = array("d")
        self.steps = WallSteps()

    def add(self, row: Mapping[str, Any]) -> None:
        self.steps.add(row.get("wall_step_s"))
        for f, col in self.cols.items():
            col.append(_number(row.get(f)))
        p = row.get("process")
        self.process.append(p if type(p) is int and -(2**63) <= p < 2**63 else 0)
        s = row.get("stalls")
        if isinstance(s, list):
            self.stalls.extend(v for x in s if (v := _number(x)) == v)
        self.stall_off.append(len(self.stalls))

    def finish(self) -> ClientSamples:
        t = np.frombuffer(self.cols["t"], dtype=np.float64) if len(self.process) else np.zeros(0)
        order = np.argsort(t, kind="stable")
        cols = {f: (np.frombuffer(c, dtype=np.float64) if len(c) else np.zeros(0))[order] for f, c in self.cols.items()}
        process = (np.frombuffer(self.process, dtype=np.int64) if len(self.process) else np.zeros(0, dtype=np.int64))[order]
        off = np.frombuffer(self.stall_off, dtype=np.int64)
        flat = np.frombuffer(self.stalls, dtype=np.float64) if len(self.stalls) else np.zeros(0)
        if not len(flat) or (order[1:] > order[:-1]).all():  # in time order already (as the runner writes)
            return ClientSamples(cols, process, off.copy(), flat.copy(), self.steps.steps())
        counts = (off[1:] - off[:-1])[order]
        stall_off = np.zeros(len(order) + 1, dtype=np.int64)
        np.cumsum(counts, out=stall_off[1:])
        stalls = np.concatenate([flat[off[i]:off[i + 1]] for i in order.tolist()])
        return ClientSamples(cols, process, stall_off, stalls, self.steps.steps())

