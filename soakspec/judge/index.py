"""The evidence, arranged: requests by backend, level and bucket (pure, spec-free).

`index(evidence)` builds one `BackendIndex` per backend of the evidence: its levels as the
manifest lists them (`LevelIndex`), each level's buckets (`Window`, the wall-clock windows
the manifest records) with the measured requests that started in them, in time order; the
requests no listed level owns (orphans); the matched traces; the telemetry samples in time
order. A *measured* request is one with bucket >= 0 (not warm-up -1, not follow-up -2).

This is the one place that reads request rows into the judge's structure: scopes
(`soakspec.judge.scope`), measures (`soakspec.judge.measures`), rules and results.json all
read the index, never the raw rows.
"""

from __future__ import annotations

import dataclasses
import bisect
import functools
import math
from collections import Counter
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from soakspec.judge.evidence import BackendEvidence, Evidence
from soakspec.judge import table as table_module
from soakspec.judge.table import MISSING, RequestTable, Rows, fits, num, ordered  # noqa: F401  (num: read from here too)
from soakspec.units import format_duration

if TYPE_CHECKING:
    from soakspec.judge.capreplay import SlotReplay

Row = Mapping[str, Any]
FOLLOW_UP_BUCKET = -2  # the clean follow-up request after the last level
WARMUP_BUCKET = -1  # a request started during a level's warm-up


def req_time(r: Row) -> float | None:
    """When a request counts as started: its intended start (open loop), else its start."""
    t = num(r.get("intended_start"))
    return t if t is not None else num(r.get("start"))


def error_message(r: Row) -> str:
    """A request's error text, or what its outcome was when it has none."""
    err = r.get("error")
    return err if isinstance(err, str) and err else f"{r.get('outcome')} (no message)"


def order(r: Row) -> tuple:
    t = req_time(r)
    return (t if t is not None else math.inf, str(r.get("request_id")))


@dataclasses.dataclass(frozen=True)
class Window:
    """One bucket (or `per window` slice) of a level: its wall-clock window and its requests."""

    index: int
    start: float | None
    end: float | None
    planned_length_s: float | None
    records: Rows  # measured requests that started in it, in time order
    planned: bool = True  # listed in the manifest (False: only requests name it)

    @property
    def wall_s(self) -> float | None:
        if self.start is None or self.end is None:
            return None
        return max(0.0, self.end - self.start)


