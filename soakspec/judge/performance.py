"""Performance rules: the spec's comparisons (see `soakspec.judge.judge`).

`judge(run, rule, impl)` judges one rule over every instance of its scope, computing the
metric with `impl` (the metric's implementation, from `soakspec.judge.registry`); the worst
instance is reported. drift() and slope() compare the per-bucket values of a level (or of a
backend, in level order).
"""

from __future__ import annotations

import dataclasses
import math
import re

import numpy as np

from soakspec.judge import stats
from soakspec.judge.common import OPS, compare, describe_request, format_beside, format_value, loc, plural, replace, result
from soakspec.judge.index import LevelIndex, Row, Window, error_message
from soakspec.judge.joined import JudgedRun
from soakspec.judge.measures import (
    Censored, Columnar, Distribution, Measure, MetricImpl, Outcome, PerRequest, PerToken, aggregate, bucket_series, centred, completed, quarters, relative_change,
    schedule_lag, slope,
)
from soakspec.judge.scope import Scope, bucket_scope, clock_span, scopes
from soakspec.judge.servermetrics import ServerMetric, histogram_beyond, histogram_mean_interval
from soakspec.judge.table import Rec, RequestTable, Rows
from soakspec.judge.verdict import Instance, Location, RuleResult, Status
from soakspec.lang.metrics import METRICS, Kind
from soakspec.lang.spec import Rule

_UNIT_WORD = {"requests": "request", "gaps": "inter-token gap", "buckets": "bucket", "samples": "telemetry sample"}
MAX_BUCKETS_LISTED = 5

Judged = tuple[Instance, float | None, int | None]  # an instance, its value, its samples


def kind(rule: Rule) -> Kind | None:
    if rule.expr.wrapper is not None:
        return Kind.RATIO
    m = METRICS.get(rule.expr.metric)
    return m.result_kind(rule.expr.agg) if m else None


def _unit_word(unit: str, n: int) -> str:
    return plural(n, _UNIT_WORD.get(unit, unit))


def _independent(impl: Distribution, sc: Scope, n: int, over: int, *, for_pass: bool) -> tuple[int, int]:
    """(overages, samples) as the binomial tests may count them: a request's ITL gaps are one
    draw, not many (`stats.independent_counts`)."""
    units = impl.independent(sc.records)
    return (over, n) if units is None else stats.independent_counts(over, n, units, for_pass=for_pass)


def _claim_tail(rule: Rule) -> float | None:
    """The percentile whose overages decide a percentile rule: NN for `pNN(x) < T`, 100 - NN for
    `pNN(x) > T` (the samples below T are the overages of the (100-NN)-th percentile, so the
    sample-size rule is that percentile's: `p99(x) > T` is claimed from 10 samples all above T,
    and `p1(x) >= T` needs 299). None: no percentile, or no side to count."""
    q, op = rule.expr.percentile, rule.op
    if q is None or op not in ("<", "<=", ">", ">="):
        return q
    return q if op in ("<", "<=") or q >= 100 else 100.0 - q


def _for_claim(run: JudgedRun, rule: Rule, m: Measure) -> Measure:
    """`m` needing the samples of the rule's own claim (`_claim_tail`), not of its percentile."""
    tail = _claim_tail(rule)
    if tail is None or tail == rule.expr.percentile or not m.needed:
        return m
    return dataclasses.replace(m, needed=max(stats.min_samples_for_percentile(tail, run.gate.confidence), run.gate.min_samples))


def _counted_text(m: Measure) -> str:
    """How many samples a measure rests on: "6 requests (378 inter-token gaps)" where a claim
    counts requests, not gaps."""
    if m.units is None:
        return _unit_word(m.unit, m.samples)
    if m.clusters is not None:  # requests of unequal lengths: fewer draws than requests (PerToken.independent)
        return (f"{plural(m.units, 'request')} in effect ({_unit_word(m.unit, m.samples)} of {plural(m.clusters, 'request')}, "
                "each weighing as many gaps as it has)")
    return f"{plural(m.units, 'request')} ({_unit_word(m.unit, m.samples)})"


def _significant_violation(run: JudgedRun, sc: Scope, rule: Rule, impl: MetricImpl) -> bool:
    """Percentile rules with too few samples: is the violation certain anyway?"""
    q, op, t = rule.expr.percentile, rule.op, rule.threshold
    if q is None or op not in ("<", "<=", ">", ">=") or t is None:
        return False
    confidence = run.gate.confidence
    if isinstance(impl, ServerMetric):  # the observations surely beyond, a request's worth of draws at most
        got = histogram_beyond(impl, sc, op, t, least=True)
        qq = q if op in ("<", "<=") else 100.0 - q
        if got is None or qq >= 100 or qq <= 0:
            return False
        n, over = got
        m = impl.measure(sc, None, q, confidence=confidence)
        over, n = (over, n) if m.units is None else stats.independent_counts(over, n, m.units, for_pass=False)
        return stats.exceeds_with_confidence(over, n, qq, confidence)
    if not isinstance(impl, Distribution):
        return False
    if op in ("<", "<="):
        n, over = impl.beyond(sc.records, ">" if op == "<=" else ">=", t)
        over, n = _independent(impl, sc, n, over, for_pass=False)
        return stats.exceeds_with_confidence(over, n, q, confidence)
    if q >= 100:
        return False
    n, under = impl.beyond(sc.records, "<" if op == ">=" else "<=", t)
    under, n = _independent(impl, sc, n, under, for_pass=False)
    return stats.exceeds_with_confidence(under, n, 100.0 - q, confidence)


def _overage(run: JudgedRun, sc: Scope, rule: Rule, impl: MetricImpl, m: Measure, vtext: str) -> Instance | None:
    """A percentile rule whose point estimate passes: does the claim hold at the gate's
    confidence? (LoadGen's overage rule, `stats.max_overages`.) None when it does; else the
    inconclusive instance saying how many samples lie beyond the threshold, how many the
    confidence allows and how many more samples the claim would need."""
    q, op, t = rule.expr.percentile, rule.op, rule.threshold
    if q is None or t is None or op not in ("<", "<=", ">", ">="):
        return None
    if isinstance(impl, ServerMetric):
        return _histogram_overage(run, sc, rule, impl, m, vtext)
    if not isinstance(impl, Distribution):
        return None
    if op in (">", ">=") and q <= 0:
        return None
    conf = run.gate.confidence
    if op in ("<", "<="):
        n, over = impl.beyond(sc.records, ">" if op == "<=" else ">=", t)
        qq, side = q, "above"
    else:
        n, over = impl.beyond(sc.records, "<" if op == ">=" else "<=", t)
        qq, side = 100.0 - q, "below"
    if qq <= 0:
        return None
    k, units = _independent(impl, sc, n, over, for_pass=True)
    allowed = stats.max_overages(units, qq, conf)
    if allowed is not None and k <= allowed:
        return None
    more = stats.samples_for_overages(k, units, qq, conf)
    word = _UNIT_WORD.get(m.unit, m.unit) if units == n else "request"
    need = f"needs {more} more {word}{'' if more == 1 else 's'} within the threshold" if more else "cannot be claimed"
    # gaps of fewer requests: the overages as the requests count them (`stats.independent_counts`)
    as_requests = "" if units == n else f" (as {k} of {plural(units, 'request')}: one request's gaps are not independent)"
    return Instance("inconclusive", loc(sc), m.value, vtext, n,
                    f"{vtext}, but {over} of {_unit_word(m.unit, n)} are {side} {rule.threshold_text}{as_requests}; "
                    f"at most {allowed if allowed is not None else 0} allowed at {conf * 100:.3g}% confidence "
                    f"(threshold {rule.op} {rule.threshold_text}); {need}", more or None)


