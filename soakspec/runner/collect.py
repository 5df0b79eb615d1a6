"""After the load: a backend's runtime boundary, traces, follow-up verdict, provenance and its
manifest entry. Synchronous (run in a thread); it never raises -- what cannot be derived is
said in the entry (`collect_error`) and the evidence written so far stays.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from soakspec.evidence.io import EvidenceFormatError, GzipJsonlWriter, write_json_atomic
from soakspec.evidence.record import iter_records
from soakspec.evidence.manifest import backend_entry, model_entry, source_entry
from soakspec.evidence.provenance import binary_sha256, git_state
from soakspec.evidence.runtime import detect_runtime_boundary
from soakspec.evidence.serverlog import cap_server_log, compress_server_log, keep_lines
from soakspec.evidence.traces import TraceSource, collect_traces, match_traces
from soakspec.plan import Plan
from soakspec.runner.progress import Progress
from soakspec.runner.recorder import BackendRecorder

NOT_SENT = "the follow-up request was not sent (the run ended before it)"


def collect(plan: Plan, rec: BackendRecorder, progress: Progress) -> dict[str, Any]:
    """The backend's manifest entry (see the module docstring)."""
    try:
        return _collect(plan, rec)
    except Exception as e:  # noqa: BLE001 - keep the evidence; say what could not be derived
        progress.error(f"[{rec.name}] could not finish the evidence: {type(e).__name__}: {e}")
        return {"name": rec.name, "collect_error": f"{type(e).__name__}: {e}"}


def _collect(plan: Plan, rec: BackendRecorder) -> dict[str, Any]:
    bp = rec.bp
    la = bp.launch
    log_path = rec.server_log
    cut = _cap_log(rec) if log_path.exists() else None
    # read lazily, only if the declaration needs the log: the capped log without its trace lines
    boundary = detect_runtime_boundary(bp.runtime, dict(la.env), lambda: _log_text(rec) if log_path.exists() else "")
    trace_source = _traces(plan, rec)
    if log_path.exists():  # read above for the last time: capped, it is kept compressed (server.log.gz)
        compress_server_log(log_path)
    if rec.followup is None:
        rec.followup = {"required": bp.follow_up, "record": None, "passed": False, "reason": NOT_SENT, "server_idle": None}
    write_json_atomic(rec.layout.followup(rec.name), rec.followup)
    repo = plan.source_repo
    after = git_state(repo) if repo is not None else None
    binary = binary_sha256(rec.argv, la.cwd) if rec.argv and la.kind == "launch" else None
    server = rec.server
    entry = backend_entry(
        name=rec.name,
        kind=la.kind,
        argv=rec.argv,
        env=dict(la.env),
        cwd=la.cwd if rec.argv is not None else None,
        url=rec.url,
        pid=server.pid if server else None,
        started_at=rec.started_at,
        ready_at=rec.ready_at,
        exit_status=server.exit_status if server else None,
        stop_signal=server.stop_signal if server else None,
        runtime_boundary=boundary,
        source=source_entry(repo, rec.source_before, after) if repo is not None else None,
        model=model_entry(plan.model.id, plan.model.path, plan.model.revision),
        server_binary={"path": binary.get("path"), "sha256": binary.get("sha256")} if binary else None,
    )
    entry["levels"] = rec.levels
    entry["trace_source"] = trace_source
    entry["server_log_cut"] = cut
    entry["aborted_reason"] = rec.aborted_reason
    entry["aborted_at"] = rec.aborted_at
    entry["crash_diagnosis"] = list(rec.failure.diagnosis) if rec.failure is not None else []
    entry["preflight"] = rec.preflight
    if rec.sweep is not None:
        entry["sweep"] = rec.sweep  # the search: every probe in order, its judgement, the result
    if rec.external_log is not None:
        entry["log_file"] = rec.external_log  # where server.log came from: path, start offset, bytes read
    if rec.metrics_scrape is not None:
        entry["metrics"] = rec.metrics_scrape  # the server's /metrics: status, scrapes, failures (runner/scrape.py)
    entry["planned_levels"] = len(bp.levels)
    entry["timeouts"] = bp.timeouts()
    return entry


