"""Facts, not labels: what the judge re-derives from the raw fields before it judges anything.

The runner writes some fields that are conclusions drawn from others: a request's `outcome`,
a trace row's `matched`, the follow-up's `passed`, the runtime boundary's `status`. Evidence
edited with its hashes recomputed -- by accident or on purpose -- can change a conclusion
without changing its facts. `rederive(spec, evidence)` draws every such conclusion again:

  outcome    from status, error, finish_reason, token counts, first token, times and the
             level's deadline (`derive_outcome`). A record labelled `completed` whose raw
             fields say otherwise is *mislabeled*: it is judged by its facts (failed, rejected,
             timed out) and the label is reported as malformed evidence. A record without an
             outcome gets the derived one (the judge does not need the label);
  traces     re-matched by the judge with `soakspec.evidence.traces`: from the retained
             server.log (from the run-start offset the manifest records, `server_log_offset`)
             when the backend's traces come from its log, else from the retained trace rows'
             own ids and times; with the gate's ± trace_window. A row marked matched that the
             judge cannot match (stale, out of window, unknown id, fabricated) is reported and
             does not count;
  errors     a matched trace reporting a server-side error for a request (status >= 500, or
             terminal / finish reason "error") makes that request failed, with the trace's
             reason as its error -- the server said it failed, whatever the stream looked like;
  drops      a matched trace saying an attempt of a request ended with its client gone
             (terminal reason "disconnected", "cancelled" or "aborted") while the record says
             completed makes that request disconnected: the server saw an attempt that never
             completed -- a connection dropped and the request silently resent -- and the
             client's record hides it;
  usage      a completed request's reported completion tokens checked against its stream
             (`usage_problem`): never fewer tokens than text chunks, never more than the
             bound on a response's tokens (evidence/record.py `usage_bound`, the bound the
             runner splits ITL within) -- the workload's max_tokens (its largest, when it asks
             for several: the judge does not know which one a request sent), whether or not it
             sets ignore_eos, since no response has more completion tokens than it asked for;
             not a bound per chunk, since a server may legitimately send many tokens a chunk
             (SGLang's and vLLM's `--stream-interval 32`: 32) -- and only for a request whose
             workload (so max_tokens) is unknown, more than MAX_TOKENS_PER_CHUNK per text chunk;
             never a cumulative usage that went down within the stream (the
             record's `usage_decreased`). A request that disagrees keeps its outcome but is flagged
             `usage_mismatch` (the reason): its ITL, TPOT and output tokens are not computed
             from the claimed count (`soakspec.judge.measures`), and throughput counts its
             chunks, a lower bound, instead;
  follow-up  `passed` from the follow-up record's own derived outcome;
  runtime    the boundary status from the spec's declaration, the retained server.log and the
             launched environment the manifest records (`detect_runtime_boundary`).

What is mislabeled goes to `BackendEvidence.mislabeled` (validity reports it: INCONCLUSIVE, or
FAIL under `require completed_run`); the returned evidence carries the derived values, so every
rule, results.json and report reads facts. Pure: no I/O.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

from soakspec.evidence import layout
from soakspec.evidence.ids import IdIndex
from soakspec.evidence.io import EvidenceUnreadable
from soakspec.evidence.record import FAILED_FINISH_REASONS, MAX_TOKENS_PER_CHUNK, usage_bound  # shared with the runner
from soakspec.evidence.runtime import BoundaryText, RuntimeDecl, detect_runtime_boundary
from soakspec import lengths
from soakspec.evidence.traces import (
    DEFAULT_ID_FORMS, Trace, TraceSource, log_boundary_text, log_lines, match_traces, nl_lines, scan_log_rows, scan_rows,
)
import numpy as np

from soakspec.judge.evidence import BackendEvidence, Evidence, StoredTraces
from soakspec.judge.table import MISSING, RequestTable, Rows, fits
from soakspec.judge.tracematch import TableMatch, invertible, kept_payload, label_column, match_rows
from soakspec.lang import simtrace
from soakspec.lang.spec import Backend, Spec

Row = Mapping[str, Any]
DEADLINE_TOLERANCE_S = 0.05  # a completed request may end this much past its deadline (clock steps)
MAX_LISTED = 3  # mislabeled rows named one by one per kind
DEADLINE_PASSED = "deadline passed"


def _num(v: Any) -> float | None:
    from soakspec.judge.index import num

    return num(v)


def derive_outcome(r: Row, deadline_s: float | None = None, max_tokens: int | None = None) -> tuple[str, tuple[str, ...]]:
    """(outcome, the facts that make it not completed) from a record's raw fields: a request
    completed only with HTTP 200, no error, no failing finish_reason (`FAILED_FINISH_REASONS`,
    the runner's: "error", or "abort", a request the engine dropped), output tokens (when it asked for any; the server's
    usage count when it reported one, even if the tokens decoded to empty text), a first
    token (or, without any text chunk, usage tokens whose arrival the stream did not time), an
    end and, with a deadline, an end within it."""
    why: list[str] = []
    outcome = "completed"
    status = r.get("status")
    err = r.get("error")
    if isinstance(status, int) and not isinstance(status, bool):
        if status != 200:
            why.append(f"status {status}")
            outcome = "rejected" if 400 <= status < 500 else "failed"
    else:
        why.append("no HTTP status")
        outcome = "timeout" if isinstance(err, str) and DEADLINE_PASSED in err else "disconnected"
    if isinstance(err, str) and err:
        why.append(f"error {err[:80]!r}")
        if outcome == "completed":
            outcome = "failed"
    fin = r.get("finish_reason")
    if isinstance(fin, str) and fin in FAILED_FINISH_REASONS:
        why.append(f"finish_reason {fin}")
        outcome = "failed" if outcome == "completed" else outcome
    wants_tokens = max_tokens is None or max_tokens > 0
    out_tokens, chunks = _num(r.get("output_tokens")), _num(r.get("chunks"))
    # the server's own count decides (`usage`): >= 1 completion token is an answer even when its
    # tokens decode to no text (`empty_text`); only without usage do the text chunks count
    no_tokens = out_tokens <= 0 if out_tokens is not None else (chunks is not None and chunks <= 0)
    if wants_tokens and no_tokens:
        why.append(f"{int(out_tokens or 0)} tokens in {int(chunks or 0)} chunks")
        outcome = "failed" if outcome == "completed" else outcome
    # no first token: no answer -- unless no text came and the usage counts tokens, whose arrival
    # times the stream did not tell (runner/protocol.py: TTFT and TPOT not measured)
    untimed = chunks is not None and chunks <= 0 and out_tokens is not None and out_tokens >= 1
    if wants_tokens and r.get("first_token") is None and not untimed:
        why.append("no first token")
        outcome = "failed" if outcome == "completed" else outcome
    start, end = _num(r.get("start")), _num(r.get("end"))
    if end is None:
        why.append("no end time")
        outcome = "failed" if outcome == "completed" else outcome
    elif deadline_s is not None and start is not None and end - start > deadline_s + DEADLINE_TOLERANCE_S:
        why.append(f"it ended {end - start:.3g}s after it started, past its {deadline_s:g}s deadline")
        outcome = "timeout" if outcome == "completed" else outcome
    return outcome, tuple(why)


def usage_problem(r: Row, max_tokens: int | None, stream: bool = True) -> str | None:
    """Why a completed request's reported completion tokens cannot be its stream's, or None.
    `max_tokens`: the most its workload asks for (None: unknown). Without streaming there are no
    chunks to compare: only the max_tokens bound applies."""
    if r.get("usage_decreased") is True:  # the runner saw it within the stream (runner/protocol.py)
        return "the stream's cumulative usage.completion_tokens went down"
    n, chunks = _num(r.get("output_tokens")), _num(r.get("chunks"))
    if n is None:
        return None
    cap = usage_bound(max_tokens)
    if cap is not None and n > cap:
        return f"{int(n)} completion tokens reported at max_tokens = {cap} (no response has more)"
    if not stream or chunks is None or chunks <= 0:
        return None
    if n < chunks:
        return f"{int(n)} completion tokens reported for {int(chunks)} text chunks (each chunk carries at least one)"
    if cap is None and n > chunks * MAX_TOKENS_PER_CHUNK:
        return (f"{int(n)} completion tokens reported for {int(chunks)} text chunks (more than {MAX_TOKENS_PER_CHUNK} "
                "a chunk, without a max_tokens to bound them)")
    return None


def server_error(payloads: Sequence[Row]) -> str | None:
    """The server-side error a request's matched traces report, or None."""
    for p in payloads:
        status = p.get("status")
        term = p.get("terminal_reason")
        fin = p.get("finish_reason")
        bad_status = isinstance(status, int) and not isinstance(status, bool) and status >= 500
        if bad_status or term == "error" or fin == "error":
            parts = [f"terminal_reason {term}"] if term is not None else []
            if fin == "error":
                parts.append("finish_reason error")
            if isinstance(status, int) and not isinstance(status, bool):
                parts.append(f"status {status}")
            return "the server's trace reports an error (" + ", ".join(parts) + ")"
    return None


