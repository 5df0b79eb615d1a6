"""What the evidence says, in numbers: results.json, and the values every gate rule compares.

Pure. `index(evidence)` arranges the requests by backend, level and bucket (bucket windows come
from the manifest's `levels`); `measure(...)` computes one aggregate of one metric over one
scope instance; `summarize(evidence)` is results.json. The judge calls the same `measure` and
`drift` functions, so a report and a gate can never disagree about a number.

Definitions (the metric catalogue in `soakspec.lang.metrics` names them):
  - a *measured* request is one with bucket >= 0 (not warm-up -1, not follow-up -2);
  - per-request distributions (ttft, itl, tpot, latency, schedule_lag, output_tokens,
    prompt_tokens) pool the *completed* measured requests of the scope; itl pools the
    per-token gaps of every completed request whose ITL is not an estimate;
  - outcome counts are over measured requests; ratio() divides by them; rate() divides by the
    scope's wall time (the sum of its buckets' end - start);
  - per-bucket series: qps = completed / wall, throughput = output tokens of completed requests
    / wall, in_flight = sum over all the backend's requests of the overlap of [start, end] with
    the window / window length (exact); rss, gpu_memory (the server's own processes, summed
    over GPUs), gpu_memory_device are per telemetry sample inside the scope's windows. A series
    aggregate at level, backend or run scope is min/max/mean over the scope's buckets (or
    samples);
  - drift of a per-bucket value over an ordered list of buckets: median of the last quarter
    relative to the median of the first quarter (quarter = max(1, n // 4) buckets, so the two
    never overlap); needs at least 2 buckets;
  - slope: least-squares slope of the per-bucket value against the bucket's mid time, per
    minute, relative to the mean value; needs at least 2 buckets.
"""

from __future__ import annotations

from array import array

import dataclasses
import math
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from soakspec.judge import stats
from soakspec.judge.evidence import BackendEvidence, Evidence

SCHEMA_VERSION = 1
TOP_ERRORS = 10

Row = Mapping[str, Any]

DIST_METRICS = ("ttft", "itl", "tpot", "latency", "schedule_lag", "output_tokens", "prompt_tokens")
OUTCOME_METRICS = ("requests", "completed", "failed", "timeouts", "rejected", "disconnected", "errors")
SERIES_BUCKET = ("qps", "throughput", "in_flight")
SERIES_SAMPLE = ("rss", "gpu_memory", "gpu_memory_device")

_OUTCOME_OF = {"completed": "completed", "failed": "failed", "timeouts": "timeout", "rejected": "rejected", "disconnected": "disconnected"}


# ------------------------------------------------------------------------------ the index


def _num(v: Any) -> float | None:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    f = float(v)
    return f if math.isfinite(f) else None


def req_time(r: Row) -> float | None:
    """When a request counts as started: its intended start (open loop), else its start."""
    t = _num(r.get("intended_start"))
    return t if t is not None else _num(r.get("start"))


def _order(r: Row) -> tuple:
    t = req_time(r)
    return (t if t is not None else math.inf, str(r.get("request_id")))


@dataclasses.dataclass(frozen=True)
class Window:
    """One bucket (or `per window` slice) of a level: its wall-clock window and its requests."""

    index: int
    start: float | None
    end: float | None
    planned_length_s: float | None
    records: tuple[Row, ...]  # measured requests that started in it, in time order
    planned: bool = True  # listed in the manifest (False: only requests name it)

    @property
    def wall_s(self) -> float | None:
        if self.start is None or self.end is None:
            return None
        return max(0.0, self.end - self.start)


@dataclasses.dataclass(frozen=True)
class LevelIndex:
    backend: str
    workload: str
    index: int
    entry: Mapping[str, Any]
    label: str
    buckets: tuple[Window, ...]

    @property
    def records(self) -> tuple[Row, ...]:
        return tuple(r for b in self.buckets for r in b.records)

    @property
    def measure_start(self) -> float | None:
        return _num(self.entry.get("measure_start"))

    @property
    def measure_end(self) -> float | None:
        return _num(self.entry.get("measure_end"))

    @property
    def key(self) -> tuple[str, int]:
        return (self.workload, self.index)


