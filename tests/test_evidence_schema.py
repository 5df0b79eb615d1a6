"""The shipped schemas load from the package, are valid Draft 2020-12, and name pointers."""

from __future__ import annotations

import json
from importlib import resources

import pytest
from jsonschema import Draft202012Validator

from soakspec.evidence import schema
from soakspec.evidence.testing import sample_request, sample_results


@pytest.mark.parametrize("name", schema.SCHEMA_NAMES)
def test_every_schema_is_valid_and_versioned(name):
    s = schema.load_schema(name)
    Draft202012Validator.check_schema(s)
    assert s["$schema"].endswith("2020-12/schema")
    if name == "request":  # generated from the record type (version 3: itl_us packed; 4: a multi-turn record's
        # conversation and turn; 5: an open loop's admitted under max_concurrency); lines carry no version of their own
        assert s["$id"].endswith(":5") and "schema_version" not in s["properties"]
        return
    assert s["$id"].endswith(":1")
    assert s["properties"]["schema_version"] == {"const": 1}
    assert "schema_version" in s["required"]


def test_schemas_ship_inside_the_package():
    files = resources.files("soakspec.evidence").joinpath("schemas")
    names = sorted(p.name for p in files.iterdir() if p.name.endswith(".schema.json"))
    assert names == sorted(f"{n}.schema.json" for n in schema.SCHEMA_NAMES)
    for n in names:
        json.loads(files.joinpath(n).read_text("utf-8"))


def test_unknown_schema_name_is_a_clear_error():
    with pytest.raises(KeyError, match="no evidence schema named 'nope'"):
        schema.load_schema("nope")


def test_request_record_keys_are_the_contract():
    from soakspec.runner.records import OPTIONAL_KEYS  # added later, optional so earlier evidence stays valid

    required = set(schema.load_schema("request")["required"])
    assert required | OPTIONAL_KEYS == set(sample_request(0)) and not schema.validate("request", sample_request(0))
    assert {"request_id", "itl_us", "output_sha256", "tokens_source", "itl_source", "intended_start"} <= required
    assert not {"ttft", "latency", "itl"} & set(schema.load_schema("request")["properties"])  # derived, never stored


def test_validate_reports_json_pointers():
    bad = sample_request(0, outcome="exploded", itl_us="1000000x")
    errs = schema.validate("request", bad)
    assert any(e.startswith("/outcome: ") for e in errs)
    assert any(e.startswith("/itl_us: ") for e in errs)
    missing = dict(sample_request(0))
    del missing["itl_us"]
    assert any(e.startswith("/: ") and "'itl_us'" in e for e in schema.validate("request", missing))


def test_failed_requests_need_an_error_and_completed_ones_an_end():
    assert schema.validate("request", sample_request(0, outcome="timeout", error=None))
    assert not schema.validate("request", sample_request(0, outcome="timeout", error="deadline passed"))
    assert schema.validate("request", sample_request(0, end=None))


def test_results_and_verdict_schemas():
    assert not schema.validate("results", sample_results("r", ["a"], 3))
    assert not schema.validate("verdict", {"schema_version": 1, "verdict": "PASS", "rules": [], "extra": {"ok": 1}})
    assert schema.validate("verdict", {"schema_version": 1, "verdict": "MAYBE", "rules": []})


def test_the_runners_request_records_match_the_schema():
    """Contract: what the runner writes to requests.jsonl is what the schema (and verify) accept."""
    from soakspec.runner import records
    ok = records.RequestRecord(request_id="r1", backend="a", workload="w", start=1.0, intended_start=1.0,
                               first_token=1.1, end=2.0, status=200, outcome=records.Outcome.COMPLETED,
                               output_tokens=3, chunks=3, itl=[0.1, 0.1], tpot=0.1)
    failed = records.RequestRecord(request_id="r2", backend="a", workload="w", start=1.0, intended_start=1.0,
                                   end=31.0, outcome=records.Outcome.TIMEOUT, error="deadline passed", bucket=-2)
    for r in (ok, failed):
        assert not schema.validate("request", r.to_json())
    request = schema.load_schema("request")
    # keys added later (`empty_text`) are optional, so that earlier evidence stays valid
    assert set(ok.to_json()) == set(request["required"]) | records.OPTIONAL_KEYS
    assert records.OPTIONAL_KEYS <= set(request["properties"])
