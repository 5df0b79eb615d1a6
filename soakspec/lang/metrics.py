"""The metric catalogue: what a gate rule can name, what it aggregates to, and its unit.

Shared by the checker (types and units of thresholds) and the judge (how to compute).

Per-request distributions (aggregate with min, max, mean or pNN):
  ttft, itl, tpot, latency, sent_ttft, sent_latency, schedule_lag   (durations),
  output_tokens, prompt_tokens (counts)
  ttft and latency run from the intended start (an open loop's arrival: a wait for a slot under
  max_concurrency is counted, as the user waited it); sent_ttft and sent_latency from the send
  (`start`, after that wait): the server's own view, what vLLM's bench serve and SGLang's
  bench_serving call TTFT and E2EL. Named for where their clock starts, not "service_*": they
  include the server's own queue and the network, which a service time would not. Equal to
  ttft and latency for a closed loop (no intended start apart from the send).
The share of ITL gaps that are not independent samples (tokens that shared a read, or one
chunk's gap split over its tokens): ratio(coalesced).
Outcome counts (bare name = count over the scope; ratio() = share of measured requests;
rate() = per second of the scope's wall time):
  requests, completed, failed, timeouts, rejected, disconnected, errors, usage_mismatch (completed
  requests whose usage contradicts their token events; they give no ITL/TPOT), empty_text (completed
  requests whose tokens decoded to no text)
Per-bucket series (aggregate with min, max or mean over the scope's buckets):
  throughput (output tokens/s), total_throughput (prompt + output tokens/s; no value for a
  bucket where a request's prompt count is unknown), qps (completed requests/s) -- each what the server delivered:
  the requests that completed in the bucket, wherever they started (judge/measures.py
  `delivered`) --, gpu_memory (bytes used by the
  server's own processes), gpu_memory_device, rss (server process tree), in_flight (mean
  requests in flight)
  cpu (server process-tree CPU per telemetry sample, a ratio of one core: 250% = 2.5 cores)
The server's own Prometheus metrics (its `/metrics`, scraped during the run; `metrics {}` of a
backend): server("family"), e.g. max(server("vllm:num_requests_waiting")). A counter gives
per-bucket rates (mean/min/max; bare = its increase over the scope, rate() = per second), a
gauge its samples (mean/min/max/pNN), a histogram its per-bucket mean observation (mean/min/max)
and quantile estimates (pNN, interpolated within the histogram's buckets). Values are in the
server's own units (seconds, fractions); several label sets of one family are summed.
Evidence checks (yes/no, except trace_coverage which is a ratio per bucket):
  bucket_coverage, duration_coverage, trace_coverage, follow_up, provenance_consistent,
  runtime_boundary_specific, artifacts_verified, completed_run, metrics_scraped
"""

from __future__ import annotations

import dataclasses
import enum
import re


class Kind(enum.Enum):
    DURATION = "duration"
    SIZE = "size"
    RATIO = "ratio"
    RATE = "rate"
    COUNT = "count"
    NUMBER = "number"
    BOOL = "bool"


DIST = ("min", "max", "mean", "p")
SERIES = ("min", "max", "mean")


@dataclasses.dataclass(frozen=True)
class Metric:
    name: str
    kind: Kind
    aggregates: tuple[str, ...]
    description: str
    outcome: bool = False  # an outcome class counted over requests
    bare_ok: bool = False
    series: bool = False  # a per-bucket value rather than a per-request one
    validity: bool = False

    def result_kind(self, agg: str | None) -> Kind:
        if agg == "ratio":
            return Kind.RATIO
        if agg == "rate":
            return Kind.RATE
        if agg == "count":
            return Kind.COUNT
        return self.kind


def _outcome(name: str, desc: str) -> Metric:
    return Metric(name, Kind.COUNT, ("count", "ratio", "rate"), desc, outcome=True, bare_ok=True)


METRICS: dict[str, Metric] = {
    m.name: m
    for m in (
        Metric("ttft", Kind.DURATION, DIST, "time to first token, per request"),
        Metric("itl", Kind.DURATION, DIST, "inter-token latency, per token"),
        Metric("coalesced", Kind.RATIO, ("ratio",), "share of ITL gaps that are not independent samples (tokens sharing a read or a chunk)"),
        Metric("tpot", Kind.DURATION, DIST, "time per output token after the first, per request"),
        Metric("latency", Kind.DURATION, DIST, "end-to-end request latency"),
        Metric("sent_ttft", Kind.DURATION, DIST, "time to first token from the send (after any max_concurrency wait)"),
        Metric("sent_latency", Kind.DURATION, DIST, "end-to-end latency from the send (after any max_concurrency wait)"),
        Metric("schedule_lag", Kind.DURATION, DIST, "open-loop send delay behind the schedule"),
        Metric("output_tokens", Kind.NUMBER, DIST, "output tokens per request"),
        Metric("prompt_tokens", Kind.NUMBER, DIST, "prompt tokens per request"),
        _outcome("requests", "measured requests"),
        _outcome("completed", "completed requests"),
        _outcome("failed", "failed requests"),
        _outcome("timeouts", "requests that passed their deadline"),
        _outcome("rejected", "requests the server refused (4xx)"),
        _outcome("disconnected", "requests whose connection broke"),
        _outcome("errors", "failed + timeouts + rejected + disconnected"),
        _outcome("usage_mismatch", "completed requests whose reported usage contradicts their stream"),
        _outcome("empty_text", "completed requests whose tokens decoded to no text (not a failure)"),
        Metric("throughput", Kind.NUMBER, SERIES, "output tokens per second, by the bucket their requests ended in", series=True),
        Metric("total_throughput", Kind.NUMBER, SERIES, "prompt + output tokens per second, by the bucket their requests ended in",
               series=True),
        Metric("qps", Kind.RATE, SERIES, "completed requests per second, by the bucket they ended in", series=True),
        Metric("gpu_memory", Kind.SIZE, SERIES, "GPU memory used by the server's processes, per sample", series=True),
        Metric("gpu_memory_device", Kind.SIZE, SERIES, "GPU memory used on the device, per sample", series=True),
        Metric("rss", Kind.SIZE, SERIES, "server process-tree resident memory (each page once: PSS), per sample", series=True),
        Metric("in_flight", Kind.NUMBER, SERIES, "mean requests in flight, per bucket", series=True),
        Metric("cpu", Kind.RATIO, SERIES, "server process-tree CPU (100% = one core), per sample", series=True),
        Metric("server", Kind.NUMBER, ("count", "rate", "min", "max", "mean", "p"),
               "a metric of the server's own /metrics: server(\"vllm:num_requests_waiting\")", bare_ok=True, series=True),
    )
}