@dataclasses.dataclass(frozen=True)
class BackendIndex:
    evidence: BackendEvidence
    levels: tuple[LevelIndex, ...]
    orphans: tuple[Row, ...]  # measured requests whose level the manifest does not list
    all_records: tuple[Row, ...]  # every request of the backend (warm-up and follow-up too)
    traced: frozenset[str]  # request ids with a matched trace
    payloads: Mapping[str, tuple[Mapping[str, Any], ...]]  # request id -> matched trace payloads
    samples: tuple[Row, ...]  # telemetry rows in time order

    @property
    def name(self) -> str:
        return self.evidence.name

    @property
    def measured(self) -> tuple[Row, ...]:
        return tuple(sorted([r for lv in self.levels for r in lv.records] + list(self.orphans), key=_order))

    @property
    def trace_source(self) -> str:
        ts = self.evidence.entry.get("trace_source")
        return ts if isinstance(ts, str) else "none"


def level_label(entry: Mapping[str, Any], with_workload: bool = False) -> str:
    """`concurrency 8`, `rate 2 rps`, `concurrency 4 (batches of 8)` -- as the plan prints it."""
    mode = entry.get("mode")
    if mode == "open":
        rate = _num(entry.get("rate"))
        text = f"rate {rate:g} rps" if rate is not None else "rate ?"
    elif mode == "batch":
        text = f"concurrency {entry.get('concurrency')} (batches of {entry.get('batch_requests')})"
    else:
        text = f"concurrency {entry.get('concurrency')}"
    if with_workload:
        return f"{entry.get('workload')} / {text}"
    return text


def _level_entries(be: BackendEvidence) -> list[Mapping[str, Any]]:
    lv = be.entry.get("levels")
    return [e for e in lv if isinstance(e, Mapping)] if isinstance(lv, list) else []


def index_backend(be: BackendEvidence) -> BackendIndex:
    entries = _level_entries(be)
    workloads = {e.get("workload") for e in entries}
    by_level: dict[tuple[Any, Any], list[Row]] = {}
    orphans: list[Row] = []
    keys = {(e.get("workload"), e.get("index")) for e in entries}
    for r in be.records:
        if r.get("bucket", -1) < 0:
            continue
        k = (r.get("workload"), r.get("level"))
        if k in keys:
            by_level.setdefault(k, []).append(r)
        else:
            orphans.append(r)
    levels = []
    for e in entries:
        k = (e.get("workload"), e.get("index"))
        recs = sorted(by_level.get(k, []), key=_order)
        by_bucket: dict[int, list[Row]] = {}
        for r in recs:
            by_bucket.setdefault(int(r["bucket"]), []).append(r)
        windows = []
        listed = set()
        for bk in e.get("buckets") or []:
            if not isinstance(bk, Mapping) or not isinstance(bk.get("index"), int):
                continue
            i = bk["index"]
            if i in listed:
                continue
            listed.add(i)
            windows.append(Window(i, _num(bk.get("start")), _num(bk.get("end")), _num(bk.get("planned_length_s")), tuple(by_bucket.get(i, ()))))
        for i in sorted(set(by_bucket) - listed):
            windows.append(Window(i, None, None, None, tuple(by_bucket[i]), planned=False))
        windows.sort(key=lambda w: w.index)
        levels.append(
            LevelIndex(be.name, str(e.get("workload")), int(e.get("index", 0)) if isinstance(e.get("index"), int) else 0,
                       e, level_label(e, len(workloads) > 1), tuple(windows))
        )
    traced: set[str] = set()
    payloads: dict[str, list[Mapping[str, Any]]] = {}
    for t in be.traces:
        rid = t.get("request_id")
        if t.get("matched") is True and isinstance(rid, str):
            traced.add(rid)
            p = t.get("payload", t.get("trace"))
            if isinstance(p, Mapping):
                payloads.setdefault(rid, []).append(p)
    samples = sorted((s for s in be.telemetry if _num(s.get("t")) is not None), key=lambda s: float(s["t"]))
    return BackendIndex(
        be, tuple(levels), tuple(sorted(orphans, key=_order)), tuple(sorted(be.records, key=_order)),
        frozenset(traced), {k: tuple(v) for k, v in payloads.items()}, tuple(samples),
    )


def index(evidence: Evidence) -> tuple[BackendIndex, ...]:
    return tuple(index_backend(b) for b in evidence.backends)


