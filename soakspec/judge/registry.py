"""The judge's one table: every predicate and metric it can judge, its class and its function.

`RULES` lists, in the order built-in checks are judged:
  - validity and evidence predicates with `check(run, spec_rule) -> RuleResult`
    (`spec_rule` is None when the judge runs the check on its own, `builtin`);
  - performance metrics with `measure`, the metric's implementation (`soakspec.judge.measures`),
    which `soakspec.judge.performance.judge` applies over each scope instance.

Every name a spec may write (`in_spec`) is declared in the catalogue, `soakspec.lang.metrics`
(`METRICS`: performance; `EVIDENCE_PREDICATES`: validity and evidence), and every name the
catalogue declares is here: tests/test_judge_registry.py fails otherwise. `abort_fired`,
`full_scale_run`, `min_samples` and `client_healthy` are the judge's own (never written in a spec); `abort_fired`
gives a result only for a run whose manifest records a fired abort rule.

To add a metric: declare it in the catalogue, write (or reuse) an implementation in
`measures.py`, and add its row here. To add an evidence check: declare it in the catalogue's
`EVIDENCE_PREDICATES`, write `check(run, rule)` in `evidence_rules.py`, add its row here.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any, Literal

from soakspec.judge import evidence_rules as E
from soakspec.judge import goodput as G
from soakspec.judge import measures as M
from soakspec.judge import servermetrics as SM
from soakspec.judge import validity as V
from soakspec.judge.joined import JudgedRun
from soakspec.judge.verdict import RuleResult

RuleClass = Literal["validity", "evidence", "performance"]
Check = Callable[[JudgedRun, Any], "RuleResult | None"]  # (run, the spec's Rule, or None for a built-in)


@dataclasses.dataclass(frozen=True)
class Entry:
    name: str
    klass: RuleClass
    check: Check | None = None  # validity and evidence
    measure: M.MetricImpl | None = None  # performance
    builtin: bool = False  # judged on every run; a `require` rule of the same name replaces it
    in_spec: bool = True  # a name a spec may write (declared in the catalogue)
    bind: Callable[[Any], M.MetricImpl] | None = None  # per rule expression: server("family")


def _check(name: str, klass: RuleClass, fn: Check, *, builtin: bool = False, in_spec: bool = True) -> Entry:
    return Entry(name, klass, check=fn, builtin=builtin, in_spec=in_spec)


def _metric(name: str, impl: M.MetricImpl) -> Entry:
    return Entry(name, "performance", measure=impl)


RULES: tuple[Entry, ...] = (
    # validity -- built in, always judged
    _check("completed_run", "validity", V.completed_run, builtin=True),
    _check("abort_fired", "validity", V.abort_fired, builtin=True, in_spec=False),  # only when one fired
    _check("full_scale_run", "validity", V.full_scale_run, builtin=True, in_spec=False),
    _check("min_samples", "validity", V.min_samples, builtin=True, in_spec=False),
    # the load generator kept up (client.jsonl + the records); the gate's client_* settings
    _check("client_healthy", "validity", V.client_healthy, builtin=True, in_spec=False),
    # evidence
    _check("artifacts_verified", "evidence", E.artifacts_verified, builtin=True),
    _check("bucket_coverage", "evidence", E.bucket_coverage),
    _check("duration_coverage", "evidence", E.duration_coverage),
    _check("trace_coverage", "evidence", E.trace_coverage),
    _check("follow_up", "evidence", E.follow_up),
    _check("provenance_consistent", "evidence", E.provenance_consistent),
    _check("runtime_boundary_specific", "evidence", E.runtime_boundary_specific),
    # built in where a backend declares metrics {}: no scrape of its /metrics failed
    _check("metrics_scraped", "evidence", SM.metrics_scraped, builtin=True),
    # performance: per-request distributions
    _metric("ttft", M.PerRequest(M.ttft, when_timed_out=M.ttft, untimed_low=M.first_byte_wait, excluded_as="ttft")),
    _metric("itl", M.PerToken(M.itl_gaps, excluded_as="itl")),
    _metric("coalesced", M.GapShare()),  # share of the ITL gaps that are not independent samples
    _metric("tpot", M.PerRequest(M.measured_tpot(), when_stalled=M.zero, excluded_as="tpot")),
    _metric("latency", M.PerRequest(M.latency, when_timed_out=M.unmeasured)),
    # from the send, after any wait for a slot under max_concurrency (bench serve's TTFT, E2EL)
    _metric("sent_ttft", M.PerRequest(M.sent_ttft, when_timed_out=M.sent_ttft, untimed_low=M.sent_first_byte_wait,
                                      elapsed=M.sent_latency, excluded_as="sent_ttft")),
    _metric("sent_latency", M.PerRequest(M.sent_latency, when_timed_out=M.unmeasured, elapsed=M.sent_latency,
                                         excluded_as="sent_latency")),
    _metric("schedule_lag", M.PerRequest(M.schedule_lag)),
    _metric("output_tokens", M.PerRequest(M.counted("output_tokens"))),
    _metric("prompt_tokens", M.PerRequest(M.field("prompt_tokens"))),
    # performance: outcome counts (a noun marks a failure class)
    _metric("requests", M.Outcome(M.any_request)),
    _metric("completed", M.Outcome(M.outcome_is("completed"))),
    _metric("failed", M.Outcome(M.outcome_is("failed"), noun="failed request")),
    _metric("timeouts", M.Outcome(M.outcome_is("timeout"), noun="timed-out request")),
    _metric("rejected", M.Outcome(M.outcome_is("rejected"), noun="rejected request")),
    _metric("disconnected", M.Outcome(M.outcome_is("disconnected"), noun="disconnected request")),
    _metric("errors", M.Outcome(M.not_completed, noun="unsuccessful request")),
    # completed requests whose usage contradicts their stream (`rederive`)
    _metric("usage_mismatch", M.Outcome(M.usage_mismatched, noun="usage-mismatched request")),
    _metric("empty_text", M.Outcome(M.empty_text, noun="empty-text completion")),
    # performance: SLO attainment -- judged with the rule's SLO set (`goodput.judge`), so a check
    # rather than a bare measure; `goodput(...)` and `goodput_rate(...)` both resolve to it
    Entry("goodput", "performance", check=G.judge),
    # performance: per-bucket and per-sample series
    _metric("throughput", M.PerBucket(M.throughput)),
    # prompt + output tokens/s; a bucket with a request of no prompt count leaves its scope unjudged
    _metric("total_throughput", M.WholePerBucket(M.total_throughput, why="delivered a request with no prompt token count")),
    _metric("qps", M.PerBucket(M.qps)),
    _metric("in_flight", M.PerBucket(M.bucket_in_flight)),
    _metric("rss", M.PerSample(M.rss)),
    _metric("gpu_memory", M.PerSample(M.gpu_sum("process_memory_used"))),
    _metric("gpu_memory_device", M.PerSample(M.gpu_sum("memory_used"))),
    _metric("cpu", M.PerSample(lambda s: v / 100.0 if (v := M.num(s.get("server_cpu_percent"))) is not None else None)),
    # the server's own Prometheus metrics: server("family"), bound per rule (judge/servermetrics.py)
    Entry("server", "performance", measure=SM.ServerMetric(None), bind=SM.bind),
)

BY_NAME: Mapping[str, Entry] = {e.name: e for e in RULES}

def less_lag(metric: str, gain: M.Columnar) -> M.MetricImpl:
    """The judge's own figure of `metric` (ttft, latency) less the load generator's own
    lateness, `gain` per request (`performance.lag_figure`: at a level under max_concurrency
    the send less the admit of the slot queue replayed on time, `judge/capreplay.py`): never
    written in a spec (no rule names it, so it is not in RULES or the catalogue). It counts the
    same requests, timed-out and untimed ones alike, as the figure it stands beside."""
    ttft, latency = M.less_gain(M.ttft, gain), M.less_gain(M.latency, gain)
    if metric == "ttft":
        return M.PerRequest(ttft, when_timed_out=ttft, untimed_low=M.less_gain(M.first_byte_wait, gain), elapsed=latency,
                            excluded_as="ttft")
    return M.PerRequest(latency, when_timed_out=M.unmeasured, elapsed=latency)


def metric(name: str) -> M.MetricImpl:
    """The implementation of performance metric `name` (KeyError: no such metric)."""
    impl = BY_NAME[name].measure
    if impl is None:
        raise KeyError(f"{name} is not a performance metric")
    return impl


def impl_for(expr: Any) -> M.MetricImpl:
    """The implementation of a rule expression's metric (`spec.Expr`): the registry's, bound
    to the expression where the metric needs more than its name (server("family"))."""
    e = BY_NAME[expr.metric]
    if e.bind is not None:
        return e.bind(expr)
    return metric(expr.metric)


def builtins(klass: RuleClass) -> tuple[Entry, ...]:
    return tuple(e for e in RULES if e.klass == klass and e.builtin)
