"""server.log's size cap keeps the head and the tail, records the cut, and never loses a trace."""

from __future__ import annotations

from hypothesis import given, settings, strategies as st

from soakspec.evidence.serverlog import CUT_MARKER, cap_server_log, keep_lines
from soakspec.evidence.traces import TraceSource, collect_traces
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
