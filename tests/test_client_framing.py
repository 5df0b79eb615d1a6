"""The h11 client's body decoders (chunked, Content-Length, until close), without sockets."""

from __future__ import annotations

import h11
import pytest
from hypothesis import given
from hypothesis import strategies as st

from soakspec.runner.h11client import (
    ChunkedDecoder,
    LengthDecoder,
    UntilCloseDecoder,
    body_decoder,
)


def encode_chunked(payloads: list[bytes], ext: str, trailers: list[str]) -> bytes:
    out = b"".join(f"{len(p):X}{ext}\r\n".encode() + p + b"\r\n" for p in payloads if p)
    return out + b"0" + ext.encode() + b"\r\n" + b"".join(f"{t}\r\n".encode() for t in trailers) + b"\r\n"


def decode(decoder: ChunkedDecoder | LengthDecoder, pieces: list[bytes]) -> bytes:
    return b"".join(decoder.feed(p) for p in pieces)


def split(data: bytes, cuts: list[int]) -> list[bytes]:
    bounds = sorted({c % (len(data) + 1) for c in cuts})
    return [data[a:b] for a, b in zip([0, *bounds], [*bounds, len(data)])]


@given(
    payloads=st.lists(st.binary(min_size=0, max_size=40), max_size=8),
    ext=st.sampled_from(["", ";a=b", " ;x", ';name="v"']),
    trailers=st.lists(st.sampled_from(["X-A: 1", "Checksum: abc"]), max_size=2),
    cuts=st.lists(st.integers(min_value=0, max_value=500), max_size=15),
)
def test_chunked_any_split_decodes_the_payload(payloads, ext, trailers, cuts) -> None:
    """Property: a chunked body fed in any split yields its payload, ends, and has no extra."""
    data = encode_chunked(payloads, ext, trailers)
    d = ChunkedDecoder()
    assert decode(d, split(data, cuts)) == b"".join(payloads)
    assert d.done and not d.extra


def test_chunked_stops_at_the_end_and_notes_extra_bytes() -> None:
    d = ChunkedDecoder()
    assert d.feed(b"3\r\nabc\r\n0\r\n\r\nHTTP/1.1 200") == b"abc"
    assert d.done and d.extra
    d = ChunkedDecoder()
    assert d.feed(b"3\r\nabc\r\n") == b"abc" and not d.done


@pytest.mark.parametrize(
    "data",
    [b"x\r\n", b"3\r\nabcd\r\n", b"-1\r\n", b"0x3\r\nabc\r\n", b"+3\r\nabc\r\n", b"3\nabc\r\n",
     b"1" * 17 + b"\r\n", b"3" + b" " * 5000],
)  # fmt: skip
def test_chunked_rejects_malformed_framing(data: bytes) -> None:
    d = ChunkedDecoder()
    d.feed(data)
    assert d.error and not d.done


def test_chunked_returns_the_payload_before_an_error() -> None:
    d = ChunkedDecoder()
    assert d.feed(b"3\r\nabc\r\nzz\r\nxyz") == b"abc"
    assert d.error == "bad chunk size line b'zz\\r\\nxyz'"
    assert d.feed(b"3\r\nabc\r\n") == b""


def test_chunked_bounds_trailers() -> None:
    d = ChunkedDecoder()
    d.feed(b"0\r\n")
    for _ in range(100):
        d.feed(b"X-Long: " + b"a" * 500 + b"\r\n")
    assert d.error == "chunked trailers too large"
    d = ChunkedDecoder()
    d.feed(b"0\r\nX-Long: " + b"a" * 20000)
    assert d.error == "chunked trailers too large"


def test_length_decoder() -> None:
    d = LengthDecoder(5)
    assert (d.feed(b"ab"), d.done) == (b"ab", False)
    assert (d.feed(b"cdeXY"), d.done, d.extra) == (b"cde", True, True)
    assert LengthDecoder(0).done


def response(*headers: tuple[bytes, bytes], status: int = 200, version: bytes = b"1.1") -> h11.Response:
    return h11.Response(status_code=status, headers=list(headers), http_version=version)


def test_body_framing_from_the_head() -> None:
    d, keep = body_decoder(response((b"Transfer-Encoding", b"chunked")))
    assert type(d) is ChunkedDecoder and keep
    d, keep = body_decoder(response((b"Content-Length", b"7"), (b"Connection", b"close")))
    assert type(d) is LengthDecoder and not keep
    d, keep = body_decoder(response(version=b"1.0"))
    assert type(d) is UntilCloseDecoder and not keep
    d, keep = body_decoder(response(status=204))
    assert d.done and keep
