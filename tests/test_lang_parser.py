"""`parse`: values, spans, and error recovery (one mistake, one diagnostic).

Several cases here are regressions for bugs found while writing the acceptance tests; each
names the bug in its id.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from soakspec.diagnostics import render_text
from soakspec.lang import ast as A
from soakspec.lang import check, fmt, parse
from soakspec.plan import plan, render_text as render_plan, to_json


def _value(text: str) -> A.Value:
    tree, diags = parse(f"x = {text}\n")
    assert diags == [], diags
    return tree.body[0].value


@pytest.mark.parametrize(
    "text, value",
    [
        ("120s", A.Quantity(120, "s")),
        ("-1.5ms", A.Quantity(-1.5, "ms")),
        ("95%", A.Quantity(95, "%")),
        ("2GiB", A.Quantity(2, "GiB")),
        ("1e5s", A.Quantity(100000.0, "s")),
        ("120sec", A.Quantity(120, "sec")),  # unknown units are check's business
        ("5em", A.Quantity(5, "em")),
        ("120", A.Num(120)),
        ("-1", A.Num(-1)),
        ("0.25", A.Num(0.25)),
        ("1e-05", A.Num(1e-05)),  # regression: lexed as the quantity `1e` then `-05`
        ("1e5", A.Num(100000.0)),  # regression: lexed as `1e` then `5`
        ("1E+3", A.Num(1000.0)),
        ("true", A.Bool(True)),
        ("false", A.Bool(False)),
        ("greedy", A.Word("greedy")),
        ("truthy", A.Word("truthy")),
        ("nccl-2.26", A.Word("nccl-2.26")),
        ('"a\\"b\\n\\u00e9"', A.Str('a"b\né')),
        ('r"\\d+ (?P<json>\\{.*\\})"', A.Str(r"\d+ (?P<json>\{.*\})", "raw")),
        ('"""two\nlines"""', A.Str("two\nlines", "long")),
        ("[]", A.List(())),
        ("[1, [2s, \"x\"], ]", A.List((A.Num(1), A.List((A.Quantity(2, "s"), A.Str("x")))))),
    ],
)
def test_values(text, value):
    assert _value(text) == value
    assert _value(fmt(A.SoakFile((A.Attribute("x", value),))).split(" = ", 1)[1]) == value


def test_spans_are_one_based_and_cover_the_node():
    text = 'soak "x" {\n  duration = 120s\n}\ngate {\n  require p99(ttft) <= 1s per bucket on "a"\n}\n'
    tree, _ = parse(text)
    soak, gate = tree.body
    assert (soak.kind_span.line, soak.kind_span.column) == (1, 1)
    attr = soak.body[0]
    assert (attr.key_span.line, attr.key_span.column, attr.key_span.end_column) == (2, 3, 11)
    assert (attr.value.span.line, attr.value.span.column, attr.value.span.end_column) == (2, 14, 18)
    rule = gate.body[0]
    assert (rule.span.line, rule.span.column) == (5, 3)
    assert rule.expr == A.Call("p99", A.MetricRef("ttft"))
    assert (rule.expr.span.column, rule.expr.span.end_column) == (11, 20)
    assert rule.scope == A.Scope("bucket") and rule.target == A.Str("a")
    assert rule.target.span.column == 41


# ---------------------------------------------------------------- one mistake, one diagnostic


@pytest.mark.parametrize(
    "text, where",
    [
        pytest.param("a {\n  x = 1;\n  y = 2\n}\n", (2, 8, "E003"), id="stray-char-after-value-cascaded"),
        pytest.param("a {\n  x = 1 ;\n}\n", (2, 9, "E003"), id="stray-char-before-brace-cascaded"),
        pytest.param("a {\n  x = @\n  y = 2\n}\n", (2, 7, "E003"), id="stray-char-as-value"),
        pytest.param("a {\n  dura@tion = 60s\n}\n", (2, 7, "E003"), id="stray-char-in-name"),
        pytest.param("a {\n  x 5\n  y = 2\n}\n", (2, 5, "E001"), id="missing-equals-cascaded"),
        pytest.param("a {\n  x = [1 2]\n  y = 2\n}\n", (2, 10, "E001"), id="missing-comma"),
        pytest.param("a {\n  x = [0, 1\n}\nb {}\n", (2, 12, "E001"), id="unclosed-list-cascaded"),  # where the line ends
        pytest.param("gate {\n  require p95(ttft <= 1s\n  require failed == 0\n}\n", (2, 20, "E001"), id="unclosed-call"),
        pytest.param('backend "a {\n  url = "http://x"\n}\n', (1, 9, "E002"), id="unterminated-label-cascaded"),
        pytest.param('a {\n  x = "abc\n  y = 2\n}\n', (2, 7, "E002"), id="unterminated-string"),
        pytest.param('a {\n  x = """abc\n  y = 2\n}\n', (2, 7, "E002"), id="unterminated-long-string-cascaded"),
        pytest.param("a {\n  b {\n    x = 1\n  }\n", (1, 3, "E004"), id="unclosed-block"),
        pytest.param("a {\n  x = " + "9" * 5000 + "\n}\n", (2, 7, "E001"), id="5000-digit-number-crashed"),
        pytest.param("a {\n  x = 1e400s\n}\n", (2, 7, "E001"), id="number-overflows"),
        pytest.param("a {\n  x = \\n\n}\n", (2, 7, "E003"), id="backslash"),
        pytest.param("a {\n  x = 1 }}\n", (2, 10, "E001"), id="extra-brace"),
    ],
)
def test_one_mistake_one_diagnostic(text, where):
    tree, diags = parse(text)
    assert tree is None
    assert [(d.span.line, d.span.column, d.code) for d in diags] == [where], render_text(diags, {"<string>": text})


