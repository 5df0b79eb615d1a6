"""The server's own metrics: `server("family")` in rules, and the `metrics_scraped` check.

What the runner scraped (`runner/scrape.py`: backends/<name>/metrics.jsonl, one line per
scrape, each kept family summed over its label sets, a ratio gauge averaged) is read here on the client's timeline,
over a scope's bucket windows (the index/scope API: `Scope.windows`):

  gauge      the scrapes that fall inside the windows: min, max, mean, pNN of their values;
             +Inf and -Inf compared as they are (a mean over both, or a drift over either,
             no figure), and a scrape the server answered NaN for (`Series.nan_at`) makes
             the scope INCONCLUSIVE but where the rest decides it (a max beyond its ceiling)
  counter    bare = its increase over the scope (a reset -- the value going down -- counts
             the new value as the increase since it; each label set its own counter where the
             scrape kept them, `Series.by`, summed after); rate() = increase / seconds; mean, min,
             max = over the per-bucket rates; beyond the label sets a scrape keeps one by
             one (64), each scrape's `step` -- its increase since the previous one, per label
             set, which the scraper computes from every label set it has seen -- and where a
             row has none (evidence from before it) a fall of the sum over several label sets
             is INCONCLUSIVE: a reset and a label set gone cannot be told apart
  histogram  mean = the scope's Δsum / Δcount (the mean observation; in a drift or slope,
             within `histogram_mean_interval`, its spread from the buckets); min, max = over the
             per-bucket means; pNN = a quantile estimate from the Δ bucket counts, linear
             within the bucket it falls in (Prometheus' histogram_quantile), carrying that
             bucket's bounds (`Measure.bounds`, `coarse`): a rule is judged on the bucket, not
             the interpolation -- a threshold inside it INCONCLUSIVE, one at or beyond its
             bounds decided, then the overage rule with as many observations beyond the
             threshold as the buckets allow (`beyond`); its observations count as at most one
             draw a request of the scope (`Measure.units`: a per-token histogram observes
             every token of a request); in the +Inf bucket only a
             lower bound, the largest finite bound (`Measure.at_least`: the rule is judged
             for every value from it up), in a lowest bucket bounded at or below 0 only an
             upper bound, that bound (`Measure.at_most`: judged for every value from it
             down; SGLang's queue time has le="0.0"); bare = observations, rate() =
             observations per second; the quantile's value is Prometheus' own
             (`quantile_estimate`), a _sum of +Inf (an observation of +Inf) a mean of +Inf,
             or none between two such sums (`_sum_change`)
  summary    mean only (Δsum / Δcount)
  ratio      `ratio(server("num"), server("den"))`: two counters' bare increases over the
             scope divided (`ServerRatio`); no ratio where the denominator did not increase

A counter's or histogram's change over a window is taken between the last scrape at or before
the window's start (else its first scrape inside) and the first scrape at or after its end
(else its last inside): it covers the window, by at most 1.5 scrape intervals more where the
window is covered (`_gap`). A counter
or histogram absent from the successful scrapes before its first appearance had no series
there, its sum 0 (a labelled family shows no line before its first event): the last such
scrape is its first point (`Series.born`), so its first value counts; absent after it, a
scrape is a gap, never a reset. Adjacent
windows of one scope are merged into one span first, so a level's increase is counted once.

A percentile of a histogram needs as many observations as the gate's percentile rule
(`stats.min_samples_for_percentile`); everything else needs one scrape (two for a change).
Missing is never a pass: no scrape in a window, a family the server does not expose, or an
endpoint that answered 404 ("not available") is INCONCLUSIVE with the reason; so is a scope
with a bucket no successful scrape covers (`_uncovered`, `_gap`: from the last scrape at or
before it to the first at or after it, none failed and none further from the next than a
scrape interval and its timeout; the same for every rule kind), but where the rest is a lower bound
that decides it (a gauge's max, a counter's or histogram's bare count not taken across a gap
to a scrape beyond the scope: `Measure.at_least`), or an upper bound that does (a gauge's min:
`Measure.at_most`). Of scrapes the server answered NaN in, a
gauge's max over the rest is a lower bound and its min an upper one (`Measure.at_most`).
"""

from __future__ import annotations

import bisect
import dataclasses
import decimal
import itertools
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from soakspec.judge import stats
from soakspec.judge.common import backend_here, format_value, plural, problem, result
from soakspec.judge.index import BackendIndex
from soakspec.judge.joined import JudgedRun
from soakspec.judge.measures import Measure
from soakspec.judge.scrapes import Scrapes, Series
from soakspec.judge.scope import Scope
from soakspec.judge.verdict import Instance, RuleResult
from soakspec.lang.metrics import Kind
from soakspec.lang.spec import Rule

EPS = 1e-6


# ------------------------------------------------------------------------------ the series


def scrapes(bi: BackendIndex) -> Scrapes:
    """The backend's scrapes (`BackendEvidence.metrics`: built once, while the file is read)."""
    return bi.evidence.metrics


def find(bi: BackendIndex, name: str) -> Series | None:
    """The family `name` of the backend, also found without or with its `_total` suffix."""
    s = scrapes(bi).series
    return s.get(name) or s.get(name + "_total") or (s.get(name[:-6]) if name.endswith("_total") else None)


def unavailable(bi: BackendIndex) -> str | None:
    """Why the backend has no server metrics at all (None: it has successful scrapes)."""
    entry = bi.evidence.entry.get("metrics")
    if not isinstance(entry, Mapping):
        return "no server metrics were scraped for this backend (metrics off, or evidence from before they existed)"
    status = entry.get("status")
    if status == "not available":
        return f"the server has no {entry.get('path', '/metrics')} (its first scrape answered {entry.get('first_error')}: not available)"
    sc = scrapes(bi)
    if not sc.ok_times:
        return (f"no successful scrape of {entry.get('path', '/metrics')} ({sc.failed} of {plural(sc.total, 'scrape')} failed; "
                f"first: {(sc.first_failed or {}).get('error')})")
    return None