DROPPED = ("disconnected", "cancelled", "aborted")


def server_drop(payloads: Sequence[Row]) -> str | None:
    """The dropped attempt a request's matched traces report, or None."""
    for p in payloads:
        term = p.get("terminal_reason")
        if term in DROPPED:
            return (f"the server's trace shows an attempt of this request ended {term} (terminal_reason {term}): "
                    "a dropped attempt hidden behind a resend")
    return None


# ------------------------------------------------------------------------------ traces


def _trace_config(spec_be: Backend | None, entry: Row, rehearsal: bool) -> tuple[str, str | None, str, tuple[str, ...]]:
    """(source kind, log pattern, id field, id forms) the run matched traces with."""
    recorded_kind = entry.get("kind")
    if spec_be is None:
        ts = entry.get("trace_source")
        return (ts if isinstance(ts, str) else "none"), None, "request_id", DEFAULT_ID_FORMS
    tr = spec_be.traces
    if rehearsal or spec_be.kind == "sim" or recorded_kind == "sim":
        return "log", simtrace.TRACE_PATTERN, tr.id_field, simtrace.ID_FORMS
    return tr.source, tr.pattern, tr.id_field, tr.id_forms


def _stored_traces(rows: Sequence[Row]) -> list[Trace]:
    out = []
    for t in rows:
        tid = t.get("trace_id")
        times = t.get("times")
        ts = tuple(float(x) for x in times if _num(x) is not None) if isinstance(times, list) else ()
        payload = t.get("payload")
        out.append(Trace(None if tid is None else str(tid), ts, payload if isinstance(payload, Mapping) else None,
                         t.get("offset") if isinstance(t.get("offset"), int) else None, str(t.get("source") or "traces.jsonl")))
    return out


