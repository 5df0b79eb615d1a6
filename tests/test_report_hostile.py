"""Reports of evidence whose text is hostile: every format stays valid and shows the text as
it is, whatever the server, the spec or the evidence directory's path carries (backticks,
markup, pipes, control characters). Fast: synthetic evidence (`soakspec.judge.testing`),
except where a test says it runs a server."""

from __future__ import annotations

import re

from markdown_it import MarkdownIt

from soakspec.judge.testing import EvidenceBuilder, small_spec, spec_from_text
from soakspec.report import prepare

TICK_NAME = "x`<img src=x onerror=alert(1)>`y"


def _md_html(md: str) -> str:
    return MarkdownIt("commonmark").enable("table").render(md)


def _code_spans(md: str) -> list[str]:
    """The text of every inline code span markdown-it finds in `md`."""
    out = []
    for tok in MarkdownIt("commonmark").enable("table").parse(md):
        for child in tok.children or ():
            if child.type == "code_inline":
                out.append(child.content)
    return out


def test_a_backend_name_with_backticks_stays_code_in_the_server_metrics_section():
    spec = spec_from_text(small_spec(backends=(TICK_NAME, "b")).canonical_text)
    md = prepare(spec, EvidenceBuilder(spec).build()).render("md")
    section = md[md.index("### Server metrics and CPU"):md.index("### Rules that did not pass")]
    assert "server CPU" in section and "scrapes of /metrics" in section
    html = _md_html(section)
    assert "<img" not in html, html
    assert sum(1 for s in _code_spans(section) if s == TICK_NAME) == 2, section


def test_a_pipe_outside_a_table_is_shown_as_it_is():
    """`\\|` keeps a code span in a table cell; in a list item it would show the backslash."""
    text = small_spec(backends=("a|b", "c")).canonical_text.replace('workload "w"', 'workload "w|1"')
    text = text.replace("}\n\ngate {", "}\n\n" + text[text.index('workload "w|1"'):text.index("\ngate {")].replace("w|1", "w2") + "\ngate {")
    spec = spec_from_text(text)
    md = prepare(spec, EvidenceBuilder(spec).build()).render("md")
    items = [line for line in md.splitlines() if line.startswith(("- ", "  - "))]
    spans = _code_spans("\n".join(items))
    assert "w|1" in spans and "a|b" in spans, items
    assert not any("\\|" in s for s in spans), spans
    assert "<td><code>a|b</code></td>" in _md_html(md)  # in a table: escaped, and shown without the backslash


# ------------------------------------------------------------------------------ compare

EVIL_DIR = "x`<img src=x onerror=alert(1)>`|y"


def _compare(tmp_path, capsys, fmt: str) -> str:
    from soakspec.cli import main

    spec = small_spec()
    base = EvidenceBuilder(spec, run_id="base").write(tmp_path / EVIL_DIR / "base")
    new = EvidenceBuilder(spec, run_id="new").write(tmp_path / "new")
    capsys.readouterr()
    main(["compare", str(base), str(new), "--format", fmt, "--resamples", "100"])
    return capsys.readouterr().out


def test_compare_md_shows_a_directory_with_backticks_as_code(tmp_path, capsys):
    """A CI checkout path carries the branch name, which the pull request's author chose."""
    md = _compare(tmp_path, capsys, "md")
    base_line = next(line for line in md.splitlines() if line.startswith("- base:"))
    assert "<img" not in _md_html(base_line), base_line
    assert str(tmp_path / EVIL_DIR / "base") in _code_spans(base_line)


def test_compare_html_forbids_every_fetch_and_carries_no_control_character(tmp_path, capsys):
    """As the report's page: a Content-Security-Policy of default-src 'none', and characters
    HTML cannot carry (a terminal escape in a directory name) shown as \\xNN."""
    from soakspec.cli import main

    spec = small_spec()
    base = EvidenceBuilder(spec, run_id="base").write(tmp_path / "b\x1b[31m")
    new = EvidenceBuilder(spec, run_id="new").write(tmp_path / "new")
    capsys.readouterr()
    main(["compare", str(base), str(new), "--format", "html", "--resamples", "100"])
    page = capsys.readouterr().out
    assert "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; style-src 'unsafe-inline'\">" in page
    assert "\x1b" not in page and "b\\x1b[31m" in page
    assert re.search(r"<(script|link|img|iframe|object)\b", page) is None


# ------------------------------------------------------------------------------ every format, any text

from hypothesis import HealthCheck, given, settings, strategies as st  # noqa: E402

HOSTILE_PARTS = st.sampled_from(["</script>", "<img src=x onerror=alert(1)>", '"', "'", "|", "`", "```", "\n# h\n", "[l](http://e.x)",
                                 "\x00", "\x01", "\x1f", "\x7f", "\ud800", "\udfff", "\ufffe", "\uffff", "]]>", "-->", "&amp;", "é名前",
                                 "\u2028", "\r", "\t", "L" * 700])
HOSTILE_TEXT = st.lists(st.one_of(HOSTILE_PARTS, st.text(max_size=8)), min_size=1, max_size=6).map("".join)


def _strict_json(text: str) -> dict:
    import json

    def refuse(constant: str) -> None:
        raise ValueError(f"{constant} is not JSON")

    return json.loads(text, parse_constant=refuse)


def _printable(text: str) -> str:
    from soakspec.commands.report import _printable as p

    return p(text)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(error=HOSTILE_TEXT, log=HOSTILE_TEXT, reason=HOSTILE_TEXT)
def test_every_format_stays_valid_whatever_the_server_said(error, log, reason):
    """A failed request's error, the crash diagnosis (server log lines), the abort reason and a
    failed pre-flight's error, each any text: JSON parses strictly (no NaN), JUnit parses, the
    HTML page carries no markup of the evidence's, the Markdown renders no HTML."""
    import xml.etree.ElementTree as ET

    spec = spec_from_text(small_spec(backends=("a", "b")).canonical_text)
    b = EvidenceBuilder(spec)
    b.set_outcome(list(b.measured("a"))[0], "failed", error)
    e = b.entry("a")
    e.update(crash_diagnosis=[log, "ok " + log], aborted_reason=reason, aborted_at=b.manifest["started_at_epoch"] + 3,
             preflight=[{"workload": "w", "passed": False, "record": {"error": error}}])
    b.manifest.update(status="aborted", incomplete_reason=reason, aborted_at=b.manifest["started_at_epoch"] + 3)
    inp = prepare(spec, b.build())
    out = {fmt: _printable(inp.render(fmt)) for fmt in ("md", "html", "json", "junit")}
    for text in out.values():
        text.encode("utf-8")  # no lone surrogate left
    doc = _strict_json(out["json"])
    assert doc["schema_version"] == 1 and doc["run"]["status"] == "aborted"
    ET.fromstring(out["junit"].encode("utf-8"))
    page = out["html"]
    assert re.search(r"<(script|img|link|iframe)\b", page) is None
    assert not re.search("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]", page)
    html = _md_html(out["md"])
    assert re.search(r"<(script|img|a)\b", html) is None, html
    assert not any(line.startswith("#") and not line.startswith(("## Retained", "### ")) for line in out["md"].splitlines())
