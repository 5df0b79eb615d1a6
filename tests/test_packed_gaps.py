"""The record's hex fields, checked a block at a time rather than by a pattern a record.

A record's per-token gaps are one packed string (evidence format 3): hex of little-endian
uint32 microseconds, "w" and uint64s when a gap needs them. What a user would notice if this
went wrong: a gap read back different from the one measured, a judge that reads a block of
records differently from one record at a time, a hand-edited or corrupt string judged instead of
refused, or evidence written by an earlier soakspec (gaps as JSON arrays) no longer judged the
same."""

from __future__ import annotations

import gzip
import json
import re

from hypothesis import given, settings, strategies as st

from soakspec.evidence import schema
from soakspec.evidence.record import (
    PACKED_PROBLEM, RequestRecord, decode_line, pack_gaps, packed_ok, request_schema, shas_ok, unpack_block, unpack_gaps,
)
from soakspec.evidence.testing import sample_request
from soakspec.evidence.verify import verify_evidence
from soakspec.judge.evidence import load_evidence
from soakspec.judge.joined import join
from soakspec.judge.judge import judge_run
from soakspec.judge.summary import summarize_run
from soakspec.judge.testing import EvidenceBuilder, small_spec
from tests.test_judge_columnar import RULES
from tests.test_verify import _rebind
from soakspec.evidence.io import sha256_file, write_json_atomic

narrow_gap = st.integers(0, 2**32 - 1)
any_gap = st.one_of(narrow_gap, st.integers(2**32, 2**63 - 1))


@settings(max_examples=300, deadline=None)
@given(st.lists(any_gap, max_size=40))
def test_packing_round_trips_every_gap_and_the_schema_takes_it(gaps):
    s = pack_gaps(gaps)
    assert list(unpack_gaps(s)) == gaps
    assert s.startswith("w") == any(g >= 2**32 for g in gaps)  # wide only when a gap needs it
    assert packed_ok(s)
    assert not schema.validate("request", sample_request(0, itl_us=s))
    # one record's gaps through the record type, as a reader decodes the line
    rec = RequestRecord("r", backend="b", error="x", itl=[g / 1e6 for g in gaps if g < 2**52])
    line = rec.to_line()
    assert list(decode_line(line).gaps_us) == [round(g * 1e6) for g in rec.itl]


def _rehash(root, path) -> None:
    """The manifest's sha256 of the requests file at `path`, after a test rewrote it."""
    m = json.loads((root / "manifest.json").read_text())
    m["artifacts"][path.relative_to(root).as_posix()] = sha256_file(path)
    write_json_atomic(root / "manifest.json", m)
    _rebind(root, *(n for n in ("results.json", "verdict.json") if (root / n).exists()))


_PATTERN = re.compile(request_schema()["properties"]["itl_us"]["anyOf"][0]["pattern"])


@settings(max_examples=500, deadline=None)
@given(st.text(alphabet="0f8aAw \n", max_size=40))
def test_the_reader_and_the_schema_agree_on_any_string(s):
    """packed_ok is the schema's pattern, plus the one thing a pattern cannot say: a wide gap
    must fit int64 (the schema documents it; verify checks it)."""
    matches = _PATTERN.search(s) is not None
    fits = not matches or not s.startswith("w") or all(int.from_bytes(bytes.fromhex(s[1 + k:17 + k]), "little") < 2**63
                                                         for k in range(0, len(s) - 1, 16))
    assert packed_ok(s) == (matches and fits)
    if not matches:
        assert schema.validate("request", sample_request(0, itl_us=s))


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(st.lists(narrow_gap, max_size=8).map(pack_gaps),
                          st.lists(any_gap, max_size=4).map(pack_gaps),
                          st.text(alphabet="0fF w\n", max_size=12),
                          st.lists(narrow_gap, max_size=3).map(tuple)), max_size=8))
def test_a_block_unpacks_as_its_records_do_or_not_at_all(values):
    """The judge unpacks a block of records in one call; when it cannot (a wide or legacy
    value, a bad string), it says so and the records are read one at a time. It never returns
    gaps that differ from the records' own."""
    got = unpack_block(values)
    if got is None:
        assert not all(type(v) is str and not v.startswith("w") and packed_ok(v) for v in values)
        return
    counts, flat = got
    assert all(type(v) is str and packed_ok(v) for v in values)
    assert counts.tolist() == [len(unpack_gaps(v)) for v in values]
    assert flat.tolist() == [g for v in values for g in unpack_gaps(v)]


