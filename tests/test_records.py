"""The request record (`soakspec.evidence.record`): what the runner's builder freezes and writes
is what every reader decodes, the schema is the type's, and decoded records read like the
JSON rows the judge was written against."""

from __future__ import annotations

import gzip
import json
import math
from array import array

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from soakspec.evidence import schema
from soakspec.evidence.io import GzipJsonlWriter, iter_jsonl, iter_jsonl_typed
from soakspec.evidence.record import (
    FOLLOW_UP_BUCKET, READ_KEYS, RECORD_KEYS, WARMUP_BUCKET, ItlSource, Outcome, Record, RequestRecord, TokensSource,
    decode_line, iter_records, request_schema,
)  # fmt: skip

_ANY_LINE = msgspec.json.Decoder(dict)  # a typed decoder for `iter_jsonl_typed`'s fast path
texts = st.text(max_size=12)  # quotes, backslashes, control characters, non-ASCII, surrogate-free
times = st.floats(0, 2e9, allow_nan=False, allow_infinity=False)
opt_times = st.none() | times
small = st.integers(0, 10**6)
gaps = st.floats(0, 5, allow_nan=False) | st.sampled_from([0.0, 0.0000005, 0.0000015, 0.0100005, 1e-7, 0.1234565])


@st.composite
def records(draw) -> RequestRecord:
    outcome = draw(st.sampled_from(Outcome))
    t0 = draw(times)
    later = st.none() | st.floats(0, 100, allow_nan=False).map(lambda d: t0 + d)
    end = draw(later) if outcome is not Outcome.COMPLETED else t0 + draw(st.floats(0, 100, allow_nan=False))
    return RequestRecord(
        request_id=draw(texts.filter(bool)), backend=draw(texts.filter(bool)), workload=draw(texts),
        level=draw(small), concurrency=draw(st.none() | st.integers(1, 10**6)), rate=draw(st.none() | st.floats(1e-3, 1e6)),
        bucket=draw(st.integers(-2, 10**4)), worker=draw(small),
        intended_start=t0, start=draw(later), first_byte=draw(later), first_token=draw(later), end=end,
        status=draw(st.none() | st.integers(100, 599)), outcome=outcome,
        error=None if outcome is Outcome.COMPLETED else draw(texts.filter(bool)),
        finish_reason=draw(st.none() | texts), server_id=draw(st.none() | texts),
        prompt_tokens=draw(st.none() | small), output_tokens=draw(small),
        tokens_source=draw(st.sampled_from(TokensSource)), itl_source=draw(st.sampled_from(ItlSource)),
        chunks=draw(small), tpot=draw(st.none() | gaps), itl=draw(st.lists(gaps, max_size=20)),
        output_sha256=draw(st.none() | st.sampled_from(["0" * 64, "ab" * 32])), output_chars=draw(small),
        empty_text=draw(st.booleans()), coalesced=draw(small), usage_decreased=draw(st.booleans()),
        client_delay=draw(st.none() | gaps),
    )  # fmt: skip


@settings(max_examples=300, deadline=None)
@given(records())
def test_a_frozen_record_reads_back_equal_and_valid(rec: RequestRecord) -> None:
    line = rec.to_line()
    assert line.endswith(b"\n") and line.count(b"\n") == 1
    frozen = rec.freeze()
    back = decode_line(line)
    assert back == frozen
    assert list(json.loads(line)) == list(RECORD_KEYS)
    # the generated schema accepts exactly what the runner writes
    assert not schema.validate("request", json.loads(line))
    # derived durations are defined once, from the intended start
    assert back.ttft == (None if frozen.first_token is None else frozen.first_token - frozen.intended_start)
    assert back.latency == (None if frozen.end is None else frozen.end - frozen.intended_start)
    # a builder made from the stored record freezes to the same record
    assert RequestRecord.from_json(back).freeze() == frozen


def test_itl_is_stored_as_integer_microseconds() -> None:
    rec = RequestRecord("r", backend="b", error="x", itl=[0.0, 0.0100004, 0.0100006, 2.5e-7, 1.0])
    stored = json.loads(rec.to_line())["itl_us"]
    assert stored == "00000000" "10270000" "11270000" "00000000" "40420f00"  # little-endian uint32s, in hex
    assert list(decode_line(rec.to_line()).gaps_us) == [0, 10000, 10001, 0, 1000000]
    assert list(decode_line(rec.to_line()).itl) == [0.0, 0.01, 0.010001, 0.0, 1.0]