def _histogram_overage(run: JudgedRun, sc: Scope, rule: Rule, impl: ServerMetric, m: Measure, vtext: str) -> Instance | None:
    """`_overage` of a server histogram's quantile: the observations beyond the threshold are
    known only to the histogram's buckets, so the claim is tested with as many as may lie
    beyond it (`servermetrics.beyond`: exact where the threshold is a bucket bound), the
    observations a request's worth of draws at most (`Measure.units`)."""
    q, op, t = rule.expr.percentile, rule.op, rule.threshold
    assert q is not None and op is not None and t is not None
    got = histogram_beyond(impl, sc, op, t)
    if got is None:
        return None
    n, over = got
    qq = q if op in ("<", "<=") else 100.0 - q
    if qq <= 0:
        return None
    conf = run.gate.confidence
    k, units = (over, n) if m.units is None else stats.independent_counts(over, n, m.units, for_pass=True)
    allowed = stats.max_overages(units, qq, conf)
    if allowed is not None and k <= allowed:
        return None
    more = stats.samples_for_overages(k, units, qq, conf)
    need = f"needs {more} more {'observation' if units == n else 'request'}{'' if more == 1 else 's'} within the threshold" if more else "cannot be claimed"
    side = "above" if op in ("<", "<=") else "below"
    as_requests = "" if units == n else (f" (as {k} of {plural(units, 'request')}, one draw a request the scope sent at most: a "
                                         "request's observations -- its tokens, in a per-token histogram -- are not independent)")
    return Instance("inconclusive", loc(sc), m.value, vtext, n,
                    f"{vtext}, but up to {over} of {plural(n, 'observation')} may be {side} {rule.threshold_text} (the "
                    f"histogram's buckets cannot say where in a bucket they lie){as_requests}; at most "
                    f"{allowed if allowed is not None else 0} allowed at {conf * 100:.3g}% confidence "
                    f"(threshold {rule.op} {rule.threshold_text}); {need}", more or None)


def _offender_groups(run: JudgedRun, sc: Scope, offenders: list[Row]) -> tuple[dict[tuple[str, str, int, int], list[Row]], dict[tuple[str, str, int, int], Location]]:
    """The offending requests by (backend, workload, level, bucket), and where each group is."""
    groups: dict[tuple[str, str, int, int], list[Row]] = {}
    places: dict[tuple[str, str, int, int], Location] = {}
    for r in offenders:
        bname = str(r.get("backend")) if len(sc.backends) > 1 else sc.backends[0].name
        found: tuple[LevelIndex, Window] | None = run.locate(bname, r)
        if found is None:
            continue
        lv, w = found
        key = (bname, lv.workload, lv.index, w.index)
        groups.setdefault(key, []).append(r)
        if key not in places:
            places[key] = loc(bucket_scope(run.backends[bname], lv, w))
    return groups, places


def _offenders_message(run: JudgedRun, sc: Scope, rule: Rule, impl: MetricImpl, value_text: str) -> tuple[Location, str] | None:
    """A failing count of a failure class: where the offending requests are, and the first one."""
    if not isinstance(impl, Outcome) or impl.noun is None:
        return None
    offenders = [r for r in sc.records if impl.counts(r)]
    if not offenders:
        return None
    groups, places = _offender_groups(run, sc, offenders)
    first = offenders[0]
    n = len(offenders)
    distinct = len({error_message(r) for r in offenders})
    more = f"; {distinct} distinct errors" if distinct > 1 else ""
    lead = f"{value_text}: " if rule.expr.agg != "count" else ""
    if len(groups) == 1 or sc.kind in ("bucket", "window"):
        where = places[next(iter(groups))] if sc.kind not in ("bucket", "window") and groups else loc(sc)
        return where, f"{lead}{plural(n, impl.noun)} ({describe_request(first)}){more}"
    listing = ", ".join(f"{places[k].level_label} bucket {k[3]}" + (f" of {k[0]}" if sc.backend is None else "") + f" ({len(v)})"
                        for k, v in list(groups.items())[:MAX_BUCKETS_LISTED])
    if len(groups) > MAX_BUCKETS_LISTED:
        listing += f", ... {len(groups) - MAX_BUCKETS_LISTED} more buckets"
    return loc(sc), f"{lead}{plural(n, impl.noun)} in {len(groups)} buckets — {listing}; first: {describe_request(first)}{more}"


def _too_few(run: JudgedRun, sc: Scope, rule: Rule, impl: MetricImpl, m: Measure, vtext: str, ok: bool) -> Instance:
    """An instance with fewer samples than a claim needs: inconclusive, unless the violation is
    certain anyway."""
    where = loc(sc)
    conf = run.gate.confidence
    if not ok and _significant_violation(run, sc, rule, impl):
        return Instance("fail", where, m.value, vtext, m.samples,
                        f"{vtext} over {_unit_word(m.unit, m.samples)} (threshold {rule.op} {rule.threshold_text}); too few for the percentile, but enough samples violate the threshold to be sure at {conf * 100:.3g}% confidence")
    basis = ""
    if rule.expr.percentile is not None:
        tail = _claim_tail(rule)
        assert tail is not None
        need_q = stats.min_samples_for_percentile(tail, conf)
        claim = rule.expr.agg if tail == rule.expr.percentile else f"{rule.expr.agg} {rule.op} (the samples below: p{tail:g})"
        basis = f"; {claim} at {conf * 100:.3g}% confidence needs {need_q}"
        if run.gate.min_samples > need_q:
            basis += f", the gate's min_samples {run.gate.min_samples}"
    return Instance("inconclusive", where, m.value, vtext, m.samples,
                    f"{vtext} from only {_counted_text(m)}; needs {m.short} more{'' if m.units is None else ' requests'}{basis}", m.short)


def _instance(run: JudgedRun, sc: Scope, rule: Rule, impl: MetricImpl) -> Judged:
    """Judge one scope instance of a plain (unwrapped) performance rule. Binned gaps (a real
    server's ITL, judge/gapbins.py) judge exactly against the thresholds their cells were cut
    at -- the spec's, given when the evidence was read; against any other the scope is judged
    from its gaps themselves, read again (`InexactCount`)."""
    try:
        return _instance_of(run, sc, rule, impl)
    except stats.InexactCount:
        if isinstance(sc.records, Rows):  # this rule's gaps not counted: `values`, exactly
            exact = Rows(sc.records.parts)  # a selection of its own: the scope's (a level's, shared
            exact.memo["itl"] = None  # with later rules and the summary) keeps its counted gaps
            sc = dataclasses.replace(sc, records=exact)
        return _instance_of(run, sc, rule, impl)


