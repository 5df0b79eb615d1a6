"""The seed gate (specs/dsv2lite.soak) against fixture evidence: a clean run passes, and each
way the original hand-written gate could fail fails here with the right rule named."""

from __future__ import annotations

from pathlib import Path

import pytest

from soakspec.evidence import schema
from soakspec.judge import judge, load_evidence, render_text
from soakspec.judge.testing import EvidenceBuilder
from soakspec.lang import load_spec

SEED = Path(__file__).resolve().parents[1] / "specs" / "dsv2lite.soak"


@pytest.fixture(scope="module")
def spec():
    s, diags, _ = load_spec(SEED)
    assert s is not None, diags
    return s


def failing(v) -> set[str]:
    return {r.rule for r in v.rules if r.severity == "require" and r.status == "fail"}


def rule(v, name):
    return next(r for r in v.rules if r.rule == name)


def test_clean_run_passes(spec):
    v = judge(spec, EvidenceBuilder(spec).build())
    assert v.outcome == "PASS", render_text(v)
    assert v.exit_code == 0
    assert not schema.validate("verdict", v.to_json())
    # the drift warnings cannot be judged from 8 requests per bucket, and never decide
    assert rule(v, "drift(p95(ttft)) <= 20% per level").status == "inconclusive"


def test_clean_run_on_disk_passes(spec, tmp_path):
    root = EvidenceBuilder(spec).write(tmp_path / "run")
    ev = load_evidence(root)
    assert ev.integrity.ok and ev.integrity.checked > 0
    v = judge(spec, ev)
    assert v.outcome == "PASS", render_text(v)
    assert v.manifest_sha256 is not None


def test_one_failed_request(spec):
    b = EvidenceBuilder(spec)
    r = list(b.measured("nccl", level=1, bucket=1))[3]
    b.set_outcome(r, "failed", "engine died", status=200)
    v = judge(spec, b.build())
    assert v.outcome == "FAIL"
    assert failing(v) == {"failed == 0"}
    res = rule(v, "failed == 0")
    assert res.text().startswith("failed == 0: FAIL — backend nccl, concurrency 8 (batches of 8), bucket 1 [")
    assert res.message.endswith(': 1 failed request (engine died)')
    assert (res.where.backend, res.where.level, res.where.bucket) == ("nccl", 1, 1)
    assert res.where.start is not None and res.where.end is not None
    assert res.observed == 1.0


def test_one_timeout(spec):
    b = EvidenceBuilder(spec)
    r = next(b.measured("host-staged", level=0, bucket=0))
    b.set_outcome(r, "timeout", "deadline of 120s passed", status=None)
    v = judge(spec, b.build())
    assert failing(v) == {"timeouts == 0"}
    assert "1 timed-out request (deadline passed: \"deadline of 120s passed\")" in rule(v, "timeouts == 0").message


def test_one_bucket_missing(spec):
    b = EvidenceBuilder(spec)
    b.drop_bucket_requests("nccl", 0, 1)
    b.level("nccl", 0)["buckets"].pop()
    v = judge(spec, b.build())
    assert v.outcome == "FAIL"
    assert "bucket_coverage" in failing(v)
    res = rule(v, "bucket_coverage")
    assert "backend nccl, concurrency 4 (batches of 8), bucket 1" in res.message
    assert "missing" in res.message
    assert all(r.status == "not_evaluated" for r in v.rules if r.klass == "performance")


def test_bucket_without_requests(spec):
    b = EvidenceBuilder(spec)
    b.drop_bucket_requests("nccl", 0, 1)
    v = judge(spec, b.build())
    assert "bucket_coverage" in failing(v)
    assert "no request in the bucket" in rule(v, "bucket_coverage").message


def test_level_missing(spec):
    b = EvidenceBuilder(spec)
    levels = b.entry("host-staged")["levels"]
    levels[:] = [lv for lv in levels if lv["index"] != 1]
    b.records["host-staged"] = [r for r in b.records["host-staged"] if r["level"] != 1 or r["bucket"] < 0]
    v = judge(spec, b.build())
    assert v.outcome == "FAIL"
    assert {"bucket_coverage", "duration_coverage", "completed_run"} <= failing(v)
    assert "backend host-staged, concurrency 8 (batches of 8): level missing" in rule(v, "bucket_coverage").message


def test_run_cut_short(spec):
    b = EvidenceBuilder(spec)
    b.manifest.update(status="incomplete", incomplete_reason="interrupted (SIGINT)")
    lv = b.level("nccl", 1)
    lv["measure_end"] = lv["measure_start"] + 90.0
    lv["buckets"][1]["end"] = lv["measure_end"]
    lv["completed"] = False
    cut = lv["measure_end"]
    b.records["nccl"] = [r for r in b.records["nccl"] if r["bucket"] < 0 and r["bucket"] != -2 or r["start"] < cut]
    v = judge(spec, b.build())
    assert v.outcome == "FAIL"
    assert {"completed_run", "duration_coverage"} <= failing(v)
    assert "interrupted (SIGINT)" in rule(v, "completed_run").message
    assert "measured 1m30s of 2m planned" in rule(v, "duration_coverage").message


