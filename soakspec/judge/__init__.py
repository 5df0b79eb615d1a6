"""The judge: evidence in, verdict out.

    load_evidence(run_dir) -> Evidence       verify (re-hash) and read a run directory; the only I/O
    summarize(evidence, spec=None) -> dict   results.json: per backend, level and bucket
    judge(spec, evidence) -> Verdict         validity -> evidence -> performance rules; pure
    join(spec, evidence) -> JudgedRun        plan and evidence joined and indexed once, for a
                                             caller that both judges and summarizes:
                                             judge_run(run) -> Verdict, summarize_run(run) -> dict
    render_text(verdict) / verdict.to_json() the terminal form / verdict.json
    combine(children) -> Combined            the report across per-backend runs

The rules are registered in `soakspec.judge.registry.RULES` (one row per predicate and metric).
Statistics live in `soakspec.judge.stats` (the one percentile function); synthetic evidence for
tests in `soakspec.judge.testing`.
"""

from __future__ import annotations

from soakspec.judge.evidence import BackendEvidence, Evidence, EvidenceNotFound, Integrity, load_evidence
from soakspec.judge.joined import JudgedRun, join
from soakspec.judge.judge import judge, judge_run
from soakspec.judge.summary import summarize, summarize_run
from soakspec.judge.verdict import Instance, Location, RuleResult, Verdict, render_text

__all__ = [
    "BackendEvidence",
    "Evidence",
    "EvidenceNotFound",
    "Instance",
    "Integrity",
    "JudgedRun",
    "Location",
    "RuleResult",
    "Verdict",
    "join",
    "judge",
    "judge_run",
    "load_evidence",
    "render_text",
    "summarize",
    "summarize_run",
]