def _instance_of(run: JudgedRun, sc: Scope, rule: Rule, impl: MetricImpl) -> Judged:
    assert rule.op is not None and rule.threshold is not None
    e = rule.expr
    m = _for_claim(run, rule, impl.measure(sc, e.agg, e.percentile, confidence=run.gate.confidence, min_samples=run.gate.min_samples))
    where = loc(sc)
    if m.coarse is not None and m.bounds is not None and (m.bounds[0] < rule.threshold < m.bounds[1] or (
            rule.op in ("==", "!=") and rule.threshold == m.bounds[1])):
        # a bucket (lo, hi] holds values above lo and at most hi: a threshold at either bound is decided
        vtext = f"{e.text} ≈ {format_beside(m.value, kind(rule), rule.op, rule.threshold)}"  # type: ignore[arg-type]
        return Instance("inconclusive", where, m.value, vtext, m.samples,
                        f"{vtext}, but {m.coarse} only places it between {format_value(m.bounds[0], kind(rule))} and "
                        f"{format_value(m.bounds[1], kind(rule))}, either side of the threshold {rule.op} {rule.threshold_text} "
                        f"(the estimate assumes its observations spread evenly across the bucket; a threshold at one of "
                        f"its bounds is decided exactly)", 1), m.value, m.samples
    if m.bounds is not None and m.coarse is None and compare(m.bounds[0], rule.op, rule.threshold) != compare(m.bounds[1], rule.op, rule.threshold):
        raise stats.InexactCount(f"{e.text} lies between {m.bounds[0]!r} and {m.bounds[1]!r}, either side of {rule.threshold!r}")
    if isinstance(impl, (PerRequest, PerToken)):
        if cens := impl.censored(sc.records):
            return _with_censored(run, sc, rule, impl, m, cens)
    if m.value is None:
        return Instance("inconclusive", where, None, None, m.samples, f"{e.text} cannot be computed: {m.reason}"), None, m.samples
    vtext = f"{e.text} {'≈' if m.bounds is not None else '='} {format_beside(m.value, kind(rule), rule.op, rule.threshold)}"
    if m.detail is not None:
        vtext += f" ({m.detail})"
    ok = compare(m.value, rule.op, rule.threshold)
    if m.coarse is not None and m.bounds is not None:
        # the threshold at or beyond the bucket's bounds (lo, hi]: every value the bucket allows is
        # on one side of it -- at most T where T >= hi, above it where T <= lo (so never equal)
        ok = rule.op == "!=" if rule.op in ("==", "!=") else (rule.threshold >= m.bounds[1]) == (rule.op in ("<", "<="))
    if m.at_least or m.at_most:
        # only a lower bound (a histogram quantile in the +Inf bucket) or an upper one (one in a
        # lowest bucket bounded at or below 0, a gauge's min beside NaN scrapes): the rule holds
        # or fails where every value from it on (up, or down) holds or fails it, else nobody can tell
        vtext += " or more" if m.at_least else " or less"
        if m.short:
            return _too_few(run, sc, rule, impl, m, vtext, ok), m.value, m.samples
        if rule.op in ("==", "!="):  # decided only by a threshold outside every value the bound allows
            undecided = rule.threshold >= m.value if m.at_least else rule.threshold <= m.value
        else:  # a monotonic comparison: decided where both ends of the bound's range agree
            undecided = ok != compare(math.inf if m.at_least else -math.inf, rule.op, rule.threshold)
        if undecided:
            return Instance("inconclusive", where, m.value, vtext, m.samples,
                            f"{vtext}: {m.reason}, so whether it is {rule.op} {rule.threshold_text} is unknown", 1), m.value, m.samples
        return Instance("pass" if ok else "fail", where, m.value, vtext, m.samples,
                        f"{vtext} ({m.reason}; threshold {rule.op} {rule.threshold_text})"), m.value, m.samples
    if m.short:
        return _too_few(run, sc, rule, impl, m, vtext, ok), m.value, m.samples
    if ok and isinstance(impl, Outcome) and not completed(sc.records):
        # a scope where nothing completed measured nothing: it can fail a rule, never pass one
        return Instance("inconclusive", where, m.value, vtext, m.samples,
                        f"{vtext}, but no request in it completed: nothing was measured", 1), m.value, m.samples
    if ok and (unsure := _overage(run, sc, rule, impl, m, vtext)) is not None:
        if _significant_violation(run, sc, rule, impl):
            return Instance("fail", where, m.value, vtext, m.samples,
                            f"{vtext} over {_unit_word(m.unit, m.samples)} (threshold {rule.op} {rule.threshold_text}), but so many samples violate the threshold that the percentile is beyond it at {run.gate.confidence * 100:.3g}% confidence"), m.value, m.samples
        return unsure, m.value, m.samples
    if ok:
        return Instance("pass", where, m.value, vtext, m.samples, f"{vtext} (threshold {rule.op} {rule.threshold_text})"), m.value, m.samples
    narrowed = _offenders_message(run, sc, rule, impl, vtext)
    if narrowed is not None:
        return Instance("fail", narrowed[0], m.value, vtext, m.samples, narrowed[1]), m.value, m.samples
    return Instance("fail", where, m.value, vtext, m.samples,
                    f"{vtext} over {_unit_word(m.unit, m.samples)} (threshold {rule.op} {rule.threshold_text})"), m.value, m.samples


def _censored_note(c: Censored, n: int, metric: str, fk: Kind | None, unit: str = "requests") -> str:
    """What a rule's message says of the requests it counted within bounds (`_with_censored`)."""
    notes = []
    if c.timed_out:
        notes.append(f"{c.timed_out} of {plural(n, 'request')} timed out before their {metric} was measured (each counted "
                     f"as at least its time to the deadline, {format_value(float(c.low[:c.timed_out].min()), fk)} or more)")
    if c.stalled:
        least = float(c.low[c.timed_out:c.timed_out + c.stalled].min())
        if unit == "gaps":
            notes.append(f"{plural(c.stalled, 'timed-out request')} stalled mid-stream, each counted as one {metric} gap of at "
                         f"least its time from its last token to the deadline ({format_value(least, fk)} or more)")
        else:
            notes.append(f"{c.stalled} of {plural(n, 'request')} timed out mid-stream, their {metric} unknown (each counted as "
                         f"{format_value(least, fk)} or more)")
    if len(c.low) > c.timed_out + c.stalled:
        notes.append(f"{len(c.low) - c.timed_out - c.stalled} of {plural(n, 'request')} completed without token times (each counted "
                     f"between its first byte and its end)")
    if len(c.known):
        notes.append(f"{plural(len(c.known), 'timed-out request')} counted with the {metric} measured before the deadline")
    return "; ".join(notes)


