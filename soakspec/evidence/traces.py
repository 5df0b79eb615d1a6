"""Server traces: extract them from what the server wrote during this run, match them to requests.

Sources (`TraceSource`):
- a log with a regex per line: a named group `json` holds a JSON payload; a named group `id`
  gives the id directly (a regex-only source, e.g. vLLM's `Received request cmpl-(?P<id>...)-0`
  with `--enable-log-requests`: no payload, so a match only means "the server saw it"); an
  optional group `ts` gives the time (epoch seconds or ISO-8601);
- a log with a marker: the payload is the JSON after the marker (`pegainfer_http_trace {json}`);
- a JSONL file: one JSON payload per line.

Only what was written after the run started counts: callers record `file_offset(path)` when the
run starts and read with `read_since(path, offset)`, so stale traces from an earlier run can never
attach. A trace matches a request when its id is one of the request's id forms (`{id}`,
`cmpl-{id}`, `cmpl-{id}-0`, `chatcmpl-{id}`, or the server id the response carried) AND every
time in the trace lies in the request's window [start - window, end + window].

Payload times: the fields named by `time_fields`, or else every numeric (or ISO-8601) top-level
field whose value is a plausible Unix time (s, ms, us or ns; years 2000-2100). A trace without
times is matched by id alone (`window_checked` False).
"""

from __future__ import annotations

import bisect
import dataclasses
import datetime as _dt
import json
import math
import os
import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

import msgspec

from soakspec.evidence.io import MAX_INT_DIGITS, loads
from soakspec.evidence.readprogress import ticker
from soakspec.evidence.runtime import BoundaryText, boundary_text

DEFAULT_ID_FORMS = ("{id}", "cmpl-{id}", "cmpl-{id}-0", "chatcmpl-{id}")
DEFAULT_WINDOW_S = 5.0

_EPOCH_MIN = 946_684_800.0  # 2000-01-01
_EPOCH_MAX = 4_102_444_800.0  # 2100-01-01

REASONS = ("unknown_id", "outside_window", "no_id", "incomplete")


# --- the wall clock's steps: a trace placed across one ----------------------------------------
#
# A server stamps its traces by its wall clock; the run's times are the run clock's, anchored to
# the wall clock once (runner/clock.py). When the wall clock is stepped during a run (NTP, an
# operator, a resumed VM), every trace stamped after the step lies off its request's window by
# the step: a window of 5 s would call a step of 10 s every later trace "outside_window" and
# fail trace coverage -- the client machine's clock, judged as the server's fault. The runner
# records the wall clock less the run clock once a second (client.jsonl `wall_step_s`), and a
# trace that fits no candidate's window as stamped is tried again with each recorded step taken
# from its times, the steps in their order (`first_fit`; the judge's `tracematch._take` alike):
# one that fits so is matched, and says by which step (traces.jsonl
# `wall_step_s`; the judge notes how many). The steps are the recorded values to the
# millisecond (smaller differences are the two clocks read a few microseconds apart), without
# 0, the most often recorded first, at most MAX_WALL_STEPS (a clock stepped more often than
# that in one run is not placed beyond its first few steps: the traces then stay outside).

WALL_STEP_RESOLUTION_S = 0.001
MAX_WALL_STEPS = 16


class WallSteps:
    """The distinct wall-clock steps recorded in a run, counted as they are added (a few floats
    whatever the run's length): `add(client.jsonl's wall_step_s)`, then `steps()`."""

    __slots__ = ("_seen",)

    def __init__(self) -> None:
        self._seen: dict[int, int] = {}  # step in milliseconds -> samples that recorded it

    def add(self, value: Any) -> None:
        if type(value) not in (int, float):
            return  # null (not measured), a boolean, anything else
        try:
            ms = value / WALL_STEP_RESOLUTION_S
        except OverflowError:  # an integer beyond a float (JSON integers have no bound)
            return
        if not math.isfinite(ms):  # NaN, or beyond a float in milliseconds: no step a clock makes
            return
        k = round(ms)
        if k != 0:
            self._seen[k] = self._seen.get(k, 0) + 1

    def steps(self) -> tuple[float, ...]:
        """The steps in seconds, the most often recorded first (ties: the smaller step first)."""
        order = sorted(self._seen.items(), key=lambda kv: (-kv[1], abs(kv[0]), kv[0]))
        return tuple(ms * WALL_STEP_RESOLUTION_S for ms, _ in order[:MAX_WALL_STEPS])


def wall_steps(values: Iterable[Any]) -> tuple[float, ...]:
    """`WallSteps.steps()` of client.jsonl's `wall_step_s` values."""
    acc = WallSteps()
    for v in values:
        acc.add(v)
    return acc.steps()


# --- reading only what this run wrote -------------------------------------------------------


def file_offset(path: os.PathLike | str) -> int:
    """Where `path` ends now (0 when it does not exist): record this when the run starts."""
    try:
        return os.stat(path).st_size
    except FileNotFoundError:
        return 0


@dataclasses.dataclass(frozen=True, slots=True)
class LogSlice:
    text: str
    start: int  # byte offset in the file where `text` begins
    end: int
    truncated: bool  # the file shrank below the offset (rotated/truncated): read from 0


