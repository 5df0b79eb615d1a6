"""The load generator's HTTP client: one kept-alive HTTP/1.1 connection per worker.

This is the hot path. It moves bytes and time stamps them; what the bytes mean is decided by
`protocol.StreamAccumulator`, shared with the httpx client, so both produce the same records
(tests/test_loadpaths*.py). httpx is for the control plane only (readiness, /metrics, checks).

Design -- in the common case no general-purpose parser runs, and every shortcut has the general
code behind it, which takes anything unusual and words the errors:

* Request: the bytes h11 would write (a test compares them), from a per-connection prefix plus
  the id and length; the body from a per-shape template (`protocol.build_body`). h11 builds
  requests with extra headers or header values it must vet. Every request asks for the body as
  sent (`accept-encoding: identity`, as the httpx client does): nothing here decodes gzip, and
  an encoded body fails by its encoding (protocol.py, "Outcomes").
* Response head: `parse_head` reads a complete, plain head (HTTP/1.x, CRLF, one Content-Length
  or `chunked`) with h11's own grammar; a head split across reads, or anything odd, goes to h11.
* Body framing (chunked, Content-Length, until close) is decoded here (`ChunkedDecoder` & co.):
  h11 hands out one event per chunk through its state machine, which for a 64-token stream
  with one SSE event per chunk cost 3x the throughput of the whole request. Every socket read
  becomes one payload; the SSE layer takes the events in vLLM's byte layout without building
  JSON objects (`protocol._fast_events`: a run of events alike but for their text by one
  bytes.split, the others by one regex split per read), and parses the rest fully.
* I/O: plain non-blocking sockets; `trio.lowlevel.wait_readable` before each recv (a response
  is never there yet: no recv tried in vain), one `send` per request. No SocketStream layers.
* Time stamps, one clock per record (protocol.py, "One clock per record"): the kernel's
  receive time of the bytes (SO_TIMESTAMPNS, from `recvmsg`), on the run clock, so first byte,
  TTFT, ITL and `end` are when the bytes arrived, not when the event loop came round to them;
  the request's `end` is its last bytes' stamp (a body that ends with the connection ends with
  its last bytes, not at the close, which carries none and no stamp). How long the client then took to process them
  is its `client_delay` (at c=64 against a zero-latency server one process is ~30 ms behind its
  sockets: TTFT from the kernel's stamps is 0.14 ms, and that 30 ms is client delay, not
  latency). A read that takes several segments gets the stamp of the last one: a starved client
  reads late and its stamps run late with it (and its tokens coalesce) -- which the client's
  own health (clienthealth.py) shows and the judge's client_healthy catches.

The figures that chose this (nginx serving a canned 64-token stream, a server that costs almost
nothing; closed loop at c=64; the shared 2-vCPU VM; `benchmarks/loadgen/`, py-spy, cProfile):
    start: h11 state machine per request, json.loads per SSE event, SocketStream
        1.39 ms client CPU per request, 266 streams/s, TTFT p50 245 ms
        (json per event ~55% of the CPU, h11's request building and head validation ~25%)
    + SSE events by one regex split per read                     0.94 ms,   679/s
    + requests by hand, plain heads without h11                  0.60 ms, 1,334/s
    + raw sockets, body templates, shapes made once              0.50 ms, ~1,550/s
    + records written at the loop's next turn (load.py)          0.45 ms, 2,197/s (median of 3)
    + kernel time stamps                                         TTFT p50 0.14 ms (c=8, 64, 256)
    + a stream's middle by one bytes.split, reads that split an event back on the fast
      path (protocol.py), records by `RequestRecord.to_line`, one write per batch
                                                                 0.36 ms, 2,797/s (median of 3)
    2026-12-01, measured afresh (the lines above are 2026-11-30's, not rerun): merged main
    after #17, self-check on, load average ~3                    0.105 ms, 7,184/s
    + round(t, 6) without its decimal string, ITL by map, records by msgspec
      encode_lines, heads memoised, one poll object per connection, gzip level 4
                                                                 0.094 ms, 8,441/s (4.3x vllm bench serve)
wrk (C, no stream parsing) does ~23,000/s on the same server; `--workers 2` 4,264/s at c=256.
What is left, by py-spy: the SSE lane (~25%: the split, the regex over the last events, the
hash), the send syscall (~7%), the record line (~8%), the response head, trio's scheduling.

Connection reuse -- every request that reached the server is on the record:

* Before a kept-alive connection is reused, it is checked without blocking (`poll`, timeout 0):
  a connection the server closed while idle (uvicorn, behind vLLM, closes idle connections
  after 5 s) has its EOF pending and reads as readable, so it is dropped and the request goes
  on a fresh connection. Nothing was sent on the dead one: nothing was dropped, nothing is
  recorded against the server.
* Once a request's bytes were sent, the request is on the record as sent. A connection that
  then closes (or resets) without a response is that request's outcome: `disconnected`
  ("connection closed before the response"), reused connection or not. It is never sent again
  silently: a resend on a fresh connection would fold a real drop into a later success (a
  server that closed every second kept-alive request passed with `failed == 0`).
  The httpx reference client behaves the same (httpcore checks idle connections the same way
  and does not resend); tests/test_client.py proves both clients alike, tests/test_faults.py
  both cases end to end (a server that drops every second kept-alive request; one that closes
  idle connections).

Connect time always counts in the request. Any failure, the deadline, or a response that ends
the connection leaves no connection behind: the next request reconnects.
"""