class _Sample:
    """A rule's values with some added: an array, or -- for a metric counted by value (ITL at
    soak scale: `stats.Counted`) -- a multiset of distinct values and counts, never written
    out; and `unbounded` more values known to exist and known to lie above every other, with no
    upper bound at all (a timeout's: `Censored.high` is inf). They are counted, never held as a
    number: an aggregate that reaches one of them is `math.inf` (the mean or max of any sample
    holding one; a percentile whose order statistics reach into them; the min of nothing else),
    not a huge number a mean divides back into a finite one. The aggregate and the count beyond
    a threshold, the same either way."""

    def __init__(self, base: np.ndarray | stats.Counted, extra: np.ndarray) -> None:
        extra = np.asarray(extra, dtype=np.float64)
        unbounded = np.isposinf(extra)
        self.unbounded = int(np.count_nonzero(unbounded))
        extra = extra[~unbounded]
        self.counted: stats.Counted | None = None
        self.array: np.ndarray | None = None
        if isinstance(base, stats.Counted):
            self.counted = base.plus(extra)
            self.finite = self.counted.n
        else:
            self.array = np.concatenate([base, extra])
            self.finite = len(self.array)
        self.n = self.finite + self.unbounded

    def _reaches_unbounded(self, percentile: float | None, agg: str | None) -> bool:
        """Whether the aggregate depends on an unbounded value (so is unbounded itself)."""
        if not self.unbounded:
            return False
        if percentile is None:
            return agg != "min" or self.finite == 0
        h = (self.n - 1) * percentile / 100.0
        lo = min(math.floor(h), self.n - 1)
        return lo >= self.finite or (h > lo and lo + 1 >= self.finite)

    def agg(self, percentile: float | None, agg: str | None) -> float:
        if self._reaches_unbounded(percentile, agg):
            return math.inf
        c = self.counted
        if percentile is not None and self.unbounded:
            # the order statistics it reads are all below the unbounded values: those of the
            # finite ones with the unbounded ones standing at their greatest (any value at least
            # it gives the same)
            top = c.max() if c is not None else float(self.array.max())
            return _Sample(c if c is not None else self.array, np.full(self.unbounded, top)).agg(percentile, agg)
        if c is None:
            got = stats.percentile(self.array, percentile) if percentile is not None else aggregate(agg, self.array)
        elif percentile is not None:
            got = c.percentile(percentile)
        else:
            got = c.aggregate(agg)
        assert got is not None
        return float(got)

    def failing(self, op: str, t: float) -> int:
        """How many values do not satisfy `value op t`."""
        beyond = 0 if OPS[op](math.inf, t) else self.unbounded
        if self.counted is None:
            return int(np.count_nonzero(~OPS[op](self.array, t))) + beyond
        c = self.counted
        return c.n - c.count(op, t) + beyond  # binned: exact at the edges the bins were cut at (else InexactCount)


def _with_censored(run: JudgedRun, sc: Scope, rule: Rule, impl: PerRequest | PerToken, m: Measure, c: Censored) -> Judged:
    """A rule over a time some requests of the scope did not measure (ttft, latency), judged
    over every request it counts (`PerRequest.censored`): a timed-out request that measured the
    value counts with it; one that did not is a right-censored sample, known only to exceed its
    time to the deadline; a completed request whose tokens came untimed has a TTFT between its
    first byte and its end. Every aggregate (pNN, mean, min, max) only grows with any sample,
    so the value lies between the aggregate with each such sample at its lower bound (`low`)
    and at its upper one, beyond any time for a timeout (`high`): the rule holds or fails only
    where both agree; else INCONCLUSIVE, saying so. (Leaving them out instead made a level
    where half the requests timed out pass `p95(latency) < 600ms` on the other half, and let a
    server take its slow requests out of a TTFT rule by sending their tokens without text.)"""
    e, op, t = rule.expr, rule.op, rule.threshold
    assert op is not None and t is not None
    conf = run.gate.confidence
    counted = impl.counted(sc.records)
    base = counted if counted is not None else np.asarray(impl.values(sc.records), dtype=np.float64)
    low_vals = _Sample(base, np.concatenate([c.known, c.low]))
    high_vals = _Sample(base, np.concatenate([c.known, c.high]))  # a timeout's inf: unbounded, counted as such
    n = low_vals.n

    def agg(v: _Sample) -> float:
        return v.agg(e.percentile, e.agg)

    # the independent draws a percentile claim rests on: requests, where a request's gaps are one
    # (each stalled request adds one gap and one request)
    units = None if m.units is None else m.units + c.stalled
    fk = kind(rule)
    note = _censored_note(c, n, e.metric or e.text, fk, m.unit)
    low, high = agg(low_vals), agg(high_vals)
    if math.isinf(high):
        vtext = f"{e.text} >= {format_beside(low, fk, op, t)}"
    elif high > low:
        vtext = f"{e.text} between {format_beside(low, fk, op, t)} and {format_beside(high, fk, op, t)}"
    else:
        vtext = f"{e.text} = {format_beside(low, fk, op, t)}"
    value = low if high > low else high
    where = loc(sc)
    ok_low, ok_high = compare(low, op, t), compare(high, op, t)
    thr = f"threshold {op} {rule.threshold_text}"
    need = m.needed
    upper = op in ("<", "<=")
    q = e.percentile
    # == and != have no worse side: between unequal bounds the value may be the threshold or not
    if ok_low != ok_high or (op not in ("<", "<=", ">", ">=") and high > low):
        return Instance("inconclusive", where, value, vtext, n,
                        f"{vtext} over {_unit_word(m.unit, n)} ({thr}): {note}; whether it holds depends on "
                        + ("how long they would have taken" if c.timed_out + c.stalled == len(c.low) else "where within their bounds they lie")), value, n
    # the rule's outcome is the same at both bounds: counts at the bound that is worst for it
    worst = high_vals if (upper if ok_low else not upper) else low_vals
    over = worst.failing(op, t)
    qq = None if q is None or op not in ("<", "<=", ">", ">=") else (q if upper else 100.0 - q)
    have = n if units is None else units

    def counts(k: int, *, for_pass: bool) -> tuple[int, int]:
        return (k, n) if units is None else stats.independent_counts(k, n, units, for_pass=for_pass)

    if not ok_low:
        if have < need and qq is not None and qq > 0 and not stats.exceeds_with_confidence(*counts(over, for_pass=False), qq, conf):
            return Instance("inconclusive", where, value, vtext, n,
                            f"{vtext} from only {_unit_word(m.unit, n)} ({note}); needs {need - n} more"), value, n
        return Instance("fail", where, value, vtext, n, f"{vtext} over {_unit_word(m.unit, n)} ({thr}); {note}"), value, n
    if have < need:
        return Instance("inconclusive", where, value, vtext, n,
                        f"{vtext} from only {_unit_word(m.unit, n) if units is None else plural(units, 'request')} ({note}); "
                        f"needs {need - have} more"), value, n
    if qq is not None and qq > 0:
        k, kn = counts(over, for_pass=True)
        allowed = stats.max_overages(kn, qq, conf)
        if allowed is None or k > allowed:
            best = low_vals if upper else high_vals  # the samples certainly beyond the threshold
            certain = best.failing(op, t)
            if stats.exceeds_with_confidence(*counts(certain, for_pass=False), qq, conf):
                return Instance("fail", where, value, vtext, n,
                                f"{vtext} over {_unit_word(m.unit, n)} ({thr}), but so many samples violate the threshold that "
                                f"the percentile is beyond it at {conf * 100:.3g}% confidence; {note}"), value, n
            side = "above" if upper else "below"
            return Instance("inconclusive", where, value, vtext, n,
                            f"{vtext}, but {over} of {_unit_word(m.unit, n)} are {side} {rule.threshold_text} ({note}); at most "
                            f"{allowed if allowed is not None else 0} allowed at {conf * 100:.3g}% confidence"), value, n
    return Instance("pass", where, value, vtext, n, f"{vtext} ({thr}); {note}"), value, n


