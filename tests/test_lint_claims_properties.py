"""Properties of the claim linter's polarity rules, over generated review documents.

Documents are a complete claim-boundary section plus paragraphs and bullet lists built from
safe sentence fragments (no excluded item, nothing out of scope). Into one of them we insert a
sentence about an excluded item, built from the spec's exclusions and a template.
"""

from __future__ import annotations

import json
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from soakspec.claims import ClaimBoundary, Coverage, lint
from soakspec.diagnostics import render_text

DATA = Path(__file__).parent / "data" / "claims"
_facts = json.loads((DATA / "dsv2lite-facts.json").read_text())
BOUNDARY = ClaimBoundary(tuple(_facts["boundary"]["claims"]), tuple(_facts["boundary"]["excludes"]))
COVERAGE = Coverage(**{k: tuple(v) if isinstance(v, list) else v for k, v in _facts["coverage"].items()})

HEADER = (
    "Summary\n\nAdds a retained HTTP soak runner.\n\n"
    "Claim Boundary\n\nThis is short-shape sustained HTTP soak evidence for the named backend/runtime contracts. "
    "It does not claim production readiness, default-runtime NCCL coverage, long/mixed-prompt soak stability, "
    "multi-node recovery, vLLM parity, or a hard latency/memory drift budget.\n\nNotes\n\n"
)

SAFE = [
    "The soak drove concurrency 4 and then 8.",
    "Each level ran for 120 s in 60 s buckets.",
    "Every bucket kept its own evidence.",
    "The gate fails on missing bucket coverage.",
    "Trace coverage was required in every bucket.",
    "Both backends used the same commit.",
    "The runner reuses the shared completions benchmark.",
    "Request failures and timeouts fail the gate.",
    "A clean follow-up request ran after the last bucket.",
    "Prompts were 64 words long.",
    "The host-staged path and the NCCL path were both exercised.",
    "Runtime boundaries were recorded per backend.",
    "Results are retained for review.",
    "The combined report re-hashes child artifacts.",
    "Greedy sampling was used with ignore-EOS.",
    "It ran on 2x RTX 5090.",
]

# Noun phrases for each exclusion: the spec's own words and derived synonyms.
NOUN_PHRASES = {
    "production readiness": ["production readiness", "production-readiness"],
    "default-runtime NCCL coverage": ["default-runtime NCCL coverage", "NCCL coverage for the default runtime"],
    "long/mixed-prompt soak stability": ["long/mixed-prompt soak stability", "long or mixed prompt stability"],
    "multi-node recovery": ["multi-node recovery", "multi node recovery"],
    "vLLM parity": ["vLLM parity", "parity with vLLM"],
    "a hard latency/memory drift budget": ["a hard latency/memory drift budget", "a latency drift budget"],
}
# Clauses that assert each exclusion (subject included).
ASSERTIONS = {
    "production readiness": ["the NCCL path is production-ready", "the server is ready for production"],
    "default-runtime NCCL coverage": ["the run covers the default NCCL runtime"],
    "long/mixed-prompt soak stability": ["the server is stable with long prompts", "mixed prompts are stable"],
    "multi-node recovery": ["the server survives multi-node failure", "the engine recovers across nodes"],
    "vLLM parity": ["throughput matches vLLM", "the engine is on par with vLLM", "latency is as fast as vLLM"],
    "a hard latency/memory drift budget": ["there is no latency drift", "memory drift stays within 5%"],
}

