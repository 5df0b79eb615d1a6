"""`gate { ... }`: the gate's settings and its rules (`require|warn EXPR [OP VALUE] [per ...] [on "..."]`).

`abort EXPR OP VALUE per bucket|window D [on "..."]` rules are the runner's: it evaluates each on
every finished bucket (or window) from the records it already holds, and stops the run's load
when one holds (they land in `Gate.aborts`, not `Gate.rules`). Only what a finished bucket's
records give is allowed (`ABORT_OUTCOMES`, `ABORT_DISTRIBUTIONS`); anything else is E422.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Mapping
from typing import NamedTuple

from soakspec.lang import ast as A
from soakspec.lang import spec as S
from soakspec.lang.batches import batch_requests
from soakspec.lang.check.core import Bad, Ctx, Key, Table, closest, describe, quantity_value, suggest
from soakspec.lang.check.requests import requests_per_second
from soakspec.lang.check.walk import walk_settings
from soakspec.lang.fmt import expr_text, rule_text, value_text
from soakspec.lang.metrics import (AGGREGATE_WORDS, AGGREGATES, EVIDENCE_PREDICATES, GOODPUT, METRIC_WORDS, METRICS, SERVER_METRIC_NAME,
                                   SERVER_RATIO_SUFFIXES, SLO_FUNCTIONS, SLO_METRICS, Kind, parse_percentile)
from soakspec.lang.samples import arrival_count_at_most, arrival_count_sd, min_samples_for_percentile, min_samples_for_share
from soakspec.lang.simoptions import OPTIONS as _SIM_OPTIONS
import soakspec.windows as windows
from soakspec.units import UNITS, Dimension, format_duration

SCOPES = ("run", "backend", "level", "bucket", "window", "phase", "turn")  # phase: each named phase (a level) of a workload's load;
# turn: each user turn of a multi-turn level's sessions (its requests of that turn, `judge.scope.turn_scopes`)
WRAPPERS = ("drift", "slope")
_DIM_OF_KIND = {Kind.DURATION: Dimension.DURATION, Kind.SIZE: Dimension.SIZE, Kind.RATIO: Dimension.RATIO, Kind.RATE: Dimension.RATE}

GATE = Table(
    cls=S.Gate,
    keys=(
        Key("confidence", "quantity", "confidence", Dimension.RATIO),  # in [50%, 100%): gate()
        Key("min_samples", "int", "min_samples", minimum=1, maximum=1_000_000_000,
            why="more samples than a run sends (at most 1,000,000,000 a level) could never be met"),
        Key("allow_rehearsal", "bool", "allow_rehearsal"),
        Key("trace_window", "quantity", "trace_window_s", Dimension.DURATION),
        Key("abort_default", "bool", "abort_default"),
        Key("client_healthy", "bool", "client_healthy"),
        Key("client_lag", "quantity", "client_lag", Dimension.DURATION),
        Key("client_cpu", "quantity", "client_cpu", Dimension.RATIO, maximum=1.0),
        Key("client_schedule_lag", "quantity", "client_schedule_lag", Dimension.DURATION),
        Key("client_concurrency", "quantity", "client_concurrency", Dimension.RATIO, maximum=1.0),
    ),
    statements=(A.Rule,),
)


def gate(ctx: Ctx, blk: A.Block | None, backends: Mapping[str, S.Backend]) -> S.Gate:
    """The gate's settings and rules; `backends` (by name) are what rules may name and scope."""
    backend_names = set(backends)
    if blk is None:
        return S.Gate()
    b, fields = walk_settings(ctx, blk, GATE, "gate")
    stmts = [s for s in b.statements if s.severity != "abort"]
    rules = [_rule(ctx, stmt, backend_names) for stmt in stmts]
    for stmt, rule in zip(stmts, rules):
        if rule is not None:
            _check_observable(ctx, stmt, rule, backends)
    aborts = [_abort(ctx, stmt, backend_names) for stmt in b.statements if stmt.severity == "abort"]
    return S.Gate(rules=tuple(r for r in rules if r is not None), aborts=tuple(r for r in aborts if r is not None), **fields)


# What the runner computes on a finished bucket or window from its own records: outcome counts
# (count, ratio) and per-request distributions over the completed requests (mean, min, max, pNN).
ABORT_OUTCOMES = ("requests", "completed", "failed", "timeouts", "rejected", "disconnected", "errors")
ABORT_DISTRIBUTIONS = ("ttft", "latency", "tpot", "output_tokens", "prompt_tokens", "schedule_lag", "sent_ttft", "sent_latency")
ABORT_SCOPES = ("bucket", "window")


def _abort(ctx: Ctx, stmt: A.Rule, backend_names: set[str]) -> S.Rule | None:
    """An abort rule: a gate rule the runner can evaluate live (E422 otherwise)."""
    e = stmt.expr
    name = e.arg.name if isinstance(e, A.Call) and isinstance(e.arg, A.MetricRef) else e.name if isinstance(e, A.MetricRef) else None
    if name not in ABORT_OUTCOMES + ABORT_DISTRIBUTIONS:
        allowed = ", ".join(ABORT_OUTCOMES + ABORT_DISTRIBUTIONS)
        ctx.error("E422", f"an abort rule is evaluated live on a finished bucket: it can use {allowed}", e.span,
                  "e.g. abort ratio(errors) > 50% per window 30s")
        return None
    rule = _rule(ctx, stmt, backend_names)
    if rule is None:
        return None
    if rule.expr.agg not in ("count", "ratio", "mean", "min", "max") and rule.expr.percentile is None:
        ctx.error("E422", f"{rule.expr.agg}() cannot be evaluated live; use count or ratio (outcomes), mean, min, max or pNN",
                  e.span)
        return None
    if stmt.scope is None or rule.scope not in ABORT_SCOPES:
        ctx.error("E422", "an abort rule is evaluated on each finished bucket or window: add per bucket or per window <duration>",
                  stmt.scope.span if stmt.scope is not None else stmt.span, "e.g. ... per window 30s")
        return None
    return rule