@dataclasses.dataclass(frozen=True)
class LevelIndex:
    backend: str
    workload: str
    index: int
    entry: Mapping[str, Any]
    label: str
    buckets: tuple[Window, ...]
    # a level under max_concurrency: its warm-up requests (bucket -1), not measured, but they
    # held its slots as the measured ones did (`judge/capproof.py` counts them in flight); an
    # open loop with a recorded schedule: its warm-up arrivals are the schedule's first ones
    # (`judge/schedproof.py` proves them); empty for any other level
    warmup: Rows = dataclasses.field(default_factory=Rows)

    @functools.cached_property
    def records(self) -> Rows:
        """The level's measured requests, bucket after bucket."""
        parts = [p for b in self.buckets for p in b.records.parts]
        if not parts:
            return Rows()
        if len({id(t) for t, _ in parts}) == 1:
            return Rows.of(parts[0][0], _joined([idx for _, idx in parts]))
        return Rows(parts)

    @functools.cached_property
    def slot_replay(self) -> SlotReplay:
        """A capped level's slot queue replayed as an on-time load generator would have driven
        it (`judge/capreplay.py`, warm-up included: it held the slots): what a failing ttft or
        latency is measured again with (`performance.lag_figure`). Made only when one asks,
        once per level."""
        from soakspec.judge.capreplay import level_replay

        return level_replay(self.warmup, self.records, self.entry["max_concurrency"], self.entry.get("workers"))

    @functools.cached_property
    def by_start(self) -> tuple[list[float], list[Window]]:
        """The buckets that have a start, in start order, and their starts (for a bisect)."""
        ws = sorted((w for w in self.buckets if w.start is not None), key=lambda w: w.start)  # type: ignore[arg-type,return-value]
        return [w.start for w in ws], ws  # type: ignore[misc]

    def started_between(self, start: float, end: float) -> Rows:
        """The measured requests of the buckets that start in [start, end)."""
        starts, ws = self.by_start
        picked = ws[bisect.bisect_left(starts, start): bisect.bisect_left(starts, end)]
        return Rows(tuple(p for w in picked for p in w.records.parts))

    @functools.cached_property
    def _windows_by_index(self) -> dict[int, Window]:
        out: dict[int, Window] = {}
        for w in self.buckets:
            out.setdefault(w.index, w)
        return out

    def window(self, bucket: int) -> Window | None:
        return self._windows_by_index.get(bucket)

    @functools.cached_property
    def not_sent(self) -> int:
        """The level's measured records of requests the load generator could not send (no
        `start`: its own limit, runner/fdlimit.py)."""
        return self.records.count(lambda t, idx: np.isnan(t.f["start"][idx]), lambda r: r.get("start") is None)

    @property
    def count_sent(self) -> tuple[int, int] | None:
        """A count-bounded level's (measured requests sent, requests_per_level asked); None for a
        level that runs for its duration. Counted from the records, not the manifest's
        `measured_sent`: a record that is not there was not measured, and one of a request that
        was never sent (no `start`) is not one of the n -- the runner's rule too
        (runner/load.py `counts_toward`), so a level whose client could not send some of its
        requests is short of its count, never "40 of 40"."""
        n = self.entry.get("requests_per_level")
        if type(n) is not int:
            return None
        return len(self.records) - self.not_sent, n

    @property
    def ended_by_count(self) -> bool:
        """A count-bounded level that its count ended: its measured window ends with its last
        request, the buckets after it were never meant to run (not a level cut short). Its n
        requests sent; or n recorded, some never sent, where the runner says its count ended it
        (`ended_by`): an open loop's count is its schedule's first n arrivals, sent or not (a
        closed loop sends another for one it could not send; a runner before that counted
        them). Either way fewer than n sent is short of the count (`count_sent`): never a pass."""
        c = self.count_sent
        if c is None or self.entry.get("completed") is not True:
            return False
        return c[0] >= c[1] or (c[0] + self.not_sent >= c[1] and self.entry.get("ended_by") in ("count", "min_duration"))

    @property
    def ended_by(self) -> str:
        """What ended a count-bounded level, read from its records: `min_duration` where it sent
        more than its count under a `min_duration_s` (only a min_duration sends past N: LoadGen's
        min_query_count and min_duration), `count` where its count ended it, else `duration`
        (its bound came first, or it was cut short: not complete). The runner's rule too
        (runner/load.py `LevelRun.ended_by`)."""
        if not self.ended_by_count:
            return "duration"
        c = self.count_sent
        return "min_duration" if c is not None and c[0] > c[1] and num(self.entry.get("min_duration_s")) is not None else "count"

    @property
    def measure_start(self) -> float | None:
        return num(self.entry.get("measure_start"))

    @property
    def measure_end(self) -> float | None:
        return num(self.entry.get("measure_end"))

    @property
    def key(self) -> tuple[str, int]:
        return (self.workload, self.index)