def _log_offset(be: BackendEvidence) -> int:
    off = be.entry.get("server_log_offset", 0)
    return off if isinstance(off, int) and not isinstance(off, bool) and off >= 0 else 0


def _log_lines(be: BackendEvidence) -> tuple[Iterable[str], int] | None:
    """The retained server.log written during this run, as lines from its start offset, and
    that offset (None: not kept). On disk it is streamed, never held; an offset past its end
    (truncated or rotated) reads it all, as the runner would."""
    off = _log_offset(be)
    if be.server_log is not None:
        data = be.server_log.encode("utf-8")
        if off > len(data):
            off = 0
        return data[off:].decode("utf-8", "replace").splitlines(keepends=True), off
    if be.server_log_path is not None:
        try:
            return log_lines(be.server_log_path, off)
        except OSError:
            return None
    return None


def _log_text(be: BackendEvidence, trace_pattern: str | None, runtime_pattern: str | None,
              read: BoundaryText | None = None) -> str:
    """The runtime boundary's text of the same lines (`BoundaryText`: not the trace lines, so
    what is held is bounded by server.log's cap): `read`'s, when trace matching's pass over
    the log filled it, else read now."""
    if read is not None and read.complete:
        return read.text()
    got = _log_lines(be)
    if got is None:
        return ""
    return log_boundary_text(nl_lines(got[0]), trace_pattern, runtime_pattern)


def _log_rows(be: BackendEvidence, source: TraceSource, boundary: BoundaryText | None = None) -> Iterator[tuple[Any, ...]] | None:
    """The traces of the retained server.log written during this run, as `scan_rows` yields
    them (None: no log kept): the same lines `_log_lines` gives, found in byte blocks, matched
    as they are read (never a list of every trace). `boundary` is fed the same pass's lines."""
    off = _log_offset(be)
    if be.server_log is not None:
        data = be.server_log.encode("utf-8")
        if off > len(data):
            off = 0
        return scan_rows((data[off:],), source, off, boundary=boundary)
    if be.server_log_path is not None:
        try:
            return scan_log_rows(be.server_log_path, off, source, boundary=boundary)
        except OSError:
            return None
    return None


def _stored_trace_iter(rows: Iterable[Row]) -> Iterator[Trace]:
    for t in rows:
        yield from _stored_traces((t,))


def _match(table: RequestTable, rows: Iterable[tuple[Any, ...]], id_field: str, forms: Sequence[str], window_s: float,
           steps: Sequence[float] = ()) -> TableMatch:
    """Streamed (`tracematch.match_rows`) when the id forms invert, else `match_traces`
    over the request views (every trace held, with the payload fields rules read only),
    converted. `rows`: `(trace_id, times, payload, ...)` per trace. `steps`: the wall-clock
    steps the run recorded (client.jsonl), which a trace may be placed across."""
    if id_field == "request_id" and invertible(forms):
        return match_rows(table, rows, forms, window_s, steps)
    shared: dict[Any, Mapping[str, Any]] = {}
    traces = [Trace(r[0], r[1], kept_payload(r[2], shared) if r[2] is not None else None, None, "") for r in rows]
    match = match_traces(Rows.of(table, np.arange(table.n, dtype=np.int64)), traces, id_field, forms, window_s, steps=steps)
    index = IdIndex(table.ids)
    got = TableMatch(table.n, index)
    got.repeated = index.repeated()
    matched = [a for a in match.assignments if a.matched and a.request_id is not None]
    found = dict(index.rows_many([a.request_id for a in matched]))
    for k, a in enumerate(matched):
        for i in found.get(k, ()):
            got.add(i, kept_payload(a.trace.payload, shared))
    got.unmatched_reason.update({a.request_id: a.reason for a in match.assignments if a.request_id is not None and not a.matched})
    for a in matched:
        if a.wall_step:
            got.stepped[a.wall_step] = got.stepped.get(a.wall_step, 0) + 1
    got.traces = len(match.assignments)
    return got


UNMATCHED_SET_MAX = 1 << 16  # unmatched rows whose ids are held as a set to sift the claims with


