"""A backend's metrics.jsonl as the judge holds it: typed series per family, not rows.

The runner scrapes the server's /metrics every few seconds for the whole soak
(`runner/scrape.py`), one line per scrape with every kept family. Held as decoded JSON, a
scrape costs ~7 KB of memory (a histogram's buckets alone are twenty two-element lists of
floats): ~120 MB a day at one scrape each 5 s, whatever the request rate. `ScrapeBuilder`
takes the rows one at a time, as verification decodes them, and keeps per family only what
the judge reads (`judge/servermetrics.py`), in arrays of 8-byte floats:

  gauge, counter     the value (`num(entry["value"])`; NaN: not a number, or beyond
                     MAX_MAGNITUDE -- 1e300 -- whose sums and means overflow); a gauge's
                     "+Inf" / "-Inf" its infinity, and the times of its "NaN" or beyond
                     MAX_MAGNITUDE values (`nan_at`: the server gave no number)
  histogram, summary the sum and the count (`float(num(...) or 0.0)`, as the judge reads them;
                     a sum written "+Inf", "-Inf" its infinity, "NaN" NaN)
                     and the bucket counts, their `le` bounds shared by every scrape that has
                     the same ones (`num(le)`, None for +Inf or a bound that is not a number;
                     a pair whose count is not a number is not kept)

Failed scrapes (`ok` not true) are counted, the earliest kept for its error, and their times
kept (a bucket they fall around is not covered: `servermetrics._uncovered`). Series
and counts are exactly what the rows give (`build_scrapes(rows)`; tests/test_scrapes.py holds
them equal to the rows read one by one).
"""

from __future__ import annotations

import bisect
import dataclasses
import math
from array import array
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from soakspec.judge.table import num

_NAN = math.nan
# a value whose magnitude is beyond this is not a measurement (no count, gauge or rate reaches
# it), and the judge's sums, means and rates of it overflow (a server's `gauge 1.7e308` stopped
# `run`, `gate` and `report` with an internal error): read as a value that is not a number
MAX_MAGNITUDE = 1e300


def _num(v: Any) -> float | None:
    """`num(v)`, and None beyond MAX_MAGNITUDE."""
    f = num(v)
    return f if f is not None and abs(f) <= MAX_MAGNITUDE else None


@dataclasses.dataclass(frozen=True)
class Series:
    """One family's successful scrapes of one backend, in time order (scrape `i` at `times[i]`)."""

    name: str
    type: str  # counter | gauge | histogram | summary: the type its latest scrape gave
    times: array  # 'd', epoch seconds, ascending
    values: array  # 'd': the value (gauge, counter); NaN where the entry has none
    sums: array  # 'd': the sum (histogram, summary); 0.0 where none
    counts: array  # 'd': the count (histogram, summary); 0.0 where none
    bounds: tuple[tuple[float | None, ...], ...]  # the distinct `le` tuples of its scrapes
    bound_of: array  # 'i': scrape -> its index in `bounds` (-1: no buckets)
    bucket_counts: tuple[array, ...]  # per scrape: the counts of its buckets ('d'), in `le` order
    # a counter's, histogram's or summary's birth: the backend's last successful scrape before
    # the family's first, where it had no series -- its sum 0 (a labelled family shows no line
    # until its first event). None: present from the first successful scrape, or a gauge
    born: float | None = None
    # a counter's value per label set (its row's `by`), NaN where the scrape had none of it, and
    # each label set's first scrape; None where a scrape had no `by` (evidence from before it,
    # or more label sets than the scrape keeps): its sum alone is read
    by: Mapping[str, array] | None = None
    by_first: Mapping[str, int] | None = None
    kinds: tuple[str, ...] = ()  # every type its scrapes gave, in the order first seen
    # a counter's increase since its previous scrape, each label set its own counter (its row's
    # `step`, written where the scrape could not keep `by`); NaN where the row has none
    steps: array | None = None
    serieses: array | None = None  # 'd': how many label sets each scrape summed (its `series`); NaN: not said
    note: str | None = None  # why the scrape kept less of it (its latest row's `note`: a histogram's buckets not kept)
    # a gauge's scrapes whose value the server gave as no number (its row's "NaN", or a number
    # beyond MAX_MAGNITUDE), ascending: what it was then is unknown (`servermetrics._gauge`)
    nan_at: tuple[float, ...] = ()

    def value(self, i: int) -> float | None:
        v = self.values[i]
        return None if v != v else v

    def answered(self, i: int) -> bool:
        """Whether scrape i read the family: a value, or the server's NaN (`nan_at`)."""
        if self.value(i) is not None:
            return True
        k = bisect.bisect_left(self.nan_at, self.times[i])
        return k < len(self.nan_at) and self.nan_at[k] == self.times[i]

    def hist(self, i: int) -> tuple[float, float, dict[float | None, float]]:
        """Scrape i's (sum, count, {le: cumulative count})."""
        k = self.bound_of[i]
        bks = dict(zip(self.bounds[k], self.bucket_counts[i])) if k >= 0 else {}
        return self.sums[i], self.counts[i], bks


