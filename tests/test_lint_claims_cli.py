"""`soakspec lint-claims`: exit codes, text and JSON output, the spec and evidence adapters."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from soakspec import cli
from soakspec.claims import adapters
from soakspec.claims.facts import ClaimBoundary, Coverage

DATA = Path(__file__).parent / "data" / "claims"
SMALL = str(DATA / "small.soak")

CLEAN = """# Soak PR

Adds a soak of the sim backend at concurrency 4 and 8, 120 s per level.

## Claim boundary

Short-shape soak evidence for the simulated backend. It does not claim production readiness or vLLM parity.
"""


def _doc(tmp_path: Path, text: str, name: str = "PR.md") -> str:
    p = tmp_path / name
    p.write_text(text, encoding="utf-8")
    return str(p)


def test_clean_document_exits_0(tmp_path, capsys):
    doc = _doc(tmp_path, CLEAN)
    assert cli.main(["lint-claims", doc, "--spec", SMALL]) == 0
    out, err = capsys.readouterr()
    assert out.strip() == f"{doc}: no findings"
    assert err == ""


def test_findings_exit_1_with_text_diagnostics(tmp_path, capsys):
    doc = _doc(tmp_path, CLEAN + "\nThis makes the sim path production-ready.\n")
    assert cli.main(["lint-claims", doc, "--spec", SMALL]) == 1
    out, _ = capsys.readouterr()
    lines = out.splitlines()
    assert lines[0] == f'{doc}:9:25: CB101 asserts "production-ready", which the claim boundary excludes ("production readiness")'
    assert lines[1] == "  This makes the sim path production-ready."
    assert lines[2] == "  " + " " * 24 + "^" + "~" * 15
    assert lines[-1] == "Found 1 error."


def test_json_format(tmp_path, capsys):
    doc = _doc(tmp_path, CLEAN.replace("## Claim boundary", "## Scope") + "\nIt is stable at concurrency 64.\n")
    assert cli.main(["lint-claims", doc, "--spec", SMALL, "--format", "json"]) == 1
    out, err = capsys.readouterr()
    payload = json.loads(out)
    assert payload["schema_version"] == 1
    assert payload["spec_sha256"] and len(payload["spec_sha256"]) == 64
    assert payload["summary"] == {"errors": 2, "warnings": 0}
    got = [(d["code"], d["line"], d["column"], d["severity"]) for d in payload["diagnostics"]]
    assert got == [("CB001", 1, 1, "error"), ("CB301", 9, 29, "error")]
    assert set(payload["diagnostics"][0]) == {"path", "line", "column", "end_line", "end_column", "code", "severity", "message", "hint"}
    assert err == ""


def test_warnings_only_exit_0(tmp_path, capsys):
    doc = _doc(tmp_path, CLEAN + "\nIt ran on 2x H100.\n")
    assert cli.main(["lint-claims", doc, "--spec", SMALL]) == 0
    out, _ = capsys.readouterr()
    assert "CB301" in out and "[warning]" in out and out.strip().endswith("Found 1 warning.")


@pytest.mark.parametrize(
    "argv, message",
    [
        (["lint-claims", "{tmp}/missing.md", "--spec", SMALL], "cannot read document"),
        (["lint-claims", "{doc}", "--spec", "{tmp}/missing.soak"], "cannot read spec"),
        (["lint-claims", "{doc}", "--spec", str(DATA / "invalid.soak")], "invalid spec"),
        (["lint-claims", "{doc}", "--spec", SMALL, "--evidence", "{tmp}/no-such-dir"], "no such evidence directory"),
        # two directories, one mistyped: that one named, as `soakspec compare` names it -- not
        # "--compare takes two evidence directories", which the user gave
        (["lint-claims", "{doc}", "--spec", SMALL, "--compare", "{tmp}/ev", "{tmp}/no-such-new"],
         "no-such-new: no such evidence directory"),
        (["lint-claims", "{doc}", "--spec", SMALL, "--compare", "{tmp}/no-such-base", "{tmp}/ev"],
         "no-such-base: no such evidence directory"),
    ],
)
def test_usage_errors_exit_2(tmp_path, capsys, argv, message):
    doc = _doc(tmp_path, CLEAN)
    (tmp_path / "ev").mkdir()
    (tmp_path / "ev" / "manifest.json").write_text("{}")  # the other --compare side
    argv = [a.format(tmp=tmp_path, doc=doc) for a in argv]
    assert cli.main(argv) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert message in err


def test_invalid_spec_prints_its_diagnostics_on_stderr(tmp_path, capsys):
    doc = _doc(tmp_path, CLEAN)
    assert cli.main(["lint-claims", doc, "--spec", str(DATA / "invalid.soak")]) == 2
    _, err = capsys.readouterr()
    assert "invalid.soak:2:13: E001" in err  # `nonsense =` with no value: at the end of its own line, not at the next line's '}'


def test_bad_format_is_an_argparse_usage_error(tmp_path):
    with pytest.raises(SystemExit) as e:
        cli.main(["lint-claims", _doc(tmp_path, CLEAN), "--spec", SMALL, "--format", "xml"])
    assert e.value.code == 2


def test_main_with_a_monkeypatched_spec_adapter(tmp_path, capsys, monkeypatch):
    """`main` depends on the language front end only through the adapter."""
    boundary = ClaimBoundary(("x",), ("vLLM parity",))
    monkeypatch.setattr(adapters, "load_boundary_and_coverage", lambda p, source=None: (boundary, Coverage(), "f" * 64, []))
    doc = _doc(tmp_path, "Claim boundary: no vLLM parity claim.\n\nIt matches vLLM.\n")
    assert cli.main(["lint-claims", doc, "--spec", SMALL]) == 1
    assert "CB101" in capsys.readouterr().out

    def missing(path, source=None):
        raise adapters.AdapterError("the .soak language front end is not available")

    monkeypatch.setattr(adapters, "load_boundary_and_coverage", missing)
    assert cli.main(["lint-claims", doc, "--spec", SMALL]) == 2
    assert "front end is not available" in capsys.readouterr().err


# ---------------------------------------------------------------- evidence directories

def _spec_sha() -> str:
    _, _, sha, _ = adapters.load_boundary_and_coverage(SMALL)
    assert sha
    return sha


def _write_evidence(root: Path, spec_sha: str, *, list_form: bool = False) -> dict[str, str]:
    root.mkdir(parents=True)
    report = "ab" * 32
    artifacts = {"backends/sim/report.json": report, "backends/sim/requests.jsonl.gz": "cd" * 32}
    backend_m = {
        "source": {"commit_before": "a" * 40, "commit_after": "a" * 40},
        "model": {"revision": "b" * 40},
        "runtime_boundary": {"display": "sim"},
    }
    backend_r = {
        "requests": {"completed": 112, "failed": 0, "timeout": 0},
        "buckets": [{"bucket": i, "concurrency": c} for i, c in enumerate([4, 4, 8, 8])],
    }
    if list_form:  # the shape soakspec's own schemas use
        manifest = {"spec": {"sha256": spec_sha}, "backends": [{"name": "sim", **backend_m}], "artifacts": artifacts,
                    "gpus": {"available": True, "devices": [{"name": "NVIDIA H100"}, {"name": "NVIDIA H100"}]}}
        results = {"backends": [{"name": "sim", **backend_r}]}
        (root / "verdict.json").write_text(json.dumps({"verdict": "PASS"}))
    else:  # the flat shape from the lint-claims brief
        manifest = {"spec_sha256": spec_sha, "artifacts": artifacts,
                    "backends": {"sim": {"commit_before": "a" * 40, "commit_after": "a" * 40, "model": {"revision": "b" * 40},
                                         "runtime_boundary": {"display": "sim"}}}}
        results = {"backends": {"sim": {"completed": 112, "failed": 0, "timeouts": 0, "buckets": 4, "batches": 14, "gate": "passed"}}}
    (root / "manifest.json").write_text(json.dumps(manifest))
    (root / "results.json").write_text(json.dumps(results))
    return {"report": report}


@pytest.mark.parametrize("list_form", [False, True])
def test_load_evidence_facts_reads_both_shapes(tmp_path, list_form):
    _write_evidence(tmp_path / "run", "e" * 64, list_form=list_form)
    (ev,) = adapters.load_evidence_facts(tmp_path / "run")
    assert ev.backend == "sim"
    assert (ev.completed, ev.failed, ev.timeouts, ev.buckets) == (112, 0, 0, 4)
    assert ev.batches == (None if list_form else 14)
    assert ev.commit == "a" * 40 and ev.model_revision == "b" * 40
    assert ev.runtime_boundary == "sim" and ev.gate == "passed"
    assert ev.report_sha256 == "ab" * 32 and ev.spec_sha256 == "e" * 64
    assert "cd" * 32 in ev.artifact_sha256.values()
    manifest_sha = hashlib.sha256((tmp_path / "run" / "manifest.json").read_bytes()).hexdigest()
    assert ev.artifact_sha256["manifest.json"] == manifest_sha
    if list_form:
        assert ev.concurrency_levels == (4, 8)
        assert ev.hardware == ("2x NVIDIA H100",)


def test_cli_checks_numbers_and_staleness_against_evidence(tmp_path, capsys):
    sha = _spec_sha()
    _write_evidence(tmp_path / "fresh", sha)
    _write_evidence(tmp_path / "stale", "0" * 64)
    good = _doc(tmp_path, CLEAN + f"\nThe sim backend completed 112 requests; report {'ab' * 32}.\n")
    assert cli.main(["lint-claims", good, "--spec", SMALL, "--evidence", str(tmp_path / "fresh")]) == 0
    capsys.readouterr()

    bad = _doc(tmp_path, CLEAN + f"\nThe sim backend completed 113 requests; report {'ab' * 32}.\n", "bad.md")
    assert cli.main(["lint-claims", bad, "--spec", SMALL, "--evidence", str(tmp_path / "fresh"), "--format", "json"]) == 1
    diags = json.loads(capsys.readouterr().out)["diagnostics"]
    assert [(d["code"], d["line"]) for d in diags] == [("CB201", 9)]
    assert "completed 113" in diags[0]["message"] and "112" in diags[0]["message"]

    assert cli.main(["lint-claims", good, "--spec", SMALL, "--evidence", str(tmp_path / "stale")]) == 1
    out = capsys.readouterr().out
    assert "CB401" in out and str(tmp_path / "stale") in out and sha in out
