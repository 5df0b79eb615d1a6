"""The judge's fast trace reading is the reference reading, faster.

`scan_rows` (byte blocks, a marker found before a line is decoded, msgspec, the simulator's
pattern shape without its regex) finds exactly the traces `extract_trace_lines` finds in the
decoded lines -- the same ids, times, payloads and broken lines -- on generated logs with
non-trace lines, odd ids, times in s/ms/us/ns/ISO-8601, malformed payloads, odd line ends,
undecodable bytes, and blocks cut anywhere. `as_epoch`'s fast paths answer as its full parse.
"""

from __future__ import annotations

import datetime as _dt
import gzip
import json

from hypothesis import example, given, settings, strategies as st

from soakspec.evidence import traces as T
from soakspec.evidence.runtime import BoundaryText, RuntimeDecl, boundary_text, detect_runtime_boundary
from soakspec.evidence.traces import (
    Trace, TraceSource, collect_traces, extract_trace_lines, scan_log, scan_rows, trace_line_test,
)
from soakspec.lang import simtrace


def scan_blocks(blocks, source, base_offset=0, compact=None, malformed=None):
    """`scan_rows`' rows as `Trace`s (what `scan_log` yields for a file)."""
    return [Trace(*row, source.name) for row in scan_rows(blocks, source, base_offset, compact, malformed)]

T0 = 1_747_000_000.0
_MIN, _MAX = 946_684_800.0, 4_102_444_800.0


def reference_as_epoch(value):
    """`as_epoch` as it was before its fast paths (the full parse of every value)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, str):
        try:
            dt = _dt.datetime.fromisoformat(value.strip().replace("Z", "+00:00"))
        except ValueError:
            try:
                value = float(value)
            except ValueError:
                return None
        else:
            if dt.tzinfo is None:
                dt = dt.replace(tzinfo=_dt.timezone.utc)
            value = dt.timestamp()
    if not isinstance(value, (int, float)) or value != value:
        return None
    if isinstance(value, int) and abs(value) > 10**30:
        return None
    for scale in (1.0, 1e3, 1e6, 1e9):
        t = value / scale
        if _MIN <= t <= _MAX:
            return float(t)
    return None


def _same(a, b) -> bool:
    return (a is None and b is None) or (a is not None and b is not None and (a == b or (a != a and b != b)))


times_st = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.floats(T0 - 1e6, T0 + 1e6),
    st.sampled_from([T0 * 1e3, T0 * 1e6, T0 * 1e9, _MIN, _MAX, _MIN - 1e-6, _MAX * 1e9, -T0]),
    st.integers(),
    st.integers(int(_MIN), int(_MAX * 1e9)),
    st.integers(-(10**40), 10**40),
)
text_times_st = st.one_of(
    st.text(max_size=12),
    st.sampled_from(["2025-05-11T21:46:40Z", " 2025-05-11T21:46:40+02:00", "20250511T214640", "1747000000.5",
                     "+1747000000", "-1", ".5e9", "inf", "nan", "Infinity", "1_747_000_000", "\u0661\u0667\u0664",
                     "", " ", "\t1747000000", "Z", "cmpl-abc", "/v1/completions", "2025-13-01", "\uff11\uff17"]),
    st.builds(lambda c, rest: c + rest, st.characters(), st.text(max_size=6)),
)


@settings(max_examples=400, deadline=None)
@given(st.one_of(times_st, text_times_st, st.booleans(), st.none(), st.lists(st.integers(), max_size=1)))
def test_as_epoch_fast_paths_answer_as_the_full_parse(value):
    assert _same(T.as_epoch(value), reference_as_epoch(value))


# --- generated logs -------------------------------------------------------------------------

ids_st = st.one_of(
    st.sampled_from(["cmpl-r1-0", "chatcmpl-r2", "r3", "", "cmpl-ü-0", "id with spaces", "\u2028", "0"]),
    st.text(max_size=10),
    st.integers(-5, 10**20),
    st.none(),
    st.just({"nested": "x"}),
    st.just(["x"]),
    st.booleans(),
    st.floats(allow_nan=False, allow_infinity=False),
)
value_st = st.one_of(times_st.filter(lambda v: not isinstance(v, float) or v == v and abs(v) != float("inf")),
                     text_times_st, st.booleans(), st.none(), ids_st)


@st.composite
def payload_text(draw) -> str:
    """A trace payload's JSON text: mostly a flat object, sometimes nested, huge, or broken."""
    obj = {}
    if draw(st.booleans()):
        obj["request_id"] = draw(ids_st)
    for k in draw(st.lists(st.sampled_from(["queued_at", "finished_at", "t_ms", "ts", "status", "terminal_reason",
                                            "finish_reason", "n", "note", "when"]), max_size=6)):
        obj[k] = draw(value_st)
    kind = draw(st.sampled_from(["flat"] * 6 + ["nested", "deep", "bigint", "array", "broken", "nan", "surrogate",
                                                "dupkey", "spaces", "scalar"]))
    if kind == "nested":
        obj["meta"] = {"t": draw(times_st.filter(lambda v: not isinstance(v, float) or abs(v) < 1e300)), "id": "x"}
    text = json.dumps(obj, allow_nan=False, ensure_ascii=draw(st.booleans())) if kind != "scalar" else "17"
    if kind == "deep":
        depth = draw(st.integers(60, 70))  # `loads` takes at most 64 levels
        text = text[:-1] + (", " if obj else "") + '"d": ' + "[" * depth + "]" * depth + "}"
    elif kind == "bigint":
        text = text[:-1] + (", " if obj else "") + '"big": ' + "9" * draw(st.integers(295, 305)) + "}"
    elif kind == "array":
        text = text[:-1] + (", " if obj else "") + '"xs": [1, 2, {"t": %r}]}' % T0
    elif kind == "broken":
        text = text[: draw(st.integers(0, max(len(text) - 1, 0)))]
    elif kind == "nan":
        text = text[:-1] + (", " if obj else "") + '"x": NaN}'
    elif kind == "surrogate":
        text = text[:-1] + (", " if obj else "") + '"s": "\\ud800"}'
    elif kind == "dupkey":
        text = text[:-1] + (", " if obj else "") + '"request_id": "dup", "queued_at": %r}' % (T0 + 1)
    elif kind == "spaces":
        text = " \t" + text + " "
    return text