def _check_observable(ctx: Ctx, stmt: A.Rule, rule: S.Rule, backends: Mapping[str, S.Backend]) -> None:
    """A rule over what a backend can never produce could never pass: trace coverage of a
    backend whose traces are `source = none` (the default, except for a simulator); a server
    metric of a backend whose scrape is off."""
    if rule.expr.metric == "server":
        _check_server_side(ctx, stmt, rule, backends)
        return
    if rule.expr.metric != "trace_coverage":
        return
    scope = [backends[rule.backend]] if rule.backend is not None else list(backends.values())
    untraced = [bk.name for bk in scope if bk.traces.source == "none"]
    if not untraced:
        return
    names = ", ".join(f"'{n}'" for n in untraced)
    ctx.error(
        "E414",
        f"'{rule.expr.text}' can never be measured: backend {names} {'has' if len(untraced) == 1 else 'have'} no traces (source = none)",
        stmt.expr.span,
        "declare traces { source = log  pattern = r\"...\" } (or source = jsonl  file = \"...\"), or scope the rule with on \"backend\" to one that has them",
    )


def _check_server_side(ctx: Ctx, stmt: A.Rule, rule: S.Rule, backends: Mapping[str, S.Backend]) -> None:
    scope = [backends[rule.backend]] if rule.backend is not None else list(backends.values())
    bad = [bk.name for bk in scope if not bk.metrics.enabled]
    if bad:
        names = ", ".join(f"'{n}'" for n in bad)
        ctx.error("E403", f"'{rule.expr.text}' can never be measured on backend {names}: its metrics scrape is off (metrics {{ enabled = false }})",
                  stmt.expr.span, 'remove enabled = false, or scope the rule with on "backend"')


@dataclasses.dataclass(frozen=True)
class _Resolved:
    """What a rule's expression measures."""

    metric: str
    agg: str | None
    percentile: float | None
    wrapper: str | None
    kind: Kind
    klass: str
    failed: bool = False  # an error was reported, but the rest of the rule can still be checked
    slo: tuple[S.Slo, ...] = ()
    server: str | None = None  # server("family")
    over: str | None = None  # ratio(server(...), server("family")): the denominator


_FAILED = object()


def _attempt(part, ctx: Ctx, r: A.Rule, res: _Resolved, backend_names: set[str]):
    try:
        return part(ctx, r, res, backend_names)
    except Bad:
        return _FAILED


def _rule(ctx: Ctx, r: A.Rule, backend_names: set[str]) -> S.Rule | None:
    try:
        res = _resolve(ctx, r.expr)
    except Bad:
        return None
    parts = [_attempt(part, ctx, r, res, backend_names) for part in (_threshold, _scope, _target)]
    if res.failed or any(p is _FAILED for p in parts):
        return None
    threshold, (scope, window), target = parts
    return S.Rule(
        severity=r.severity,
        klass=res.klass,
        expr=S.Expr(metric=res.metric, agg=res.agg, percentile=res.percentile, wrapper=res.wrapper, text=expr_text(r.expr), slo=res.slo,
                    server=res.server, over=res.over),
        op=r.op,
        threshold=threshold,
        threshold_text=value_text(r.threshold) if r.threshold is not None else None,
        scope=scope,
        window_s=window,
        backend=target,
        text=rule_text(r),
        span=r.span,
    )


def _resolve(ctx: Ctx, expr: A.Expr) -> _Resolved:
    if isinstance(expr, A.SloCall):
        return _resolve_slo(ctx, expr)
    if isinstance(expr, A.MultiCall):
        return _resolve_ratio(ctx, expr)
    wrapper = None
    if isinstance(expr, A.Call) and expr.func in WRAPPERS:
        wrapper, expr = expr.func, expr.arg
        if isinstance(expr, A.MultiCall):
            ctx.error("E305", f"{wrapper}() of a ratio of two server counters is not judged: the ratio is already one number a scope",
                      expr.span, f"gate the ratio itself per bucket: {expr_text(expr)} >= ... per bucket")
            raise Bad
        if not isinstance(expr, A.Call):
            ctx.error("E305", f"{wrapper}() takes an aggregate such as {wrapper}(p95(ttft))", expr.span)
            raise Bad
    agg, percentile, metric_node = _aggregate(ctx, expr)
    family = _server_family(ctx, metric_node) if isinstance(metric_node, A.NamedRef) else None
    metric = "server" if isinstance(metric_node, A.NamedRef) else metric_node.name
    if metric in EVIDENCE_PREDICATES:
        if agg is not None or wrapper is not None:
            ctx.error("E305", f"'{metric}' is an evidence check, not a metric to aggregate", expr.span)
            raise Bad
        klass = "validity" if metric == "completed_run" else "evidence"
        return _Resolved(metric, None, None, None, EVIDENCE_PREDICATES[metric], klass)
    if metric == "server" and family is None:
        ctx.error("E305", "'server' names one of the server's own metrics: write server(\"vllm:num_requests_waiting\")", metric_node.span)
        raise Bad
    if metric not in METRICS:
        ctx.error("E302", f"unknown metric '{metric}'", metric_node.span, _metric_hint(metric, agg))
        raise Bad
    agg = _check_aggregate(ctx, METRICS[metric], agg, percentile, expr, metric_node)
    kind = Kind.RATIO if wrapper is not None else METRICS[metric].result_kind(agg)
    bad_percentile = percentile is None and re.fullmatch(r"p-?[0-9.]+", agg) is not None
    return _Resolved(metric, agg, percentile, wrapper, kind, "performance", failed=bad_percentile, server=family)


def _server_family(ctx: Ctx, node: A.NamedRef) -> str:
    """`server("vllm:num_requests_waiting")`: the family name, a Prometheus metric name."""
    if node.func != "server":
        ctx.error("E303", f"unknown function '{node.func}' with a name in quotes; only server(\"...\") names a metric by a string",
                  node.span, 'e.g. max(server("vllm:num_requests_waiting"))')
        raise Bad
    if not SERVER_METRIC_NAME.fullmatch(node.name):
        ctx.error("E302", f"server metric {node.name!r} is not a Prometheus metric name ([a-zA-Z_:][a-zA-Z0-9_:]*)", node.span,
                  "write the family name as /metrics shows it, without labels, e.g. vllm:num_requests_running")
        raise Bad
    return node.name