def _inner_text(rule: Rule) -> str:
    e = rule.expr
    return e.text[len(e.wrapper) + 1 : -1] if e.wrapper and e.text.startswith(e.wrapper + "(") else e.text


def _short_buckets(rule: Rule, short: list[tuple[Scope, Measure]], used: list[tuple[Scope, Measure]]) -> tuple[str, int | None, int]:
    """Why a drift/slope cannot be judged: (message, samples still needed, samples)."""
    e = rule.expr
    inner = _inner_text(rule)
    s0, m0 = short[0]
    b0 = f"bucket {s0.bucket}{clock_span(s0.start, s0.end)}"
    if m0.value is None:
        why = f"{b0} has no {inner} ({m0.reason})"
    else:
        why = f"{b0} has {inner} from only {_counted_text(m0)}, needs {m0.short} more"
    of = f"{len(short)} of the {len(used)} compared buckets are short of samples; " if len(short) > 1 else ""
    shortfall = max((m.short for _, m in short), default=0) or None
    return f"{e.wrapper}({inner}) cannot be judged: {of}{why}", shortfall, sum(m.samples for _, m in used)


def _trend(rule: Rule, n: int, used: list[tuple[Scope, Measure]]) -> tuple[float | None, str]:
    """The drift or slope of the compared buckets, and what it compares."""
    e = rule.expr
    inner = _inner_text(rule)
    vals = [float(m.value) for _, m in used]  # type: ignore[arg-type]
    if e.wrapper == "drift":
        inner_kind = METRICS[e.metric].result_kind(e.agg) if e.metric in METRICS else None
        k = quarters(n)
        first, last = stats.median(vals[:k]), stats.median(vals[len(vals) - k:])
        basis = f"{inner} {format_value(first, inner_kind)} → {format_value(last, inner_kind)}, first vs last {plural(k, 'bucket')}"
        return relative_change(first, last), basis  # type: ignore[arg-type]
    times = [((s.start or 0.0) + (s.end or 0.0)) / 2 for s, _ in used]
    return slope(times, vals), f"{inner} over {plural(n, 'bucket')}"


def sampling_interval(impl: Distribution | ServerMetric, sc: Scope, m: Measure, agg: str | None, q: float | None,
                      confidence: float) -> tuple[float, float]:
    """Where bucket `sc`'s pNN (its measure `m`) may lie, given how many samples it rests on:
    between the order statistics that the percentile rules' own test (`stats.max_overages`)
    puts on either side of it at the gate's confidence -- with k draws allowed beyond it, the
    (n-k)-th smallest sample bounds the percentile from above; the mirror test from below --
    a cluster's samples (a request's ITL gaps) one draw, as those rules count them (the share
    beyond kept: `stats.independent_counts`). Read back as the percentiles that land on those
    order statistics (their bins' extent where gaps are binned). (-inf, inf) where no order
    statistic bounds it; the point value itself where q is 0 or 100 (the extremes: no
    sampling interval, as before). A mean: `_mean_interval`. A server histogram's quantile is
    bounded the same way, each end at its bucket's bound; its mean by
    `servermetrics.histogram_mean_interval`; any other server figure (a gauge's or a counter's
    series) is its point."""
    if q is None and isinstance(impl, ServerMetric):  # a histogram's mean (a gauge's is a series: its point)
        got = histogram_mean_interval(impl, sc, confidence) if agg == "mean" and m.value is not None else None
        return (min(got[0], m.value), max(got[1], m.value)) if got is not None else (m.value, m.value)  # type: ignore[type-var, return-value]
    if q is None:
        return _mean_interval(impl, sc, m, confidence) if agg == "mean" else (-math.inf, math.inf)
    if m.value is None or not 0 < q < 100:
        return (m.value, m.value) if m.value is not None else (-math.inf, math.inf)
    n = m.samples
    units = m.units if m.units is not None and m.units < n else n
    k_hi = stats.max_overages(units, q, confidence)
    k_lo = stats.max_overages(units, 100.0 - q, confidence)
    if n < 2 or k_hi is None or k_lo is None:
        return -math.inf, math.inf
    beyond_hi, beyond_lo = k_hi * n // units, k_lo * n // units  # samples the draws' share allows
    # the percentile that lands on the 0-based order statistic p is 100 p / (n - 1); a hair past
    # it each way, so rounding never reads the value beside it on the inner side
    q_hi = min(100.0, 100.0 * (n - 1 - beyond_hi) / (n - 1) + 1e-9)
    q_lo = max(0.0, 100.0 * beyond_lo / (n - 1) - 1e-9)
    hi_m = impl.measure(sc, agg, q_hi, confidence=confidence) if q_hi > 0 else None
    lo_m = impl.measure(sc, agg, q_lo, confidence=confidence) if q_lo > 0 else None
    hi = (hi_m.bounds[1] if hi_m.bounds is not None else hi_m.value) if hi_m is not None else m.value
    lo = (lo_m.bounds[0] if lo_m.bounds is not None else lo_m.value) if lo_m is not None else m.value
    if hi is None or lo is None:
        return -math.inf, math.inf
    return min(lo, float(m.value)), max(hi, float(m.value))