from __future__ import annotations

import math
import os
import re
import select
import socket
import struct
import sys
import time
from collections.abc import Callable, Iterable

import h11
import trio
from trio.lowlevel import wait_readable, wait_writable

from soakspec import __version__
from soakspec.runner.clock import RunClock
from soakspec.runner.protocol import (
    CONNECT_FAILED,
    DEADLINE_PASSED,
    DEFAULT_LIMITS,
    Limits,
    RequestShape,
    StreamAccumulator,
    build_body,
    describe_transport_error,
)
from soakspec.runner.fdlimit import not_sent_error
from soakspec.runner.records import Outcome, RequestRecord

RECEIVE_SIZE = 64 * 1024
# Kernel receive time stamps (Linux; the constant is not in the socket module): SO_TIMESTAMPNS
# makes recvmsg return a struct timespec of wall-clock time with the data.
SO_TIMESTAMPNS = getattr(socket, "SO_TIMESTAMPNS", None)
if SO_TIMESTAMPNS is None and sys.platform == "linux" and os.uname().machine in ("x86_64", "aarch64", "riscv64"):
    SO_TIMESTAMPNS = 35  # asm-generic/socket.h
_TIMESPEC = struct.Struct("@ll")
_ANC_SIZE = socket.CMSG_SPACE(_TIMESPEC.size)
USER_AGENT = f"soakspec/{__version__}".encode()


# chunk-size [BWS ; chunk-ext] CRLF  (RFC 9112 7.1); sizes up to 16 hex digits
_CHUNK_HEADER = re.compile(rb"([0-9A-Fa-f]{1,16})[ \t]*(?:;[^\r\n]*)?\r\n")
_MAX_CHUNK_LINE = 4096
_MAX_TRAILERS = 16 * 1024
_SIZE, _DATA, _TRAILER = 0, 1, 2