_RATIO_EXAMPLE = 'ratio(server("vllm:prefix_cache_hits_total"), server("vllm:prefix_cache_queries_total"))'


def _resolve_ratio(ctx: Ctx, expr: A.MultiCall) -> _Resolved:
    """`ratio(server("a_total"), server("b_total"))`: the ratio of two server counters' increases
    over the scope (PromQL's `increase(a[w]) / increase(b[w])`; judge/servermetrics.py
    `ServerRatio`). Two arguments, each a `server("...")`, two different families; a gauge that is
    already a ratio (`SERVER_RATIO_SUFFIXES`: kv_cache_usage_perc, cache_hit_rate) is refused,
    since a level has no increase to divide (a gauge or histogram only the server's exposition
    reveals is INCONCLUSIVE when judged)."""
    if expr.func != "ratio":
        ctx.error("E303", f"'{expr.func}' takes one argument; only ratio(...) takes two (of server counters)", expr.span,
                  f"e.g. {_RATIO_EXAMPLE}")
        raise Bad
    if len(expr.args) != 2:
        ctx.error("E305", f"ratio() of server metrics takes two arguments, a numerator and a denominator; it has {len(expr.args)}",
                  expr.span, f"e.g. {_RATIO_EXAMPLE}")
        raise Bad
    families = []
    for arg in expr.args:
        if not isinstance(arg, A.NamedRef):
            what = f"'{expr_text(arg)}' is not one of the server's own metrics"
            hint = (f"ratio({expr_text(arg)}) alone is the share of measured requests" if isinstance(arg, A.MetricRef) and arg.name in METRICS
                    and "ratio" in METRICS[arg.name].aggregates else f"write each as server(\"...\"), e.g. {_RATIO_EXAMPLE}")
            ctx.error("E305", f"ratio(a, b) divides two server counters' increases: {what}", arg.span, hint)
            raise Bad
        family = _server_family(ctx, arg)
        if family.endswith(SERVER_RATIO_SUFFIXES):
            ctx.error("E305", f"server metric '{family}' is a gauge that is already a ratio: it has no increase for ratio() to divide",
                      arg.span, f'gate it directly, e.g. mean(server("{family}")) >= ...; ratio(a, b) divides two counters (..._total)')
            raise Bad
        families.append(family)
    num, den = families
    if num == den:
        ctx.error("E305", f"ratio() divides '{num}' by itself: always 100% where it increased", expr.args[1].span,
                  "the denominator is another counter, e.g. the lookups the numerator's hits are out of")
        raise Bad
    return _Resolved("server", "ratio", None, None, Kind.RATIO, "performance", server=num, over=den)


_SLO_OPS = ("<", "<=", ">", ">=")


def _resolve_slo(ctx: Ctx, expr: A.SloCall) -> _Resolved:
    """`goodput(ttft < 500ms and tpot < 50ms)` (a ratio) or `goodput_rate(...)` (per second)."""
    if expr.func not in SLO_FUNCTIONS:
        ctx.error("E303", f"'{expr.func}' does not take conditions; goodput(...) and goodput_rate(...) do", expr.span,
                  suggest(expr.func, list(SLO_FUNCTIONS)))
        raise Bad
    conds: list[S.Slo] = []
    seen: set[tuple[str, str]] = set()
    for c in expr.conditions:
        slo = _slo_condition(ctx, c)
        if slo is None:
            continue
        if (slo.metric, slo.op) in seen:
            ctx.error("E305", f"'{slo.metric} {slo.op}' is written twice in one SLO set", c.span)
            continue
        seen.add((slo.metric, slo.op))
        conds.append(slo)
    failed = len(conds) != len(expr.conditions)
    agg = "ratio" if SLO_FUNCTIONS[expr.func] is Kind.RATIO else "rate"
    return _Resolved(GOODPUT, agg, None, None, SLO_FUNCTIONS[expr.func], "performance", failed=failed, slo=tuple(conds))


def _slo_condition(ctx: Ctx, c: A.Slo) -> S.Slo | None:
    """One condition of an SLO set: a per-request metric, an ordering, a threshold in its unit."""
    if c.metric not in SLO_METRICS:
        known = c.metric in METRICS
        why = "is not one value per request" if known else "is not a per-request metric"
        # another benchmark's name (vLLM's --goodput e2el:...) answered with the one that means it,
        # as a rule's metric is (`_metric_hint`), never a spelling neighbour's
        meant = METRIC_WORDS.get(c.metric.lower())
        hint = (f"{METRICS[meant].description.split(',')[0]} is '{meant}': write {meant} {c.op} {value_text(c.threshold)}"
                if meant in SLO_METRICS else suggest(c.metric, list(SLO_METRICS)))
        ctx.error("E302" if not known else "E305", f"'{c.metric}' {why}; an SLO condition names one of {', '.join(SLO_METRICS)}",
                  c.span, hint)
        return None
    if c.op not in _SLO_OPS:
        ctx.error("E305", f"an SLO condition is a bound: write {c.metric} < ..., <=, > or >=, not {c.op}", c.span)
        return None
    kind = METRICS[c.metric].kind
    text = f"{c.metric} {c.op} {value_text(c.threshold)}"
    try:
        if kind in _DIM_OF_KIND:
            value = quantity_value(ctx, text, c.threshold, _DIM_OF_KIND[kind])
        elif isinstance(c.threshold, A.Num):
            value = float(c.threshold.value)
        else:
            ctx.error("E305", f"'{c.metric}' is a plain number of tokens; write e.g. {c.metric} <= 512", c.threshold.span)
            return None
    except Bad:
        return None
    if value < 0 and c.metric not in _SIGNED:
        ctx.error("E204", f"'{text}': {c.metric} is never negative, so no request {'meets' if c.op in ('<', '<=') else 'misses'} "
                          f"a threshold below zero", c.threshold.span, "a threshold of zero or more")
        return None
    return S.Slo(c.metric, c.op, value, value_text(c.threshold))


