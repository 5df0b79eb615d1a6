"""What the evidence says, in numbers: results.json (see results.schema.json).

Pure. `summarize_run(run)` summarizes a joined run (`joined.join(spec, evidence)`, shared with
the judge, so a long soak is indexed once); `summarize(evidence, spec=None)` indexes the
evidence itself. Every number comes from the metric implementations the gate uses
(`soakspec.judge.registry`, `soakspec.judge.measures`), so a report and a gate can never
disagree about a number. Per backend, per level and per bucket: request counts by outcome,
ttft/itl/tpot/latency distributions, qps, output tokens/s, in-flight, trace coverage, terminal
reasons, the most frequent errors, memory series and each level's drift table.

A bucket's request counts and distributions are over the requests that started in it; its
qps and output tokens/s are what the server delivered in it: the requests that completed
(ended) within its wall-clock window, whichever bucket they started in, per second
(`soakspec.judge.measures.delivered`) -- under overload, the server's completion rate, not
the arrival rate.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from soakspec.judge import peaks, stats
import numpy as np

from soakspec.judge.evidence import OUTCOMES, BackendEvidence, Evidence
from soakspec.judge.index import BackendIndex, LevelIndex, Row, Window, capped, error_message, index, num, scheduled_in
from soakspec.judge.joined import JudgedRun
from soakspec.judge.measures import (Distribution, Outcome, PerBucket, PerRequest, PerSample, bucket_series, completed, excluded, gap_share, not_completed,
                                    outcome_is, quarters, relative_change)
from soakspec.judge import table as table_module
from soakspec.judge.table import MISSING, Rows
from soakspec.judge.registry import metric
from soakspec.judge.servermetrics import results_section as server_metrics_section
from soakspec.judge.scope import Scope, bucket_scope, rows_by_turn
from soakspec.judge.validity import client_bucket

SCHEMA_VERSION = 1
TOP_ERRORS = 10


def dist_values(records: Iterable[Row], name: str) -> Any:
    """The samples of per-request distribution `name` over the completed requests in
    `records` (the per-token gaps counted by value, `stats.Counted`, where they can be)."""
    impl = metric(name)
    assert isinstance(impl, Distribution), name
    c = impl.counted(records)
    if c is not None:
        return c
    vals = impl.values(records)
    # an array `_dist` must not reorder (a metric whose values are not made for the call) goes as a copy
    return vals if impl.new_values or not isinstance(vals, np.ndarray) else vals.copy()


def window_series(bi: BackendIndex, w: Window, name: str) -> float | None:
    """qps, throughput or in_flight of one bucket or window (None: unknown wall time)."""
    impl = metric(name)
    assert isinstance(impl, PerBucket), name
    return impl.of(bi, w)


def series_points(scope: Scope, name: str) -> list[float]:
    """The telemetry values of `name` (rss, gpu_memory, ...) inside the scope's buckets."""
    impl = metric(name)
    assert isinstance(impl, PerSample), name
    return impl.points(scope)


def itl_coalesced(records: Iterable[Row]) -> dict[str, int]:
    """The ITL gaps `itl` pools from these records and how many of them are coalesced (not
    independent samples: tokens that shared a read, or a chunk's gap split over its tokens)."""
    gaps, shared = gap_share(records)
    return {"gaps": gaps, "coalesced": shared}


def counts(records: Sequence[Row]) -> dict[str, int]:
    """results.json `requests` counts (outcome names as in requests.jsonl)."""
    if isinstance(records, Rows):
        c = Counter({name: impl.count(records) for name in OUTCOMES for impl in [Outcome(outcome_is(name))]})
    else:
        c = Counter(r.get("outcome") for r in records)
    return {
        "total": len(records),
        "completed": c["completed"],
        "failed": c["failed"],
        "timeout": c["timeout"],
        "rejected": c["rejected"],
        "disconnected": c["disconnected"],
    }


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
    for key, name, agg, q in _DRIFT_METRICS:
        series = bucket_series(bi, [lv], metric(name), agg, q)
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


# The percentiles results.json stores of every per-request distribution (a level's, a bucket's, a
# turn's): bench serve's median and p99, GuideLLM's p90 and p95. p90 came later (an added key:
# older results.json files lack it, and a reader of one finds p50/p95/p99 as before); the report's
# `--percentiles` chooses among these (`soakspec.report.common.parse_percentiles`).
PERCENTILES = (50.0, 90.0, 95.0, 99.0)
PERCENTILE_KEYS = tuple(f"p{q:g}" for q in PERCENTILES)