@dataclasses.dataclass(frozen=True)
class Scrapes:
    """A backend's metrics.jsonl, arranged once: its families' series and what failed."""

    series: Mapping[str, Series]
    total: int  # scrapes with a time (ok or not)
    failed: int  # of them, those not ok
    first_failed: Mapping[str, Any] | None  # the earliest failed scrape's row (its error)
    rows: int  # rows read (with or without a time)
    # when the scrapes were made, ascending ('d'): the failed ones (a bucket among them is not
    # covered by the successes either side, `servermetrics._uncovered`), the successful ones (a
    # counter's zeros before its first appearance) and all of them (the cadence, where the
    # manifest does not record it)
    failed_times: array = dataclasses.field(default_factory=lambda: array("d"))
    ok_times: array = dataclasses.field(default_factory=lambda: array("d"))
    times: array = dataclasses.field(default_factory=lambda: array("d"))


class ScrapeBuilder:
    """`Scrapes` built a row at a time (in file order; sorted by time when finished)."""

    def __init__(self) -> None:
        self.rows = 0
        self.total = 0
        self.failed = 0
        self.first_failed: tuple[float, Mapping[str, Any]] | None = None
        self._fams: dict[str, _Family] = {}
        self._bounds: dict[tuple[float | None, ...], int] = {}
        self._ok_times = array("d")  # the successful scrapes' times (a family's `born`)
        self._failed_times = array("d")
        self._times = array("d")

    def add(self, row: Any) -> None:
        if not isinstance(row, Mapping):
            return
        self.rows += 1
        t = num(row.get("t"))
        if t is None:
            return
        self.total += 1
        self._times.append(t)
        fams = row.get("families")
        if row.get("ok") is not True or not isinstance(fams, Mapping):
            if row.get("ok") is not True:
                self.failed += 1
                self._failed_times.append(t)
                if self.first_failed is None or t < self.first_failed[0]:
                    self.first_failed = (t, {"error": row.get("error")})
            return
        self._ok_times.append(t)
        for name, entry in fams.items():
            if isinstance(entry, Mapping) and isinstance(entry.get("type"), str):
                fam = self._fams.get(name)
                if fam is None:
                    fam = self._fams[name] = _Family()
                fam.add(t, entry, self._bounds)

    def finish(self) -> Scrapes:
        bounds = tuple(self._bounds)
        ok = sorted(self._ok_times)
        series = {name: fam.finish(name, bounds, ok) for name, fam in self._fams.items()}
        return Scrapes(series, self.total, self.failed, self.first_failed[1] if self.first_failed else None, self.rows,
                       array("d", sorted(self._failed_times)), array("d", ok), array("d", sorted(self._times)))


def build_scrapes(rows: Iterable[Any]) -> Scrapes:
    b = ScrapeBuilder()
    for r in rows:
        b.add(r)
    return b.finish()


