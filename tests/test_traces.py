"""Server traces: only this run's lines count, ids match in their server forms within a window."""

from __future__ import annotations

import json

from soakspec.evidence.testing import T0, sample_request
from soakspec.evidence.traces import (
    TraceSource,
    as_epoch,
    collect_traces,
    coverage_by_bucket,
    extract_traces,
    file_offset,
    match_traces,
    read_since,
    read_slice,
    validate_id_form,
)
from soakspec.evidence import schema

PEGA = TraceSource(marker="pegainfer_http_trace")
SIM = TraceSource(pattern=r"soakspec_sim_trace (?P<json>\{.*\})$")
VLLM = TraceSource(pattern=r"Received request (?P<id>cmpl-\S+?)(?:,|$)")


def trace_line(marker, rid, t, **extra):
    return f"{marker} " + json.dumps({"request_id": rid, "queued_ts": t, "terminal_ts": t + 0.25, **extra}) + "\n"


def reqs(n=3, bucket=0):
    return [sample_request(i, bucket=bucket) for i in range(n)]


def test_read_since_skips_what_an_earlier_run_wrote(tmp_path):
    log = tmp_path / "server.log"
    stale = trace_line("pegainfer_http_trace", "run1-a-00000", T0)
    log.write_text("old banner\n" + stale)
    start = file_offset(log)
    fresh = trace_line("pegainfer_http_trace", "run1-a-00001", T0 + 0.5)
    with open(log, "a") as f:
        f.write("INFO noise\n" + fresh)
    assert read_since(log, start) == "INFO noise\n" + fresh
    traces, malformed = collect_traces(log, start, PEGA)
    assert [t.trace_id for t in traces] == ["run1-a-00001"] and not malformed
    assert traces[0].offset == start + len("INFO noise\n")
    assert file_offset(tmp_path / "missing.log") == 0 and read_since(tmp_path / "missing.log", 0) == ""


def test_truncated_log_is_read_from_the_start(tmp_path):
    log = tmp_path / "server.log"
    log.write_text("a" * 100)
    offset = file_offset(log)
    log.write_text("new\n")
    sl = read_slice(log, offset)
    assert sl.truncated and sl.text == "new\n" and sl.start == 0


def test_extract_marker_regex_and_jsonl_sources():
    text = "x\n" + trace_line("pegainfer_http_trace", "r1", T0) + "pegainfer_http_trace {broken\n"
    traces, malformed = extract_traces(text, PEGA)
    assert [t.trace_id for t in traces] == ["r1"] and traces[0].times == (T0, T0 + 0.25)
    assert len(malformed) == 1 and "not valid JSON" in malformed[0][1]
    traces, _ = extract_traces(trace_line("soakspec_sim_trace", "r2", T0), SIM)
    assert traces[0].trace_id == "r2" and traces[0].payload["request_id"] == "r2"
    jl = json.dumps({"id": 7, "t_ms": int(T0 * 1000)}) + "\n\n"
    traces, _ = extract_traces(jl, TraceSource(kind="jsonl", id_field="id"))
    assert traces[0].trace_id == "7" and traces[0].times == (T0,)


def test_times_are_plausible_epochs_in_any_unit_or_named_fields():
    assert as_epoch(T0) == T0 and as_epoch(T0 * 1e3) == T0 and as_epoch(T0 * 1e9) == T0
    assert as_epoch("2025-05-11T21:46:40Z") == T0 and as_epoch(128) is None and as_epoch(True) is None
    payload = {"request_id": "r", "prompt_tokens": 16, "latency_ms": 250, "done": T0, "nested": {"t": T0 + 1}}
    src = TraceSource(kind="jsonl")
    assert extract_traces(json.dumps(payload), src)[0][0].times == (T0,)
    named = TraceSource(kind="jsonl", time_fields=("nested.t",))
    assert extract_traces(json.dumps(payload), named)[0][0].times == (T0 + 1,)


def test_match_by_id_forms_and_window():
    rs = reqs(3)
    traces, _ = extract_traces(
        trace_line("pegainfer_http_trace", "run1-a-00000", T0 + 0.1)
        + trace_line("pegainfer_http_trace", "cmpl-run1-a-00001", T0 + 0.6)
        + trace_line("pegainfer_http_trace", "cmpl-run1-a-00002-0", T0 + 60)  # too late: stale/foreign
        + trace_line("pegainfer_http_trace", "someone-else", T0)
        + 'pegainfer_http_trace {"queued_ts": 1}\n',
        PEGA,
    )
    m = match_traces(rs, traces)
    assert set(m.matched) == {"run1-a-00000", "run1-a-00001"}
    assert [(a.trace.trace_id, a.reason) for a in m.unmatched] == [
        ("cmpl-run1-a-00002-0", "outside_window"), ("someone-else", "unknown_id"), (None, "no_id")]
    assert m.traceless == ("run1-a-00002",)
    records = m.records()
    assert len(records) == 5 and all(not schema.validate("trace", r) for r in records)
    assert records[2]["request_id"] == "run1-a-00002" and records[2]["matched"] is False


