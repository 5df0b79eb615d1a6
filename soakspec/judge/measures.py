"""How a metric is computed over one scope instance: `impl.measure(scope, agg, q) -> Measure`.

Each metric of the catalogue (`soakspec.lang.metrics`) has one implementation here, of one of
four families; `soakspec.judge.registry.RULES` names which implements which metric. The gate
and results.json call the same implementations, so a report and a gate cannot disagree.

  Outcome     counted over the scope's measured requests: count, ratio() = share of them,
              rate() = per second of the scope's wall time (the sum of its buckets' end - start)
  PerRequest  a distribution pooling one value per *completed* measured request (ttft, tpot,
              latency, sent_ttft, sent_latency, schedule_lag, output_tokens, prompt_tokens):
              min, max, mean, pNN
  PerToken    a distribution pooling the inter-token gaps of every completed request whose
              ITL is not an estimate (itl)

A completed request flagged `usage_mismatch` (its reported completion tokens contradict its
stream, `soakspec.judge.rederive.usage_problem`) gives no ITL, TPOT or output_tokens value --
they would be computed from the claimed count -- and throughput counts its text chunks instead.
  PerBucket   one value per bucket (or `per window` slice) with a known wall time: min, max or
              mean over the scope's buckets. qps and throughput are what the server delivered
              in the window: the completed requests whose `end` lies in [start, end), whatever
              bucket they started in (`delivered`), per second of its wall time, and their
              output tokens per second (total_throughput: their prompt and output tokens,
              none where one has no prompt count); in_flight is the exact time integral of the backend's
              requests in flight over the window / its length
  PerSample   one value per telemetry sample inside the scope's buckets (rss, gpu_memory --
              the server's own processes, summed over GPUs -- and gpu_memory_device)

A scope's requests are a `soakspec.judge.table.Rows` selection of typed columns. A per-request
function may be a plain `row -> value` (it is then applied to each request's `Rec` view: right,
but slow at soak scale) or a `Columnar(row, col)` whose `col(table, idx)` computes the same
values vectorized. Columns of one selection are aligned -- `column(records, ttft)[k]` and
`column(records, counted("tpot"))[k]` are the same request -- so a predicate across metrics
(`ttft < X and tpot < Y`) is `Columnar(lambda r: ..., lambda t, idx: (t.ttft(idx) < X) & ...)`
counted with `Outcome`. The ITL gaps of a scope are counted by value (`stats.Counted`,
exact), never held as one array of every gap.

Also here: drift and slope of a per-bucket series (median of the last quarter relative to the
median of the first, quarter = max(1, n // 4); least-squares slope per minute relative to the
mean), both needing at least 2 buckets.
"""

from __future__ import annotations

import dataclasses
import math
from collections import Counter
from array import array
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, ClassVar, Protocol

import numpy as np

from soakspec.evidence.record import schedule_lag as record_lag
from soakspec.evidence.record import sent_since
from soakspec.judge import stats
from soakspec.judge.common import OPS
from soakspec.judge.index import FOLLOW_UP_BUCKET, BackendIndex, LevelIndex, Row, Window, num, req_time
from soakspec.judge.scope import Scope, bucket_scope
from soakspec.judge import table as table_module
from soakspec.lang.metrics import exclusion_title
from soakspec.judge.table import MISSING, RequestTable, Rows

Cols = Callable[[RequestTable, np.ndarray], np.ndarray]


@dataclasses.dataclass(frozen=True)
class Columnar:
    """A per-request function in two forms that agree: `row(r)` on one record (a dict or a
    `Rec` view) and `col(table, idx)` vectorized over rows of a table (NaN: no value; a
    boolean array for a predicate). A plain function works everywhere too (it is applied to
    each request's view); this is what keeps a metric fast at soak scale."""

    row: Callable[[Row], Any]
    col: Cols

    def __call__(self, r: Row) -> Any:
        return self.row(r)


def _col_of(fn: Callable[[Row], Any], kind=np.float64) -> Cols:
    if isinstance(fn, Columnar):
        return fn.col

    def slow(t: RequestTable, idx: np.ndarray) -> np.ndarray:
        vals = [fn(t.rec(i)) for i in idx.tolist()]
        if kind is bool:
            return np.fromiter((bool(v) for v in vals), dtype=bool, count=len(vals))
        return np.fromiter((np.nan if v is None else v for v in vals), dtype=np.float64, count=len(vals))
    return slow


def column(records: Rows, fn: Callable[[Row], Any]) -> np.ndarray:
    """fn over every request of `records`, aligned (NaN: no value)."""
    return records.map(_col_of(fn), fn)


def mask(records: Rows, pred: Callable[[Row], bool]) -> np.ndarray:
    """pred over every request of `records`, aligned (a boolean array)."""
    return records.map(_col_of(pred, bool), pred, bool)


@dataclasses.dataclass(frozen=True)
class Measure:
    """One computed value with the evidence behind it.

    value   -- None when it cannot be computed (then `reason` says why)
    samples -- how many samples it rests on (requests, gaps, buckets or telemetry samples)
    needed  -- how many it must rest on to support a claim (0: no minimum)
    unit    -- what a sample is, for messages: "requests", "gaps", "buckets", "samples"
    """

    value: float | None
    samples: int
    needed: int = 0
    unit: str = "requests"
    reason: str | None = None
    over: int | None = None  # percentile rules: samples beyond the threshold (set by the judge)
    # percentile rules over samples that come in clusters (itl: a request's gaps): the
    # independent draws -- requests -- the claim rests on and `needed` counts (None: `samples`)
    units: int | None = None
    # and the requests they come from, when that is more than `units` (gaps of requests of
    # unequal lengths count as fewer draws: `PerToken.independent`)
    clusters: int | None = None
    # the value is only a lower bound, the true one at least it (how far beyond unknown): a
    # server histogram's quantile in its +Inf bucket, `reason` saying so
    at_least: bool = False
    # the value is only an upper bound, the true one at most it (how far below unknown): a
    # server histogram's quantile in a lowest bucket bounded at or below 0, a gauge's min over
    # scrapes some of which the server answered NaN; `reason` saying so
    at_most: bool = False
    # binned gaps (judge/gapbins.py): the least and greatest the value can be, where they differ
    # (the value is their bins' midpoints); on which side of a threshold the cells were cut at
    # it lies is exact all the same
    bounds: tuple[float, float] | None = None
    # where `bounds` are all there is to know -- the value's resolution in its source, with
    # nothing finer to read again (a server histogram's quantile: the bucket it falls in) -- why,
    # for messages ("the server histogram's bucket"); None: binned gaps, which can be re-read
    coarse: str | None = None
    # what the value is made of, printed beside it in every message and report (a server ratio:
    # its numerator's and denominator's increases over the scope)
    detail: str | None = None

    @property
    def short(self) -> int:
        return max(0, self.needed - (self.samples if self.units is None else self.units))


class MetricImpl(Protocol):
    """What the registry holds for a performance metric."""

    def measure(self, scope: Scope, agg: str | None, percentile: float | None = None, *,
                confidence: float = 0.95, min_samples: int = 1) -> Measure: ...


_AGGREGATE: dict[str, Callable[[Sequence[float]], float | None]] = {"mean": stats.mean, "min": min, "max": max}


