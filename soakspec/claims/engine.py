"""`lint`: one pure function from (document, boundary, coverage, evidence) to diagnostics."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from soakspec.claims.boundary import check_assertions, check_boundary_section, unasserted_blocks
from soakspec.claims.changes import check_changes
from soakspec.claims.document import parse_document
from soakspec.claims.evidence_check import check_evidence, check_stale, check_stored
from soakspec.claims.figures import check_figures
from soakspec.claims.facts import ChangeFacts, ClaimBoundary, Coverage, EvidenceFacts
from soakspec.claims.phrases import compile_exclusion
from soakspec.claims.scope import check_scope
from soakspec.claims.sustain import check_sustain
from soakspec.diagnostics import Diagnostic, Span, sort_key


def _overlaps(a: Span, b: Span) -> bool:
    return (a.line, a.column) < (b.end_line, b.end_column) and (b.line, b.column) < (a.end_line, a.end_column)


def lint(
    doc_text: str,
    doc_path: str,
    boundary: ClaimBoundary,
    coverage: Coverage,
    evidence: Sequence[EvidenceFacts] = (),
    current_spec_sha256: str | None = None,
    changes: ChangeFacts | None = None,
) -> list[Diagnostic]:
    """Check a review document against a claim boundary, a workload's coverage and evidence.

    Checks: CB001/CB002 (the claim-boundary section and its exclusions), CB101 (an excluded
    item asserted), CB301 (scope creep; dropped where a CB101 already covers the phrase),
    CB201/CB202 (values and hashes vs evidence; only with evidence), CB201 for latency,
    throughput and request-rate figures (`figures`; only with evidence), CB401 (stale evidence;
    only with `current_spec_sha256`), CB402 (the evidence's stored results.json/verdict.json
    disagree with it re-judged: a warning), CB501-CB505 (claims of change against `soakspec
    compare`'s rows, `changes`; only with them: `soakspec.claims.changes`). Unknown `coverage.hardware` is taken from the evidence.
    Pure: no I/O. Diagnostics come sorted.
    """
    if not coverage.hardware:
        hardware = tuple(dict.fromkeys(h for ev in evidence for h in ev.hardware))
        coverage = dataclasses.replace(coverage, hardware=hardware)
    doc = parse_document(doc_text)
    excludes = [compile_exclusion(e) for e in boundary.excludes if e.strip()]
    negated = unasserted_blocks(doc)
    has_boundary = bool(boundary.claims or boundary.excludes)

    diags: list[Diagnostic] = []
    diags += check_boundary_section(doc, doc_path, excludes, has_boundary)
    asserted = check_assertions(doc, doc_path, excludes, negated)
    diags += asserted
    sustain = check_sustain(doc, doc_path, coverage, evidence, negated)  # a sweep's figure (CB201 / CB301)
    diags += [  # one finding per overclaim: a sustain claim's own message says more than "not covered"
        d for d in check_scope(doc, doc_path, coverage, negated)
        if not any(_overlaps(d.span, a.span) for a in [*asserted, *sustain])
    ]
    diags += sustain
    diags += check_evidence(doc, doc_path, evidence, current_spec_sha256)
    diags += check_figures(doc, doc_path, evidence, negated)  # latency / throughput / rate figures (CB201)
    diags += check_stale(doc, doc_path, evidence, current_spec_sha256)
    diags += check_stored(doc, doc_path, evidence)
    diags += check_changes(doc, doc_path, changes, negated)  # claims of change against compare's rows (CB501-CB505)
    return sorted(diags, key=sort_key)