class SpanIndex:
    """Where to look for the requests whose start lies in [lo, hi), without a start-order
    index of its own: the backend's every request in the judge's order (`table.ordered`:
    by req_time -- an open loop's intended start, else the start -- absent last), which the
    join already holds, with every FENCE-th request's req_time beside it, and the range of
    start - req_time over the table (0 for a closed loop, whose req_time is its start; an open
    loop's schedule lag otherwise). A request whose start is in [lo, hi) has its req_time in
    [lo - lag_max, hi - lag_min), so `between(lo, hi)` reads only that stretch of the order
    and keeps the rows whose start is in [lo, hi) (in the judge's order: every reader sums
    or counts them). `longest` is the longest end - start (an absent end: the start). Held:
    the fence (8 bytes every FENCE requests); a sorted copy of the starts or a second order
    (4-24 bytes a request while built) was the report's 10^7 peak."""

    FENCE = 256

    def __init__(self, table: RequestTable | None, order: np.ndarray | None = None) -> None:
        self.table = table
        if table is None or table.n == 0:
            self.order, self.fence = np.zeros(0, dtype=np.int32), np.zeros(0)
            self.longest = self.lag_min = self.lag_max = 0.0
            return
        self.order = table_module.ordered(table) if order is None else order
        s, e = table.f["start"], table.f["end"]
        longest, lags = 0.0, []
        for a in range(0, table.n, table_module.SCAN_CHUNK):  # row order, a chunk at a time: no full-length temporaries
            b = min(table.n, a + table_module.SCAN_CHUNK)
            sa = s[a:b]
            d = e[a:b] - sa
            d = d[~np.isnan(d)]
            if len(d):
                longest = max(longest, float(d.max()))
            with np.errstate(over="ignore"):  # the table's times are finite; a difference of two near 1e308 is not
                lag = sa - table.req_time(slice(a, b))  # NaN only where start is absent (req_time is start then)
            lag = lag[~np.isnan(lag)]
            if len(lag):
                lags.append((float(lag.min()), float(lag.max())))  # +-inf: between() then reads the whole order
        self.longest = longest
        self.lag_min = min((lo for lo, _ in lags), default=0.0)
        self.lag_max = max((hi for _, hi in lags), default=0.0)
        self.fence = self._keys(self.order[::self.FENCE])

    def _keys(self, rows: np.ndarray) -> np.ndarray:
        return table_module.order_keys(self.table, rows)  # type: ignore[arg-type]

    def _first_at_least(self, x: float) -> int:
        """The position in the order of the first req_time >= x (numpy's searchsorted, side left)."""
        k = int(np.searchsorted(self.fence, x, side="left"))  # fence[k - 1] < x <= fence[k]
        lo, hi = max(0, (k - 1) * self.FENCE), min(len(self.order), k * self.FENCE + 1)
        return lo + int(np.searchsorted(self._keys(self.order[lo:hi]), x, side="left"))

    def between(self, lo: float, hi: float) -> np.ndarray:
        """The rows whose start is in [lo, hi), in the judge's order."""
        # a req_time of a start in [lo, hi) lies in [lo - lag_max, hi - lag_min) up to the rounding
        # of start - req_time and of these bounds: a few ulps more, then the exact test on start
        slack = 4 * (math.ulp(max(abs(lo), abs(hi))) + math.ulp(max(abs(self.lag_min), abs(self.lag_max))))
        a = self._first_at_least(lo - self.lag_max - slack)
        b = self._first_at_least(hi - self.lag_min + slack)
        rows = self.order[a:b]
        if not len(rows):
            return rows
        s = self.table.f["start"][rows]  # type: ignore[union-attr]
        return rows[(s >= lo) & (s < hi)]