def dist_summary(records: Iterable[Row], name: str) -> dict[str, Any] | None:
    """count, p50/p90/p95/p99, mean, min and max of distribution `name` over the completed requests
    in `records` (`_dist`). A day's per-request values (ttft, latency, tpot of a level of
    `CHUNKED_ROWS` requests or more) are read a chunk at a time, never held together -- the
    same figures, bit for bit (`stats.percentiles_of_chunks`, `stats.mean_min_max_of_chunks`),
    never a 10^7-request level's 80 MB of values and their selection at once (not where the
    report peaks today, benchmarks/README.md: bounded all the same)."""
    impl = metric(name)
    chunks = impl.chunked(records) if isinstance(impl, PerRequest) else None
    if chunks is None:
        return _dist(dist_values(records, name))
    pcts, n = stats.percentiles_of_chunks(chunks, PERCENTILES)
    if not n:
        return None
    mean, least, most = stats.mean_min_max_of_chunks(chunks)
    return {"count": n, **dict(zip(PERCENTILE_KEYS, pcts)), "mean": mean, "min": least, "max": most}


def _dist(vals: Any) -> dict[str, Any] | None:
    """count, p50/p90/p95/p99, mean, min and max of `dist_values`' result (which this may reorder:
    a scope's values are an array made for the call, `Distribution.new_values`). Gaps counted
    in bins add `bounds`: for each percentile that is not exact, the least and greatest it can
    be (within 0.2% of each other); mean, min and max stay exact."""
    if isinstance(vals, stats.Counted):
        if not vals.n:
            return None
        out: dict[str, Any] = {"count": vals.n, **{k: vals.percentile(q) for k, q in zip(PERCENTILE_KEYS, PERCENTILES)},
                               "mean": vals.mean(), "min": vals.min(), "max": vals.max()}
        if not vals.exact:  # binned gaps (judge/gapbins.py): each percentile shown with where it lies
            bounds = {k: list(b) for k, q in zip(PERCENTILE_KEYS, PERCENTILES)
                      if (b := vals.percentile_bounds(q)) is not None and b[0] != b[1]}
            if bounds:
                out["bounds"] = bounds
        return out
    if not len(vals):
        return None
    reorder = stats.own_array(vals)
    return {
        "count": len(vals),
        **{k: stats.percentile(vals, q, reorder=reorder) for k, q in zip(PERCENTILE_KEYS, PERCENTILES)},
        "mean": stats.mean(vals),
        "min": float(np.min(vals)),
        "max": float(np.max(vals)),
    }


def _series(vals: Sequence[float]) -> dict[str, Any] | None:
    if not len(vals):
        return None
    return {"samples": len(vals), "min": min(vals), "mean": stats.mean(vals), "max": max(vals)}


def errors_by_message(records: Iterable[Row], top: int = TOP_ERRORS) -> dict[str, int]:
    if isinstance(records, Rows):
        records = records.where(not_completed.col, not_completed.row)
    c = Counter(error_message(r) for r in records if r.get("outcome") != "completed")
    ranked = sorted(c.items(), key=lambda kv: (-kv[1], kv[0]))[:top]
    return dict(ranked)


def trace_coverage(bi: BackendIndex, records: Sequence[Row]) -> tuple[float | None, int]:
    """(completed requests with a matched trace / completed measured requests, traced count),
    as the gate's trace_coverage counts them; None without a completed request."""
    done = completed(records)
    if not done:
        return None, 0
    if isinstance(done, Rows):
        n = sum(int(bi.traced_mask(t, idx).sum()) for t, idx in done.parts)
    else:
        n = sum(1 for r in done if r.get("request_id") in bi.traced)
    return n / len(done), n


def terminal_reasons(bi: BackendIndex, records: Iterable[Row]) -> dict[str, int]:
    if isinstance(records, Rows):
        return bi.terminal_reasons(records)
    c: Counter[str] = Counter()
    for rid in (str(r.get("request_id")) for r in records):
        for p in bi.payloads.get(rid, ()):
            reason = p.get("terminal_reason", p.get("finish_reason"))
            c[str(reason) if reason is not None else "unknown"] += 1
    return dict(sorted(c.items()))


