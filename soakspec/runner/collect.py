"""After the load: a backend's runtime boundary, traces, follow-up verdict, provenance and its
manifest entry. Synchronous (run in a thread); it never raises -- a failure here (the disk
full, an I/O error reading the log) aborts the run with its reason, the backend's entry holds
what was known without it (`unfinished_entry`, with `collect_error`) and the evidence written
so far stays.
"""

from __future__ import annotations

import itertools
import math
from array import array
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from soakspec.evidence.ids import IdColumn, IdIndex, IdStore
from soakspec.evidence.io import EvidenceFormatError, GzipJsonlWriter, write_json_atomic
from soakspec.evidence.record import iter_record_batches
from soakspec.evidence.redact import record_redactor
from soakspec.evidence.manifest import backend_entry, model_entry, source_entry
from soakspec.evidence.provenance import binary_sha256, git_state
from soakspec.evidence.runtime import BoundaryText, detect_runtime_boundary
from soakspec.evidence import layout
from soakspec.evidence.serverlog import open_log
from soakspec.evidence.traces import (
    Assignment, Trace, TraceMatch, TraceSource, _window, first_fit, id_form_affixes, log_boundary_text, match_traces,
    scan_log,
)
from soakspec.plan import Plan
from soakspec.runner.progress import Progress
from soakspec.runner.recorder import BackendRecorder

NOT_SENT = layout.FOLLOWUP_NOT_SENT


def collect(plan: Plan, rec: BackendRecorder, progress: Progress) -> dict[str, Any]:
    """The backend's manifest entry (see the module docstring)."""
    try:
        return _collect(plan, rec)
    except Exception as e:  # noqa: BLE001 - keep the evidence; say what could not be derived
        error = f"{type(e).__name__}: {e}"
        reason = f"[{rec.name}] could not finish the evidence: {error}"
        progress.error(reason)
        rec.status.collection_failed(reason)
        return unfinished_entry(plan, rec, error)


def unfinished_entry(plan: Plan, rec: BackendRecorder, error: str) -> dict[str, Any]:
    """The manifest entry of a backend whose evidence could not be finished (`collect_error`:
    why), the run being aborted with that reason (`RunStatus.collection_failed`).

    Design: it is a whole `backend_entry` -- every field the manifest schema requires, so the
    final manifest is still validated and written, status `aborted` with the real reason,
    rather than left `running` by a schema error -- built only from what the recorder holds in
    memory: no file is read or written, since the failure may be the disk itself. It keeps the
    levels that ran (and the load's other records: pre-flight, sweep, /metrics, log_file): their
    requests.jsonl.gz was written during the load, and `verify`, the judge and `gate` read it
    as they read any aborted run's. Keeping the entry out instead would leave those files named
    by no entry and the backend judged as never run. What collection derives is absent or
    says it was not: no `trace_source` (read as "none"; the judge re-matches a log's traces
    itself), no follow-up verdict file, the runtime boundary as declared (not looked for in the
    log), the model not fingerprinted, no server binary hash, no commit after the run.
    """
    bp = rec.bp
    not_derived = f"not derived: the evidence could not be finished ({error})"
    rt = bp.runtime
    boundary = None if rt is None else {
        "declared": rt.label, "detected": None, "env_observed": {}, "status": "declared",
        "display": rt.label or "declared", "details": [f"not looked for in the server log: {not_derived}"],
    }  # fmt: skip
    model = {"id": plan.model.id, "revision": plan.model.revision, "path": str(plan.model.path) if plan.model.path is not None else None,
             "fingerprint": None, "fingerprint_files": {}, "reason": f"not fingerprinted: {not_derived}"}  # fmt: skip
    entry = _entry(plan, rec, boundary=boundary, after={"reason": not_derived}, model=model, binary=None)
    entry["collect_error"] = error
    return entry