class _Family:
    def __init__(self) -> None:
        self.times = array("d")
        self.values = array("d")
        self.sums = array("d")
        self.counts = array("d")
        self.steps = array("d")
        self.serieses = array("d")
        self.bound_of = array("i")
        self.bucket_counts: list[array] = []
        self.types: list[str] = []
        self.note: str | None = None
        # a counter's value per label set, a column each (NaN: not in that scrape); None once a
        # scrape had no `by`
        self.by: dict[str, array] | None = {}
        self.nan_at = array("d")

    def add(self, t: float, entry: Mapping[str, Any], bounds: dict[tuple[float | None, ...], int]) -> None:
        self.times.append(t)
        self.types.append(entry["type"])
        if isinstance(entry.get("note"), str):
            self.note = entry["note"][:300]
        raw = entry.get("value")
        v = _INFINITIES.get(raw) if entry["type"] == "gauge" and isinstance(raw, str) else _num(raw)
        self.values.append(_NAN if v is None else v)
        if v is None and entry["type"] == "gauge" and (raw == "NaN" or num(raw) is not None):
            self.nan_at.append(t)
        raw_sum = entry.get("sum")
        # an infinite _sum (an observation of +Inf) stays one: a change to it is +Inf, a change
        # between two of them (inf - inf) NaN, no mean (`servermetrics._histogram`)
        self.sums.append(_NON_FINITE[raw_sum] if isinstance(raw_sum, str) and raw_sum in _NON_FINITE else float(_num(raw_sum) or 0.0))
        self.counts.append(float(_num(entry.get("count")) or 0.0))
        st = _num(entry.get("step"))
        self.steps.append(_NAN if st is None or st < 0 else st)
        ns = _num(entry.get("series"))
        self.serieses.append(_NAN if ns is None else ns)
        by = _by(entry.get("by")) if self.by is not None else None
        if by is None:
            self.by = None
        else:
            n = len(self.times) - 1  # the scrapes before this one
            for lab, col in self.by.items():
                col.append(by.pop(lab, _NAN))
            for lab, v in by.items():
                col = self.by[lab] = array("d", [_NAN]) * n
                col.append(v)
        bks: dict[float | None, float] = {}
        pairs = entry.get("buckets")
        for pair in pairs if isinstance(pairs, (list, tuple)) else ():  # anything else holds no bucket
            if isinstance(pair, (list, tuple)) and len(pair) == 2 and (n := _num(pair[1])) is not None:
                bks[_num(pair[0]) if pair[0] is not None else None] = n
        if bks:
            les = tuple(bks)
            k = bounds.get(les)
            if k is None:
                k = bounds[les] = len(bounds)
            self.bound_of.append(k)
            self.bucket_counts.append(array("d", bks.values()))
        else:
            self.bound_of.append(-1)
            self.bucket_counts.append(_EMPTY)

    def finish(self, name: str, bounds: tuple[tuple[float | None, ...], ...], ok: list[float]) -> Series:
        times = np.frombuffer(self.times, dtype=np.float64) if len(self.times) else np.zeros(0)
        order = np.argsort(times, kind="stable")  # time order; scrapes of one time in file order
        if len(order) and not (order[1:] > order[:-1]).all():
            pick = order.tolist()
            cols = [array(c.typecode, (c[j] for j in pick)) for c in (self.times, self.values, self.sums, self.counts, self.bound_of, self.steps, self.serieses)]
            bc = tuple(self.bucket_counts[j] for j in pick)
        else:
            cols, bc = [self.times, self.values, self.sums, self.counts, self.bound_of, self.steps, self.serieses], tuple(self.bucket_counts)
        per = first = None
        if self.by is not None and len(order):
            per = {lab: array("d", (col[j] for j in order.tolist())) for lab, col in self.by.items()} if cols[0] is not self.times else self.by
            first = {lab: next(i for i, v in enumerate(col) if v == v) for lab, col in per.items()}
        kind = self.types[int(order[-1])]
        before = bisect.bisect_left(ok, cols[0][0]) - 1 if len(cols[0]) else -1
        born = ok[before] if before >= 0 and kind in ("counter", "histogram", "summary") else None
        return Series(name, kind, *cols[:4], bounds, cols[4], bc, born, per, first, tuple(dict.fromkeys(self.types)), cols[5], cols[6], self.note,
                      tuple(sorted(self.nan_at)))


_EMPTY = array("d")
# a gauge's value that is not finite, as the scraper writes it (`runner.scrape.nonfinite_text`);
# "NaN" is no value (`Series.nan_at`)
_INFINITIES = {"+Inf": math.inf, "-Inf": -math.inf}
_NON_FINITE = {**_INFINITIES, "NaN": _NAN}  # a histogram's or summary's `sum` (any other text: 0, as ever)


def _by(pairs: Any) -> dict[str, float] | None:
    """A counter entry's `by` ([label set, value] pairs) as a dict; None where it has none."""
    if not isinstance(pairs, (list, tuple)):
        return None
    out: dict[str, float] = {}
    for pair in pairs:
        if isinstance(pair, (list, tuple)) and len(pair) == 2 and isinstance(pair[0], str) and (v := _num(pair[1])) is not None:
            out[pair[0]] = v
    return out