@dataclasses.dataclass(frozen=True)
class BackendIndex:
    evidence: BackendEvidence
    levels: tuple[LevelIndex, ...]
    orphans: Rows  # measured requests whose level the manifest does not list
    all_records: Rows  # every request of the backend (warm-up and follow-up too), in time order
    samples: tuple[Row, ...]  # telemetry rows in time order
    recorded: Mapping[tuple[Any, Any], int]  # (workload, level) -> requests recorded (warm-up too, no follow-up)
    table: RequestTable | None = None  # the backend's requests, as columns

    @property
    def name(self) -> str:
        return self.evidence.name

    @functools.cached_property
    def sample_times(self) -> np.ndarray:
        """The telemetry samples' times (float64, ascending, as `samples`)."""
        return np.fromiter((float(s["t"]) for s in self.samples), dtype=np.float64, count=len(self.samples))

    def samples_between(self, start: float, end: float) -> tuple[Row, ...]:
        """The telemetry samples with start <= t < end, in time order: found by bisection (a
        day-long soak has ~17,000 samples and ~1,400 buckets; scanning them all per bucket
        made a telemetry rule quadratic in the soak's length)."""
        ts = self.sample_times
        return self.samples[int(np.searchsorted(ts, start, side="left")):int(np.searchsorted(ts, end, side="left"))]

    @functools.cached_property
    def measured(self) -> Rows:
        parts = [p for lv in self.levels for p in lv.records.parts] + list(self.orphans.parts)
        if not parts:
            return Rows()
        t = parts[0][0]
        every = self.all_records.parts
        if len(every) == 1 and every[0][0] is t and all(pt is t for pt, _ in parts):
            # every request is in all_records, already in the judge's order: keep those measured
            # (a mask and the kept row numbers; sorting them again made ~28 bytes a request)
            keep = np.zeros(t.n, dtype=bool)
            for _, idx in parts:
                keep[idx] = True
            order = every[0][1]
            held = [r for r in (*(lv.records for lv in self.levels), self.orphans) if len(r)]
            if len(held) == 1 and len(held[0].parts) == 1 and _follows(held[0].parts[0][1], order, keep):
                # one selection holds every measured row, already in that order (one level: the
                # usual run): that selection itself, memo and all (a copy was 4 bytes a request)
                return held[0]
            return Rows.of(t, order[keep[order]])
        return Rows.of(t, ordered(t, np.concatenate([idx for _, idx in parts])))

    @property
    def columnar_traces(self) -> bool:
        """The judge matched this backend's traces itself (`rederive`): they are a column."""
        return self.table is not None and "trace" in self.table.c

    def traced_mask(self, t: RequestTable, idx: np.ndarray) -> np.ndarray:
        """Which rows (of `idx`) have a matched trace."""
        if self.columnar_traces:
            return t.traced(idx)
        traced = self.traced
        return np.fromiter((t.ids[i] in traced for i in idx.tolist()), dtype=bool, count=len(idx))

    @functools.cached_property
    def traced(self) -> frozenset[str]:
        """Request ids with a matched trace."""
        if self.columnar_traces:
            t = self.table
            assert t is not None
            return frozenset(t.ids[i] for i in np.nonzero(t.traced(slice(None)))[0].tolist())
        return _traces(self.evidence)[0]

    @functools.cached_property
    def payloads(self) -> Mapping[str, tuple[Mapping[str, Any], ...]]:
        """Request id -> its matched traces' payloads (the fields rules read)."""
        if self.columnar_traces:
            from soakspec.judge.tracematch import payloads_of

            t = self.table
            assert t is not None
            out: dict[str, tuple[Mapping[str, Any], ...]] = {}
            for i in np.nonzero(t.traced(slice(None)))[0].tolist():
                if ps := payloads_of(t, i):
                    out[t.ids[i]] = out.get(t.ids[i], ()) + ps if t.ids[i] in out else ps
            return out
        return _traces(self.evidence)[1]

    def terminal_reasons(self, records: Rows) -> dict[str, int]:
        """terminal_reason (else finish_reason, else "unknown") of every matched trace of
        `records`, counted."""
        from soakspec.judge.tracematch import payloads_of

        c: Counter[str] = Counter()
        if not self.columnar_traces:
            for rid in records.ids():
                for p in self.payloads.get(rid, ()):
                    reason = p.get("terminal_reason", p.get("finish_reason"))
                    c[str(reason) if reason is not None else "unknown"] += 1
            return dict(sorted(c.items()))
        for t, idx in records.parts:
            multi = t.aux.get("trace_multi", {})
            codes = t.c["trace"][idx]
            for code, n in enumerate(np.bincount(codes, minlength=len(t.values["trace"])).tolist()):
                v = t.values["trace"][code]
                if n and isinstance(v, tuple):
                    p = dict(v)
                    reason = p.get("terminal_reason", p.get("finish_reason"))
                    c[str(reason) if reason is not None else "unknown"] += n
            here = set(idx.tolist()) if multi else set()
            for i in [i for i in multi if i in here]:
                v = t.values["trace"][t.c["trace"][i]]
                if isinstance(v, tuple):  # counted once above: count all of its payloads instead
                    p = dict(v)
                    reason = p.get("terminal_reason", p.get("finish_reason"))
                    c[str(reason) if reason is not None else "unknown"] -= 1
                for p in payloads_of(t, i):
                    reason = p.get("terminal_reason", p.get("finish_reason"))
                    c[str(reason) if reason is not None else "unknown"] += 1
        return dict(sorted((k, v) for k, v in c.items() if v))

    @functools.cached_property
    def spans(self) -> SpanIndex:
        """Where the requests whose start lies in a window are: what `in_flight` integrates and
        `delivered` counts, found in the order `all_records` already holds."""
        parts = self.all_records.parts
        one = len(parts) == 1 and parts[0][0] is self.table and self.table is not None and len(parts[0][1]) == self.table.n
        return SpanIndex(self.table, parts[0][1] if one else None)

    @property
    def trace_source(self) -> str:
        ts = self.evidence.entry.get("trace_source")
        return ts if isinstance(ts, str) else "none"


def scheduled(entry: Mapping[str, Any]) -> bool:
    """Whether a level's manifest entry records the open-loop schedule it sent on
    (`judge/schedproof.py` proves its records against it)."""
    return isinstance(entry.get("schedule"), Mapping)


