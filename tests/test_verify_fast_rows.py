"""verify's typed fast path for traces.jsonl.gz rows (`verify._ShortTrace`, `io.iter_jsonl_typed`):
a row the type accepts is one the trace schema accepts, read as the same JSON values, so
skipping its schema check changes nothing; anything else is read and validated as before."""

from __future__ import annotations

import gzip
import json

import msgspec
from hypothesis import given, settings
from hypothesis import strategies as st

from soakspec.evidence import schema
from soakspec.evidence.io import iter_jsonl, iter_jsonl_typed
from soakspec.evidence.verify import _FAST_ROWS, _ShortTrace
from soakspec.evidence import layout

values = (st.none() | st.booleans() | st.integers(-3, 2**70) | st.floats(allow_nan=False, allow_infinity=False)
          | st.text(max_size=8) | st.sampled_from(["unknown_id", "outside_window", "no_id", "incomplete", "server.log"])
          | st.lists(st.integers(0, 3), max_size=2) | st.dictionaries(st.text(max_size=3), st.integers(), max_size=2))
keys = ["schema_version", "trace_id", "request_id", "matched", "reason", "source", "offset", "window_checked", "times",
        "payload", "extra", "wall_step_s"]


@st.composite
def rows(draw) -> dict:
    good = {"schema_version": 1, "trace_id": draw(st.none() | st.text(max_size=8)), "request_id": draw(st.none() | st.text(max_size=8)),
            "matched": draw(st.booleans()), "reason": draw(st.sampled_from([None, "unknown_id", "outside_window", "no_id", "incomplete"])),
            "source": "server.log", "offset": draw(st.none() | st.integers(0, 2**40))}
    if draw(st.booleans()):
        good["window_checked"] = draw(st.booleans())
    if draw(st.booleans()):  # matched across a wall-clock step
        good["wall_step_s"] = draw(st.floats(-1e6, 1e6) | st.integers(-5, 5))
    for k in draw(st.lists(st.sampled_from(keys), max_size=3)):  # break or add a key now and then
        if draw(st.booleans()):
            good[k] = draw(values)
        else:
            good.pop(k, None)
    return good


@settings(max_examples=400, deadline=None)
@given(rows())
def test_a_row_the_type_takes_is_valid_and_reads_the_same(row: dict) -> None:
    line = json.dumps(row).encode()
    try:
        got = msgspec.to_builtins(msgspec.json.decode(line, type=_ShortTrace))
    except msgspec.ValidationError:
        return  # read and validated the slow way
    assert not schema.validate("trace", row), row
    assert got == row


def _write(path, rows: list[bytes]) -> None:
    with gzip.open(path, "wb") as fh:
        fh.write(b"".join(rows))


def test_a_block_with_a_bad_row_is_read_line_by_line_with_the_same_rows_and_errors(tmp_path) -> None:
    ok = [json.dumps({"matched": True, "offset": 10 * i, "reason": None, "request_id": f"r{i}", "schema_version": 1,
                      "source": "server.log", "trace_id": f"t{i}", "window_checked": True}).encode() + b"\n" for i in range(5)]
    full = json.dumps({"matched": False, "offset": None, "reason": "unknown_id", "request_id": None, "schema_version": 1,
                       "source": "server.log", "trace_id": "x", "times": [1.0], "payload": {"a": 1}}).encode() + b"\n"
    lines = ok[:2] + [b"{not json\n", full] + ok[2:] + [ok[0][:-5]]
    p = tmp_path / layout.TRACES
    _write(p, lines)
    e1: list = []
    plain = list(iter_jsonl(p, e1))
    e2: list = []
    typed = list(iter_jsonl_typed(p, e2, None, _FAST_ROWS[layout.TRACES]))
    assert [(i, r) for i, r, _ in typed] == plain and e1 == e2
    assert [i for i, _ in plain] == [1, 2, 4, 5, 6, 7] and [e[0] for e in e1] == [3, 8]
    # a block of clean rows takes the fast path
    _write(p, ok)
    assert all(t for _, _, t in iter_jsonl_typed(p, [], None, _FAST_ROWS[layout.TRACES]))