def read_slice(path: os.PathLike | str, offset: int) -> LogSlice:
    """The bytes of `path` from `offset` on, decoded as UTF-8 (bad bytes replaced)."""
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            truncated = size < offset
            start = 0 if truncated else offset
            f.seek(start)
            data = f.read()
    except FileNotFoundError:
        return LogSlice("", offset, offset, False)
    return LogSlice(data.decode("utf-8", "replace"), start, start + len(data), truncated)


def read_since(path: os.PathLike | str, offset: int) -> str:
    """The text written to `path` after `offset` (see `read_slice`)."""
    return read_slice(path, offset).text


# --- sources and extraction -----------------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class TraceSource:
    """How to find traces. kind "log": exactly one of `pattern` / `marker`; kind "jsonl": neither."""

    kind: str = "log"
    pattern: str | None = None
    marker: str | None = None
    id_field: str = "request_id"
    time_fields: tuple[str, ...] = ()
    name: str = "server.log"

    def problems(self) -> list[str]:
        """Why this source cannot work (empty when it can); the compiler reports these."""
        out: list[str] = []
        if self.kind not in ("log", "jsonl"):
            return [f"unknown trace source kind {self.kind!r} (log or jsonl)"]
        if self.kind == "jsonl":
            if self.pattern or self.marker:
                out.append("a jsonl trace source takes no pattern or marker")
            return out
        if bool(self.pattern) == bool(self.marker):
            return ["a log trace source needs exactly one of a pattern or a marker"]
        if self.pattern:
            try:
                rx = re.compile(self.pattern)
            except re.error as e:
                return [f"invalid trace pattern: {e}"]
            if "json" not in rx.groupindex and "id" not in rx.groupindex:
                out.append("the trace pattern needs a named group (?P<json>...) or (?P<id>...)")
        return out


@dataclasses.dataclass(frozen=True, slots=True)
class Trace:
    trace_id: str | None
    times: tuple[float, ...]
    payload: Mapping[str, Any] | None
    offset: int | None  # byte offset of the line in its file
    source: str


def _get(obj: Mapping, dotted: str) -> Any:
    cur: Any = obj
    for part in dotted.split("."):
        if not isinstance(cur, Mapping) or part not in cur:
            return None
        cur = cur[part]
    return cur


# A string can be a time only if, stripped, it starts with a digit (ISO-8601, or a number as
# text) or a sign or a point (a number as text): `as_epoch` turns down the rest without
# parsing. Only ASCII is listed; any other first character takes the full parse.
_NOT_A_TIME_START = frozenset(
    [""] + [chr(c) for c in range(0x21, 0x7F) if not chr(c).isdigit() and chr(c) not in "+-."]
)


def as_epoch(value: Any) -> float | None:
    """A plausible Unix time in seconds from seconds/ms/us/ns numbers or ISO-8601 text."""
    kind = type(value)
    if kind is float and _EPOCH_MIN <= value <= _EPOCH_MAX:  # fast path: seconds already
        return value
    if (kind is float or kind is int) and value < _EPOCH_MIN:  # below 2000 at every scale
        return None
    if kind is str and value[:1] in _NOT_A_TIME_START:  # fast path: a word, not a time
        return None
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
    if isinstance(value, int) and abs(value) > 10**30:  # beyond any float time (and float())
        return None
    for scale in (1.0, 1e3, 1e6, 1e9):
        t = value / scale
        if _EPOCH_MIN <= t <= _EPOCH_MAX:
            return float(t)
    return None


def _times(payload: Mapping[str, Any], time_fields: Sequence[str]) -> tuple[float, ...]:
    values = [_get(payload, f) for f in time_fields] if time_fields else payload.values()
    out = []
    for v in values:
        kind = type(v)
        if kind is float or kind is int:  # as `as_epoch`, without the call for most numbers
            if v < _EPOCH_MIN:
                continue
            if kind is float and v <= _EPOCH_MAX:
                out.append(v)
                continue
        elif kind is str:
            if v[:1] in _NOT_A_TIME_START:
                continue
        elif v is None or kind is bool:
            continue
        t = as_epoch(v)
        if t is not None:
            out.append(t)
    return tuple(out)


def extract_traces(
    text: str, source: TraceSource, base_offset: int = 0
) -> tuple[list[Trace], list[tuple[int, str]]]:
    """All traces in `text` (which starts at byte `base_offset` of its file), and the
    `(offset, problem)` of lines that look like traces but do not parse."""
    return extract_trace_lines(text.splitlines(keepends=True), source, base_offset)


def log_lines(path: os.PathLike | str, offset: int) -> tuple[Iterator[str], int]:
    """The lines of `path` (plain or gzip: `server.log.gz`, offsets counted in the uncompressed
    log) from byte `offset` on, streamed (a day-long soak's server.log is never
    held at once), and the offset they start at: 0 when the file is shorter than `offset`
    (truncated or rotated: read it all, as the runner does). Each newline-terminated piece is
    decoded on its own (UTF-8, undecodable bytes replaced -- a newline is never inside a UTF-8
    sequence, so this equals decoding the whole) and split as `str.splitlines` splits, so
    `extract_trace_lines(lines, ...)` finds exactly what `extract_traces` finds in the text."""
    from soakspec.evidence.serverlog import open_log, opened_as_stream, read_errors

    fh = open_log(path)
    try:  # gzip (or a log partly moved out): its length is found by reading up to the offset
        with read_errors(path):
            start = _run_start(fh, opened_as_stream(fh), offset)
    except BaseException:
        fh.close()
        raise

    def gen() -> Iterator[str]:
        with fh, read_errors(path):
            for raw in fh:
                yield from raw.decode("utf-8", "replace").splitlines(keepends=True)

    return gen(), start