# ------------------------------------------------------------------------------ scopes


@dataclasses.dataclass(frozen=True)
class Scope:
    """One instance of a rule's scope: what it covers and where it is, for messages."""

    kind: str  # run | backend | level | bucket | window
    backends: tuple[BackendIndex, ...]
    records: tuple[Row, ...]  # measured requests in the scope, time order
    windows: tuple[tuple[BackendIndex, Window], ...]  # buckets (or the one window) in the scope
    level: LevelIndex | None = None
    bucket: int | None = None
    start: float | None = None
    end: float | None = None

    @property
    def backend(self) -> str | None:
        return self.backends[0].name if len(self.backends) == 1 else None

    @property
    def wall_s(self) -> float | None:
        walls = [w.wall_s for _, w in self.windows]
        if not walls or any(w is None for w in walls):
            return None
        return math.fsum(walls)  # type: ignore[arg-type]

    def where(self) -> str:
        """`backend nccl, concurrency 8, bucket 1 [12:01:00-12:02:00 UTC]`."""
        if self.kind == "run":
            return "the whole run"
        parts = []
        if self.backend is not None:
            parts.append(f"backend {self.backend}")
        if self.level is not None:
            parts.append(self.level.label)
        if self.bucket is not None:
            parts.append(f"{'window' if self.kind == 'window' else 'bucket'} {self.bucket}{clock_span(self.start, self.end)}")
        return ", ".join(parts)


def clock(t: float) -> str:
    import datetime as _dt

    return _dt.datetime.fromtimestamp(t, tz=_dt.timezone.utc).strftime("%H:%M:%S")


def clock_span(start: float | None, end: float | None) -> str:
    if start is None or end is None:
        return ""
    return f" [{clock(start)}-{clock(end)} UTC]"


def bucket_scope(bi: BackendIndex, lv: LevelIndex, w: Window) -> Scope:
    return Scope("bucket", (bi,), w.records, ((bi, w),), lv, w.index, w.start, w.end)


def level_scope(bi: BackendIndex, lv: LevelIndex) -> Scope:
    return Scope("level", (bi,), lv.records, tuple((bi, w) for w in lv.buckets), lv, None, lv.measure_start, lv.measure_end)


def backend_scope(bi: BackendIndex) -> Scope:
    return Scope("backend", (bi,), bi.measured, tuple((bi, w) for lv in bi.levels for w in lv.buckets))


def run_scope(bis: Sequence[BackendIndex]) -> Scope:
    ws = tuple((bi, w) for bi in bis for lv in bi.levels for w in lv.buckets)
    recs = tuple(sorted((r for bi in bis for r in bi.measured), key=_order))
    return Scope("run", tuple(bis), recs, ws)


def window_scopes(bi: BackendIndex, lv: LevelIndex, length: float) -> list[Scope]:
    """Fixed, non-overlapping windows of `length` from the level's measured start; the last one
    may be shorter. A request belongs to the window in which it started."""
    t0, t1 = lv.measure_start, lv.measure_end
    if t0 is None or t1 is None or length <= 0 or t1 <= t0:
        return []
    n = max(1, math.ceil((t1 - t0) / length - 1e-9))
    out = []
    recs = lv.records
    for k in range(n):
        a = t0 + k * length
        b = min(t1, a + length)
        last = k == n - 1
        inside = tuple(r for r in recs if (t := req_time(r)) is not None and a <= t and (t < b or (last and t <= b)))
        w = Window(k, a, b, b - a, inside)
        out.append(Scope("window", (bi,), inside, ((bi, w),), lv, k, a, b))
    return out


def scopes(kind: str, bis: Sequence[BackendIndex], window_s: float | None = None) -> list[Scope]:
    """Every instance of a scope kind, in a fixed order (backends, levels, buckets)."""
    if kind == "run":
        return [run_scope(bis)]
    out: list[Scope] = []
    for bi in bis:
        if kind == "backend":
            out.append(backend_scope(bi))
            continue
        for lv in bi.levels:
            if kind == "level":
                out.append(level_scope(bi, lv))
            elif kind == "bucket":
                out.extend(bucket_scope(bi, lv, w) for w in lv.buckets)
            elif kind == "window":
                out.extend(window_scopes(bi, lv, window_s or 0.0))
    return out