@pytest.mark.parametrize(
    "text, where, says",
    [
        pytest.param('x = "a\\qb"\n', (1, 7, 9), "'\\q'", id="unknown-escape"),
        pytest.param('x = "\\d+"\n', (1, 6, 8), "'\\d'", id="regex-escape-outside-a-raw-string"),
        pytest.param('x = "ab\\u12"\n', (1, 8, 12), "'\\u12' needs four hex digits", id="short-u-escape"),
        pytest.param('x = "\\uzzzz"\n', (1, 6, 8), "'\\u' needs four hex digits", id="u-without-hex"),
        pytest.param('x = "a\\ud800"\n', (1, 7, 13), "surrogate", id="lone-surrogate"),
        pytest.param('x = "\\ude00\\ud83d"\n', (1, 6, 12), "surrogate", id="pair-in-the-wrong-order"),
        pytest.param('a {\n  x = """one\n  t\\wo"""\n}\n', (3, 4, 6), "'\\w'", id="in-a-long-string-lines-below"),
        pytest.param('a {\n  x = """one \\\n  two"""\n}\n', (2, 14, 15), "end of a line", id="backslash-newline"),
        pytest.param('backend "a\\sb" {}\n', (1, 11, 13), "'\\s'", id="in-a-label"),
    ],
)
def test_an_invalid_escape_is_an_error_at_the_escape(text, where, says):
    """An escape the language does not define is E006 at the escape itself, with a hint that
    lists the escapes it does define (it used to be kept as written, silently: `"\\d+"` meant
    a backslash and a d, `"\\u12"` six characters)."""
    tree, diags = parse(text)
    assert tree is None
    assert [(d.span.line, d.span.column, d.span.end_column, d.code) for d in diags] == [(*where, "E006")], render_text(diags, {"<string>": text})
    assert says in diags[0].message
    assert all(e in diags[0].hint for e in ("\\n", "\\t", '\\"', "\\\\", "\\uXXXX", 'r"..."'))


def test_invalid_escapes_and_too_large_numbers_are_all_reported_in_order():
    text = 'a {\n  x = "\\q"\n  y = 1e400\n  z = ["ok\\n", "\\x41"]\n}\n'
    _, diags = parse(text)
    assert [(d.span.line, d.span.column, d.code) for d in diags] == [(2, 8, "E006"), (3, 7, "E001"), (4, 17, "E006")]


def test_raw_strings_keep_their_backslashes_and_valid_escapes_still_read():
    assert _value('r"a\\qb\\u12\\ud800"') == A.Str("a\\qb\\u12\\ud800", "raw")
    assert _value('"\\n\\t\\r\\0\\"\\\'\\\\\\/\\u00e9\\ud83d\\ude00"') == A.Str("\n\t\r\0\"'\\/\u00e9\U0001F600")
    assert _value('"""\\q"""'.replace("\\q", "\\\\q")) == A.Str("\\q", "long")  # an escaped backslash, then q


def test_every_line_with_a_mistake_is_reported():
    text = "".join(f"b{i} {{\n  x = 1;\n}}\n" for i in range(10))
    _, diags = parse(text)
    assert [(d.span.line, d.code) for d in diags] == [(3 * i + 2, "E003") for i in range(10)]


def test_raw_string_right_after_a_name_is_not_a_raw_string():
    """Regression: the comment scanner read `for"a\\"#"` as the raw string `r"a\\"` followed by
    the comment `#" {}`, and fmt invented that comment."""
    tree, diags = parse('for"a\\"#" {}\n')
    assert diags == []
    assert tree == A.SoakFile((A.Block("for", A.Str('a"#'), ()),))
    assert fmt(tree) == 'for "a\\"#" {}\n'


def test_braces_inside_a_long_string_do_not_count_as_nesting():
    """Regression: the nesting guard ignored long strings and refused this spec (E011)."""
    text = 'x = """a\n' + "{" * 40 + '\n"""\n'
    tree, diags = parse(text)
    assert diags == []
    assert tree.body[0].value.value == "a\n" + "{" * 40 + "\n"