class _LineReader:
    """A source's rule for one line: the trace the line holds, why it holds a broken one, or
    None (no trace). `fast`: a payload's JSON is read by `_fast_payload` (the same values as
    `loads`), and the simulator's pattern shape is matched without its regex (`_json_after`)."""

    def __init__(self, source: TraceSource, compact: Callable[[dict[str, Any]], Any] | None,
                 fast: bool = False) -> None:
        problems = source.problems()
        if problems:
            raise ValueError(problems[0])
        self.source = source
        self.compact = compact
        self.decode = _fast_payload if fast else _payload
        self.id_key = source.id_field if "." not in source.id_field else None  # a top-level key: one get
        self.rx = re.compile(source.pattern) if source.kind == "log" and source.pattern else None
        self.json_after = _json_after(source.pattern) if fast and self.rx is not None else None
        self.json_after_ascii = self.json_after.encode() if self.json_after and self.json_after.isascii() else None

    def row(self, body: str, here: int) -> tuple[str | None, tuple[float, ...], Any, int] | str | None:
        """`(trace_id, times, payload, here)` of the trace in `body` (the line without its line
        end; `here`: its byte offset in its file), or why it is broken, or None."""
        source = self.source
        given_id = given_ts = None
        if source.kind == "jsonl":
            if not body.strip():
                return None
            payload_text: str | None = body
        elif (lit := self.json_after) is not None:  # `lit(?P<json>\{.*\})`, found as the regex finds it
            p = body.find(lit)
            while p >= 0 and not body.startswith("{", p + len(lit)):
                p = body.find(lit, p + 1)
            if p < 0:
                return None
            q = p + len(lit)
            r = body.rfind("}")  # `.*` is greedy and the body holds no newline
            if r <= q:
                return None  # no `}` after this `{` -- nor after any later one
            payload_text = body[q:r + 1]
        elif self.rx is not None:
            m = self.rx.search(body)
            if not m:
                return None
            groups = m.groupdict()
            payload_text = groups.get("json")
            given_id, given_ts = groups.get("id"), groups.get("ts")
        else:
            assert source.marker
            idx = body.find(source.marker)
            if idx < 0:
                return None
            payload_text = body[idx + len(source.marker):].strip()
        if payload_text is None:  # regex-only: the server saw this id
            t = as_epoch(given_ts) if given_ts else None
            return (given_id, (t,) if t is not None else (), None, here)
        return self.payload_row(payload_text, here, given_id, given_ts)

    def row_ascii(self, body: bytes, here: int) -> tuple[str | None, tuple[float, ...], Any, int] | str | None:
        """`row` for the simulator's pattern shape (`json_after_ascii`) on an ASCII line's
        bytes (without its line end), which are its text: nothing decoded but the payload."""
        lit = self.json_after_ascii
        assert lit is not None
        p = body.find(lit)
        while p >= 0 and not body.startswith(b"{", p + len(lit)):
            p = body.find(lit, p + 1)
        if p < 0:
            return None
        q = p + len(lit)
        r = body.rfind(b"}")
        if r <= q:
            return None
        return self.payload_row(body[q:r + 1], here, None, None)

    def sim_row(self, payload: bytes, here: int) -> tuple[str | None, tuple[float, ...], Any, int] | str:
        """`payload_row(payload, here, None, None)` in one call, for the simulator's payloads:
        a flat object msgspec decodes, its id a top-level key and its times every value's
        (`_fast_payload`, inline); anything else takes `payload_row`."""
        try:
            obj = _MSGSPEC_JSON.decode(payload)
        except (msgspec.MsgspecError, ValueError, RecursionError):
            return self.payload_row(payload, here, None, None)
        if type(obj) is not dict or self.id_key is None or self.source.time_fields:
            return self.payload_row(payload, here, None, None)
        out = _flat_times(obj)
        if out is None:
            return self.payload_row(payload, here, None, None)
        raw_id = obj.get(self.id_key)
        if type(raw_id) is str:
            trace_id: str | None = raw_id
        else:
            trace_id = None if raw_id is None or isinstance(raw_id, (dict, list)) else str(raw_id)
        return (trace_id, tuple(out), self.compact(obj) if self.compact is not None else obj, here)

    def payload_row(self, payload_text: str | bytes, here: int, given_id: str | None,
                    given_ts: str | None) -> tuple[str | None, tuple[float, ...], Any, int] | str:
        """The row of a payload's JSON text (bytes: ASCII, for `_fast_payload` only)."""
        source = self.source
        try:
            payload, times = self.decode(payload_text)  # bounded: a server's log is not ours to trust
        except json.JSONDecodeError as e:
            return f"trace payload is not valid JSON: {e.msg}"
        if not isinstance(payload, dict):
            return "trace payload is not a JSON object"
        raw_id = payload.get(self.id_key) if self.id_key is not None else _get(payload, source.id_field)
        if type(raw_id) is str:
            trace_id: str | None = raw_id
        else:
            trace_id = None if raw_id is None or isinstance(raw_id, (dict, list)) else str(raw_id)
        if times is None or source.time_fields:
            times = _times(payload, source.time_fields)
        kept = self.compact(payload) if self.compact is not None else payload
        if given_id is not None or given_ts is not None:
            t = as_epoch(given_ts) if given_ts else None
            if given_id is not None:
                trace_id = given_id
            if t is not None:
                times = times + (t,)
        return (trace_id, times, kept, here)