class ChunkedDecoder:
    """Incremental `Transfer-Encoding: chunked` decoder.

    `feed(data)` returns the payload bytes `data` completes (all of its chunks at once).
    `done` once the last chunk and the trailers were read; `extra` if bytes followed them.
    On malformed framing `error` says what is wrong and `feed` returns the payload before it.
    """

    __slots__ = ("_buf", "_left", "_state", "_trailers", "done", "extra", "error")

    def __init__(self) -> None:
        self._buf = b""
        self._left = 0  # data bytes left in the current chunk
        self._state = _SIZE
        self._trailers = 0
        self.done = False
        self.extra = False
        self.error: str | None = None

    def feed(self, data: bytes) -> bytes:
        if self.error is not None:
            return b""
        buf = self._buf + data if self._buf else data
        pos, end = 0, len(buf)
        out: list[bytes] = []
        state, left = self._state, self._left
        while True:
            if state == _DATA:
                if left:
                    take = min(left, end - pos)
                    if not take:
                        break
                    out.append(buf[pos : pos + take])
                    pos += take
                    left -= take
                    if left:
                        break
                if end - pos < 2:
                    break
                if buf[pos : pos + 2] != b"\r\n":
                    self.error = "chunk data not followed by CRLF"
                    break
                pos += 2
                state = _SIZE
            elif state == _SIZE:
                m = _CHUNK_HEADER.match(buf, pos)
                if m is None:
                    if buf.find(b"\n", pos) >= 0 or end - pos > _MAX_CHUNK_LINE:
                        self.error = f"bad chunk size line {buf[pos : pos + 40]!r}"
                    break
                pos = m.end()
                left = int(m.group(1), 16)
                state = _DATA if left else _TRAILER
            else:  # the trailer section: header lines up to an empty one
                eol = buf.find(b"\r\n", pos)
                if self._trailers + (end if eol < 0 else eol) - pos > _MAX_TRAILERS:
                    self.error = "chunked trailers too large"
                    break
                if eol < 0:
                    break
                self._trailers += eol - pos
                empty = eol == pos
                pos = eol + 2
                if empty:
                    self.done = True
                    self.extra = pos < end
                    break
        self._state, self._left = state, left
        self._buf = buf[pos:] if pos < end and not self.done and self.error is None else b""
        return out[0] if len(out) == 1 else b"".join(out)


class LengthDecoder:
    """A `Content-Length` body."""

    __slots__ = ("_left", "done", "extra")
    error = None

    def __init__(self, length: int) -> None:
        self._left = length
        self.done = length == 0
        self.extra = False

    def feed(self, data: bytes) -> bytes:
        left = self._left
        if len(data) < left:
            self._left = left - len(data)
            return data
        self._left = 0
        self.done = True
        self.extra = len(data) > left
        return data[:left] if self.extra else data


class UntilCloseDecoder:
    """A body without framing (HTTP/1.0 style): everything up to the end of the connection."""

    __slots__ = ("done", "extra")
    error = None

    def __init__(self) -> None:
        self.done = self.extra = False

    def feed(self, data: bytes) -> bytes:
        return data


Decoder = ChunkedDecoder | LengthDecoder | UntilCloseDecoder


def body_decoder(response: h11.Response) -> tuple[Decoder, bool]:
    """The response's body framing (RFC 9112 6.3) and whether the connection stays open after.

    h11 has validated the head: Transfer-Encoding can only be `chunked`, Content-Length is one
    non-negative integer.
    """
    return _framing(response.status_code, response.http_version, response.headers)


def _framing(status: int, http_version: bytes, headers: Iterable[tuple[bytes, bytes]]) -> tuple[Decoder, bool]:
    """`body_decoder` from the parts of a validated head (lower-case header names)."""
    chunked = False
    length: int | None = None
    keep_alive = http_version == b"1.1"
    for name, value in headers:
        if name == b"transfer-encoding":
            chunked = True
        elif name == b"content-length":
            length = int(value)
        elif name == b"connection" and b"close" in value.lower():
            keep_alive = False
    if status in (204, 304):
        return LengthDecoder(0), keep_alive
    if chunked:
        return ChunkedDecoder(), keep_alive
    if length is not None:
        return LengthDecoder(length), keep_alive
    return UntilCloseDecoder(), False


# A final (status >= 200) response head in the plainest form h11 accepts: HTTP/1.0 or 1.1, CRLF
# line ends, no folded lines, one Content-Length of digits, Transfer-Encoding exactly `chunked`.
# The same expressions as h11's (`h11._abnf`), so whatever they accept h11 accepts alike.
_STATUS_LINE = re.compile(rb"HTTP/1\.([01]) ([2-9][0-9][0-9])(?: [^\x00\n\r\x0b\x0c]*)?")
_HEADER_LINE = re.compile(rb"([-!#$%&'*+.^_`|~0-9a-zA-Z]+):[ \t]*((?:[^\x00\s]+(?:[ \t]+[^\x00\s]+)*)?)[ \t]*")
_MAX_LENGTH_DIGITS = 20  # h11's CONTENT_LENGTH_MAX_DIGITS


_HEADS_MAX = 64
_heads: dict[bytes, tuple[int, bytes, list[tuple[bytes, bytes]], int] | None] = {}


