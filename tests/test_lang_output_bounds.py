"""What `check` prints stays proportional to the number of distinct problems, not to the size
of the lines they sit on (issue 15: a 72 KB spec printed 1.14 GB of warnings, because each
one repeated its whole source line; here a 170 KB one-line spec printed 1.3 GB)."""

from __future__ import annotations

import contextlib
import io

from soakspec.cli import main
from soakspec.diagnostics import SHOWN_COLUMNS, Diagnostic, Severity, Span, render_text
from soakspec.lang import check, parse


def _check(tmp_path, text: str) -> tuple[int, str]:
    path = tmp_path / "s.soak"
    path.write_text(text)
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        code = main(["check", str(path)])
    return code, out.getvalue()


def test_many_warnings_on_one_long_line_print_a_window_each(tmp_path):
    n = 2000
    text = 'soak "x" {} ' + " ".join(f'backend "b{i}" {{ launch = ["x"] }}' for i in range(n))
    text += ' workload "w" { load { concurrency = 1 } duration = 1s }\n'
    code, out = _check(tmp_path, text)
    assert code == 0 and out.count("W501") == n
    assert max(len(line) for line in out.splitlines()) < SHOWN_COLUMNS + 200
    assert len(out) < n * 600  # was n × the whole line: ~140 MB here
    first = out.splitlines()
    assert first[1].startswith('  soak "x" {} backend "b0"') and first[1].endswith("…")


def test_the_caret_still_points_at_the_span_inside_the_window():
    line = "x" * 500 + "BAD" + "y" * 500
    d = Diagnostic("E101", "bad", Span(1, 501, 1, 504), "p", Severity.ERROR)
    shown, caret = render_text([d], {"p": line}).splitlines()[1:3]
    i = caret.index("^")
    assert shown[i : i + 3] == "BAD" and caret[i:] == "^~~"
    assert len(shown) <= SHOWN_COLUMNS + 4


def test_short_lines_are_shown_whole():
    d = Diagnostic("E101", "bad", Span(1, 5, 1, 8), "p", Severity.ERROR)
    assert render_text([d], {"p": "abc def ghi"}).splitlines()[1:3] == ["  abc def ghi", "      ^~~"]


def test_the_caret_counts_terminal_cells_after_wide_and_combining_characters():
    """A label in Chinese before the error: each of its characters takes two cells on a
    terminal, so the caret moves two per character to stay under the span; a combining accent
    takes none. The column in the header stays the character's."""
    line = 'label = "模型" bad'
    d = Diagnostic("E101", "bad", Span(1, 14, 1, 17), "p", Severity.ERROR)
    head, shown, caret = render_text([d], {"p": line}).splitlines()[:3]
    assert head.startswith("p:1:14:")
    assert caret == "  " + " " * 15 + "^~~"  # 'label = "' 9 + 模型 4 + '" ' 2
    wide = Diagnostic("E101", "bad", Span(1, 10, 1, 12), "p", Severity.ERROR)
    assert render_text([wide], {"p": line}).splitlines()[2] == "  " + " " * 9 + "^~~~"  # under both wide characters
    accent = Diagnostic("E101", "bad", Span(1, 5, 1, 8), "p", Severity.ERROR)
    assert render_text([accent], {"p": "e\u0301e bad"}).splitlines()[2] == "  " + " " * 3 + "^~~"  # é: two characters, one cell


def test_a_warning_repeated_word_for_word_is_reported_once_with_a_count():
    n = 40
    text = 'soak "x" {}\nbackend "a" { url = "http://127.0.0.1:8000" }\n' + "".join(
        f'workload "w{i}" {{\n  load {{ concurrency = [1, 1] }}\n  duration = 90s\n  bucket = 60s\n}}\n' for i in range(n)
    )
    spec, diags = check(parse(text)[0])
    assert spec is not None
    assert [(d.code, d.span.line, d.span.column) for d in diags] == [("W504", 4, 28), ("W505", 6, 12)]
    assert all(d.message.endswith(f"(and {n - 1} more like it)") for d in diags)
