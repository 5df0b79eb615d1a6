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
