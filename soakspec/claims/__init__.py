"""The claim linter: does a review document stay inside the spec's claim boundary?

`lint(doc_text, doc_path, boundary, coverage, evidence=(), current_spec_sha256=None)` is pure
and returns `Diagnostic`s:

- CB001  no claim-boundary section
- CB002  the section does not state one of the spec's exclusions
- CB101  a sentence asserts an excluded item (negated, hedged, quoted, asked: not an assertion)
- CB201  a stated value (count, level, duration, commit, revision, runtime, gate, report hash)
         differs from the evidence; a latency, throughput or request-rate figure the evidence
         contradicts, at the precision it is written with
- CB202  a SHA-256 the evidence does not record
- CB301  scope creep: concurrency, rate, duration, prompt shape, backend, model or hardware not covered
         (a warning when the hardware is unknown)
- CB401  stale evidence: produced from a different spec than the current one
- CB402  (warning) the evidence's stored results.json / verdict.json disagree with the evidence
         re-judged (or with themselves); values are checked against the re-judged evidence

Modules: `facts` (the input values), `document` (blocks, sentences, masking), `phrases`
(normalisation and exclusion patterns), `polarity` (asserted / negated / hedged), `boundary`
(CB001/CB002/CB101), `scope` (CB301), `evidence_check` (CB201/CB202/CB401), `figures` (CB201 for performance
figures), `sustain` (a sweep's figure), `engine` (`lint`),
`adapters` (spec and evidence directories -> facts; the only I/O).
"""

from soakspec.claims.engine import lint
from soakspec.claims.facts import ClaimBoundary, Coverage, EvidenceFacts, LevelFacts

CODES = {
    "CB001": "no claim-boundary section",
    "CB002": "an exclusion missing from the claim-boundary section",
    "CB101": "positive assertion of an excluded item",
    "CB201": "a stated value differs from the evidence",
    "CB202": "a SHA-256 the evidence does not record",
    "CB301": "scope creep beyond what the workload covered",
    "CB401": "stale evidence: the spec hash differs",
    "CB402": "the stored results.json / verdict.json disagree with the evidence re-judged",
}

__all__ = ["CODES", "ClaimBoundary", "Coverage", "EvidenceFacts", "LevelFacts", "lint"]