def _wrong_claims(traces: StoredTraces, table: RequestTable, match: TableMatch) -> list[str]:
    """The request ids, in row order, that stored trace rows mark matched while the first
    record of that id has no matched trace. Only a claim naming an unmatched record can be
    wrong: with every record matched (the usual case) no claim is read at all."""
    unmatched = np.flatnonzero(match.codes == 0)
    if not len(unmatched):
        return []
    claimed = (rid for rid in traces.matched_ids() if isinstance(rid, str))
    if len(unmatched) <= UNMATCHED_SET_MAX:
        ids = {table.ids[i] for i in unmatched.tolist()}
        claimed = (rid for rid in claimed if rid in ids)
    keys = list(claimed)
    matched = match.codes != 0
    return [rid for rid, i in zip(keys, match.rows_of(keys).tolist()) if i >= 0 and not matched[i]]


def _rematch(be: BackendEvidence, spec_be: Backend | None, window_s: float, rehearsal: bool,
             table: RequestTable, same_spec: bool = True,
             boundary: BoundaryText | None = None) -> tuple[TableMatch | None, list[str]]:
    """The traces as the judge matches them, and what the stored rows claimed wrongly
    (only under the run's own spec: another spec may match with another window or id forms).
    `boundary`, when given, is fed the lines of the pass over server.log (if one is made)."""
    kind, pattern, id_field, forms = _trace_config(spec_be, be.entry, rehearsal)
    if kind == "none":
        return None, []
    rows = _log_rows(be, TraceSource(kind="log", pattern=pattern, id_field=id_field), boundary) if kind == "log" and pattern is not None else None
    if rows is not None:
        basis = "the retained server.log"
    else:
        stored = _stored_trace_iter(be.traces.rows())
        rows = ((t.trace_id, t.times, t.payload) for t in stored)
        basis = "the trace's own id and times"
    match = _match(table, rows, id_field, forms, window_s, be.client.steps)
    # a claim about a request that is not on the record covers nothing (lost records are
    # validity's to report); one about a request that is, the judge must be able to make
    wrong = _wrong_claims(be.traces, table, match)
    notes: list[str] = []
    if wrong and same_spec:
        first = wrong[0]
        reason = match.unmatched_reason.get(first)
        reason_text = {"outside_window": "its times lie outside the request's window",
                       "unknown_id": "no request has its id", "incomplete": "its payload is incomplete"}.get(reason or "", "no such trace")
        notes.append(f"traces.jsonl marks {len(wrong)} trace{'s' if len(wrong) != 1 else ''} matched that the judge "
                     f"cannot match from {basis} (first: {first}: {reason_text}); they do not count")
    return match, notes


# ------------------------------------------------------------------------------ records


def _deadlines(be: BackendEvidence) -> dict[tuple[Any, Any], float]:
    out: dict[tuple[Any, Any], float] = {}
    levels = be.entry.get("levels")
    for lv in levels if isinstance(levels, list) else []:
        if isinstance(lv, Mapping) and (d := _num(lv.get("deadline_s"))) is not None:
            out[(lv.get("workload"), lv.get("index"))] = d
    return out


def _max_tokens(spec: Spec) -> dict[str, int]:
    """The smallest max_tokens each workload asks for (0 tokens is only a failure above 0)."""
    return {w.name: min(w.max_tokens) for w in spec.workloads if w.max_tokens}


def _usage_bounds(spec: Spec) -> dict[str, tuple[int | None, bool]]:
    """Per workload: the largest max_tokens it asks for (None: not known), whether it streams.
    With `max_tokens_from_file` the runner sends the prompt file's lengths when every record
    has one (`plan._prompt_source`), else the workload's max_tokens; a file the judge's spec
    did not read leaves it unknown."""
    return {w.name: (_largest_max_tokens(w), w.stream) for w in spec.workloads}


def _largest_max_tokens(w: Any) -> int | None:
    lens: tuple[int | None, ...] = w.max_tokens
    if w.max_tokens_from_file:
        d = w.dataset
        if d is None:
            return None
        if d.output_lens and all(n is not None for n in d.output_lens):
            lens = d.output_lens
    if not lens or any(n is None for n in lens):
        return None
    # random lengths (`length_range`): the top of the largest max_tokens' range, which a request may draw
    return lengths.largest(lens, w.length_range) if w.length_range else max(lens)  # type: ignore[arg-type,type-var]


def _relabel(r: Row, deadline: float | None, max_tokens: int | None, server: tuple[str, str] | None,
             usage: tuple[int | None, bool] = (None, True)) -> tuple[Row, str | None]:
    """The record judged by its facts, and why its stored label is wrong (None: it is not).
    `server`: (outcome, reason) when the server's own traces say the request did not complete."""
    stored = r.get("outcome")
    derived, why = derive_outcome(r, deadline, max_tokens)
    note = None
    new = r
    if stored is None:
        new = {**r, "outcome": derived}
    elif stored == "completed" and derived != "completed":
        note = f"{r.get('request_id')} is labelled completed but its record says {', '.join(why)}"
        new = {**r, "outcome": derived}
    if server is not None and new.get("outcome") == "completed":
        new = {**new, "outcome": server[0], "error": server[1]}
    if new.get("outcome") == "completed" and not new.get("usage_mismatch"):
        why_usage = usage_problem(new, *usage)
        if why_usage is not None:
            new = {**new, "usage_mismatch": why_usage}
    return new, note