def test_deep_nesting_is_refused_before_parsing():
    tree, diags = parse("a {" * 17 + "}" * 17)
    assert tree is None and [d.code for d in diags] == ["E011"]


def test_a_refusal_points_at_its_cause():
    """E011 at the bracket that opens the first level too many (not 1:1, the top comment's
    place), a NUL byte at its column, an invalid UTF-8 byte at its column."""
    from soakspec.lang.parser import decode_source

    _, (d,) = parse("# deep\nx = 1\n" + "  " + "a {" * 17 + "}" * 17)
    assert (d.code, d.span.line, d.span.column) == ("E011", 3, 3 + 3 * 16 + 2)
    _, (d,) = parse('soak "x" {\n  issue = "a\0b"\n}\n')
    assert (d.code, d.span.line, d.span.column) == ("E003", 2, 13)
    _, d = decode_source(b'soak "x" {\n  issue = "\xc3\xa9\xe9"\n}\n', "s")  # a valid e-acute, then a stray byte
    assert (d.code, d.span.line, d.span.column) == ("E003", 2, 13)


def test_huge_input_is_refused():
    tree, diags = parse("# x\n" * 300_000)
    assert tree is None and [d.code for d in diags] == ["E010"]


def test_at_most_50_syntax_errors():
    _, diags = parse("a {\n" + "  x = 1;\n" * 80 + "}\n")
    assert len(diags) == 50


# ---------------------------------------------------------------- check bounds (plan never crashes)

BASE = 'soak "x" {}\nbackend "a" { url = "http://127.0.0.1:8000" }\nworkload "w" {\n%s\n}\n'


@pytest.mark.parametrize(
    "body, code",
    [
        pytest.param("  load { concurrency = 1 }\n  duration = 24h\n  bucket = 1ms", "E204", id="86M-buckets-hung-plan"),
        pytest.param("  load { concurrency = 1 }\n  duration = 1e306h", "E204", id="inf-duration-crashed-plan"),
        pytest.param("  load { concurrency = [1, 2] }\n  duration = 60s\n  warmup = 1e308s", "E204", id="inf-wall-time-crashed-plan"),
        pytest.param("  load { concurrency = 1" + "0" * 300 + " }\n  duration = 60s\n  expected_latency = 1s", "E204", id="inf-requests-crashed-plan"),
        pytest.param("  load {\n    mode = open\n    rate = 1e300rps\n  }\n  duration = 60s", "E204", id="inf-open-loop-crashed-plan"),
    ],
)
def test_check_bounds_what_plan_computes(body, code):
    tree, diags = parse(BASE % body)
    assert diags == []
    spec, diags = check(tree)
    assert spec is None
    assert [d.code for d in diags] == [code], diags


@pytest.mark.parametrize(
    "body",
    [
        "  load { concurrency = 1000000 }\n  duration = 719h\n  bucket = 260s\n  warmup = 1h\n  expected_latency = 1us",
        "  load {\n    mode = open\n    rate = 1000000rps\n  }\n  duration = 720h\n  bucket = 259.2s",
    ],
)
def test_plan_at_the_bounds(body):
    spec, diags = check(parse(BASE % body)[0])
    assert spec is not None, diags
    p = plan(spec)
    assert p.bucket_count <= 10_000
    assert "wall time" in render_plan(p)
    assert to_json(p)["expected_requests"] > 0


def test_hypothesis_is_not_imported_by_the_package():
    code = (
        "import sys, soakspec, soakspec.lang, soakspec.plan, soakspec.cli\n"
        "assert 'hypothesis' not in sys.modules\n"
        "import soakspec.lang.strategies\n"
        "assert 'hypothesis' in sys.modules\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr


_ENDINGS = 'soak "x" {\n  description = """a\n  b"""  # note\n  issue = 5\n}\n'


def test_a_leading_bom_and_crlf_line_breaks_parse_as_the_plain_text():
    """A BOM is not part of the spec, and CRLF reads as LF (inside a long string too): the same
    tree, and the same positions (line 1's columns counted after the BOM)."""
    plain = parse(_ENDINGS)
    assert plain[0] is not None
    for variant in ("\ufeff" + _ENDINGS, _ENDINGS.replace("\n", "\r\n"), "\ufeff" + _ENDINGS.replace("\n", "\r\n"),
                    _ENDINGS.replace("\n", "\r")):  # fmt: skip
        assert parse(variant) == plain, repr(variant)
    tree, diags = parse('\ufeffsoak "x" { issue = 5 }\nbackend "a" { url = "http://127.0.0.1:8000" }\n'
                        'workload "w" {\n  load { concurrency = 1 }\n  duration = 60s\n}\n')  # fmt: skip
    _, diags = check(tree)
    assert [(d.code, d.span.line, d.span.column) for d in diags] == [("E104", 1, 20)]
    tree, diags = parse('\ufeffsoak "x" { x = @ }\n')
    assert [(d.code, d.span.line, d.span.column) for d in diags] == [("E003", 1, 16)]
