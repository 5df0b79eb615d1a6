"""server.log's size cap keeps the head and the tail, records the cut, and never loses a trace;
compressed (server.log.gz) it reads as it did."""

from __future__ import annotations

import gzip

from hypothesis import given, settings, strategies as st

from soakspec.evidence import layout
from soakspec.evidence.serverlog import CUT_MARKER, cap_server_log, compress_server_log, keep_lines, read_log
from soakspec.evidence.traces import TraceSource, collect_traces, log_lines
from soakspec.lang import simtrace

TRACE = simtrace.TRACE_PREFIX + '{"request_id":"cmpl-r%d-0","client_request_id":"r%d","finished_at":1764500000.5}'

lines_st = st.lists(st.one_of(st.integers(0, 10**6).map(lambda i: TRACE % (i, i)),
                              st.text("abcdefgh \t", max_size=120).map(lambda s: "INFO " + s)), max_size=300)


@settings(max_examples=60, deadline=None)
@given(lines=lines_st, head=st.integers(0, 3000), tail=st.integers(0, 3000), last_newline=st.booleans())
def test_the_cap_keeps_head_tail_and_every_trace(tmp_path_factory, lines, head, tail, last_newline):
    p = tmp_path_factory.mktemp("log") / "server.log"
    text = "\n".join(lines) + ("\n" if last_newline and lines else "")
    p.write_text(text)
    src = TraceSource(kind="log", pattern=simtrace.TRACE_PATTERN)
    before = sorted(t.trace_id for t in collect_traces(p, 0, src)[0])
    cut = cap_server_log(p, keep_lines(simtrace.TRACE_PATTERN), head=head, tail=tail)
    after_text = p.read_text()
    assert sorted(t.trace_id for t in collect_traces(p, 0, src)[0]) == before  # no trace lost
    if cut is None:
        assert after_text == text and len(text.encode()) <= head + tail
        return
    data = text.encode()
    a, b = cut["cut_from"], cut["cut_to"]
    assert a <= head + max(len(x) for x in data.splitlines(keepends=True)) and after_text.encode().startswith(data[:a])
    assert after_text.encode().endswith(data[b:])  # the tail, whole lines
    assert b >= len(data) - tail or b == len(data)
    middle = data[a:b].splitlines(keepends=True)
    kept = [x for x in middle if simtrace.TRACE_PREFIX.encode() in x]
    assert cut["lines_kept_from_cut"] == len(kept) and cut["lines_cut"] == len(middle) - len(kept)
    assert cut["bytes_cut"] == (b - a) - sum(map(len, kept)) and cut["bytes_before"] == len(data)
    assert after_text.count(CUT_MARKER) == 1


def test_a_small_log_is_left_alone(tmp_path):
    p = tmp_path / "server.log"
    p.write_text("hello\n")
    assert cap_server_log(p, keep_lines(None), head=10, tail=10) is None and p.read_text() == "hello\n"


@settings(max_examples=40, deadline=None)
@given(lines=lines_st, offset=st.integers(0, 40_000), last_newline=st.booleans())
def test_the_compressed_log_reads_as_the_plain_one(tmp_path_factory, lines, offset, last_newline):
    """server.log.gz gives the same lines, the same traces at the same (uncompressed) offsets, and
    the same start for a run-start offset -- one past its end reads it all -- as server.log did."""
    d = tmp_path_factory.mktemp("log")
    p = d / layout.SERVER_LOG
    text = "\n".join(lines) + ("\n" if last_newline and lines else "")
    p.write_bytes(text.encode())
    src = TraceSource(kind="log", pattern=simtrace.TRACE_PATTERN)
    plain_lines, plain_start = log_lines(p, offset)
    plain = (list(plain_lines), plain_start, collect_traces(p, offset, src))
    gz = compress_server_log(p)
    assert gz == d / layout.SERVER_LOG_GZ and not p.exists() and layout.server_log_file(d) == gz
    assert read_log(gz) == text.encode()
    gz_lines, gz_start = log_lines(gz, offset)
    assert (list(gz_lines), gz_start, collect_traces(gz, offset, src)) == plain


def test_a_kill_before_compression_ends_leaves_a_readable_log(tmp_path):
    """A run killed while it ran leaves server.log only: readers take it. Killed after the .gz was
    renamed into place but before server.log was removed: both are whole, and the .gz wins. A
    temporary file of a compression that was cut is never taken for the log."""
    d = tmp_path
    (d / layout.SERVER_LOG).write_text("plain\n")
    (d / ".server.log.gz.tmp-1-abcd").write_bytes(b"\x1f\x8b cut")
    assert layout.server_log_file(d) == d / layout.SERVER_LOG and read_log(d / layout.SERVER_LOG) == b"plain\n"
    (d / layout.SERVER_LOG_GZ).write_bytes(gzip.compress(b"whole\n"))
    assert layout.server_log_file(d) == d / layout.SERVER_LOG_GZ and read_log(layout.server_log_file(d)) == b"whole\n"
    (d / layout.SERVER_LOG_GZ).unlink()
    (d / layout.SERVER_LOG).unlink()
    assert layout.server_log_file(d) is None