def aggregate(agg: str | None, vals: Sequence[float]) -> float | None:
    f = _AGGREGATE.get(agg or "")
    if f is None:
        raise ValueError(f"{agg}() does not apply to this metric")
    if isinstance(vals, np.ndarray) and agg in ("min", "max"):
        return float(vals.min() if agg == "min" else vals.max())
    return f(vals)


def _is_completed(r: Row) -> bool:
    return r.get("outcome") == "completed"


is_completed = Columnar(_is_completed, lambda t, idx: t.label_is("outcome", "completed", idx))


def completed(records: Iterable[Row]) -> Any:
    """The completed requests of `records` (a `Rows` selection for a scope's records)."""
    if isinstance(records, Rows):
        return records.where(is_completed.col, is_completed.row)
    return [r for r in records if r.get("outcome") == "completed"]


# ------------------------------------------------------------------------------ outcome counts


@dataclasses.dataclass(frozen=True)
class Outcome:
    """A class of measured requests, counted. `noun` (one offending request) marks a failure
    class: a failing count rule names the buckets that hold the offending requests."""

    counts: Callable[[Row], bool]
    noun: str | None = None

    def count(self, records: Iterable[Row]) -> int:
        if isinstance(records, Rows):  # a chunk of rows at a time: a whole run's mask is never made
            return sum(int(mask(Rows.of(t, sub), self.counts).sum()) for t, sub in records.chunks())
        return sum(1 for r in records if self.counts(r))

    def measure(self, scope: Scope, agg: str | None, percentile: float | None = None, *,
                confidence: float = 0.95, min_samples: int = 1) -> Measure:
        n = len(scope.records)
        agg = agg or "count"
        if n == 0:
            return Measure(None, 0, 1, "requests", "no measured requests")
        c = self.count(scope.records)
        if agg == "count":
            return Measure(float(c), n, 1)
        if agg == "ratio":
            return Measure(c / n, n, 1)
        if agg == "rate":
            wall = scope.wall_s
            if not wall:
                return Measure(None, n, 1, "requests", "the scope's wall time is unknown")
            return Measure(c / wall, n, 1)
        raise ValueError(f"{agg}() does not apply to an outcome count")


def outcome_is(outcome: str) -> Callable[[Row], bool]:
    """Requests whose `outcome` (as requests.jsonl writes it) is `outcome`."""
    return Columnar(lambda r: r.get("outcome") == outcome, lambda t, idx: t.label_is("outcome", outcome, idx))


any_request = Columnar(lambda r: True, lambda t, idx: np.ones(len(idx), dtype=bool))


def _done(t: RequestTable, idx: np.ndarray) -> np.ndarray:
    return t.label_is("outcome", "completed", idx)


# A completed request whose tokens (>= 1 by the server's usage) decoded to no text.
empty_text = Columnar(lambda r: r.get("outcome") == "completed" and r.get("empty_text") is True,
                      lambda t, idx: _done(t, idx) & t.label_is("empty_text", True, idx))

# A completed request whose reported completion tokens contradict its stream.
usage_mismatched = Columnar(lambda r: r.get("outcome") == "completed" and bool(r.get("usage_mismatch")),
                            lambda t, idx: _done(t, idx) & ~t.usage_ok(idx))

not_completed = Columnar(lambda r: r.get("outcome") != "completed", lambda t, idx: ~_done(t, idx))


# ------------------------------------------------------------------------------ what a metric leaves out


def excluded(records: Iterable[Row], sent: bool = False) -> dict[str, dict[str, int]]:
    """Completed requests that TTFT, TPOT and ITL leave out, by reason (none is silent); with
    `sent`, those that sent_ttft and sent_latency leave out too (the times from the send: a
    request without a first token, as TTFT, or without a send time, `start`). `sent` where
    their figures are given (a level that declares max_concurrency, `summary.sent_summary`) or
    a rule on them asks: elsewhere they leave out what ttft and latency do, said once."""
    if isinstance(records, Rows) and len(records.parts) == 1 and not len(records.parts[0][0].odd(records.parts[0][1])):
        return _excluded_columns(*records.parts[0], sent=sent)
    ttft: Counter[str] = Counter()
    tpot: Counter[str] = Counter()
    itl: Counter[str] = Counter()
    sent_ttft: Counter[str] = Counter()
    sent_latency: Counter[str] = Counter()
    for r in records:
        if r.get("outcome") != "completed":
            continue
        untimed = r.get("first_token") is None  # completed without one: its tokens' times are unknown
        if untimed:
            ttft[_UNTIMED] += 1
        if sent:
            unsent = num(r.get("start")) is None
            if untimed or unsent:
                sent_ttft[_UNTIMED if untimed else _UNSENT] += 1
            if unsent or num(r.get("end")) is None:
                sent_latency[_UNSENT if unsent else _NO_END] += 1
        if r.get("usage_mismatch"):
            tpot[_MISMATCH] += 1
            itl[_MISMATCH] += 1
            continue
        n = r.get("output_tokens")
        if r.get("tpot") is None:
            tpot[_FEW if isinstance(n, int) and n < 2 else _UNTIMED if untimed else _UNSTREAMED] += 1
        elif r.get("itl_source") == "estimated":
            tpot[_ESTIMATED] += 1
        if untimed:
            itl[_UNTIMED] += 1
        elif r.get("itl_source") == "estimated":
            itl[_ESTIMATED] += 1
    out = {"ttft": dict(ttft), "tpot": dict(tpot), "itl": dict(itl)}
    return out | ({"sent_ttft": dict(sent_ttft), "sent_latency": dict(sent_latency)} if sent else {})


_MISMATCH = "usage contradicts the stream (usage_mismatch)"
# no TPOT for a request with tokens after its first token event's: not streamed, or (the record
# alone cannot tell which) the first chunk carried every token (runner/protocol.py)
_FEW, _UNSTREAMED = "fewer than 2 tokens", "no token times after the first chunk (not streamed, or every token in it)"
_UNTIMED = "token arrival times unknown (no text, usage not per chunk)"
_ESTIMATED = "estimated tokens per chunk (final usage spread over the chunks)"
# sent_ttft and sent_latency run from `start`, the send: a record without one has neither
_UNSENT, _NO_END = "no send time (start) recorded", "no end time recorded"


