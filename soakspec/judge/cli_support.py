"""Judging a run directory from a command: `soakspec run` calls this right after a run, with
the spec it ran (the same code path as `soakspec gate`); `gate`, `report`, `combine` and
`lint-claims` choose the spec to judge retained evidence with by `spec_for`."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

from soakspec import heap
from soakspec.evidence import layout
from soakspec.exitcodes import UsageError
from soakspec.lang.spec import Spec


def _dump(doc: Any) -> str:
    return json.dumps(doc, indent=2, sort_keys=True, ensure_ascii=False)


def judge_run_dir(run_dir: str | os.PathLike, spec: Spec, fmt: str = "text", *, write: bool = False) -> int:
    """Verify and judge `run_dir` against `spec`, print the verdict to stdout and return its
    exit code (0 PASS, 1 FAIL, 3 INCONCLUSIVE). See `judge_and_write` for `write`."""
    from soakspec.judge.verdict import render_text

    verdict, _ = judge_and_write(run_dir, spec, write=write)
    print(_dump(verdict.to_json()) if fmt == "json" else render_text(verdict))
    return int(verdict.exit_code)


def judge_and_write(run_dir: str | os.PathLike, spec: Spec, *, write: bool = False,
                    retained: bool = False) -> tuple[Any, dict[str, Any]]:
    """Verify and judge `run_dir` against `spec`: (the Verdict, results.json's document).
    `retained`: the evidence is judged after the fact, as `gate` judges it (its own
    results.json and verdict.json must be there); the run at its end judges with False.

    With `write`, results.json and verdict.json are written into the run directory, each bound
    to the final manifest by `manifest_sha256` (so `soakspec verify` accepts them unlisted). A
    file the manifest already lists as an artifact is never overwritten: that would turn the
    evidence into something other than what the run hashed.
    """
    from soakspec.evidence.results import write_results, write_verdict
    from soakspec.judge.evidence import load_evidence, spec_itl_thresholds, spec_windows
    from soakspec.judge.joined import join
    from soakspec.judge.judge import judge_run
    from soakspec.judge.summary import summarize_run

    heap.release()  # `run`: what collecting the evidence freed, before the judge builds its columns
    evidence = load_evidence(run_dir, windows=spec_windows(spec), itl_thresholds=spec_itl_thresholds(spec))
    run = join(spec, evidence, retained=retained)  # once, for the verdict and results.json
    verdict = judge_run(run)
    doc = verdict.to_json()
    results = summarize_run(run)
    if write:
        listed = evidence.manifest.get("artifacts") or {}
        if layout.RESULTS not in listed:
            write_results(run_dir, results)
        else:
            print(f"soakspec: {layout.RESULTS} is part of the hashed evidence; not rewritten", file=sys.stderr)
        if layout.VERDICT not in listed:
            write_verdict(run_dir, doc)
        else:
            print(f"soakspec: {layout.VERDICT} is part of the hashed evidence; not rewritten", file=sys.stderr)
    return verdict, results


def spec_for(evidence, spec_file: str | None, where: str):
    """The spec to judge with: `spec_file` when given, else the manifest's embedded text.
    Returns (spec, messages for stderr). Raises UsageError when the spec does not check."""
    from soakspec.diagnostics import render_text
    from soakspec.lang import load_spec, load_text

    notes: list[str] = []
    if spec_file is not None:
        spec, diags, text = load_spec(spec_file)
        if spec is None:
            raise UsageError(f"{spec_file} does not check:\n{render_text(diags, {spec_file: text})}")
        if evidence.spec_sha256 and spec.sha256 != evidence.spec_sha256:
            notes.append(f"{spec_file} (sha256 {spec.sha256[:12]}) differs from the spec the run used "
                         f"(sha256 {evidence.spec_sha256[:12]}); judging with {spec_file}")
        return spec, notes
    text = evidence.spec_text
    if text is None:
        raise UsageError(f"{where}: the manifest embeds no spec text; pass --spec FILE")
    name = f"{where}/manifest.json#spec"
    from soakspec.evidence.manifest import recorded_data_files, stored_spec_sha256

    spec, diags, shown = load_text(text, name, data_optional=True, data_files=recorded_data_files(evidence.manifest))
    if spec is None:
        raise UsageError(f"the spec embedded in {where} does not check with this soakspec; pass --spec FILE:\n"
                         f"{render_text(diags, {name: shown})}")
    notes += [d.message for d in diags if d.code == "W513"]
    stored = evidence.manifest.get("spec")
    want = stored_spec_sha256(stored) if isinstance(stored, dict) else None  # a redacted text has its own hash
    if isinstance(want, str) and spec.sha256 != want:
        notes.append(f"the embedded spec's canonical text now hashes to {spec.sha256[:12]}, "
                     f"the manifest recorded {want[:12]}")
    return spec, notes


def bare_evidence(run_dir: str | os.PathLike):
    """An evidence directory's manifest alone, as an `Evidence` without backends: what
    `spec_for` reads (the embedded spec), before the evidence is verified and read with the
    chosen spec's window lengths. Raises as `load_evidence` does for the manifest
    (`EvidenceNotFound`, `EvidenceError`)."""
    from soakspec.evidence.io import EvidenceFormatError, read_json, require_evidence_dir
    from soakspec.judge.evidence import Evidence, Integrity

    mpath = require_evidence_dir(run_dir) / layout.MANIFEST
    manifest = read_json(mpath)
    if not isinstance(manifest, dict):
        raise EvidenceFormatError(mpath, 1, "the manifest is not a JSON object")
    return Evidence(manifest, (), Integrity(), None, str(run_dir))
