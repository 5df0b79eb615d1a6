"""soakspec.claims.lint: the seed PR, its failing variants, and the matching rules one by one."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from soakspec.claims import ClaimBoundary, Coverage, EvidenceFacts, lint
from soakspec.claims.document import BlockKind, parse_document
from soakspec.claims.phrases import compile_exclusion, normalise, stem
from soakspec.claims.polarity import Polarity, polarity
from soakspec.diagnostics import Severity, render_text

DATA = Path(__file__).parent / "data" / "claims"
SHARED_PR = Path(__file__).resolve().parent / ".." / ".." / "shared" / "reference" / "dsv2lite-http-soak-pr.txt"

_facts = json.loads((DATA / "dsv2lite-facts.json").read_text())
BOUNDARY = ClaimBoundary(tuple(_facts["boundary"]["claims"]), tuple(_facts["boundary"]["excludes"]))
COVERAGE = Coverage(**{k: tuple(v) if isinstance(v, list) else v for k, v in _facts["coverage"].items()})

COMMIT = "a5703d0424d917ce99b4bd8691b0b86eecde966f"
REVISION = "604d5664dddd88a0433dbae533b7fe9472482de0"
HOST_SHA = "3fe4f163024602a51f10cac0c15cc24a5feffd92bbcb93091e175cd63e49bd33"
NCCL_SHA = "52c2a70d895fc0c080233961ea06824097fbf5b7241a0983e41c0ca6646e762f"
COMBINED_SHA = "1c06e8825da70888277f1485f54d7f4fb9b2f61d617149d3ac7357cd5a03e7f1"
SPEC_SHA = "5a1c0c3e0f1d4b7a8e2f6c9d0b1a2e3f4c5d6e7f8091a2b3c4d5e6f708192a3b"
NCCL_RUNTIME = "NCCL 2.26.2, NCCL_IB_DISABLE=1, NCCL_P2P_DISABLE=1"


def evidence(spec_sha: str = SPEC_SHA) -> tuple[EvidenceFacts, ...]:
    """The retained run, from the numbers in the PR."""
    common = dict(
        failed=0, timeouts=0, buckets=4, concurrency_levels=(4, 8), duration_s=120.0,
        commit=COMMIT, model_revision=REVISION, spec_sha256=spec_sha, gate="passed",
        artifact_sha256={"combined/report.json": COMBINED_SHA},
    )
    return (
        EvidenceFacts("host-staged", completed=112, batches=14, runtime_boundary="host-staged", report_sha256=HOST_SHA, **common),
        EvidenceFacts("nccl", completed=128, batches=16, runtime_boundary=NCCL_RUNTIME, report_sha256=NCCL_SHA, **common),
    )


def pr_body() -> str:
    return (DATA / "dsv2lite-pr-body.md").read_text(encoding="utf-8")


def line_of(text: str, needle: str) -> int:
    for i, line in enumerate(text.splitlines(), start=1):
        if needle in line:
            return i
    raise AssertionError(f"{needle!r} not in text")


def col_of(text: str, needle: str, after: str | None = None) -> int:
    line = text.splitlines()[line_of(text, after or needle) - 1]
    return line.index(needle) + 1


def run(text: str, ev: tuple[EvidenceFacts, ...] = (), current: str | None = None, coverage: Coverage = COVERAGE):
    return lint(text, "PR.md", BOUNDARY, coverage, ev, current)


def codes(diags) -> list[str]:
    return [d.code for d in diags]


# ---------------------------------------------------------------- the seed PR

def test_seed_pr_body_is_clean_with_and_without_evidence():
    text = pr_body()
    assert run(text) == []
    assert run(text, evidence(), SPEC_SHA) == []


@pytest.mark.skipif(not SHARED_PR.is_file(), reason="shared/reference is not beside the clone")
def test_full_seed_pr_text_passes_checks_1_2_and_4():
    text = SHARED_PR.read_text(encoding="utf-8")
    assert run(text) == []
    # the test-data copy is the PR body of the shared file
    assert text.startswith(pr_body().rstrip("\n"))


@pytest.mark.parametrize("exclusion", BOUNDARY.excludes)
def test_removing_an_exclusion_from_the_boundary_section_is_CB002(exclusion):
    text = pr_body()
    sentence = text.splitlines()[line_of(text, "It does not claim") - 1]
    items = [e for e in BOUNDARY.excludes if e != exclusion]
    new = "This is short-shape sustained HTTP soak evidence for the named backend/runtime contracts. It does not claim " + ", ".join(items[:-1]) + ", or " + items[-1] + "."
    text = text.replace(sentence, new)
    diags = run(text)
    assert codes(diags) == ["CB002"]
    d = diags[0]
    assert exclusion in d.message
    assert (d.span.line, d.span.column) == (line_of(text, "Claim Boundary"), 1) == (32, 1)


def test_missing_boundary_section_is_CB001_on_line_1():
    text = pr_body().replace("Claim Boundary", "Scope")
    diags = run(text)
    assert codes(diags) == ["CB001"]
    assert diags[0].span.line == 1
    for e in BOUNDARY.excludes:
        assert e in diags[0].message


def test_production_ready_added_is_CB101_at_the_phrase():
    text = pr_body().replace(
        "and runtime-boundary retention.",
        "and runtime-boundary retention.\n\nThis makes the NCCL path production-ready.",
    )
    diags = run(text)
    assert codes(diags) == ["CB101"]
    d = diags[0]
    assert d.span.line == line_of(text, "This makes the NCCL path") == 32
    assert d.span.column == col_of(text, "production-ready", after="This makes the NCCL path")
    assert '"production readiness"' in d.message
    rendered = render_text(diags, {"PR.md": text})
    assert "PR.md:32:26: CB101" in rendered and "^~~~~~~~~~~~~~~" in rendered


def test_soak_stable_for_24_hours_is_CB301():
    text = pr_body().replace(
        "and runtime-boundary retention.",
        "and runtime-boundary retention. The NCCL path is soak-stable for 24 hours.",
    )
    diags = run(text)
    assert codes(diags) == ["CB301"]
    d = diags[0]
    assert d.span.line == 30
    assert d.span.column == col_of(text, "for 24 hours")
    assert "24h" in d.message and "2m per level" in d.message and "4m in total" in d.message


def test_changed_sha_is_CB201_naming_stated_and_recorded():
    bad = "3fe4f163024602a51f10cac0c15cc24a5feffd92bbcb93091e175cd63e49bd34"
    text = pr_body().replace(HOST_SHA, bad)
    diags = run(text, evidence(), SPEC_SHA)
    assert codes(diags) == ["CB201"]
    d = diags[0]
    assert (d.span.line, d.span.column) == (26, col_of(text, bad))
    assert bad in d.message and HOST_SHA in d.message and "host-staged" in d.message


def test_changed_completed_count_is_CB201():
    text = pr_body().replace("host-staged\thost-staged\t112\t", "host-staged\thost-staged\t113\t")
    diags = run(text, evidence())
    assert codes(diags) == ["CB201"]
    d = diags[0]
    assert (d.span.line, d.span.column) == (26, col_of(text, "113"))
    assert "completed 113" in d.message and "112" in d.message


@pytest.mark.parametrize(
    "old, new, stated, recorded",
    [
        ("4 / 16", "4 / 15", "leafs 15", "16"),
        ("128\t0 / 0", "128\t0 / 2", "timeouts 2", "0"),
        ("• commit: a5703d04", "• commit: b5703d04", "commit b5703d04", COMMIT),
        ("model revision: 604d5664", "model revision: 704d5664", "model revision 704d5664", REVISION),
        ("concurrency 4,8,", "concurrency 4,16,", "concurrency levels 4,16", "4,8"),
        ("duration_s=120", "duration_s=300", "duration_s 300", "120"),
        ("NCCL\tNCCL 2.26.2", "NCCL\tNCCL 2.27.1", "runtime boundary NCCL 2.27.1", NCCL_RUNTIME),
        ("4 / 14\tpassed", "4 / 14\tfailed", "gate failed", "passed"),
    ],
)
def test_other_evidence_mismatches_are_CB201(old, new, stated, recorded):
    text = pr_body()
    assert old in text
    text = text.replace(old, new, 1)
    diags = [d for d in run(text, evidence()) if d.code == "CB201"]
    assert len(diags) == 1, render_text(diags)
    assert stated in diags[0].message and recorded in diags[0].message
    assert diags[0].span.line == line_of(text, new)


def test_a_commit_or_revision_cited_where_the_evidence_records_none_is_CB202():
    """README: CB202 is a commit or revision "absent in the evidence". A run whose commit (or model
    revision) was not recorded ("commit: not recorded") supports no claim of a specific one."""
    text = pr_body()
    unrecorded = tuple(dataclasses.replace(ev, commit=None, model_revision=None) for ev in evidence())
    diags = run(text, unrecorded)
    shown = [f"{d.span.line}:{d.span.column}: {d.code} {d.message}" for d in diags]
    assert shown == [
        f"17:11: CB202 commit {COMMIT} appears nowhere in the evidence (it records no commit for host-staged, nccl)",
        f"18:19: CB202 model revision {REVISION} appears nowhere in the evidence "
        "(it records no model revision for host-staged, nccl)",
    ]
    # a commit some backend records is compared with it, not reported absent
    one = (unrecorded[0], dataclasses.replace(unrecorded[1], commit=COMMIT, model_revision=REVISION))
    assert run(text, one) == []


def test_unknown_sha_is_CB202_and_matching_evidence_is_quiet():
    stray = "ab" * 32
    text = pr_body() + f"\nThe model fingerprint is {stray}.\n"
    diags = run(text, evidence())
    assert codes(diags) == ["CB202"]
    assert stray in diags[0].message
    # a hash the evidence records anywhere is fine
    ev = tuple(dataclasses.replace(e, artifact_sha256={"model/fingerprint": stray, "combined/report.json": COMBINED_SHA}) for e in evidence())
    assert run(text, ev) == []


def test_stale_evidence_is_CB401_at_the_evidence_mention():
    diags = run(pr_body(), evidence(spec_sha="0" * 64), current=SPEC_SHA)
    assert codes(diags) == ["CB401", "CB401"]
    lines = sorted(d.span.line for d in diags)
    assert lines == [26, 27]  # each backend's report hash in the results table
    assert "0" * 64 in diags[0].message and SPEC_SHA in diags[0].message


def test_stale_evidence_without_a_mention_is_on_line_1():
    ev = (EvidenceFacts("x", spec_sha256="1" * 64),)
    diags = run("# Title\n\nClaim boundary: It does not claim anything else.\n", ev, current=SPEC_SHA)
    assert [(d.code, d.span.line) for d in diags if d.code == "CB401"] == [("CB401", 1)]


def test_sum_over_backends_and_prose_counts():
    ev = evidence()
    text = pr_body() + "\nAcross both backends 240 requests completed with 0 failures and no timeouts.\n"
    text += "The NCCL backend completed 128 requests in 16 leaves.\n"
    assert run(text, ev) == []
    bad = pr_body() + "\nThe NCCL backend completed 127 requests.\n"
    diags = run(bad, ev)
    assert codes(diags) == ["CB201"] and "for nccl" in diags[0].message


# ---------------------------------------------------------------- normalisation

@pytest.mark.parametrize(
    "a, b",
    [("readiness", "ready"), ("recovery", "recovers"), ("stability", "stable"), ("coverage", "covered"), ("failures", "fail"), ("prompts", "prompt")],
)
def test_stem_equates_inflections(a, b):
    assert stem(a) == stem(b)


@pytest.mark.parametrize(
    "a, b",
    [
        ("long/mixed-prompt soak stability", "long or mixed prompt stability"),
        ("production readiness", "Production-Ready"),
        ("multi-node recovery", "multi node recovers"),
        ("a hard latency/memory drift budget", "latency or memory drift budget"),
    ],
)
def test_exclusion_slots_match_wording_variants(a, b):
    ex = compile_exclusion(a)
    from soakspec.claims.phrases import tokens, windows

    toks = tokens(b)
    assert next(windows(toks, ex.slots, len(ex.slots) + 3, ex.stated_needed), None) is not None


def test_normalise_drops_articles_and_qualifiers():
    assert normalise("a hard latency/memory drift budget") == "latency memory drift budget"
    assert normalise("The Production-Readiness") == "production ready"


@pytest.mark.parametrize(
    "section",
    [
        "## Claim boundary\n\nShows: short-shape soak evidence.\n\nIt does not claim:\n- production readiness\n- NCCL coverage for the default runtime\n- long or mixed prompt stability\n- recovery across multiple nodes (multi-node)\n- parity with vLLM\n- a hard latency or memory drift budget\n",
        "**Claim boundary:** short-shape soak evidence only. Not claimed: production-readiness, default runtime NCCL coverage, long-prompt or mixed-prompt stability, multi node recovery, vLLM parity, latency/memory drift budgets.\n",
        "Claim boundary: see below.\n\nNon-goals: `production readiness`; `default-runtime NCCL coverage`; `long/mixed-prompt soak stability`; `multi-node recovery`; `vLLM parity`; `a hard latency/memory drift budget`.\n",
    ],
)
def test_boundary_section_forms_and_wording_variants(section):
    text = "# PR\n\nSummary text.\n\n" + section + "\n## Validation\n\npytest passed.\n"
    assert run(text) == []


def test_boundary_section_ends_at_the_next_heading():
    text = (
        "## Claim boundary\n\nShort-shape evidence.\n\n## Notes\n\n"
        "It does not claim production readiness, default-runtime NCCL coverage, long/mixed-prompt soak stability, "
        "multi-node recovery, vLLM parity, or a hard latency/memory drift budget.\n"
    )
    assert codes(run(text)) == ["CB002"] * 6


def test_document_model_blocks_and_masking():
    doc = parse_document('Title\n\nSays "production-ready" here. And `x`.\n\n> quoted\n\n```\ncode\n```\n- item\n')
    kinds = [b.kind for b in doc.blocks]
    assert kinds == [BlockKind.TITLE, BlockKind.PARAGRAPH, BlockKind.QUOTE, BlockKind.CODE, BlockKind.LIST_ITEM]
    assert "production-ready" not in doc.masked and len(doc.masked) == len(doc.text)
    assert [doc.sentence_text(s, masked=False) for s in doc.sentences[1:3]] == ['Says "production-ready" here.', "And `x`."]


# ---------------------------------------------------------------- check 2: what asserts

BOUNDARY_SECTION = (
    "Claim boundary\n\nIt does not claim production readiness, default-runtime NCCL coverage, "
    "long/mixed-prompt soak stability, multi-node recovery, vLLM parity, or a hard latency/memory drift budget.\n\n"
)

ASSERTING = [
    "This makes the NCCL path production-ready.",
    "The NCCL path is ready for production.",
    "The server is production-grade.",
    "It matches vLLM.",
    "Throughput is on par with vLLM.",
    "The engine is as fast as vLLM.",
    "The results are comparable to vLLM.",
    "We show vLLM parity.",
    "The server survives multi-node failure.",
    "It recovers across nodes.",
    "The deployment has multi-node recovery.",
    "There is no drift.",
    "Latency drift stays within 5%.",
    "Memory stays flat over the run.",
    "The run is stable with long prompts.",
    "Long and mixed prompts are stable.",
    "It covers the default NCCL runtime.",
    "It is not slow and is production-ready.",
    "With no failures, the NCCL path is production-ready.",
    "It has no failures and no drift.",
    "It does not claim vLLM parity; this makes the NCCL path production-ready.",
    "It does not claim vLLM parity, but it is production-ready.",
    "The run had zero failures and proves vLLM parity.",
    "- The NCCL path is production-ready",
]

NOT_ASSERTING = [
    "It does not claim production readiness.",
    "There is no vLLM parity claim.",
    "The path is not production ready.",
    "Production is not ready.",
    "Without claiming multi-node recovery, the run is short.",
    "It does not claim production readiness, vLLM parity, or multi-node recovery.",
    "It doesn't make the path production-ready or show vLLM parity.",
    "We make no claim of multi-node recovery or vLLM parity.",
    "It does not claim that the NCCL path is production-ready.",
    "We do not claim there is no drift.",
    "Not claimed: vLLM parity.",
    "Production readiness is not claimed.",
    "vLLM parity is out of scope.",
    "Neither production readiness nor vLLM parity is shown.",
    "It may be production-ready.",
    "This might match vLLM one day.",
    "Production readiness is future work.",
    "Multi-node recovery would need a second host.",
    "If we add a second host, we could test multi-node recovery.",
    'The PR says "production-ready" in a quote.',
    "Run `matches vLLM` as a literal.",
    "> This makes it production-ready.",
    "```\nThis makes it production-ready.\n```",
    "Is this production-ready?",
    "It does not claim:\n\n- production readiness\n- vLLM parity",
    "## Non-goals\n\n- production readiness\n- multi-node recovery",
    "The production team reviewed the change.",
    "Production readiness — not claimed.",
    "- vLLM parity -- not claimed",
    "- Multi-node recovery – out of scope.",
]


@pytest.mark.parametrize("sentence", ASSERTING)
def test_asserting_sentences_are_CB101(sentence):
    text = BOUNDARY_SECTION + sentence + "\n"
    diags = run(text)
    assert codes(diags) == ["CB101"], render_text(diags)
    assert diags[0].span.line == 5


@pytest.mark.parametrize("sentence", NOT_ASSERTING)
def test_negated_hedged_quoted_sentences_are_quiet(sentence):
    diags = run(BOUNDARY_SECTION + sentence + "\n")
    assert diags == [], render_text(diags)


@pytest.mark.parametrize(
    "sentence, start, expected",
    [
        ("It is production-ready.", 6, Polarity.ASSERTED),
        ("It is not production-ready.", 10, Polarity.NEGATED),
        ("It might be production-ready.", 12, Polarity.HEDGED),
        ("Is it production-ready?", 6, Polarity.QUESTION),
        ("It is not slow and is production-ready.", 22, Polarity.ASSERTED),
    ],
)
def test_polarity_unit(sentence, start, expected):
    assert polarity(sentence, start, start + len("production-ready")) is expected


# ---------------------------------------------------------------- check 4: scope

SCOPE_CREEP = [
    ("It is soak-stable for 24 hours.", "for 24 hours"),
    ("A 24-hour soak passed.", "24-hour soak"),
    ("The soak ran for 10 minutes.", "for 10 minutes"),
    ("The soak lasted 3 hours.", "lasted 3 hours"),
    ("Each run spanned 2 days.", "spanned 2 days"),
    ("It ran overnight.", "overnight"),
    ("The NCCL path is stable at concurrency 64.", "64"),
    ("It handles 32 concurrent requests.", "32"),
    ("It was tested at 100 rps.", "100"),
    ("Results hold on H100.", "H100"),
    ("Results hold on 8x RTX 5090.", "8x RTX 5090"),
    ("Tested with 8 GPUs.", "8 GPUs"),
    ("Tested on SGLang.", "SGLang"),
    ("It handles 4096-token prompts.", "4096-token prompts"),
    ("It handles long-context requests.", "long-context"),
    ("prompt_words=128 was used.", "128"),
    ("It generated 512 output tokens per request.", "512"),
    ("Mixed prompts work.", "Mixed prompts"),
    ("No failures at concurrency 64.", "64"),  # the outcome is negated, the level asserted
    ("Zero errors at 32 concurrent streams.", "32"),
    ("It ran without errors at concurrency 64.", "64"),
    ("No timeouts during a 24-hour soak.", "24-hour soak"),
    ("No errors on vLLM.", "vLLM"),
    ("Never failed on 8x RTX 5090.", "8x RTX 5090"),
    ("The NCCL path ran NCCL 2.27.", "2.27"),  # the runtime boundary says NCCL 2.26.2
    ("Verified on Llama-3-70B.", "Llama-3-70B"),  # another model
    ("The results hold for DeepSeek-V3 as well.", "DeepSeek-V3"),
    ("This also validates Qwen2.5-7B-Instruct.", "Qwen2.5-7B-Instruct"),
]

IN_SCOPE = [
    "The soak ran for 2 minutes per level.",
    "Each level ran for 120 s, 240 s in total.",
    "Each level lasted 2 minutes.",
    "The NCCL path ran NCCL 2.26.2 (NCCL 2.26).",
    "It does not claim NCCL 2.27 coverage.",
    "CI flaked over the last 3 days.",
    "Concurrency levels 4 and 8 passed.",
    "Results hold on 2x RTX 5090.",
    "It ran on the host-staged and NCCL backends.",
    "We did not test concurrency 64.",
    "A 24-hour soak would be needed for that.",
    "No long prompts were tested.",
    "It does not cover H100.",
    "Short prompts of 64 words were used.",
    "Soaked deepseek-ai/DeepSeek-V2-Lite on both backends.",  # the spec's model
    "It does not claim results for Llama-3-70B.",
    "A Llama-3 gate follows in #500.",
    "No errors at concurrency 8.",
    "It does not claim zero errors at concurrency 64.",
    "Prompts were sampled like GPT-4 prompts.",
]


@pytest.mark.parametrize("sentence, phrase", SCOPE_CREEP)
def test_scope_creep_is_CB301_at_the_phrase(sentence, phrase):
    text = BOUNDARY_SECTION + sentence + "\n"
    diags = run(text)
    assert codes(diags) == ["CB301"], render_text(diags)
    assert (diags[0].span.line, diags[0].span.column) == (5, sentence.index(phrase) + 1)


@pytest.mark.parametrize("sentence", IN_SCOPE)
def test_covered_or_negated_scope_is_quiet(sentence):
    diags = run(BOUNDARY_SECTION + sentence + "\n")
    assert diags == [], render_text(diags)


def test_unknown_hardware_is_a_warning():
    cov = dataclasses.replace(COVERAGE, hardware=())
    diags = run(BOUNDARY_SECTION + "Results hold on H100.\n", coverage=cov)
    assert [(d.code, d.severity) for d in diags] == [("CB301", Severity.WARNING)]
    # hardware recorded by the evidence fills in an unknown spec
    ev = (EvidenceFacts("nccl", hardware=("2x NVIDIA GeForce RTX 5090",)),)
    assert run(BOUNDARY_SECTION + "Results hold on 2x RTX 5090.\n", ev, coverage=cov) == []


def test_excluded_and_scope_on_the_same_phrase_report_once():
    diags = run(BOUNDARY_SECTION + "The run is stable with long prompts.\n")
    assert codes(diags) == ["CB101"]


def test_one_overclaim_is_one_finding():
    """Two patterns reading the same words ("32k-token prompts" and "32k-token"; "for 24 hours" and "24
    hours of sustained load") are one CB301; a sustain claim above a sweep's range is reported by the
    sustain rule alone (its message says more than "did not cover")."""
    def shown(diags):
        return [f"{d.span.line}:{d.span.column}: {d.code} {d.message}" for d in diags]

    text = BOUNDARY_SECTION + "Tested with 32k-token prompts.\nIt ran for 3 hours of sustained load.\n"
    assert shown(run(text)) == [
        "5:13: CB301 claims 32000-token prompts; the workload used prompt_words = 64",
        '6:8: CB301 claims a duration of 3h ("for 3 hours"); the workload covered 2m per level, 4m in total',
    ]
    sweep = dataclasses.replace(COVERAGE, concurrency_levels=tuple(range(1, 17)), sweep_axis="concurrency", sweep_high=16)
    text = BOUNDARY_SECTION + "The NCCL path sustains concurrency 32.\nIt sustains 64 concurrent requests.\nMax sustainable concurrency = 20.\n"
    assert shown(run(text, coverage=sweep)) == [
        "5:36: CB301 claims it sustains concurrency 32, above the highest level the sweep searches (concurrency 16)",
        "6:13: CB301 claims it sustains concurrency 64, above the highest level the sweep searches (concurrency 16)",
        "7:31: CB301 claims it sustains concurrency 20, above the highest level the sweep searches (concurrency 16)",
    ]


def test_durations_compare_with_the_larger_of_level_and_total():
    assert run(BOUNDARY_SECTION + "The soak ran for 4 minutes.\n") == []
    assert codes(run(BOUNDARY_SECTION + "The soak ran for 5 minutes.\n")) == ["CB301"]


def test_no_boundary_in_spec_means_no_boundary_checks():
    assert lint("Anything goes.\n", "d.md", ClaimBoundary(), COVERAGE) == []


def test_markdown_pr_with_table_bold_introducer_and_next_steps_is_clean():
    """A Markdown rendering of the same PR: pipe table, bullets under "**Does not claim:**",
    forward-looking claims under "## Next steps"."""
    text = (DATA / "dsv2lite-markdown-pr.md").read_text(encoding="utf-8")
    assert run(text, evidence(), SPEC_SHA) == []
    broken = text.replace("| NCCL | 128 |", "| NCCL | 129 |").replace("**Does not claim:**", "**Also shows:**")
    diags = run(broken, evidence())
    assert codes(diags) == ["CB201"] + ["CB101"] * 6
    assert diags[0].span.line == line_of(broken, "| NCCL | 129 |")


def test_sections_that_never_assert():
    text = BOUNDARY_SECTION + "## Next steps\n\nA 24-hour soak will make the path production-ready.\n\n## Results\n\nThe path is production-ready.\n"
    diags = run(text)
    assert [(d.code, d.span.line) for d in diags] == [("CB101", line_of(text, "The path is production-ready"))]


@pytest.mark.parametrize(
    "sentence",
    ["Concurrency 4 and 8, 120 s per level.", "It ran at concurrency 4,8 with duration_s=120.", "Concurrency levels 4, 8 and 4 again."],
)
def test_concurrency_lists_stop_before_durations(sentence):
    assert run(BOUNDARY_SECTION + sentence + "\n") == []


def test_plain_boundary_line_with_bold_labels():
    text = (
        "**Claim boundary:** short-shape soak evidence only.\n\n**Does not claim:**\n\n"
        + "".join(f"- {e}\n" for e in BOUNDARY.excludes)
        + "\n**Validation:** pytest passed.\n"
    )
    assert run(text) == []
    after = text.replace("- production readiness\n", "") + "\nIt does not claim production readiness.\n"
    assert codes(run(after)) == ["CB002"]  # stated, but after "**Validation:**" ended the section


def test_results_row_for_a_backend_that_was_not_run_is_CB301():
    """A PR table that adds a backend the evidence never ran ('tp4 ... passed') is not clean;
    a row summing the backends ('combined', 'host-staged + NCCL') stays the SHA rule's."""
    table = (
        "| Backend | Completed | Failed/timeouts | Gate |\n|---|---|---|---|\n"
        "| host-staged | 112 | 0 / 0 | passed |\n| NCCL | 128 | 0 / 0 | passed |\n"
        "| host-staged + NCCL | 240 | 0 / 0 | passed |\n| combined | - | - | passed |\n"
    )
    assert run(BOUNDARY_SECTION + table, evidence()) == []
    text = BOUNDARY_SECTION + table + "| nccl-tp4 | 128 | 0 / 0 | passed |\n"
    diags = run(text, evidence())
    assert codes(diags) == ["CB301"], render_text(diags)
    assert (diags[0].span.line, diags[0].span.column) == (11, 3)
    assert '"nccl-tp4"' in diags[0].message and "host-staged, nccl" in diags[0].message


@pytest.mark.parametrize(
    ("sentence", "said"),
    [
        ("The gate passed.", "states gate passed;"),
        ("Verdict: **PASS**.", "states gate PASS;"),
        ("All 15 required rules hold.", "states gate passed ('hold');"),
        ("All of the required rules passed, so the soak is green.", "states gate passed;"),
    ],
)
def test_a_verdict_stated_in_prose_is_checked_against_the_evidence(sentence, said):
    """'The gate passed.' over a run whose gate failed is the one claim a review must not let
    through; only 'gate: passed' was read."""
    failed = tuple(dataclasses.replace(ev, gate="failed") for ev in evidence())
    diags = run(f"# PR\n\n{sentence}\n\n" + pr_body().split("\n", 1)[1], failed, SPEC_SHA)
    mine = [d for d in diags if d.code == "CB201" and d.span.line == 3]
    assert len(mine) == 1 and said in mine[0].message and "failed" in mine[0].message
    assert run(f"# PR\n\n{sentence}\n\n" + pr_body().split("\n", 1)[1], evidence(), SPEC_SHA) == []


def test_a_negated_verdict_in_prose_is_not_a_claim_that_it_passed():
    failed = tuple(dataclasses.replace(ev, gate="failed") for ev in evidence())
    for sentence in ("The gate did not pass.", "The gate has not passed yet.", "Not all required rules held."):
        diags = run(f"# PR\n\n{sentence}\n\n" + pr_body().split("\n", 1)[1], failed, SPEC_SHA)
        assert not [d for d in diags if d.span.line == 3], (sentence, diags)