def _excluded_columns(t, idx, sent: bool = False) -> dict[str, dict[str, int]]:
    """`excluded` over one table's rows without extras, vectorized a chunk of rows at a time:
    the same counts, each reason in the order its first request comes (as the row loop adds them)."""
    first: dict[tuple[str, str], int] = {}  # (ttft|tpot|itl, reason) -> the position of its first request
    total: Counter[tuple[str, str]] = Counter()
    step = table_module.SCAN_CHUNK
    for a in range(0, len(idx), step):
        part = idx[a:a + step]
        done = t.label_is("outcome", "completed", part)
        untimed = done & np.isnan(t.f["first_token"][part])
        mism = done & ~t.usage_ok(part)
        rest = done & ~mism
        notpot = rest & np.isnan(t.f["tpot"][part])
        n = t.i["output_tokens"][part]
        few = notpot & (n != MISSING) & (n < 2)
        est = rest & t.label_is("itl_source", "estimated", part)
        masks = [(("ttft", _UNTIMED), untimed), (("tpot", _MISMATCH), mism), (("tpot", _FEW), few),
                 (("tpot", _UNTIMED), notpot & ~few & untimed), (("tpot", _UNSTREAMED), notpot & ~few & ~untimed),
                 (("tpot", _ESTIMATED), est & ~notpot),
                 (("itl", _MISMATCH), mism), (("itl", _UNTIMED), rest & untimed), (("itl", _ESTIMATED), est & ~untimed)]
        if sent:
            unsent = done & np.isnan(t.number("start", part))
            endless = done & ~unsent & np.isnan(t.number("end", part))
            masks += [(("sent_ttft", _UNTIMED), untimed), (("sent_ttft", _UNSENT), unsent & ~untimed),
                      (("sent_latency", _UNSENT), unsent), (("sent_latency", _NO_END), endless)]
        for key, m in masks:
            if m.any():
                first.setdefault(key, a + int(np.argmax(m)))
                total[key] += int(m.sum())
    out: dict[str, dict[str, int]] = {"ttft": {}, "tpot": {}, "itl": {}}
    if sent:
        out |= {"sent_ttft": {}, "sent_latency": {}}
    for (which, reason), _ in sorted(first.items(), key=lambda kv: (kv[1], kv[0][1])):
        out[which][reason] = total[(which, reason)]
    return out


# ------------------------------------------------------------------------------ distributions


class Distribution:
    unit: ClassVar[str]
    excluded_as: str | None = None  # its name in `excluded` (a dataclass field of the kinds that have one)
    # True where `values` of a scope's rows is always an array made for the call, which the
    # caller may reorder (`stats.percentile(..., reorder=True)`): no copy of a scope's values
    new_values: ClassVar[bool] = False

    def values(self, records: Iterable[Row]) -> list[float]:
        raise NotImplementedError

    def counted(self, records: Iterable[Row]) -> stats.Counted | None:
        return None

    def beyond(self, records: Iterable[Row], op: str, t: float) -> tuple[int, int]:
        """(samples, how many of them satisfy `value op t`)."""
        c = self.counted(records)
        if c is not None:
            try:
                return c.n, c.count(op, t)
            except stats.InexactCount:  # binned gaps, `t` not an edge they were cut at: the gaps themselves
                pass
        vals = np.asarray(self.values(records), dtype=np.float64)
        return len(vals), int(np.count_nonzero(OPS[op](vals, t)))

    def independent(self, records: Iterable[Row]) -> int | None:
        """How many independent draws the values of `records` are, when fewer than the values
        (PerToken: the requests that give gaps); None: each value is one."""
        return None

    def no_values(self, records: Iterable[Row]) -> str:
        """Why `records` give no value: no completed request, or the completed ones this
        metric leaves out -- how many and why (`excluded`, as the report's notes say it), never
        "no completed requests" beside a run that completed 148 whose tokens came untimed."""
        done = completed(records)
        n = len(done)
        if not n:
            return "no completed requests"
        name = self.excluded_as
        why = excluded(done, sent=name in ("sent_ttft", "sent_latency")).get(name, {}) if name else {}
        if not why:
            return f"none of its {n} completed request{'s' if n != 1 else ''} gives a value"
        reasons = "; ".join(f"{k} ({v})" if len(why) > 1 else k for k, v in why.items())
        return f"{exclusion_title(name)} leaves out {'all ' if n > 1 else ''}{n} completed request{'s' if n != 1 else ''}: {reasons}"

    def sizes(self, records: Iterable[Row]) -> np.ndarray:
        """How many values each request of `records` that gives any gives (PerToken: its gaps);
        `stats.effective_units` weighs them."""
        if isinstance(records, Rows) and isinstance(self, PerToken) and self.gaps is itl_gaps:
            parts = list(_gap_counts(records))
            return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)
        if isinstance(records, Rows) and isinstance(self, PerRequest):
            return np.ones(len(self.values(records)), dtype=np.int64)
        return np.asarray([k for r in records if (k := len(self.values([r])))], dtype=np.int64)

    def percentile_of(self, records: Iterable[Row], q: float) -> tuple[float | None, int]:
        """(the q-th percentile of `values(records)`, how many values there are)."""
        vals = self.values(records)
        if not len(vals):
            return None, 0
        reorder = self.new_values and stats.own_array(vals)
        return stats.percentile(vals, q, reorder=reorder), len(vals)

    def measure(self, scope: Scope, agg: str | None, percentile: float | None = None, *,
                confidence: float = 0.95, min_samples: int = 1) -> Measure:
        unit = self.unit
        if percentile is not None:
            need = max(stats.min_samples_for_percentile(percentile, confidence), min_samples)
            value, n = self.percentile_of(scope.records, percentile)
            if not n:
                return Measure(None, 0, need, unit, self.no_values(scope.records))
            return Measure(value, n, need, unit, units=self.independent(scope.records))
        vals = self.values(scope.records)
        need = max(1, min_samples)
        if not len(vals):
            return Measure(None, 0, need, unit, self.no_values(scope.records))
        return Measure(aggregate(agg, vals), len(vals), need, unit)


@dataclasses.dataclass(frozen=True)
class Censored:
    """The requests a time rule counts that lack their value, each known only to lie within
    [low, high] (`PerRequest.censored`), and the values timed-out requests did measure."""

    known: np.ndarray  # values timed-out requests measured (a first token before the deadline)
    low: np.ndarray
    high: np.ndarray  # inf: no upper bound (a timeout: the request never finished)
    timed_out: int  # how many of the bounded ones timed out before the value was measured
    stalled: int = 0  # how many timed out mid-stream (a first token, then no end: `when_stalled`)
    # low, high: first the `timed_out`, then the `stalled`, then requests completed without token times

    def __bool__(self) -> bool:
        return bool(len(self.known) or len(self.low))


# A selection of at least this many requests has its per-request values (ttft, latency, tpot)
# read a chunk at a time for a percentile or a count beyond a threshold, never held at once: a
# day's 10^7 requests held 80 MB of values and their selection beside the table (the gate's
# peak, benchmarks/README.md). Exact either way (`stats.percentile_of_chunks`).
CHUNKED_ROWS = 1 << 20


