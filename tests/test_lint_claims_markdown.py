"""lint-claims on Markdown as reviewers write it: BOM, HTML comments, setext headings, front
matter, link targets -- none of them may change what the document asserts or where its
claim-boundary section is."""

from __future__ import annotations

from pathlib import Path

from soakspec import cli
from soakspec.claims import ClaimBoundary, Coverage, lint
from soakspec.diagnostics import render_text

DSV2 = str(Path(__file__).resolve().parent.parent / "specs" / "dsv2lite.soak")
EXCLUDES = (
    "production readiness", "default-runtime NCCL coverage", "long/mixed-prompt soak stability",
    "multi-node recovery", "vLLM parity", "a hard latency/memory drift budget",
)
BOUNDARY = ClaimBoundary(("short-shape sustained HTTP soak evidence for the named backend/runtime contracts",), EXCLUDES)
COVERAGE = Coverage(
    concurrency_levels=(4, 8), duration_s=120.0, total_duration_s=240.0, prompt_words=(64,), max_tokens=(64,),
    backends=("host-staged", "nccl"), hardware=("2x RTX 5090",), model_ids=("deepseek-ai/DeepSeek-V2-Lite",),
)
STATEMENT = (
    "This is short-shape sustained HTTP soak evidence for the named backend/runtime contracts. It does not claim "
    "production readiness, default-runtime NCCL coverage, long/mixed-prompt soak stability, multi-node recovery, "
    "vLLM parity, or a hard latency/memory drift budget."
)
SECTION = f"Claim Boundary\n\n{STATEMENT}\n"


def run(text: str):
    return lint(text, "PR.md", BOUNDARY, COVERAGE)


def codes(diags) -> list[str]:
    return [d.code for d in diags]


def test_utf8_bom_does_not_hide_the_claim_boundary_line(tmp_path, capsys):
    """A document saved with a byte-order mark (Windows editors) has its section on line 1."""
    doc = tmp_path / "PR.md"
    doc.write_bytes(b"\xef\xbb\xbf" + SECTION.encode())
    assert cli.main(["lint-claims", str(doc), "--spec", DSV2]) == 0, capsys.readouterr().out
    assert run("\ufeff" + SECTION) == []


def test_html_comment_is_not_prose():
    diags = run(SECTION + "\n<!-- This is production-ready. -->\n\n<!--\nThe NCCL path matches vLLM.\n-->\n")
    assert diags == [], render_text(diags)


def test_commented_out_claim_boundary_is_no_section():
    """A PR template's boundary left inside <!-- --> is not shown to a reviewer: CB001."""
    diags = run(f"# PR\n\n<!--\n\n{SECTION}\n-->\n\nIt runs.\n")
    assert codes(diags) == ["CB001"], render_text(diags)


def test_comment_markers_in_fenced_code_stay_code():
    text = SECTION + "\n```html\n<!-- a\n```\n\nIt is production-ready.\n"
    diags = run(text)
    assert codes(diags) == ["CB101"] and diags[0].span.line == 9, render_text(diags)


def test_setext_heading_of_a_negated_section_negates_its_list():
    diags = run(SECTION + "\nNon-goals\n---------\n\n- Production readiness.\n- vLLM parity.\n")
    assert diags == [], render_text(diags)


def test_setext_heading_ends_the_claim_boundary_section():
    """As with '## Notes': exclusions stated under a later heading are not in the section."""
    text = "# PR\n\nClaim Boundary\n==============\n\nThis is soak evidence.\n\nNotes\n=====\n\n" + STATEMENT + "\n"
    atx = text.replace("Claim Boundary\n==============", "# Claim Boundary").replace("Notes\n=====", "# Notes")
    assert codes(run(text)) == ["CB002"] * 6 == codes(run(atx))
    assert run(text)[0].span.line == 3


def test_setext_heading_underline_is_not_a_table():
    diags = run(SECTION + "\nResults\n-------\n\nIt is production-ready.\n")
    assert codes(diags) == ["CB101"] and diags[0].span.line == 8, render_text(diags)


def test_front_matter_is_metadata():
    text = "---\ntitle: NCCL soak\nlabels: [soak, vllm-parity, production-readiness]\n---\n\n" + SECTION
    diags = run(text)
    assert diags == [], render_text(diags)


def test_link_targets_and_definitions_are_not_prose():
    text = (
        SECTION + "\nTracking: https://github.com/x/y/issues/vllm-parity\n\n"
        "See [the tracking issue](https://example.com/production-ready).\n\n"
        "[production-ready]: https://example.com/prod\n"
    )
    diags = run(text)
    assert diags == [], render_text(diags)