# ------------------------------------------------------------------------------ values


def completed(records: Iterable[Row]) -> list[Row]:
    return [r for r in records if r.get("outcome") == "completed"]


def dist_values(records: Iterable[Row], metric: str) -> list[float]:
    """The samples of a per-request distribution over the completed requests in `records`."""
    out: list[float] = []
    for r in completed(records):
        if metric == "itl":
            if r.get("itl_source") == "estimated":
                continue
            gaps = r.get("itl")
            if isinstance(gaps, (list, array)):
                out.extend(v for g in gaps if (v := _num(g)) is not None)
            continue
        v: float | None
        if metric == "ttft":
            v = _num(r.get("ttft"))
            if v is None and (ft := _num(r.get("first_token"))) is not None and (t := req_time(r)) is not None:
                v = ft - t
        elif metric == "latency":
            v = _num(r.get("latency"))
            if v is None and (e := _num(r.get("end"))) is not None and (t := req_time(r)) is not None:
                v = e - t
        elif metric == "schedule_lag":
            s, i = _num(r.get("start")), _num(r.get("intended_start"))
            v = s - i if s is not None and i is not None else None
        else:  # tpot, output_tokens, prompt_tokens
            v = _num(r.get(metric))
        if v is not None:
            out.append(v)
    return out


def outcome_count(records: Iterable[Row], metric: str) -> int:
    if metric == "requests":
        return sum(1 for _ in records)
    if metric == "errors":
        return sum(1 for r in records if r.get("outcome") != "completed")
    want = _OUTCOME_OF[metric]
    return sum(1 for r in records if r.get("outcome") == want)


def counts(records: Sequence[Row]) -> dict[str, int]:
    """results.json `requests` counts (outcome names as in requests.jsonl)."""
    c = Counter(r.get("outcome") for r in records)
    return {
        "total": len(records),
        "completed": c["completed"],
        "failed": c["failed"],
        "timeout": c["timeout"],
        "rejected": c["rejected"],
        "disconnected": c["disconnected"],
    }


def in_flight(all_records: Iterable[Row], start: float, end: float) -> float | None:
    """Mean number of requests in flight over [start, end): the exact time integral of the
    in-flight count divided by the window length."""
    if end <= start:
        return None
    parts = []
    for r in all_records:
        s = _num(r.get("start"))
        e = _num(r.get("end"))
        if s is None:
            continue
        e = s if e is None else e
        lo, hi = max(s, start), min(e, end)
        if hi > lo:
            parts.append(hi - lo)
    return math.fsum(parts) / (end - start)


def window_series(bi: BackendIndex, w: Window, metric: str) -> float | None:
    """qps, throughput or in_flight of one bucket or window (None: unknown wall time)."""
    wall = w.wall_s
    if not wall:
        return None
    if metric == "qps":
        return outcome_count(w.records, "completed") / wall
    if metric == "throughput":
        return math.fsum(float(_num(r.get("output_tokens")) or 0.0) for r in completed(w.records)) / wall
    if metric == "in_flight":
        return in_flight(bi.all_records, w.start, w.end)  # type: ignore[arg-type]
    raise KeyError(metric)


def sample_value(s: Row, metric: str) -> float | None:
    if metric == "rss":
        return _num(s.get("server_rss_bytes", s.get("rss")))
    gpus = s.get("gpus")
    if not isinstance(gpus, list):
        return None
    key = "process_memory_used" if metric == "gpu_memory" else "memory_used"
    vals = [v for g in gpus if isinstance(g, Mapping) and (v := _num(g.get(key))) is not None]
    return math.fsum(vals) if vals else None


def series_points(scope: Scope, metric: str) -> list[float]:
    """The points a series aggregate runs over: one per bucket (qps, throughput, in_flight) or
    one per telemetry sample inside the scope's buckets (memory)."""
    pts: list[float] = []
    for bi, w in scope.windows:
        if metric in SERIES_SAMPLE:
            if w.start is None or w.end is None:
                continue
            for s in bi.samples:
                t = float(s["t"])
                if w.start <= t < w.end and (v := sample_value(s, metric)) is not None:
                    pts.append(v)
        elif (v := window_series(bi, w, metric)) is not None:
            pts.append(v)
    return pts


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

    @property
    def short(self) -> int:
        return max(0, self.needed - self.samples)