def _mean_interval(impl: Distribution, sc: Scope, m: Measure, confidence: float) -> tuple[float, float]:
    """Where bucket `sc`'s mean (its measure `m`) may lie, given the samples it rests on: mean
    -+ t s / sqrt(u), Student's t with u - 1 degrees of freedom at the gate's confidence on each
    side (one-sided each, as `sampling_interval` bounds a percentile), s the values' standard
    deviation and u the independent draws they are: the requests, a request's ITL gaps one
    draw weighted as the percentile rules weigh them (`PerToken.draws`, Kish's effective
    number). That is the most clustering can cost a pooled mean -- were a request's gaps all
    one value, Var(mean) = s^2 sum(n_i^2) / N^2 = s^2 / u -- so the interval holds whatever the
    correlation within a request. It is the textbook interval of a mean (the central limit
    theorem's): for heavy-tailed values it is what a reviewer would compute, not an exact bound.
    (-inf, inf) with fewer than 2 draws; the point itself where every value is one value."""
    if m.value is None:
        return -math.inf, math.inf
    c = impl.counted(sc.records)
    if c is not None and c.n:  # gaps counted by value (`_itl_counted`): the mean's own n and spread
        vals, counts = np.asarray(c.values, dtype=np.float64), np.asarray(c.counts, dtype=np.float64)
    else:
        vals = np.asarray(impl.values(sc.records), dtype=np.float64)
        counts = np.ones(len(vals))
    n = float(counts.sum())
    units = impl.independent(sc.records)
    u = int(n) if units is None else min(int(units), int(n))
    if u < 2 or n < 2:
        return -math.inf, math.inf
    centre = float(np.dot(vals, counts)) / n
    var = float(np.dot(counts, (vals - centre) ** 2)) / (n - 1)
    if not math.isfinite(var):
        return -math.inf, math.inf
    half = stats.t_quantile(confidence, u - 1) * math.sqrt(var / u)
    return min(float(m.value), float(m.value) - half), max(float(m.value), float(m.value) + half)


def _interval_text(q: float | None, confidence: float, histogram: bool = False) -> str:
    """How `sampling_interval` bounded a bucket's value, for a message."""
    if q is None and histogram:
        return (f"its mean within Student's t standard errors either side at {confidence * 100:g}% confidence, its "
                f"observations' spread as the histogram's buckets give it, at most one draw a request")
    if q is not None:
        return f"its order statistics either side at {confidence * 100:g}% confidence, as the percentile rules count them"
    return (f"its mean within Student's t standard errors either side at {confidence * 100:g}% confidence, "
            f"a request one draw, its gaps too")


def _trend_bounds(rule: Rule, n: int, used: list[tuple[Scope, Measure]],
                  intervals: list[tuple[float, float]] | None = None) -> tuple[float, float] | None:
    """The least and greatest the drift or slope can be where some bucket's value is only known
    within bounds (binned gaps: `Measure.bounds`; a percentile's sampling interval: `intervals`,
    one a bucket of `used`); None where every value is exact. Drift is the relative change of
    two medians, each monotone in its buckets' values; a slope's numerator is linear in them
    and its denominator their mean."""
    if not any(m.bounds is not None for _, m in used) and not intervals:
        return None
    los = [m.bounds[0] if m.bounds is not None else float(m.value) for _, m in used]  # type: ignore[arg-type]
    his = [m.bounds[1] if m.bounds is not None else float(m.value) for _, m in used]  # type: ignore[arg-type]
    if intervals:
        los = [min(a, iv[0]) for a, iv in zip(los, intervals)]
        his = [max(b, iv[1]) for b, iv in zip(his, intervals)]
    if not all(map(math.isfinite, los + his)):
        return -math.inf, math.inf
    if rule.expr.wrapper == "drift":
        k = quarters(n)
        f0, f1 = stats.median(los[:k]), stats.median(his[:k])
        l0, l1 = stats.median(los[len(los) - k:]), stats.median(his[len(his) - k:])
        ends = [relative_change(f, last) for f in (f0, f1) for last in (l0, l1)]  # type: ignore[arg-type]
    else:
        c = centred([((s.start or 0.0) + (s.end or 0.0)) / 2 for s, _ in used])  # as `slope` takes the times
        if c is None:
            return None
        w, sxx = c
        num = (math.fsum(x * (a if x < 0 else b) for x, a, b in zip(w, los, his)) / sxx * 60.0,
               math.fsum(x * (b if x < 0 else a) for x, a, b in zip(w, los, his)) / sxx * 60.0)
        mean = (math.fsum(los) / len(los), math.fsum(his) / len(his))
        if mean[0] <= 0:  # a mean that may be 0: no bound on the ratio
            return -math.inf, math.inf
        ends = [x / m for x in num for m in mean]
    if any(e is None for e in ends):
        return -math.inf, math.inf
    return min(ends), max(ends)  # type: ignore[type-var]


def _wrapped(run: JudgedRun, sc: Scope, rule: Rule, impl: MetricImpl) -> Judged:
    """drift() or slope() over the buckets of a level (or of a backend, in level order)."""
    assert rule.op is not None and rule.threshold is not None
    e = rule.expr
    bi = sc.backends[0]
    levels = [sc.level] if sc.level is not None else list(bi.levels)
    series = bucket_series(bi, levels, impl, e.agg, e.percentile, confidence=run.gate.confidence, min_samples=run.gate.min_samples)
    where = loc(sc)
    n = len(series)
    if n < 2:
        return Instance("inconclusive", where, None, None, n, f"{e.wrapper}() needs at least 2 buckets; there {'is' if n == 1 else 'are'} {n}"), None, n
    used = series[:quarters(n)] + series[n - quarters(n):] if e.wrapper == "drift" else series
    short = [(s, m) for s, m in used if m.value is None or m.short]
    if short:
        message, shortfall, samples = _short_buckets(rule, short, used)
        return Instance("inconclusive", where, None, None, samples, message, shortfall), None, samples
    if any(not math.isfinite(m.value) for _, m in used):  # type: ignore[arg-type]
        # a server gauge at +Inf or -Inf (the text format allows them): no relative change of it
        samples = sum(m.samples for _, m in used)
        return Instance("inconclusive", where, None, None, samples, f"{e.wrapper}() is undefined: {_inner_text(rule)} is "
                        "not finite in a bucket it compares (the server's +Inf or -Inf)"), None, samples
    value, basis = _trend(rule, n, used)
    samples = sum(m.samples for _, m in used)
    if value is None:
        return Instance("inconclusive", where, None, None, samples, f"{e.wrapper}() is undefined: the baseline {_inner_text(rule)} is 0 ({basis})"), None, samples
    # a percentile or mean of sampled requests (or their gaps): each bucket's value within its
    # sampling interval (`sampling_interval`), so a drift that noise alone could carry across
    # the threshold is INCONCLUSIVE, never a FAIL (or a PASS) of the server
    sampled = (isinstance(impl, Distribution) and (e.percentile is not None or e.agg == "mean")
               or isinstance(impl, ServerMetric) and (e.percentile is not None and any(m.coarse for _, m in used)
                                                      or e.agg == "mean" and all(m.unit == "observation" for _, m in used)))
    intervals = [sampling_interval(impl, s, m, e.agg, e.percentile, run.gate.confidence)  # type: ignore[arg-type]
                 for s, m in used] if sampled else None
    binned = _trend_bounds(rule, n, used)
    bounds = _trend_bounds(rule, n, used, intervals)
    approx = binned is not None and binned[0] != binned[1]
    vtext = f"{e.text} {'≈' if approx else '='} {format_beside(value, None, rule.op, rule.threshold, signed=True)}{'/min' if e.wrapper == 'slope' else ''}"
    coarse = next((m.coarse for _, m in used if m.coarse), None)
    if binned is not None and compare(binned[0], rule.op, rule.threshold) != compare(binned[1], rule.op, rule.threshold):
        if coarse is not None:  # a server histogram's quantiles: each only known within its bucket
            return Instance("inconclusive", where, value, vtext, samples,
                            f"{vtext} ({basis}): each bucket's {_inner_text(rule)} is only known within {coarse} it falls "
                            f"in, and within those the {e.wrapper} lies {_span(rule, binned)}, either "
                            f"side of the threshold {rule.op} {rule.threshold_text} (the estimate assumes observations spread "
                            f"evenly across a bucket; the client's own {_client_twin(e.text)}is measured exactly)"), value, samples
        return Instance("inconclusive", where, value, vtext, samples,
                        f"{vtext} ({basis}): its buckets' {_inner_text(rule)} are known to 0.1% (their gaps are counted in "
                        f"bins, too many distinct gaps a bucket to count each), and within that it may lie either side of "
                        f"the threshold {rule.op} {rule.threshold_text}"), value, samples
    if bounds is not None and compare(bounds[0], rule.op, rule.threshold) != compare(bounds[1], rule.op, rule.threshold):
        return Instance("inconclusive", where, value, vtext, samples,
                        f"{vtext} ({basis}): each bucket's {_inner_text(rule)} is only known within the samples it rests on "
                        f"({_interval_text(e.percentile, run.gate.confidence, isinstance(impl, ServerMetric))}), and within those the {e.wrapper} lies "
                        f"{_span(rule, bounds)}, "
                        f"either side of the threshold {rule.op} {rule.threshold_text}: sampling noise alone could decide it"), value, samples
    status: Status = "pass" if compare(value, rule.op, rule.threshold) else "fail"
    return Instance(status, where, value, vtext, samples, f"{vtext} ({basis}; threshold {rule.op} {rule.threshold_text})"), value, samples