def trace_line_test(source: TraceSource) -> Callable[[str], bool]:
    """Whether a line of the log (up to and with its "\\n") holds a trace of `source`, well
    formed or not: what `scan_rows` reads as a trace line (`BoundaryText`'s rule). A line that
    `str.splitlines` cuts in pieces holds one when a piece does, as `scan_rows` reads it."""
    reader = _LineReader(source, None)

    def test(line: str) -> bool:
        return any(reader.row(piece.rstrip("\r\n"), 0) is not None for piece in line.splitlines(keepends=True))

    return test


def log_boundary_text(lines: Iterable[str], trace_pattern: str | None, runtime_pattern: str | None) -> str:
    """`runtime.boundary_text` of a log's lines ("\\n"-ended) whose traces `trace_pattern` finds
    (None: it holds none): the runner's and the judge's reading when no pass over the log
    for traces took the text already."""
    is_trace = trace_line_test(TraceSource(kind="log", pattern=trace_pattern)) if trace_pattern else None
    return boundary_text(lines, is_trace, runtime_pattern)


def nl_lines(pieces: Iterable[str]) -> Iterator[str]:
    """`log_lines`' pieces joined back into lines that end at "\\n" (the last one may not)."""
    held: list[str] = []
    for piece in pieces:
        held.append(piece)
        if piece.endswith("\n"):
            yield "".join(held)
            held.clear()
    if held:
        yield "".join(held)


def extract_trace_lines(
    lines: Iterable[str], source: TraceSource, base_offset: int = 0,
    compact: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
) -> tuple[list[Trace], list[tuple[int, str]]]:
    """`extract_traces` over lines (each with its line end) that start at byte `base_offset`.
    `compact`, when given, replaces each payload (after its id and times are read) by what the
    caller keeps of it: the judge keeps a few fields, not the server's whole object. This is
    the reference reading (`scan_rows` finds the same traces faster)."""
    reader = _LineReader(source, compact)
    traces: list[Trace] = []
    malformed: list[tuple[int, str]] = []
    offset = base_offset
    name = source.name
    for line in lines:
        here = offset
        offset += len(line.encode("utf-8"))
        got = reader.row(line.rstrip("\r\n"), here)
        if got is None:
            continue
        if type(got) is str:
            malformed.append((here, got))
        else:
            traces.append(Trace(*got, name))
    return traces, malformed


# --- the fast reading: byte blocks, a marker found before anything is decoded ----------------

SCAN_BLOCK = 1 << 20  # bytes of the (uncompressed) log read at a time

_MSGSPEC_JSON = msgspec.json.Decoder()
_BIG_INT = 10**MAX_INT_DIGITS  # `loads` turns down an integer of more digits; msgspec does not


def _payload(text: str | bytes) -> tuple[Any, None]:
    """The reference reading of a payload: `loads` (times are read from it after). Bytes are
    an ASCII line's (`_LineReader.row_ascii`): their text."""
    return loads(text if type(text) is str else text.decode("ascii")), None


def _fast_payload(text: str | bytes) -> tuple[Any, tuple[float, ...] | None]:
    """`(loads(text), _times(it, ()))`: the same value (or the same error) and its times.
    msgspec decodes (about 5x faster than json) a flat object, and its times are read in the
    same pass; what msgspec may read otherwise than `loads` -- anything it turns down, a payload
    that is not an object, nests, or holds an integer beyond `loads`' limit -- goes to `loads`."""
    try:
        obj = _MSGSPEC_JSON.decode(text)
    except (msgspec.MsgspecError, ValueError, RecursionError):
        return _payload(text)
    if type(obj) is not dict:
        return _payload(text)
    out = _flat_times(obj)
    if out is None:
        return _payload(text)
    return obj, tuple(out)


def _flat_times(obj: dict[str, Any], _int=int, _float=float, _str=str, _dict=dict, _list=list, _lo=_EPOCH_MIN,
                _hi=_EPOCH_MAX, _nbig=-_BIG_INT, _big=_BIG_INT, _words=_NOT_A_TIME_START) -> list[float] | None:
    """`_times(obj, ())` of a decoded payload, or None when it is not flat (a value nests) or
    holds an integer beyond `loads`' limit: then it takes the reference reading. (Run once a
    trace: the names it reads are its locals, and ints -- most of a payload's values -- are
    tested first, in one comparison when they are neither a time nor out of bounds.)"""
    out = []
    for v in obj.values():
        kind = type(v)
        if kind is _int:
            if _nbig < v < _lo:
                continue
            if v <= _nbig or v >= _big:
                return None
            if (t := as_epoch(v)) is not None:
                out.append(t)
        elif kind is _float:
            if _lo <= v <= _hi:
                out.append(v)
            elif v > _hi and (t := as_epoch(v)) is not None:
                out.append(t)
        elif kind is _str:
            if v[:1] not in _words and (t := as_epoch(v)) is not None:
                out.append(t)
        elif kind is _dict or kind is _list:
            return None
    return out