def _followup(f: Mapping[str, Any] | None, deadline: float | None, max_tokens: int | None) -> tuple[Mapping[str, Any] | None, str | None]:
    if f is None:
        return None, None
    rec = f.get("record")
    if not isinstance(rec, Mapping):
        if f.get("passed") is True:
            return {**f, "passed": False, "reason": "followup.json says passed but holds no follow-up record"}, \
                "followup.json says passed but holds no follow-up record"
        return f, None
    derived, why = derive_outcome(rec, deadline, max_tokens)
    if rec.get("outcome") not in (None, "completed") and derived == "completed":
        derived = str(rec.get("outcome"))
    passed = derived == "completed"
    if f.get("passed") is True and not passed:
        reason = f"the follow-up record says {', '.join(why) or derived}"
        return {**f, "passed": False, "reason": reason}, f"followup.json says passed but {reason[4:]}"
    if f.get("passed") is None:  # no stored label: the record decides
        return {**f, "passed": passed, "reason": f.get("reason") or (None if passed else f"the follow-up request {derived}: {', '.join(why)}")}, None
    return f, None


def _runtime(be: BackendEvidence, spec_be: Backend | None, same_spec: bool, rehearsal: bool = False,
             read: BoundaryText | None = None) -> tuple[Mapping[str, Any], str | None]:
    """The backend entry with its runtime boundary re-derived, and a note when the stored one
    disagrees. `read`: the boundary's text, if trace matching's pass over server.log took it."""
    entry = be.entry
    if spec_be is None:
        return entry, None
    rt = spec_be.runtime
    decl = None
    if rt is not None:
        decl = RuntimeDecl(label=rt.label, log_regex=rt.log_pattern, expected_version=rt.version,
                           required_env=tuple((n, None) for n in rt.require_env))
    env = entry.get("env")
    env = {str(k): str(v) for k, v in env.items()} if isinstance(env, Mapping) else {}
    kept = be.server_log is not None or be.server_log_path is not None
    kind, pattern, _, _ = _trace_config(spec_be, entry, rehearsal)
    trace_pattern = pattern if kind == "log" else None
    derived = detect_runtime_boundary(decl, env, lambda: _log_text(be, trace_pattern, rt.log_pattern if rt else None, read)).to_json()
    if not kept and rt is not None and rt.log_pattern:
        derived["details"] = list(derived["details"]) + ["no server.log was retained to confirm it"]
    stored = entry.get("runtime_boundary")
    stored_status = stored.get("status") if isinstance(stored, Mapping) else None
    note = None
    if same_spec and stored_status is not None and stored_status != derived["status"]:
        note = (f"the manifest records runtime boundary status {stored_status!r} but the declaration, the retained "
                f"server.log and the launched environment give {derived['status']!r}")
    derived["stored_status"] = stored_status if stored_status is not None else derived["status"]  # absent: nothing to contradict
    return {**entry, "runtime_boundary": derived}, note


def _server_verdict(payloads: Sequence[Row]) -> tuple[str, str] | None:
    """(outcome, reason) when the server's traces say a request did not complete: an error
    first (failed), else a dropped attempt (disconnected)."""
    if (err := server_error(payloads)) is not None:
        return "failed", err
    if (drop := server_drop(payloads)) is not None:
        return "disconnected", drop
    return None


def _capped(kind: str, notes: list[str]) -> list[str]:
    if len(notes) <= MAX_LISTED:
        return notes
    return notes[:MAX_LISTED] + [f"... and {len(notes) - MAX_LISTED} more {kind}"]


OUTCOME_CODES = ("completed", "failed", "timeout", "rejected", "disconnected")
_C, _F, _T, _R, _D = range(5)


def _per_workload(t: RequestTable, by_workload: Mapping[str, Any], default: Any) -> list[Any]:
    """A workload's setting, per workload code of the table (index it by `t.c["workload"]`)."""
    return [by_workload.get(str(v), default) for v in t.values["workload"]]


ROWS_AT_ONCE = 1 << 17  # rows relabelled per vectorized step: its temporaries stay a few MB at any size


def _clean_parts(t: RequestTable) -> Iterator[np.ndarray]:
    """The rows of `t` without extras, ascending, ROWS_AT_ONCE rows of the table at a time (at
    least one, maybe empty, part): no array of every row's number (4 bytes a request)."""
    dtype = np.int32 if t.n < 2**31 else np.int64
    for a in range(0, max(t.n, 1), ROWS_AT_ONCE):
        yield t.clean(np.arange(a, min(a + ROWS_AT_ONCE, t.n), dtype=dtype))