noise_st = st.one_of(
    st.sampled_from(["INFO starting", "", "soakspec_sim_trac {x}", "pegainfer_http_trace", "pegainfer_http_trace {",
                     "soakspec_sim_trace {}", "soakspec_sim_trace soakspec_sim_trace {\"a\": 1}", "{}", "  ",
                     "Received request cmpl-r1-0, prompt: 'hi'", f"{T0} Received request r3"]),
    st.text(max_size=40),
)
END_ST = st.sampled_from([b"\n"] * 8 + [b"\r\n", b"\r", b"\x0b", b"\x0c", b"\x1c", b"\xc2\x85", b"\xe2\x80\xa8",
                                         b"\r\r\n", b"\x1f\n"])


@st.composite
def log_bytes(draw, marker: str) -> bytes:
    out = []
    for _ in range(draw(st.integers(0, 14))):
        pick = draw(st.integers(0, 9))
        if pick < 5:
            line = (draw(st.sampled_from(["", "INFO ", "x "])) + marker + draw(st.sampled_from([" ", "", "  "]))
                    + draw(payload_text()) + draw(st.sampled_from(["", " tail", "}", " \u00e9"]))).encode("utf-8", "surrogatepass")
        elif pick < 6:
            line = draw(payload_text()).encode("utf-8", "surrogatepass")
        else:
            line = draw(noise_st).encode("utf-8", "surrogatepass")
        if draw(st.integers(0, 15)) == 0:  # undecodable bytes
            at = draw(st.integers(0, len(line)))
            line = line[:at] + draw(st.sampled_from([b"\xff", b"\xc3", b"\xe2\x80", b"\xed\xa0\x80"])) + line[at:]
        out.append(line + draw(END_ST))
    data = b"".join(out)
    if data and draw(st.booleans()):
        data = data.rstrip(b"\n")  # the last line without its line end
    return data