def _top_literals(pattern: str) -> list[Any] | None:
    """The parsed top-level items of `pattern` (None: flags that change what a literal matches)."""
    try:
        from re import _parser  # type: ignore[attr-defined]

        parsed = _parser.parse(pattern)
    except Exception:  # noqa: BLE001 - an internal parser's surprise only costs the fast path
        return None
    if parsed.state.flags & (re.IGNORECASE | re.LOCALE):
        return None
    return list(parsed)


def _literal_text(items: Sequence[Any]) -> str:
    return "".join(chr(arg) for _, arg in items)


def _required_literal(pattern: str) -> str | None:
    """The longest run of plain characters every match of `pattern` contains (its top-level
    literals), or None: a line without it cannot match."""
    from re import _constants  # type: ignore[attr-defined]

    items = _top_literals(pattern)
    if items is None:
        return None
    best, run = "", []
    for op, arg in [*items, (None, None)]:
        if op is _constants.LITERAL:
            run.append((op, arg))
            continue
        if len(run) > len(best):
            best = _literal_text(run)
        run = []
    return best or None


def _json_after(pattern: str) -> str | None:
    """L when `pattern` is exactly `L(?P<json>\\{.*\\})` with L plain characters (the
    simulator's `soakspec_sim_trace (?P<json>\\{.*\\})`), else None."""
    from re import _constants  # type: ignore[attr-defined]

    items = _top_literals(pattern)
    if not items or len(items) < 2:
        return None
    *lits, group = items
    if not lits or any(op is not _constants.LITERAL for op, _ in lits):
        return None
    try:
        rx = re.compile(pattern)
    except re.error:
        return None
    if set(rx.groupindex) != {"json"} or group[0] is not _constants.SUBPATTERN:
        return None
    gid, add_flags, del_flags, body = group[1]
    if gid != rx.groupindex["json"] or add_flags or del_flags or len(body) != 3:
        return None
    (op0, a0), (op1, a1), (op2, a2) = body
    if (op0, a0) != (_constants.LITERAL, ord("{")) or (op2, a2) != (_constants.LITERAL, ord("}")):
        return None
    if op1 is not _constants.MAX_REPEAT or a1[:2] != (0, _constants.MAXREPEAT) or list(a1[2]) != [(_constants.ANY, None)]:
        return None
    return _literal_text(lits)


def _marker_bytes(source: TraceSource) -> bytes | None:
    """What every trace line of `source` contains, as UTF-8 (None: any line may be one)."""
    if source.kind != "log":
        return None
    text = source.marker if source.marker else _required_literal(source.pattern or "")
    if not text or "\ufffd" in text:  # a replaced byte decodes to U+FFFD: not findable in bytes
        return None
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        return None


# Line ends `str.splitlines` honours besides "\n" (and "\r\n"): a line holding one is split as
# the reference reading splits it (rare: the fast path reads a "\n" line as one line).
_ODD_BREAKS = (b"\x0b", b"\x0c", b"\x1c", b"\x1d", b"\x1e")
_ODD_BREAKS_UTF8 = (b"\xc2\x85", b"\xe2\x80\xa8", b"\xe2\x80\xa9")  # only in a block that is not ASCII


def _odd_breaks(block: bytes) -> list[int]:
    """Sorted positions in `block` of a line end other than "\\n" and "\\r\\n"."""
    out = []
    for pat in _ODD_BREAKS if block.isascii() else _ODD_BREAKS + _ODD_BREAKS_UTF8:
        k = block.find(pat)
        while k >= 0:
            out.append(k)
            k = block.find(pat, k + 1)
    k = block.find(b"\r")
    while k >= 0:
        if block[k + 1:k + 2] != b"\n":
            out.append(k)
        k = block.find(b"\r", k + 1)
    out.sort()
    return out


def scan_rows(
    blocks: Iterable[bytes], source: TraceSource, base_offset: int = 0,
    compact: Callable[[dict[str, Any]], Any] | None = None,
    malformed: list[tuple[int, str]] | None = None, boundary: BoundaryText | None = None,
) -> Iterator[tuple[str | None, tuple[float, ...], Any, int]]:
    """The traces of a log given as byte blocks (cut anywhere) that start at byte `base_offset`,
    yielded as they are found as `(trace_id, times, payload, offset)` (a `Trace` without its
    source: no object per trace) -- the traces `extract_trace_lines` finds in the decoded lines,
    with the same payloads (the `offset` of each is its line's byte offset in the file; the
    reference counts re-encoded text, which differs only after undecodable bytes). Fast:
    a log source's marker (or its pattern's literal) is found in the bytes before any line is
    decoded, a payload is decoded by msgspec (`_fast_payload`), and the simulator's pattern shape
    is matched without its regex. Lines that hold a trace but do not parse are appended to
    `malformed`, when given, as `(offset, problem)`. `boundary`, when given, is fed the same
    pass's lines (`BoundaryText.add_block`: a trace line is one that holds a trace, well formed
    or not), and marked done once the last block is read: the runtime boundary needs no second
    read of the log."""
    reader = _LineReader(source, compact, fast=True)
    marker = _marker_bytes(source)
    ascii_rows = reader.row_ascii if reader.json_after_ascii is not None else None
    sim_payload = reader.sim_row if ascii_rows is not None and marker == reader.json_after_ascii else None
    base = base_offset
    carry: list[bytes] = []
    for data in blocks:
        cut = data.rfind(b"\n")
        if cut < 0:
            if data:
                carry.append(data)
            continue
        block = b"".join([*carry, data[:cut + 1]]) if carry else data[:cut + 1]
        carry = [data[cut + 1:]] if cut + 1 < len(data) else []
        yield from _block_rows(block, base, marker, reader.row, malformed, ascii_rows, sim_payload, boundary)
        base += len(block)
    if carry:  # the last line, without a line end
        yield from _block_rows(b"".join(carry), base, marker, reader.row, malformed, ascii_rows, sim_payload, boundary)
    if boundary is not None:
        boundary.done()