def measure(scope: Scope, metric: str, agg: str | None, percentile: float | None = None, *,
            confidence: float = 0.95, min_samples: int = 1) -> Measure:
    """agg(metric) over one scope instance."""
    if metric in OUTCOME_METRICS:
        n = len(scope.records)
        agg = agg or "count"
        if n == 0:
            return Measure(None, 0, 1, "requests", "no measured requests")
        c = outcome_count(scope.records, metric)
        if agg == "count":
            return Measure(float(c), n, 1)
        if agg == "ratio":
            return Measure(c / n, n, 1)
        if agg == "rate":
            wall = scope.wall_s
            if not wall:
                return Measure(None, n, 1, "requests", "the scope's wall time is unknown")
            return Measure(c / wall, n, 1)
        raise ValueError(f"{agg}() does not apply to {metric}")
    if metric in DIST_METRICS:
        vals = dist_values(scope.records, metric)
        unit = "gaps" if metric == "itl" else "requests"
        if percentile is not None:
            need = max(stats.min_samples_for_percentile(percentile, confidence), min_samples)
            if not vals:
                return Measure(None, 0, need, unit, f"no completed {unit}")
            return Measure(stats.percentile(vals, percentile), len(vals), need, unit)
        need = max(1, min_samples)
        if not vals:
            return Measure(None, 0, need, unit, f"no completed {unit}")
        if agg == "mean":
            return Measure(stats.mean(vals), len(vals), need, unit)
        if agg == "min":
            return Measure(min(vals), len(vals), need, unit)
        if agg == "max":
            return Measure(max(vals), len(vals), need, unit)
        raise ValueError(f"{agg}() does not apply to {metric}")
    if metric in SERIES_BUCKET or metric in SERIES_SAMPLE:
        pts = series_points(scope, metric)
        unit = "samples" if metric in SERIES_SAMPLE else "buckets"
        if not pts:
            why = "no telemetry samples" if metric in SERIES_SAMPLE else "no bucket with a known wall time"
            return Measure(None, 0, 1, unit, why)
        if agg == "mean":
            return Measure(stats.mean(pts), len(pts), 1, unit)
        if agg == "min":
            return Measure(min(pts), len(pts), 1, unit)
        if agg == "max":
            return Measure(max(pts), len(pts), 1, unit)
        raise ValueError(f"{agg}() does not apply to {metric}")
    raise KeyError(f"unknown metric {metric!r}")


# ------------------------------------------------------------------------------ drift / slope