def _aggregate(ctx: Ctx, expr: A.Expr) -> tuple[str | None, float | None, A.MetricRef]:
    """(function, percentile, metric) of `agg(metric)` or a bare metric."""
    if not isinstance(expr, A.Call):
        return None, None, expr
    if isinstance(expr.arg, A.SloCall):
        ctx.error("E305", f"{expr.arg.func}(...) is already a ratio (or a rate): compare it directly, e.g. {expr.arg.func}(...) >= 90%",
                  expr.span)
        raise Bad
    if not isinstance(expr.arg, (A.MetricRef, A.NamedRef)):
        ctx.error("E305", f"{expr.func}() takes a metric name, not another function", expr.arg.span)
        raise Bad
    agg = expr.func
    if agg in WRAPPERS:
        ctx.error("E305", f"{agg}() must be the outermost function", expr.span)
        raise Bad
    if re.fullmatch(r"p-?[0-9.]+", agg):
        percentile = parse_percentile(agg)
        if percentile is None:  # reported; the rest of the rule is still checked
            ctx.error("E304", f"percentile '{agg}' is outside (0, 100]; write p50, p95, p99 or p99.9", expr.span)
        return agg, percentile, expr.arg
    if agg not in AGGREGATES:
        options = list(AGGREGATES) + list(WRAPPERS) + ["p50", "p95", "p99"]
        meant = AGGREGATE_WORDS.get(agg.lower())
        why = " (the median is the 50th percentile)" if meant == "p50" else ""
        hint = f"write {meant}({expr_text(expr.arg)}){why}" if meant else suggest(agg, options)
        ctx.error("E303", f"unknown function '{agg}'", expr.span, hint)
        raise Bad
    return agg, None, expr.arg


def _metric_hint(metric: str, agg: str | None) -> str | None:
    """What an unknown metric's name means here: the catalogue's metric another tool's name
    stands for, written as the rule takes it (`request_throughput` -> mean(qps), and what the
    look-alike `throughput` is instead), else a spelling neighbour."""
    meant = METRIC_WORDS.get(metric.lower())
    if meant is None:
        return suggest(metric, list(METRICS) + list(EVIDENCE_PREDICATES))
    m = METRICS[meant]
    fits = m.bare_ok if agg is None else (agg in m.aggregates or ("p" in m.aggregates and agg.startswith("p")))
    form = (f"{agg}({meant})" if agg else meant) if fits else aggregate_examples(m).split(" or ")[0]
    hint = f"{m.description.split(',')[0]} is '{meant}': write {form}"
    neighbour = closest(metric, [n for n in METRICS if n != meant])
    if neighbour is not None:
        hint += f" ('{neighbour}' is {METRICS[neighbour].description.split(',')[0]})"
    return hint


_PREFERRED = ("p", "mean", "max", "min", "ratio", "rate")


def aggregate_examples(m) -> str:
    """How to aggregate a metric, only in forms the checker accepts: p99(ttft) or mean(ttft),
    mean(throughput) or max(throughput)."""
    forms = [f"{'p99' if a == 'p' else a}({m.name})" for a in _PREFERRED if a in m.aggregates]
    return " or ".join(forms[:2])


def _check_aggregate(ctx: Ctx, m, agg: str | None, percentile: float | None, expr: A.Expr, node: A.MetricRef) -> str:
    if agg is None:
        if not m.bare_ok:
            what = "a per-bucket series" if m.series else "a distribution"
            ctx.error("E305", f"'{m.name}' is {what}; aggregate it, e.g. {aggregate_examples(m)}", node.span)
            raise Bad
        return "count"
    if percentile is not None or agg.startswith("p"):
        if "p" not in m.aggregates:
            ctx.error("E305", f"a percentile does not apply to '{m.name}' ({m.description})", expr.span, f"write {aggregate_examples(m)}")
            raise Bad
    elif agg not in m.aggregates:
        hint = f"a ratio of two server counters takes both: {_RATIO_EXAMPLE}" if m.name == "server" and agg == "ratio" else f"write {aggregate_examples(m)}"
        ctx.error("E305", f"{agg}() does not apply to '{m.name}' ({m.description})", expr.span, hint)
        raise Bad
    return agg


def _threshold(ctx: Ctx, r: A.Rule, res: _Resolved, _names: set[str]) -> float | None:
    text = expr_text(r.expr)
    if r.op is None:
        if res.kind is not Kind.BOOL:
            ctx.error("E305", f"'{text}' needs a comparison, e.g. {text} <= ...", r.expr.span)
            raise Bad
        return None
    if res.kind is Kind.BOOL:
        ctx.error("E305", f"'{res.metric}' is a yes/no check; write just: {r.severity} {res.metric}", r.threshold.span)
        raise Bad
    if res.kind in _DIM_OF_KIND:
        return _possible(ctx, r, res, text, quantity_value(ctx, text, r.threshold, _DIM_OF_KIND[res.kind]))
    if res.server is not None and isinstance(r.threshold, A.Quantity) and (unit := UNITS.get(r.threshold.unit)):
        return quantity_value(ctx, text, r.threshold, unit[0])  # a server metric in its own unit: 2s, 90%
    if isinstance(r.threshold, A.Quantity):  # a plain number (count, tokens, tokens/s)
        ctx.error("E305", f"'{text}' is a plain number; {value_text(r.threshold)} has a unit", r.threshold.span, _count_hint(res, r))
        raise Bad
    if not isinstance(r.threshold, A.Num):
        ctx.error("E104", f"the threshold must be a number, not {describe(r.threshold)}", r.threshold.span)
        raise Bad
    return _possible(ctx, r, res, text, float(r.threshold.value))


# Metrics whose values are never negative (everything but the open loop's schedule lag, which
# a request sent ahead of its time makes negative, and a server's own metric, whose range is
# the server's): a rule comparing one with a negative threshold is decided before it runs.
_SIGNED = frozenset({"schedule_lag", "server"})
_NO_SHARE_LIMIT = frozenset({"cpu"})  # 100 % = one core: a process tree may use several