@pytest.mark.parametrize("field", ["start", "end", "tpot", "itl"])
def test_non_finite_times_are_refused(field: str) -> None:
    rec = RequestRecord("r", backend="b", error="x", start=1.0, end=2.0)
    setattr(rec, field, [math.inf] if field == "itl" else math.nan)
    with pytest.raises(ValueError):
        rec.to_line()


def test_ttft_and_latency_fall_back_to_the_start_without_an_intended_start() -> None:
    r = RequestRecord("r", backend="b", start=10.0, first_token=10.25, end=11.0, outcome=Outcome.COMPLETED).freeze()
    assert (r.ttft, r.latency) == (0.25, 1.0)
    r2 = RequestRecord("r", backend="b", intended_start=9.0, start=10.0, first_token=10.25, end=11.0,
                       outcome=Outcome.COMPLETED).freeze()  # fmt: skip
    assert (r2.ttft, r2.latency) == (1.25, 2.0)  # a late scheduler is charged


def test_records_read_like_json_rows() -> None:
    r = RequestRecord("r1", backend="a", workload="w", start=1.0, intended_start=1.0, first_token=1.1, end=2.0,
                      status=200, outcome=Outcome.COMPLETED, output_tokens=3, chunks=3, itl=[0.1, 0.1]).freeze()
    assert r["request_id"] == "r1" and r.get("bucket") == 0 and r.get("nope", 7) == 7
    assert r["ttft"] == pytest.approx(0.1) and list(r["itl"]) == [0.1, 0.1] and "latency" in r and "nope" not in r
    with pytest.raises(KeyError):
        r["nope"]
    d = {**r, "outcome": "failed"}  # how the judge re-labels a row
    assert set(d) == set(READ_KEYS) and d["outcome"] == "failed" and d["end"] == 2.0
    from collections.abc import Mapping

    assert isinstance(r, Mapping)


def test_new_fields_have_defaults_so_older_lines_still_decode() -> None:
    d = json.loads(RequestRecord("r", backend="b", error="x").to_line())
    for k in ("coalesced", "usage_decreased", "client_delay", "empty_text"):
        del d[k]
    r = decode_line(json.dumps(d))
    assert (r.coalesced, r.usage_decreased, r.client_delay, r.empty_text) == (0, False, None, False)


@pytest.mark.parametrize(("edit", "pointer"), [
    ({"bucket": "1"}, "/bucket"), ({"outcome": "exploded"}, "/outcome"), ({"itl_us": [1, -1]}, "/itl_us"), ({"itl_us": "0000000"}, "/itl_us"),
    ({"itl_us": "0000000A"}, "/itl_us"), ({"itl_us": "00000000\n"}, "/itl_us"), ({"itl_us": "w00000000"}, "/itl_us"),

    ({"extra": 1}, ""), ({"outcome": "completed", "error": "x"}, "/error"), ({"error": None}, "/error"),
    ({"output_sha256": "XYZ"}, "/output_sha256"), ({"output_sha256": "A" * 64}, "/output_sha256"),
    ({"output_sha256": "0" * 63 + "\n"}, "/output_sha256"), ({"output_sha256": "0" * 64 + "\n"}, "/output_sha256"),
    ({"status": 700}, "/status"),
])  # fmt: skip
def test_a_broken_line_is_located_and_the_schema_agrees(edit, pointer) -> None:
    d = json.loads(RequestRecord("r", backend="b", error="boom", start=1.0, end=2.0).to_line()) | edit
    errors: list = []
    invalid: list = []
    import tempfile, os

    with tempfile.TemporaryDirectory() as tmp:
        p = os.path.join(tmp, "requests.jsonl.gz")
        with GzipJsonlWriter(p) as w:
            w.write_lines((json.dumps(d) + "\n").encode())
        assert list(iter_records(p, errors, schema_errors=invalid)) == []
    assert not errors and len(invalid) == 1 and invalid[0][1].startswith(pointer), invalid
    assert schema.validate("request", d)  # the JSON Schema rejects it too


def test_the_shipped_schema_is_the_one_generated_from_the_type() -> None:
    assert schema.load_schema("request") == json.loads(json.dumps(request_schema())), (
        "regenerate soakspec/evidence/schemas/request.schema.json from soakspec.evidence.record.request_schema()")


def test_bucket_sentinels() -> None:
    assert (WARMUP_BUCKET, FOLLOW_UP_BUCKET) == (-1, -2)
    r = RequestRecord("r", backend="b", error="x", bucket=FOLLOW_UP_BUCKET).freeze()
    assert not r.measured and RequestRecord("r", backend="b", error="x", bucket=0).freeze().measured