def parse_head(data: bytes) -> tuple[int, bytes, list[tuple[bytes, bytes]], int] | None:
    """(status, HTTP version, headers with lower-case names, end of the head) when `data` starts
    with a complete head of the plain form above; None otherwise: then h11 reads it, and says
    what is wrong if anything is.

    A server sends the same head bytes again and again (nginx and uvicorn change only `Date`,
    once a second), so results are kept by the head's exact bytes (a pure function of them; at
    most `_HEADS_MAX`, then forgotten): the regexes run about once a second, not per request.
    The headers list is shared between the requests that got the same head: read it, never
    change it."""
    end = data.find(b"\r\n\r\n")
    if end < 0:
        return None
    key = data[: end + 4]
    try:
        return _heads[key]
    except KeyError:
        pass
    head = _parse_head(data, end)
    if len(_heads) >= _HEADS_MAX:
        _heads.clear()
    _heads[key] = head
    return head


def _parse_head(data: bytes, end: int) -> tuple[int, bytes, list[tuple[bytes, bytes]], int] | None:
    lines = data[:end].split(b"\r\n")
    m = _STATUS_LINE.fullmatch(lines[0])
    if m is None:
        return None
    headers = []
    length = chunked = False
    for i in range(1, len(lines)):
        h = _HEADER_LINE.fullmatch(lines[i])
        if h is None:
            return None
        name, value = h.groups()
        name = name.lower()
        if name == b"content-length":
            if length or not value.isdigit() or len(value) > _MAX_LENGTH_DIGITS:
                return None
            length = True
        elif name == b"transfer-encoding":
            value = value.lower()
            if chunked or value != b"chunked":
                return None
            chunked = True
        headers.append((name, value))
    return int(m.group(2)), b"1." + m.group(1), headers, end + 4


def _awaiting_response() -> h11.Connection:
    """An h11 client connection that has sent a request: ready to read a response head."""
    conn = h11.Connection(h11.CLIENT)
    conn.send(h11.Request(method=b"POST", target=b"/", headers=[(b"host", b"-"), (b"content-length", b"0")]))
    conn.send(h11.EndOfMessage())
    return conn


_FIELD_VALUE = re.compile(rb"[^\x00\s]+(?:[ \t]+[^\x00\s]+)*")