def _span(rule: Rule, bounds: tuple[float, float]) -> str:
    """Where a drift or slope may lie (`_trend_bounds`), for a message."""
    if not all(map(math.isfinite, bounds)):
        return "anywhere"
    per = "/min" if rule.expr.wrapper == "slope" else ""
    return (f"between {format_beside(bounds[0], None, rule.op, rule.threshold, signed=True)} and "
            f"{format_beside(bounds[1], None, rule.op, rule.threshold, signed=True)}{per}")


def _client_twin(text: str) -> str:
    """The client's metric a server histogram's name suggests ("ttft " for one named
    time_to_first_token), for a hint; "timing " where none does."""
    for part, name in (("time_to_first_token", "ttft"), ("inter_token", "itl"), ("time_per_output_token", "tpot"),
                       ("e2e_request_latency", "latency")):
        if part in text:
            return name + " "
    return "timing "


# the times from the intended start, and the same times from the actual send: an open loop's
# first token and end less `intended_start` hold the load generator's own lateness
# (`schedule_lag`), which the same times less `start` do not (compare reads this table too)
FROM_SEND = {"ttft": "sent_ttft", "latency": "sent_latency"}
# where a level declares max_concurrency the send figure also leaves out the wait for a slot
# under the user's cap, and `admitted` holds the queue the client's own lateness built: the
# figure there replays the slot queue as an on-time client would have driven it (capreplay)
REPLAYED = "{} with the slot queue replayed on time"
CAP_REPLAYED = "the wait for a slot under max_concurrency as an on-time load generator would have met it"
CAP_LAG = " after each slot, and the queue that lateness built"


@dataclasses.dataclass(frozen=True)
class LagFigure:
    """What a failing ttft or latency is measured again with to see whether the load
    generator's own schedule lag decided it (`lag_figure`): `name` as the messages write it
    inside the statistic (sent_ttft; ttft with the slot queue replayed on time), the catalogue
    metric that gives its kind and names the requests it leaves out (the send metric; the
    judge's own figure keeps the metric it is of: the same kind, the same requests), its
    implementation, and how the messages say what it is: `measured` after "measured " and
    `keeps` after its name (a require rule's note: "measured from the actual send
    (p50(sent_ttft))"), `short` before "it is" (an abort's: "from the send it is 145ms"), and
    `lag` after the schedule lag's own figure: at a capped level schedule_lag counts from the
    slot, so it shows the lateness after each slot, not the queue that lateness built (which
    the replay takes out too), and the messages say so."""

    name: str
    metric: str
    impl: MetricImpl
    measured: str
    keeps: str
    short: str
    lag: str = ""

    def text(self, metric: str, stat_text: str) -> str:
        """`stat_text` ("p50(ttft)") with this figure in place of `metric`."""
        return stat_text.replace(f"({metric})", f"({self.name})")


def lag_figure(client_judged: bool, metric: str, levels: list[LevelIndex]) -> LagFigure | None:
    """The figure that takes the load generator's own lateness out of `metric` (ttft, latency)
    over `levels` (a scope's, or an abort's one), or None where the client's lag cannot decide
    a failure there: the client is not judged (`client_judged` false: a gate's `client_healthy =
    false`, or in compare either run's -- its figures as measured), no level is an open loop (a closed loop's intended start is its send), or
    `metric` is no time from the intended start. The one predicate the require rules
    (`_lag_decided`) and the abort rules (`validity.abort_lag_decided`) both ask.

    Decision: the figure is `metric` less what the client's lateness added to it, per request.
    Where no level declares max_concurrency that is the time from the actual send, exactly (the
    lateness is start - intended_start), and the registered send metric (sent_ttft,
    sent_latency) is used and named, as before. Where one does (`index.capped`), the wait for a
    slot behind the user's declared cap is what users see and must stay in the figure -- but
    not the wait as recorded: a request sent late also holds its slot late, so with the cap full
    the next one's `admitted` absorbs that lateness and the queue grows from the client's
    lateness alone (`admitted - intended_start` carries it; the send figure would take the
    cap's own wait out too). So the level's slot queue is replayed as an on-time client would
    have driven it (`judge/capreplay.py`: per load process, FIFO in intended-start order, each
    request holding its slot for its own service time) and the figure is (replayed admit -
    intended_start) + (stamp - start): `metric` less (start - replayed admit). Requests of an
    uncapped level in the same scope count from the send, as above. Where the replay cannot be
    made (a level split over processes whose records do not all name a worker, a request whose
    slot time the records do not show, and every later one of its process), the requests keep
    their figure as measured: the FAIL stands on them (missing data is never the client's
    excuse). It is the judge's own figure (`registry.less_lag`), not a metric a spec may write: a
    spec has ttft and sent_ttft for what users and the server see; this one only answers whose
    lateness carried a failure over its threshold. The replay is made only when a failing
    instance is measured with it, once per level (`LevelIndex.slot_replay`)."""
    from soakspec.judge.index import capped
    from soakspec.judge.registry import less_lag, metric as registered

    if metric not in FROM_SEND or not client_judged or not any(lv.entry.get("mode") == "open" for lv in levels):
        return None
    replayed = [lv for lv in levels if capped(lv.entry)]
    if replayed:
        return LagFigure(REPLAYED.format(metric), metric, less_lag(metric, _replay_gain(replayed)),
                         "less the load generator's own lateness", f", {CAP_REPLAYED}",
                         f"less the load generator's own lateness, {CAP_REPLAYED},", CAP_LAG)
    return LagFigure(FROM_SEND[metric], FROM_SEND[metric], registered(FROM_SEND[metric]), "from the actual send", "", "from the send")