def _possible(ctx: Ctx, r: A.Rule, res: _Resolved, text: str, value: float) -> float:
    """`value`, when the rule's comparison can go either way: E204 for a threshold the metric's
    values can never reach -- below zero for a metric that is never negative (`p95(ttft) < -1s`
    never holds, `> -1s` always does), a share beyond 100 % (`ratio(failed) < 150%`), a count
    equal or unequal to a fraction (`failed == 0.5`). A drift or slope is a signed change:
    not limited."""
    if res.wrapper is not None or res.server is not None:
        return value
    if value < 0 and res.metric not in _SIGNED:
        what = "a share" if res.kind is Kind.RATIO else "a count" if res.kind is Kind.COUNT else f"'{res.metric}'"
        ctx.error("E204", f"'{text} {r.op} {value_text(r.threshold)}' compares {what}, which is never negative, with a "
                          f"threshold below zero: it {'never' if r.op in ('<', '<=', '==') else 'always'} holds",
                  r.threshold.span, "a threshold of zero or more")
        raise Bad
    if res.kind is Kind.RATIO and value > 1.0 and res.metric not in _NO_SHARE_LIMIT:
        ctx.error("E204", f"'{text} {r.op} {value_text(r.threshold)}' compares a share, which is at most 100%, with "
                          f"{value_text(r.threshold)}: it {'never' if r.op in ('>', '>=', '==') else 'always'} holds",
                  r.threshold.span, "a share between 0% and 100%")
        raise Bad
    if res.kind is Kind.COUNT and r.op in ("==", "!=") and value != int(value):
        ctx.error("E204", f"'{text} {r.op} {value_text(r.threshold)}': a count is a whole number, so it "
                          f"{'never' if r.op == '==' else 'always'} holds", r.threshold.span,
                  f"a whole number, e.g. {text} {r.op} {int(value)}")
        raise Bad
    return value


def _count_hint(res: _Resolved, r: A.Rule) -> str | None:
    """A count compared with a ratio or a rate: say which function gives one."""
    unit = UNITS.get(r.threshold.unit)
    func = {Dimension.RATIO: "ratio", Dimension.RATE: "rate"}.get(unit[0]) if unit else None
    if func is None or res.agg != "count" or func not in METRICS[res.metric].aggregates:
        return None
    what = "the share of measured requests" if func == "ratio" else "requests per second"
    return f"for {what}, write {func}({res.metric}) {r.op} {value_text(r.threshold)}"


def _scope(ctx: Ctx, r: A.Rule, res: _Resolved, _names: set[str]) -> tuple[str, float | None]:
    scope, window = ("level" if res.wrapper else "backend"), None
    if r.scope is not None:
        scope = r.scope.kind
        if scope not in SCOPES:
            msg = f"unknown scope 'per {scope}' (use per run, backend, level, phase, turn, bucket or window <duration>)"
            ctx.error("E306", msg, r.scope.span, suggest(scope, SCOPES))
            raise Bad
        if scope == "window":
            if r.scope.length is None:
                ctx.error("E103", "'per window' needs a length, e.g. per window 30s", r.scope.span)
                raise Bad
            window = quantity_value(ctx, "window", r.scope.length, Dimension.DURATION)
            if window <= 0:
                ctx.error("E204", f"a window must be longer than zero, not {value_text(r.scope.length)}", r.scope.length.span,
                          "e.g. per window 30s")
                raise Bad
        elif r.scope.length is not None:
            ctx.error("E305", "only 'per window' takes a length", r.scope.length.span)
            raise Bad
    if scope == "turn" and (why := _not_per_turn(res)) is not None:
        ctx.error("E305", f"per turn judges the requests of each user turn of a multi-turn level: {why}",
                  r.scope.span if r.scope else r.span, "e.g. require p95(ttft) < 2s per turn, or ratio(failed) == 0 per turn")
        raise Bad
    if res.wrapper is not None and scope not in ("level", "backend", "phase"):
        ctx.error("E305", f"{res.wrapper}() compares buckets over time; use per level or per backend", r.scope.span if r.scope else r.span)
        raise Bad
    return scope, window


def _not_per_turn(res: _Resolved) -> str | None:
    """Why a rule cannot be judged per turn (None: it can). A turn's requests are spread over
    its level's whole time, interleaved with the other turns': what they measure -- their
    distributions, outcome counts and shares -- is theirs; a rate over time, a per-bucket
    series (qps, throughput, memory, the server's metrics) and the evidence checks are the
    level's, not a turn's."""
    if res.klass != "performance":
        return f"'{res.metric}' is an evidence check of the run"
    if res.slo:
        return "goodput() is judged per level or bucket"
    if res.wrapper is not None:
        return None  # drift() and slope(): refused below, as for any scope but level and backend
    m = METRICS.get(res.metric)
    if res.server is not None or m is None or m.series:
        return f"'{res.metric if res.server is None else 'server(' + repr(res.server) + ')'}' is a series of the level's buckets, not a measure of requests"
    if res.agg == "rate":
        return "rate() is per second of a scope's time, and a turn's requests share their level's time with the others'"
    return None


def _target(ctx: Ctx, r: A.Rule, _res: _Resolved, backend_names: set[str]) -> str | None:
    if r.target is None:
        return None
    target = r.target.value
    if target not in backend_names:
        msg = f"rule names backend '{target}', which the spec does not declare"
        ctx.error("E301", msg, r.target.span, suggest(target, backend_names))
        raise Bad
    return target


# Scopes that only some workloads have instances of: (whether a workload has them, what the
# scope judges and what no workload has, the hint)
_SCOPE_NEEDS = {
    "phase": (lambda w: bool(w.load.phases), "each named phase of a workload's load, and no workload has phases",
              "add load { phases { NAME { duration = ...  ... } } } to a workload, or scope the rule per level"),
    "turn": (lambda w: w.multi_turn, "each user turn of a multi-turn chat level, and no workload has multi_turn = true",
             "add multi_turn = true (endpoint = chat, a conversation file) to a workload, or scope the rule per level"),
}


def check_scope_rules(ctx: Ctx, g: S.Gate, workloads: list[S.Workload]) -> None:
    """A `per phase` rule needs a workload with phases, a `per turn` rule a multi-turn one:
    without one no run could judge it (E403)."""
    for scope, (has, what, hint) in _SCOPE_NEEDS.items():
        if any(has(w) for w in workloads):
            continue
        for r in g.rules:
            if r.scope == scope:
                ctx.error("E403", f"'per {scope}' judges {what}", r.span, hint)