def _collect(plan: Plan, rec: BackendRecorder) -> dict[str, Any]:
    bp = rec.bp
    la = bp.launch
    # the server no longer writes its log: capped and compressed (server.log.gz), then read
    cut = rec.log_compactor.finish() if rec.server_log.exists() else None
    log_path = layout.server_log_file(rec.layout.backend_dir(rec.name))
    # the runtime boundary's lines of the log (the capped log without its trace lines), taken
    # in trace matching's pass over it, or read lazily if the declaration needs them and that
    # pass did not read this log
    read = BoundaryText(bp.runtime.log_regex) if bp.runtime is not None else None
    trace_source = _traces(plan, rec, log_path, read)
    boundary = detect_runtime_boundary(bp.runtime, dict(la.env), lambda: _log_text(rec, log_path, read) if log_path is not None else "")
    if rec.followup is None:
        rec.followup = {"required": bp.follow_up, "record": None, "passed": False, "reason": NOT_SENT, "server_idle": None}
    write_json_atomic(rec.layout.followup(rec.name), rec.followup)
    repo = plan.source_repo
    entry = _entry(plan, rec, boundary=boundary, after=git_state(repo) if repo is not None else None,
                   model=model_entry(plan.model.id, plan.model.path, plan.model.revision),
                   binary=binary_sha256(rec.argv, la.cwd) if rec.argv and la.kind == "launch" else None)
    entry["trace_source"] = trace_source
    entry["server_log_cut"] = cut
    entry["server_log_moved"] = rec.log_compactor.moved_record()  # what the run's steps moved, or why they stopped
    return entry


def _entry(plan: Plan, rec: BackendRecorder, *, boundary: Any, after: Mapping[str, Any] | None, model: Mapping[str, Any],
           binary: Mapping[str, Any] | None) -> dict[str, Any]:
    """The backend's manifest entry from what the recorder holds and what collection derived
    (`boundary`, the source's state `after` the run, the `model` entry, the server `binary`'s
    hash): one place for both a finished and an unfinished entry, each redacted alike."""
    bp = rec.bp
    la = bp.launch
    server = rec.server
    repo = plan.source_repo
    red = record_redactor()
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
        model=model,
        server_binary={"path": binary.get("path"), "sha256": binary.get("sha256")} if binary else None,
        secrets=red.source,
    )
    entry["levels"] = rec.levels
    # the runner's words, but they may quote the server or a URL (a probe path's ?access_token=)
    entry["aborted_reason"] = red.text(rec.aborted_reason) if rec.aborted_reason is not None else None
    entry["aborted_at"] = rec.aborted_at
    # the server's own log lines: they may print the run's secrets (an auth error quoting its
    # token), so they are redacted as a record's server text is (server.log.gz has them masked),
    # line by line (a secret cut off by the 500-character line limit) and together (a secret the
    # server's log broke across two lines goes from both)
    lines = rec.failure.diagnosis if rec.failure is not None and rec.failure.diagnosis else ()
    entry["crash_diagnosis"] = [red.text(line) for line in red.text("\n".join(lines)).split("\n")] if lines else []
    entry["preflight"] = rec.preflight
    # a launched server's port at readiness: its own, or why not checked; null where no launched
    # server passed readiness (a url backend, one never ready), as server_binary is for a url backend
    entry["port_listener"] = rec.port_listener
    if rec.sweep is not None:
        entry["sweep"] = rec.sweep  # the search: every probe in order, its judgement, the result
    if rec.external_log is not None:
        entry["log_file"] = rec.external_log  # where server.log came from: path, start offset, bytes read
    if rec.metrics_scrape is not None:
        entry["metrics"] = rec.metrics_scrape  # the server's /metrics: status, scrapes, failures (runner/scrape.py)
    entry["planned_levels"] = len(bp.levels)
    entry["timeouts"] = bp.timeouts()
    return entry


def _log_text(rec: BackendRecorder, path: Path, read: BoundaryText | None) -> str:
    """server.log's text for the runtime boundary (`BoundaryText`: every line but the trace
    lines, one per request, so what is held is bounded by the cap): `read`'s when trace
    matching's pass over this log filled it, else read now, streamed."""
    if read is not None and read.complete:
        return read.text()
    tr, rt = rec.bp.traces, rec.bp.runtime
    with open_log(path) as f:
        lines = (raw.decode("utf-8", "replace") for raw in f)
        return log_boundary_text(lines, tr.pattern if tr.source == "log" else None, rt.log_regex if rt is not None else None)