def window_summary(bi: BackendIndex, lv: LevelIndex, w: Window, prev: Window | None = None) -> dict[str, Any]:
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
        # an open loop's arrivals in the bucket per second, where its schedule is recorded (`index.scheduled_in`)
        "scheduled_rate": scheduled_in(lv, w),
        "planned": w.planned,
        "started": w.start,
        "ended": w.end,
        "wall_s": w.wall_s if w.wall_s is not None else 0.0,
        "planned_length_s": w.planned_length_s,
        "requests": counts(recs),
        "qps": window_series(bi, w, "qps"),
        "output_tokens_per_s": window_series(bi, w, "throughput"),
        # prompt + output tokens (bench serve's "total token throughput"); None: a prompt count unknown
        "total_tokens_per_s": window_series(bi, w, "total_throughput"),
        "in_flight": window_series(bi, w, "in_flight"),
        "ttft": dist_summary(recs, "ttft"),
        "itl": dist_summary(recs, "itl"),
        "tpot": dist_summary(recs, "tpot"),
        "latency": dist_summary(recs, "latency"),
        "trace_coverage": cov,
        "traced": traced,
        "terminal_reasons": terminal_reasons(bi, recs),
        "errors": errors_by_message(recs),
        "rss": _series(series_points(sc, "rss")),
        "gpu_memory": _series(series_points(sc, "gpu_memory")),
        "gpu_memory_device": _series(series_points(sc, "gpu_memory_device")),
        "cpu": _series(series_points(sc, "cpu")),  # server process-tree CPU, 1.0 = one core
        "itl_coalesced": itl_coalesced(recs),
        "client": client_bucket(bi, lv, w, prev),
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
        "scheduled_rate": scheduled_rate(lv),
        "batch_requests": e.get("batch_requests"),
        "shape": e.get("shape") if isinstance(e.get("shape"), Mapping) else None,  # a ramp's, phase's or replay's (manifest)
        "planned_duration_s": e.get("planned_duration_s"),
        "measure_start": ms,
        "measure_end": me,
        "wall_s": (me - ms) if ms is not None and me is not None else None,
        "completed": e.get("completed") is True,
        "sent": e.get("sent"),
        "requests_per_level": _count_summary(lv),
        "requests": counts(recs),
        "ttft": dist_summary(recs, "ttft"),
        "itl": dist_summary(recs, "itl"),
        "tpot": dist_summary(recs, "tpot"),
        "latency": dist_summary(recs, "latency"),
        **sent_summary(lv),
        **peak_summary(lv),
        "trace_coverage": cov,
        "traced": traced,
        "errors": errors_by_message(recs),
        "buckets": [w.index for w in lv.buckets],
        "drift": level_drift(bi, lv),
        "itl_coalesced": itl_coalesced(recs),
        "excluded": excluded(recs, sent=capped(lv.entry)),
        "turns": turn_summary(recs),
        "drain": drain_summary(lv),
    }


def scheduled_rate(lv: LevelIndex) -> float | None:
    """What an open loop offered, per second: the measured requests its schedule put in the
    measured window (sent, held back or not sent alike -- each has its record) over the window's
    wall time, the window `qps` (achieved) is over too. `rate` stays the nominal rate, which a
    seeded random schedule only averages: 40 rps nominal put 444 arrivals in one 10 s window,
    and 43.7 achieved read as the server beating the offer. None for a closed loop or batch,
    a level without a window, or one its count ended (its window runs to the drain, after its
    last arrival: its offer is its n requests, `requests_per_level`)."""
    ms, me = lv.measure_start, lv.measure_end
    if lv.entry.get("mode") != "open" or lv.ended_by_count or ms is None or me is None or me <= ms:
        return None
    return len(lv.records) / (me - ms)


def sent_summary(lv: LevelIndex) -> dict[str, Any]:
    """`sent_ttft` and `sent_latency` (from the send, after the wait for a slot: the server's
    view, bench serve's TTFT and E2EL) of a level that declares max_concurrency; None for any
    other level, where they are ttft and latency less only the load generator's own lateness
    (closed loop: equal), which client_healthy bounds -- a second pair of figures there would
    say nothing a reader needs."""
    if not capped(lv.entry):
        return {"sent_ttft": None, "sent_latency": None}
    return {"sent_ttft": dist_summary(lv.records, "sent_ttft"), "sent_latency": dist_summary(lv.records, "sent_latency")}


