"""Trace matching over a request table, streamed: `match_table(table, traces, ...)`.

The same rule as `soakspec.evidence.traces.match_traces` (a trace matches the first request,
in record order, that carries its id in one of the id forms -- or as its `server_id` -- and
whose window [start - w, end + w] holds all of the trace's times), computed without a map of
every id form of every request and without holding the traces: each trace is matched as it
is read and only what the judge keeps of it stays (`TableMatch`): per request, the payload
fields rules read, and per claimed request the reason a trace for it did not match.

An id form is inverted (`cmpl-{id}` -> the id between `cmpl-` and the end) and looked up in
one id -> row map; forms that are not a literal prefix, `{id}` and a literal suffix are
handled by `match_traces` itself (`invertible`).
"""

from __future__ import annotations

import string
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from soakspec.judge.table import RequestTable

_EPOCH_MAX = 4_102_444_800.0  # as soakspec.evidence.traces: a time beyond 2100 is no time
JUDGED_PAYLOAD_KEYS = ("terminal_reason", "finish_reason", "status")


def _affixes(form: str) -> tuple[str, str] | None:
    parts = list(string.Formatter().parse(form))
    fields = [p for p in parts if p[1] is not None]
    if len(fields) != 1 or fields[0][1] != "id" or fields[0][2] or fields[0][3]:
        return None
    if any("{" in p[0] or "}" in p[0] for p in parts):
        return None  # escaped braces: not a literal prefix
    prefix = "".join(p[0] for p in parts[: parts.index(fields[0]) + 1])
    suffix = "".join(p[0] for p in parts[parts.index(fields[0]) + 1:])
    return prefix, suffix


def invertible(id_forms: Sequence[str]) -> bool:
    return all(_affixes(f) is not None for f in id_forms)


NO_PAYLOAD = False  # the `trace` label of a request matched by a trace without a payload


class TableMatch:
    """What the judge keeps of matching, per row of the table: `codes[i]` (0: no matched
    trace; else 1 + the position in `values` of its first matched trace's kept payload:
    NO_PAYLOAD or the payload's kept items), `extra` (rows with more than one matched trace:
    every kept payload, None for one without), and for ids a trace carried without matching,
    why (the last such trace's reason, as `match_traces` reports it). `row_of(id)`: the first
    row with that request id."""

    def __init__(self, n: int, row_of) -> None:
        self.codes = np.zeros(n, dtype=np.int32)
        self.values: list[Any] = []
        self._index: dict[Any, int] = {}
        self.extra: dict[int, list[Mapping[str, Any] | None]] = {}
        self.unmatched_reason: dict[str, str] = {}
        self.row_of = row_of
        self.traces = 0

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

    def payload(self, c: int) -> Mapping[str, Any] | None:
        v = self.values[c - 1]
        return None if v is NO_PAYLOAD else dict(v)

    def add(self, i: int, p: Mapping[str, Any] | None) -> None:
        if self.codes[i] == 0:
            self.codes[i] = self.code(p)
        else:
            self.extra.setdefault(i, [self.payload(int(self.codes[i]))]).append(p)

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


def match_table(table: RequestTable, traces: Iterable[Any], id_forms: Sequence[str], window_s: float) -> TableMatch:
    """Match `traces` (`soakspec.evidence.traces.Trace`, any iterable: consumed once) to the
    rows of `table` by request id (see the module doc). Requires `invertible(id_forms)`."""
    affixes = [a for f in dict.fromkeys(id_forms) if (a := _affixes(f)) is not None]
    first: dict[str, int] = {}
    more: dict[str, list[int]] = {}
    for i, rid in enumerate(table.ids):
        if rid in first:
            more.setdefault(rid, [first[rid]]).append(i)
        else:
            first[rid] = i
    by_server: dict[str, list[int]] = {}
    for i, sid in sorted(table.sparse.get("server_id", {}).items()):
        if sid:
            by_server.setdefault(str(sid), []).append(i)
    # server ids that are the request id with an affix: inverted like the id forms
    srv_affixes = [(code, v) for code, v in enumerate(table.values.get("server_affix", (None,))) if v is not None]
    srv_codes = table.c.get("server_affix")
    start, end = table.f["start"], table.f["end"]
    limit = _EPOCH_MAX * 1e9

    def window(i: int) -> tuple[float, float] | None:
        s = float(start[i])
        if s != s or abs(s) > limit:
            return None
        e = float(end[i])
        if e != e or abs(e) > limit:
            e = s
        return s - window_s, e + window_s

    def candidates(tid: str) -> list[int]:
        found: set[int] = set()
        for pre, suf in affixes:
            if len(tid) >= len(pre) + len(suf) and tid.startswith(pre) and tid.endswith(suf):
                rid = tid[len(pre): len(tid) - len(suf)]
                if rid in first:
                    found.update(more.get(rid, (first[rid],)))
        found.update(by_server.get(tid, ()))
        for code, (pre, suf) in srv_affixes:
            if len(tid) >= len(pre) + len(suf) and tid.startswith(pre) and tid.endswith(suf):
                rid = tid[len(pre): len(tid) - len(suf)]
                if rid and rid in first:
                    found.update(i for i in more.get(rid, (first[rid],)) if srv_codes[i] == code)
        return sorted(found)

    match = TableMatch(table.n, first.get)
    why = match.unmatched_reason
    shared: dict[Any, Mapping[str, Any]] = {}
    n = 0
    for tr in traces:
        n += 1
        if tr.trace_id is None:
            continue
        cands = candidates(tr.trace_id)
        if not cands:
            continue
        chosen = None
        for i in cands:
            w = window(i)
            if not tr.times or (w is not None and all(w[0] <= t <= w[1] for t in tr.times)):
                chosen = i
                break
        if chosen is None:
            why[str(table.ids[cands[0]])] = "outside_window"
            continue
        match.add(chosen, kept_payload(tr.payload, shared))
    # a request id recorded twice: a trace for it covers every record of that id (as a match
    # by id always has)
    for rows in more.values():
        got = [p for i in rows for p in match.kept_of(i)]
        if got:
            for i in rows:
                match.codes[i] = 0
                match.extra.pop(i, None)
                for p in got:
                    match.add(i, p)
    match.traces = n
    return match


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
