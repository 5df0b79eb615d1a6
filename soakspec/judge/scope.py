"""Scope instances: the run, a backend, a level, a phase, a turn, a bucket or a `per window` slice.

A phase is a level that carries a `phase` name (a workload's `load { phases { ... } }`): `per
phase` judges each such level, named by its phase in messages; levels without one are no
phase's (a run without phases has no phase instance, so the rule is inconclusive). A turn is
one user turn of a multi-turn chat level (`multi_turn = true`): `per turn` judges, per backend
and level, the requests that sent each turn of their sessions' conversations (their records'
`turn`); a level without multi-turn requests has no turn instance.

A rule is judged once per instance of its scope; `scopes(kind, backends, window_s)` lists them
in a fixed order (backends, levels, buckets). A `Scope` holds the measured requests it covers
and the bucket windows it spans (series metrics and rates read those), and says where it is
for messages (`where()`).
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from soakspec import windows
from soakspec.judge.index import BackendIndex, LevelIndex, Window, req_time
from soakspec.judge.table import MISSING, Rows


@dataclasses.dataclass(frozen=True)
class Scope:
    """One instance of a rule's scope: what it covers and where it is, for messages."""

    kind: str  # run | backend | level | phase | turn | bucket | window
    backends: tuple[BackendIndex, ...]
    # measured requests in the scope, time order; per-request columns of a scope are aligned:
    # `records.column(...)`, `records.map(...)` give one value per request, in this order
    records: Rows
    windows: tuple[tuple[BackendIndex, Window], ...]  # buckets (or the one window) in the scope
    level: LevelIndex | None = None
    bucket: int | None = None
    start: float | None = None
    end: float | None = None
    turn: int | None = None  # a `per turn` instance's user turn (from 1)

    @property
    def backend(self) -> str | None:
        return self.backends[0].name if len(self.backends) == 1 else None

    @property
    def wall_s(self) -> float | None:
        walls = [w.wall_s for _, w in self.windows]
        if not walls or any(w is None for w in walls):
            return None
        return math.fsum(walls)  # type: ignore[arg-type]

    def where(self) -> str:
        """`backend nccl, concurrency 8, bucket 1 [12:01:00-12:02:00 UTC]`."""
        if self.kind == "run":
            return "the whole run"
        parts = []
        if self.backend is not None:
            parts.append(f"backend {self.backend}")
        if self.level is not None:
            parts.append(self.level.label)
        if self.turn is not None:
            parts.append(f"turn {self.turn}")
        if self.bucket is not None:
            parts.append(f"{'window' if self.kind == 'window' else 'bucket'} {self.bucket}{clock_span(self.start, self.end)}")
        return ", ".join(parts)


def clock(t: float) -> str:
    return _dt.datetime.fromtimestamp(t, tz=_dt.timezone.utc).strftime("%H:%M:%S")


def clock_span(start: float | None, end: float | None) -> str:
    if start is None or end is None:
        return ""
    return f" [{clock(start)}-{clock(end)} UTC]"


def bucket_scope(bi: BackendIndex, lv: LevelIndex, w: Window) -> Scope:
    return Scope("bucket", (bi,), w.records, ((bi, w),), lv, w.index, w.start, w.end)


def level_scope(bi: BackendIndex, lv: LevelIndex, kind: str = "level") -> Scope:
    return Scope(kind, (bi,), lv.records, tuple((bi, w) for w in lv.buckets), lv, None, lv.measure_start, lv.measure_end)


def phase_of(lv: LevelIndex) -> str | None:
    """The level's phase name (its manifest entry's `phase`), or None."""
    p = lv.entry.get("phase")
    return p if isinstance(p, str) and p else None


def backend_scope(bi: BackendIndex) -> Scope:
    return Scope("backend", (bi,), bi.measured, tuple((bi, w) for lv in bi.levels for w in lv.buckets))


def run_scope(bis: Sequence[BackendIndex]) -> Scope:
    ws = tuple((bi, w) for bi in bis for lv in bi.levels for w in lv.buckets)
    recs = bis[0].measured if len(bis) == 1 else Rows(tuple(p for bi in bis for p in bi.measured.parts))
    return Scope("run", tuple(bis), recs, ws)