def peak_summary(lv: LevelIndex) -> dict[str, int | None]:
    """bench serve's `Peak output token throughput (tok/s)` and `Peak concurrent requests` of the
    level's measured requests that completed (`judge.peaks`: the definitions, and where they
    differ from bench serve's): the fullest second of output tokens from its measure_start,
    counted as the records were read (the table's `token_seconds`), and the most of them in
    flight at one instant, [start, end) swept. None where nothing was counted (no completed
    request, a run without streaming, a level without a measure_start)."""
    recs = lv.records
    tables = {id(t): t for t, _ in recs.parts}
    bins = None
    if len(tables) == 1:
        got = next(iter(tables.values())).token_seconds
        bins = got.get((lv.workload, lv.index)) if got is not None else None
        if bins is not None:
            bins = _believed(lv, bins)
    done = recs.where(lambda t, idx: t.label_is("outcome", "completed", idx), lambda r: r.get("outcome") == "completed")
    start = done.map(lambda t, idx: t.f["start"][idx], lambda r: num(r.get("start")))
    end = done.map(lambda t, idx: t.f["end"][idx], lambda r: num(r.get("end")))
    return {"peak_output_tokens_per_s": peaks.peak_tokens(bins),
            "peak_concurrent_requests": peaks.peak_concurrency(np.asarray(start, dtype=np.float64),
                                                              np.asarray(end, dtype=np.float64))}


def _believed(lv: LevelIndex, bins: np.ndarray) -> np.ndarray:
    """The level's token seconds without the first-chunk tokens of the requests the judge flags
    `usage_mismatch` (a usage more than the workload's max_tokens, ...: `rederive.usage_problem`),
    which the loader counted from the claimed count (`peaks.less_claimed`): those the loader
    counted (recorded completed, a first token) that are completed and flagged now. Rare: where
    no request is flagged, a look at the label's distinct values and no pass over the rows."""
    (t, idx), = lv.records.parts
    if not t.label_mask("usage_mismatch", bool).any():
        return bins
    rows = idx[t.recorded_completed(idx) & ~t.usage_ok(idx) & t.label_is("outcome", "completed", idx)]
    origin = peaks.level_origins((lv.entry,)).get((lv.workload, lv.index))
    if origin is None or not len(rows):
        return bins
    ft = np.asarray(t.f["first_token"][rows], dtype=np.float64)
    ok = np.isfinite(ft)
    return peaks.less_claimed(bins, origin, ft[ok], t.first_chunks(rows[ok]))


DRAIN_TOLERANCE_S = 1e-3  # a last bucket this much past its planned end holds no drain worth saying


def drain_summary(lv: LevelIndex) -> dict[str, Any] | None:
    """A level its count ended whose last bucket ran past its planned length (the runner ends
    it at the level's drain, `runner.load.LevelRun.bucket_windows`): that bucket, its wall time
    and planned length, and `ended_late`, how many of the level's measured requests ended after
    its planned end -- the queue's drain (an open loop's arrivals waiting behind
    max_concurrency, a slow last request) that the long bucket holds. None for any other level."""
    listed = [w for w in lv.buckets if w.planned]
    if not listed or not lv.ended_by_count or lv.entry.get("completed") is not True:
        return None
    last = listed[-1]
    if last.start is None or last.end is None or last.planned_length_s is None:
        return None
    nominal = last.start + last.planned_length_s
    if last.end <= nominal + DRAIN_TOLERANCE_S:
        return None
    ends = lv.records.map(lambda t, idx: t.f["end"][idx], lambda r: v if (v := num(r.get("end"))) is not None else np.nan)
    return {"bucket": last.index, "wall_s": last.end - last.start, "planned_length_s": last.planned_length_s,
            "ended_late": int(np.count_nonzero(ends > nominal))}


def _count_summary(lv: LevelIndex) -> dict[str, Any] | None:
    """A count-bounded level's count: `asked` (requests_per_level), `sent` (its measured
    requests sent; `not_sent` where the load generator could not send some) and `ended_by` -- "count" once it sent them all,
    "min_duration" where its min_duration kept it sending past them (`min_duration_s` beside), else "duration" (its
    bound came first, or it was cut short: not complete). None for a level run for its duration."""
    c = lv.count_sent
    if c is None:
        return None
    out: dict[str, Any] = {"asked": c[1], "sent": c[0], "ended_by": lv.ended_by}
    least = lv.entry.get("min_duration_s")
    if isinstance(least, int | float) and not isinstance(least, bool):  # absent without one, as in evidence from before it
        out["min_duration_s"] = least
    if lv.not_sent:  # measured requests the load generator could not send: not among the sent
        out["not_sent"] = lv.not_sent
    return out