def _block_rows(block: bytes, base: int, marker: bytes | None, read_line: Callable[[str, int], Any],
                malformed: list[tuple[int, str]] | None, ascii_rows: Callable[[bytes, int], Any] | None = None,
                sim_payload: Callable[..., Any] | None = None, boundary: BoundaryText | None = None) -> list[Any]:
    """The rows of the whole lines in `block` (which starts at byte `base` of its file);
    `ascii_rows`, when given, reads the lines of an ASCII block from their bytes, and
    `sim_payload` (the reader's `sim_row`, when `marker` is its `json_after_ascii`) the
    payloads of the simulator's shape straight from the block. `boundary`: given the block
    and the spans of its trace lines."""
    spans_out: list[tuple[int, int]] | None = [] if boundary is not None else None
    out = _block_rows_of(block, base, marker, read_line, malformed, ascii_rows, sim_payload, spans_out)
    if boundary is not None:
        boundary.add_block(block, spans_out)  # type: ignore[arg-type]
    return out


def _block_rows_of(block: bytes, base: int, marker: bytes | None, read_line: Callable[[str, int], Any],
                   malformed: list[tuple[int, str]] | None, ascii_rows: Callable[[bytes, int], Any] | None,
                   sim_payload: Callable[..., Any] | None, spans_out: list[tuple[int, int]] | None) -> list[Any]:
    """`_block_rows`, and the [start, end) spans of the trace lines appended to `spans_out`."""
    out: list[Any] = []
    breaks = _odd_breaks(block)
    size = len(block)
    ascii_row = ascii_rows if ascii_rows is not None and block.isascii() else None
    if ascii_row is not None and not breaks and sim_payload is not None and marker is not None:
        # the simulator's log (`marker(?P<json>\{.*\})`, ASCII, no odd line end): each payload
        # is cut from the block where `row_ascii` would cut it from its line
        find, rfind, append, width = block.find, block.rfind, out.append, len(marker)
        k = find(marker)
        while k >= 0:
            le = find(b"\n", k)
            if le < 0:
                le = size
            p = k
            while p >= 0 and block[p + width:p + width + 1] != b"{":
                p = find(marker, p + 1, le)
            if p >= 0 and (r := rfind(b"}", p + width + 1, le)) >= 0:
                ls = rfind(b"\n", 0, k) + 1
                here = base + ls
                if spans_out is not None:
                    spans_out.append((ls, le + 1 if le < size else size))
                got = sim_payload(block[p + width:r + 1], here)
                if type(got) is str:
                    if malformed is not None:
                        malformed.append((here, got))
                else:
                    append(got)
            k = find(marker, le + 1)
        return out
    if marker is None:  # every line may hold a trace
        starts = [0]
        k = block.find(b"\n")
        while k >= 0:
            starts.append(k + 1)
            k = block.find(b"\n", k + 1)
        spans: Iterable[tuple[int, int]] = zip(starts, [*starts[1:], size + 1])
    else:
        spans = []
        k = block.find(marker)
        while k >= 0:
            le = block.find(b"\n", k)
            le = size if le < 0 else le
            spans.append((block.rfind(b"\n", 0, k) + 1, le + 1))
            k = block.find(marker, le + 1)
    for ls, nxt in spans:
        if ls >= size:
            continue
        le = nxt - 1  # the line without its "\n"
        if breaks and (j := bisect.bisect_left(breaks, ls)) < len(breaks) and breaks[j] < le:
            here = base + ls  # a line `str.splitlines` cuts in pieces: read as the reference reads it
            traced = False
            for piece in block[ls:nxt].decode("utf-8", "replace").splitlines(keepends=True):
                got = read_line(piece.rstrip("\r\n"), here)
                traced = traced or got is not None
                if type(got) is str:
                    if malformed is not None:
                        malformed.append((here, got))
                elif got is not None:
                    out.append(got)
                here += len(piece.encode("utf-8"))
            if traced and spans_out is not None:
                spans_out.append((ls, min(nxt, size)))
            continue
        if ascii_row is not None:  # an ASCII line's bytes are its text
            got = ascii_row(block[ls:le].rstrip(b"\r\n"), base + ls)
        else:
            got = read_line(block[ls:le].decode("utf-8", "replace").rstrip("\r\n"), base + ls)
        if got is None:
            continue
        if spans_out is not None:
            spans_out.append((ls, min(nxt, size)))
        if type(got) is str:
            if malformed is not None:
                malformed.append((base + ls, got))
            continue
        out.append(got)
    return out