def _traces(plan: Plan, rec: BackendRecorder, log_path: Path | None, boundary: BoundaryText | None = None) -> str:
    """Match the server's traces to the requests; write traces.jsonl.gz; judge the follow-up's idleness.
    `boundary` is fed server.log's lines when the pass over it reads the log the runtime
    boundary is looked for in (`log_path`, from its start).

    Streamed: the log is read once in byte blocks (`scan_log`) and each trace's row is written
    as it is matched, against a compact view of the requests (ids, times, an id index),
    so what is held after a day-long soak is ~30 bytes a request (`_RequestView`), not every request and every
    trace as objects (18 GB at 10^7 requests). Id forms that cannot be inverted (a format spec)
    take `match_traces` over the same traces, streamed too; both give the rows `match_traces` gives."""
    tr = rec.bp.traces
    requests_path = rec.layout.requests(rec.name)
    # pre-flight requests are not in requests.jsonl, but the server traced them: match them too,
    # so that their traces are known as theirs and left out (they are not this run's load)
    preflight = [p["record"] for p in rec.preflight or ()]
    preflight_ids = {r["request_id"] for r in preflight}
    w = GzipJsonlWriter(rec.layout.traces(rec.name))  # one gzip member: closed (and fsynced) whole
    try:
        if tr.source != "none":
            if tr.source == "log":
                src = TraceSource(kind="log", pattern=tr.pattern, id_field=tr.id_field)
                path, offset = log_path or rec.server_log, 0
            else:
                path, offset = Path(tr.file or ""), rec.trace_offset
                src = TraceSource(kind="jsonl", id_field=tr.id_field, name=str(path))
            forms = tuple(id_form_affixes(f) for f in tr.id_forms)
            reqs = _RequestView(tr.id_field, None if None in forms else forms)  # type: ignore[arg-type]
            if requests_path.exists():
                reqs.read(requests_path)
            for r in preflight:
                reqs.add(r.get(tr.id_field), r.get("server_id"), r.get("start"), r.get("end"))
            follow = rec.followup["record"]["request_id"] if rec.followup is not None else None
            feed = boundary if tr.source == "log" and path == log_path and offset == 0 else None
            first_payload = _match_stream(reqs, _trace_chunks(path, offset, src, feed) if path.exists() else iter(()), tr, w,
                                          tr.source == "log", preflight_ids, follow, rec.wall_steps)
            if first_payload is not None and rec.followup is not None:
                if "active" in first_payload and "pending" in first_payload:
                    p = first_payload
                    rec.followup["server_idle"] = int(p.get("active") or 0) <= 1 and int(p.get("pending") or 0) == 0
    finally:
        w.close()
    return tr.source


TRACE_CHUNK = 5_000  # traces matched at a time


def _trace_chunks(path: Path, offset: int, src: TraceSource, boundary: BoundaryText | None = None) -> Iterator[list[Trace]]:
    """The traces of what `path` gained since `offset` (`scan_log`: read once, in byte blocks;
    each trace's offset is its line's byte offset in the file), a chunk at a time; `boundary`
    is fed the same pass's lines."""
    traces = scan_log(path, offset, src, boundary=boundary)
    while chunk := list(itertools.islice(traces, TRACE_CHUNK)):
        yield chunk