@dataclasses.dataclass(frozen=True)
class PerRequest(Distribution):
    """One value per completed request (None: the request does not have it).

    `when_timed_out`, for the times a deadline cuts short (ttft, latency): what a timed-out
    request still measured of the value (ttft: a first token that came before the deadline;
    latency: nothing). A timed-out request that lacks it is a right-censored sample: its value
    is only known to exceed its time from request to deadline. `untimed_low`, for ttft: a
    completed request whose tokens' arrival times are unknown (no text carried them, usage not
    per chunk: `runner/protocol.py`) has a TTFT between its first byte (this function) and its
    end. The distribution (`values`) stays over completed requests with a value; the gate judges
    a rule over all of them together, within the bounds (`censored`,
    `soakspec.judge.performance`), so neither a timeout nor a server that leaves its tokens
    untimed takes a request out of a time rule. `when_stalled`, for a per-token time (tpot):
    the lower bound of the value of a request that timed out mid-stream (`stalled`: a first
    token, then the deadline) -- its TPOT had it finished is unknown, so it counts between that
    bound and no bound at all, never left out."""

    value: Callable[[Row], float | None]
    when_timed_out: Callable[[Row], float | None] | None = None
    untimed_low: Callable[[Row], float | None] | None = None
    when_stalled: Callable[[Row], float | None] | None = None
    excluded_as: str | None = None  # its name in `excluded` (ttft, tpot): why a completed request has no value
    # the time from the value's own origin to the request's end, which bounds a censored value:
    # `latency` (None) for the times from the intended start, `sent_latency` for those from the send
    elapsed: Callable[[Row], float | None] | None = None
    unit: ClassVar[str] = "requests"
    new_values: ClassVar[bool] = True  # `column` makes a new array; `v[ok]` another

    def censored(self, records: Iterable[Row]) -> Censored:
        """The requests of `records` the rule counts without their value (see the class doc)."""
        known, low, high, n_out = np.zeros(0), [np.zeros(0)], [np.zeros(0)], 0
        if self.when_timed_out is not None:
            out = _select(records, timed_out)
            got, bound = _floats(out, self.when_timed_out), _floats(out, self.elapsed or latency)
            has = np.isfinite(got)
            known, lows = got[has], bound[~has & np.isfinite(bound)]
            low.append(lows)
            high.append(np.full(len(lows), np.inf))
            n_out = len(lows)
        n_stalled = 0
        if self.when_stalled is not None:
            lows = _floats(_select(records, stalled), self.when_stalled)
            low.append(np.where(np.isfinite(lows), lows, 0.0))
            high.append(np.full(len(lows), np.inf))
            n_stalled = len(lows)
        if self.untimed_low is not None:
            blind = _select(records, untimed)
            v, lo, hi = _floats(blind, self.value), _floats(blind, self.untimed_low), _floats(blind, self.elapsed or latency)
            miss = ~np.isfinite(v) & np.isfinite(hi)
            low.append(np.where(np.isfinite(lo[miss]), lo[miss], 0.0))
            high.append(hi[miss])
        return Censored(known, np.concatenate(low), np.concatenate(high), n_out, n_stalled)

    def percentile_of(self, records: Iterable[Row], q: float) -> tuple[float | None, int]:
        chunks = self.chunked(records)
        if chunks is not None:  # a day's requests: never all held
            return stats.percentile_of_chunks(chunks, q)
        return super().percentile_of(records, q)

    def beyond(self, records: Iterable[Row], op: str, t: float) -> tuple[int, int]:
        chunks = self.chunked(records)
        if chunks is not None:
            n = over = 0
            for v in chunks():
                n += len(v)
                over += int(np.count_nonzero(OPS[op](v, t)))
            return n, over
        return super().beyond(records, op, t)

    def chunked(self, records: Iterable[Row]) -> Callable[[], Iterator[np.ndarray]] | None:
        """`values(records)` to read a few rows at a time (table.SCAN_CHUNK), pass after pass,
        where `records` are a day's (`CHUNKED_ROWS` rows or more): what a whole run's
        percentiles, counts beyond a threshold and summary read. None: few enough to hold."""
        if isinstance(records, Rows) and len(records) >= CHUNKED_ROWS:
            return lambda: self._value_chunks(records)
        return None

    def _value_chunks(self, records: Rows) -> Iterator[np.ndarray]:
        for t, sub in records.chunks():
            v = self.values(Rows.of(t, sub))
            if len(v):
                yield v

    def values(self, records: Iterable[Row]) -> Any:
        if isinstance(records, Rows):  # a scope's requests: vectorized, an array
            v = column(completed(records), self.value)
            ok = np.isfinite(v)
            return v if ok.all() else v[ok]  # no second full-length copy when every value is there
        out: list[float] = []
        for r in completed(records):
            v = self.value(r)
            if v is not None:
                out.append(v)
        return out


def _gap_counts(records: Rows) -> Iterator[np.ndarray]:
    """The ITL gap count of each completed request of `records` that pools any (its gaps not
    estimated, its usage not contradicted), a SCAN_CHUNK of rows at a time (int64 arrays): no
    temporary the length of a day's requests."""
    step = table_module.SCAN_CHUNK
    for t, whole in completed(records).parts:
        for a in range(0, len(whole), step):
            idx = whole[a:a + step]
            clean = t.clean(idx)
            ok = ~t.label_is("itl_source", "estimated", clean) & t.usage_ok(clean)
            m = t.itl_off[clean + 1] - t.itl_off[clean]
            yield np.asarray(m[(m > 0) & ok], dtype=np.int64)
            yield np.asarray([k for i in t.odd(idx).tolist() if (k := len(itl_gaps(t.rec(i))))], dtype=np.int64)


@dataclasses.dataclass(frozen=True)
class PerToken(Distribution):
    """Many values per completed request: its inter-token gaps. A request that timed out
    mid-stream (`stalled`) stopped at a gap that never ended: it counts as one more gap, known
    only to exceed the time from its last token to its end (`stall`), with no upper bound
    (`censored`; judged as `PerRequest`'s censored values are). The gaps it measured before are
    not pooled (ITL pools completed streams); its stall is what a gap rule must not miss: a
    server that stalls streams until the deadline would otherwise pass `max(itl) < 1s` on the
    streams that finished."""

    gaps: Callable[[Row], Iterable[float]]
    excluded_as: str | None = None  # its name in `excluded` (itl): why a completed request gives no gap
    unit: ClassVar[str] = "gaps"

    def censored(self, records: Iterable[Row]) -> Censored:
        lows = _floats(_select(records, stalled), stall)
        lows = np.where(np.isfinite(lows), lows, 0.0)
        return Censored(np.zeros(0), lows, np.full(len(lows), np.inf), 0, len(lows))

    def independent(self, records: Iterable[Row]) -> int | None:
        """How many independent draws the pooled gaps are: a request's gaps share its batch and
        its place in the queue, so a percentile claim over them rests on requests, not gaps (its
        sample-size rule and overage counts: `stats.independent_counts`) -- and on requests
        weighted by their gaps (`stats.effective_units`, Kish's effective number, as `soakspec
        compare` counts them): one long stream among short ones is most of the pool, and
        counting it as one request of many passed `p90(itl) < T` with T at the true p90 27 % of
        the time at 95 % confidence. Requests of one length count each as one."""
        return self.draws(records)[0]

    def draws(self, records: Iterable[Row]) -> tuple[int, int]:
        """(independent draws, the requests whose gaps are pooled): see `independent`."""
        if isinstance(records, Rows) and self.gaps is itl_gaps:
            clusters, total, squares = 0, 0.0, 0.0
            for counts in _gap_counts(records):  # summed a chunk at a time, never held whole
                x = counts.astype(np.float64)
                clusters, total, squares = clusters + len(x), total + float(x.sum()), squares + float(np.dot(x, x))
            return stats.effective_units_of(clusters, total, squares), clusters
        sizes = self.sizes(records)
        return stats.effective_units(sizes), len(sizes)

    def counted(self, records: Iterable[Row]) -> stats.Counted | None:
        """The gaps counted by value (`_itl_counted`), or None where that does not apply."""
        if isinstance(records, Rows) and self.gaps is itl_gaps:
            return _itl_counted(records)
        return None

    def measure(self, scope: Scope, agg: str | None, percentile: float | None = None, *,
                confidence: float = 0.95, min_samples: int = 1) -> Measure:
        c = self.counted(scope.records)
        if c is None:
            return super().measure(scope, agg, percentile, confidence=confidence, min_samples=min_samples)
        unit = self.unit
        if percentile is not None:
            need = max(stats.min_samples_for_percentile(percentile, confidence), min_samples)
            if not c.n:
                return Measure(None, 0, need, unit, self.no_values(scope.records))
            units, clusters = self.draws(scope.records)
            b = c.percentile_bounds(percentile) if not c.exact else None
            return Measure(c.percentile(percentile), c.n, need, unit, units=units, clusters=clusters if clusters != units else None,
                           bounds=b if b is not None and b[0] != b[1] else None)
        need = max(1, min_samples)
        if not c.n:
            return Measure(None, 0, need, unit, self.no_values(scope.records))
        value = c.aggregate(agg)
        return Measure(value, c.n, need, unit)

    def values(self, records: Iterable[Row]) -> Any:
        if isinstance(records, Rows) and self.gaps is itl_gaps:
            return _itl_values(completed(records))
        out: list[float] = []
        for r in completed(records):
            out.extend(self.gaps(r))
        return np.asarray(out, dtype=np.float64) if isinstance(records, Rows) else out