def _run_start(fh: Any, gz: bool, offset: int) -> int:
    """Position `fh` (the log, plain or decompressed) at `offset` and return it, or at 0 when the
    log is shorter than `offset` (truncated or rotated: read it all, as the runner does)."""
    if gz:  # the decompressed size is found by reading: read up to the offset once
        left = offset if offset > 0 else 0
        while left > 0:
            got = len(fh.read(min(left, SCAN_BLOCK)))
            if not got:
                fh.seek(0)
                return 0
            left -= got
        return max(offset, 0)
    size = os.fstat(fh.fileno()).st_size
    start = offset if 0 <= offset <= size else 0
    fh.seek(start)
    return start


def scan_log(
    path: os.PathLike | str, offset: int, source: TraceSource,
    compact: Callable[[dict[str, Any]], Any] | None = None,
    malformed: list[tuple[int, str]] | None = None, boundary: BoundaryText | None = None,
) -> Iterator[Trace]:
    """`collect_traces(path, offset, source)`'s traces, yielded as they are found (`scan_log_rows`)."""
    name = source.name
    for row in scan_log_rows(path, offset, source, compact, malformed, boundary):
        yield Trace(*row, name)


def scan_log_rows(
    path: os.PathLike | str, offset: int, source: TraceSource,
    compact: Callable[[dict[str, Any]], Any] | None = None,
    malformed: list[tuple[int, str]] | None = None, boundary: BoundaryText | None = None,
) -> Iterator[tuple[str | None, tuple[float, ...], Any, int]]:
    """`scan_rows` over the log at `path` (plain or gzip: `server.log.gz`, offsets counted in
    the uncompressed log), read once, a block at a time, from the run's start offset
    `offset` -- or from 0 when the log is shorter (truncated or rotated), as `log_lines`. The
    log is opened (and an OSError raised) now; it is read as the rows are taken."""
    from soakspec.evidence.serverlog import open_log, opened_as_stream, read_errors

    fh = open_log(path)
    try:
        with read_errors(path):
            start = _run_start(fh, opened_as_stream(fh), offset)
    except BaseException:
        fh.close()
        raise

    raw = getattr(fh, "fileobj", None) or fh  # the file as stored: a gzip log's position is its compressed bytes'
    tick = ticker(path, raw)  # how far the read has got, for a long one (on stderr)

    def blocks() -> Iterator[bytes]:
        with read_errors(path):
            while block := fh.read(SCAN_BLOCK):
                if tick is not None:
                    tick()
                yield block

    def gen() -> Iterator[tuple[str | None, tuple[float, ...], Any, int]]:
        with fh:
            yield from scan_rows(blocks(), source, start, compact, malformed, boundary)

    return gen()


def collect_traces(
    path: os.PathLike | str, offset: int, source: TraceSource
) -> tuple[list[Trace], list[tuple[int, str]]]:
    """Read what `path` gained since `offset` and extract its traces, streamed: line by line
    (`log_lines`), so a day-long soak's log is never held at once."""
    lines, start = log_lines(path, offset)
    return extract_trace_lines(lines, source, start)


# --- matching -------------------------------------------------------------------------------


def validate_id_form(form: str) -> str | None:
    """None when `form` is a usable id template (`cmpl-{id}-0`), else why not (for the compiler)."""
    import string

    try:
        fields = [f for _, f, _, _ in string.Formatter().parse(form) if f is not None]
    except ValueError as e:
        return f"invalid id form {form!r}: {e}"
    if fields != ["id"]:
        return f"id form {form!r} must contain {{id}} exactly once and no other field"
    return None


@dataclasses.dataclass(frozen=True, slots=True)
class Assignment:
    trace: Trace
    request_id: str | None  # the request it matched (or whose id it carried, when incomplete)
    reason: str | None  # None when matched; else one of REASONS
    window_checked: bool
    wall_step: float = 0.0  # the recorded wall-clock step its times were placed across (0: none)

    @property
    def matched(self) -> bool:
        return self.reason is None


@dataclasses.dataclass(frozen=True, slots=True)
class TraceMatch:
    assignments: tuple[Assignment, ...]  # one per trace, in the order traces were given
    traceless: tuple[str, ...]  # request ids with no matched trace, in request order

    @property
    def matched(self) -> dict[str, tuple[Trace, ...]]:
        out: dict[str, list[Trace]] = {}
        for a in self.assignments:
            if a.matched and a.request_id is not None:
                out.setdefault(a.request_id, []).append(a.trace)
        return {k: tuple(v) for k, v in out.items()}

    @property
    def unmatched(self) -> tuple[Assignment, ...]:
        return tuple(a for a in self.assignments if not a.matched)

    def records(self, *, in_log: bool = False) -> list[dict[str, Any]]:
        """The lines of traces.jsonl.gz (schema "trace"). `in_log`: the traces were read from the
        evidence's own server.log, which keeps each one's line at `offset` -- the rows then leave
        out `times` and `payload` (the line holds both; the judge re-reads them from there), which
        were 2/3 of the evidence's bytes (README: "Evidence at soak scale"). Traces from a file
        outside the evidence (`source = jsonl`) keep them: the row is their only copy."""
        rows = []
        for a in self.assignments:
            row: dict[str, Any] = {
                "schema_version": 1,
                "trace_id": a.trace.trace_id,
                "request_id": a.request_id,
                "matched": a.matched,
                "reason": a.reason,
                "window_checked": a.window_checked,
                "source": a.trace.source,
                "offset": a.trace.offset,
            }
            if a.wall_step:
                row["wall_step_s"] = a.wall_step
            if not in_log:
                row["times"] = list(a.trace.times)
                row["payload"] = dict(a.trace.payload) if a.trace.payload is not None else None
            rows.append(row)
        return rows