def test_a_gap_beyond_int64_is_refused_at_its_field_by_verify(tmp_path):
    spec = small_spec("require failed == 0")
    root = EvidenceBuilder(spec, per_bucket=4).write(tmp_path / "run")
    path = next(root.glob("backends/*/requests.jsonl.gz"))
    lines = gzip.decompress(path.read_bytes()).decode().splitlines()
    row = json.loads(lines[1])
    row["itl_us"] = "w" + "ff" * 8  # 2**64 - 1: no int64
    lines[1] = json.dumps(row)
    path.write_bytes(gzip.compress(("\n".join(lines) + "\n").encode()))
    _rehash(root, path)
    report = verify_evidence(root)
    assert report.result == "failed"
    assert any("/itl_us" in str(p) and PACKED_PROBLEM[:20] in str(p) for p in report.problems), report.problems


def test_a_gap_longer_than_71_minutes_is_kept_and_judged(tmp_path):
    """A stalled stream that resumed after 80 minutes: the gap is wide (uint64), the block
    holding it is read record by record, and the judge sees 1h20m, not a wrapped uint32."""
    spec = small_spec("require failed == 0\nrequire max(itl) < 1h")
    b = EvidenceBuilder(spec, per_bucket=6)
    r = next(b.measured(next(iter(b.records))))
    r["itl"] = [4800.0] + list(r["itl"][1:])
    root = b.write(tmp_path / "run")
    path = next(root.glob("backends/*/requests.jsonl.gz"))
    assert b'"itl_us":"w' in gzip.decompress(path.read_bytes())
    ev = load_evidence(root)
    run = join(spec, ev)
    verdict = judge_run(run)
    assert verdict.outcome == "FAIL"
    assert any("max(itl) = 1h20m" in r.message for r in verdict.rules if r.status == "fail"), [(r.status, r.message) for r in verdict.rules]


def test_evidence_written_before_format_3_is_judged_the_same(tmp_path):
    """Evidence of an earlier soakspec holds each record's gaps as a JSON array of integers:
    verify accepts it, and gate gives the same verdict and results.json as for the same run
    written packed."""
    spec = small_spec(RULES.format(t="300ms", u="20ms", lat="2s") + "\nrequire p99(itl) < 30ms per window 7s",
                      levels="[2, 4]")
    b = EvidenceBuilder(spec, per_bucket=30)
    packed = b.write(tmp_path / "packed")
    legacy = b.write(tmp_path / "legacy")
    for path in legacy.glob("backends/*/requests.jsonl.gz"):
        rows = [json.loads(line) for line in gzip.decompress(path.read_bytes()).decode().splitlines()]
        assert all(type(r["itl_us"]) is str for r in rows)
        for r in rows:
            r["itl_us"] = list(unpack_gaps(r["itl_us"]))
        path.write_bytes(gzip.compress("".join(json.dumps(r) + "\n" for r in rows).encode()))
        _rehash(legacy, path)
    assert verify_evidence(legacy).result == "ok", verify_evidence(legacy).diagnostics
    results = []
    for root in (packed, legacy):
        run = join(spec, load_evidence(root))
        verdict = judge_run(run)
        summary = summarize_run(run)
        del summary["manifest_sha256"]  # the legacy manifest was rewritten with the file's new hash
        results.append(([(r.status, r.message) for r in verdict.rules], verdict.outcome, summary))
    assert results[0] == results[1]
    assert any(m for _, m in results[0][0])


_SHA = re.compile(request_schema()["properties"]["output_sha256"]["anyOf"][0]["pattern"])


@settings(max_examples=300, deadline=None)
@given(st.lists(st.none() | st.text(alphabet="0aAf \n", min_size=62, max_size=66) | st.sampled_from(["ab" * 32, "0" * 64]),
                max_size=6))
def test_a_block_of_shas_is_accepted_exactly_when_each_matches_the_schema(shas):
    """output_sha256 is checked for a block with one bytes.fromhex: it accepts the block
    exactly when every value is None or matches the schema's pattern."""
    assert shas_ok(shas) == all(h is None or _SHA.search(h) is not None for h in shas)