NEGATED_NP = [
    "It does not claim {np}.",
    "This PR makes no claim of {np}.",
    "We do not show {np}.",
    "Nothing here demonstrates {np}.",
    "This is not evidence of {np}.",
    "{NP} is not claimed.",
    "{NP} is out of scope.",
    "Without claiming {np}, the soak stays short.",
    "It does not claim production readiness, {np}, or vLLM parity.",
    "Neither {np} nor anything beyond short shapes is shown.",
]
NEGATED_CLAUSE = [
    "It does not claim that {clause}.",
    "We cannot say that {clause}.",
    "Nobody should read this as saying {clause}.",
]
HEDGED = [
    "A later run may show that {clause}.",
    "Future work could establish {np}.",
    "If a second host is added, it might show {np}.",
    'The issue asks whether "{clause}".',
    "Is it true that {clause}?",
]
POSITIVE_NP = [
    "This PR delivers {np}.",
    "These results demonstrate {np}.",
    "We show {np} for both backends.",
    "{NP} is demonstrated by this run.",
    "The evidence establishes {np}.",
]
POSITIVE_CLAUSE = [
    "{Clause}.",
    "With this change, {clause}.",
    "After the soak, {clause}.",
    "The gate passed and {clause}.",
]


def _cap(s: str) -> str:
    return s[:1].upper() + s[1:]


def _fill(template: str, np: str, clause: str) -> str:
    return template.format(np=np, NP=_cap(np), clause=clause, Clause=_cap(clause))


paragraphs = st.lists(
    st.tuples(st.booleans(), st.lists(st.sampled_from(SAFE), min_size=1, max_size=4)), min_size=1, max_size=4
)


@st.composite
def documents_with(draw, templates):
    """(document text, 1-based line of the inserted sentence)."""
    exclusion = draw(st.sampled_from(BOUNDARY.excludes))
    np = draw(st.sampled_from(NOUN_PHRASES[exclusion]))
    clause = draw(st.sampled_from(ASSERTIONS[exclusion]))
    sentence = _fill(draw(st.sampled_from(templates)), np, clause)
    paras = draw(paragraphs)
    which = draw(st.integers(0, len(paras) - 1))
    bullets, sents = paras[which]
    pos = draw(st.integers(0, len(sents)))
    sents = sents[:pos] + [sentence] + sents[pos:]
    paras = paras[:which] + [(bullets, sents)] + paras[which + 1 :]
    blocks = []
    for is_list, ss in paras:
        blocks.append("\n".join("- " + s for s in ss) if is_list else " ".join(ss))
    text = HEADER + "\n\n".join(blocks) + "\n"
    line = next(i for i, ln in enumerate(text.splitlines(), 1) if sentence in ln)
    return text, line


def _lint(text: str):
    return lint(text, "doc.md", BOUNDARY, COVERAGE)


def test_generated_documents_are_clean_without_an_insertion():
    """The safe fragments and the boundary section alone produce no finding."""
    text = HEADER + " ".join(SAFE) + "\n\n" + "\n".join("- " + s for s in SAFE) + "\n"
    assert _lint(text) == []


@settings(max_examples=200, deadline=None)
@given(documents_with(NEGATED_NP + NEGATED_CLAUSE))
def test_negation_cue_before_an_excluded_phrase_never_creates_a_finding(case):
    """Inserting a negation cue before an excluded phrase, anywhere, never creates a finding."""
    text, _ = case
    diags = _lint(text)
    assert diags == [], render_text(diags, {"doc.md": text})


@settings(max_examples=100, deadline=None)
@given(documents_with(HEDGED))
def test_hedged_or_quoted_or_asked_never_creates_a_finding(case):
    """Hedges, quotations and questions about an excluded item are not assertions."""
    text, _ = case
    diags = _lint(text)
    assert diags == [], render_text(diags, {"doc.md": text})


@settings(max_examples=200, deadline=None)
@given(documents_with(POSITIVE_NP + POSITIVE_CLAUSE))
def test_positive_assertion_of_an_excluded_phrase_always_creates_CB101_on_its_line(case):
    """Inserting a positive assertion of an excluded phrase into any paragraph always gives a
    CB101 on the inserted line, and no finding anywhere else."""
    text, line = case
    diags = _lint(text)
    assert diags, text
    assert {d.code for d in diags} == {"CB101"}, render_text(diags, {"doc.md": text})
    assert {d.span.line for d in diags} == {line}