def _window(req: Mapping[str, Any], window_s: float) -> tuple[float, float] | None:
    start = req.get("start")
    if not isinstance(start, (int, float)) or isinstance(start, bool) or abs(start) > _EPOCH_MAX * 1e9:
        return None
    end = req.get("end")
    if not isinstance(end, (int, float)) or isinstance(end, bool) or abs(end) > _EPOCH_MAX * 1e9:
        end = start
    return start - window_s, end + window_s


def first_fit(times: Sequence[float], windows: Sequence[tuple[int, tuple[float, float] | None]],
              steps: Sequence[float] = ()) -> tuple[int | None, float]:
    """(the first candidate whose window holds `times` as stamped, 0.0), else the first whose
    window holds them across the first of `steps` that places them in one (and that step),
    else (None, 0.0). A trace without
    times fits its first candidate; a candidate without a window (no start) fits none. The
    choice of `match_traces` and of the runner's streamed matching (runner/collect.py)."""
    if not times:
        return (windows[0][0], 0.0) if windows else (None, 0.0)
    for d in (0.0, *steps):  # as stamped, then each step in turn: a candidate of each
        for i, w in windows:
            if w is not None and all(w[0] <= t - d <= w[1] for t in times):
                return i, d
    return None, 0.0


def match_traces(
    requests: Iterable[Mapping[str, Any]],
    traces: Iterable[Trace],
    id_field: str = "request_id",
    id_forms: Sequence[str] = DEFAULT_ID_FORMS,
    window_s: float = DEFAULT_WINDOW_S,
    required_fields: Sequence[str] = (),
    steps: Sequence[float] = (),
) -> TraceMatch:
    """Match each trace to the request whose id form it carries and whose time window holds
    all of its times. Unmatched traces are kept with a reason; `required_fields` marks payloads
    lacking any of them as "incomplete" (regex-only traces have no payload and are exempt).
    `steps`: the run's recorded wall-clock steps (`wall_steps`): a trace whose times fit no
    candidate's window goes to the first candidate whose window they fit across a step."""
    reqs = list(requests)
    by_form: dict[str, list[int]] = {}
    for i, r in enumerate(reqs):
        rid = r.get(id_field)
        if rid is None:
            continue
        forms = {form.format(id=rid) for form in id_forms}
        if r.get("server_id"):
            forms.add(str(r["server_id"]))
        for f in forms:
            by_form.setdefault(f, []).append(i)
    windows = [_window(r, window_s) for r in reqs]

    out: list[Assignment] = []
    seen: set[int] = set()
    for tr in traces:
        checked = bool(tr.times)
        if tr.trace_id is None:
            out.append(Assignment(tr, None, "no_id", checked))
            continue
        candidates = by_form.get(tr.trace_id, [])
        if not candidates:
            out.append(Assignment(tr, None, "unknown_id", checked))
            continue
        chosen, step = first_fit(tr.times, [(i, windows[i]) for i in candidates], steps)
        if chosen is None:
            rid = str(reqs[candidates[0]].get(id_field))
            out.append(Assignment(tr, rid, "outside_window", checked))
            continue
        rid = str(reqs[chosen].get(id_field))
        if tr.payload is not None and any(_get(tr.payload, f) is None for f in required_fields):
            out.append(Assignment(tr, rid, "incomplete", checked))
            continue
        seen.add(chosen)
        out.append(Assignment(tr, rid, None, checked, step))
    traceless = tuple(
        str(r.get(id_field)) for i, r in enumerate(reqs) if i not in seen and r.get(id_field) is not None
    )
    return TraceMatch(tuple(out), traceless)


@dataclasses.dataclass(frozen=True, slots=True)
class Coverage:
    matched: int
    measured: int

    @property
    def ratio(self) -> float | None:
        return self.matched / self.measured if self.measured else None


def coverage_by_bucket(
    requests: Iterable[Mapping[str, Any]], match: TraceMatch, id_field: str = "request_id"
) -> dict[int, Coverage]:
    """Per measured bucket (bucket >= 0): requests with a matched trace / requests."""
    have = set(match.matched)
    counts: dict[int, list[int]] = {}
    for r in requests:
        b = r.get("bucket")
        if not isinstance(b, int) or b < 0:
            continue
        c = counts.setdefault(b, [0, 0])
        c[1] += 1
        if str(r.get(id_field)) in have:
            c[0] += 1
    return {b: Coverage(m, n) for b, (m, n) in sorted(counts.items())}


def id_form_affixes(form: str) -> tuple[str, str] | None:
    """(prefix, suffix) of an id form whose text is `prefix + id + suffix` (`cmpl-{id}-0`:
    ("cmpl-", "-0")), or None when formatting does more than put the id in (a format spec, a
    conversion, escaped braces): then a trace id cannot be inverted into the request id."""
    import string

    parts = list(string.Formatter().parse(form))
    fields = [p for p in parts if p[1] is not None]
    if len(fields) != 1 or fields[0][1] != "id" or fields[0][2] or fields[0][3]:
        return None
    if any("{" in p[0] or "}" in p[0] for p in parts):
        return None  # escaped braces: not a literal prefix
    at = parts.index(fields[0])
    return "".join(p[0] for p in parts[: at + 1]), "".join(p[0] for p in parts[at + 1:])