def _itl_counted(records: Rows) -> stats.Counted | None:
    """The ITL gaps of the completed requests of `records`, counted by value (exact, and
    bounded in memory by the number of distinct gaps); None when a table's gaps are not whole
    microseconds. Computed once per selection of MEMO_ROWS or more."""
    if "itl" in records.memo:
        return records.memo["itl"]
    parts: list[stats.Counted] = []
    got: stats.Counted | None = None
    chunked = len(records) >= CHUNKED_ROWS  # a whole day's selection: never made at once
    for t, idx in (records.parts if chunked else completed(records).parts):
        if chunked:
            whole = Rows.of(t, idx)
            vc = t.gap_counts_of_chunks(lambda t=t, whole=whole: (_counted_itl_rows(t, _done_rows(t, sub)) for _, sub in whole.chunks()))
            # the rows with extras first (a few), then which of them completed
            odd_rows = _done_rows(t, np.concatenate([t.odd(sub) for _, sub in whole.chunks()])).tolist() if len(t.odd_rows) else []
        else:
            vc = t.gap_counts(_counted_itl_rows(t, idx))
            odd_rows = t.odd(idx).tolist()
        if vc is None:
            break
        parts.append(vc)
        odd = [g for i in odd_rows for g in itl_gaps(t.rec(i))]
        if odd:
            u, c = np.unique(np.asarray(odd, dtype=np.float64), return_counts=True)
            parts.append(stats.Counted(u, c))
    else:
        got = stats.merge_counted(parts)
    if len(records) >= MEMO_ROWS:
        records.memo["itl"] = got
    return got


def _counted_itl_rows(t: RequestTable, done: np.ndarray) -> np.ndarray:
    """Of completed rows `done`, those whose gaps the cells count: no extras, ITL not an
    estimate, usage consistent with the stream."""
    clean = t.clean(done)
    return clean[~t.label_is("itl_source", "estimated", clean) & t.usage_ok(clean)]


def _done_rows(t: RequestTable, idx: np.ndarray) -> np.ndarray:
    """The completed rows of `idx` (`completed`)."""
    parts = completed(Rows.of(t, idx)).parts
    return parts[0][1] if parts else idx[:0]


# Selections of fewer rows count their gaps again each time they are asked (a cell or two: a
# bucket's or a window's, ~0.1 ms), not held: a day's thousands of window scopes each holding
# its counts (binned: ~70 KB) held ~400 MB at 10^7 requests of a real server's gaps
MEMO_ROWS = 1 << 16


def _itl_values(done: Rows) -> np.ndarray:
    """The ITL gaps of completed requests, straight from the table's flat gap array (rows
    with extras through `itl_gaps`)."""
    outs = []
    for t, idx in done.parts:
        clean = t.clean(idx)
        ok = ~t.label_is("itl_source", "estimated", clean) & t.usage_ok(clean)
        outs.append(t.gaps(clean[ok]))
        for i in t.odd(idx).tolist():
            outs.append(np.asarray(itl_gaps(t.rec(i)), dtype=np.float64))
    if not outs:
        return np.zeros(0)
    return np.concatenate(outs) if len(outs) > 1 else outs[0]


def field(name: str) -> Callable[[Row], float | None]:
    """The request row's own numeric field `name`."""
    return Columnar(lambda r: num(r.get(name)), lambda t, idx: t.number(name, idx))


def _ttft(r: Row) -> float | None:
    v = num(r.get("ttft"))
    if v is None and (ft := num(r.get("first_token"))) is not None and (t := req_time(r)) is not None:
        v = ft - t
    return v


def _latency(r: Row) -> float | None:
    v = num(r.get("latency"))
    if v is None and (e := num(r.get("end"))) is not None and (t := req_time(r)) is not None:
        v = e - t
    return v


def _schedule_lag(r: Row) -> float | None:
    """The load generator's lateness (`record.schedule_lag`): from `admitted` -- the slot under
    the spec's max_concurrency -- where the request has one, else from its intended start."""
    return record_lag(num(r.get("start")), num(r.get("intended_start")), num(r.get("admitted")))


def _cap_wait(r: Row) -> float | None:
    a, i = num(r.get("admitted")), num(r.get("intended_start"))
    return a - i if a is not None and i is not None else None


ttft = Columnar(_ttft, lambda t, idx: t.ttft(idx))
latency = Columnar(_latency, lambda t, idx: t.latency(idx))
unmeasured = Columnar(lambda r: None, lambda t, idx: np.full(len(idx), np.nan))  # latency: a timeout measured none
zero = Columnar(lambda r: 0.0, lambda t, idx: np.zeros(len(idx)))  # tpot: a stalled request's, at least
timed_out = outcome_is("timeout")
# a request that timed out after its first token: its stream stalled (or ran) past the deadline
stalled = Columnar(lambda r: r.get("outcome") == "timeout" and num(r.get("first_token")) is not None,
                   lambda t, idx: t.label_is("outcome", "timeout", idx) & ~np.isnan(t.number("first_token", idx)))
TPOT_RESOLUTION = 1e-6  # a record's tpot is written to the microsecond


def _stall(first: Any, end: Any, tpot: Any, n: Any) -> Any:
    """end - the latest its last token can have come (vectorized or not): the last token came
    (last - first) = tpot x (n - k1) after the first, k1 >= 1 the first chunk's tokens, so at
    most tpot x (n - 1) after it (tpot rounded up by its resolution); no tpot: at the first."""
    after = (tpot + TPOT_RESOLUTION) * (n - 1)
    return end - first - after


def _stall_row(r: Row) -> float | None:
    ft, e = num(r.get("first_token")), num(r.get("end"))
    if ft is None or e is None:
        return None
    tp, n = num(r.get("tpot")), num(r.get("output_tokens"))
    if tp is None or n is None or n < 2:
        return max(0.0, e - ft)
    return max(0.0, _stall(ft, e, tp, n))


def _stall_col(t: RequestTable, idx: np.ndarray) -> np.ndarray:
    ft, e = t.number("first_token", idx), t.number("end", idx)
    tp, n = t.number("tpot", idx), t.number("output_tokens", idx)
    timed = ~np.isnan(tp) & ~np.isnan(n) & (n >= 2)
    v = np.where(timed, _stall(ft, e, np.nan_to_num(tp), np.nan_to_num(n)), e - ft)
    return np.maximum(v, 0.0)  # NaN (no first token or end) stays NaN