def _replay_gain(capped_levels: list[LevelIndex]) -> Columnar:
    """What the load generator's lateness added to each request's times: at the capped levels,
    the send less the admit of their slot queue replayed on time (`LevelIndex.slot_replay`,
    made on the first read); any other request's schedule lag (start - intended_start: its
    time from the send); 0 where neither is known (the figure as measured)."""

    def col(t: RequestTable, idx: np.ndarray) -> np.ndarray:
        got = np.full(len(idx), np.nan)
        for lv in capped_levels:
            g = lv.slot_replay.col(t, idx)
            got = np.where(np.isnan(g), got, g)
        rest = np.isnan(got)
        if rest.any():
            got[rest] = t.schedule_lag(idx)[rest]
        return np.where(np.isnan(got), 0.0, got)

    keys = {(lv.workload, lv.index) for lv in capped_levels}

    def row(r: Row) -> float:
        if isinstance(r, Rec):
            return float(col(r.table, np.array([r.i], dtype=np.int64))[0])
        if (r.get("workload"), r.get("level")) in keys:  # a row of no table at a capped level: not replayed,
            return 0.0  # its figure as measured
        lag = schedule_lag(r)  # as the column form reads any other request
        return 0.0 if lag is None else lag

    return Columnar(row, col)


def _lag_decided(run: JudgedRun, sc: Scope, rule: Rule, j: Judged) -> Judged:
    """A failing instance of a time from the intended start (FROM_SEND), tagged CLIENT_LAG when
    the same statistic over the same scope less the load generator's own lateness
    (`lag_figure`: from the actual send; at a level under max_concurrency, with its slot
    queue replayed on time, the cap's own wait kept) does not fail: the client's
    schedule lag, added to every open-loop time (rightly: coordinated omission), is what
    carried it over the threshold, so `validity.client_blocks` makes it INCONCLUSIVE, never the
    server's FAIL. Untouched where that figure fails too (the server's own time, or the cap's
    wait), and where `lag_figure` says the lag cannot decide (the gate's `client_healthy =
    false`, no open-loop level). Measured again with the same vectorised measures, and only
    for failing instances."""
    from soakspec.judge.registry import impl_for
    from soakspec.judge.validity import CLIENT_LAG

    inst = j[0]
    e = rule.expr
    levels = [sc.level] if sc.level is not None else [lv for bi in sc.backends for lv in bi.levels]
    fig = lag_figure(run.gate.client_healthy, e.metric, levels)
    if fig is None:
        return j
    own = dataclasses.replace(e, metric=fig.metric, text=fig.text(e.metric, e.text))
    mine = _instance(run, sc, dataclasses.replace(rule, expr=own), fig.impl)[0]
    if mine.status == "fail":
        return j
    lag = dataclasses.replace(e, metric="schedule_lag", text=e.text.replace(f"({e.metric})", "(schedule_lag)"))
    m = impl_for(lag).measure(sc, lag.agg, lag.percentile, confidence=run.gate.confidence, min_samples=run.gate.min_samples)
    if mine.observed_text and mine.status == "pass":  # "p50(sent_ttft) = 145ms" (or ≈): its figure
        figure = f"it is {re.split(' [=≈] ', mine.observed_text, maxsplit=1)[-1]}"
    else:  # too few requests, or none completed: the server's own figure cannot be judged either
        figure = f"it cannot be judged ({mine.message})"
    lag_text = f"{lag.text} = {format_value(m.value, Kind.DURATION)}" if m.value is not None else "schedule_lag"
    note = (f"{inst.observed_text or e.text} fails {rule.op} {rule.threshold_text}, but measured {fig.measured} "
            f"({own.text}{fig.keeps}) {figure}: the load generator's own schedule lag ({lag_text}{fig.lag}) decides it")
    return dataclasses.replace(inst, cause=CLIENT_LAG, lag_note=note), j[1], j[2]


def _badness(rule: Rule, v: float | None) -> float:
    if v is None or rule.threshold is None:
        return -math.inf
    t = rule.threshold
    if rule.op in ("<", "<="):
        return v - t
    if rule.op in (">", ">="):
        return t - v
    if rule.op == "==":
        return abs(v - t)
    return -abs(v - t)


def _pick(rule: Rule, judged: list[Judged]) -> tuple[Judged | None, list[Instance]]:
    """The reported instance -- the worst failure, else the first inconclusive one, else the
    pass closest to failing -- and the non-passing instances in the order they are listed."""
    insts = [j[0] for j in judged]
    failing = [j for j in judged if j[0].status == "fail"]
    if failing:
        pick = max(failing, key=lambda j: _badness(rule, j[1]))
        return pick, [pick[0]] + [i for i in insts if i.status == "fail" and i is not pick[0]]
    unsure = [j for j in judged if j[0].status == "inconclusive"]
    if unsure:
        return unsure[0], [i for i in insts if i.status == "inconclusive"]
    passing = [j for j in judged if j[0].status == "pass"]
    return (max(passing, key=lambda j: _badness(rule, j[1])) if passing else None), []


def judge(run: JudgedRun, rule: Rule, impl: MetricImpl) -> RuleResult:
    e = rule.expr
    scope_list = scopes(rule.scope, run.backends_for(rule), rule.window_s)
    if not scope_list:
        inst = Instance("inconclusive", Location(), None, None, 0, f"no {rule.scope} in the evidence to evaluate")
        return result(rule, e.text, "performance", rule.severity, [inst], "", 0, observed=None)
    one = _wrapped if e.wrapper is not None else _instance
    judged = [one(run, sc, rule, impl) for sc in scope_list]
    if e.wrapper is None and e.metric in FROM_SEND:  # only the failing instances are measured again
        judged = [_lag_decided(run, sc, rule, j) if j[0].status == "fail" else j for sc, j in zip(scope_list, judged)]
    pick, ordered = _pick(rule, judged)
    n = len(scope_list)
    msg = ""
    if pick is not None and pick[0].status == "pass":
        each = f"all {n} {rule.scope}s pass; worst: " if n > 1 else ""
        msg = f"{each}{pick[0].where.text}: {pick[0].message}" if pick[0].where.text else f"{each}{pick[0].message}"
    res = result(rule, e.text, "performance", rule.severity, ordered, msg, n,
                 observed=pick[1] if pick else None, where=pick[0].where if pick else None)
    return replace(res, observed_text=pick[0].observed_text if pick else None, samples=pick[2] if pick else None)