def test_gzip_members_per_bucket_read_as_one_stream(tmp_path) -> None:
    """One member per bucket: plain gzip tools read the file whole, and so do the readers."""
    recs = [RequestRecord(f"r{i}", backend="b", error="x", bucket=i // 2) for i in range(6)]
    p = tmp_path / "requests.jsonl.gz"
    with GzipJsonlWriter(p) as w:
        for b in range(3):
            w.write_lines(b"".join(r.to_line() for r in recs[2 * b: 2 * b + 2]))
            w.flush_fsync()
    assert gzip.decompress(p.read_bytes()).count(b"\n") == 6
    assert [r.request_id for _, r in iter_records(p)] == [f"r{i}" for i in range(6)]
    assert [row["request_id"] for _, row in iter_jsonl(p)] == [f"r{i}" for i in range(6)]


def test_appended_garbage_after_the_members_is_corruption(tmp_path) -> None:
    p = tmp_path / "requests.jsonl.gz"
    with GzipJsonlWriter(p) as w:
        w.write_lines(RequestRecord("r", backend="b", error="x").to_line())
    with open(p, "ab") as f:
        f.write(b'{"request_id": "smuggled"}\n')
    errors: list = []
    assert [r.request_id for _, r in iter_records(p, errors)] == ["r"]
    assert errors == [(2, "bytes after the last gzip member are not gzip (appended to?)")]


def test_the_judge_reads_runner_lines_back_equal(tmp_path) -> None:
    from soakspec.judge.evidence import _compact_request, _read_rows

    recs = [RequestRecord(f"r{i}", backend="b", workload="w", start=1.0 + i, intended_start=1.0 + i, end=2.0 + i,
                          first_token=1.5 + i, status=200, outcome=Outcome.COMPLETED, itl=[0.25, 0.125])
            for i in range(3)]  # fmt: skip
    path = tmp_path / "requests.jsonl.gz"
    with GzipJsonlWriter(path) as w:
        w.write_lines(b"".join(r.to_line() for r in recs))
    problems: list[str] = []
    rows = _read_rows(path, "requests.jsonl.gz", problems, [], required=True, compact=_compact_request)
    assert not problems
    assert rows == [r.freeze() for r in recs] and all(isinstance(r, Record) for r in rows)


def test_decode_is_typed_not_coerced() -> None:
    d = json.loads(RequestRecord("r", backend="b", error="x").to_line())
    with pytest.raises(msgspec.ValidationError):
        decode_line(json.dumps(d | {"output_tokens": True}))


_tie_times = st.builds(lambda k, d: (k + 0.5) / 1e6 + d, st.integers(0, 4 * 10**15), st.sampled_from([0.0, 1e-13, -1e-13, 5e-7]))


@settings(max_examples=3000)
@given(st.floats(allow_nan=False, allow_infinity=False) | times | _tie_times | st.floats(0, 0.01))
def test_freezing_rounds_times_to_the_microsecond_exactly_as_round_does(t: float) -> None:
    """The builder's fast rounding (record._round6, record._round_us) is round(t, 6) itself --
    value and sign of zero -- for every finite double, near-ties and epoch times included."""
    from soakspec.evidence.record import _round6, _round_us

    want = round(t, 6)
    for got in (_round6(t), _round_us(t)):
        assert got == want and math.copysign(1.0, got) == math.copysign(1.0, want), (t, got, want)
    rec = RequestRecord("r", start=abs(t), end=abs(t), tpot=abs(t), client_delay=abs(t)).freeze()
    assert rec.start == rec.end == rec.tpot == rec.client_delay == round(abs(t), 6)


def _table_state(t) -> dict:
    import numpy as np

    return {
        "n": t.n, "f": {k: np.asarray(v).tobytes() for k, v in t.f.items()},  # a MicroColumn: the float64 values it holds
        "held": {k: type(v).__name__ for k, v in t.f.items()},  # as 4 bytes a request or 8, alike either way
        "i": {k: v.tolist() for k, v in t.i.items()},
        "c": {k: [t.values[k][c] if k in t.values else c for c in v.tolist()] for k, v in t.c.items()},
        "labels": {k: [(type(x).__name__, x) for x in v] for k, v in t.values.items()},
        "sparse": t.sparse, "ids": list(t.ids), "extras": t.extras, "itl": t.itl[:].tolist(),
        "itl_off": t.itl_off.tolist(), "scale": t.itl_scale,
    }


@settings(max_examples=150, deadline=None)
@given(st.lists(records(), max_size=12), st.lists(st.integers(1, 5), max_size=6), st.booleans())
def test_columns_filled_a_batch_at_a_time_equal_those_filled_a_record_at_a_time(recs, cuts, string_level) -> None:
    """`TableBuilder.add_records` (what the judge does with each block verify decodes) builds
    exactly the table `add` of each record builds: same columns, codes, extras, ITL."""
    frozen = [r.freeze() for r in recs]
    if string_level and frozen:  # a record with a string level (kept in extras) sends its batch row by row
        frozen[0] = msgspec.structs.replace(frozen[0], level="warm")
    _same_table_a_batch_or_a_row_at_a_time(frozen, cuts)


def _same_table_a_batch_or_a_row_at_a_time(frozen: list, cuts: list[int]) -> None:
    """`add` of each record and `add_records` of batches cut at `cuts` build the same table,
    whatever number of records `add_records` holds before it appends them (`BULK_ROWS`), and
    with a batch now and then added a row at a time (`add`) between the others."""
    import unittest.mock

    from soakspec.judge import table
    from soakspec.judge.table import TableBuilder

    one = TableBuilder()
    for r in frozen:
        one.add(r)
    want = _table_state(one.finish())
    for bulk in (1, 3, 1024):
        for rows_too in (False, True):
            with unittest.mock.patch.object(table, "BULK_ROWS", bulk):
                many = TableBuilder()
                k = 0
                for j, c in enumerate(cuts + [len(frozen)]):
                    if rows_too and j % 2:
                        for r in frozen[k:k + c]:
                            many.add(r)
                    else:
                        many.add_records(frozen[k:k + c])
                    k += c
                assert _table_state(many.finish()) == want, (bulk, rows_too)


def test_two_records_on_one_line_and_a_blank_line_are_errors_in_a_block_as_line_by_line(tmp_path) -> None:
    """A block is decoded in one call only when that call sees one record a line: two records
    on one line with a whitespace-only line after them hold as many records as lines, but
    each line is read as the line-by-line reading reads it (invalid JSON; an empty line)."""
    from soakspec.evidence.record import iter_record_batches

    good = [RequestRecord(request_id=f"r{i}", backend="b", workload="w", level=1, bucket=0, outcome=Outcome.COMPLETED,
                          start=1.0, intended_start=1.0, end=2.0, output_tokens=3).to_line()
            for i in range(4)]
    body = good[0] + good[1].rstrip(b"\n") + b" " + good[2] + b" \n" + good[3]
    p = tmp_path / "requests.jsonl"
    p.write_bytes(body)
    errs_a: list = []
    lines = [(i, r.request_id) for i, r in iter_records(p, errs_a, schema_errors=[])]
    assert lines == [(1, "r0"), (4, "r3")]
    assert [e[0] for e in errs_a] == [2, 3]  # two values on line 2; line 3 holds only a space
    errs_b: list = []
    batches = list(iter_record_batches(p, errs_b, schema_errors=[]))
    assert [(f + k, r.request_id) for f, rs in batches for k, r in enumerate(rs)] == lines
    assert errs_b == errs_a
    for fast in (True, False):  # the generic JSONL reading agrees
        errs_c: list = []
        assert [i for i, _row, _typed in iter_jsonl_typed(p, errs_c, fast=_ANY_LINE if fast else None)] == [1, 4]
        assert [e[0] for e in errs_c] == [2, 3]


tiny = st.text(alphabet="ab-0", max_size=4)  # ids and affixes that overlap: an id may also start inside the prefix


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(tiny, st.integers(0, 3)), min_size=1, max_size=10), tiny, tiny,
       st.lists(st.integers(1, 5), max_size=4))
