"""Manifest builders: schema-valid at start and end, secrets redacted, artifacts hashed."""

from __future__ import annotations

import json

import pytest

from soakspec.evidence import schema
from soakspec.evidence.io import EvidenceSchemaError, sha256_file
from soakspec.evidence.manifest import (
    backend_entry,
    finalize_manifest,
    model_entry,
    new_manifest,
    source_entry,
    utc_iso,
    write_manifest,
)
from soakspec.evidence.runtime import RuntimeDecl, detect_runtime_boundary
from soakspec.evidence.testing import T0, build_evidence_dir


def test_start_manifest_is_valid_and_running(tmp_path):
    m = new_manifest(run_id="r1", spec_text="x\n", spec_path="a.soak", started_at=T0, rehearsal=True, time_scale=0.1)
    assert m["status"] == "running" and m["artifacts"] == {} and m["ended_at"] is None
    assert m["started_at"] == utc_iso(T0) and m["started_at"].endswith("Z")
    assert m["host"]["cpu_cores"] >= 1 and m["host"]["hostname"]
    assert not schema.validate("manifest", m)
    write_manifest(tmp_path, m)
    assert json.loads((tmp_path / "manifest.json").read_text()) == m


def test_backend_entry_redacts_and_records_provenance(tmp_path):
    rb = detect_runtime_boundary(RuntimeDecl("NCCL 2.26.2, NCCL_IB_DISABLE=1", r"NCCL version (\S+)"),
                                 {"NCCL_IB_DISABLE": "1"}, "NCCL version 2.26.2\n")
    b = backend_entry(
        name="../evil", kind="launch",
        argv=["server", "--api-key", "s3cr3t-value", "--max-tokens", "128"],
        env={"HF_TOKEN": "hf_abcdefghijklmnopqrstu", "NCCL_IB_DISABLE": "1"},
        cwd="/srv", pid=42, started_at=T0, ready_at=T0 + 12.5, exit_status=-15, stop_signal="SIGTERM",
        runtime_boundary=rb,
        source=source_entry("/repo", {"commit": "a" * 40, "dirty": False}, {"commit": "a" * 40, "dirty": False}),
        model=model_entry("m", tmp_path),
    )
    text = json.dumps(b)
    assert "s3cr3t-value" not in text and "hf_abc" not in text
    assert b["argv"][-2:] == ["--max-tokens", "128"] and b["env"]["NCCL_IB_DISABLE"] == "1"
    assert b["safe_name"].startswith("evil-") and b["ready_seconds"] == 12.5
    assert b["runtime_boundary"]["status"] == "confirmed"
    m = new_manifest(run_id="r1", spec_text="x", spec_path=None, started_at=T0, backends=[b])
    assert not schema.validate("manifest", m)


def test_finalize_hashes_every_file_but_manifest_and_lock(tmp_path):
    m = build_evidence_dir(tmp_path / "run1")
    assert m["status"] == "complete" and m["ended_at_epoch"] == T0 + 130
    arts = m["artifacts"]
    assert "manifest.json" not in arts and ".lock" not in arts
    assert {"backends/a/requests.jsonl.gz", "backends/a/buckets.jsonl", "backends/a/traces.jsonl.gz", "backends/b/server.log.gz"} <= set(arts)
    # like a run's, results and verdict follow the final manifest (bound to it by its hash)
    assert not {"results.json", "verdict.json"} & set(arts)
    for rel, digest in arts.items():
        assert sha256_file(tmp_path / "run1" / rel) == digest
    assert json.loads((tmp_path / "run1" / "manifest.json").read_text()) == m


def test_final_status_rules(tmp_path):
    m = new_manifest(run_id="r1", spec_text="x", spec_path=None, started_at=T0)
    with pytest.raises(ValueError, match="incomplete_reason"):
        finalize_manifest(tmp_path, m, "aborted")
    with pytest.raises(ValueError, match="final status"):
        finalize_manifest(tmp_path, m, "running")
    bad = dict(m, status="complete")  # complete without an end time: refused by the schema
    with pytest.raises(EvidenceSchemaError, match="/ended_at"):
        write_manifest(tmp_path, bad)
    out = finalize_manifest(tmp_path, m, "aborted", "backend a died", ended_at=T0 + 5)
    assert out["incomplete_reason"] == "backend a died" and m["status"] == "running"  # input not mutated