def absent(bi: BackendIndex, family: str) -> str:
    """Why `family` has no series on a backend whose /metrics answered: it never showed it."""
    entry = bi.evidence.entry.get("metrics")
    path = entry.get("path", "/metrics") if isinstance(entry, Mapping) else "/metrics"
    sc = scrapes(bi)
    ok = len(sc.ok_times)
    failed = f" ({sc.failed} more failed; first: {(sc.first_failed or {}).get('error')})" if sc.failed else ""
    return (f"the server's {path} has no '{family}': it answered {plural(ok, 'scrape')}{failed}, none with it "
            "(a name the server does not expose, or one it shows only once it has counted something)")


# ------------------------------------------------------------------------------ windows


def spans(scope: Scope) -> list[tuple[BackendIndex, float, float]]:
    """The scope's windows with a known wall-clock span, adjacent ones of a backend merged."""
    out: list[tuple[BackendIndex, float, float]] = []
    for bi, w in sorted(((bi, w) for bi, w in scope.windows if w.start is not None and w.end is not None),
                        key=lambda p: (p[0].name, p[1].start)):
        if out and out[-1][0] is bi and w.start <= out[-1][2] + EPS:  # type: ignore[operator]
            out[-1] = (bi, out[-1][1], max(out[-1][2], w.end))  # type: ignore[type-var]
        else:
            out.append((bi, w.start, w.end))  # type: ignore[arg-type]
    return out


def windows(scope: Scope) -> list[tuple[BackendIndex, float, float]]:
    """Each of the scope's windows with a known span, unmerged (per-bucket values)."""
    return [(bi, w.start, w.end) for bi, w in scope.windows if w.start is not None and w.end is not None]


def inside(s: Series, start: float, end: float) -> range:
    return range(bisect.bisect_left(s.times, start), bisect.bisect_left(s.times, end))


def bracket(s: Series, start: float, end: float) -> tuple[int, int] | None:
    """Indexes of the scrapes a change over [start, end) is taken between (module docstring)."""
    lo = bisect.bisect_right(s.times, start) - 1
    if lo < 0:
        lo = bisect.bisect_left(s.times, start)
    hi = bisect.bisect_left(s.times, end)
    if hi >= len(s.times):
        hi = bisect.bisect_left(s.times, end) - 1
    if lo >= len(s.times) or hi <= lo:
        return None
    return lo, hi


def span_of(s: Series, start: float, end: float) -> tuple[int, int] | None:
    """`bracket`, with index -1 for the family's birth (`Series.born`: the successful scrape
    before its first, where it had no series, its sum 0) where its first scrape is after `start`."""
    if s.born is not None and len(s.times) and start < s.times[0] and s.born < end:
        return -1, min(bisect.bisect_left(s.times, end), len(s.times) - 1)
    return bracket(s, start, end)


def _time(s: Series, i: int) -> float:
    return s.born if i < 0 else s.times[i]  # type: ignore[return-value]


class AmbiguousFall(Exception):
    """A counter's sum over several label sets went down between two scrapes that kept neither
    its label sets (`by`) nor its per-label-set increase (`step`): a reset and a label set gone
    read the same."""


def _increase_steps(s: Series, lo: int, hi: int) -> float:
    """The increase between scrapes lo and hi (-1: the family's birth) without `by`: each
    scrape's `step` where it has one (each label set's own increase since the previous scrape,
    written by the scraper), else its sum's rise; a fall of the sum with no `step` is
    `AmbiguousFall` where either scrape summed several label sets, never read as a reset of
    every label set (one label set, or a row that does not say: a reset, its new value counts)."""
    inc, prev, prev_n = 0.0, None, math.nan
    for i in range(lo, hi + 1):
        v = 0.0 if i < 0 else s.value(i)
        if v is None:
            continue
        n = s.serieses[i] if i >= 0 and s.serieses is not None else math.nan
        if prev is not None:
            step = s.steps[i] if s.steps is not None else math.nan
            if step == step:
                inc += step
            elif v >= prev:
                inc += v - prev
            elif not (n > 1 or prev_n > 1):
                inc += v
            else:
                raise AmbiguousFall(f"'{s.name}' went down from {prev:g} to {v:g} between two scrapes that kept only its sum "
                                    "(more label sets than the scrape keeps one by one): a reset and a label set gone read the same")
        prev, prev_n = v, n
    return inc


def _increase(vals: Sequence[float]) -> float:
    inc = 0.0
    for a, b in zip(vals, vals[1:]):
        inc += b - a if b >= a else b  # a reset: the new value is what it counted since
    return inc


def counter_change(s: Series, start: float, end: float) -> tuple[float, float, int] | None:
    """(increase, seconds between the bracketing scrapes, scrapes used) over [start, end)."""
    b = span_of(s, start, end)
    if b is None:
        return None
    vals = [v for i in range(b[0], b[1] + 1) if (v := (0.0 if i < 0 else s.value(i))) is not None]
    if len(vals) < 2:
        return None
    inc = _increase_steps(s, *b) if s.by is None else _increase_by(s, *b)
    return inc, s.times[b[1]] - _time(s, b[0]), b[1] - b[0] + 1


def _increase_by(s: Series, lo: int, hi: int) -> float:
    """The increase between scrapes lo and hi (-1: the family's birth) summed over its label
    sets, each its own counter (Prometheus' sum(increase(...))): a label set going down is its
    own reset, one gone from a scrape a gap; one whose first scrape is after lo had no series
    before, so 0."""
    assert s.by is not None and s.by_first is not None
    inc = 0.0
    for lab, arr in s.by.items():
        vals = [0.0] if lo < s.by_first[lab] <= hi else []
        vals += [v for i in range(max(lo, 0), hi + 1) if (v := arr[i]) == v]
        inc += _increase(vals)
    return inc


@dataclasses.dataclass(frozen=True)
class HistDelta:
    sum: float
    count: float
    buckets: tuple[tuple[float | None, float], ...]  # (le, cumulative Δcount); None: +Inf
    seconds: float
    scrapes: int