MAX_TURNS_LISTED = 20  # multi-turn chat: turns listed one by one in results.json; later ones together


def turn_summary(records: Rows) -> list[dict[str, Any]] | None:
    """Multi-turn chat (`multi_turn = true`): per user turn of the sessions' conversations (1,
    2, ...), its requests' counts and their ttft, latency and prompt_tokens distributions. A
    turn's prompt carries its conversation so far, so its prefill grows while the server's
    prefix cache holds the history: how TTFT goes with the turn is what a multi-turn soak
    shows. Turns past MAX_TURNS_LISTED are one last entry (`and_later`). None where no request
    of `records` has a turn (any other workload)."""
    by_turn = rows_by_turn(records, MAX_TURNS_LISTED)
    if not by_turn:
        return None
    return [{"turn": k, "and_later": k > MAX_TURNS_LISTED, "requests": counts(sel), "ttft": dist_summary(sel, "ttft"),
             "latency": dist_summary(sel, "latency"), "prompt_tokens": dist_summary(sel, "prompt_tokens")} for k, sel in by_turn]


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
        "latency": num(rec.get("latency")) if isinstance(rec, Mapping) else None,
    }


def _lkey(lv: LevelIndex, bucket: int | None = None) -> str:
    k = f"{lv.workload}:{lv.index}"
    return k if bucket is None else f"{k}:{bucket}"


def backend_summary(bi: BackendIndex, required_coverage: float | None = None) -> dict[str, Any]:
    be = bi.evidence
    buckets = [window_summary(bi, lv, w, lv.buckets[i - 1] if i else None) for lv in bi.levels for i, w in enumerate(lv.buckets)]
    by_bucket = {_lkey(lv, w.index): trace_coverage(bi, w.records)[0] for lv in bi.levels for w in lv.buckets}
    known = [v for v in by_bucket.values() if v is not None]
    warm = bi.all_records.where(lambda t, idx: t.i["bucket"][idx] == -1, lambda r: r.get("bucket") == -1)
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
        "server_metrics": server_metrics_section(bi),  # the server's /metrics per bucket (judge/servermetrics.py)
    }


def required_trace_coverage(spec: Any) -> float | None:
    if spec is None:
        return None
    vals = [r.threshold for r in spec.gate.rules if r.expr.metric == "trace_coverage" and r.threshold is not None]
    return max(vals) if vals else None




def _summarize(evidence: Evidence, indexes: Sequence[BackendIndex], required_coverage: float | None) -> dict[str, Any]:
    return {
        "schema_version": SCHEMA_VERSION,
        "run_id": evidence.run_id or "unknown",
        "manifest_sha256": evidence.manifest_sha256,
        "spec_sha256": evidence.spec_sha256,
        "status": evidence.manifest.get("status"),
        "backends": [backend_summary(bi, required_coverage) for bi in indexes],
    }


def summarize_run(run: JudgedRun) -> dict[str, Any]:
    """results.json of a joined run: every backend of its evidence, with the trace coverage
    its spec's gate requires."""
    from soakspec.judge.goodput import level_summary as goodput_summary

    out = _summarize(run.evidence, run.indexes, required_trace_coverage(run.spec))
    if goodput := goodput_summary(run):  # per SLO set the gate names, per level (`soakspec.judge.goodput`)
        out["goodput"] = goodput
    if run.sweep:  # a sweep: the claimable figure and every probe (`soakspec.judge.sweep`)
        out["sweep"] = [r.to_json() for r in run.sweep]
        for r in run.sweep:
            out.setdefault("figures", {})[r.figure] = r.result
    return out


def summarize(evidence: Evidence, spec: Any = None) -> dict[str, Any]:
    """results.json: per backend, per level, per bucket. `spec`, when given, adds the trace
    coverage the gate requires, and the evidence's stored conclusions are re-derived against
    it first (`soakspec.judge.rederive`), as the judge does."""
    if spec is not None:
        from soakspec.judge.rederive import rederive

        evidence = rederive(spec, evidence)
    return _summarize(evidence, index(evidence), required_trace_coverage(spec))
