"""Trace matching over a request table, streamed: `match_table(table, traces, ...)`.

The same rule as `soakspec.evidence.traces.match_traces` (a trace matches the first request,
in record order, that carries its id in one of the id forms -- or as its `server_id` -- and
whose window [start - w, end + w] holds all of the trace's times), computed without a map of
every id form of every request and without holding the traces: each trace is matched as it
is read and only what the judge keeps of it stays (`TableMatch`): per request, the payload
fields rules read, and per claimed request the reason a trace for it did not match.

A chunk's trace ids are looked up at once by `IdIndex.find_affixed` (shared with the runner's
matching; for the runner's ids a table indexed by their numbers, ~4 bytes a request, else a
sorted array of the ids' hashes with their rows, 8 -- not a map of every id: at 10^7 requests
40 or 80 MB rather than ~1 GB): for the runner's ids (a stem and a
number, `IdColumn` numbered) a trace id is read as an id form's prefix, a stem, its digits and
the form's suffix, no id made as text; for other ids an id form is inverted (`cmpl-{id}` ->
the id between `cmpl-` and the end) only for a trace id whose length some request id's could
give (`IdForms`), and the ids so found are looked up. Forms
that are not a literal prefix, `{id}` and a literal suffix are handled by `match_traces`
itself (`invertible`). Traces are taken `MATCH_CHUNK` at a time --
one vectorized lookup and window check a chunk -- from `match_rows`' tuples
(`soakspec.evidence.traces.scan_rows` yields them as it reads server.log) or from `Trace`s
(`match_table`).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from soakspec.evidence.traces import id_form_affixes
from soakspec.lang.parser import gc_paused
from soakspec.evidence.ids import IdIndex
from soakspec.judge.table import RequestTable

_EPOCH_MAX = 4_102_444_800.0  # as soakspec.evidence.traces: a time beyond 2100 is no time
JUDGED_PAYLOAD_KEYS = ("terminal_reason", "finish_reason", "status")


_affixes = id_form_affixes  # (prefix, suffix) of an id form, or None (evidence/traces.py)


def invertible(id_forms: Sequence[str]) -> bool:
    return all(_affixes(f) is not None for f in id_forms)


NO_PAYLOAD = False  # the `trace` label of a request matched by a trace without a payload
_ABSENT = object()  # a judged payload key the payload does not have

MATCH_CHUNK = 4096  # traces matched at a time (one vectorized id lookup and window check each)


class TableMatch:
    """What the judge keeps of matching, per row of the table: `codes[i]` (0: no matched
    trace; else 1 + the position in `values` of its first matched trace's kept payload:
    NO_PAYLOAD or the payload's kept items), `extra` (rows with more than one matched trace:
    every kept payload, None for one without), and for ids a trace carried without matching,
    why (the last such trace's reason, as `match_traces` reports it). `row_of(id)`: the first
    row with that request id (`rows_of(ids)`: of each, -1 for none)."""

    def __init__(self, n: int, index: IdIndex) -> None:
        self.codes = np.zeros(n, dtype=np.uint8)  # a byte a request while there are < 256 codes (`fit`)
        self.values: list[Any] = []
        self._index: dict[Any, int] = {}
        self._by_get: dict[tuple[Any, ...], int] = {}
        self.extra: dict[int, list[Mapping[str, Any] | None]] = {}
        self.unmatched_reason: dict[str, str] = {}
        self.stepped: dict[float, int] = {}  # traces matched across a recorded wall-clock step, by step
        self.ids = index
        self.traces = 0
        # the rows of each request id recorded more than once (`IdIndex.repeated`), found once
        # here, where the index is at hand: the duplicate-id rule reads them (`aux["repeated"]`)
        # instead of building a second index of every id (8 bytes a request) beside the join
        self.repeated: list[list[int]] = []

    def row_of(self, rid: Any) -> int | None:
        return self.ids.first(rid)

    def rows_of(self, rids: Sequence[Any]) -> np.ndarray:
        return self.ids.first_many(rids)

    def code(self, p: Mapping[str, Any] | None) -> int:
        key: Any = NO_PAYLOAD if p is None else tuple(p.items())
        try:
            c = self._index.get(key)
            if c is None:
                c = self._index[key] = len(self.values) + 1
                self.values.append(key)
        except TypeError:  # an unhashable value: its own code
            self.values.append(tuple(p.items()) if p is not None else NO_PAYLOAD)
            c = len(self.values)
        return c

    def payload_code(self, p: Any) -> int:
        """`code(kept_payload(p))` for a trace's whole payload `p` (None: a trace without one),
        one dict lookup for a content seen before."""
        if type(p) is not dict and not isinstance(p, Mapping):
            return self.code(None)
        got = (p.get("terminal_reason", _ABSENT), p.get("finish_reason", _ABSENT), p.get("status", _ABSENT))
        try:
            c = self._by_get.get(got)
        except TypeError:  # an unhashable value: its own code, as `code` gives it
            return self.code(dict((k, p[k]) for k in JUDGED_PAYLOAD_KEYS if k in p))
        if c is None:
            c = self._by_get[got] = self.code(dict((k, p[k]) for k in JUDGED_PAYLOAD_KEYS if k in p))
        return c

    def payload(self, c: int) -> Mapping[str, Any] | None:
        v = self.values[c - 1]
        return None if v is NO_PAYLOAD else dict(v)

    def add(self, i: int, p: Mapping[str, Any] | None) -> None:
        self.add_code(i, self.code(p))

    def fit(self, c: int) -> None:
        """Make room for code `c`: the codes widen to int32 from the 256th kept payload on."""
        if c > 255 and self.codes.dtype == np.uint8:
            self.codes = self.codes.astype(np.int32)

    def add_code(self, i: int, c: int) -> None:
        self.fit(c)
        if self.codes[i] == 0:
            self.codes[i] = c
        else:
            self.extra.setdefault(i, [self.payload(int(self.codes[i]))]).append(self.payload(c))

    def kept_of(self, i: int) -> list[Mapping[str, Any] | None]:
        """Every kept payload of row i (None for a trace without one); [] when unmatched."""
        if i in self.extra:
            return list(self.extra[i])
        c = int(self.codes[i])
        return [self.payload(c)] if c else []

    @property
    def kept(self) -> dict[int, list[Mapping[str, Any] | None]]:
        """row -> its kept payloads, for every matched row (built when asked)."""
        return {i: self.kept_of(i) for i in np.nonzero(self.codes)[0].tolist()}


def kept_payload(p: Any, shared: dict[Any, Mapping[str, Any]]) -> Mapping[str, Any] | None:
    """The payload fields rules read, one shared object per distinct content."""
    if not isinstance(p, Mapping):
        return None
    kept = tuple((k, p[k]) for k in JUDGED_PAYLOAD_KEYS if k in p)
    try:
        return shared.setdefault(kept, dict(kept))
    except TypeError:  # an unhashable value: not shared
        return dict(kept)


def match_table(table: RequestTable, traces: Iterable[Any], id_forms: Sequence[str], window_s: float,
                steps: Sequence[float] = ()) -> TableMatch:
    """Match `traces` (`soakspec.evidence.traces.Trace`, any iterable: consumed once) to the
    rows of `table` by request id (see the module doc). Requires `invertible(id_forms)`."""
    return match_rows(table, ((t.trace_id, t.times, t.payload) for t in traces), id_forms, window_s, steps)


def match_rows(table: RequestTable, rows: Iterable[tuple[Any, ...]], id_forms: Sequence[str], window_s: float,
               steps: Sequence[float] = ()) -> TableMatch:
    """`match_table` over traces given as tuples that start `(trace_id, times, payload)`
    (`soakspec.evidence.traces.scan_rows` yields them: no object per trace). A chunk of traces
    at a time: their candidate ids are looked up at once (`IdIndex`), their windows checked at
    once, and each is then taken in order, as one at a time would be. The cyclic garbage
    collector is paused meanwhile: a trace's few short-lived objects form no cycles, and each
    collection would walk every object the judge holds (a third of the matching's time).
    `steps`: the run's recorded wall-clock steps (`soakspec.evidence.traces.wall_steps`): a
    trace whose times fit no candidate's window goes to the first whose window they fit across
    a step (`TableMatch.stepped` counts them by step)."""
    with gc_paused():
        return _match_rows(table, rows, id_forms, window_s, tuple(steps))


def _match_rows(table: RequestTable, rows: Iterable[tuple[Any, ...]], id_forms: Sequence[str], window_s: float,
                steps: tuple[float, ...] = ()) -> TableMatch:
    affixes = [a for f in dict.fromkeys(id_forms) if (a := _affixes(f)) is not None]
    index = IdIndex(table.ids)
    by_server: dict[str, list[int]] = {}
    for i, sid in sorted(table.sparse.get("server_id", {}).items()):
        if sid:
            by_server.setdefault(str(sid), []).append(i)
    # server ids that are the request id with an affix: inverted like the id forms (an affix that
    # is also an id form's adds nothing: the id form already takes every row of that id)
    srv = [(code, v) for code, v in enumerate(table.values.get("server_affix", (None,))) if v is not None and v not in affixes]
    srv_codes = table.c.get("server_affix")
    # tag -1: an id form (any row of that id); else the server affix code the row must have
    tagged = [(pre, suf, -1) for pre, suf in affixes] + [(pre, suf, code) for code, (pre, suf) in srv]
    start, end = table.f["start"], table.f["end"]
    match = TableMatch(table.n, index)
    why = match.unmatched_reason
    ids = table.ids
    n = 0
    it = iter(rows)
    while True:
        chunk = list(itertools.islice(it, MATCH_CHUNK))
        if not chunk:
            break
        n += len(chunk)
        # a request id some trace of the chunk may name, the trace it came from, its affix's tag
        pt, found, code = index.find_affixed([tr[0] for tr in chunk], tagged)
        direct_t: list[int] = []  # (trace, row) of a server id recorded as it was
        direct_r: list[int] = []
        if by_server:
            for j, tr in enumerate(chunk):
                if (got := by_server.get(tr[0])) is not None:
                    direct_t.extend([j] * len(got))
                    direct_r.extend(got)
        take = code < 0
        if not take.all():  # a server affix: only the rows whose server id has it
            take |= srv_codes[found] == code
        pt, pr = pt[take], found[take]
        if direct_t:
            pt = np.concatenate([pt, np.asarray(direct_t, dtype=np.int64)])
            pr = np.concatenate([pr, np.asarray(direct_r, dtype=np.int64)])
        if len(pt):
            _take(chunk, pt, pr, start, end, window_s, ids, match, why, steps)
    # a request id recorded twice: a trace for it covers every record of that id (as a match
    # by id always has)
    match.repeated = index.repeated()
    for group in match.repeated:
        got = [p for i in group for p in match.kept_of(i)]
        if got:
            for i in group:
                match.codes[i] = 0
                match.extra.pop(i, None)
                for p in got:
                    match.add(i, p)
    match.traces = n
    return match


def _take(chunk: list[tuple[Any, ...]], pt: np.ndarray, pr: np.ndarray, start: np.ndarray, end: np.ndarray,
          window_s: float, ids: Sequence[Any], match: TableMatch, why: dict[str, str],
          steps: tuple[float, ...] = ()) -> None:
    """Each trace of `chunk` with candidates (trace `pt[k]` may be row `pr[k]`) goes to its
    first candidate row, in record order, whose window holds all of its times; else (`steps`)
    to the first whose window holds them across a recorded wall-clock step, the steps tried in
    their order; one with none is outside the window of its first."""
    limit = _EPOCH_MAX * 1e9
    pt, pr = np.divmod(np.unique(pt * len(start) + pr), len(start))  # by trace, then row; no pair twice
    lens = np.fromiter((len(tr[1]) for tr in chunk), dtype=np.int64, count=len(chunk))
    has = lens > 0
    tmin = np.zeros(len(chunk))
    tmax = np.zeros(len(chunk))
    if has.any():  # each trace's earliest and latest time (NaN when it has one: it fits no window)
        flat = np.fromiter(itertools.chain.from_iterable(tr[1] for tr in chunk), dtype=np.float64, count=int(lens.sum()))
        at = (np.cumsum(lens) - lens)[has]
        tmin[has] = np.minimum.reduceat(flat, at)
        tmax[has] = np.maximum.reduceat(flat, at)
    s, e = start[pr], end[pr]
    s_ok = (s == s) & (np.abs(s) <= limit)
    e = np.where((e == e) & (np.abs(e) <= limit), e, s)
    ok = ~has[pt] | (s_ok & (s - window_s <= tmin[pt]) & (tmax[pt] <= e + window_s))
    first = np.flatnonzero(np.r_[True, pt[1:] != pt[:-1]])  # each trace's first candidate
    okp = np.flatnonzero(ok)
    chosen_t, at = np.unique(pt[okp], return_index=True)
    chosen_r = pr[okp[at]]
    outside = np.setdiff1d(pt[first], chosen_t, assume_unique=True)
    for d in steps:  # a trace outside every window as stamped, tried across each recorded step
        if not len(outside):
            break
        left = np.isin(pt, outside)
        fit = left & s_ok & (s - window_s <= tmin[pt] - d) & (tmax[pt] - d <= e + window_s)
        if not fit.any():
            continue
        fp = np.flatnonzero(fit)
        got_t, at = np.unique(pt[fp], return_index=True)
        chosen_t = np.concatenate([chosen_t, got_t])
        chosen_r = np.concatenate([chosen_r, pr[fp[at]]])
        outside = np.setdiff1d(outside, got_t, assume_unique=True)
        match.stepped[d] = match.stepped.get(d, 0) + len(got_t)
    if steps and len(chosen_t):  # back in trace order: each is taken as one at a time would be
        by = np.argsort(chosen_t, kind="stable")
        chosen_t, chosen_r = chosen_t[by], chosen_r[by]
    if len(outside):
        first_row = dict(zip(pt[first].tolist(), pr[first].tolist()))
        for j in outside.tolist():
            why[str(ids[first_row[j]])] = "outside_window"
    if not len(chosen_t):
        return
    codes = [match.payload_code(chunk[j][2]) for j in chosen_t.tolist()]
    rows = chosen_r
    uniq, counts = np.unique(rows, return_counts=True)
    once = np.isin(rows, uniq[counts == 1]) & (match.codes[rows] == 0)
    match.fit(max(codes))
    match.codes[rows[once]] = np.asarray(codes, dtype=np.int32)[once]
    for k in np.flatnonzero(~once).tolist():  # a row a trace already matched, or two of this chunk
        match.add_code(int(rows[k]), codes[k])


def label_column(table: RequestTable, match: TableMatch) -> tuple[np.ndarray, tuple[Any, ...], dict[int, tuple]]:
    """The match as a table label column `trace`: None (no matched trace), NO_PAYLOAD or the
    first matched payload's kept items (a tuple); rows with more than one matched trace are
    also in the returned map, row -> every kept payload (None for one without)."""
    return match.codes, (None, *match.values), {i: tuple(ps) for i, ps in match.extra.items()}


def payloads_of(table: RequestTable, i: int) -> tuple[Mapping[str, Any], ...]:
    """The matched trace payloads (kept fields) of row i."""
    multi = table.aux.get("trace_multi", {})
    if i in multi:
        return tuple(p for p in multi[i] if p is not None)
    codes = table.c.get("trace")
    if codes is None:
        return ()
    v = table.values["trace"][codes[i]]
    return (dict(v),) if isinstance(v, tuple) else ()