def test_window_edges():
    r = sample_request(0)  # start T0, end T0 + 0.3
    traces, _ = extract_traces(trace_line("t", "run1-a-00000", T0 - 5.0) + trace_line("t", "run1-a-00000", T0 - 5.01),
                               TraceSource(marker="t"))
    m = match_traces([r], traces, window_s=5.0)
    assert [a.reason for a in m.assignments] == [None, "outside_window"]


def test_server_id_from_the_response_also_matches():
    r = sample_request(0, server_id="cmpl-xyz")
    traces, _ = extract_traces(trace_line("t", "cmpl-xyz", T0), TraceSource(marker="t"))
    assert set(match_traces([r], traces).matched) == {"run1-a-00000"}


def test_vllm_regex_only_source_means_the_server_saw_it():
    log = "INFO 05-11 21:46:40 [logger.py:39] Received request cmpl-run1-a-00000-0, prompt: 'hi'\n" \
          "INFO Received request cmpl-run1-a-00001-0\n"
    traces, malformed = extract_traces(log, VLLM)
    assert [t.trace_id for t in traces] == ["cmpl-run1-a-00000-0", "cmpl-run1-a-00001-0"] and not malformed
    assert traces[0].payload is None and traces[0].times == ()
    m = match_traces(reqs(3), traces)
    assert set(m.matched) == {"run1-a-00000", "run1-a-00001"}
    assert all(not a.window_checked for a in m.assignments)
    ts_src = TraceSource(pattern=r"^(?P<ts>\S+) Received request (?P<id>\S+)")
    traces, _ = extract_traces(f"{T0 + 100} Received request run1-a-00000\n", ts_src)
    assert match_traces(reqs(1), traces).unmatched[0].reason == "outside_window"


def test_required_fields_mark_incomplete_traces():
    traces, _ = extract_traces(trace_line("t", "run1-a-00000", T0, finish_reason="length") + trace_line("t", "run1-a-00001", T0 + 0.5),
                               TraceSource(marker="t"))
    m = match_traces(reqs(2), traces, required_fields=("finish_reason",))
    assert set(m.matched) == {"run1-a-00000"} and m.unmatched[0].reason == "incomplete"


def test_coverage_by_bucket_counts_measured_requests_only():
    rs = [sample_request(0, bucket=0), sample_request(1, bucket=0), sample_request(2, bucket=1), sample_request(3, bucket=-1)]
    traces, _ = extract_traces("".join(trace_line("t", f"run1-a-0000{i}", T0 + i * 0.5) for i in (0, 2, 3)), TraceSource(marker="t"))
    cov = coverage_by_bucket(rs, match_traces(rs, traces))
    assert {b: (c.matched, c.measured, c.ratio) for b, c in cov.items()} == {0: (1, 2, 0.5), 1: (1, 1, 1.0)}


def test_source_problems_for_the_compiler():
    assert TraceSource(marker="x").problems() == []
    assert TraceSource(kind="jsonl").problems() == []
    assert "exactly one" in TraceSource().problems()[0]
    assert "named group" in TraceSource(pattern=r"trace (\{.*\})").problems()[0]
    assert "invalid trace pattern" in TraceSource(pattern="(").problems()[0]
    assert "unknown trace source kind" in TraceSource(kind="http").problems()[0]


def test_invalid_sources_and_id_forms_are_refused():
    import pytest

    with pytest.raises(ValueError, match="exactly one"):
        extract_traces("x", TraceSource())
    assert validate_id_form("cmpl-{id}-0") is None
    assert "exactly once" in validate_id_form("cmpl-{rid}")
    assert "exactly once" in validate_id_form("{id}-{id}")
    assert "invalid id form" in validate_id_form("cmpl-{id")


def test_log_trace_rows_point_into_the_log_instead_of_copying_it(tmp_path):
    """A trace read from the evidence's own server.log is stored as its claim and its line's
    offset (no times, no payload: the line holds them); the line at that offset gives the trace
    back, ids and times included. Traces from a file outside the evidence keep both."""
    log = tmp_path / "server.log"
    log.write_text("banner\n" + "".join(trace_line("pegainfer_http_trace", f"run1-a-{i:05d}", T0 + 0.1 * i) for i in range(3)))
    traces, _ = collect_traces(log, 0, PEGA)
    m = match_traces(reqs(3), traces)
    rows = m.records(in_log=True)
    assert all(not schema.validate("trace", r) for r in rows)
    assert all("payload" not in r and "times" not in r for r in rows) and [r["matched"] for r in rows] == [True] * 3
    data = log.read_bytes()
    for row, tr in zip(rows, traces):
        line = data[row["offset"]:].splitlines(keepends=True)[0].decode()
        (again,), _ = extract_traces(line, PEGA, row["offset"])
        assert again == tr and row["trace_id"] == again.trace_id
    full = m.records()
    assert all(r["payload"] is not None and r["times"] for r in full)