def quarters(n: int) -> int:
    return max(1, n // 4)


def relative_change(first: float, last: float) -> float | None:
    if first == 0:
        return 0.0 if last == 0 else None
    return (last - first) / abs(first)


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


def slope(times: Sequence[float], values: Sequence[float]) -> float | None:
    """Least-squares slope of values against times (seconds), per minute, relative to the
    mean value (None: < 2 points, no time spread, or a zero mean with a non-zero slope)."""
    n = len(values)
    if n < 2 or len(times) != n:
        return None
    mt = math.fsum(times) / n
    mv = math.fsum(values) / n
    sxx = math.fsum((t - mt) ** 2 for t in times)
    if sxx == 0:
        return None
    sxy = math.fsum((t - mt) * (v - mv) for t, v in zip(times, values))
    per_min = sxy / sxx * 60.0
    if mv == 0:
        return 0.0 if per_min == 0 else None
    return per_min / abs(mv)


def bucket_series(bi: BackendIndex, levels: Sequence[LevelIndex], metric: str, agg: str | None,
                  percentile: float | None, *, confidence: float = 0.95, min_samples: int = 1) -> list[tuple[Scope, Measure]]:
    """agg(metric) in each bucket of `levels`, in order."""
    return [
        (sc, measure(sc, metric, agg, percentile, confidence=confidence, min_samples=min_samples))
        for lv in levels
        for w in lv.buckets
        for sc in [bucket_scope(bi, lv, w)]
    ]


_DRIFT_METRICS = (
    ("qps", "qps", "mean", None),
    ("throughput", "throughput", "mean", None),
    ("ttft_p95", "ttft", None, 95.0),
    ("itl_p95", "itl", None, 95.0),
    ("tpot_p95", "tpot", None, 95.0),
    ("rss", "rss", "mean", None),
    ("gpu_memory", "gpu_memory", "mean", None),
)


def level_drift(bi: BackendIndex, lv: LevelIndex) -> dict[str, Any] | None:
    """The report's drift table for one level (not gated here: values only, no sample test)."""
    if len(lv.buckets) < 2:
        return None
    out: dict[str, Any] = {}
    k = quarters(len(lv.buckets))
    for key, metric, agg, q in _DRIFT_METRICS:
        series = bucket_series(bi, [lv], metric, agg, q)
        vals = [m.value for _, m in series]
        first = [v for v in vals[:k]]
        last = [v for v in vals[len(vals) - k:]]
        if any(v is None for v in first + last):
            out[key] = None
            continue
        f, la = stats.median(first), stats.median(last)  # type: ignore[arg-type]
        out[key] = {"first": f, "last": la, "change": relative_change(f, la)}  # type: ignore[arg-type]
    return out


# ------------------------------------------------------------------------------ results.json


def _dist(vals: Sequence[float]) -> dict[str, Any] | None:
    if not vals:
        return None
    return {
        "count": len(vals),
        "p50": stats.percentile(vals, 50),
        "p95": stats.percentile(vals, 95),
        "p99": stats.percentile(vals, 99),
        "mean": stats.mean(vals),
        "min": min(vals),
        "max": max(vals),
    }


def _series(vals: Sequence[float]) -> dict[str, Any] | None:
    if not vals:
        return None
    return {"samples": len(vals), "min": min(vals), "mean": stats.mean(vals), "max": max(vals)}


def error_message(r: Row) -> str:
    err = r.get("error")
    return err if isinstance(err, str) and err else f"{r.get('outcome')} (no message)"


def errors_by_message(records: Iterable[Row], top: int = TOP_ERRORS) -> dict[str, int]:
    c = Counter(error_message(r) for r in records if r.get("outcome") != "completed")
    ranked = sorted(c.items(), key=lambda kv: (-kv[1], kv[0]))[:top]
    return dict(ranked)


def trace_coverage(bi: BackendIndex, records: Sequence[Row]) -> tuple[float | None, int]:
    """(requests with a matched trace / measured requests, traced count); None without requests."""
    if not records:
        return None, 0
    n = sum(1 for r in records if r.get("request_id") in bi.traced)
    return n / len(records), n


def terminal_reasons(bi: BackendIndex, records: Iterable[Row]) -> dict[str, int]:
    c: Counter[str] = Counter()
    for r in records:
        for p in bi.payloads.get(str(r.get("request_id")), ()):
            reason = p.get("terminal_reason", p.get("finish_reason"))
            c[str(reason) if reason is not None else "unknown"] += 1
    return dict(sorted(c.items()))


def window_summary(bi: BackendIndex, lv: LevelIndex, w: Window) -> dict[str, Any]:
    sc = bucket_scope(bi, lv, w)
    recs = w.records
    cov, traced = trace_coverage(bi, recs)
    return {
        "bucket": w.index,
        "level": lv.index,
        "workload": lv.workload,
        "level_label": lv.label,
        "concurrency": lv.entry.get("concurrency"),
        "rate": lv.entry.get("rate"),
        "planned": w.planned,
        "started": w.start,
        "ended": w.end,
        "wall_s": w.wall_s if w.wall_s is not None else 0.0,
        "planned_length_s": w.planned_length_s,
        "requests": counts(recs),
        "qps": window_series(bi, w, "qps"),
        "output_tokens_per_s": window_series(bi, w, "throughput"),
        "in_flight": window_series(bi, w, "in_flight"),
        "ttft": _dist(dist_values(recs, "ttft")),
        "itl": _dist(dist_values(recs, "itl")),
        "tpot": _dist(dist_values(recs, "tpot")),
        "latency": _dist(dist_values(recs, "latency")),
        "trace_coverage": cov,
        "traced": traced,
        "terminal_reasons": terminal_reasons(bi, recs),
        "errors": errors_by_message(recs),
        "rss": _series(series_points(sc, "rss")),
        "gpu_memory": _series(series_points(sc, "gpu_memory")),
        "gpu_memory_device": _series(series_points(sc, "gpu_memory_device")),
    }


def level_summary(bi: BackendIndex, lv: LevelIndex) -> dict[str, Any]:
    e = lv.entry
    recs = lv.records
    ms, me = lv.measure_start, lv.measure_end
    cov, traced = trace_coverage(bi, recs)
    return {
        "workload": lv.workload,
        "index": lv.index,
        "label": lv.label,
        "mode": e.get("mode"),
        "concurrency": e.get("concurrency"),
        "rate": e.get("rate"),
        "batch_requests": e.get("batch_requests"),
        "planned_duration_s": e.get("planned_duration_s"),
        "measure_start": ms,
        "measure_end": me,
        "wall_s": (me - ms) if ms is not None and me is not None else None,
        "completed": e.get("completed") is True,
        "sent": e.get("sent"),
        "requests": counts(recs),
        "ttft": _dist(dist_values(recs, "ttft")),
        "itl": _dist(dist_values(recs, "itl")),
        "tpot": _dist(dist_values(recs, "tpot")),
        "latency": _dist(dist_values(recs, "latency")),
        "trace_coverage": cov,
        "traced": traced,
        "errors": errors_by_message(recs),
        "buckets": [w.index for w in lv.buckets],
        "drift": level_drift(bi, lv),
    }


def _followup(be: BackendEvidence) -> dict[str, Any] | None:
    f = be.followup
    if f is None:
        return None
    rec = f.get("record")
    return {
        "required": f.get("required", True) is not False,
        "passed": f.get("passed") is True,
        "reason": f.get("reason"),
        "server_idle": f.get("server_idle"),
        "outcome": rec.get("outcome") if isinstance(rec, Mapping) else None,
        "latency": _num(rec.get("latency")) if isinstance(rec, Mapping) else None,
    }


def _lkey(lv: LevelIndex, bucket: int | None = None) -> str:
    k = f"{lv.workload}:{lv.index}"
    return k if bucket is None else f"{k}:{bucket}"


def backend_summary(bi: BackendIndex, required_coverage: float | None = None) -> dict[str, Any]:
    be = bi.evidence
    buckets = [window_summary(bi, lv, w) for lv in bi.levels for w in lv.buckets]
    by_bucket = {_lkey(lv, w.index): trace_coverage(bi, w.records)[0] for lv in bi.levels for w in lv.buckets}
    known = [v for v in by_bucket.values() if v is not None]
    warm = [r for r in be.records if r.get("bucket") == -1]
    return {
        "name": be.name,
        "safe_name": be.safe_name,
        "trace_source": bi.trace_source,
        "requests": counts(bi.measured),
        "warmup_requests": counts(warm),
        "unassigned_requests": len(bi.orphans),
        "errors": errors_by_message(bi.measured),
        "buckets": buckets,
        "levels": [level_summary(bi, lv) for lv in bi.levels],
        "drift": {_lkey(lv): level_drift(bi, lv) for lv in bi.levels} or None,
        "followup": _followup(be),
        "trace_coverage": {
            "required": required_coverage,
            "min_bucket": min(known) if known else None,
            "by_bucket": by_bucket,
        },
        "runtime_boundary": be.entry.get("runtime_boundary") if isinstance(be.entry.get("runtime_boundary"), Mapping) else None,
        "partial_tail": list(be.partial_tail),
        "problems": list(be.problems),
    }


def required_trace_coverage(spec: Any) -> float | None:
    if spec is None:
        return None
    vals = [r.threshold for r in spec.gate.rules if r.expr.metric == "trace_coverage" and r.threshold is not None]
    return max(vals) if vals else None


def summarize(evidence: Evidence, spec: Any = None, indexes: Sequence[BackendIndex] | None = None) -> dict[str, Any]:
    """results.json: per backend, per level, per bucket (see results.schema.json). `spec`, when
    given, only adds the trace coverage the gate requires; `indexes`, `index(evidence)` when the
    caller has it already."""
    need = required_trace_coverage(spec)
    return {
        "schema_version": SCHEMA_VERSION,
        "run_id": evidence.run_id or "unknown",
        "manifest_sha256": evidence.manifest_sha256,
        "spec_sha256": evidence.spec_sha256,
        "status": evidence.manifest.get("status"),
        "backends": [backend_summary(bi, need) for bi in (index(evidence) if indexes is None else indexes)],
    }
