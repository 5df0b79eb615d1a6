"""The compressed evidence layout (server.log.gz, traces.jsonl.gz) judges as the plain one did:
a run killed before its log was compressed leaves server.log, and gate gives the same verdict
and figures from either; the judge re-reads a log trace's payload from the log line, never
from the stored row."""

from __future__ import annotations

import gzip
import json

import pytest

from soakspec.evidence import layout
from soakspec.evidence.io import iter_jsonl, read_json
from soakspec.evidence.manifest import write_manifest
from soakspec.evidence.verify import finalize_artifacts, verify_evidence
from soakspec.judge.evidence import load_evidence
from soakspec.judge.joined import join
from soakspec.judge.judge import judge_run
from soakspec.judge.summary import summarize_run
from soakspec.judge.testing import EvidenceBuilder, spec_from_text
from tests.test_judge_streaming import SIM_SPEC


def _figures(spec, root):
    """The verdict and the summary, less the manifest hash they bind to (the edit changes it)."""
    run = join(spec, load_evidence(root))
    verdict, summary = judge_run(run).to_json(), json.loads(json.dumps(summarize_run(run), default=str))
    for doc in (verdict, summary):
        doc.pop("manifest_sha256", None)
    return verdict, summary


def _rehash(root):
    m = read_json(root / layout.MANIFEST)
    m["artifacts"] = {}
    for bound in (layout.RESULTS, layout.VERDICT):
        (root / bound).unlink(missing_ok=True)
    m["artifacts"] = finalize_artifacts(root)
    write_manifest(root, m)


def test_a_plain_server_log_left_by_a_kill_judges_as_the_compressed_one(tmp_path):
    spec = spec_from_text(SIM_SPEC)
    b = EvidenceBuilder(spec)
    for r in list(b.measured(spec.backends[0].name))[:2]:
        b.untrace(r["request_id"], spec.backends[0].name)  # coverage below 100%: the figures say something
    root = b.write(tmp_path / "ev")
    d = root / layout.BACKENDS / layout.safe_name(spec.backends[0].name)
    assert (d / layout.SERVER_LOG_GZ).is_file() and not (d / layout.SERVER_LOG).exists()
    rows = [r for _, r in iter_jsonl(d / layout.TRACES)]
    assert rows and all("payload" not in r and "times" not in r for r in rows)  # in the log, not copied
    before = _figures(spec, root)
    (d / layout.SERVER_LOG).write_bytes(gzip.decompress((d / layout.SERVER_LOG_GZ).read_bytes()))
    (d / layout.SERVER_LOG_GZ).unlink()
    _rehash(root)
    assert verify_evidence(root).problems == ()  # (results and verdict were dropped: re-judged here)
    ev = load_evidence(root)
    assert ev.backends[0].server_log_path == str(d / layout.SERVER_LOG)
    assert _figures(spec, root) == before


def test_a_changed_compressed_log_is_tampering_and_a_stray_plain_one_is_unlisted(tmp_path):
    spec = spec_from_text(SIM_SPEC)
    root = EvidenceBuilder(spec).write(tmp_path / "ev")
    d = root / layout.BACKENDS / layout.safe_name(spec.backends[0].name)
    assert verify_evidence(root).exit_code == 0
    (d / layout.SERVER_LOG).write_text("a stray plain log\n")  # not what the run hashed
    assert [x.code for x in verify_evidence(root).problems] == ["V103"]
    (d / layout.SERVER_LOG).unlink()
    (d / layout.SERVER_LOG_GZ).write_bytes(gzip.compress(b"tampered\n"))
    assert [x.code for x in verify_evidence(root).problems] == ["V101"]


@pytest.mark.parametrize("edit", ["garbage", "cut short"])
def test_a_log_that_does_not_decompress_makes_the_gate_inconclusive_not_a_crash_nor_an_empty_log(tmp_path, capsys, edit):
    """server.log.gz edited into bytes that are not gzip, or cut short mid-member (and the
    manifest re-hashed, so verification does not stop it first): the gate cannot know which
    traces the server logged, so it says the log does not decompress and gives no verdict
    (exit 3) -- never an internal error, never the log read as empty (which would judge every
    request untraced as if the server had said so). A killed run's moved part likewise."""
    from soakspec.cli import main

    spec = spec_from_text(SIM_SPEC)
    root = EvidenceBuilder(spec).write(tmp_path / "ev")
    d = root / layout.BACKENDS / layout.safe_name(spec.backends[0].name)
    data = (d / layout.SERVER_LOG_GZ).read_bytes()
    (d / layout.SERVER_LOG_GZ).write_bytes(b"\x1f\x8b not gzip at all" if edit == "garbage" else data[: len(data) // 2])
    _rehash(root)
    assert main(["gate", str(root)]) == 3
    err = capsys.readouterr().err
    assert f"{d / layout.SERVER_LOG_GZ}: the log does not decompress" in err and "internal error" not in err, err

    # a killed run's log: the moved part does not decompress
    plain = gzip.decompress(data)
    (d / layout.SERVER_LOG_GZ).unlink()
    (d / layout.SERVER_LOG).write_bytes(b"\0" * 100 + plain[100:])
    (d / layout.SERVER_LOG_MOVED).write_bytes(b"\x1f\x8b not gzip at all")
    (d / layout.SERVER_LOG_MOVED_STATE).write_text(json.dumps({"raw_offset": 100, "moved_bytes": 19}))
    _rehash(root)
    assert main(["gate", str(root)]) == 3
    err = capsys.readouterr().err
    assert f"{d / layout.SERVER_LOG}: the log does not decompress" in err and "internal error" not in err, err


def test_a_log_changed_after_the_run_so_it_does_not_decompress_fails_the_gate_naming_it(tmp_path, capsys):
    """One byte of server.log.gz flipped after the run (the manifest not re-hashed): verify
    says V101, and gate, report and compare must say the same -- the artifact changed since
    the manifest was written FAILs artifacts_verified (exit 1), as a flipped byte of
    requests.jsonl.gz does. It read "the log does not decompress (BadGzipFile: CRC check
    failed ...): the evidence cannot be judged" (exit 3), the edit unnamed."""
    from soakspec.cli import main

    spec = spec_from_text(SIM_SPEC)
    base = EvidenceBuilder(spec).write(tmp_path / "base")
    root = EvidenceBuilder(spec).write(tmp_path / "ev")
    d = root / layout.BACKENDS / layout.safe_name(spec.backends[0].name)
    data = bytearray((d / layout.SERVER_LOG_GZ).read_bytes())
    data[len(data) // 2] ^= 0x01
    (d / layout.SERVER_LOG_GZ).write_bytes(bytes(data))
    rel = f"{layout.BACKENDS}/{layout.safe_name(spec.backends[0].name)}/{layout.SERVER_LOG_GZ}"
    assert [x.code for x in verify_evidence(root).problems] == ["V101"]

    assert main(["gate", str(root)]) == 1
    cap = capsys.readouterr()
    assert "does not decompress" not in cap.err and "cannot be judged" not in cap.err, cap.err
    assert f"FAIL  artifacts_verified — {rel}: changed since the manifest was written" in cap.out, cap.out

    assert main(["report", str(root)]) == 0  # a report of a FAIL verdict is written (its exit code is gate's)
    cap = capsys.readouterr()
    assert "cannot be judged" not in cap.err and f"{rel}: changed since the manifest was written" in cap.out, cap.err

    assert main(["compare", str(base), str(root)]) == 1
    cap = capsys.readouterr()
    assert "cannot be judged" not in cap.err, cap.err
    assert f"{rel}: changed since the manifest was written" in cap.out, cap.out