def test_server_ids_around_the_request_id_are_coded_alike_a_batch_or_a_row_at_a_time(rows, pre, suf, cuts) -> None:
    """The batch path of `add_records` codes a batch whose server ids are all the request id
    inside one affix (`cmpl-{id}-0`) at once; where `find` would cut a server id elsewhere (an
    empty id, an id whose start is also in the prefix) or a row differs, it must give exactly
    the codes and kept server ids that `add`, a row at a time, gives."""
    kinds = [lambda r: pre + r + suf, lambda r: None, lambda r: "x" + pre + r + suf, lambda r: pre + suf]
    frozen = [RequestRecord(request_id=rid, backend="b", workload="w", level=1, bucket=0, outcome=Outcome.FAILED,
                            error="e", start=1.0, intended_start=1.0, server_id=kinds[kind](rid)).freeze()
              for rid, kind in rows]
    _same_table_a_batch_or_a_row_at_a_time(frozen, cuts)


def test_a_file_is_read_in_batches_of_the_same_records_and_errors_as_line_by_line(tmp_path) -> None:
    from soakspec.evidence.record import iter_record_batches

    good = [RequestRecord(request_id=f"r{i}", backend="b", workload="w", level=1, bucket=0, outcome=Outcome.COMPLETED,
                          start=1.0, intended_start=1.0, end=2.0, output_tokens=3, itl=[0.001, 0.002]).to_line()
            for i in range(6)]
    bad_json = b'{"request_id": \n'
    broken = good[0].replace(b'"end":2.0', b'"end":null')
    early = good[0].replace(b'"end":2.0', b'"end":0.5')  # ends before it started
    blank_error = good[0].replace(b'"outcome":"completed"', b'"outcome":"failed"').replace(b'"error":null', b'"error":""')
    body = good[0] + good[1] + bad_json + good[2] + broken + b"\n" + good[3] + good[4] + early + blank_error + good[5][:-9]
    p = tmp_path / "requests.jsonl"
    p.write_bytes(body)
    errs_a: list = []
    inv_a: list = []
    lines = [(i, r.request_id) for i, r in iter_records(p, errs_a, schema_errors=inv_a)]
    errs_b: list = []
    inv_b: list = []
    batches = list(iter_record_batches(p, errs_b, schema_errors=inv_b))
    assert [(f + k, r.request_id) for f, rs in batches for k, r in enumerate(rs)] == lines
    assert lines == [(1, "r0"), (2, "r1"), (4, "r2"), (7, "r3"), (8, "r4")]
    assert errs_a == errs_b and inv_a == inv_b
    assert [e[0] for e in errs_a] == [3, 6, 11] and errs_a[-1][1] is None  # bad JSON, empty line, cut-off end
    assert [e[:2] for e in inv_a] == [(5, "/end"), (9, "/end"), (10, "/error")]  # no end; end before start; no error