MAX_WINDOWS_PER_LEVEL = 10_000  # as buckets (workload.MAX_BUCKETS_PER_LEVEL): the judge lists every window of a level


def _level_lengths(w: S.Workload) -> tuple[float, ...]:
    """The measured length of each of a workload's levels (a phase is a level of its own)."""
    return tuple(p.duration_s for p in w.load.phases) or (w.duration_s,)


def check_window_rules(ctx: Ctx, g: S.Gate, workloads: list[S.Workload]) -> None:
    """`per window D` against the levels it cuts: the runner evaluates an abort rule on each window
    that has *ended* within a level, so a window longer than every level of a workload never ends
    and the abort could never fire in it (E401, as a bucket longer than the duration); and a window so short that a level
    has more than MAX_WINDOWS_PER_LEVEL of them is refused as such buckets are (E204)."""
    for rule, abort in [(r, False) for r in g.rules] + [(r, True) for r in g.aborts]:
        if rule.scope != "window" or not rule.window_s:
            continue
        for w in workloads:
            longest = max(_level_lengths(w))
            if abort and rule.window_s > longest + 1e-9:
                ctx.error("E401", f"window ({rule.window_s:g}s) is longer than every level of workload '{w.name}' ({longest:g}s): "
                                  "no window would ever end, so the abort rule would never fire", rule.span,
                          "use a window at most as long as the level, or per bucket")
                break
            if longest / rule.window_s > MAX_WINDOWS_PER_LEVEL:
                n = math.ceil(longest / rule.window_s - 1e-9)
                ctx.error("E204", f"window ({rule.window_s:g}s) cuts a level of workload '{w.name}' into {n} windows; "
                                  f"at most {MAX_WINDOWS_PER_LEVEL} are allowed", rule.span, "use a longer window, or per bucket")
                break


# ------------------------------------------------------------------ W509: too few planned samples
#
# A percentile rule needs min_samples_for_percentile(q, confidence) samples in each instance of
# its scope (lang/samples.py; the judge's rule, judge/stats.py) before it can PASS. `check` warns
# before anything runs when the plan cannot give them: requests per bucket (window, level) are
# rate x length in open loop, concurrency x length / the expected latency in a closed loop, and
# a batch's requests every ceil(requests / concurrency) latencies -- the workload's
# `expected_latency`, else a simulator backend's own ttft + itl x (max_tokens - 1); a phase is a
# level of its own duration, its buckets counted at its lowest load (`_planned`). Without a
# latency (a real server, no hint) a closed loop is not estimated, nor is a replay. `itl` counts
# requests, as the judge does: one request's gaps are not independent draws. A `pNN(x) > T` rule
# needs the samples of the (100-NN)-th percentile (the samples below T decide it). `per turn`
# takes a level's requests in the share of a multi-turn session's user turns that are its
# deepest turn (`_deepest_turn`): the turn with fewest requests, one long conversation among
# short ones being the usual reason a per-turn rule cannot conclude. `per backend` (the default)
# and `per run` pool every level of every workload (and backend): warned about only when every
# level's count is estimated (`_pooled_fewest`).

SIM_DEFAULTS = {name: _SIM_OPTIONS[name].default for name in ("ttft", "itl")}
PER_REQUEST_PERCENTILES = frozenset(SLO_METRICS)  # one value per request: the same names an SLO condition takes


def _sim_latency(bk: S.Backend, max_tokens: float) -> float | None:
    if bk.kind != "sim":
        return None
    opts = dict(bk.sim)
    if opts.get("zero_latency"):
        return None
    ttft = float(opts.get("ttft", SIM_DEFAULTS["ttft"]))  # type: ignore[arg-type]
    itl = float(opts.get("itl", SIM_DEFAULTS["itl"]))  # type: ignore[arg-type]
    return ttft + itl * max(0.0, max_tokens - 1)


class Planned(NamedTuple):
    """One load level's planned requests in one instance of a rule's scope (`_planned`)."""

    label: str  # the level: "20 rps", "concurrency 8, 100 requests", "phase burst"
    n: float
    by_count: bool = False  # its `requests_per_level`, not its rate × length, is what it plans


def _planned(w: S.Workload, bk: S.Backend, scope: str, window_s: float | None) -> list[Planned]:
    """(level label, expected requests in one instance of `scope`) for each load level of `w`
    on `bk`: requests a second at the level's load -- an open loop's rate; a closed loop's
    workers over the expected latency; batches of `requests` from c workers, a batch every
    ceil(requests / c) latencies -- times the instance's length (a batch level's own: the
    requests its waves start in it, `lang/batches.py`, the count `plan` expects), and never more
    than a level's `requests_per_level` (it measures N requests, its duration only bounds it; the
    label then names the count, and `by_count` says so). A phase is a level of its own
    duration: over the level at its mean load, and in a bucket or window at its lowest (the
    first or last bucket of a linear ramp: the ramp's low end plus half a bucket's climb). A
    replay's arrivals are its trace's: not estimated."""
    tokens = sum(w.max_tokens) / len(w.max_tokens) if w.max_tokens else 64.0
    load = w.load
    if load.replay is not None:
        return []
    latency = w.expected_latency_s or _sim_latency(bk, tokens)

    piece = (window_s or w.bucket_s) if scope == "window" else w.bucket_s
    out: list[Planned] = []
    if load.phases:
        for ph in load.phases:
            end = ph.end if ph.end is not None else ph.start
            lo, hi = min(ph.start, end), max(ph.start, end)
            if scope == "level":
                x, length = (ph.start + end) / 2, ph.duration_s
            else:
                length = min(piece, ph.duration_s)
                ramp = ph.end is not None and not ph.steps and ph.duration_s > 0
                x = lo + (hi - lo) * length / ph.duration_s / 2 if ramp else lo
            rate = requests_per_second(load, x, latency)
            if rate is not None:
                out.append(Planned(f"phase {ph.name}", rate * length))
        return out
    length = w.duration_s if scope == "level" else piece
    count = load.requests_per_level  # a counted level measures at most N, whatever its duration bound allows
    for x in load.levels:
        rate = requests_per_second(load, x, latency)
        if rate is None:
            continue
        unit = f"{x:g} rps" if load.mode == "open" else f"concurrency {x:g}"
        if load.mode == "batch" and scope == "level" and latency:  # the waves in the level, as `plan` counts them
            n = batch_requests(int(x), int(load.requests or x), latency, w.warmup_s, w.warmup_s + w.duration_s)
            out.append(Planned(unit, float(n)))
        elif count is not None and count < rate * length:  # the level's count -- or its min_duration's requests
            n = min(rate * length, rate * windows.counted_span(w.duration_s, rate, count, load.min_duration_s))
            least = f", at least {format_duration(load.min_duration_s)}" if load.min_duration_s else ""
            out.append(Planned(f"{unit}, {count} requests{least}", n, by_count=True))
        else:
            out.append(Planned(unit, rate * length))
    return out