class H11Connection:
    """One HTTP/1.1 connection to `host:port`, kept alive across requests, not shared.

    `send()` never raises for anything the server or the network does; it records it.
    Only `trio.Cancelled` (and bugs) propagate.
    """

    def __init__(
        self,
        host: str,
        port: int,
        clock: RunClock,
        *,
        api_key: str | None = None,
        limits: Limits = DEFAULT_LIMITS,
        receive_size: int = RECEIVE_SIZE,
    ) -> None:
        self._host = host
        self._port = port
        self._clock = clock
        self._limits = limits
        self._receive_size = receive_size
        self._sock: socket.socket | None = None  # non-blocking; trio waits for it
        self._poll = select.poll()  # the socket registered for POLLIN (see `_exchange`)
        base = [(b"host", f"{host}:{port}".encode()), (b"user-agent", USER_AGENT)]
        base.append((b"content-type", b"application/json"))
        base.append((b"accept-encoding", b"identity"))  # the body as sent: soakspec decodes no gzip
        if api_key:
            base.append((b"authorization", b"Bearer " + api_key.encode()))
        self._base_headers = base
        # every header but x-request-id and content-length, by (path, stream); None: let h11
        # write (and refuse) a header value it would not accept
        self._prefixes: dict[tuple[str, bool], bytes] = {}
        self._plain = all(_FIELD_VALUE.fullmatch(v) for _, v in base)
        self.connects = 0  # connections opened so far

    async def __aenter__(self) -> H11Connection:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        self._drop()
        await trio.lowlevel.checkpoint()

    async def send(
        self,
        shape: RequestShape,
        request_id: str,
        headers: Iterable[tuple[str, str]],
        record: RequestRecord,
        *,
        deadline: float = math.inf,
    ) -> None:
        """Send one request and fill `record` with what happened.

        `deadline` is the request's absolute deadline in run-clock seconds; when it passes the
        request ends as `timeout` (and its connection is dropped).
        """
        clock = self._clock
        if record.start is None:  # else the load loop's read (`load.Connection`)
            record.start = clock.now()
        if record.intended_start is None:
            record.intended_start = record.start
        acc = StreamAccumulator(shape, self._limits)
        request = self._request(shape, request_id, tuple(headers))
        with trio.move_on_at(clock.to_trio(deadline)) as scope:
            await self._exchange(request, acc, record)
        if scope.cancelled_caught:
            acc.fail(Outcome.TIMEOUT, DEADLINE_PASSED)
        acc.finish(record, clock.now())

    def _request(self, shape: RequestShape, request_id: str, headers: tuple[tuple[str, str], ...]) -> bytes:
        """The request's bytes: exactly what h11 writes for it, head and body."""
        body = build_body(shape, request_id)
        rid = request_id.encode()
        accept = b"text/event-stream" if shape.stream else b"application/json"
        if headers or not self._plain or _FIELD_VALUE.fullmatch(rid) is None:
            conn = h11.Connection(h11.CLIENT)
            head = conn.send(
                h11.Request(
                    method=b"POST",
                    target=shape.path.encode(),
                    headers=[
                        *self._base_headers,
                        (b"accept", accept),
                        (b"x-request-id", rid),
                        *((k.encode(), v.encode()) for k, v in headers),
                        (b"content-length", b"%d" % len(body)),
                    ],
                )
            )
            return head + body  # type: ignore[operator]  # a Request always gives bytes
        key = (shape.path, shape.stream)
        prefix = self._prefixes.get(key)
        if prefix is None:
            lines = [b"POST %s HTTP/1.1\r\n" % shape.path.encode()]
            lines += [b"%s: %s\r\n" % hv for hv in (*self._base_headers, (b"accept", accept))]
            prefix = self._prefixes[key] = b"".join(lines) + b"x-request-id: "
        return b"%s%s\r\ncontent-length: %d\r\n\r\n%s" % (prefix, rid, len(body), body)

    def _drop(self) -> None:
        if self._sock is not None:
            trio.lowlevel.notify_closing(self._sock)
            self._sock.close()
            self._sock = None

    async def _connect(self) -> socket.socket:
        """A new connection (trio resolves, connects, sets TCP_NODELAY), as a plain socket."""
        stream = await trio.open_tcp_stream(self._host, self._port)
        sock = socket.socket(fileno=stream.socket.detach())
        sock.setblocking(False)
        if SO_TIMESTAMPNS is not None:
            try:  # the kernel stamps each received segment; recvmsg hands the stamp over
                sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
            except OSError:  # pragma: no cover - then every read is stamped by the run clock
                pass
        return sock

    async def _exchange(self, request: bytes, acc: StreamAccumulator, record: RequestRecord) -> None:
        sock = self._sock
        # readable while idle: the server closed it (EOF pending) -- use a fresh one, before sending
        if sock is None or self._poll.poll(0):
            self._drop()
            try:
                sock = self._sock = await self._connect()
            except OSError as exc:
                unsent = not_sent_error(exc)
                if unsent is not None:  # out of file descriptors (...) here: nothing reached the server
                    record.start = None  # the record's "never sent" (runner/fdlimit.py)
                    acc.fail(Outcome.DISCONNECTED, unsent)
                    return
                acc.fail(Outcome.DISCONNECTED, CONNECT_FAILED + describe_transport_error(exc))
                return
            self.connects += 1
            self._poll = select.poll()  # one per connection: the idle check is one poll(0)
            self._poll.register(sock, select.POLLIN)
        assert sock is not None
        keep = False
        try:
            keep = await self._round_trip(sock, request, acc, record)
        finally:
            if not keep:
                self._drop()

    async def _round_trip(
        self,
        sock: socket.socket,
        request: bytes,
        acc: StreamAccumulator,
        record: RequestRecord,
    ) -> bool:
        """One request/response cycle. True if the connection can carry the next request.

        A close or reset before the whole response is the request's own outcome (`disconnected`),
        on a reused connection as on a fresh one (see the module docstring)."""
        conn: h11.Connection | None = None
        size = self._receive_size
        now = self._clock.now
        t = record.start or 0.0  # when the bytes being processed arrived (never going back)
        try:
            await _send_all(sock, request)
            data, t = await _receive(sock, size, now, t)
            if data:
                record.first_byte = t
            head = parse_head(data)
            if head is not None:  # the usual case: a whole, plain head in the first read
                status, version, headers, end = head
                data = data[end:]
            else:  # h11 reads the head: split across reads, unusual, or wrong
                conn = _awaiting_response()
                conn.receive_data(data)
                while True:
                    event = conn.next_event()
                    if event is h11.NEED_DATA:
                        data, t = await _receive(sock, size, now, t)
                        if record.first_byte is None and data:
                            record.first_byte = t
                        conn.receive_data(data)
                    elif type(event) is h11.Response:
                        break
                    elif type(event) is h11.ConnectionClosed:
                        acc.connection_closed()
                        return False
                status, version, headers = event.status_code, event.http_version, event.headers
                data, _ = conn.trailing_data
            acc.on_response(status, *_head_fields(headers))
            decoder, keep_alive = _framing(status, version, headers)
            # the body, decoded here: one payload per socket read
            on_body = acc.on_body
            while True:
                if data:
                    payload = decoder.feed(data)
                    if payload and not on_body(payload, t):
                        return False
                    if decoder.error is not None:
                        acc.fail(Outcome.FAILED, f"HTTP protocol error: {decoder.error}")
                        return False
                if decoder.done:
                    break
                last = t
                data, t = await _receive(sock, size, now, t)
                if not data:
                    if type(decoder) is UntilCloseDecoder:
                        # the body ends with its last bytes; the close carries none and no kernel
                        # stamp (`now()`: when the loop came round to it, the client's lateness)
                        t = last
                        break
                    acc.connection_closed()
                    return False
        except OSError as exc:
            acc.fail(Outcome.DISCONNECTED, describe_transport_error(exc))
            return False
        except h11.RemoteProtocolError as exc:
            assert conn is not None  # only h11 raises it
            if conn.their_state is h11.ERROR and conn.trailing_data[1]:  # the peer closed mid-head
                acc.connection_closed()
            else:
                acc.fail(Outcome.FAILED, f"HTTP protocol error: {exc}")
            return False
        acc.on_end(t)
        return keep_alive and not decoder.extra and type(decoder) is not UntilCloseDecoder


