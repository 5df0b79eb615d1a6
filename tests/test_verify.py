"""`soakspec verify`: a clean evidence directory passes; any changed, missing or extra byte is
named; schema errors are located; an unfinished run is reported as incomplete (exit 3)."""

from __future__ import annotations

import gzip
import json
import os
import signal
import subprocess
import sys
import textwrap

import pytest

from soakspec.cli import main as cli_main
from soakspec.evidence.io import JsonlWriter, RunLock, write_json_atomic
from soakspec.evidence.manifest import finalize_manifest, manifest_sha256
from soakspec.evidence.testing import append_request_lines, build_evidence_dir, sample_request
from soakspec.evidence.verify import EvidenceNotFound, finalize_artifacts, verify_evidence


@pytest.fixture
def run_dir(tmp_path):
    d = tmp_path / "run1"
    build_evidence_dir(d)
    return d


def verify(capsys, *args):
    code = cli_main(["verify", *map(str, args)])
    out, err = capsys.readouterr()
    return code, out, err


def codes(report):
    return sorted({d.code for d in report.diagnostics})


def test_clean_directory_passes(run_dir, capsys):
    code, out, err = verify(capsys, run_dir)
    assert code == 0, out
    assert out.strip().endswith("intact and complete (15 artifacts and 24 records checked; results.json and verdict.json name "
                                "this manifest but are conclusions no hash covers: `soakspec gate` re-derives them).")
    # results.json and verdict.json are bound to the manifest, not listed in it: the 15 artifacts
    # (client.jsonl, each backend's buckets.jsonl and metrics.jsonl among them; metrics.jsonl holds one scrape each and client.jsonl one sample a backend: 4 of the 24 records)
    # are the manifest's, the number `run` and the gate's artifacts_verified state too
    assert err == ""


def _artifacts(run_dir):
    return sorted(json.loads((run_dir / "manifest.json").read_text())["artifacts"])


