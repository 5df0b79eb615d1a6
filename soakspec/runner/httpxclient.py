"""The reference client: the `H11Connection.send` contract over one long-lived httpx client.

Used for the control plane and to cross-check the hot-path client: for the same server
behaviour both fill identical records (ids and timestamps aside), because both hand the bytes
to the same `protocol.StreamAccumulator`. httpx errors are translated here, at the edge.

One clock per record: httpx has no kernel receive stamps, so every arrival (first byte, each
read, the end) is this client's own `clock.now()` at the read -- one source for the whole
record; `end` is the read that completed the body, and `client_delay` the time from it to the
record being filled in (protocol.py, "One clock per record").
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import httpx
import trio

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

CLOSE_GRACE = 1.0  # seconds allowed for closing a response after the request ended

# What h11 (inside httpcore) and httpcore say when the peer closes the connection early.
_CLOSED_MARKERS = ("peer closed connection", "peer unexpectedly closed connection", "Server disconnected")


# A connection the server closed while it sat idle in the pool (its keep-alive timeout --
# uvicorn's, vLLM's and SGLang's, is 5 s -- against a 5 s scrape or probe interval) fails the
# next request sent on it before any answer: "Server disconnected without sending a response".
# Go's HTTP client (Prometheus scrapes with it) sends such an idempotent request again on a
# new connection; the control plane's GETs (a /metrics scrape, a liveness probe) do too, once:
# the server never saw the first. A second such failure is the server's.
NO_ANSWER = (httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError)
IDEMPOTENT = frozenset({"GET", "HEAD", "OPTIONS"})


async def send_once_more_if_unanswered(http: httpx.AsyncClient, method: str, url: str, *, stream: bool = False) -> httpx.Response:
    """`http.send` of `method url`; an idempotent request the connection dropped before any
    answer (`NO_ANSWER`) is sent again once (the pool gives it a new connection)."""
    try:
        return await http.send(http.build_request(method, url), stream=stream)
    except NO_ANSWER:
        if method.upper() not in IDEMPOTENT:
            raise
    return await http.send(http.build_request(method, url), stream=stream)


class HttpxClient:
    """Sends requests to `base_url` (e.g. `http://127.0.0.1:8000`) through `client`.

    The caller owns `client` (one per run, passed down) and closes it. Timeouts of the
    client are not used: each request has its own absolute deadline.
    """

    def __init__(
        self,
        client: httpx.AsyncClient,
        base_url: str,
        clock: RunClock,
        *,
        api_key: str | None = None,
        limits: Limits = DEFAULT_LIMITS,
    ) -> None:
        self._client = client
        self._base_url = base_url.rstrip("/")
        self._clock = clock
        self._limits = limits
        base = {"user-agent": f"soakspec/{__version__}", "content-type": "application/json"}
        base["accept-encoding"] = "identity"  # the body as sent (httpx would ask for gzip); read raw, never decoded
        if api_key:
            base["authorization"] = f"Bearer {api_key}"
        self._base_headers = base

    async def send(
        self,
        shape: RequestShape,
        request_id: str,
        headers: Iterable[tuple[str, str]],
        record: RequestRecord,
        *,
        deadline: float = math.inf,
    ) -> None:
        """Send one request and fill `record`; same contract as `H11Connection.send`."""
        clock = self._clock
        if record.start is None:  # else the load loop's read (`load.Connection`)
            record.start = clock.now()
        if record.intended_start is None:
            record.intended_start = record.start
        acc = StreamAccumulator(shape, self._limits)
        head = dict(self._base_headers)
        head["accept"] = "text/event-stream" if shape.stream else "application/json"
        head["x-request-id"] = request_id
        head.update(headers)
        request = self._client.build_request(
            "POST", self._base_url + shape.path, content=build_body(shape, request_id), headers=head, timeout=None
        )
        with trio.move_on_at(clock.to_trio(deadline)) as scope:
            await self._exchange(request, acc, record)
        if scope.cancelled_caught:
            acc.fail(Outcome.TIMEOUT, DEADLINE_PASSED)
        acc.finish(record, clock.now())

    async def _exchange(self, request: httpx.Request, acc: StreamAccumulator, record: RequestRecord) -> None:
        now = self._clock.now
        response: httpx.Response | None = None
        try:
            response = await self._client.send(request, stream=True)
            record.first_byte = now()
            acc.on_response(response.status_code, response.headers.get("content-type"), response.headers.get("content-encoding"))
            async for data in response.aiter_raw():
                if not acc.on_body(data, now()):
                    break
            else:
                acc.on_end(now())
        except httpx.RemoteProtocolError as exc:
            if any(m in str(exc) for m in _CLOSED_MARKERS):
                acc.connection_closed()
            else:
                acc.fail(Outcome.FAILED, f"HTTP protocol error: {exc}")
        except httpx.ConnectError as exc:
            unsent = not_sent_error(exc)
            if unsent is not None:  # the load generator's own limit (runner/fdlimit.py): never sent
                record.start = None
                acc.fail(Outcome.DISCONNECTED, unsent)
            else:
                acc.fail(Outcome.DISCONNECTED, CONNECT_FAILED + describe_transport_error(exc))
        except httpx.TransportError as exc:
            acc.fail(Outcome.DISCONNECTED, describe_transport_error(exc))
        finally:
            if response is not None:
                with trio.CancelScope(shield=True), trio.move_on_after(CLOSE_GRACE):
                    await response.aclose()