async def _send_all(sock: socket.socket, data: bytes) -> None:
    """Write `data`; waits only when the socket buffer is full (a request usually fits)."""
    while True:
        try:
            n = sock.send(data)
        except BlockingIOError:
            n = 0
        if n == len(data):
            return
        data = data[n:]
        await wait_writable(sock)


async def _receive(sock: socket.socket, size: int, now: Callable[[], float], after: float) -> tuple[bytes, float]:
    """The next bytes (b"" at the end) and when they arrived on the run clock: the kernel's
    receive time stamp of the last segment read, converted from the wall clock, kept within
    [after, now]; `now()` if there is no stamp. Waits first: called when the bytes are not there yet."""
    while True:
        await wait_readable(sock)
        try:
            data, anc, _, _ = sock.recvmsg(size, _ANC_SIZE)
        except BlockingIOError:  # pragma: no cover - a spurious wake-up
            continue
        t = now()
        if anc:
            level, kind, stamp = anc[0]
            if level == socket.SOL_SOCKET and kind == SO_TIMESTAMPNS and len(stamp) == _TIMESPEC.size:
                sec, nsec = _TIMESPEC.unpack(stamp)
                t = min(t, sec + nsec * 1e-9 + (t - time.time()))
        return data, t if t > after else after


def _head_fields(headers: Iterable[tuple[bytes, bytes]]) -> tuple[str | None, str | None]:
    """(Content-Type, Content-Encoding) of a response head (lower-case names): the first
    Content-Type, every Content-Encoding joined with ", " (as httpx reads them); None: absent."""
    ctype = None
    codings: list[str] = []
    for name, value in headers:
        if name == b"content-type":
            if ctype is None:
                ctype = value.decode("latin-1")
        elif name == b"content-encoding":
            codings.append(value.decode("latin-1"))
    return ctype, ", ".join(codings) if codings else None