def rows_by_turn(records: Rows, cap: int | None = None) -> list[tuple[int, Rows]]:
    """The rows of each user turn of `records` (multi-turn chat: their records' `turn`), turns
    ascending, each turn's rows in their order in `records`; none where no request has a turn
    (read from the column alone: a single-turn table's is one repeated absent value). With
    `cap`, the turns past it are one entry, numbered cap + 1. Grouped by one stable sort a part,
    never a pass over the rows a turn: evidence of any number of distinct turns costs no more."""
    groups: dict[int, list[tuple[Any, np.ndarray]]] = {}
    for t, idx in records.parts:
        col = t.i["turn"]
        odd = t.odd(idx)
        if not len(odd) and len(col) and (col.strides == (0,) and int(col[0]) == MISSING):
            continue  # no request of this table has a turn
        v = np.asarray(col[idx], dtype=np.int64)
        for p in np.flatnonzero(np.isin(idx, odd)).tolist():  # a row whose value is not its column's (beyond int32)
            got = t.rec(int(idx[p])).get("turn")
            v[p] = got if type(got) is int and 1 <= got < 2**63 else MISSING
        if cap is not None:
            v[v > cap] = cap + 1
        order = np.argsort(v, kind="stable")
        sv = v[order]
        cuts = np.concatenate(([0], np.flatnonzero(sv[1:] != sv[:-1]) + 1, [len(sv)]))
        for a, b in zip(cuts[:-1].tolist(), cuts[1:].tolist()):
            k = int(sv[a])
            if k >= 1:
                groups.setdefault(k, []).append((t, idx[order[a:b]]))
    return [(k, Rows(groups[k])) for k in sorted(groups)]


def turn_scopes(bi: BackendIndex, lv: LevelIndex) -> list[Scope]:
    """A multi-turn level's turns: each the level's requests that sent that user turn, over the
    level's buckets and time (a turn's requests are spread over all of it)."""
    return [Scope("turn", (bi,), rows, tuple((bi, w) for w in lv.buckets), lv, None, lv.measure_start, lv.measure_end, turn=k)
            for k, rows in rows_by_turn(lv.records)]


def window_scopes(bi: BackendIndex, lv: LevelIndex, length: float) -> list[Scope]:
    """Fixed, non-overlapping windows of `length` from the level's measured start; the last one
    may be shorter. A request belongs to the window in which it started (qps and throughput
    count what completed in the window instead: `soakspec.judge.measures.delivered`)."""
    t0, t1 = lv.measure_start, lv.measure_end
    if t0 is None or t1 is None or length <= 0 or t1 <= t0:
        return []
    starts = windows.starts(t0, t1 - t0, length)  # as the runner cuts them (soakspec.windows)
    n = len(starts)
    out = []
    for k, (a, inside) in enumerate(zip(starts, window_rows(lv.records, starts, t1))):
        b = t1 if k == n - 1 else starts[k + 1]
        w = Window(k, a, b, b - a, inside)
        out.append(Scope("window", (bi,), inside, ((bi, w),), lv, k, a, b))
    return out


def window_rows(recs: Rows, starts: Sequence[float], end: float) -> list[Rows]:
    """The rows of each window (window k: the requests whose `req_time` lies in [starts[k],
    starts[k + 1]); the last window's also at `end`), in their order in `recs`, every part kept
    (empty or not, as `Rows.select` keeps them). The rows are cut once, by where each lies
    among the starts: a day-long level's thousands of windows each selected over every row
    of the level took minutes at 10^6 requests."""
    n = len(starts)
    bounds = np.asarray([*starts, end], dtype=np.float64)
    out: list[list[np.ndarray]] = [[] for _ in range(n)]
    for t, whole in recs.parts:
        cuts = _window_cuts(t, whole, bounds, end)
        if cuts is not None:  # the rows in time order (a level's, in the judge's order): views of them
            for j in range(n):
                out[j].append(whole[cuts[j]:cuts[j + 1]])
            continue
        pieces: list[list[np.ndarray]] = [[] for _ in range(n)]
        for a in range(0, len(whole), WINDOW_CHUNK):  # a chunk at a time: ~20 bytes a row while it is cut
            idx = whole[a:a + WINDOW_CHUNK]
            k = _window_of(t, idx, bounds, end)
            order = np.argsort(k, kind="stable")  # by window, each window's rows in their order
            at = np.searchsorted(k[order], np.arange(n + 1, dtype=np.int32), side="left")
            for j in np.flatnonzero(np.diff(at)).tolist():
                pieces[j].append(idx[order[at[j]:at[j + 1]]])
        for j in range(n):
            out[j].append(np.concatenate(pieces[j]) if len(pieces[j]) > 1 else pieces[j][0] if pieces[j] else whole[:0])
    return [Rows(tuple((t, sel) for (t, _), sel in zip(recs.parts, out[j]))) for j in range(n)]