def _cap_log(rec: BackendRecorder) -> dict[str, Any] | None:
    """Cap server.log (head and tail kept), never cutting a trace or runtime-banner line."""
    tr = rec.bp.traces
    rt = rec.bp.runtime
    keep = keep_lines(tr.pattern if tr.source == "log" else None, getattr(rt, "log_regex", None) if rt else None)
    return cap_server_log(rec.server_log, keep)


def _log_text(rec: BackendRecorder) -> str:
    """server.log's text for the runtime boundary, streamed: every line but the trace lines
    (one per request: a long soak's log is mostly those), so what is held is bounded by the cap;
    a trace line that matches the runtime pattern is kept."""
    tr, rt = rec.bp.traces, rec.bp.runtime
    trace_rx = re.compile(tr.pattern) if tr.source == "log" and tr.pattern else None
    rt_rx = re.compile(rt.log_regex) if rt is not None and getattr(rt, "log_regex", None) else None
    out = []
    with open(rec.server_log, "rb") as f:
        for raw in f:
            line = raw.decode("utf-8", "replace")
            if trace_rx is None or not trace_rx.search(line) or (rt_rx is not None and rt_rx.search(line)):
                out.append(line)
    return "".join(out)


def _traces(plan: Plan, rec: BackendRecorder) -> str:
    """Match the server's traces to the requests; write traces.jsonl.gz; judge the follow-up's idleness."""
    tr = rec.bp.traces
    requests_path = rec.layout.requests(rec.name)
    requests = _match_view(requests_path, tr.id_field) if requests_path.exists() else []
    # pre-flight requests are not in requests.jsonl, but the server traced them: match them too,
    # so that their traces are known as theirs and left out (they are not this run's load)
    preflight = [p["record"] for p in rec.preflight or ()]
    preflight_ids = {r["request_id"] for r in preflight}
    requests += [{k: r[k] for k in (tr.id_field, "server_id", "start", "end") if k in r} for r in preflight]
    rows: list[dict] = []
    if tr.source != "none":
        if tr.source == "log":
            src = TraceSource(kind="log", pattern=tr.pattern, id_field=tr.id_field)
            path, offset = rec.server_log, 0
        else:
            path, offset = Path(tr.file or ""), rec.trace_offset
            src = TraceSource(kind="jsonl", id_field=tr.id_field, name=str(path))
        traces, _bad = collect_traces(path, offset, src) if path.exists() else ([], [])
        match = match_traces(requests, traces, tr.id_field, tr.id_forms, tr.window_s)
        rows = [row for row in match.records(in_log=tr.source == "log") if row["request_id"] not in preflight_ids or row["request_id"] is None]
        if rec.followup is not None:
            ts = match.matched.get(rec.followup["record"]["request_id"])
            if ts and ts[0].payload is not None:
                p = ts[0].payload
                if "active" in p and "pending" in p:
                    rec.followup["server_idle"] = int(p.get("active") or 0) <= 1 and int(p.get("pending") or 0) == 0
    w = GzipJsonlWriter(rec.layout.traces(rec.name))  # one gzip member: closed (and fsynced) whole
    try:
        for row in rows:
            w.write(row)
    finally:
        w.close()
    return tr.source


def _match_view(path: Path, id_field: str) -> list[dict]:
    """The request fields trace matching uses, read one line at a time: a long soak's
    requests.jsonl read whole as dicts takes ~5 KiB per request (850 MiB after 30 minutes
    at 94 requests/s). A cut-off last line is skipped, a corrupt whole line raises."""
    keys = (id_field, "server_id", "start", "end")
    bad: list[tuple[int, str | None]] = []
    out = [{k: r[k] for k in keys if k in r} for _, r in iter_records(path, bad)]
    corrupt = next(((n, m) for n, m in bad if m is not None), None)
    if corrupt is not None:
        raise EvidenceFormatError(path, *corrupt)
    return out


__all__ = ["collect"]