def _deadline_per_row(t: RequestTable, idx: np.ndarray, deadlines: Mapping[tuple[Any, Any], float]) -> np.ndarray:
    out = np.full(len(idx), np.nan)
    if not deadlines or not len(idx):
        return out
    lvl = t.i["level"][idx]
    for (w, lv), d in reversed(list(deadlines.items())):
        if lv is not None and not fits(lv):
            continue
        out[t.label_is("workload", w, idx) & (lvl == (MISSING if lv is None else lv))] = d
    return out


def _derive_outcomes(t: RequestTable, idx: np.ndarray, deadline: np.ndarray, max_tokens: np.ndarray) -> np.ndarray:
    """`derive_outcome` over the ordinary rows `idx` of a table, vectorized: OUTCOME_CODES
    positions (rows with extras are derived one by one, by `derive_outcome` itself)."""
    st = t.i["status"][idx]
    has = st != MISSING
    o = np.full(len(idx), _C, dtype=np.int8)
    client = (st >= 400) & (st < 500)
    o[has & (st != 200) & client] = _R
    o[has & (st != 200) & ~client] = _F
    ec = t.c["error"][idx]
    err_lut = t.label_mask("error", lambda v: isinstance(v, str) and bool(v))
    late_lut = t.label_mask("error", lambda v: isinstance(v, str) and DEADLINE_PASSED in v)
    err, late = err_lut[ec], late_lut[ec]
    o[~has] = np.where(late[~has], _T, _D)
    wants = np.isnan(max_tokens) | (max_tokens > 0)
    out, ch = t.i["output_tokens"][idx], t.i["chunks"][idx]
    no_tokens = np.where(out != MISSING, out <= 0, (ch != MISSING) & (ch <= 0))
    start, end = t.f["start"][idx], t.f["end"][idx]
    untimed = (ch != MISSING) & (ch <= 0) & (out != MISSING) & (out >= 1)  # as `derive_outcome`
    fin_lut = t.label_mask("finish_reason", lambda v: isinstance(v, str) and v in FAILED_FINISH_REASONS)
    bad_fin = fin_lut[t.c["finish_reason"][idx]] if len(fin_lut) else np.zeros(len(idx), dtype=bool)
    failed = (err | bad_fin | (wants & no_tokens)
              | (wants & np.isnan(t.f["first_token"][idx]) & ~untimed) | np.isnan(end))
    with np.errstate(invalid="ignore"):
        late_end = ~np.isnan(start) & (end - start > deadline + DEADLINE_TOLERANCE_S)
    return np.where(o != _C, o, np.where(failed, _F, np.where(late_end, _T, _C))).astype(np.int8)


def _usage_flags(t: RequestTable, idx: np.ndarray, bounds: Sequence[tuple[int | None, bool]]) -> np.ndarray:
    """`usage_problem(...) is not None` over the ordinary rows `idx`, vectorized (`bounds`: per
    workload code)."""
    if not len(idx):
        return np.zeros(0, dtype=bool)
    wl = t.c["workload"][idx]
    caps = [usage_bound(b[0]) for b in bounds]
    mt = np.array([np.nan if c is None else c for c in caps], dtype=np.float64)[wl]
    stream = np.array([b[1] for b in bounds], dtype=bool)[wl]
    n, ch = t.i["output_tokens"][idx].astype(np.int64), t.i["chunks"][idx].astype(np.int64)
    known = ~np.isnan(mt)
    over_max = known & (n > np.nan_to_num(mt, nan=np.inf))
    nostream = ~stream | (ch == MISSING) | (ch <= 0)
    bad = np.where(nostream, over_max, (n < ch) | (~known & (n > ch * MAX_TOKENS_PER_CHUNK)) | over_max)
    # the runner saw the cumulative usage go down within the stream (`usage_decreased`)
    down = [k for k, v in enumerate(t.values["usage_decreased"]) if v is True]
    decreased = np.isin(t.c["usage_decreased"][idx], down) if down else np.zeros(len(idx), dtype=bool)
    return ((n != MISSING) & bad) | decreased


class _Labels:
    """One label column of a table, changed row by row: the table's own codes until a change,
    then a copy (one byte a code while there are at most 256 values, four beyond). A column
    that nothing changes -- the usual case: the runner's labels are right -- is never copied
    (three int32 copies were 12 bytes a request while the join re-derived them)."""

    def __init__(self, t: RequestTable, key: str) -> None:
        self.base = t.c[key]
        self._own: np.ndarray | None = None
        self.values = list(t.values[key])
        self.index = {(type(v).__name__, v): k for k, v in enumerate(self.values)}

    @property
    def codes(self) -> np.ndarray:
        return self.base if self._own is None else self._own

    def code(self, v: Any) -> int:
        k = (type(v).__name__, v)
        c = self.index.get(k)
        if c is None:
            c = self.index[k] = len(self.values)
            self.values.append(v)
        return c

    def _writable(self, c: int) -> np.ndarray:
        if self._own is None:
            self._own = np.array(self.base, dtype=np.uint8 if len(self.values) <= 256 else np.int32)
        elif c > 255 and self._own.dtype == np.uint8:
            self._own = self._own.astype(np.int32)
        return self._own

    def set(self, i: int, v: Any) -> None:
        c = self.code(v)
        if self.codes[i] != c:
            self._writable(c)[i] = c

    def set_many(self, rows: np.ndarray, v: Any) -> None:
        c = self.code(v)
        if len(rows) and not (self.codes[rows] == c).all():
            self._writable(c)[rows] = c

    def done(self) -> tuple[np.ndarray, tuple[Any, ...]]:
        return self.codes, tuple(self.values)