def hist_change(s: Series, start: float, end: float) -> HistDelta | None:
    b = span_of(s, start, end)
    if b is None:
        return None
    count = 0.0
    parts: list[float] = []
    buckets: dict[float | None, float] = {}
    pts = [(0.0, 0.0, {}) if i < 0 else s.hist(i) for i in range(b[0], b[1] + 1)]
    for (s0, c0, b0), (s1, c1, b1) in zip(pts, pts[1:]):
        reset = c1 < c0
        parts.append(s1 if reset else s1 - s0)
        count += c1 if reset else c1 - c0
        for le, v in b1.items():
            buckets[le] = buckets.get(le, 0.0) + (v if reset else v - b0.get(le, 0.0))
    order = sorted(buckets, key=lambda le: math.inf if le is None else le)
    return HistDelta(_sum_change(parts), count, tuple((le, buckets[le]) for le in order), s.times[b[1]] - _time(s, b[0]), b[1] - b[0] + 1)


PRECISION = 1e-12  # histogram_quantile's tolerance for float noise in cumulative bucket counts


def _fraction(q: float) -> float:
    """The percentile `q` as the fraction a PromQL query writes (p99.9: 0.999, the double
    nearest that decimal; 99.9 / 100 is one ulp above it, and a rank on a bucket's edge would
    fall in the next bucket)."""
    return float(decimal.Decimal(repr(q)) / 100)


def _sum_change(parts: Sequence[float]) -> float:
    """A histogram's Δsum from its changes between consecutive scrapes. A _sum of +Inf (an
    observation of +Inf; Prometheus keeps the _sum so until a restart): its change from a
    finite one is +Inf, and between two +Inf ones (inf - inf) unknown, NaN -- but one that
    stayed +Inf saw no -Inf (that makes it NaN), so a change with a +Inf among unknown ones is
    +Inf. NaN: unknown."""
    if all(math.isfinite(p) for p in parts):
        return math.fsum(parts)
    infs = {p for p in parts if math.isinf(p)}
    return infs.pop() if len(infs) == 1 else math.nan


def quantile_estimate(q: float, buckets: Sequence[tuple[float | None, float]]) -> tuple[float | None, tuple[float, float | None]]:
    """The q-th percentile of a histogram's observations (cumulative counts by `le`, None: +Inf)
    and the bounds of the bucket it falls in -- the estimate's resolution: the true quantile of
    the observations lies within them, so the estimate is off by at most the bucket's width.

    The value is Prometheus' `histogram_quantile(q/100, ...)` of the same counts, rule for rule
    (promql/quantile.go `bucketQuantile`), so that a user comparing with Grafana sees the same
    number: counts within 1e-12 of the previous bound's made equal to it, then made monotonic
    (each at least the one below it); the rank q * (the +Inf bucket's count) found in the first
    bucket whose count reaches it and interpolated linearly within it, from 0 in the lowest
    bucket where its bound is above 0; in the +Inf bucket the largest finite bound (a lower
    bound: `(bound, None)`); in a lowest bucket whose bound is 0 or below that bound (an upper
    bound: `(-inf, bound)`). None (Prometheus' NaN, no figure) without a +Inf bucket, with fewer
    than two buckets, with no observations, or where the rank is 0 in an empty lowest bucket."""
    if not buckets or buckets[-1][0] is not None or len(buckets) < 2 or not 0 <= q <= 100:
        return None, (0.0, None)
    counts = [n for _, n in buckets]
    prev = counts[0]
    for i in range(1, len(counts)):  # correctPrecisionErrors
        delta = abs(counts[i] - prev)
        if delta == 0:
            continue
        if counts[i] != 0 and delta / counts[i] <= PRECISION:
            counts[i] = prev
        else:
            prev = counts[i]
    counts = list(itertools.accumulate(counts, max))  # ensureMonotonic
    total = counts[-1]
    if not total > 0:
        return None, (0.0, None)
    rank = _fraction(q) * total
    b = next((i for i, n in enumerate(counts[:-1]) if n >= rank), len(counts) - 1)
    if b == len(counts) - 1:
        top = buckets[-2][0]
        return top, (top, None)  # type: ignore[return-value]
    le = buckets[b][0]
    assert le is not None
    if b == 0 and le <= 0:
        return le, (-math.inf, le)
    start, count = (0.0, counts[0]) if b == 0 else (buckets[b - 1][0], counts[b] - counts[b - 1])
    if count <= 0:
        return None, (start, le)  # type: ignore[return-value]  # 0 / 0: Prometheus' NaN
    return start + (le - start) * ((rank - (counts[b - 1] if b else 0.0)) / count), (start, le)  # type: ignore[operator]


def pooled(deltas: Sequence[HistDelta]) -> tuple[tuple[float | None, float], ...]:
    acc: dict[float | None, float] = {}
    for d in deltas:
        for le, n in d.buckets:
            acc[le] = acc.get(le, 0.0) + n
    return tuple((le, acc[le]) for le in sorted(acc, key=lambda le: math.inf if le is None else le))


# ------------------------------------------------------------------------------ the metric


_AGG = {"mean": stats.mean, "min": min, "max": max}