def scheduled_in(lv: LevelIndex, w: Window) -> float | None:
    """What an open loop with a recorded schedule offered in bucket `w`, per second: the
    arrivals its schedule put in the bucket (each has its record in the bucket it was due in,
    sent, held back or never sent alike; `judge/schedproof.py` proves the records are exactly
    the schedule, and a run where they are not is INCONCLUSIVE) over the bucket's wall time.
    A seeded Poisson schedule at 40 rps puts 36 in one second and 44 in the next: the nominal
    rate, held against what a bucket achieved, reads the one as a client short of its offer.
    None without a recorded schedule (the nominal rate is all there is), for a bucket without a
    window, and for the last bucket of a level its count ended (its window runs to the drain,
    after its last arrival)."""
    wall = w.wall_s
    if not scheduled(lv.entry) or not wall or (lv.ended_by_count and w is lv.buckets[-1]):
        return None
    return len(w.records) / wall


def capped(entry: Mapping[str, Any]) -> bool:
    """Whether a level's manifest entry declares max_concurrency (an int; anything else is no
    cap): where its requests may wait for a slot, its times from the send (`sent_ttft`,
    `sent_latency`) have figures of their own and say what they leave out, its warm-up is kept
    (`judge/capproof.py`), `schedule_lag` counts from `admitted`, and a failing ttft or latency
    is measured again with its slot queue replayed as an on-time client would have driven it,
    not from the send (`performance.lag_figure`, `judge/capreplay.py`: the cap's own wait
    kept, the queue the client's lateness built taken out). The one test for it: the
    judge, compare and the reports all read a cap through this."""
    return type(entry.get("max_concurrency")) is int


def level_label(entry: Mapping[str, Any], with_workload: bool = False) -> str:
    """`concurrency 8`, `rate 2 rps`, `concurrency 4 (batches of 8)` -- as the plan prints it."""
    mode = entry.get("mode")
    shape = entry.get("shape")
    if isinstance(entry.get("label"), str) and (entry.get("phase") or isinstance(shape, Mapping) and shape.get("kind") == "replay"):
        text = entry["label"]  # a phase (`phase burst, rate 40 rps`) or a replay: the plan's own label
    elif mode == "open":
        rate = num(entry.get("rate"))
        text = f"rate {rate:g} rps" if rate is not None else "rate ?"
        cap = entry.get("max_concurrency")
        if type(cap) is int:  # the plan's label (`plan.shape_label`) names a declared cap
            text += f", max_concurrency {cap}"
    elif mode == "batch":
        text = f"concurrency {entry.get('concurrency')} (batches of {entry.get('batch_requests')})"
    else:
        text = f"concurrency {entry.get('concurrency')}"
    count = entry.get("requests_per_level")
    if type(count) is int and not entry.get("phase"):  # the plan's label names a level's count
        text += f", {count} requests"
        least = entry.get("min_duration_s")
        if isinstance(least, int | float) and not isinstance(least, bool):  # and its min_duration (`plan.shape_label`)
            text += f", min_duration {format_duration(least)}"
    if with_workload:
        return f"{entry.get('workload')} / {text}"
    return text


def _level_entries(be: BackendEvidence) -> list[Mapping[str, Any]]:
    lv = be.entry.get("levels")
    return [e for e in lv if isinstance(e, Mapping)] if isinstance(lv, list) else []



def _level_of(t: RequestTable, keys: list[tuple[Any, Any]]) -> np.ndarray:
    """Per request of `t`: the position in `keys` of its (workload, level), -1 for none -- in
    the smallest signed integer that holds them (a byte a request for up to 127 levels), made
    a chunk of rows at a time (the whole table's masks were 4 bytes a request beside it)."""
    dtype = np.int8 if len(keys) < 2**7 else np.int16 if len(keys) < 2**15 else np.int32
    pos = np.full(t.n, -1, dtype=dtype)
    first: dict[tuple[Any, Any], int] = {}
    for k, key in enumerate(keys):
        first.setdefault((type(key[0]).__name__, key[0], type(key[1]).__name__, key[1]), k)
    lvl = t.i["level"]
    wanted = [(wv, MISSING if lv_ is None else lv_, k) for (wt, wv, lt, lv_), k in first.items()
              if lt in ("int", "NoneType") and (lv_ is None or fits(lv_))]
    for a in range(0, t.n, table_module.SCAN_CHUNK):
        part = slice(a, min(t.n, a + table_module.SCAN_CHUNK))
        got, lv_part = pos[part], lvl[part]
        for wv, lv_, k in wanted:
            got[(got < 0) & t.label_is("workload", wv, part) & (lv_part == lv_)] = k
    for i in t.odd_rows.tolist():  # rows whose workload or level is not a plain value
        r = t.rec(i)
        w, lv_ = r.get("workload"), r.get("level")
        pos[i] = next((k for k, key in enumerate(keys) if key == (w, lv_) and type(key[1]) is type(lv_)), -1)
    return pos


