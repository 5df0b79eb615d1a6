"""`soakspec gate DIR`: verify, judge, print; exit 0/1/3 (2 for usage errors)."""

from __future__ import annotations

import errno
import json
import os
import sys
from pathlib import Path

import pytest

from soakspec.cli import main
from soakspec.evidence import schema
from soakspec.evidence.testing import edit_requests
from soakspec.judge.testing import EvidenceBuilder
from soakspec.lang import load_spec

SEED = Path(__file__).resolve().parents[1] / "specs" / "dsv2lite.soak"


@pytest.fixture(scope="module")
def spec():
    return load_spec(SEED)[0]


def listing(root: Path) -> dict[str, float]:
    return {str(p.relative_to(root)): p.stat().st_mtime for p in root.rglob("*")}


def test_clean_run_passes(spec, tmp_path, capsys):
    root = EvidenceBuilder(spec).write(tmp_path / "run")
    before = listing(root)
    assert main(["gate", str(root)]) == 0
    out, err = capsys.readouterr()
    assert out.rstrip().splitlines()[-1] == "PASS: all 15 required rules hold"
    assert err == ""
    assert listing(root) == before  # gate writes nothing


def test_json_output_validates(spec, tmp_path, capsys):
    root = EvidenceBuilder(spec).write(tmp_path / "run")
    assert main(["gate", str(root), "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert not schema.validate("verdict", doc)
    assert doc["verdict"] == "PASS" and doc["exit_code"] == 0
    assert doc["run_id"] == "run1" and len(doc["manifest_sha256"]) == 64


def test_failed_request_exits_1(spec, tmp_path, capsys):
    b = EvidenceBuilder(spec)
    b.set_outcome(list(b.measured("nccl", level=1, bucket=1))[0], "failed", "engine died")
    root = b.write(tmp_path / "run")
    assert main(["gate", str(root)]) == 1
    out = capsys.readouterr().out
    assert 'FAIL  failed == 0 — backend nccl, concurrency 8 (batches of 8), bucket 1 [' in out
    assert '1 failed request (engine died)' in out


class _Stdout:
    """A stdout whose writes (or only its flush) fail with `error`."""

    def __init__(self, error: OSError, on: str = "write"):
        self.error, self.on, self.written = error, on, []

    def write(self, text: str) -> int:
        if self.on == "write":
            raise self.error
        self.written.append(text)
        return len(text)

    def flush(self) -> None:
        if self.on == "flush":
            raise self.error


@pytest.mark.parametrize("failed", [False, True], ids=["pass", "fail"])
def test_a_verdict_stdout_cannot_take_is_said_and_aborts(spec, tmp_path, capsys, monkeypatch, failed):
    """`gate DIR > /dev/full`: the verdict never reached stdout, so the exit is ABORTED whatever
    it was (a PASS must not stand for a verdict nobody received), and stderr says why in one
    line: a full disk, not "internal error ... this is a bug"."""
    b = EvidenceBuilder(spec)
    if failed:
        b.set_outcome(list(b.measured("nccl", level=1, bucket=1))[0], "failed", "engine died")
    root = b.write(tmp_path / "run")
    monkeypatch.setattr(sys, "stdout", _Stdout(OSError(errno.ENOSPC, "No space left on device")))
    code = main(["gate", str(root)])
    err = capsys.readouterr().err
    assert code == 4
    assert err == "soakspec gate: cannot write the verdict to stdout: No space left on device (stdout holds at most part of it)\n"


def test_a_reader_that_leaves_after_the_verdict_does_not_change_its_code(spec, tmp_path, monkeypatch):
    """`gate DIR | head -1`: the pipe breaks when the buffered verdict is flushed, after the gate
    decided; the exit is still the verdict's (1 here), not a PASS."""
    b = EvidenceBuilder(spec)
    b.set_outcome(list(b.measured("nccl", level=1, bucket=1))[0], "failed", "engine died")
    root = b.write(tmp_path / "run")
    out = _Stdout(BrokenPipeError(errno.EPIPE, "Broken pipe"), on="flush")
    monkeypatch.setattr(sys, "stdout", out)
    assert main(["gate", str(root)]) == 1
    assert "FAIL  failed == 0" in "".join(out.written)


def test_a_reader_that_leaves_before_the_verdict_is_written_gets_no_pass(spec, tmp_path, monkeypatch):
    """`gate DIR | head` where the pipe breaks while the verdict is written: the command did
    not finish, so its exit is ABORTED, never OK (it was 0: a pipefail CI passed a FAIL)."""
    b = EvidenceBuilder(spec)
    b.set_outcome(list(b.measured("nccl", level=1, bucket=1))[0], "failed", "engine died")
    root = b.write(tmp_path / "run")
    monkeypatch.setattr(sys, "stdout", _Stdout(BrokenPipeError(errno.EPIPE, "Broken pipe"), on="write"))
    assert main(["gate", str(root)]) == 4


def test_edited_artifact_refuses_to_pass_and_names_the_file(spec, tmp_path, capsys):
    root = EvidenceBuilder(spec).write(tmp_path / "run")
    p = root / "backends" / "nccl" / "requests.jsonl.gz"

    def retouch(text: str) -> str:
        lines = text.splitlines(keepends=True)
        doctored = json.loads(lines[3])
        doctored.update(end=doctored["end"] - 0.5)  # a retouched number
        lines[3] = json.dumps(doctored, separators=(",", ":")) + "\n"
        return "".join(lines)

    edit_requests(p, retouch)
    assert main(["gate", str(root)]) == 1
    out = capsys.readouterr().out
    assert "FAIL  artifacts_verified — backends/nccl/requests.jsonl.gz: changed since the manifest was written" in out


def test_added_file_refuses_to_pass(spec, tmp_path, capsys):
    root = EvidenceBuilder(spec).write(tmp_path / "run")
    (root / "backends" / "nccl" / "extra.jsonl").write_text("{}\n")
    assert main(["gate", str(root)]) == 1
    assert "backends/nccl/extra.jsonl: exists but is not listed" in capsys.readouterr().out


def test_rehearsal_exits_3(spec, tmp_path, capsys):
    root = EvidenceBuilder(spec, time_scale=0.1, rehearsal=True).write(tmp_path / "run")
    assert main(["gate", str(root)]) == 3
    assert "INCONCLUSIVE" in capsys.readouterr().out


def test_missing_directory_is_a_usage_error(tmp_path, capsys):
    assert main(["gate", str(tmp_path / "nope")]) == 2
    assert "no such evidence directory" in capsys.readouterr().err
    os.mkdir(tmp_path / "empty")
    assert main(["gate", str(tmp_path / "empty")]) == 2


def test_newer_spec_is_used_and_reported(spec, tmp_path, capsys):
    root = EvidenceBuilder(spec).write(tmp_path / "run")
    newer = tmp_path / "newer.soak"
    newer.write_text(SEED.read_text().replace("  require follow_up\n", "  require follow_up\n  require p99(ttft) <= 1s\n"))
    assert main(["gate", str(root), "--spec", str(newer)]) == 3  # 32 requests per backend cannot show a p99
    out, err = capsys.readouterr()
    assert "differs from the spec the run used" in err
    assert "p99(ttft) <= 1s" in out and "needs" in out


def test_spec_that_does_not_check_is_a_usage_error(spec, tmp_path, capsys):
    root = EvidenceBuilder(spec).write(tmp_path / "run")
    bad = tmp_path / "bad.soak"
    bad.write_text('soak "x" {}\ngate {\n  require nonsense <= 1\n}\n')
    assert main(["gate", str(root), "--spec", str(bad)]) == 2
    assert "does not check" in capsys.readouterr().err


def test_judge_run_dir_writes_bound_results_and_verdict(spec, tmp_path, capsys):
    """`soakspec run` judges through judge_run_dir: results.json and verdict.json land next to
    the final manifest, bound to it by hash, and the directory still verifies and gates."""
    from soakspec.evidence.io import sha256_file
    from soakspec.judge.cli_support import judge_run_dir

    b = EvidenceBuilder(spec)
    root = b.write(tmp_path / "run")
    (root / "results.json").unlink()
    assert judge_run_dir(root, spec, "text", write=True) == 0
    assert capsys.readouterr().out.rstrip().endswith("PASS: all 15 required rules hold")
    manifest_sha = sha256_file(root / "manifest.json")
    for name, kind in (("results.json", "results"), ("verdict.json", "verdict")):
        doc = json.loads((root / name).read_text())
        assert doc["manifest_sha256"] == manifest_sha
        assert not schema.validate(kind, doc)
    assert main(["verify", str(root)]) == 0
    assert main(["gate", str(root)]) == 0
