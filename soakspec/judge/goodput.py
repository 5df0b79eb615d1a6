"""Goodput: the share (or rate) of requests that meet an SLO set, judged with LoadGen's rigour.

`goodput(ttft < 500ms and tpot < 50ms)` is, over a scope's *measured* requests (warm-up and the
follow-up excluded), the fraction that completed and meet every condition of the set;
`goodput_rate(...)` is how many requests meeting it the server delivered per second of the
scope's wall time: of its completed requests that *ended* within the scope's buckets, as qps
counts them (`measures.delivered`), so the rate is the part of qps that met the SLO and never
exceeds it, as vLLM's `request_goodput` never exceeds its `request_throughput` (one duration
divides both). Counting the requests sent in the scope instead read an overloaded open loop's
goodput rate as its offered rate (100 rps beside 43.5 achieved). What counts:

  - a request that did not complete (failed, timed out, rejected, disconnected) never meets an
    SLO: it is in the denominator and not in the numerator;
  - a completed request that has no value for a condition's metric does not meet it either
    (tpot of a one-token answer, tpot or output_tokens of a usage-mismatched request,
    schedule_lag of a closed-loop request): a goodput claim rests only on measured values;
  - each condition reads the request's value through the same per-request functions as the
    metric's own rules (`soakspec.judge.measures`: ttft, tpot, latency, ...), so `goodput(ttft <
    1s)` and `p95(ttft) < 1s` speak about the same numbers.

Sample size. `goodput(...) >= X` claims that the true fraction of requests meeting the SLO is
at least X: the misses are the overages of the X-quantile, so the rule is judged exactly like
`pX(...)` (`soakspec.judge.stats`, LoadGen's early-stopping rule): PASS only when the misses
are at most `max_overages(n, 100 X, confidence)`; FAIL when the observed share is below X, or
when so many requests miss that the true share is below X at the gate's confidence
(`exceeds_with_confidence`); otherwise INCONCLUSIVE with "needs N more requests meeting the
SLO" (`samples_for_overages`). `goodput(...) <= X` is the mirror (the hits are the overages).
So `goodput(...) >= 95%` at 95 % confidence needs at least 59 measured requests, with no miss
among the first 59 -- `lang.samples.min_samples_for_share`, the count `check`'s W509 warns a
share rule's planned scope cannot reach. `goodput_rate(...)` is a rate over wall time, compared as measured (like
`rate(completed)`): it needs one measured request and cannot pass a scope where nothing
completed.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterable, Sequence

from soakspec.judge import stats
from soakspec.judge.common import compare, format_beside, format_value, loc, plural, replace, result
from soakspec.judge.index import Row
from soakspec.judge.joined import JudgedRun
from soakspec.judge.measures import delivered_in
from soakspec.judge.scope import Scope, level_scope, scopes
from soakspec.judge.verdict import Instance, Location, RuleResult
from soakspec.lang.metrics import Kind
from soakspec.lang.samples import min_samples_for_share, share_quantile
from soakspec.lang.spec import Rule, Slo, Spec

__all__ = ["Share", "goodput", "goodput_rate", "judge", "level_summary", "meets", "share", "slo_sets", "slo_text"]


def _value_of(metric: str) -> Callable[[Row], float | None]:
    """The per-request value function of `metric`, as its own rules read it (the registry's
    `PerRequest` implementation)."""
    from soakspec.judge.registry import metric as impl_of  # the registry lists this module's rule

    return impl_of(metric).value  # type: ignore[attr-defined]


def meets(r: Row, slo: Sequence[Slo]) -> bool:
    """Does request `r` count as goodput: completed, and every condition holds on its value?"""
    if r.get("outcome") != "completed":
        return False
    for c in slo:
        v = _value_of(c.metric)(r)
        if v is None or not compare(v, c.op, c.threshold):
            return False
    return True


def hits(records: Iterable[Row], slo: Sequence[Slo]) -> tuple[int, int]:
    """(requests meeting the SLO, measured requests)."""
    n = k = 0
    for r in records:
        n += 1
        k += meets(r, slo)
    return k, n


def goodput(records: Iterable[Row], slo: Sequence[Slo]) -> float | None:
    """The share of `records` meeting `slo` (None: no records). Order does not matter."""
    k, n = hits(records, slo)
    return k / n if n else None


def delivered_hits(scope: Scope, slo: Sequence[Slo]) -> tuple[int, int]:
    """(requests meeting `slo`, requests) among those the server delivered in the scope's
    windows: its completed requests that ended in one (`measures.delivered`, what qps counts)."""
    k = n = 0
    for bi, w in scope.windows:
        if w.start is None or w.end is None:
            continue
        for part in delivered_in(bi, w):
            for r in part:
                n += 1
                k += meets(r, slo)
    return k, n


def goodput_rate(scope: Scope, slo: Sequence[Slo]) -> float | None:
    """Requests meeting `slo` the server delivered per second of the scope's wall time (None:
    unknown wall time): the part of the scope's qps that met the SLO."""
    wall = scope.wall_s
    if not wall:
        return None
    return delivered_hits(scope, slo)[0] / wall