SOURCES = {
    "sim": TraceSource(kind="log", pattern=simtrace.TRACE_PATTERN),
    "sim$": TraceSource(kind="log", pattern=r"soakspec_sim_trace (?P<json>\{.*\})$"),
    "marker": TraceSource(kind="log", marker="pegainfer_http_trace"),
    "jsonl": TraceSource(kind="jsonl", id_field="request_id"),
    "named": TraceSource(kind="log", marker="pegainfer_http_trace", id_field="meta.id", time_fields=("ts", "meta.t")),
    "vllm": TraceSource(kind="log", pattern=r"Received request (?P<id>cmpl-\S+?)(?:,|$)"),
    "ts": TraceSource(kind="log", pattern=r"^(?P<ts>\S+) Received request (?P<id>\S+)"),
    "nolit": TraceSource(kind="log", pattern=r"(?:soakspec_sim_trace|pegainfer_http_trace) ?(?P<json>\{.*\})"),
    "icase": TraceSource(kind="log", pattern=r"(?i)SOAKSPEC_sim_trace (?P<json>\{.*\})"),
}
MARKER_OF = {"sim": "soakspec_sim_trace ", "sim$": "soakspec_sim_trace ", "marker": "pegainfer_http_trace",
             "jsonl": "", "named": "pegainfer_http_trace", "vllm": "Received request cmpl-", "ts": " Received request ",
             "nolit": "pegainfer_http_trace", "icase": "soakspec_sim_trace "}


@st.composite
def cases(draw):
    name = draw(st.sampled_from(sorted(SOURCES)))
    data = draw(log_bytes(MARKER_OF[name]))
    cuts = sorted(draw(st.lists(st.integers(0, len(data)), max_size=5)))
    base = draw(st.integers(0, 10**6))
    return name, data, cuts, base


def _reference(data: bytes, source: TraceSource, base: int):
    """What the judge read before: each "\\n" line decoded, split as `str.splitlines` splits it."""
    lines = [piece for raw in _nl_lines(data) for piece in raw.decode("utf-8", "replace").splitlines(keepends=True)]
    return extract_trace_lines(lines, source, base)


def _nl_lines(data: bytes):
    start = 0
    while start < len(data):
        k = data.find(b"\n", start)
        end = len(data) if k < 0 else k + 1
        yield data[start:end]
        start = end


@settings(max_examples=500, deadline=None)
@given(cases())
@example(("sim", b"soakspec_sim_trace {\"request_id\": \"a\"}\x0bsoakspec_sim_trace {\"request_id\": \"b\"}\n", [7], 0))
@example(("sim", b"x soakspec_sim_trace soakspec_sim_trace {\"request_id\": 1} }\r\n\xffsoakspec_sim_trace {}", [], 5))
def test_the_fast_reading_finds_what_the_reference_finds(case):
    """The same traces (id, times, payload) and the same broken lines, in order, however the
    log is cut into blocks; the offsets too where the log is valid UTF-8 (the fast reading
    gives each line's byte offset in the file; the reference counts re-encoded text)."""
    name, data, cuts, base = case
    source = SOURCES[name]
    ref, ref_bad = _reference(data, source, base)
    blocks = [data[a:b] for a, b in zip([0, *cuts], [*cuts, len(data)])]
    bad: list[tuple[int, str]] = []
    got = list(scan_blocks(blocks, source, base, malformed=bad))
    strip = (lambda t: (t.trace_id, t.times, t.payload, t.source))
    assert [strip(t) for t in got] == [strip(t) for t in ref]
    assert [p for _, p in bad] == [p for _, p in ref_bad]
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return
    assert got == ref and bad == ref_bad


@settings(max_examples=60, deadline=None)
@given(data=log_bytes("soakspec_sim_trace "), offset=st.integers(0, 3000), gz=st.booleans())
def test_scan_log_reads_what_collect_traces_reads(tmp_path_factory, data, offset, gz):
    """From the run-start offset (from 0 when the log is shorter), plain or gzip."""
    p = tmp_path_factory.mktemp("log") / ("server.log.gz" if gz else "server.log")
    p.write_bytes(gzip.compress(data) if gz else data)
    source = SOURCES["sim"]
    ref, _ = collect_traces(p, offset, source)
    got = list(scan_log(p, offset, source))
    strip = (lambda t: (t.trace_id, t.times, t.payload))
    assert [strip(t) for t in got] == [strip(t) for t in ref]


def test_fast_payload_gives_loads_value_or_its_error():
    """msgspec reads more than the bounded `loads` accepts (301-digit integers, 70-deep
    nesting) and less (a lone surrogate escape): both go to `loads`, which decides."""
    from soakspec.evidence.io import loads

    for text in ['{"a": ' + "1" * 301 + "}", '{"a": [' * 1 + "[" * 70 + "]" * 71 + "}", '{"a": "\\ud800"}',
                 '{"a": -' + "1" * 301 + "}", '{"a": 1e400}', '{"a": NaN}', '[1]', '{"a": 1, "a": 2}']:
        try:
            want = ("ok", loads(text))
        except ValueError as e:
            want = ("error", str(e))
        try:
            got = ("ok", T._fast_payload(text)[0])
        except ValueError as e:
            got = ("error", str(e))
        assert got == want, text


