"""The test builders write what `soakspec run` writes.

`soakspec.evidence.testing.build_evidence_dir` and `soakspec.judge.testing.EvidenceBuilder` stand
in for real runs in most evidence, judge and report tests, so a builder that drifts from the
runner makes those tests prove things about evidence no run leaves. Each builder's directory is
compared here with a real run's (`quick_demo`, tests/conftest.py): the same files, the same
keys in every document and row, request lines exactly as `RequestRecord.to_line` makes them,
every document valid against its schema, and `soakspec verify` passing.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from soakspec.cli import main
from soakspec.evidence import schema
from soakspec.evidence.testing import (
    SAMPLE_LEVEL, SAMPLE_SPEC, SAMPLE_TIMEOUTS, build_evidence_dir, read_request_rows, sample_request, sample_spec_text,
)
from soakspec.judge.testing import EvidenceBuilder, small_spec, spec_from_text
from soakspec.lang import load_spec
from soakspec.plan import plan
from soakspec.runner.records import RequestRecord

REPO = Path(__file__).resolve().parents[1]


def _files(root: Path) -> tuple[set[str], set[str]]:
    """(top-level files, per-backend file names) of an evidence directory."""
    top = {p.name for p in root.iterdir() if p.is_file() and p.name != ".lock"}
    per_backend = {p.name for p in (root / "backends").glob("*/*")}
    return top, per_backend


def _rows(path: Path) -> list[dict]:
    return read_request_rows(path)  # plain or gzip JSONL


def _shape(root: Path) -> dict[str, set]:
    """Every key set a reader relies on, from the first backend of a run directory."""
    m = json.loads((root / "manifest.json").read_text())
    b = m["backends"][0]
    d = root / "backends" / b["safe_name"]
    return {
        "manifest": set(m), "backend": set(b), "level": set(b["levels"][0]), "bucket": set(b["levels"][0]["buckets"][0]),
        "request": set(_rows(d / "requests.jsonl.gz")[0]), "bucket line": set(_rows(d / "buckets.jsonl")[0]), "trace": set(_rows(d / "traces.jsonl.gz")[0]),
        "telemetry": set(_rows(d / "telemetry.jsonl")[0]), "followup": set(json.loads((d / "followup.json").read_text())),
        "followup.record": set(json.loads((d / "followup.json").read_text())["record"]),
    }


@pytest.fixture(scope="module")
def real(quick_demo) -> Path:
    return quick_demo.run_dir


@pytest.fixture(params=["build_evidence_dir", "EvidenceBuilder(seed)", "EvidenceBuilder(small)"])
def built(request, tmp_path) -> Path:
    """A builder's directory: `build_evidence_dir`, and `EvidenceBuilder` of the seed spec
    (launch backends, log traces, GPUs) and of a small url-backend spec with a jsonl trace file."""
    root = tmp_path / "built"
    if request.param == "build_evidence_dir":
        build_evidence_dir(root)
        return root
    spec = load_spec(REPO / "specs" / "dsv2lite.soak")[0] if "seed" in request.param else small_spec()
    return EvidenceBuilder(spec).with_client().write(root)  # a run's client.jsonl (without: a run from before it)


def test_the_sample_spec_checks_and_plans_the_sample_records():
    """SAMPLE_SPEC is a spec a user could run, and sample_request's rows belong to its plan."""
    spec = spec_from_text(SAMPLE_SPEC)
    assert [b.name for b in spec.backends] == ["a", "b"] and all(b.kind == "sim" for b in spec.backends)
    lv = plan(spec).backends[0].levels[0]
    r = sample_request(0)
    assert (lv.workload, lv.index, lv.concurrency, lv.rate) == (r["workload"], r["level"], r["concurrency"], r["rate"])
    assert [b.name for b in spec_from_text(sample_spec_text(("x", "y", "z"))).backends] == ["x", "y", "z"]


def test_the_sample_manifest_entries_are_the_plans(tmp_path):
    """build_evidence_dir's level entries and bounds are what the plan of SAMPLE_SPEC says."""
    bp = plan(spec_from_text(SAMPLE_SPEC)).backends[0]
    assert SAMPLE_TIMEOUTS == bp.timeouts() and SAMPLE_LEVEL == bp.levels[0].to_json()
    m = build_evidence_dir(tmp_path / "run")
    for b in m["backends"]:
        assert b["timeouts"] == bp.timeouts()
        assert b["levels"][0].items() >= bp.levels[0].to_json().items()


def test_builders_leave_the_files_a_run_leaves(built, real):
    assert _files(built) == _files(real)


def test_builders_write_the_keys_a_run_writes(built, real):
    got, want = _shape(built), _shape(real)
    if got["backend"] >= {"trace_source"} and json.loads((built / "manifest.json").read_text())["backends"][0]["trace_source"] == "jsonl":
        # the real run's traces are in its server.log, whose line holds their times and payload; a
        # jsonl trace file is outside the evidence, so its rows keep them (TraceMatch.records)
        want["trace"] = want["trace"] | {"times", "payload"}
    for what in want:
        assert got[what] == want[what], (what, "missing:", want[what] - got[what], "extra:", got[what] - want[what])


@pytest.mark.parametrize("spec", ["seed", "small"])
def test_the_judge_builder_writes_results_and_verdict_as_the_judge_does(spec, real, tmp_path):
    spec = load_spec(REPO / "specs" / "dsv2lite.soak")[0] if spec == "seed" else small_spec()
    root = EvidenceBuilder(spec).write(tmp_path / "built")
    for name in ("results.json", "verdict.json"):
        got, want = json.loads((root / name).read_text()), json.loads((real / name).read_text())
        assert set(got) == set(want), name
        manifest_sha = hashlib.sha256((root / "manifest.json").read_bytes()).hexdigest()
        assert got["manifest_sha256"] == manifest_sha, name


def _assert_runner_lines(root: Path) -> None:
    from soakspec.evidence.io import iter_raw_lines

    files = sorted((root / "backends").glob("*/requests.jsonl.gz"))
    assert files
    for f in files:
        for _, line in iter_raw_lines(f):
            assert RequestRecord.from_json(json.loads(line)).to_line() == line, f


def test_request_lines_are_the_runners_lines(built, real):
    """Every requests.jsonl.gz line reads back as a RequestRecord whose `to_line` is that line
    (checked on the real run too, so that the comparison itself is sound)."""
    _assert_runner_lines(real)
    _assert_runner_lines(built)


def test_builder_output_passes_verify(built, capsys):
    """`soakspec verify` validates every document and row against its schema and re-hashes."""
    root = built
    assert main(["verify", str(root)]) == 0, capsys.readouterr().out
    assert "intact and complete" in capsys.readouterr().out
    m = json.loads((root / "manifest.json").read_text())
    assert not schema.validate("manifest", m)
    for b in m["backends"]:
        rows = _rows(root / "backends" / b["safe_name"] / "requests.jsonl.gz")
        assert rows and not any(schema.validate("request", r) for r in rows)