@dataclasses.dataclass(frozen=True)
class ServerMetric:
    """`agg(server("family"))` over one scope instance (see the module docstring)."""

    family: str | None

    def measure(self, scope: Scope, agg: str | None, percentile: float | None = None, *,
                confidence: float = 0.95, min_samples: int = 1) -> Measure:
        if self.family is None:
            return Measure(None, 0, 1, "scrape", "server() needs a metric name")
        series, why = [], []
        for bi in scope.backends:
            s = find(bi, self.family)
            if s is not None:
                series.append(s)
            else:
                why.append(unavailable(bi) or absent(bi, self.family))
        if why or not series:
            return Measure(None, 0, 1, "scrape", why[0] if why else "no backend in the scope")
        kind = series[0].type
        if changed := next((s for s in series if len(s.kinds) > 1), None):
            return Measure(None, 0, 1, "scrape", f"'{self.family}' changed type during the run ({' then '.join(changed.kinds)}): "
                           "its scrapes are not one series")
        agg = "p" if percentile is not None else (agg or "count")
        impl = _KINDS.get(kind, _gauge)
        m = impl(self.family, scope, agg, percentile, confidence, min_samples)
        if m.value is None or not (gaps := _uncovered(scope, self.family, kind, agg)):
            return m
        why = f"no scrape of '{self.family}' covers {len(gaps)} of {plural(len(windows(scope)), 'bucket')} of the scope"
        bi0, a0, _, g0 = gaps[0]
        interval, tol = _interval(bi0), _tolerance(bi0)
        if math.isfinite(g0) and interval is not None and tol is not None:
            why += (f" (its successful scrapes {g0:.3g} s apart around one, more than a {interval:g} s scrape interval "
                    f"and its timeout: {tol:.3g} s)")
        if failed := [bi for bi in scope.backends if scrapes(bi).failed]:
            sc = scrapes(failed[0])
            why += f" ({sc.failed} of {plural(sc.total, 'scrape')} failed; first: {(sc.first_failed or {}).get('error')})"
        if (kind == "gauge" and agg == "max") or (kind in ("counter", "histogram") and agg == "count" and not _spills(scope, self.family)):
            # what the buckets it saw hold, the unseen ones can only add to: a lower bound (a
            # change taken across a gap to a scrape far outside the scope is not: it counts
            # what happened outside)
            return dataclasses.replace(m, reason=why, at_least=True)
        if kind == "gauge" and agg == "min":  # the mirror: the unseen buckets can only lower it
            return dataclasses.replace(m, reason=why, at_most=True)
        return Measure(None, m.samples, m.needed, m.unit, why)


def histogram_beyond(metric: ServerMetric, scope: Scope, op: str, t: float, *, least: bool = False) -> tuple[int, int] | None:
    """(observations, at most -- `least`: at least -- how many do not satisfy `value op t`:
    `beyond`) of `metric`'s histogram over `scope`; None where it is not a histogram or has no
    buckets there."""
    if metric.family is None or not scope.backends:
        return None
    s = find(scope.backends[0], metric.family)
    if s is None or s.type != "histogram":
        return None
    buckets = pooled(_deltas(metric.family, scope, "p"))
    if not buckets or buckets[-1][1] <= 0:
        return None
    return int(round(buckets[-1][1])), beyond(buckets, op, t, least=least)


def histogram_mean_interval(metric: ServerMetric, scope: Scope, confidence: float) -> tuple[float, float] | None:
    """Where the mean of `metric`'s histogram over `scope` (its Δsum / Δcount, exact) may lie
    given the observations it rests on: mean -+ t s / sqrt(u), Student's t with u - 1 degrees
    of freedom at `confidence` on each side, u the observations -- at most one a request of the
    scope (`_requests`) -- and s their spread as the buckets give it, each observation at its
    bucket's midpoint plus Sheppard's h^2 / 12 for the spread within a bucket (the textbook
    estimate for grouped values, as a client mean's interval is the textbook one).
    (-inf, inf) where an observation lies in the +Inf bucket (no spread can be bounded) or
    there are fewer than 2; None where it is not a histogram with buckets."""
    if metric.family is None or not scope.backends:
        return None
    s = find(scope.backends[0], metric.family)
    if s is None or s.type != "histogram":
        return None
    deltas = _deltas(metric.family, scope, "mean")
    buckets = pooled(deltas)
    n = math.fsum(d.count for d in deltas)
    if not buckets or n < 2:
        return None if not buckets else (-math.inf, math.inf)
    mean = _ieee_sum(d.sum for d in deltas) / n
    if not math.isfinite(mean):
        return -math.inf, math.inf  # an observation of +Inf: no spread can be bounded
    ss, prev_le, prev_n = 0.0, 0.0, 0.0
    for le, cum in zip((le for le, _ in buckets), itertools.accumulate((c for _, c in buckets), max)):
        k = max(0.0, min(cum, n) - prev_n)  # this bucket's observations (counts made monotonic, as `beyond`)
        if le is None:
            if k > 0:
                return -math.inf, math.inf
            break
        h = le - prev_le
        ss += k * ((prev_le + h / 2 - mean) ** 2 + h * h / 12)
        prev_le, prev_n = le, prev_n + k
    units = _requests(scope, int(round(n))) or int(round(n))
    if units < 2:
        return -math.inf, math.inf
    half = stats.t_quantile(confidence, units - 1) * math.sqrt(ss / (n - 1) / units)
    return mean - half, mean + half


# How far apart a family's successful scrapes around and inside a bucket may be, with none
# failed, and still cover it (`_tolerance`): a scrape interval and the scrape's timeout. The
# scraper starts each scrape on the first slot after the last one's answer, so a /metrics
# answering just inside its timeout, or a scraper held up by its own machine (a real vLLM on
# the same CPUs: one slot in 25 missed, readings 4.8 s apart every 2.5 s asked), leaves gaps
# that long with nothing missing; and every scrape is a point sample of a gauge however dense.
# What coverage asks is that nothing *failed*: a failed scrape among the readings around a
# bucket leaves it uncovered whatever the successes either side say (`_gap`). (The audit fix
# first held readings to 1.5 intervals apart: the real-server lane's soak went INCONCLUSIVE on
# that one missed slot.) A gap longer than interval + timeout is scrapes never made.


def _tolerance(bi: BackendIndex) -> float | None:
    """How far apart successful scrapes may be and still cover what lies between them: the
    backend's scrape interval and timeout (the manifest's; half an interval where it records no
    timeout). None: no interval known."""
    interval = _interval(bi)
    if interval is None:
        return None
    entry = bi.evidence.entry.get("metrics")
    t = entry.get("timeout_s") if isinstance(entry, Mapping) else None
    timeout = float(t) if isinstance(t, (int, float)) and not isinstance(t, bool) and math.isfinite(t) and t >= 0 else interval / 2
    return interval + timeout + EPS