def test_the_pattern_shapes_taken_without_a_regex():
    assert T._json_after(simtrace.TRACE_PATTERN) == simtrace.TRACE_PREFIX
    for pattern in [r"soakspec_sim_trace (?P<json>\{.*\})$", r"x(?P<json>\{.*?\})", r"(?i)x(?P<json>\{.*\})",
                    r"(?P<json>\{.*\})", r"x(?P<json>\{.*\})(?P<id>y)", r"x(?P<json>\{.+\})", r"x|(?P<json>\{.*\})"]:
        assert T._json_after(pattern) is None, pattern
    assert T._required_literal(r"\d+ Received request cmpl-(?P<id>\S+)-0") == " Received request cmpl-"
    assert T._required_literal(r"(?i)abc") is None and T._required_literal(r"a|b") is None


def test_a_marker_an_undecodable_byte_would_spell_is_found_as_the_reference_finds_it():
    """A replaced byte decodes to U+FFFD: a marker holding one is not looked for in the bytes."""
    source = TraceSource(kind="log", marker="tr\ufffd")
    data = b'tr\xff {"request_id": "a", "t": %r}\nnoise\n' % T0
    ref, _ = _reference(data, source, 0)
    assert [t.trace_id for t in scan_blocks([data], source)] == [t.trace_id for t in ref] == ["a"]


@st.composite
def ascii_sim_log(draw) -> bytes:
    """A log like the simulator's: ASCII, "\\n" or "\\r\\n" line ends, mostly trace lines."""
    lines = []
    for _ in range(draw(st.integers(1, 20))):
        if draw(st.integers(0, 4)):
            obj = {"request_id": draw(st.sampled_from(["cmpl-r1-0", "r2", "", "x y"])), "queued_at": draw(times_st.filter(
                lambda v: not isinstance(v, float) or abs(v) < 1e300)), "n": draw(st.integers(-3, 10**12)),
                "status": draw(st.sampled_from([200, 500, None, "ok"]))}
            text = "soakspec_sim_trace " + json.dumps(obj, allow_nan=False)
            text = draw(st.sampled_from([text, text + " }", "INFO " + text, text[:-1]]))
        else:
            text = draw(st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=30))
        lines.append(text.encode("ascii") + draw(st.sampled_from([b"\n", b"\n", b"\r\n"])))
    return b"".join(lines)


@settings(max_examples=200, deadline=None)
@given(data=ascii_sim_log(), cut=st.integers(0, 5000), base=st.integers(0, 10**6))
def test_the_simulator_log_read_from_its_bytes_is_the_reference_reading(data, cut, base):
    """The simulator's own log (ASCII, no odd line end): read from the bytes, every field and
    offset as the reference reads them."""
    source = SOURCES["sim"]
    ref, ref_bad = _reference(data, source, base)
    bad: list[tuple[int, str]] = []
    got = list(scan_blocks([data[:cut], data[cut:]], source, base, malformed=bad))
    assert got == ref and bad == ref_bad


# --- the runtime boundary's lines, taken in the same pass -------------------------------------

RUNTIME_PATTERNS = [None, r"NCCL version (?P<version>\d+(?:\.\d+)+)", r'"status": (?P<version>\d+)',
                    r"request_id.: .(?P<version>[a-z0-9]+)", r"(?m)^INFO (\w+)", r"x"]
VERSION_LINES = [b"NCCL version 2.26.2\n", b"INFO NCCL version 2.18.1 (cuda 12)\n", b"NCCL version 2.26.2\r\n"]


@settings(max_examples=400, deadline=None)
@given(case=cases(), runtime=st.sampled_from(RUNTIME_PATTERNS), banners=st.lists(st.tuples(
    st.integers(0, 14), st.sampled_from(VERSION_LINES)), max_size=3))
@example(case=("sim", b'soakspec_sim_trace {"request_id": "a", "status": 200}\n' * 3 + b"tail\n", [40], 0),
         runtime=RUNTIME_PATTERNS[2], banners=[])
@example(case=("vllm", b"Received request cmpl-r1-0, prompt: 'hi'\rReceived request cmpl-r1-0, prompt: 'hi'\n", [], 0),
         runtime=None, banners=[])  # two traces on one "\n" line (CI found it)