@settings(max_examples=200, deadline=None)
@given(st.lists(st.lists(st.integers(-5, 70_000) | st.integers(0, 2**31 - 1), max_size=9), max_size=8), st.data())
def test_packed_gaps_read_back_every_gap_exactly(runs, data) -> None:
    """The judge keeps whole-microsecond gaps in 2 bytes (a stall beyond 65 ms or a negative
    gap beside them, exactly): slices and masks give back the gaps as they were."""
    import numpy as np

    from soakspec.judge.table import _GapStore

    store = _GapStore()
    for run in runs:
        store.extend(np.asarray(run, dtype=np.int64))
    every = [g for run in runs for g in run]
    packed = store.finish()
    assert packed[:].tolist() == every
    a = data.draw(st.integers(0, len(every)))
    b = data.draw(st.integers(a, len(every)))
    assert packed[a:b].tolist() == every[a:b]
    mask = np.asarray(data.draw(st.lists(st.booleans(), min_size=len(every), max_size=len(every))), dtype=bool)
    assert packed[mask].tolist() == [g for g, m in zip(every, mask) if m]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.lists(st.text(min_size=1, max_size=6), max_size=5), max_size=5), st.data())
def test_the_id_column_reads_back_every_id(runs, data) -> None:
    """Request ids held as one UTF-8 blob (non-ASCII and lone surrogates included) read back
    as they were, one at a time, in a batch and iterated."""
    from soakspec.evidence.ids import take_ids

    runs = [[x + "\ud800" if k % 3 == 2 else x for x in run] for k, run in enumerate(runs)]
    every, rows = _ids_read_back(runs, data)
    assert take_ids(every, rows) == [every[r] for r in rows.tolist()]


def _ids_read_back(runs, data):
    """Store `runs` of ids (extend a run, append one at a time, alternately) and check every id
    reads back: iterated, indexed and taken in a batch. Returns (the ids, the rows taken)."""
    import numpy as np

    from soakspec.evidence.ids import IdStore, take_ids

    store = IdStore()
    every: list[str] = []
    for k, run in enumerate(runs):
        if k % 2:
            for x in run:
                store.append(x)
        else:
            store.extend(run)
        every += run
    col = store.finish()
    assert list(col) == every and len(col) == len(every) and [col[i] for i in range(len(every))] == every
    assert col.lengths() == set(map(len, every))  # what trace matching reads of the ids, none made
    rows = np.asarray(data.draw(st.lists(st.integers(0, max(len(every) - 1, 0)), max_size=8)) if every else [], dtype=np.int64)
    assert take_ids(col, rows) == [every[r] for r in rows.tolist()]
    return every, rows