def _relabel_table(t: RequestTable, deadlines: Mapping[tuple[Any, Any], float], max_tokens: Mapping[str, int],
                   bounds: Mapping[str, tuple[int | None, bool]],
                   verdicts: Mapping[str, tuple[str, str]]) -> tuple[RequestTable, list[str]]:
    """`_relabel` over every request of a table: the derived outcomes, errors and usage flags
    as new label columns (the table itself is not changed), and the mislabeled-record notes."""
    outcome, error, usage = _Labels(t, "outcome"), _Labels(t, "error"), _Labels(t, "usage_mismatch")
    notes: list[tuple[int, str]] = []
    mislabeled = 0
    extras = dict(t.extras)
    # ordinary rows: vectorized, a part at a time
    mt_of = np.array([np.nan if v is None else v for v in _per_workload(t, max_tokens, None)] or [np.nan], dtype=np.float64)
    lut = np.array([OUTCOME_CODES.index(v) if v in OUTCOME_CODES else -1 for v in t.values["outcome"]] or [-1], dtype=np.int8)
    wrong_rows: list[int] = []
    for part in _clean_parts(t):
        mt = mt_of[t.c["workload"][part]]
        derived = _derive_outcomes(t, part, _deadline_per_row(t, part, deadlines), mt)
        s_code = lut[t.c["outcome"][part]] if len(t.values["outcome"]) else np.full(len(part), -1, dtype=np.int8)
        wrong = (s_code == _C) & (derived != _C)
        new = np.where((s_code < 0) | wrong, derived, s_code)
        for k, name in enumerate(OUTCOME_CODES):
            outcome.set_many(part[new == k], name)
        mislabeled += int(wrong.sum())
        if len(wrong_rows) < MAX_LISTED:
            wrong_rows += part[wrong][:MAX_LISTED].tolist()
    for i in wrong_rows[:MAX_LISTED]:
        r = t.rec(i)
        _, why = derive_outcome(r, deadlines.get((r.get("workload"), r.get("level"))), max_tokens.get(str(r.get("workload"))))
        notes.append((i, f"{r.get('request_id')} is labelled completed but its record says {', '.join(why)}"))
    # rows with extras: one by one, by `_relabel` itself
    for i in t.odd_rows.tolist():
        r = t.rec(i)
        w = str(r.get("workload"))
        got, note = _relabel(r, deadlines.get((r.get("workload"), r.get("level"))), max_tokens.get(w),
                             verdicts.get(str(r.get("request_id"))), bounds.get(w, (None, True)))
        ex = dict(extras.get(i, {}))
        for key, lab in (("outcome", outcome), ("error", error), ("usage_mismatch", usage)):
            v = got.get(key)
            if isinstance(v, (str, bool, int, float)) or v is None:
                ex.pop(key, None)
                lab.set(i, v)
            else:
                ex[key] = v
                lab.set(i, None)
        if ex:
            extras[i] = ex
        else:
            extras.pop(i, None)
        if note:
            mislabeled += 1
            notes.append((i, note))
    odd = set(t.odd_rows.tolist())
    # the server's own word: an error or a dropped attempt in a matched trace
    if verdicts:
        done = outcome.code("completed")
        for i, rid in enumerate(t.ids):
            v = verdicts.get(rid)
            if v is not None and i not in odd and outcome.codes[i] == done:
                outcome.set(i, v[0])
                error.set(i, v[1])
    # usage against the stream, for completed requests not flagged already
    done = outcome.code("completed")
    flag_of = np.array([bool(v) for v in usage.values], dtype=bool) if usage.values else None
    bnds = _per_workload(t, bounds, (None, True))
    for part in _clean_parts(t):
        flagged = flag_of[usage.codes[part]] if flag_of is not None else np.zeros(len(part), bool)
        cand = part[(outcome.codes[part] == done) & ~flagged]
        for i in cand[_usage_flags(t, cand, bnds)].tolist():
            r = t.rec(i)
            why_usage = usage_problem(r, *bounds.get(str(r.get("workload")), (None, True)))
            if why_usage is not None:
                usage.set(i, why_usage)
    notes.sort(key=lambda n: n[0])
    texts = [n for _, n in notes][:MAX_LISTED]
    if mislabeled > MAX_LISTED:
        texts.append(f"... and {mislabeled - MAX_LISTED} more mislabeled records")
    return t.with_labels({"outcome": outcome.done(), "error": error.done(), "usage_mismatch": usage.done()}, extras), texts


