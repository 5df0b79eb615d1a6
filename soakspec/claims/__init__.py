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
- CB501  a claimed change ("p99 TTFT fell 12%") whose direction contradicts what compare measured
- CB502  a claimed size of change outside compare's confidence interval for that row
- CB503  a claimed change where compare found no significant change (or had too few samples)
- CB504  "unchanged" / "no regression" where compare found a significant regression
- CB505  (warning) a claim of change compare has no row (or no data) for

Modules: `facts` (the input values), `document` (blocks, sentences, masking), `phrases`
(normalisation and exclusion patterns), `polarity` (asserted / negated / hedged), `boundary`
(CB001/CB002/CB101), `scope` (CB301), `evidence_check` (CB201/CB202/CB401), `figures` (CB201 for performance
figures), `sustain` (a sweep's figure), `changes` (CB501-CB505: claims of change against `soakspec compare`'s
rows), `sweep_changes` (the same, of a sweep's own figure against compare's Sweep row), `change_common`
(what those two share: a number's precision, the backends a claim names), `direction` (the
words of change `changes` reads and `figures` leaves alone), `engine` (`lint`),
`adapters` (spec and evidence directories -> facts; the only I/O).
"""

from soakspec.claims.engine import lint
from soakspec.claims.facts import ChangeFacts, ChangeRow, ClaimBoundary, Coverage, EvidenceFacts, LevelFacts

CODES = {
    "CB001": "no claim-boundary section",
    "CB002": "an exclusion missing from the claim-boundary section",
    "CB101": "positive assertion of an excluded item",
    "CB201": "a stated value differs from the evidence",
    "CB202": "a SHA-256 the evidence does not record",
    "CB301": "scope creep beyond what the workload covered",
    "CB401": "stale evidence: the spec hash differs",
    "CB402": "the stored results.json / verdict.json disagree with the evidence re-judged",
    "CB501": "a claimed change contradicts the direction compare measured",
    "CB502": "a claimed size of change outside compare's confidence interval",
    "CB503": "a claimed change where compare found no significant change",
    "CB504": "'unchanged' / 'no regression' where compare found a significant regression",
    "CB505": "a claim of change compare has no row or data for",
}

__all__ = ["CODES", "ChangeFacts", "ChangeRow", "ClaimBoundary", "Coverage", "EvidenceFacts", "LevelFacts", "lint"]