def test_partial_tail_on_disk_is_incomplete(spec, tmp_path):
    root = EvidenceBuilder(spec).write(tmp_path / "run", finalize=False)
    import gzip

    with open(root / "backends" / "nccl" / "requests.jsonl.gz", "ab") as f:
        f.write(gzip.compress(b'{"request_id": "cut'))  # a member whose last line was cut mid-write
    v = judge(spec, load_evidence(root))
    assert v.outcome == "FAIL"
    assert "completed_run" in failing(v)
    assert "cut-off line" in render_text(v)


def test_trace_coverage_ninety_percent_in_one_bucket(spec):
    b = EvidenceBuilder(spec, per_bucket=10)
    victim = list(b.measured("host-staged", level=1, bucket=0))[4]
    b.untrace(victim["request_id"], "host-staged")
    v = judge(spec, b.build())
    assert failing(v) == {"trace_coverage >= 100% per bucket"}
    res = rule(v, "trace_coverage >= 100% per bucket")
    assert res.observed == pytest.approx(0.9)
    assert "backend host-staged, concurrency 8 (batches of 8), bucket 0" in res.message
    assert "9 of 10 requests traced" in res.message
    assert victim["request_id"] in res.message
    assert res.failing == 1


def test_failed_follow_up(spec):
    b = EvidenceBuilder(spec)
    b.followups["nccl"].update(passed=False, reason="HTTP 503: server overloaded")
    v = judge(spec, b.build())
    assert failing(v) == {"follow_up"}
    assert "backend nccl: the clean follow-up request failed: HTTP 503: server overloaded" in rule(v, "follow_up").message


def test_follow_up_with_busy_server(spec):
    b = EvidenceBuilder(spec)
    b.followups["host-staged"]["server_idle"] = False
    v = judge(spec, b.build())
    assert failing(v) == {"follow_up"}


def test_commit_changed_mid_run(spec):
    b = EvidenceBuilder(spec)
    b.entry("nccl")["source"]["commit_after"] = "f" * 40
    v = judge(spec, b.build())
    assert failing(v) == {"provenance_consistent"}
    assert "commit changed during the run" in rule(v, "provenance_consistent").message


def test_commits_differ_across_backends(spec):
    b = EvidenceBuilder(spec)
    src = b.entry("nccl")["source"]
    src["commit_before"] = src["commit_after"] = "e" * 40
    v = judge(spec, b.build())
    assert failing(v) == {"provenance_consistent"}
    assert "backends ran different commits" in rule(v, "provenance_consistent").message


def test_generic_runtime_boundary(spec):
    b = EvidenceBuilder(spec)
    b.entry("nccl")["runtime_boundary"].update(declared="nccl", display="nccl", status="generic",
                                                 details=["'nccl' names a runtime without a version or mode"])
    v = judge(spec, b.build())
    # the judge re-derives the status from the spec, the log and the environment: a stored
    # label that disagrees is malformed evidence, and never better than what was recorded
    assert failing(v) == {"runtime_boundary_specific", "completed_run"}
    assert "backend nccl: runtime boundary" in rule(v, "runtime_boundary_specific").message
    assert "recorded as generic" in rule(v, "runtime_boundary_specific").message
    assert "runtime boundary status 'generic'" in rule(v, "completed_run").message


def test_contradicted_runtime_boundary(spec):
    b = EvidenceBuilder(spec)
    b.entry("nccl")["runtime_boundary"].update(detected="2.21.5", status="contradictory",
                                                 details=["the log shows NCCL 2.21.5, the label declares 2.26.2"])
    # the retained server.log is what the judge reads (the stored status above agrees with it)
    b.server_logs["nccl"] = b.log_of("nccl").replace("NCCL version 2.26.2", "NCCL version 2.21.5")
    v = judge(spec, b.build())
    assert failing(v) == {"runtime_boundary_specific"}
    assert "contradictory: the server log reports version 2.21.5 but 2.26.2 is declared" in rule(v, "runtime_boundary_specific").message


def test_edited_artifact_never_passes(spec, tmp_path):
    root = EvidenceBuilder(spec).write(tmp_path / "run")
    p = root / "backends" / "host-staged" / "telemetry.jsonl"
    p.write_text(p.read_text().replace("2147483648", "1073741824", 1))
    v = judge(spec, load_evidence(root))
    assert v.outcome == "FAIL"
    assert failing(v) == {"artifacts_verified"}
    assert "backends/host-staged/telemetry.jsonl" in rule(v, "artifacts_verified").message


def test_rehearsal_is_inconclusive_unless_allowed(spec):
    b = EvidenceBuilder(spec, time_scale=0.1, rehearsal=True)
    v = judge(spec, b.build())
    assert v.outcome == "INCONCLUSIVE" and v.exit_code == 3
    assert rule(v, "full_scale_run").status == "inconclusive"
    # the time-scaled plan is the yardstick: the rehearsal is otherwise whole
    assert rule(v, "duration_coverage").status == "pass"


def test_an_unreadable_follow_up_is_named_as_such_not_missing(spec, tmp_path):
    """A followup.json that is there but does not parse fails `follow_up` saying so, not
    "followup.json missing" (which would send a reader looking for a file that exists)."""
    b = EvidenceBuilder(spec)
    run = b.write(tmp_path / "ev")
    (run / "backends" / "nccl" / "followup.json").write_text("{not json")
    v = judge(spec, load_evidence(run))
    msg = rule(v, "follow_up").message
    assert "backend nccl: no follow-up evidence (backends/nccl/followup.json:1: does not parse)" in msg, msg
    assert "missing" not in msg