def _joined(parts: list[np.ndarray]) -> np.ndarray:
    """`parts` end to end: when they are consecutive slices of one array (a level's buckets,
    cut from one bucket-sorted array by `_by_bucket`), that array's slice -- a view, no copy
    (4 bytes a request for every level otherwise); else a concatenation."""
    base = parts[0].base
    if isinstance(base, np.ndarray) and base.ndim == 1 and all(
            p.base is base and p.dtype == base.dtype and p.strides == base.strides for p in parts):
        size = base.itemsize
        at = (parts[0].__array_interface__["data"][0] - base.__array_interface__["data"][0]) // size
        pos = at
        for p in parts:
            if (p.__array_interface__["data"][0] - base.__array_interface__["data"][0]) // size != pos:
                break
            pos += len(p)
        else:
            return base[at:pos]
    return np.concatenate(parts)


def _by_bucket(t: RequestTable, idx: np.ndarray) -> dict[int, np.ndarray]:
    """`idx` (in order) grouped by bucket, each group in the same order: views of `idx` itself
    when its buckets never go down (rows in time order nearly always are: a request's bucket is
    the one it started in), else of a stable regrouping of it."""
    if not len(idx):
        return {}
    col = t.i["bucket"]
    cuts: list[np.ndarray] = []  # positions where the bucket changes, a slice at a time
    step = table_module.SCAN_CHUNK
    for a in range(0, len(idx), step):
        b = col[idx[a:a + step + 1]]
        d = b[1:] != b[:-1]
        if (b[1:] < b[:-1]).any():  # out of bucket order: group a stable sort of every row
            b = col[idx]
            o = np.argsort(b, kind="stable")
            idx, bs = idx[o], b[o]
            del o, b
            at = np.nonzero(bs[1:] != bs[:-1])[0] + 1
            starts = [0, *at.tolist()]
            return {int(bs[s]): idx[s:e] for s, e in zip(starts, [*at.tolist(), len(idx)])}
        cuts.append(np.nonzero(d)[0] + a + 1)
    at = np.concatenate(cuts).tolist()
    starts = [0, *at]
    return {int(col[idx[s]]): idx[s:e] for s, e in zip(starts, [*at, len(idx)])}


def _windows(e: Mapping[str, Any], t: RequestTable, idx: np.ndarray) -> tuple[Window, ...]:
    """The level's buckets: those the manifest lists (first listing wins), then any that only
    requests name, in bucket order."""
    by_bucket = _by_bucket(t, idx)
    empty = idx[:0]
    windows = []
    listed = set()
    for bk in e.get("buckets") or []:
        if not isinstance(bk, Mapping) or not isinstance(bk.get("index"), int):
            continue
        i = bk["index"]
        if i in listed:
            continue
        listed.add(i)
        windows.append(Window(i, num(bk.get("start")), num(bk.get("end")), num(bk.get("planned_length_s")),
                              Rows.of(t, by_bucket.get(i, empty))))
    for i in sorted(set(by_bucket) - listed):
        windows.append(Window(i, None, None, None, Rows.of(t, by_bucket[i]), planned=False))
    windows.sort(key=lambda w: w.index)
    return tuple(windows)