def rederive_backend(spec: Spec, be: BackendEvidence, *, window_s: float, rehearsal: bool, same_spec: bool,
                     ran: Spec | None = None) -> BackendEvidence:
    """`ran`: the spec the run ran (`ran_spec`), whose workloads' max_tokens and stream are what
    its requests asked for (None: `spec`)."""
    spec_be = next((b for b in spec.backends if b.name == be.name), None)
    deadlines = _deadlines(be)
    sent = ran if ran is not None else spec
    max_tokens = _max_tokens(sent)
    bounds = _usage_bounds(sent)
    table = be.requests
    # the runtime boundary's lines of server.log, taken from trace matching's pass over it
    boundary = BoundaryText(spec_be.runtime.log_pattern) if spec_be is not None and spec_be.runtime is not None else None
    match, trace_notes = _rematch(be, spec_be, window_s, rehearsal, table, same_spec, boundary)
    verdicts: dict[str, tuple[str, str]] = {}
    if match is not None:
        # the server's verdict per distinct payload, then per request that carries it
        by_code = {c: v for c in range(1, len(match.values) + 1)
                   if (p := match.payload(c)) is not None and (v := _server_verdict([p])) is not None}
        if by_code:
            for i in np.nonzero(np.isin(match.codes, list(by_code)))[0].tolist():
                if i not in match.extra:
                    verdicts.setdefault(table.ids[i], by_code[int(match.codes[i])])
        for i, ps in match.extra.items():
            if (v := _server_verdict([p for p in ps if p is not None])) is not None:
                verdicts.setdefault(table.ids[i], v)
        codes, values, multi = label_column(table, match)
        # traces placed across a recorded wall-clock step: trace_coverage says so (a fact, not a fault)
        table = table.with_labels({"trace": (codes, values)},
                                  aux={"trace_multi": multi, "repeated": match.repeated, "wall_stepped": dict(match.stepped)})
    else:
        table = table.with_labels({"trace": (np.zeros(table.n, dtype=np.int32), (None,))}, aux={"trace_multi": {}})
    table, label_notes = _relabel_table(table, deadlines, max_tokens, bounds, verdicts)
    follow_deadline = min(deadlines.values(), default=None)
    followup, fnote = _followup(be.followup, follow_deadline, min(max_tokens.values(), default=None))
    entry, rnote = _runtime(be, spec_be, same_spec, rehearsal, boundary)
    notes = label_notes + trace_notes + ([fnote] if fnote else []) + ([rnote] if rnote else [])
    return dataclasses.replace(be, entry=entry, records=(), table=table, traces=(), followup=followup,
                               mislabeled=be.mislabeled + tuple(notes))


def rederive(spec: Spec, evidence: Evidence, ran: Spec | None = None) -> Evidence:
    """`evidence` with every derived label drawn again from its facts (see the module doc).
    `ran`: the spec the run ran (`judge.workload.ran_spec`), when `spec` is another one (`gate
    --spec`): what its requests asked for -- max_tokens, stream, the bound on a response's
    tokens -- is the run's, not what a newer spec would ask (a max_tokens lowered there flagged
    every request as reporting more tokens than it asked for). None: `spec`."""
    m = evidence.manifest
    rehearsal = m.get("rehearsal") is True
    same_spec = evidence.spec_sha256 is None or evidence.spec_sha256 == spec.sha256
    window = spec.gate.trace_window_s
    backends = tuple(_rederive_readable(spec, evidence, be, window_s=window, rehearsal=rehearsal, same_spec=same_spec, ran=ran)
                     for be in evidence.backends)
    return dataclasses.replace(evidence, backends=backends)


def _tampered_log(evidence: Evidence, be: BackendEvidence) -> bool:
    """Whether `be`'s retained server.log is an artifact verification found changed since the
    manifest was written (or otherwise tampered with: `Integrity.tampered`)."""
    if be.server_log_path is None:
        return False
    rel = f"{layout.BACKENDS}/{be.safe_name}/{os.path.basename(be.server_log_path)}"
    return any(f.path == rel for f in evidence.integrity.tampered)


def _rederive_readable(spec: Spec, evidence: Evidence, be: BackendEvidence, **kw: Any) -> BackendEvidence:
    """`rederive_backend`, where a server.log that does not decompress because it was changed
    after the run (its hash no longer the manifest's) is judged as a log not kept: the changed
    artifact FAILs artifacts_verified, which names it, as an edited requests.jsonl.gz does --
    the hash failure wins over "the evidence cannot be judged" (exit 3, the edit unnamed). A
    log that does not decompress with its hash intact (a killed run's moved part, which no
    manifest lists) still cannot be judged."""
    try:
        return rederive_backend(spec, be, **kw)
    except EvidenceUnreadable:
        if not _tampered_log(evidence, be):
            raise
    return rederive_backend(spec, dataclasses.replace(be, server_log_path=None), **kw)
