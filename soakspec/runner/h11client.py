"""The load generator's HTTP client: one kept-alive HTTP/1.1 connection per worker, over h11.

This is the hot path. It only moves bytes and timestamps them (one clock read per socket
read); what the bytes mean is decided by `protocol.StreamAccumulator`, shared with the httpx
client, so both produce the same records.

Connection reuse: before each request an idle connection is checked (the server may have
closed it while idle) and replaced if it is readable or h11 says it cannot be reused. If a
*reused* connection still fails before the first response byte (the close raced our send), the
request is sent once more on a fresh connection. Connect time always counts in the request.
Any failure leaves no connection behind: the next request reconnects.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import h11
import trio

from soakspec import __version__
from soakspec.runner.clock import RunClock
from soakspec.runner.protocol import (
    DEADLINE_PASSED,
    DEFAULT_LIMITS,
    Limits,
    RequestShape,
    StreamAccumulator,
    build_body,
    describe_transport_error,
)
from soakspec.runner.records import Outcome, RequestRecord

RECEIVE_SIZE = 64 * 1024
USER_AGENT = f"soakspec/{__version__}".encode()


class _Stale(Exception):
    """A reused connection failed before any response byte: retry on a fresh one."""


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
        self._stream: trio.SocketStream | None = None
        self._h11: h11.Connection | None = None
        base = [(b"host", f"{host}:{port}".encode()), (b"user-agent", USER_AGENT)]
        base.append((b"content-type", b"application/json"))
        if api_key:
            base.append((b"authorization", b"Bearer " + api_key.encode()))
        self._base_headers = base
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
        record.start = clock.now()
        if record.intended_start is None:
            record.intended_start = record.start
        acc = StreamAccumulator(shape, self._limits)
        target = shape.path.encode()
        head = [
            *self._base_headers,
            (b"accept", b"text/event-stream" if shape.stream else b"application/json"),
            (b"x-request-id", request_id.encode()),
            *((k.encode(), v.encode()) for k, v in headers),
        ]
        body = build_body(shape, request_id)
        head.append((b"content-length", str(len(body)).encode()))
        with trio.move_on_at(clock.to_trio(deadline)) as scope:
            while True:
                try:
                    await self._exchange(target, head, body, acc, record)
                    break
                except _Stale:
                    continue
        if scope.cancelled_caught:
            acc.fail(Outcome.TIMEOUT, DEADLINE_PASSED)
        acc.finish(record, clock.now())

    def _drop(self) -> None:
        if self._stream is not None:
            self._stream.socket.close()
            self._stream = None
            self._h11 = None

    async def _exchange(
        self,
        target: bytes,
        head: list[tuple[bytes, bytes]],
        body: bytes,
        acc: StreamAccumulator,
        record: RequestRecord,
    ) -> None:
        reused = (
            self._stream is not None
            and self._h11 is not None
            and self._h11.our_state is h11.IDLE
            and not self._stream.socket.is_readable()
        )
        if not reused:
            self._drop()
            try:
                self._stream = await trio.open_tcp_stream(self._host, self._port)
            except OSError as exc:
                acc.fail(Outcome.DISCONNECTED, "connect failed: " + describe_transport_error(exc))
                return
            self._h11 = h11.Connection(h11.CLIENT)
            self.connects += 1
        stream, conn = self._stream, self._h11
        assert stream is not None and conn is not None
        clean = False
        try:
            out = conn.send(h11.Request(method=b"POST", target=target, headers=head))
            out += conn.send(h11.Data(data=body)) + conn.send(h11.EndOfMessage())  # type: ignore[operator]
            try:
                await stream.send_all(out)
            except trio.BrokenResourceError as exc:
                if reused:
                    raise _Stale from exc
                acc.fail(Outcome.DISCONNECTED, describe_transport_error(exc))
                return
            clean = await self._read_response(stream, conn, acc, record, reused)
        finally:
            if not clean:
                self._drop()

    async def _read_response(
        self,
        stream: trio.SocketStream,
        conn: h11.Connection,
        acc: StreamAccumulator,
        record: RequestRecord,
        reused: bool,
    ) -> bool:
        """Read one response into `acc`. True if the connection can carry the next request."""
        now = self._clock.now
        on_body = acc.on_body
        size = self._receive_size
        received = eof = False
        t = 0.0
        try:
            while True:
                event = conn.next_event()
                if event is h11.NEED_DATA:
                    try:
                        data = await stream.receive_some(size)
                    except trio.BrokenResourceError as exc:
                        if reused and not received:
                            raise _Stale from exc
                        acc.fail(Outcome.DISCONNECTED, describe_transport_error(exc))
                        return False
                    t = now()
                    if data:
                        if not received:
                            received = True
                            record.first_byte = t
                    elif reused and not received:
                        raise _Stale
                    else:
                        eof = True
                    conn.receive_data(data)
                    continue
                kind = type(event)
                if kind is h11.Data:
                    if not on_body(event.data, t):  # type: ignore[union-attr]
                        return False
                elif kind is h11.Response:
                    acc.on_response(event.status_code, _content_type(event.headers), t)  # type: ignore[union-attr]
                elif kind is h11.EndOfMessage:
                    acc.on_end(t)
                    if conn.our_state is h11.DONE and conn.their_state is h11.DONE:
                        conn.start_next_cycle()
                        return True
                    return False
                elif kind is h11.ConnectionClosed:
                    acc.connection_closed()
                    return False
                # h11.InformationalResponse (1xx): nothing to do
        except h11.RemoteProtocolError as exc:
            if eof:
                acc.connection_closed()
            else:
                acc.fail(Outcome.FAILED, f"HTTP protocol error: {exc}")
            return False


def _content_type(headers: Iterable[tuple[bytes, bytes]]) -> str | None:
    for name, value in headers:
        if name == b"content-type":
            return value.decode("latin-1")
    return None