def _interval(bi: BackendIndex) -> float | None:
    """The backend's scrape interval: the manifest's `interval_s`, else (evidence from before
    it) the median time between its scrapes. None: neither."""
    entry = bi.evidence.entry.get("metrics")
    v = entry.get("interval_s") if isinstance(entry, Mapping) else None
    if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 0:
        return float(v)
    ts = scrapes(bi).times
    gaps = sorted(y - x for x, y in zip(ts, ts[1:]) if y - x > EPS)
    return gaps[len(gaps) // 2] if gaps else None


def _readings(bi: BackendIndex, s: Series, kind: str, lo: float, hi: float) -> list[float]:
    """When the family was read in [lo, hi]: its successful scrapes with a value or a gauge's
    NaN (`Series.answered`: the scrape read it; what NaN means is the rule's, `_gauge`), a
    histogram's or summary's every one, and for a counter, histogram or summary every successful scrape up
    to its birth (`Series.born`: no series there, its sum 0)."""
    out = [s.times[i] for i in range(bisect.bisect_left(s.times, lo), bisect.bisect_right(s.times, hi))
           if kind in ("histogram", "summary") or s.answered(i)]
    if s.born is not None and kind in ("counter", "histogram", "summary") and lo <= s.born:
        ok = scrapes(bi).ok_times
        out = list(ok[bisect.bisect_left(ok, lo):bisect.bisect_right(ok, min(hi, s.born))]) + out
    return out


def _gap(bi: BackendIndex, s: Series, kind: str, a: float, b: float, tol: float) -> float | None:
    """None where the family's readings cover [a, b), else the gap that leaves it uncovered
    (math.inf: a failed scrape). Covered: from the last scrape at or before `a` to the first at
    or after `b` (where the scraping had begun or not yet ended: the edge itself) every scrape
    succeeded and read the family, no two readings more than `tol` apart (`_tolerance`). A
    failed scrape among them -- before `a`, inside, after `b` -- leaves the bucket uncovered,
    whatever the successes either side say: a counter's change across it may hide a restart, a
    gauge's peak may be in it."""
    sc = scrapes(bi)
    before, after = _reading_near(bi, s, kind, a, -1), _reading_near(bi, s, kind, b, 1)
    first = before if before is not None else (a if bisect.bisect_left(sc.times, a) == 0 else None)
    last = after if after is not None else (b if bisect.bisect_right(sc.times, b) == len(sc.times) else None)
    if first is None or last is None or _failed_between(bi, first, last):
        return math.inf  # a failed scrape among them, or none before `a` (after `b`) that read it
    seq = [first] + [t for t in _readings(bi, s, kind, first, last) if first < t < last] + [last]
    widest = max((y - x for x, y in zip(seq, seq[1:])), default=0.0)
    return widest if widest > tol else None


def _failed_between(bi: BackendIndex, lo: float, hi: float) -> bool:
    """Whether a scrape failed strictly between `lo` and `hi` (two readings of a family)."""
    failed = scrapes(bi).failed_times
    return bisect.bisect_left(failed, lo + EPS) < bisect.bisect_right(failed, hi - EPS)


def _reading_near(bi: BackendIndex, s: Series, kind: str, x: float, way: int) -> float | None:
    """The family's last reading at or before `x` (way -1), or its first at or after it (1)."""
    usable = (lambda i: True) if kind in ("histogram", "summary") else s.answered
    if way < 0:
        i = bisect.bisect_right(s.times, x) - 1
        while i >= 0 and not usable(i):
            i -= 1
        got = s.times[i] if i >= 0 else None
        if s.born is not None and kind in ("counter", "histogram", "summary") and got is None:
            ok = scrapes(bi).ok_times
            k = bisect.bisect_right(ok, min(x, s.born)) - 1
            got = ok[k] if k >= 0 else None
        return got
    i = bisect.bisect_left(s.times, x)
    while i < len(s.times) and not usable(i):
        i += 1
    got = s.times[i] if i < len(s.times) else None
    if s.born is not None and kind in ("counter", "histogram", "summary") and x <= s.born:
        ok = scrapes(bi).ok_times
        k = bisect.bisect_left(ok, x)
        got = ok[k] if k < len(ok) and ok[k] <= s.born else got
    return got


def _uncovered(scope: Scope, family: str, kind: str, agg: str) -> list[tuple[BackendIndex, float, float, float]]:
    """The scope's buckets no successful scrape of the family covers (`_gap`: failed scrapes, a
    /metrics that stopped answering), each with its gap; and a bucket whose per-bucket change
    has no scrape on one side (before a counter's birth)."""
    out = []
    for bi, a, b in windows(scope):
        s = find(bi, family)
        tol = _tolerance(bi)
        if s is None or not len(s.times) or tol is None:
            out.append((bi, a, b, math.inf))
            continue
        gap = _gap(bi, s, kind, a, b, tol)
        if gap is None and kind in ("counter", "histogram", "summary") and agg not in ("count", "rate") \
                and not (kind != "counter" and agg in ("mean", "p")) and span_of(s, a, b) is None:
            gap = math.inf
        if gap is not None:
            out.append((bi, a, b, gap))
    return out


def _spills(scope: Scope, family: str) -> bool:
    """Whether a change over the scope is taken from or to a scrape outside it across a failed
    scrape, or further outside than `_tolerance`: it counts what happened outside the scope, so
    is no lower bound of the scope's."""
    for bi, a, b in spans(scope):
        s, tol = find(bi, family), _tolerance(bi)
        sp = span_of(s, a, b) if s is not None else None
        if sp is None or tol is None:
            continue
        lo, hi = _time(s, sp[0]), s.times[sp[1]]
        across = (lo < a and _failed_between(bi, lo, a)) or (hi > b and _failed_between(bi, b, hi))  # between it and the scope
        if lo < a - tol or hi > b + tol or across:
            return True
    return False


def _by_backend(scope: Scope, family: str, wins) -> list[tuple[Series, float, float]]:
    out = []
    for bi, a, b in wins:
        s = find(bi, family)
        if s is not None:
            out.append((s, a, b))
    return out


def _gauge(family: str, scope: Scope, agg: str, q: float | None, confidence: float, min_samples: int) -> Measure:
    if agg in ("count", "rate"):
        what = "bare server(...)" if agg == "count" else "rate()"
        return Measure(None, 0, 1, "scrape", f"{what} reads a counter's increase; '{family}' is a gauge: write max(server(\"{family}\")) or mean(...)")
    wins = _by_backend(scope, family, windows(scope))
    vals = [v for s, a, b in wins for i in inside(s, a, b) if (v := s.value(i)) is not None]
    nans = sum(bisect.bisect_left(s.nan_at, b) - bisect.bisect_left(s.nan_at, a) for s, a, b in wins)
    if not vals:
        return Measure(None, 0, 1, "scrape", f"no scrape of '{family}' inside the scope's buckets" +
                       (f" with a number (the server answered NaN in {plural(nans, 'scrape')})" if nans else ""))
    if agg == "p":
        value = stats.percentile(vals, q)  # type: ignore[arg-type]
    elif agg == "mean" and any(math.isinf(v) for v in vals):
        value = _infinite_mean(vals)
    else:
        value = _AGG[agg](vals)
    if value is not None and math.isnan(value):
        return Measure(None, len(vals), 1, "scrape", f"'{family}' was both +Inf and -Inf in the scope: its {agg}{'' if agg != 'p' else f'{q:g}'} is no number")
    if nans:
        # the server's NaN: no value, what it was in those scrapes unknown -- never judged on the
        # rest, but where the rest decides it (a max only grows with more values, a min only falls)
        why = (f"the server answered NaN for '{family}' in {plural(nans, 'scrape')} inside the scope "
               "(no value: what it was then is unknown)")
        if agg in ("max", "min"):
            return Measure(value, len(vals), 1, "scrape", why, at_least=agg == "max", at_most=agg == "min")
        return Measure(None, len(vals), 1, "scrape", why)
    return Measure(value, len(vals), 1, "scrape")


def _counter(family: str, scope: Scope, agg: str, q: float | None, confidence: float, min_samples: int) -> Measure:
    try:
        return _counter_measure(family, scope, agg)
    except AmbiguousFall as e:
        return Measure(None, 0, 2, "scrape", str(e))


def _counter_measure(family: str, scope: Scope, agg: str) -> Measure:
    if agg == "p":
        return Measure(None, 0, 1, "scrape", f"'{family}' is a counter: a percentile does not apply (write rate() or max() of its per-bucket rates)")
    if agg in ("count", "rate"):
        changes = [c for s, a, b in _by_backend(scope, family, spans(scope)) if (c := counter_change(s, a, b)) is not None]
        if not changes:
            return Measure(None, 0, 2, "scrape", f"'{family}' needs two scrapes around the scope to give a change")
        inc, secs, n = math.fsum(c[0] for c in changes), math.fsum(c[1] for c in changes), sum(c[2] for c in changes)
        if agg == "count":
            return Measure(inc, n, 2, "scrape")
        return Measure(inc / secs, n, 2, "scrape") if secs > 0 else Measure(None, n, 2, "scrape", "no time between the scrapes")
    rates = []
    n = 0
    for s, a, b in _by_backend(scope, family, windows(scope)):
        c = counter_change(s, a, b)
        if c is not None and c[1] > 0:
            rates.append(c[0] / c[1])
            n += c[2]
    if not rates:
        return Measure(None, 0, 2, "scrape", f"'{family}' needs two scrapes around a bucket to give its rate")
    return Measure(_AGG[agg](rates), n, 2, "scrape")


def _deltas(family: str, scope: Scope, agg: str) -> list[HistDelta]:
    wins = windows(scope) if agg in ("min", "max") else spans(scope)
    return [d for s, a, b in _by_backend(scope, family, wins) if (d := hist_change(s, a, b)) is not None]


def _requests(scope: Scope, observations: int) -> int | None:
    """The independent draws a histogram's `observations` in `scope` rest on, where fewer: the
    scope's requests. A server's per-token histogram (vLLM's inter-token latency) observes
    every token, and one request's tokens share its batch and its place in the queue -- as the
    client's ITL counts requests, not gaps (`stats.independent_counts`). None: as many."""
    requests = len(scope.records) if scope.records is not None else 0
    return requests if 0 < requests < observations else None


def beyond(buckets: Sequence[tuple[float | None, float]], op: str, t: float, *, least: bool = False) -> int:
    """At most (`least`: at least) how many of a histogram's observations (cumulative bucket
    counts, +Inf last) do not satisfy `value op t`. With `<`/`<=`: at most, all but those in
    buckets wholly at or below t; at least, those in buckets wholly above it. With `>`/`>=`:
    at most, those in every bucket up to the one holding t; at least, those in buckets wholly
    below it. A threshold at a bucket bound is exact (an observation equal to a bound is taken
    as within, as the bucket's `le` counts it). Counts that go down from one bound to the next (a
    broken exposition) are read as their running maximum, as histogram_quantile makes them
    monotonic, and none exceeds the total."""
    total = buckets[-1][1] if buckets else 0.0
    cum = [(le, min(total, n)) for le, n in zip((le for le, _ in buckets), itertools.accumulate((n for _, n in buckets), max))]
    below = max((n for le, n in cum if le is not None and le <= t), default=0.0)  # in buckets wholly at or below t
    upto = next((n for le, n in cum if le is None or le >= t), total)  # in every bucket up to the one holding t
    if op in ("<", "<="):
        return max(0, int(round(total - (upto if least else below))))
    return max(0, int(round(below if least else upto)))


def _histogram(family: str, scope: Scope, agg: str, q: float | None, confidence: float, min_samples: int) -> Measure:
    deltas = _deltas(family, scope, agg)
    if not deltas:
        return Measure(None, 0, 2, "scrape", f"'{family}' needs two scrapes around the scope to give its observations")
    obs = math.fsum(d.count for d in deltas)
    n = int(round(obs))
    if agg == "count":
        return Measure(obs, sum(d.scrapes for d in deltas), 2, "scrape")
    if agg == "rate":
        secs = math.fsum(d.seconds for d in deltas)
        return Measure(obs / secs if secs > 0 else None, sum(d.scrapes for d in deltas), 2, "scrape",
                       None if secs > 0 else "no time between the scrapes")
    if obs <= 0:
        return Measure(None, 0, 1, "observation", f"no '{family}' observations in the scope")
    if agg == "p":
        need = max(stats.min_samples_for_percentile(q, confidence), min_samples)  # type: ignore[arg-type]
        value, (lo, hi) = quantile_estimate(q, pooled(deltas))  # type: ignore[arg-type]
        if value is None:
            note = next((s.note for s, _, _ in _by_backend(scope, family, spans(scope)) if s.note), None)
            buckets = pooled(deltas)
            if len(buckets) >= 2 and buckets[-1][0] is None:  # no observation at the rank (p0 in an empty lowest bucket)
                return Measure(None, n, need, "observation", f"'{family}' has no observation at p{q:g} in the scope "
                               "(histogram_quantile answers NaN)")
            why = (note or "its _sum and _count only, or buckets the scrape did not keep") if not buckets else (
                "no +Inf bucket" if buckets[-1][0] is not None else "its +Inf bucket alone")
            return Measure(None, n, need, "observation", f"'{family}' has no histogram buckets in the scope ({why}) "
                           "to estimate a quantile from (histogram_quantile answers NaN)")
        if math.isinf(lo):
            # in a lowest bucket bounded at or below 0 (SGLang's queue time, le="0.0"): at most its
            # bound, how far below the histogram cannot say (histogram_quantile answers that
            # bound) -- an upper bound, deciding the thresholds every value up to it is on one side of
            return Measure(value, n, need, "observation", f"p{q:g} falls in the histogram's lowest bucket, at or below "
                           f"its bound {hi:g}, how far below it cannot say", at_most=True)
        if value is not None and hi is None:
            # in the +Inf bucket: above the largest finite bound, how far the histogram cannot say
            # (histogram_quantile answers that bound; as a value it would pass `p99 < 10s` for a
            # server whose every observation took 30 s)
            return Measure(value, n, need, "observation",
                           f"p{q:g} falls in the histogram's +Inf bucket, above its largest finite bound {lo:g}", at_least=True)
        # the observations within a bucket are unknown: the quantile is somewhere in it (the
        # interpolated value is Prometheus' estimate, not a bound), which decides a threshold
        # outside the bucket and no other
        return Measure(value, n, need, "observation", units=_requests(scope, n),
                       bounds=(lo, hi) if lo < hi else None, coarse="the server histogram's bucket")
    means = [_ieee_sum(d.sum for d in deltas) / obs] if agg == "mean" else [d.sum / d.count for d in deltas if d.count > 0]
    if any(math.isnan(m) for m in means):
        # the server's _sum is +Inf (an observation of +Inf: Prometheus keeps it so) at both
        # ends of a change, or NaN: what the observations added up to in the scope is unknown
        return Measure(None, n, max(1, min_samples), "observation", f"'{family}''s _sum is not finite (+Inf: the server "
                       "observed an infinite value) across the scope, so the sum of its observations there is unknown")
    return Measure(means[0] if agg == "mean" else _AGG[agg](means), n, max(1, min_samples), "observation")


def _ieee_sum(xs: Iterable[float]) -> float:
    """`math.fsum` of finite values; with an infinity or NaN, IEEE's sum (fsum refuses +Inf + -Inf)."""
    xs = list(xs)
    return math.fsum(xs) if all(math.isfinite(x) for x in xs) else sum(xs)


def _summary(family: str, scope: Scope, agg: str, q: float | None, confidence: float, min_samples: int) -> Measure:
    if agg != "mean":
        return Measure(None, 0, 1, "scrape", f"'{family}' is a summary: only mean() applies")
    return _histogram(family, scope, agg, q, confidence, min_samples)


_KINDS = {"gauge": _gauge, "counter": _counter, "histogram": _histogram, "summary": _summary}


@dataclasses.dataclass(frozen=True)
class ServerRatio:
    """`ratio(server("num"), server("den"))` over one scope instance: the numerator's increase
    over the scope divided by the denominator's (PromQL's `increase(num[w]) / increase(den[w])`;
    a prefix-cache hit rate, a speculative-decoding acceptance rate, an error ratio).

    Each increase is exactly a bare `server("...")` rule's (`ServerMetric.measure` with
    "count"): the same brackets, the same resets, the same label sets, the same coverage. Only
    counters have an increase to divide: a gauge's level or a histogram's observations are
    INCONCLUSIVE, saying so (the checker refuses the gauges it can name: `_perc`, `hit_rate`...).
    Missing data is never a pass: where either increase cannot be computed, where either is only
    a lower bound (a bucket no scrape covers: a ratio of two lower bounds bounds nothing), or
    where the denominator did not increase (no lookups, no drafts: no ratio), the scope is
    INCONCLUSIVE with the reason and both increases."""

    num: str
    den: str

    def measure(self, scope: Scope, agg: str | None, percentile: float | None = None, *,
                confidence: float = 0.95, min_samples: int = 1) -> Measure:
        for family in (self.num, self.den):
            for bi in scope.backends:
                s = find(bi, family)
                if s is not None and s.type != "counter":
                    return Measure(None, 0, 2, "scrape", f"ratio() divides two counters' increases; '{family}' is a {s.type}, "
                                   "which has none (gate a gauge or histogram on its own: mean(server(...)), p99(...))")
        parts = [ServerMetric(f).measure(scope, "count", confidence=confidence, min_samples=min_samples) for f in (self.num, self.den)]
        n, d = parts
        if n.value is not None and d.value is not None:
            # exact counts, as large as they come (1234567, never 1.23457e+06)
            detail = f"'{self.num}' +{format_value(n.value, Kind.COUNT)} of '{self.den}' +{format_value(d.value, Kind.COUNT)}"
        else:
            detail = None
        samples = min(n.samples, d.samples)
        for family, m in zip((self.num, self.den), parts):
            if m.value is None:
                return Measure(None, samples, 2, "scrape", f"'{family}': {m.reason}")
            if m.at_least:
                return Measure(None, samples, 2, "scrape", f"{detail}: each only a lower bound, which bounds no ratio ({m.reason})")
        if d.value <= 0:  # type: ignore[operator]
            return Measure(None, samples, 2, "scrape", f"{detail}: the denominator did not increase in the scope, so there is no ratio")
        return Measure(n.value / d.value, samples, 2, "scrape", detail=detail)  # type: ignore[operator]


def bind(expr: Any) -> ServerMetric | ServerRatio:
    """The implementation of one rule's `server("family")`, or of its
    `ratio(server("num"), server("den"))` (`over`: the denominator) (registry: `impl_for`)."""
    if expr.over is not None:
        return ServerRatio(expr.server, expr.over)
    return ServerMetric(expr.server)


# ------------------------------------------------------------------------------ the evidence check


def _scrape_problem(bi: BackendIndex) -> str | None:
    """Why the backend's scrapes do not stand (None: every scrape succeeded)."""
    entry = bi.evidence.entry.get("metrics")
    if not isinstance(entry, Mapping):
        return "no scrape of the server's metrics is recorded"
    sc = scrapes(bi)
    path = entry.get("path", "/metrics")
    if entry.get("status") == "not available":
        return f"{path} is not available (the first scrape answered {entry.get('first_error')})"
    if sc.total == 0:
        return f"metrics.jsonl holds no scrape of {path}"
    if sc.failed:
        return f"{sc.failed} of {plural(sc.total, 'scrape')} of {path} failed; first: {sc.first_failed.get('error')}"
    return None


def metrics_scraped(run: JudgedRun, rule: Rule | None) -> RuleResult | None:
    """Every scrape of the server's /metrics succeeded. Built in for the backends whose spec
    declares `metrics { }` (none: nothing to judge); `require metrics_scraped` asks it of every
    backend the rule covers, default scrapes included."""
    if rule is None:
        declared = {b.name for b in run.spec.backends if b.metrics.declared}
        bis = tuple(bi for bi in run.judged if bi.name in declared)
        if not bis:
            return None
    else:
        bis = run.backends_for(rule)
    insts: list[Instance] = []
    total = 0
    for bi in bis:
        total += scrapes(bi).total
        why = _scrape_problem(bi)
        if why is not None:
            # a run not finished (`gate --partial`: its entry made from what it wrote so far) with
            # no scrape recorded yet has missing data, not a failed scrape: never a FAIL for that
            unfinished = bi.evidence.entry.get("partial") is True and scrapes(bi).total == 0
            insts.append(problem(why + (" yet (the run is not finished)" if unfinished else ""), backend_here(bi.name),
                                 **({"status": "inconclusive"} if unfinished else {})))
    if not bis:
        insts.append(problem("no backend to judge", status="inconclusive"))
    msg = f"all {plural(total, 'scrape')} of the server's metrics succeeded"
    return result(rule, "metrics_scraped", "evidence", rule.severity if rule else "require", insts, msg, max(1, len(bis)))


# ------------------------------------------------------------------------------ results.json

SUMMARY_QUANTILES = (50.0, 99.0)


def _bucket_entry(s: Series, start: float, end: float) -> dict[str, Any] | None:
    if s.type == "counter":
        try:
            c = counter_change(s, start, end)
        except AmbiguousFall:
            return None
        if c is None or c[1] <= 0:
            return None
        return {"rate": c[0] / c[1], "increase": c[0], "scrapes": c[2]}
    if s.type in ("histogram", "summary"):
        d = hist_change(s, start, end)
        if d is None or d.count <= 0:
            return None
        out: dict[str, Any] = {"mean": _json_number(d.sum / d.count), "observations": d.count, "scrapes": d.scrapes}
        if d.buckets:
            for q in SUMMARY_QUANTILES:
                v, (lo, hi) = quantile_estimate(q, d.buckets)
                # the estimate and its resolution (null bounds: -Inf below, +Inf above)
                out[f"p{q:g}"] = {"value": v, "bucket": [lo if math.isfinite(lo) else None, hi]}
        return out
    vals = [x for i in inside(s, start, end) if (x := s.value(i)) is not None]
    nans = bisect.bisect_left(s.nan_at, end) - bisect.bisect_left(s.nan_at, start)
    if not vals:
        return {"nan_scrapes": nans} if nans else None
    mean = _infinite_mean(vals) if any(math.isinf(v) for v in vals) else stats.mean(vals)
    out = {"mean": _json_number(mean), "max": _json_number(max(vals)), "min": _json_number(min(vals)), "scrapes": len(vals)}
    return out | {"nan_scrapes": nans} if nans else out


def _infinite_mean(vals: Sequence[float]) -> float:
    """The mean of values among which an infinity: it, or NaN with both."""
    infs = {v for v in vals if math.isinf(v)}
    return infs.pop() if len(infs) == 1 else math.nan


def _json_number(v: float | None) -> float | str | None:
    """A figure as results.json holds it: a value that is not finite as the text format writes
    it ("+Inf", "-Inf", "NaN"), since JSON has none."""
    if v is None or math.isfinite(v):
        return v
    return "NaN" if math.isnan(v) else ("+Inf" if v > 0 else "-Inf")


def results_section(bi: BackendIndex) -> dict[str, Any] | None:
    """results.json's `server_metrics` of one backend: how its /metrics scrapes went, and per
    kept family its type and per-bucket values (keyed "workload:level:bucket"): a gauge's
    mean/min/max, a counter's rate and increase, a histogram's mean observation and its p50/p99
    estimates with the histogram bucket each falls in (the estimate's resolution)."""
    entry = bi.evidence.entry.get("metrics")
    if not isinstance(entry, Mapping) and not scrapes(bi).rows:
        return None
    entry = entry if isinstance(entry, Mapping) else {}
    sc = scrapes(bi)
    fams: dict[str, Any] = {}
    for name in sorted(sc.series):
        s = sc.series[name]
        per: dict[str, Any] = {}
        for lv in bi.levels:
            for w in lv.buckets:
                if w.start is not None and w.end is not None and (e := _bucket_entry(s, w.start, w.end)) is not None:
                    per[f"{lv.workload}:{lv.index}:{w.index}"] = e
        fams[name] = {"type": s.type, "per_bucket": per}
    return {"path": entry.get("path"), "declared": entry.get("declared"), "status": entry.get("status"),
            "scrapes": sc.total, "failed": sc.failed, "first_error": entry.get("first_error"), "families": fams}


__all__ = ["ServerMetric", "bind", "find", "metrics_scraped", "quantile_estimate", "results_section", "scrapes", "unavailable"]
