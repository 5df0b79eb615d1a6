"""The fast schema check used on every JSONL line agrees with the reference validator."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from jsonschema import Draft202012Validator

from soakspec.evidence.schema import SCHEMA_NAMES, is_valid, load_schema
from soakspec.runner.records import RECORD_KEYS, Outcome, RequestRecord


def _valid_record() -> dict:
    rec = RequestRecord(request_id="r-1", backend="b", workload="w", level=0, concurrency=4, bucket=0)
    rec.start = rec.intended_start = 100.0
    rec.first_byte, rec.first_token, rec.end = 100.01, 100.05, 100.4
    rec.status, rec.outcome, rec.finish_reason = 200, Outcome.COMPLETED, "length"
    rec.output_tokens, rec.chunks, rec.itl = 3, 3, [0.01, 0.02]
    rec.output_sha256 = "0" * 64
    return rec.to_json()


_values = st.one_of(
    st.none(), st.booleans(), st.integers(-5, 5), st.floats(-1, 1e9, allow_nan=False),
    st.text(max_size=5), st.lists(st.integers(), max_size=2), st.sampled_from(["completed", "failed", "weird", "usage"]),
)  # fmt: skip


@settings(max_examples=300, deadline=None)
@given(key=st.sampled_from(RECORD_KEYS + ("extra",)), value=_values, drop=st.booleans())
def test_fast_and_reference_validators_agree_on_mutated_records(key, value, drop):
    """For any single-field mutation of a valid request record (a changed value, a removed
    key, an added one), the fast check says valid exactly when jsonschema does."""
    rec = _valid_record()
    if drop:
        rec.pop(key, None)
    else:
        rec[key] = value
    reference = Draft202012Validator(load_schema("request")).is_valid(rec)
    assert is_valid("request", rec) == reference


@pytest.mark.parametrize("name", SCHEMA_NAMES)
def test_every_schema_compiles_for_the_fast_path(name):
    assert is_valid(name, {}) == Draft202012Validator(load_schema(name)).is_valid({})


def test_a_valid_record_is_valid():
    assert is_valid("request", _valid_record())
    assert Draft202012Validator(load_schema("request")).is_valid(json.loads(json.dumps(_valid_record())))
