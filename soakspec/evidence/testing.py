"""Test helpers built from the evidence model: sample records and a whole synthetic evidence
directory written the way `soakspec run` writes one. Used by soakspec's own tests (and handy for
the judge's); hypothesis is imported only by the strategy functions.

`build_evidence_dir` leaves exactly the files a run of `sample_spec_text(backends)` against the
embedded simulator leaves (tests/test_evidence_builders.py compares it with a real run): request
lines made by `RequestRecord.to_line`, a server log with the simulator's trace lines (server.log.gz), traces.jsonl.gz
from the runner's trace matcher, telemetry, followup.json in the runner's shape, a finalized,
hashed manifest, and results.json and verdict.json written after it, bound to it by
`manifest_sha256` (so `soakspec verify` accepts them unlisted, as it does a real run's).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from soakspec.evidence import layout
from soakspec.evidence.buckets import lines_for
from soakspec.evidence.io import GzipJsonlWriter, JsonlWriter, RunLock, write_bytes_atomic, write_json_atomic
from soakspec.evidence.manifest import backend_entry, finalize_manifest, new_manifest, write_manifest
from soakspec.evidence.results import write_results, write_verdict
from soakspec.evidence.serverlog import compress_server_log
from soakspec.evidence.traces import TraceSource, collect_traces, match_traces
from soakspec.lang import check, parse, simtrace
from soakspec.units import format_duration

T0 = 1_747_000_000.0  # a fixed wall-clock origin for synthetic runs
from soakspec.evidence.record import FOLLOW_UP_BUCKET, RequestRecord, pack_gaps


def sample_spec_text(backends: Sequence[str] = ("a", "b"), count: int | None = None, min_duration_s: float | None = None) -> str:
    """A spec that checks: one simulated backend per name, the workload `sample_request` rows
    belong to (closed loop, concurrency 4, one 1-minute bucket) and a follow-up request; with
    `count`, its level counted (`requests_per_level`, and `min_duration` where given)."""
    blocks = "".join(
        f'backend "{b}" {{\n  sim {{}}\n  runtime {{\n    label = "host-staged"\n  }}\n}}\n' for b in backends
    )
    return (
        'soak "sample" {\n  issue = "test"\n}\n'
        + blocks
        + 'workload "short" {\n  load {\n    mode = closed\n    concurrency = [4]\n'
        + (f"    requests_per_level = {count}\n" if count is not None else "")
        + (f"    min_duration = {min_duration_s:g}s\n" if count is not None and min_duration_s is not None else "")
        + '  }\n'
        '  duration = 1m\n  bucket = 1m\n  deadline = 30s\n  follow_up = true\n}\n'
        "gate {\n  require failed == 0\n}\n"
        'claims {\n  claim "sample evidence"\n}\n'
    )


SAMPLE_SPEC = sample_spec_text()


def _canonical(text: str) -> str:
    """The text `soakspec run` embeds in its manifest: the checked spec's canonical form (no
    comments), whose hash is `Spec.sha256`."""
    tree, diags = parse(text, "specs/sample.soak")
    spec, more = check(tree, "specs/sample.soak")
    assert spec is not None, diags + more
    return spec.canonical_text


def sample_request(i: int = 0, backend: str = "a", bucket: int = 0, **overrides: Any) -> dict[str, Any]:
    """A completed, valid requests record: `RequestRecord.to_json()`'s keys and values (8 tokens
    in 8 chunks with usage, so `itl_source` is "exact"; gaps in integer microseconds)."""
    start = T0 + i * 0.5
    text = f"output {i}"
    rec: dict[str, Any] = {
        "request_id": f"run1-{backend}-{i:05d}",
        "backend": backend,
        "workload": "short",
        "level": 0,
        "concurrency": 4,
        "rate": None,
        "bucket": bucket,
        "worker": i % 4,
        "intended_start": start,
        "start": start,
        "first_byte": start + 0.01,
        "first_token": start + 0.02,
        "end": start + 0.3,
        "status": 200,
        "outcome": "completed",
        "error": None,
        "finish_reason": "length",
        "server_id": f"cmpl-run1-{backend}-{i:05d}-0",
        "prompt_tokens": 16,
        "output_tokens": 8,
        "tokens_source": "usage",
        "itl_source": "exact",
        "chunks": 8,
        "tpot": 0.04,
        "itl_us": pack_gaps([40000] * 7),  # as the runner writes it (a list is the format before 3)
        "output_sha256": hashlib.sha256(text.encode()).hexdigest(),
        "output_chars": len(text),
        "empty_text": False,
        "coalesced": 0,
        "usage_decreased": False,
        "client_delay": 0.0001,
        "conversation": None,
        "turn": None,
        "admitted": None,
    }
    rec.update(overrides)
    return rec


def sample_results(run_id: str, backends: Sequence[str], per_backend: int) -> dict[str, Any]:
    counts = {"total": per_backend, "completed": per_backend, "failed": 0, "timeout": 0, "rejected": 0, "disconnected": 0}
    return {
        "schema_version": 1,
        "run_id": run_id,
        "backends": [
            {
                "name": b,
                "safe_name": layout.safe_name(b),
                "requests": counts,
                "buckets": [{"bucket": 0, "level": 0, "concurrency": 4, "wall_s": 60.0, "requests": counts,
                             "qps": per_backend / 60.0, "ttft": {"p50": 0.02, "p95": 0.02, "p99": 0.02}}],
                "followup": {"passed": True},
            }
            for b in backends
        ],
    }


def _sim_trace_line(rec: dict[str, Any], active: int) -> str:
    """The line the simulator prints for a finished request (sim/server.py's payload keys)."""
    payload = {
        "request_id": rec["server_id"], "client_request_id": rec["request_id"], "endpoint": "completions",
        "stream": True, "queued_at": rec["start"], "scheduled_at": rec["start"], "first_token_at": rec["first_token"],
        "finished_at": rec["end"], "prompt_tokens": rec["prompt_tokens"], "completion_tokens": rec["output_tokens"],
        "max_tokens": rec["output_tokens"], "finish_reason": rec["finish_reason"], "terminal_reason": "completed",
        "status": rec["status"], "fault": None, "active": active, "pending": 0,
    }
    return simtrace.TRACE_PREFIX + json.dumps(payload, separators=(",", ":")) + "\n"


# What `plan(sample_spec_text())` gives each backend (tests/test_evidence_builders.py checks
# both against the plan; the evidence package does not import the plan).
SAMPLE_TIMEOUTS = {"ready_timeout_s": 600.0, "ready_interval_s": 0.5, "ready_attempt_timeout_s": 2.0,
                   "shutdown_grace_s": 10.0, "kill_wait_s": 5.0, "follow_up_deadline_s": 30.0,
                   "liveness_interval_s": 1.0, "liveness_grace_s": 5.0, "liveness_attempt_timeout_s": 2.0,
                   "liveness_hang_s": 60.0, "liveness_backoff_base_s": 0.05, "liveness_backoff_max_s": 1.0}
SAMPLE_LEVEL = {"workload": "short", "index": 0, "label": "concurrency 4", "mode": "closed", "concurrency": 4, "rate": None,
                "batch_requests": None, "planned_duration_s": 60.0, "bucket_s": 60.0, "warmup_s": 0.0, "deadline_s": 30.0}


def _level_entry(n: int, started: float, count: int | None = None, min_duration_s: float | None = None) -> dict[str, Any]:
    """A manifest level entry for the one level of `sample_spec_text` (a 60 s bucket): the
    plan's `Level.to_json()`, then what happened. `count` (with `min_duration_s`): the entry of
    a counted level (`load { requests_per_level  min_duration }`) that sent its `n` over the
    bucket, its `ended_by` as the runner says it (`LevelRun.ended_by`)."""
    ms = started
    label = SAMPLE_LEVEL["label"] + (f", {count} requests" if count is not None else "")
    label += f", min_duration {format_duration(min_duration_s)}" if count is not None and min_duration_s is not None else ""
    out = dict(SAMPLE_LEVEL, label=label) | {
        "started_at": started, "measure_start": ms, "measure_end": ms + 60.0, "drained_at": ms + 60.5,
        "completed": True, "buckets": [{"index": 0, "start": ms, "end": ms + 60.0, "planned_length_s": 60.0}],
        "sent": n, "mean_in_flight": 4.0,
    }
    if count is not None:
        by = "duration" if n < count else "min_duration" if n > count and min_duration_s is not None else "count"
        out |= {"requests_per_level": count, "measured_sent": n, "ended_by": by}
        if min_duration_s is not None:
            out["min_duration_s"] = min_duration_s
    return out


def sample_client_rows(backend: str, start: float = T0, end: float = T0 + 60.0, lag: float = 0.002, cpu: float = 0.2) -> list[dict[str, Any]]:
    """client.jsonl rows of a load process that kept up (runner/clienthealth.py `HealthSample`):
    windows of at most 60 s (the runner writes one a second; the judge pools any window up to
    `SAMPLE_SPAN_S`) from `start` to `end`, every wake-up `lag` late (a stall, above 10 ms),
    `cpu` of a core busy. By default
    one window over the sample level's one bucket: the builder stays a few records small."""
    rows = []
    a = start
    while a < end:
        t = min(end, a + 60.0)
        wakeups = max(1, int((t - a) / (0.005 + lag)))
        rows.append({"schema_version": 1, "start": a, "t": t, "backend": backend, "process": 0, "wakeups": wakeups,
                     "lag_p50": lag, "lag_p99": lag, "lag_max": lag, "cpu": cpu, "host_cpu": 0.3, "tick_s": 0.005,
                     "stall_s": 0.01, "weight_s": t - a, "stalls": [lag] * wakeups if lag > 0.01 else []})
        a = t
    return rows


def build_evidence_dir(
    run_dir: str | os.PathLike,
    *,
    backends: Sequence[str] = ("a", "b"),
    requests_per_backend: int = 3,
    count: int | None = None,
    min_duration_s: float | None = None,
    status: str = "complete",
    run_id: str = "run1",
) -> dict[str, Any]:
    """Write a small, valid evidence directory like a finished run would; returns its manifest.
    `count` (with `min_duration_s`): its level counted, as `sample_spec_text` writes it.

    `status="running"` stops where a run killed mid-soak stops (the start-of-run manifest, no
    hashes, no results); other statuses finalize the manifest, and a complete run's results
    and verdict follow it."""
    root = Path(run_dir)
    with RunLock(root):
        m = new_manifest(
            run_id=run_id, spec_text=_canonical(sample_spec_text(backends, count, min_duration_s)), spec_path="specs/sample.soak", started_at=T0,
            host={"hostname": "h", "cpu_model": "cpu", "cpu_cores": 2, "memory_total": 1 << 30,
                  "kernel": "6.0", "os": "Linux", "python_version": "3.11", "soakspec_version": "0.1.0"},
            command=["soakspec", "run", "specs/sample.soak"],
        )
        write_manifest(root, m)
        entries = []
        for i, b in enumerate(backends):
            d = layout.RunLayout(root).backend_dir(b)
            d.mkdir(parents=True, exist_ok=True)
            rows = [sample_request(k, backend=b) for k in range(requests_per_backend)]
            end = T0 + requests_per_backend * 0.5 + 1.0
            fu = sample_request(requests_per_backend, backend=b, bucket=FOLLOW_UP_BUCKET, concurrency=1, worker=0,
                                intended_start=end, start=end, first_byte=end + 0.01, first_token=end + 0.02,
                                end=end + 0.3)
            rows.append(fu)
            with GzipJsonlWriter(d / layout.REQUESTS) as w:  # the runner's writer: one batch of `to_line`s
                w.write_lines(b"".join(RequestRecord.from_json(r).to_line() for r in rows))
            with JsonlWriter(d / layout.BUCKETS) as w:  # the recorder's lines (a finished run: every record counted)
                for line in lines_for([_level_entry(requests_per_backend, T0, count, min_duration_s)], [RequestRecord.from_json(r).freeze() for r in rows]):
                    w.write(line)
            log = "soakspec-sim listening on http://127.0.0.1:8000\n" + "".join(
                _sim_trace_line(r, active=1 if r is fu else 4) for r in rows)
            write_bytes_atomic(d / layout.SERVER_LOG, log.encode())
            traces, _bad = collect_traces(d / layout.SERVER_LOG, 0, TraceSource(kind="log", pattern=simtrace.TRACE_PATTERN))
            with GzipJsonlWriter(d / layout.TRACES) as w:  # as the runner's `collect` writes them
                for row in match_traces(rows, traces, "request_id", simtrace.ID_FORMS).records(in_log=True):
                    w.write(row)
            compress_server_log(d / layout.SERVER_LOG)  # server.log.gz, as a finished run leaves it
            with JsonlWriter(d / layout.TELEMETRY, schema="telemetry") as w:
                w.write({"schema_version": 1, "t": T0 + 1, "server_pid": 1000 + i, "server_rss_bytes": 1 << 20, "server_pss_bytes": 1 << 20,
                         "gpus": None,
                         "server_cpu_s": 0.5, "server_cpu_percent": None})
            with JsonlWriter(d / layout.METRICS, schema="metrics") as w:  # one scrape of the simulator's /metrics
                w.write({"schema_version": 1, "t": T0 + 1, "ok": True, "status": 200, "error": None, "seconds": 0.001,
                         "families": {"vllm:num_requests_running": {"type": "gauge", "value": 4.0, "series": 1}}})
            write_json_atomic(d / layout.FOLLOWUP, {"required": True, "record": RequestRecord.from_json(fu).to_json(),
                                                    "passed": True, "reason": None,
                                                    "server_idle": True})
            entry = backend_entry(name=b, kind="sim", argv=["soakspec", "sim", "--port", "8000", "--api-key", "sekrit-123"],
                                  env={"HF_TOKEN": "hf_abcdefghijklmnopqrstuvwxyz"}, url="http://127.0.0.1:8000",
                                  pid=1000 + i, started_at=T0, ready_at=T0 + 1.5, exit_status=0, stop_signal="SIGTERM",
                                  runtime_boundary={"declared": "host-staged", "detected": None, "env_observed": {},
                                                    "status": "declared", "display": "host-staged", "details": []})
            entry.update(levels=[_level_entry(requests_per_backend, T0, count, min_duration_s)], trace_source="log", server_log_cut=None, server_log_moved=None,
                         aborted_reason=None, planned_levels=1, timeouts=dict(SAMPLE_TIMEOUTS),
                         aborted_at=None, crash_diagnosis=[], preflight=None,
                         port_listener={"owner": "server", "via": "server", "pid": 1000 + i, "reason": None},
                         metrics={"path": "/metrics", "interval_s": 5.0, "timeout_s": 2.0, "declared": False,
                                  "status": "scraped", "scrapes": 1, "failed": 0, "first_error": None,
                                  "families": ["vllm:num_requests_running"]})
            entries.append(entry)
        with JsonlWriter(root / layout.CLIENT, schema="client") as w:  # as a run leaves it (runner/clienthealth.py)
            for b in backends:
                for row in sample_client_rows(b):
                    w.write(row)
        if status == "running":  # a run writes its backends into the manifest only when it ends
            return m
        m = dict(m, backends=entries, preflight=True, aborted_at=None, aborts=[])
        final = finalize_manifest(root, m, status, None if status == "complete" else "interrupted", ended_at=T0 + 130)
        if status == "complete":  # like `soakspec run`: judged after the final manifest, bound to it
            from soakspec.evidence.manifest import manifest_sha256

            sha = manifest_sha256(root)
            write_results(root, dict(sample_results(run_id, backends, requests_per_backend), manifest_sha256=sha))
            write_verdict(root, {"schema_version": 1, "run_id": run_id, "manifest_sha256": sha, "verdict": "PASS",
                                 "exit_code": 0, "rules": []})
        return final


# --- hypothesis strategies ------------------------------------------------------------------


def secrets_strategy():
    """Secret-looking values: 8-40 characters that cannot be confused with argv structure."""
    from hypothesis import strategies as st

    return st.text(alphabet="abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.~+", min_size=8, max_size=40)


def append_request_lines(path: str | os.PathLike, *lines: str | bytes) -> None:
    """Append raw lines to a requests.jsonl.gz as one more gzip member (what a run that went on
    writing would add): how tests edit a request file without re-writing it."""
    data = b"".join((ln if isinstance(ln, bytes) else ln.encode()) + (b"" if (ln.endswith(b"\n") if isinstance(ln, bytes)
                    else ln.endswith("\n")) else b"\n") for ln in lines)
    with GzipJsonlWriter(path) as w:
        w.write_lines(data)


def read_request_rows(path: str | os.PathLike) -> list[dict[str, Any]]:
    """The rows of a requests file as plain JSON objects (gzip decompressed, every line)."""
    from soakspec.evidence.io import iter_raw_lines

    return [json.loads(raw) for _, raw in iter_raw_lines(path) if raw.strip()]


def edit_requests(path: str | os.PathLike, edit) -> None:
    """Rewrite a requests.jsonl.gz with `edit(text) -> text` applied to its decompressed text
    (one gzip member): how tests doctor a request file the way an operator could."""
    import gzip

    p = Path(path)
    p.write_bytes(gzip.compress(edit(gzip.decompress(p.read_bytes()).decode("utf-8")).encode("utf-8")))