@pytest.mark.parametrize("index", range(12))  # the files the manifest hashes
def test_editing_one_byte_of_any_artifact_fails_naming_it(run_dir, capsys, index):
    rel = _artifacts(run_dir)[index]
    p = run_dir / rel
    data = bytearray(p.read_bytes())
    data[len(data) // 2] ^= 0x01
    p.write_bytes(bytes(data))
    code, out, _ = verify(capsys, run_dir)
    assert code == 1
    assert f"{run_dir}/{rel}: V101 changed since the manifest was written" in out
    assert "Found" in out.splitlines()[-1]


def test_missing_and_unlisted_files(run_dir):
    (run_dir / "backends/a/followup.json").unlink()
    (run_dir / "backends/a/extra.txt").write_text("smuggled\n")
    r = verify_evidence(run_dir)
    assert r.exit_code == 1 and codes(r) == ["V102", "V103"]
    paths = {d.code: d.path for d in r.problems}
    assert paths == {"V102": f"{run_dir}/backends/a/followup.json", "V103": f"{run_dir}/backends/a/extra.txt"}


def test_schema_error_in_a_request_record_is_located(run_dir):
    p = run_dir / "backends/b/requests.jsonl.gz"
    append_request_lines(p, json.dumps(sample_request(9, backend="b", outcome="exploded")))
    _rehash(run_dir)
    r = verify_evidence(run_dir)
    assert r.exit_code == 1 and codes(r) == ["V104"]
    d = r.problems[0]
    assert d.path == f"{run_dir}/backends/b/requests.jsonl.gz" and d.span.line == 5 and d.message.startswith("/outcome:")
    assert f"{run_dir}/backends/b/requests.jsonl.gz:5:1: V104 /outcome:" in r.render_text()


def test_corrupt_json_and_cross_file_disagreements(run_dir):
    (run_dir / "backends/a/followup.json").write_text("{oops")
    append_request_lines(run_dir / "backends/a/requests.jsonl.gz", json.dumps(sample_request(5, backend="b")))
    res = json.loads((run_dir / "results.json").read_text())
    write_json_atomic(run_dir / "results.json", dict(res, run_id="other"))
    _rehash(run_dir)
    r = verify_evidence(run_dir)
    assert codes(r) == ["V105", "V108"]
    assert {d.path.rsplit("/", 2)[-1] for d in r.problems} == {"followup.json", "requests.jsonl.gz", "results.json"}


def test_running_run_is_incomplete_not_corrupt(tmp_path, capsys):
    d = tmp_path / "run1"
    build_evidence_dir(d, status="running")
    code, out, _ = verify(capsys, d)
    assert code == 3
    assert "V201 run status is running [incomplete]" in out
    assert "V204 15 files never hashed: the run did not finalize its manifest [incomplete]" in out  # buckets, metrics and client too
    assert "intact but incomplete" in out.splitlines()[-1]


def test_aborted_run_with_hashes_is_incomplete(tmp_path):
    d = tmp_path / "run1"
    build_evidence_dir(d, status="aborted")
    r = verify_evidence(d)
    assert r.exit_code == 3 and codes(r) == ["V201"] and "interrupted" in r.incomplete[0].message


def test_writer_killed_mid_member_leaves_an_incomplete_but_readable_run(tmp_path, capsys):
    d = tmp_path / "run1"
    build_evidence_dir(d, status="running")
    req = d / "backends/a/requests.jsonl.gz"
    code = textwrap.dedent(
        f"""
        import os, signal, zlib
        from soakspec.evidence.io import GzipJsonlWriter
        from soakspec.evidence.record import RequestRecord
        from soakspec.evidence.testing import sample_request
        w = GzipJsonlWriter({str(req)!r})
        w.write_lines(RequestRecord.from_json(sample_request(3)).to_line())
        w.flush_fsync()   # a bucket closed: its member is whole
        z = zlib.compressobj(6, zlib.DEFLATED, 31)
        data = z.compress(b"".join(RequestRecord.from_json(sample_request(k)).to_line() for k in (4, 5))) + z.flush()
        fd = os.open({str(req)!r}, os.O_WRONLY | os.O_APPEND)
        os.write(fd, data[: len(data) // 2])   # the next bucket's member was half written, then:
        os.kill(os.getpid(), signal.SIGKILL)
        """
    )
    p = subprocess.run([sys.executable, "-c", code], timeout=60)
    assert p.returncode == -signal.SIGKILL
    rc, out, _ = verify(capsys, d)
    assert rc == 3 and f"{d}/backends/a/requests.jsonl.gz: V202 ends in a cut-off write" in out, out
    assert "V105" not in out and "V104" not in out  # a cut, not corruption
    # the runner's clean-up finalizes it as incomplete: the hashed partial tail is still incomplete
    m = json.loads((d / "manifest.json").read_text())
    with RunLock(d, allow_existing=True):
        finalize_manifest(d, m, "incomplete", "backend a writer was killed")
    r = verify_evidence(d)
    # 20 of the builder's records + one scrape per backend (metrics.jsonl) + one client-health
    # sample per backend (client.jsonl), the closed member's one, and what the cut member's bytes hold
    assert r.exit_code == 3 and codes(r) == ["V201", "V202"] and r.records_checked in (25, 26)


def test_lock_held_means_a_run_is_still_writing(run_dir):
    with RunLock(run_dir, allow_existing=True):
        r = verify_evidence(run_dir)
    assert r.exit_code == 3 and codes(r) == ["V203"] and str(os.getpid()) in r.incomplete[0].message


def test_results_and_verdict_may_follow_the_final_manifest_when_bound_to_it(run_dir):
    digest = manifest_sha256(run_dir)
    write_json_atomic(run_dir / "verdict.json", {"schema_version": 1, "verdict": "FAIL", "rules": [], "manifest_sha256": digest})
    assert "verdict.json" not in json.loads((run_dir / "manifest.json").read_text())["artifacts"]
    assert verify_evidence(run_dir).exit_code == 0
    m = json.loads((run_dir / "manifest.json").read_text())
    m["host"]["hostname"] = "another"
    write_json_atomic(run_dir / "manifest.json", m)
    _rebind(run_dir, "results.json")
    r = verify_evidence(run_dir)  # the manifest changed, so the binding must be to the new one
    assert codes(r) == ["V107"]
    write_json_atomic(run_dir / "verdict.json", {"schema_version": 1, "verdict": "FAIL", "rules": [],
                                                 "manifest_sha256": manifest_sha256(run_dir)})
    assert verify_evidence(run_dir).exit_code == 0


def test_unsafe_entries(run_dir):
    m = json.loads((run_dir / "manifest.json").read_text())
    m["artifacts"]["../outside.txt"] = "0" * 64
    write_json_atomic(run_dir / "manifest.json", m)
    _rebind(run_dir, "results.json", "verdict.json")
    os.symlink("/etc/hostname", run_dir / "backends/a/link")
    r = verify_evidence(run_dir)
    assert codes(r) == ["V104", "V106"]
    assert any("'../outside.txt' is not a plain relative path" in d.message for d in r.problems)
    assert any(d.path.endswith("backends/a/link") and d.code == "V106" for d in r.problems)


def test_a_complete_run_without_results_is_incomplete(run_dir):
    (run_dir / "results.json").unlink()  # like a run's, it followed the manifest: not listed there
    r = verify_evidence(run_dir)
    assert r.exit_code == 3 and codes(r) == ["V205"] and "results were never written" in r.incomplete[0].message


def test_json_format(run_dir, capsys):
    (run_dir / "backends/b/server.log.gz").write_bytes(gzip.compress(b"tampered\n"))  # what a finished run leaves
    code, out, _ = verify(capsys, run_dir, "--format", "json")
    doc = json.loads(out)
    assert code == 1 and doc["schema_version"] == 1 and doc["result"] == "failed" and doc["exit_code"] == 1
    assert [(p["code"], p["path"]) for p in doc["problems"]] == [("V101", f"{run_dir}/backends/b/server.log.gz")]
    assert doc["manifest_status"] == "complete" and doc["incomplete"] == []


def test_usage_errors(tmp_path, capsys):
    code, out, err = verify(capsys, tmp_path / "nope")
    assert code == 2 and out == "" and "no such evidence directory" in err
    code, _, err = verify(capsys, tmp_path)
    assert code == 2 and "no manifest.json" in err
    with pytest.raises(EvidenceNotFound):
        verify_evidence(tmp_path)


def test_unparseable_manifest_is_a_failure(run_dir, capsys):
    (run_dir / "manifest.json").write_text("{\n  truncated")
    code, out, _ = verify(capsys, run_dir)
    assert code == 1 and f"{run_dir}/manifest.json:2:1: V105 invalid JSON" in out


def test_finalize_artifacts_lists_regular_files_only(run_dir):
    arts = finalize_artifacts(run_dir)
    assert list(arts) == sorted(arts) and "manifest.json" not in arts and all("\\" not in k for k in arts)
    with JsonlWriter(run_dir / "backends/a/more.jsonl") as w:
        w.write({"x": 1})
    assert "backends/a/more.jsonl" in finalize_artifacts(run_dir)


def _rehash(run_dir):
    m = json.loads((run_dir / "manifest.json").read_text())
    m["artifacts"] = finalize_artifacts(run_dir)
    write_json_atomic(run_dir / "manifest.json", m)


def _rebind(run_dir, *names):
    """Bind results/verdict written after the manifest to the manifest as it is now."""
    for name in names:
        doc = json.loads((run_dir / name).read_text())
        write_json_atomic(run_dir / name, dict(doc, manifest_sha256=manifest_sha256(run_dir)))


@pytest.mark.parametrize("workers", [None, 1, 2])
def test_a_record_with_no_worker_in_a_level_split_over_processes_is_refused(tmp_path, capsys, workers):
    """A level the manifest says ran in 2 load processes (`soakspec run --workers 2`) holds a
    record whose `worker` is null: which process sent it is unknown (the judge reads a record's
    process from its worker), and no soakspec writes that, so verify names the line (V108, exit
    1). The same record verifies where the level ran in one process -- `workers` 1, or absent
    as in every run without --workers and all evidence from before it -- as it always did."""
    from soakspec.judge.testing import EvidenceBuilder, small_spec

    b = EvidenceBuilder(small_spec(mode="open", levels="[2rps]"))
    if workers is not None:
        b.level("a", 0)["workers"] = workers
    rows = b.records["a"]
    k = next(i for i, r in enumerate(rows) if r["level"] == 0 and r["bucket"] >= 0)
    rows[k]["worker"] = None
    d = b.write(tmp_path / "run1")  # sealed as a run seals it: hashed into the manifest, results bound to it
    code, out, _ = verify(capsys, d)
    if workers != 2:
        assert code == 0 and out.strip().endswith(")."), out
        assert "intact and complete" in out
        return
    assert code == 1, out
    assert (f"{d}/backends/a/requests.jsonl.gz:{k + 1}:1: V108 record names no worker, but the manifest says its level "
            "(workload 'w', level 0) ran in 2 load processes (--workers): which one sent it is unknown") in out, out
    assert out.count("V108") == 1 and out.splitlines()[-1].startswith("Found 1 problem ")