numbered_ids = st.builds(lambda stem, n, w: stem + str(n).zfill(w), st.sampled_from(["soak-5ca1ab1e-0-", "soak-5ca1ab1e-1-", "r", "", "x9-", "é-"]),
                         st.integers(0, 10**12), st.integers(1, 14))


@settings(max_examples=300, deadline=None)
@given(st.lists(st.lists(st.one_of(numbered_ids, numbered_ids, st.text(max_size=6), st.just("0" * 19), st.just("a\u0661")),
                         max_size=6), max_size=6), st.data())
def test_numbered_ids_read_back_as_they_were(runs, data) -> None:
    """Ids the runner writes (a stem and a zero-padded number) are held as a stem code and an
    integer; any id that is not one (a 19-digit number, a non-ASCII digit, no digits) turns the
    column to text -- either way every id reads back exactly, in any order of appends."""
    _ids_read_back(runs, data)


def test_runner_ids_take_a_few_bytes_each() -> None:
    from soakspec.evidence.ids import IdStore
    from soakspec.judge.table import compact_codes

    store = IdStore()
    store.extend([f"soak-5ca1ab1e-0-{k:07d}" for k in range(10_000)])
    col = store.finish(compact_codes)  # as the judge's table holds them
    assert col.nbytes < 6 * 10_000 and col[9_999] == "soak-5ca1ab1e-0-0009999"


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(st.integers(0, 2**33), st.lists(st.integers(0, 2**33), max_size=5),
                          st.lists(st.integers(0, 2**32 - 1), max_size=5)), max_size=12))
def test_row_counts_and_offsets_held_in_four_bytes_read_back_as_they_were(pieces) -> None:
    """A table's offsets and id numbers are appended (one at a time or a block at a time) in 4
    bytes while each is below 2**32 and in 8 from the first that is not: every value reads back
    as it was, and 4 bytes a value when none needed more."""
    import numpy as np

    from soakspec.evidence.ids import U32, as_numbers, put_numbers

    a, every = array(U32), []
    for p in pieces:
        a = put_numbers(a, p if isinstance(p, int) else np.asarray(p, dtype=np.int64))
        every += [p] if isinstance(p, int) else p
    got = as_numbers(a)
    assert got.tolist() == every
    assert got.itemsize == (4 if all(v < 2**32 for v in every) else 8)


@pytest.mark.parametrize("far_at", [None, 0, 1500, 2999])
def test_a_time_that_cannot_be_held_in_microseconds_turns_the_column_to_float64_and_loses_nothing(far_at) -> None:
    """The builder holds end, first_token and tpot as whole microseconds after the start from
    the first block on; a value it cannot hold so (an end an hour after its start), in any
    block, turns that column to float64 with every value before it read back exactly, and
    leaves the others as they are."""
    import unittest.mock

    import numpy as np

    from soakspec.judge import table
    from soakspec.judge.table import MicroColumn, TableBuilder

    recs = []
    for i in range(3000):
        t0 = 1.7e9 + i * 0.013
        end = t0 + (3600.5 if i == far_at else 0.25 + i * 1e-6)
        recs.append(RequestRecord(f"r{i}", backend="b", workload="w", bucket=i // 700, outcome=Outcome.COMPLETED,
                                  intended_start=t0, start=t0, first_token=t0 + 0.01 + i * 2e-6,
                                  first_byte=t0 + 0.01 + i * 2e-6, end=end,
                                  tpot=0.004 + i * 1e-6, itl=[0.001, 0.002]).freeze())
    with unittest.mock.patch.object(table, "SCAN_CHUNK", 256):
        b = TableBuilder()
        for k in range(0, len(recs), 1000):
            b.add_records(recs[k:k + 1000])
        t = b.finish()
    for k in ("end", "first_token", "tpot", "start"):
        got = np.asarray(t.f[k])
        assert got.tobytes() == np.array([getattr(r, k) for r in recs], dtype=np.float64).tobytes(), k
    assert isinstance(t.f["end"], MicroColumn) == (far_at is None)
    assert isinstance(t.f["first_token"], MicroColumn) and isinstance(t.f["tpot"], MicroColumn)
    assert t.f["first_byte"] is t.f["first_token"] and t.f["intended_start"] is t.f["start"]