# how long a timed-out request had waited since its last token, at least (a lower bound: the
# stall a gap rule counts it as, `PerToken.censored`)
stall = Columnar(_stall_row, _stall_col)
# a completed request without a first token: its tokens' arrival times are unknown (summary.excluded)
untimed = Columnar(lambda r: r.get("outcome") == "completed" and num(r.get("first_token")) is None,
                   lambda t, idx: _done(t, idx) & np.isnan(t.number("first_token", idx)))


def _first_byte_wait(r: Row) -> float | None:
    fb, t = num(r.get("first_byte")), req_time(r)
    return fb - t if fb is not None and t is not None else None


# how long a request waited for its first byte: a lower bound of its TTFT
first_byte_wait = Columnar(_first_byte_wait, lambda t, idx: t.number("first_byte", idx) - t.req_time(idx))


def _select(records: Iterable[Row], pred: Columnar) -> Any:
    """The requests of `records` that `pred` holds for (a `Rows` selection for a scope's)."""
    return records.where(pred.col, pred.row) if isinstance(records, Rows) else [r for r in records if pred(r)]


def _floats(records: Any, fn: Callable[[Row], float | None]) -> np.ndarray:
    """fn over `records` (a `Rows` selection or a list of rows) as float64, NaN for none."""
    if isinstance(records, Rows):
        return column(records, fn)
    return np.asarray([np.nan if (v := fn(r)) is None else v for r in records], dtype=np.float64)
schedule_lag = Columnar(_schedule_lag, lambda t, idx: t.schedule_lag(idx))


def _since_send(stamp: str) -> Columnar:
    """`stamp` - start (`record.sent_since`): a duration from the send, the server's view."""
    return Columnar(lambda r: sent_since(num(r.get(stamp)), num(r.get("start"))), lambda t, idx: t.sent(stamp, idx))


# TTFT and latency from the send (after any wait for a slot under max_concurrency): what vLLM's
# bench serve and SGLang's bench_serving report as TTFT and E2EL
sent_ttft = _since_send("first_token")
sent_latency = _since_send("end")
sent_first_byte_wait = _since_send("first_byte")  # a lower bound of sent_ttft, as first_byte_wait of ttft
cap_wait = Columnar(_cap_wait, lambda t, idx: t.cap_wait(idx))  # NaN / None: the request had no cap to wait behind


def less_gain(of: Columnar, gain: Columnar) -> Columnar:
    """`of` (a time from the intended start: ttft, latency, first_byte_wait) less `gain`, what
    the load generator's own lateness added to it: at a level under max_concurrency the send
    less the admit of the slot queue replayed on time (`judge/capreplay.py`), elsewhere the
    schedule lag (so the time from the send). The judge's own figure (`registry.less_lag`,
    `performance.lag_figure`). None (NaN): `of` has none."""
    def row(r: Row) -> float | None:
        v = of(r)
        return None if v is None else v - gain(r)

    return Columnar(row, lambda t, idx: of.col(t, idx) - gain.col(t, idx))


def usage_ok(r: Row) -> bool:
    """The request's token count agrees with its stream (not flagged `usage_mismatch`)."""
    return not r.get("usage_mismatch")


def counted(name: str) -> Callable[[Row], float | None]:
    """A field computed from the reported token count: None when that count is contradicted."""
    get = field(name)
    return Columnar(lambda r: get(r) if usage_ok(r) else None, lambda t, idx: t.counted_number(name, idx))


def _tpot_col(t: Any, idx: Any) -> np.ndarray:
    out = t.counted_number("tpot", idx)
    out[t.label_is("itl_source", "estimated", idx)] = np.nan
    return out


def measured_tpot() -> Columnar:
    """tpot where the record measured it: `counted("tpot")`, and none for a request whose
    tokens per chunk were estimated (only a final usage, spread evenly over chunks of unequal
    tokens: `itl_source` "estimated"). Its TPOT's denominator, the tokens after the first
    chunk's, is then a guess, and a first chunk of several tokens makes the guess deflate TPOT
    (AIPerf PR #1279), so a `tpot <` claim could pass on it. ITL pools none of such a request's
    gaps for the same reason; the summary lists both as excluded, with why."""
    get = counted("tpot")
    return Columnar(lambda r: None if r.get("itl_source") == "estimated" else get(r), _tpot_col)


def itl_gaps(r: Row) -> list[float]:
    if r.get("itl_source") == "estimated" or not usage_ok(r):
        return []
    gaps = r.get("itl")
    if type(gaps) is array and math.isfinite(sum(gaps)):  # a finite sum: every gap is finite
        return gaps.tolist()
    if isinstance(gaps, (list, array)):
        return [v for g in gaps if (v := num(g)) is not None]
    return []


def _gap_share_row(r: Row) -> tuple[int, int]:
    if r.get("outcome") != "completed":
        return 0, 0
    n = len(itl_gaps(r))
    c = r.get("coalesced")
    return n, (min(n, c) if n and type(c) is int and c > 0 else 0)


def gap_share(records: Iterable[Row]) -> tuple[int, int]:
    """(the ITL gaps `itl` pools from the completed requests of `records`, how many of them are
    coalesced: the record's `coalesced`, at most its gaps). Vectorized over a `Rows` selection."""
    if not isinstance(records, Rows):
        pairs = [_gap_share_row(r) for r in records]
        return sum(n for n, _ in pairs), sum(c for _, c in pairs)
    gaps = shared = 0
    for t, idx in records.chunks():
        clean = t.clean(idx)
        ok = t.label_is("outcome", "completed", clean) & ~t.label_is("itl_source", "estimated", clean) & t.usage_ok(clean)
        n = np.where(ok, t.itl_off[clean + 1] - t.itl_off[clean], 0)
        c = t.i["coalesced"][clean].astype(np.int64)
        gaps += int(n.sum())
        shared += int(np.minimum(n, np.where((c > 0) & (c != MISSING), c, 0)).sum())
        for i in t.odd(idx).tolist():
            a, b = _gap_share_row(t.rec(i))
            gaps += a
            shared += b
    return gaps, shared


@dataclasses.dataclass(frozen=True)
class GapShare:
    """`coalesced`: the share of the scope's ITL gaps (those `itl` pools) that are not
    independent samples -- tokens that shared a read or receive stamp with the one before, or
    a chunk's gap split over its tokens (the record's `coalesced` count, runner/protocol.py)."""

    unit: ClassVar[str] = "gaps"

    def measure(self, scope: Scope, agg: str | None, percentile: float | None = None, *,
                confidence: float = 0.95, min_samples: int = 1) -> Measure:
        gaps, shared = gap_share(scope.records)
        if not gaps:
            return Measure(None, 0, 1, "gaps", "no ITL gaps")
        return Measure(shared / gaps, gaps, 1, "gaps")


# ------------------------------------------------------------------------------ series


class _Series:
    unit: ClassVar[str]
    empty: ClassVar[str]

    def points(self, scope: Scope) -> list[float]:
        raise NotImplementedError

    def measure(self, scope: Scope, agg: str | None, percentile: float | None = None, *,
                confidence: float = 0.95, min_samples: int = 1) -> Measure:
        pts = self.points(scope)
        if not pts:
            return Measure(None, 0, 1, self.unit, self.empty)
        return Measure(aggregate(agg, pts), len(pts), 1, self.unit)