def slo_text(slo: Sequence[Slo]) -> str:
    return " and ".join(f"{c.metric} {c.op} {c.threshold_text}" for c in slo)


def slo_sets(spec: Spec) -> list[tuple[Slo, ...]]:
    """The distinct SLO sets the spec's gate rules name, in rule order."""
    out: dict[str, tuple[Slo, ...]] = {}
    for r in spec.gate.rules:
        if r.expr.slo:
            out.setdefault(slo_text(r.expr.slo), r.expr.slo)
    return list(out.values())


def level_summary(run: JudgedRun) -> list[dict]:
    """results.json's `goodput`: per SLO set the gate names, per backend and level, the requests
    meeting it, the measured requests, the share (`met / requests`) and the rate (`goodput_rate`:
    the delivered requests meeting it per second of the level's wall time, a part of its qps)."""
    rows = []
    for slo in slo_sets(run.spec):
        for bi in run.judged:
            for lv in bi.levels:
                sc = level_scope(bi, lv)
                k, n = hits(sc.records, slo)
                rows.append({"slo": slo_text(slo), "backend": bi.name, "workload": lv.workload, "level": lv.index,
                             "label": lv.label, "met": k, "requests": n, "goodput": k / n if n else None,
                             "goodput_rate": goodput_rate(sc, slo)})  # fmt: skip
    return rows


# ------------------------------------------------------------------------------ judging


@dataclasses.dataclass(frozen=True)
class Share:
    """How a share claim over `n` requests of which `k` meet the SLO is judged (pure)."""

    status: str  # pass | fail | inconclusive
    why: str  # plain | too_few | within | certain | beyond (the point estimate fails) | unsure
    over: int = 0  # the overages: misses for ">= X", hits for "<= X"
    allowed: int | None = None  # the overages the confidence allows at n
    more: int | None = None  # inconclusive: how many more requests the claim needs


def share(k: int, n: int, op: str, threshold: float, confidence: float, min_samples: int = 1) -> Share:
    """Judge `k / n OP threshold` with LoadGen's overage rule (module docstring); n > 0."""
    ok = compare(k / n, op, threshold)
    if op not in ("<", "<=", ">", ">="):
        return Share("pass" if ok else "fail", "plain")
    # ">= X": the misses are the overages of the X-quantile; "<= X": the hits, of the (1-X)-quantile
    over = n - k if op in (">", ">=") else k
    q = share_quantile(op, threshold)
    needed = min_samples_for_share(op, threshold, confidence, min_samples)  # what check's W509 asks for
    if q is None or needed is None:  # ">= 0%" or "<= 100%": true of any share
        return Share("pass", "plain", over)
    certain = stats.exceeds_with_confidence(over, n, q, confidence) if q < 100 else over > 0
    if n < needed and not certain:  # too few for any claim, and the violation (if any) is not certain
        return Share("inconclusive", "too_few", over, None, needed - n)
    if not ok:
        return Share("fail", "beyond", over)
    allowed = stats.max_overages(n, q, confidence)
    if allowed is not None and over <= allowed:
        return Share("pass", "within", over, allowed)
    if certain:
        return Share("fail", "certain", over, allowed)
    return Share("inconclusive", "unsure", over, allowed, stats.samples_for_overages(over, n, q, confidence) or None)