def test_the_runtime_boundary_text_taken_while_scanning_is_the_line_by_line_one(case, runtime, banners):
    """The runtime boundary's text `scan_rows` feeds `BoundaryText` as it reads the blocks
    (cut anywhere) is the text `boundary_text` gives line by line: every line but those
    holding a trace (well formed or not), and each trace line with a runtime match not seen
    before. So a runtime pattern that every trace line matches keeps one line per version."""
    name, data, cuts, base = case
    source = SOURCES[name]
    if source.kind != "log" or source.pattern is None:  # what a spec's server.log traces are
        return
    lines = list(_nl_lines(data))
    for at, banner in banners:  # the runtime's own version lines, among the traces
        at = min(at, len(lines))
        if at and not lines[at - 1].endswith(b"\n"):
            at -= 1  # (after the last line only when that has a line end)
        lines.insert(at, banner)
    data = b"".join(lines)
    cuts = [min(c, len(data)) for c in cuts]
    want = boundary_text((ln.decode("utf-8", "replace") for ln in lines), trace_line_test(source), runtime)
    fed = BoundaryText(runtime)
    blocks = [data[a:b] for a, b in zip([0, *cuts], [*cuts, len(data)])]
    list(scan_rows(blocks, source, base, boundary=fed))  # (what it finds is the test above's)
    assert fed.complete
    assert fed.text() == want
    kept_traces = sum(1 for ln in lines if trace_line_test(source)(ln.decode("utf-8", "replace")))
    if runtime is None and kept_traces:
        assert len(want) < len(data.decode("utf-8", "replace"))  # the trace lines are not held


def test_a_pattern_every_trace_line_matches_keeps_one_line_a_version():
    """The simulator's log with the version in each trace line: one trace line kept for each
    version, beside the non-trace lines, and `detect_runtime_boundary` reads the same versions
    from it as from the whole log."""
    line = 'soakspec_sim_trace {"request_id": "r%d", "engine": "v%s", "queued_at": %r}\n'
    data = ("soakspec-sim: listening\n" + "".join(line % (i, "1.2" if i < 500 else "1.3", T0) for i in range(1000))
            + "shutting down\n").encode()
    fed = BoundaryText(r'"engine": "v(?P<version>[\d.]+)"')
    assert len(list(scan_rows([data[:7000], data[7000:]], SOURCES["sim"], 0, boundary=fed))) == 1000
    text = fed.text()
    assert text.count("soakspec_sim_trace") == 2 and text.startswith("soakspec-sim: listening\n")
    assert text.endswith("shutting down\n")
    decl = RuntimeDecl(label="engine v1.2", log_regex=r'"engine": "v(?P<version>[\d.]+)"')
    whole = detect_runtime_boundary(decl, {}, data.decode())
    assert detect_runtime_boundary(decl, {}, text) == whole
    assert whole.status == "contradictory" and "1.2, 1.3" in whole.details[0]


@settings(max_examples=400, deadline=None)
@given(values=st.lists(st.one_of(
    st.integers(), st.sampled_from([946_684_799, 946_684_800, 4_102_444_800, 10**300 - 1, 10**300, -(10**300) + 1, -(10**300),
                                    -(2**53), 2**63, T0 * 1000]),
    st.floats(allow_nan=True, allow_infinity=True), st.sampled_from([T0, T0 * 1e3, T0 * 1e9, -T0, 0.5, 4_102_444_800.0]),
    st.text(max_size=6), st.sampled_from(["2025-01-01T00:00:00Z", "1764500001.5", " 1764500001", "cmpl-1", "/v1", ""]),
    st.booleans(), st.none(), st.just({"t": T0}), st.just([T0])), max_size=20))
def test_a_flat_payloads_times_are_the_reference_times(values):
    """`_flat_times` (run once a trace) reads the times `_times` reads, in order, or answers
    None -- exactly when a value nests or an integer is beyond `loads`' limit (then the
    reference reading decides)."""
    obj = {f"k{j}": v for j, v in enumerate(values)}
    got = T._flat_times(obj)
    limit = any(type(v) is int and abs(v) >= 10**300 for v in values)
    nests = any(type(v) in (dict, list) for v in values)
    if got is None:
        assert nests or limit
    else:
        assert not nests and not limit and got == list(T._times(obj, ()))