class _RequestView:
    """What trace matching reads of each request, compact: its id (`IdStore`: a runner id is a
    stem code and a number, ~6 bytes), start and end (NaN: none), an index of the ids
    (`IdIndex`: ~4 bytes a request for the runner's ids, built once every request is in), and
    the server ids that are not an id form of their own request's id (the index cannot find
    those; a map holds them, usually empty). About 30 bytes a request: at 10^7 requests ~300 MB, not the ~2 GB
    of a list of str and a dict by id. `forms`: the id forms' (prefix, suffix), or None when
    one cannot be inverted (then every server id is kept). Requests are added, then matched:
    none is added once the first trace is looked up."""

    def __init__(self, id_field: str, forms: tuple[tuple[str, str], ...] | None) -> None:
        self.id_field = id_field
        self.forms = forms
        self._store = IdStore()
        self._no_id: set[int] = set()  # requests without an id (held as "" in the store): never matched
        self.n = 0
        self.start = array("d")
        self.end = array("d")
        self.by_server: dict[str, list[int]] = {}
        self._ids: IdColumn | None = None
        self._index: IdIndex | None = None

    def read(self, path: Path) -> None:
        """requests.jsonl.gz, a block at a time. A cut-off last line is skipped, a corrupt whole line raises."""
        bad: list[tuple[int, str | None]] = []
        key = self.id_field
        for _, recs in iter_record_batches(path, bad):
            for r in recs:
                self.add(r.get(key), r.server_id, r.start, r.end)
        corrupt = next(((n, m) for n, m in bad if m is not None), None)
        if corrupt is not None:
            raise EvidenceFormatError(path, *corrupt)

    def add(self, rid: Any, server_id: Any, start: Any, end: Any) -> None:
        assert self._ids is None, "a request added after matching began"
        i = self.n
        self.n += 1
        text = None if rid is None else str(rid)
        if text is None:
            self._no_id.add(i)
        self._store.append("" if text is None else text)
        w = _window({"start": start, "end": end}, 0.0)  # match_traces' rule for a request's window
        self.start.append(w[0] if w is not None else math.nan)
        self.end.append(w[1] if w is not None else math.nan)
        if server_id and text is not None:  # a request without an id is never matched (`match_traces`)
            sid = str(server_id)
            if self.forms is None or not any(sid == pre + text + suf for pre, suf in self.forms):
                self.by_server.setdefault(sid, []).append(i)

    def _column(self) -> IdColumn:
        if self._ids is None:
            self._ids = self._store.finish()
        return self._ids

    def _indexed(self) -> IdIndex:
        if self._index is None:
            self._index = IdIndex(self._column())
        return self._index

    def id_of(self, i: int) -> str | None:
        return None if i in self._no_id else self._column()[i]

    def candidates(self, trace_ids: list[str]) -> list[list[int]]:
        """For each trace id, the requests one of whose forms (or server id) it is, in request
        order; the ids of a chunk looked up at once."""
        assert self.forms is not None
        pos, rows, _ = self._indexed().find_affixed(trace_ids, [(pre, suf, -1) for pre, suf in self.forms])
        found: list[set[int]] = [set() for _ in trace_ids]
        no_id = self._no_id
        for p, r in zip(pos.tolist(), rows.tolist()):
            if r not in no_id:
                found[p].add(r)
        if self.by_server:
            for k, tid in enumerate(trace_ids):
                found[k].update(self.by_server.get(tid, ()))
        return [sorted(f) for f in found]

    def as_rows(self) -> list[dict[str, Any]]:
        """Every request as the dict `match_traces` reads (the general matcher's input)."""
        rows: list[dict[str, Any]] = [{self.id_field: self.id_of(i), "start": self.start[i], "end": self.end[i]}
                                      for i in range(self.n)]
        for sid, idx in self.by_server.items():
            for i in idx:
                rows[i]["server_id"] = sid
        return rows


def _match_stream(reqs: _RequestView, chunks: Iterator[list[Trace]], tr: Any, w: GzipJsonlWriter, in_log: bool,
                  preflight_ids: set[Any], follow: Any, steps: Sequence[float] = ()) -> Mapping[str, Any] | None:
    """Match each chunk's traces as `match_traces` does, writing each trace's row (but a
    pre-flight request's); returns the payload of the follow-up's first matched trace.
    `steps`: the wall-clock steps the run recorded (`evidence.traces.wall_steps`)."""
    follow_first: list[Trace] = []
    if reqs.forms is None:  # not invertible: the general matcher, over every request as a dict
        rows = reqs.as_rows()
        assign = lambda traces: match_traces(rows, traces, tr.id_field, tr.id_forms, tr.window_s, steps=steps).assignments  # noqa: E731
    else:
        assign = lambda traces: _assign(reqs, traces, tr.window_s, steps)  # noqa: E731
    for traces in chunks:
        for a in assign(traces):
            if a.matched and not follow_first and follow is not None and a.request_id == str(follow):
                follow_first.append(a.trace)
            if a.request_id is not None and a.request_id in preflight_ids:
                continue
            w.write(_row(a, in_log))
    return follow_first[0].payload if follow_first else None


def _assign(reqs: _RequestView, traces: list[Trace], window_s: float, steps: Sequence[float] = ()) -> Iterator[Assignment]:
    start, end = reqs.start, reqs.end
    cands_of = iter(reqs.candidates([t.trace_id for t in traces if t.trace_id is not None]))
    for t in traces:
        checked = bool(t.times)
        if t.trace_id is None:
            yield Assignment(t, None, "no_id", checked)
            continue
        cands = next(cands_of)
        if not cands:
            yield Assignment(t, None, "unknown_id", checked)
            continue
        # as stamped, else across a recorded wall-clock step: `match_traces`' own choice
        chosen, step = first_fit(t.times, [(i, (s - window_s, end[i] + window_s) if s == s else None)
                                           for i in cands for s in (start[i],)], steps)
        if chosen is None:
            yield Assignment(t, reqs.id_of(cands[0]), "outside_window", checked)
        else:
            yield Assignment(t, reqs.id_of(chosen), None, checked, step)


def _row(a: Assignment, in_log: bool) -> dict[str, Any]:
    """One line of traces.jsonl.gz (`TraceMatch.records`)."""
    return TraceMatch((a,), ()).records(in_log=in_log)[0]


__all__ = ["collect"]