@dataclasses.dataclass(frozen=True)
class PerBucket(_Series):
    """One value per bucket (or window) with a known wall time: value(backend, window, wall_s)."""

    value: Callable[[BackendIndex, Window, float], float | None]
    unit: ClassVar[str] = "buckets"
    empty: ClassVar[str] = "no bucket with a known wall time"

    def of(self, bi: BackendIndex, w: Window) -> float | None:
        wall = w.wall_s
        if not wall:
            return None
        return self.value(bi, w, wall)

    def points(self, scope: Scope) -> list[float]:
        return [v for bi, w in scope.windows if (v := self.of(bi, w)) is not None]


@dataclasses.dataclass(frozen=True)
class WholePerBucket(PerBucket):
    """A PerBucket whose value a bucket with a known wall time may still not know (None: a
    request it counts lacks what the value needs -- total_throughput's prompt count). The
    scope then has no points at all, and its measure says why: a min or mean over the buckets
    that do know would judge a scope by part of it (missing data is never a pass)."""

    why: str = "a request without the value's data"

    def _known(self, scope: Scope) -> tuple[list[float], int]:
        pts, unknown = [], 0
        for bi, w in scope.windows:
            if not w.wall_s:
                continue
            v = self.of(bi, w)
            if v is None:
                unknown += 1
            else:
                pts.append(v)
        return pts, unknown

    def points(self, scope: Scope) -> list[float]:
        pts, unknown = self._known(scope)
        return [] if unknown else pts

    def measure(self, scope: Scope, agg: str | None, percentile: float | None = None, *,
                confidence: float = 0.95, min_samples: int = 1) -> Measure:
        pts, unknown = self._known(scope)
        if unknown:
            return Measure(None, len(pts), 1, self.unit, f"{unknown} of {unknown + len(pts)} buckets {self.why}")
        return super().measure(scope, agg, percentile, confidence=confidence, min_samples=min_samples)


@dataclasses.dataclass(frozen=True)
class PerSample(_Series):
    """One value per telemetry sample that falls inside one of the scope's windows."""

    value: Callable[[Row], float | None]
    unit: ClassVar[str] = "samples"
    empty: ClassVar[str] = "no telemetry samples"

    def points(self, scope: Scope) -> list[float]:
        pts: list[float] = []
        for bi, w in scope.windows:
            if w.start is None or w.end is None:
                continue
            pts.extend(v for s in bi.samples_between(w.start, w.end) if (v := self.value(s)) is not None)
        return pts


def in_flight(all_records: Iterable[Row], start: float, end: float) -> float | None:
    """Mean number of requests in flight over [start, end): the exact time integral of the
    in-flight count divided by the window length."""
    if end <= start:
        return None
    parts = []
    for r in all_records:
        s = num(r.get("start"))
        e = num(r.get("end"))
        if s is None:
            continue
        e = s if e is None else e
        lo, hi = max(s, start), min(e, end)
        if hi > lo:
            parts.append(hi - lo)
    return math.fsum(parts) / (end - start)


def in_flight_spans(bi: BackendIndex, start: float, end: float) -> float | None:
    """`in_flight` over the backend's every request, from its columns: only the requests
    that started before `end` and may still run at `start` are looked at."""
    if end <= start:
        return None
    sp = bi.spans
    rows = sp.between(start - sp.longest, end)
    s, e = bi.table.f["start"][rows], bi.table.f["end"][rows]  # type: ignore[union-attr]
    a = np.maximum(s, start)
    b = np.minimum(np.where(np.isnan(e), s, e), end)
    d = b - a
    return math.fsum(d[d > 0].tolist()) / (end - start)


def _tokens(r: Row) -> float:
    key = "output_tokens" if usage_ok(r) else "chunks"  # a contradicted count: its chunks, a lower bound
    return float(num(r.get(key)) or 0.0)


tokens = Columnar(_tokens, lambda t, idx: np.nan_to_num(np.where(t.usage_ok(idx), t.number("output_tokens", idx),
                                                                 t.number("chunks", idx)), nan=0.0))

# A completed request of the load: not the clean follow-up (bucket FOLLOW_UP_BUCKET), which
# measures the server after the load, not what it delivered under it.
served = Columnar(lambda r: r.get("outcome") == "completed" and r.get("bucket") != FOLLOW_UP_BUCKET,
                  lambda t, idx: t.label_is("outcome", "completed", idx) & (t.i["bucket"][idx] != FOLLOW_UP_BUCKET))


def _prompt(r: Row) -> float:
    v = num(r.get("prompt_tokens"))
    return math.nan if v is None else v


# a request's prompt tokens, NaN where the server reported none (`total`: then no total is known)
prompt = Columnar(_prompt, lambda t, idx: t.number("prompt_tokens", idx))


def _total(out: float, prompts: Iterable[float]) -> float:
    """Output plus prompt tokens; NaN when a request's prompt count is unknown: a total
    without it would read as the whole (a server that reports no prompt usage would show its
    output throughput as its total)."""
    ps = list(prompts)
    return math.nan if any(math.isnan(p) for p in ps) else out + math.fsum(ps)


def delivered(all_records: Iterable[Row], start: float, end: float) -> tuple[int, float]:
    """(requests, output tokens) the server delivered over [start, end): its completed
    requests whose `end` lies in [start, end), and their output tokens (`tokens`: the reported
    count, or the text chunks where usage contradicts the stream). What k6, vLLM's bench serve
    and GuideLLM count per wall second. Not the requests that *started* in the window: against
    a server slower than an open loop's arrivals, those are the arrival rate, not what it served.

    Over the backend's every request (`all_records`), whichever bucket it started in -- a
    warm-up request that ends in bucket 0 counts there: the server delivered it then -- except
    the clean follow-up. A request needs a start before `end` (every request that ends in the
    window has one, unless recorded ending before it started). Not restricted to the window's
    own level: a backend's levels run one after another (runner/driver.py), each drained
    before the next one's warm-up begins and the follow-up after the last, so only the
    window's own level's requests (its warm-up too) can end inside it; requests of several
    levels could only meet in one window if levels overlapped, and then the server did
    deliver them all; restricting to the level would look up each request's level for no
    difference in any evidence the runner writes. `in_flight` reads the same requests (the
    follow-up too: it runs after every window)."""
    out = [_tokens(r) for r in delivered_records(all_records, start, end)]
    return len(out), math.fsum(out)


def delivered_records(all_records: Iterable[Row], start: float, end: float) -> list[Row]:
    """The requests `delivered` counts over [start, end) (see there)."""
    out = []
    for r in all_records:
        if not served(r):
            continue
        s, e = num(r.get("start")), num(r.get("end"))
        if s is None or e is None or not (start <= e < end and s < end):
            continue
        out.append(r)
    return out


def delivered_spans(bi: BackendIndex, start: float, end: float) -> tuple[int, float]:
    """`delivered` over the backend's columns: only the requests that started before `end` and
    may still run at `start` (`SpanIndex.between`, as `in_flight_spans`) are looked at, a
    SCAN_CHUNK of them at a time."""
    n, kept = 0, []
    for done in delivered_parts(bi, start, end):
        n += len(done)
        kept.append(column(done, tokens))
    return n, math.fsum(v for k in kept for v in k.tolist())