def recorded(t: RequestTable) -> dict[tuple[Any, Any], int]:
    """(workload, level) -> requests recorded, warm-up too, no follow-up."""
    out: Counter = Counter()
    by_key: Counter = Counter()
    step = table_module.SCAN_CHUNK  # the keys and their sort stay a few MB at any size (2^20 rows: ~40 MB)
    for a in range(0, t.n, step):
        keep = t.clean(np.nonzero(t.i["bucket"][a:a + step] != FOLLOW_UP_BUCKET)[0] + a)
        if not len(keep):
            continue
        # one int64 key a request (workload code, level): a 1-D unique (axis=1 was ~60 s at 10^7)
        key = (t.c["workload"][keep].astype(np.int64) << 32) | (t.i["level"][keep].astype(np.int64) - MISSING)
        keys, n = np.unique(key, return_counts=True)
        for k, c in zip(keys.tolist(), n.tolist()):
            by_key[k] += c
    for k in sorted(by_key):  # in key order, as one unique over every request gave them
        wc, lv = k >> 32, (k & 0xFFFFFFFF) + MISSING
        out[(t.values["workload"][wc], None if lv == MISSING else lv)] += by_key[k]
    odd = t.odd_rows  # filtered themselves: every row's number made first was 8 bytes a request, the join's peak at 10^7
    for i in odd[t.i["bucket"][odd] != FOLLOW_UP_BUCKET].tolist():
        r = t.rec(i)
        out[(r.get("workload"), r.get("level"))] += 1
    return dict(out)


def _traces(be: BackendEvidence) -> tuple[frozenset[str], dict[str, tuple[Mapping[str, Any], ...]]]:
    """Request ids with a matched trace, and each one's trace payloads."""
    traced: set[str] = set()
    payloads: dict[str, list[Mapping[str, Any]]] = {}
    for t in be.traces.rows():  # the rows themselves, read again if they are not held
        rid = t.get("request_id")
        if t.get("matched") is True and isinstance(rid, str):
            traced.add(rid)
            p = t.get("payload", t.get("trace"))
            if isinstance(p, Mapping):
                payloads.setdefault(rid, []).append(p)
    return frozenset(traced), {k: tuple(v) for k, v in payloads.items()}


def _follows(idx: np.ndarray, order: np.ndarray, keep: np.ndarray) -> bool:
    """Whether `idx` is `order[keep[order]]` (the rows `keep` marks, in `order`'s order),
    compared a chunk of `order` at a time (that array never made)."""
    at = 0
    for part in table_module.slices(order):
        got = part[keep[part]]
        if not np.array_equal(got, idx[at:at + len(got)]):
            return False
        at += len(got)
    return at == len(idx)


def index_backend(be: BackendEvidence) -> BackendIndex:
    entries = _level_entries(be)
    workloads = {e.get("workload") for e in entries}
    t = be.requests
    keys = [(e.get("workload"), e.get("index")) for e in entries]
    # row numbers in 4 bytes: every selection of a scope (buckets, levels, the backend) is made from
    # these (sorted before the per-request level and bucket test are made: not held beside the sort)
    everyone = ordered(t)
    everyone.flags.writeable = False  # the levels' rows are views of it (`table.kept`): never changed in place
    pos = _level_of(t, keys)
    bucket = t.i["bucket"]
    levels = []
    for k, e in enumerate(entries):
        first = next(j for j, key in enumerate(keys) if key == keys[k] and type(key[1]) is type(keys[k][1]))
        sel = table_module.kept(everyone, lambda rows: (pos[rows] == first) & (bucket[rows] >= 0))  # a view of it, nearly always
        # a capped level's warm-up held its slots (judge/capproof.py), a scheduled one's was sent
        # on its schedule (judge/schedproof.py); no other level needs it kept
        warm = (table_module.kept(everyone, lambda rows: (pos[rows] == first) & (bucket[rows] == WARMUP_BUCKET))
                if capped(e) or scheduled(e) else everyone[:0])
        levels.append(
            LevelIndex(be.name, str(e.get("workload")), int(e.get("index", 0)) if isinstance(e.get("index"), int) else 0,
                       e, level_label(e, len(workloads) > 1), _windows(e, t, sel), Rows.of(t, warm))
        )
    orphans = table_module.kept(everyone, lambda rows: (pos[rows] < 0) & (bucket[rows] >= 0))
    del pos  # (a request's level: a byte a request for up to 127 levels, not held past here)
    samples = sorted((s for s in be.telemetry if num(s.get("t")) is not None), key=lambda s: float(s["t"]))
    return BackendIndex(
        be, tuple(levels), Rows.of(t, orphans), Rows.of(t, everyone),
        tuple(samples), recorded(t), t,
    )


def index(evidence: Evidence) -> tuple[BackendIndex, ...]:
    """One `BackendIndex` per backend of the evidence, in the evidence's order."""
    return tuple(index_backend(b) for b in evidence.backends)