_SCOPE_WORDS = {"bucket": "per bucket", "window": "per window", "level": "per level", "turn": "per turn",
                "backend": "per backend", "run": "per run"}


# a percentile rule over too few samples: the judge FAILs it once enough of them violate the
# threshold to be sure (early stopping), so "can only be INCONCLUSIVE" would mislead
_NEVER_PASSES = "the rule can never PASS (at best INCONCLUSIVE; it FAILs where enough samples violate the threshold to be sure)"
_W509_HINT = "raise the rate or concurrency, lengthen the bucket or level, or use a lower percentile"
_W509_COUNT_HINT = "raise requests_per_level of {whose} (each level measures that many requests), or use a lower percentile"
_W509_SHARE_HINT = ("a share of X% with none missing needs more requests the nearer X is to 100%: raise the rate or "
                    "concurrency, lengthen the bucket or level, or claim a lower share")
_W509_SHARE_COUNT_HINT = ("raise requests_per_level of {whose} (each level measures that many requests), or claim a lower "
                          "share (a share of X% with none missing needs more requests the nearer X is to 100%)")
_W509_TURN_HINT = ("a conversation's deepest turns are sent least: lengthen the level, use conversations of similar lengths, "
                   "or judge a lower percentile")


def _deepest_turn(w: S.Workload) -> tuple[str, float] | None:
    """A multi-turn workload's turns with the fewest requests ("turn 4", "turns 2-4": the
    deepest, and those before it that as few conversations reach) and the share of its
    sessions' requests that each of them is (a session sends each user turn of a conversation
    in turn, the file's conversations one after another), or None: not multi-turn, or its
    prompt file not read."""
    convs = w.dataset.conversations if w.multi_turn and w.dataset is not None else ()
    turns = [n for c in convs if (n := sum(1 for role, _ in c if role == "user"))]
    if not turns:
        return None
    deepest = max(turns)
    reach = turns.count(deepest)  # conversations that reach the deepest turn
    first = max((n for n in turns if n < deepest), default=0) + 1  # the first turn only they reach
    return (f"turn {deepest}" if first == deepest else f"turns {first}-{deepest}"), reach / sum(turns)


class Fewest(NamedTuple):
    """The scope instance a W509 warning is about: its planned requests, where it is, and the
    workloads whose `requests_per_level` bounds what it plans (the count hint names them; none:
    the rate, concurrency or length does)."""

    n: float
    where: str
    counted: tuple[str, ...] = ()


def _pooled_fewest(workloads, backends: list[S.Backend], scope: str, need: int) -> Fewest | None:
    """A `per backend` (the default) or `per run` rule pools every level of every workload (of
    every backend, per run): the planned requests, where, and the workloads whose count bounds
    a level of the pool, when fewer than `need` -- the backend with the fewest for `per backend`;
    None when enough, or when a level's count is not estimated (a replay, a closed loop without a
    latency): the total could be any size."""
    totals: list[Fewest] = []
    for bk in backends:
        total, counted = 0.0, []
        for w in workloads:
            load = w.load
            got = _planned(w, bk, "level", None)
            if load.replay is not None or len(got) != (len(load.phases) if load.phases else len(load.levels)):
                return None
            total += sum(p.n for p in got)
            counted += [w.name] if any(p.by_count for p in got) else []
        totals.append(Fewest(total, f"every level of every workload on backend '{bk.name}'", tuple(counted)))
    if not totals:
        return None
    if scope == "run":
        total = sum(f.n for f in totals)
        counted = tuple(dict.fromkeys(name for f in totals for name in f.counted))
        return Fewest(total, "every level of every workload and backend", counted) if total < need else None
    low = min(totals, key=lambda f: (f.n, f.where))
    return low if low.n < need else None


def _sample_need(rule: S.Rule, g: S.Gate) -> tuple[int, str] | None:
    """(the samples the rule's claim needs per scope instance, their unit), as the judge asks
    for them; None for a rule W509 does not estimate. A percentile of a per-request metric (or
    itl, counted in requests): `min_samples_for_percentile`; a goodput share (`goodput(...) >=
    99%`): `min_samples_for_share`, the judge's `goodput.share` -- the misses are the overages
    of the 99th percentile, so 299 requests at 95% with none missing the SLO."""
    q = rule.expr.percentile
    metric = rule.expr.metric
    if metric == GOODPUT and rule.expr.agg == "ratio" and rule.op is not None and rule.threshold is not None:
        need = min_samples_for_share(rule.op, rule.threshold, g.confidence, g.min_samples)
        return (need, "requests") if need is not None else None
    if q is None or (metric not in PER_REQUEST_PERCENTILES and metric != "itl"):
        return None
    # `pNN(x) > T` is decided by the samples below T: the (100-NN)-th percentile's sample size
    # (the judge's `performance._claim_tail`)
    tail = 100.0 - q if rule.op in (">", ">=") and q < 100 else q
    return max(min_samples_for_percentile(tail, g.confidence), g.min_samples), "requests" if metric == "itl" else "samples"


SHORT_COUNT_RISK = 0.01  # W509 of random arrivals: warn where some scope instance falls short with this probability