def delivered_parts(bi: BackendIndex, start: float, end: float) -> Iterator[Rows]:
    """The requests `delivered_spans` counts, a `Rows` selection per SCAN_CHUNK of candidates."""
    sp = bi.spans
    t = bi.table
    assert t is not None
    # no request that ends at or after `start` started before start - longest; a few ulps more
    # cover the rounding of end - start and of the subtraction (the exact test is on `end` below)
    lo = start - sp.longest
    lo -= 4 * (math.ulp(abs(start)) + math.ulp(sp.longest))
    rows = sp.between(lo, end)
    step = table_module.SCAN_CHUNK
    for a in range(0, len(rows), step):
        part = rows[a:a + step]
        e = t.f["end"][part]
        part = part[(e >= start) & (e < end)]  # NaN (no end): never
        if not len(part):
            continue
        done = Rows.of(t, part).where(served.col, served.row)  # rows with extras through their views
        if done:
            yield done


def delivered_in(bi: BackendIndex, w: Window) -> list[Iterable[Row]]:
    """The requests the server delivered in window `w` (`delivered`): what its qps counts."""
    if bi.table is not None:
        return list(delivered_parts(bi, w.start, w.end))  # type: ignore[arg-type]
    return [delivered_records(bi.all_records, w.start, w.end)]  # type: ignore[arg-type]


def _delivered(bi: BackendIndex, w: Window) -> tuple[int, float]:
    if bi.table is not None:
        return delivered_spans(bi, w.start, w.end)  # type: ignore[arg-type]
    return delivered(bi.all_records, w.start, w.end)  # type: ignore[arg-type]


def _delivered_total(bi: BackendIndex, w: Window) -> float:
    """Prompt plus output tokens of the requests the server delivered in the window
    (`delivered`); NaN when one of them has no prompt count (`_total`)."""
    if bi.table is not None:  # whole columns a chunk at a time (token counts: float64 sums are exact)
        total = 0.0
        for part in delivered_parts(bi, w.start, w.end):  # type: ignore[arg-type]
            ps = column(part, prompt)
            if np.isnan(ps).any():
                return math.nan
            total += float(np.sum(column(part, tokens))) + float(np.sum(ps))
        return total
    recs = delivered_records(bi.all_records, w.start, w.end)  # type: ignore[arg-type]
    return _total(math.fsum(_tokens(r) for r in recs), (_prompt(r) for r in recs))


def qps(bi: BackendIndex, w: Window, wall: float) -> float | None:
    """Completed requests per second the server delivered in the window (`delivered`)."""
    return _delivered(bi, w)[0] / wall


def throughput(bi: BackendIndex, w: Window, wall: float) -> float | None:
    """Output tokens per second of the requests the server delivered in the window (`delivered`)."""
    return _delivered(bi, w)[1] / wall


def total_throughput(bi: BackendIndex, w: Window, wall: float) -> float | None:
    """Prompt plus output tokens per second of the requests the server delivered in the window
    (`delivered`: by the bucket they ended in, as `throughput`): vLLM's bench serve's "total
    token throughput", but per bucket. None when a delivered request has no prompt count."""
    v = _delivered_total(bi, w) / wall
    return None if math.isnan(v) else v


def bucket_in_flight(bi: BackendIndex, w: Window, wall: float) -> float | None:
    if bi.table is not None:
        return in_flight_spans(bi, w.start, w.end)  # type: ignore[arg-type]
    return in_flight(bi.all_records, w.start, w.end)  # type: ignore[arg-type]


def rss(s: Row) -> float | None:
    """The server tree's resident memory in a sample: its PSS sum (every shared page once,
    `telemetry.process_tree_pss`) where the sample has it, else its RSS sum (evidence from
    before, a kernel without smaps_rollup)."""
    pss = num(s.get("server_pss_bytes"))
    return pss if pss is not None else num(s.get("server_rss_bytes", s.get("rss")))


def gpu_sum(key: str) -> Callable[[Row], float | None]:
    """The sample's `key` summed over its GPUs; None (the sample says nothing) when a GPU of
    the sample does not report it -- a GPU lost mid-run, a call NVML refused on one device -- as
    the others' sum alone would read as the whole (half the memory of two GPUs: a pass, a drift)."""

    def value(s: Row) -> float | None:
        gpus = s.get("gpus")
        if not isinstance(gpus, list):
            return None
        vals = []
        for g in gpus:
            if not isinstance(g, Mapping):
                continue
            v = num(g.get(key))
            if v is None:
                return None
            vals.append(v)
        return math.fsum(vals) if vals else None

    return value


# ------------------------------------------------------------------------------ drift / slope


def quarters(n: int) -> int:
    return max(1, n // 4)


def relative_change(first: float, last: float) -> float | None:
    """(last - first) / |first|; None where it is not a number: a zero baseline with a non-zero
    end, or a baseline so close to 0 (a subnormal) that the ratio overflows to infinity."""
    if first == 0:
        return 0.0 if last == 0 else None
    v = (last - first) / abs(first)
    return v if math.isfinite(v) else None


def drift(values: Sequence[float]) -> float | None:
    """Median of the last quarter relative to the median of the first (None: < 2 values, or a
    zero baseline with a non-zero end)."""
    n = len(values)
    if n < 2:
        return None
    k = quarters(n)
    first = stats.median(values[:k])
    last = stats.median(values[n - k:])
    return relative_change(first, last)  # type: ignore[arg-type]


def centred(times: Sequence[float]) -> tuple[list[float], float] | None:
    """Each time less their mean, and the sum of those squared (None: no time spread): a
    slope's weights are these over the sum (`slope`; `performance._trend_bounds` bounds it)."""
    if not times:
        return None
    mt = math.fsum(times) / len(times)
    dev = [t - mt for t in times]
    sxx = math.fsum(d ** 2 for d in dev)
    return (dev, sxx) if sxx != 0 else None


def slope(times: Sequence[float], values: Sequence[float]) -> float | None:
    """Least-squares slope of values against times (seconds), per minute, relative to the
    mean value (None: < 2 points, no time spread, or a zero mean with a non-zero slope)."""
    n = len(values)
    if n < 2 or len(times) != n or (c := centred(times)) is None:
        return None
    dev, sxx = c
    mv = math.fsum(values) / n
    sxy = math.fsum(d * (v - mv) for d, v in zip(dev, values))
    per_min = sxy / sxx * 60.0
    if mv == 0:
        return 0.0 if per_min == 0 else None
    v = per_min / abs(mv)
    return v if math.isfinite(v) else None  # a mean so close to 0 that the ratio overflows: as a zero mean


def bucket_series(bi: BackendIndex, levels: Sequence[LevelIndex], impl: MetricImpl, agg: str | None,
                  percentile: float | None, *, confidence: float = 0.95, min_samples: int = 1) -> list[tuple[Scope, Measure]]:
    """agg(metric) in each bucket of `levels`, in order."""
    return [
        (sc, _known(impl.measure(sc, agg, percentile, confidence=confidence, min_samples=min_samples)))
        for lv in levels
        for w in lv.buckets
        for sc in [bucket_scope(bi, lv, w)]
    ]


def _known(m: Measure) -> Measure:
    """`m`, or none where its value is only a bound (lower or upper): a drift or slope of it
    would be a number the server never measured."""
    return dataclasses.replace(m, value=None) if m.at_least or m.at_most else m