# server("name"): a Prometheus metric family name (the text format's own rule)
SERVER_METRIC_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")

# a gauge that is a fraction of one engine's capacity or traffic (vLLM's kv_cache_usage_perc,
# gpu_prefix_cache_hit_rate, spec_decode_draft_acceptance_rate, spec_decode_efficiency; SGLang's
# token_usage, cache_hit_rate): the scraper averages its label sets (runner/scrape.py), and the
# checker refuses it in ratio(server(...), server(...)), which divides counters' increases.
# The runner may not import the language: runner/scrape.py's RATIO_SUFFIXES is this list,
# pinned equal by tests/test_server_ratio.py
SERVER_RATIO_SUFFIXES = ("_perc", "_ratio", "_usage", "hit_rate", "acceptance_rate", "_efficiency")

AGGREGATES = ("count", "ratio", "rate", "min", "max", "mean")

# Other names for an aggregate, and the one that means it: a hint's answer, never a spelling
# neighbour's (`median` is not `mean`).
AGGREGATE_WORDS: dict[str, str] = {
    "median": "p50", "med": "p50", "avg": "mean", "average": "mean", "minimum": "min", "maximum": "max",
}

# Names other benchmarks give a metric (vLLM's benchmark_serving, genai-perf), and the
# catalogue's metric that measures it: `request_throughput` is requests per second (qps), not
# `throughput` (output tokens per second), however close the spelling.
METRIC_WORDS: dict[str, str] = {
    **dict.fromkeys(("request_throughput", "request_rate", "requests_per_second", "req_per_sec", "rps"), "qps"),
    **dict.fromkeys(("output_throughput", "output_token_throughput", "tokens_per_second", "tps", "tok_s"), "throughput"),
    **dict.fromkeys(("total_token_throughput", "total_tokens_per_second"), "total_throughput"),
    **dict.fromkeys(("time_to_first_token",), "ttft"),
    **dict.fromkeys(("inter_token_latency",), "itl"),
    **dict.fromkeys(("time_per_output_token",), "tpot"),
    **dict.fromkeys(("e2el", "e2e_latency", "request_latency", "end_to_end_latency"), "latency"),
}

EVIDENCE_PREDICATES: dict[str, Kind] = {
    "bucket_coverage": Kind.BOOL,
    "duration_coverage": Kind.BOOL,
    "trace_coverage": Kind.RATIO,
    "follow_up": Kind.BOOL,
    "provenance_consistent": Kind.BOOL,
    "runtime_boundary_specific": Kind.BOOL,
    "artifacts_verified": Kind.BOOL,
    "completed_run": Kind.BOOL,
    "metrics_scraped": Kind.BOOL,
}


# Goodput (SLO attainment): `goodput(ttft < 500ms and tpot < 50ms)` is the share of the scope's
# measured requests that completed and meet every condition; `goodput_rate(...)` is how many
# requests meeting it the server delivered (ended in the scope's buckets, as qps counts) per
# second of the scope's wall time. A condition names one per-request metric of
# `SLO_METRICS` (not itl: a request has many gaps; bound them with tpot or p99(itl) instead).
SLO_FUNCTIONS: dict[str, Kind] = {"goodput": Kind.RATIO, "goodput_rate": Kind.RATE}
SLO_METRICS = ("ttft", "tpot", "latency", "sent_ttft", "sent_latency", "schedule_lag", "output_tokens", "prompt_tokens")
GOODPUT = "goodput"  # the metric name both functions resolve to (agg "ratio" or "rate")


# How a metric is named where it says which completed requests it leaves out ("TPOT leaves out 3
# completed requests ..."): its name in capitals, but the times from the send, which read as words
# (the judge's message for an empty scope and the reports' exclusion notes say it alike)
_EXCLUSION_TITLES = {"sent_ttft": "TTFT from the send", "sent_latency": "Latency from the send"}


def exclusion_title(name: str) -> str:
    """`tpot` -> "TPOT", `sent_ttft` -> "TTFT from the send"."""
    return _EXCLUSION_TITLES.get(name, name.upper())


def parse_percentile(func: str) -> float | None:
    """`p99` -> 99.0, `p99.9` -> 99.9; None when not a percentile in (0, 100]."""
    m = re.fullmatch(r"p([0-9]+(?:\.[0-9]+)?)", func)
    if not m:
        return None
    q = float(m.group(1))
    if not 0 < q <= 100:
        return None
    return q