def _ratio_instance(run: JudgedRun, sc: Scope, rule: Rule) -> tuple[Instance, float | None]:
    assert rule.op is not None and rule.threshold is not None
    k, n = hits(sc.records, rule.expr.slo)
    where = loc(sc)
    if n == 0:
        return Instance("inconclusive", where, None, None, 0, f"{rule.expr.text} cannot be computed: no measured requests", 1), None
    value = k / n
    vtext = f"{rule.expr.text} = {format_beside(value, Kind.RATIO, rule.op, rule.threshold)}"
    conf = run.gate.confidence
    j = share(k, n, rule.op, rule.threshold, conf, run.gate.min_samples)
    basis = f"{k} of {plural(n, 'request')} meet it"
    side = "miss" if rule.op in (">", ">=") else "meet"
    thr = f"threshold {rule.op} {rule.threshold_text}"
    at = f"{conf * 100:.3g}% confidence"
    if j.why == "too_few":
        msg = f"{vtext} from only {plural(n, 'request')}; needs {j.more} more (a share of {rule.threshold_text} at {at} needs {n + (j.more or 0)})"
    elif j.why == "within":
        msg = f"{vtext} ({basis}; {j.over} {side} it, at most {j.allowed} allowed at {at}; {thr})"
    elif j.why == "certain":
        msg = f"{vtext}, but {j.over} of {plural(n, 'request')} {side} the SLO: the true share is beyond {rule.threshold_text} at {at}"
    elif j.why == "unsure":
        need = f"needs {plural(j.more, 'more request')} {'meeting' if side == 'miss' else 'missing'} the SLO" if j.more else "cannot be claimed"
        msg = (f"{vtext} ({basis}), but {j.over} {side} it; at most {j.allowed if j.allowed is not None else 0} allowed "
               f"at {at} ({thr}); {need}")
    else:
        msg = f"{vtext} ({basis}; {thr})"
    return Instance(j.status, where, value, vtext, n, msg, j.more if j.status == "inconclusive" else None), value  # type: ignore[arg-type]


def _rate_instance(run: JudgedRun, sc: Scope, rule: Rule) -> tuple[Instance, float | None]:
    assert rule.op is not None and rule.threshold is not None
    where = loc(sc)
    n = len(sc.records)
    value = goodput_rate(sc, rule.expr.slo)
    if n == 0 or value is None:
        why = "no measured requests" if n == 0 else "the scope's wall time is unknown"
        return Instance("inconclusive", where, None, None, n, f"{rule.expr.text} cannot be computed: {why}", 1), None
    vtext = f"{rule.expr.text} = {format_beside(value, Kind.RATE, rule.op, rule.threshold)}"
    ok = compare(value, rule.op, rule.threshold)
    if ok and not any(r.get("outcome") == "completed" for r in sc.records):
        return Instance("inconclusive", where, value, vtext, n, f"{vtext}, but no request in it completed: nothing was measured", 1), value
    dk, dn = delivered_hits(sc, rule.expr.slo)
    return Instance("pass" if ok else "fail", where, value, vtext, n,
                    f"{vtext} ({dk} of the {plural(dn, 'request')} the server delivered in it meet it; "
                    f"threshold {rule.op} {rule.threshold_text})"), value


def _badness(rule: Rule, v: float | None) -> float:
    if v is None or rule.threshold is None:
        return -math.inf
    return rule.threshold - v if rule.op in (">", ">=") else v - rule.threshold


def judge(run: JudgedRun, rule: Rule) -> RuleResult:
    """Judge a goodput rule over every instance of its scope; the worst instance is reported
    (the registry's `goodput` row: a performance rule that needs its SLO set, not only a name)."""
    scope_list = scopes(rule.scope, run.backends_for(rule), rule.window_s)
    if not scope_list:
        inst = Instance("inconclusive", Location(), None, None, 0, f"no {rule.scope} in the evidence to evaluate")
        return result(rule, rule.expr.text, "performance", rule.severity, [inst], "", 0, observed=None)
    one = _rate_instance if rule.expr.agg == "rate" else _ratio_instance
    judged = [(*one(run, sc, rule),) for sc in scope_list]
    insts = [i for i, _ in judged]
    failing = [j for j in judged if j[0].status == "fail"]
    unsure = [j for j in judged if j[0].status == "inconclusive"]
    if failing:
        pick = max(failing, key=lambda j: _badness(rule, j[1]))
        ordered = [pick[0]] + [i for i in insts if i.status == "fail" and i is not pick[0]]
    elif unsure:
        pick, ordered = unsure[0], [i for i in insts if i.status == "inconclusive"]
    else:
        pick, ordered = max(judged, key=lambda j: _badness(rule, j[1])), []
    n = len(scope_list)
    msg = ""
    if pick[0].status == "pass":
        each = f"all {n} {rule.scope}s pass; worst: " if n > 1 else ""
        msg = f"{each}{pick[0].where.text}: {pick[0].message}" if pick[0].where.text else f"{each}{pick[0].message}"
    res = result(rule, rule.expr.text, "performance", rule.severity, ordered, msg, n, observed=pick[1], where=pick[0].where)
    return replace(res, observed_text=pick[0].observed_text, samples=pick[0].samples)
