"""Judging a run directory from a command: `soakspec run` calls this right after a run, with
the spec it ran (the same code path as `soakspec gate`); `gate`, `report`, `combine` and
`lint-claims` choose the spec to judge retained evidence with by `spec_for`."""

from __future__ import annotations

import dataclasses
import functools
import json
import math
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
    spec = as_it_ran(spec, evidence.manifest)
    stored = evidence.manifest.get("spec")
    want = stored_spec_sha256(stored) if isinstance(stored, dict) else None  # a redacted text has its own hash
    if isinstance(want, str) and spec.sha256 != want:
        notes.append(f"the embedded spec's canonical text now hashes to {spec.sha256[:12]}, "
                     f"the manifest recorded {want[:12]}")
    return spec, notes


def as_it_ran(spec: Spec, manifest: Any) -> Spec:
    """The embedded spec as it was meant when the run read it, where a later soakspec reads the
    same text otherwise (the manifest records how the run planned each level): a replay's
    `hash_ids` (prefix sharing, the default since) unused when its levels' shapes record no
    `prefix_blocks` -- the run sent unique prompts -- and its duration without `duration`, when
    the levels record the earlier window (the trace's span rounded up to whole buckets,
    `lang.replay.earlier_replay_rest`) where the spec now derives the shorter one
    (`replay_rest`). Either way the re-planned level is the one that ran, so that its evidence
    is judged, and reported, as it ran. A spec given with `--spec` is taken as written."""
    levels = _recorded_levels(manifest)
    from soakspec.judge.joined import _time_scale  # the judge's one reading of the run's time scale

    scale = _time_scale(manifest)[0] if isinstance(manifest, dict) else 1.0
    out = []
    for w in spec.workloads:
        rp, ran = w.load.replay, levels.get(w.name)
        if rp is not None and ran:
            w = _replay_as_it_ran(w, ran, scale)
        out.append(w)
    return dataclasses.replace(spec, workloads=tuple(out)) if out != list(spec.workloads) else spec


def _recorded_levels(manifest: Any) -> dict[str, list[dict]]:
    """The manifest's level entries by workload (every backend's)."""
    out: dict[str, list[dict]] = {}
    backends = manifest.get("backends") if isinstance(manifest, dict) else None
    for b in backends if isinstance(backends, list) else []:
        levels = b.get("levels") if isinstance(b, dict) else None
        for lv in levels if isinstance(levels, list) else []:
            if isinstance(lv, dict) and isinstance(lv.get("workload"), str):
                out.setdefault(lv["workload"], []).append(lv)
    return out


def _replay_as_it_ran(w: Any, ran: list[dict], scale: float) -> Any:
    from soakspec.lang.replay import earlier_replay_rest, replay_rest

    rp = w.load.replay
    shapes = [lv.get("shape") for lv in ran]
    if rp.hash_ids and shapes and all(isinstance(s, dict) and s.get("kind") == "replay" and "prefix_blocks" not in s for s in shapes):
        w = dataclasses.replace(w, load=dataclasses.replace(w.load, replay=dataclasses.replace(rp, hash_ids=())))
    planned = {lv.get("planned_duration_s") for lv in ran}
    if len(planned) != 1 or not rp.offsets_s:
        return w
    d = planned.pop()
    if not isinstance(d, (int, float)) or isinstance(d, bool) or d <= 0:
        return w
    d /= scale
    args = (rp.offsets_s, rp.speed, w.warmup_s)
    buckets = (w.bucket_s, None)
    close = functools.partial(math.isclose, rel_tol=1e-9, abs_tol=1e-6)
    derived = any(close(w.duration_s, replay_rest(*args, b)) for b in buckets)
    if derived and not close(d, w.duration_s) and any(close(d, earlier_replay_rest(*args, b)) for b in buckets):
        one = close(w.bucket_s, w.duration_s)  # no `bucket`: one bucket, the whole window (check)
        w = dataclasses.replace(w, duration_s=d, bucket_s=d if one else w.bucket_s)
    return w


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
