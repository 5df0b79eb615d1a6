"""The fast request check (`request_certainly_valid`) never accepts what the schema rejects,
and it accepts what the runner writes -- so `verify` over millions of lines skips the compiled
schema for them without changing a single finding."""

from __future__ import annotations

import json

from hypothesis import given, settings, strategies as st

from soakspec.evidence.schema import _validator, errors_for, is_valid, request_certainly_valid
from soakspec.evidence.testing import sample_request
from soakspec.runner.records import Outcome, RequestRecord

JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**40), 2**40) | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=70) | st.sampled_from(["completed", "failed", "timeout", "", "ab" * 32, "AB" * 32, "ab" * 32 + "\n"]),
    lambda kids: st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=5), kids, max_size=3),
    max_leaves=6,
)


def _runner_record(i: int, outcome: Outcome) -> dict:
    t = 1_764_500_000.0 + i
    rec = RequestRecord(
        f"soak-1-{i:07d}", backend="sim", workload="chat", level=0, concurrency=8, bucket=i % 3, worker=i % 8,
        intended_start=t, start=t, first_byte=t + 0.01, first_token=t + 0.02, end=t + 0.5, status=200,
        outcome=outcome, error=None if outcome is Outcome.COMPLETED else "boom", finish_reason="length",
        server_id=f"cmpl-{i}", prompt_tokens=16, output_tokens=4, chunks=4, tpot=0.1, itl=[0.1, 0.1, 0.1],
        output_sha256="ab" * 32, output_chars=20,
    )  # fmt: skip
    return json.loads(rec.to_line())


def test_the_runners_records_take_the_fast_path():
    for i, outcome in enumerate(Outcome):
        row = _runner_record(i, outcome)
        assert is_valid("request", row)
        assert request_certainly_valid(row), outcome


@settings(max_examples=400, deadline=None)
@given(base=st.sampled_from(list(Outcome)), key=st.sampled_from(sorted(sample_request())), value=JSON_VALUES,
       drop=st.booleans(), extra=st.booleans())
def test_fast_check_never_accepts_what_the_schema_rejects(base, key, value, drop, extra):
    row = _runner_record(1, base)
    if drop:
        row.pop(key)
    else:
        row[key] = value
    if extra:
        row["schema_version"] = value
    if request_certainly_valid(row):
        assert not list(_validator("request").iter_errors(row)), row
        assert is_valid("request", row)
    # and the verdict of errors_for is the schema's either way
    assert (errors_for("request", row) == []) == (not list(_validator("request").iter_errors(row)))


@settings(max_examples=200, deadline=None)
@given(itl=st.lists(st.floats(allow_nan=False, allow_infinity=False) | st.integers(-3, 3) | st.booleans(), max_size=6))
def test_fast_check_on_itl_values(itl):
    row = _runner_record(2, Outcome.COMPLETED)
    row["itl_us"] = itl
    if request_certainly_valid(row):
        assert is_valid("request", row)
    else:  # all integer microseconds >= 0 are proven valid
        assert not (all(type(g) is int and g >= 0 for g in itl))