WINDOW_CHUNK = 1 << 18  # rows of a level cut into windows at a time


def _window_of(t: Any, idx: np.ndarray, bounds: np.ndarray, end: float) -> np.ndarray:
    """Each row's window (`window_rows`), -1 for none."""
    n = len(bounds) - 1
    rt = t.req_time(idx)
    k = np.searchsorted(bounds, rt, side="right").astype(np.int32) - 1  # bounds[k] <= rt < bounds[k + 1] (NaN: past the end)
    k[rt == end] = n - 1  # the last window holds its end
    del rt
    k[(k >= n) | (k < 0)] = -1
    for p in np.nonzero(np.isin(idx, t.odd(idx)))[0].tolist():  # a row whose value is not its column's
        v = req_time(t.rec(int(idx[p])))
        k[p] = -1 if v is None or not bounds[0] <= v <= end else (n - 1 if v == end else int(np.searchsorted(bounds, v, side="right")) - 1)
    return k


def _window_cuts(t: Any, whole: np.ndarray, bounds: np.ndarray, end: float) -> np.ndarray | None:
    """Where each window's rows begin and end in `whole` (window j: cuts[j]:cuts[j + 1]) when
    they lie there in window order -- rows in no window only before or after all of them,
    as a level's rows in the judge's (time) order do -- else None. Read a chunk at a time:
    the windows are then views of `whole`, not copies of it (4 bytes a request, and as much
    again while they were cut: the 10^7 gate's peak in its `per window` rules)."""
    n = len(bounds) - 1
    counts = np.zeros(n, dtype=np.int64)
    lead, state, last = 0, 0, 0  # state: 0 before any window's row, 1 among them, 2 after them
    for a in range(0, len(whole), WINDOW_CHUNK):
        k = _window_of(t, whole[a:a + WINDOW_CHUNK], bounds, end)
        none = k < 0
        if state == 0:
            if none.all():
                lead += len(k)
                continue
            at = int(np.argmax(~none))
            lead += at
            k, none, state = k[at:], none[at:], 1
        if state == 1:
            stop = int(np.argmax(none)) if none.any() else len(k)
            if stop:
                mid = k[:stop]
                if int(mid[0]) < last or (len(mid) > 1 and bool((mid[1:] < mid[:-1]).any())):
                    return None
                counts += np.bincount(mid, minlength=n)
                last = int(mid[-1])
            if stop == len(k):
                continue
            k, none, state = k[stop:], none[stop:], 2
        if not none.all():  # a row in a window after rows in none
            return None
    return np.concatenate(([lead], lead + np.cumsum(counts)))


def scopes(kind: str, bis: Sequence[BackendIndex], window_s: float | None = None) -> list[Scope]:
    """Every instance of a scope kind, in a fixed order (backends, levels, buckets)."""
    if kind == "run":
        return [run_scope(bis)]
    out: list[Scope] = []
    for bi in bis:
        if kind == "backend":
            out.append(backend_scope(bi))
            continue
        for lv in bi.levels:
            if kind == "level":
                out.append(level_scope(bi, lv))
            elif kind == "phase":
                if phase_of(lv) is not None:
                    out.append(level_scope(bi, lv, "phase"))
            elif kind == "turn":
                out.extend(turn_scopes(bi, lv))
            elif kind == "bucket":
                out.extend(bucket_scope(bi, lv, w) for w in lv.buckets)
            elif kind == "window":
                out.extend(window_scopes(bi, lv, window_s or 0.0))
    return out