def _random_count_warning(ctx: Ctx, rule: S.Rule, g: S.Gate, workloads, bk: S.Backend | None, need: int, unit: str) -> None:
    """W509 for a rule whose scope plans enough samples on average but whose open loop's Poisson
    (or gamma) arrivals put a random count in each instance: a bucket expecting 60 at p95's 59
    holds fewer than 59 with probability 0.4, and the rule is INCONCLUSIVE in it however the
    server did -- while `check` said "ok" (3 of 4 buckets of a 4 s run short). Warned where some
    bucket (window, level) of the rule's workloads falls short with probability SHORT_COUNT_RISK
    or more; the seed then fixes which. Constant arrivals, a closed loop and a level's exact
    `requests_per_level` count do not vary: not warned here. Backends share the schedule, so a
    workload's levels are counted once."""
    if bk is None:
        return
    none_short, worst = 1.0, None
    for w in workloads:
        load = w.load
        if load.mode != "open" or load.arrival != "poisson" or load.phases or load.replay is not None or load.search is not None:
            continue
        piece = (rule.window_s or w.bucket_s) if rule.scope == "window" else w.bucket_s
        for rate, (label, mean, _) in zip(load.levels, _planned(w, bk, rule.scope, rule.window_s)):
            # the count: exact (with min_duration the count is a floor and the minimum's arrivals vary)
            if load.requests_per_level is not None and mean >= load.requests_per_level and not load.min_duration_s:
                continue
            if rule.scope == "level":
                k = 1
            else:
                span = windows.counted_span(w.duration_s, rate, load.requests_per_level, load.min_duration_s)
                k = max(1, math.floor(span / piece + 1e-9))
            p = arrival_count_at_most(need - 1, mean, load.burstiness)
            none_short *= (1.0 - p) ** k
            if worst is None or p > worst[0]:
                worst = (p, mean, arrival_count_sd(mean, load.burstiness), f"workload '{w.name}' at {label}", load.burstiness)
    risk = 1.0 - none_short
    if worst is None or risk < SHORT_COUNT_RISK:
        return
    _, mean, sd, where, b = worst
    what = _SCOPE_WORDS[rule.scope]
    arrivals = "Poisson" if b == 1.0 else f"gamma (burstiness {b:g})"
    ctx.warn("W509", f"{rule.expr.text} {what} needs {need} {unit} at {g.confidence * 100:g}% confidence; about {mean:.0f} "
                     f"{what} are planned ({where}), but {arrivals} arrivals vary (±{sd:.2g} a {rule.scope}): some {rule.scope} "
                     f"falls short with probability {risk:.0%}, and there {_NEVER_PASSES}", rule.span,
             f"raise the rate or lengthen the {rule.scope} (to expect well over {need}), use arrival = constant (its count "
             "does not vary), or use a lower percentile")


def planned_sample_warnings(ctx: Ctx, g: S.Gate, workloads, backends: Mapping[str, S.Backend]) -> None:
    """W509 for each percentile rule, or goodput share rule, whose scope the plan cannot fill
    (see above): the planned requests of its fewest-filled scope instance -- never more than a
    level's `requests_per_level` (`_planned`) -- below what its claim needs (`_sample_need`)."""
    for rule in g.rules:
        if rule.scope not in ("bucket", "window", "level", "turn", "backend", "run") or rule.expr.wrapper is not None:
            continue
        wanted = _sample_need(rule, g)
        if wanted is None:
            continue
        need, unit = wanted
        fewest: Fewest | None = None
        targets = [backends[rule.backend]] if rule.backend in backends else list(backends.values())
        if rule.scope in ("backend", "run"):
            fewest = _pooled_fewest(workloads, targets, rule.scope, need)
        for w in workloads if rule.scope not in ("backend", "run") else ():
            turn = _deepest_turn(w) if rule.scope == "turn" else None
            if rule.scope == "turn" and turn is None:
                continue
            for bk in targets:
                for label, n, by_count in _planned(w, bk, "level" if turn else rule.scope, rule.window_s):
                    if turn is not None:
                        n, label = n * turn[1], f"{label}, {turn[0]}"
                    if n < need and (fewest is None or n < fewest.n):
                        fewest = Fewest(n, f"workload '{w.name}' at {label}" + (f" on backend '{bk.name}'" if len(targets) > 1 else ""),
                                        (w.name,) if by_count else ())
        if fewest is None and rule.scope in ("bucket", "window", "level") and rule.expr.metric != GOODPUT:
            _random_count_warning(ctx, rule, g, workloads, targets[0] if targets else None, need, unit)
            continue
        if fewest is not None:
            _warn_few(ctx, rule, g, need, unit, fewest)


def _warn_few(ctx: Ctx, rule: S.Rule, g: S.Gate, need: int, unit: str, fewest: Fewest) -> None:
    """W509 for a percentile rule, or a goodput share rule, over `fewest`: what the claim needs,
    what is planned and where, and a hint for that scope instance -- raise the `requests_per_level`
    of the workloads whose count bounds it (named), else the rate, concurrency or length."""
    what = _SCOPE_WORDS[rule.scope]
    whose = "workload" + ("s " if len(fewest.counted) > 1 else " ") + ", ".join(f"'{name}'" for name in fewest.counted)
    conf = f"{g.confidence * 100:g}% confidence"
    if rule.expr.metric == GOODPUT:
        side = "missing" if rule.op in (">", ">=") else "meeting"
        claim = f"{rule.expr.text} {rule.op} {rule.threshold_text} {what} needs {need} {unit} at {conf}, none of them {side} the SLO"
        outcome = "the share can never PASS, at best INCONCLUSIVE"
        hint = _W509_SHARE_COUNT_HINT.format(whose=whose) if fewest.counted else _W509_SHARE_HINT
    else:
        claim = f"{rule.expr.text} {what} needs {need} {unit} at {conf}"
        outcome = _NEVER_PASSES
        hint = (_W509_TURN_HINT if rule.scope == "turn" else
                _W509_COUNT_HINT.format(whose=whose) if fewest.counted else _W509_HINT)  # fmt: skip
    ctx.warn("W509", f"{claim}; about {fewest.n:.0f} {what} are planned ({fewest.where}): {outcome}", rule.span, hint)
