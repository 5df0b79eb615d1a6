"""The parser's fast paths give what lark's own parse gives, and error recovery does work
bounded by the input (issue 15: check/fmt/plan bounded on any spec under 1 MB). Counted, not
timed: the timings are in benchmarks/spec_scale.py.

- `_fast_parse` (one loop over lark's lexers and LALR table) yields the same tree, spans
  included, and the same diagnostics as lark's own `Lark.parse(on_error=...)`, for valid,
  mutated and noisy specs.
- A recovery that must parse again (an E005 mend) starts from a saved state near the mend,
  and a lexer error is mended and parsed on from where it stopped: many errors near the end
  of a long spec never mean a parse from the top per error.
- The resumable unescaped-quote scan answers as the scan from the top does.
- The strings' unrolled-loop regexes match exactly what the textbook forms match.
"""

from __future__ import annotations

import dataclasses
import re

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from runner_support import sim_spec
from soakspec.lang import parser as P
from soakspec.lang.strategies import valid_specs

SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def _full(x):
    """A node with its spans (which take no part in the AST's equality)."""
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        return (type(x).__name__,) + tuple((f.name, _full(getattr(x, f.name))) for f in dataclasses.fields(x))
    if isinstance(x, tuple):
        return tuple(_full(i) for i in x)
    return x


def _both(text: str) -> tuple:
    fast = P.parse(text, "t.soak")
    with pytest.MonkeyPatch.context() as m:
        m.setattr(P, "_fast_parts", lambda lark: None)  # lark's own parse throughout
        slow = P.parse(text, "t.soak")
    return _full(fast), _full(slow)


def _mutate(text: str, data) -> str:
    chars = list(text)
    for _ in range(data.draw(st.integers(1, 6))):
        i = data.draw(st.integers(0, max(0, len(chars) - 1)))
        op = data.draw(st.sampled_from(["insert", "delete", "replace"]))
        piece = data.draw(st.sampled_from(['"', "{", "}", "[", "]", "(", ")", "=", ",", "@", "\\", "\n", "#", '"""', "x", "1e999", "per", ":"]))
        if op == "insert":
            chars[i:i] = [piece]
        elif op == "delete" and chars:
            del chars[i]
        elif chars:
            chars[i] = piece
    return "".join(chars)


@SETTINGS
@given(valid_specs())
def test_the_fast_parse_of_a_valid_spec_is_lark_s(spec):
    fast, slow = _both(spec[0])
    assert fast == slow
    assert fast[0] is not None


@SETTINGS
@given(valid_specs(), st.data())
def test_a_mutated_spec_gets_lark_s_own_diagnostics(spec, data):
    fast, slow = _both(_mutate(spec[0], data))
    assert fast == slow


def _long_spec(n: int, tail: str) -> str:
    works = "".join(f'workload "w{i}" {{\n  load {{ concurrency = 1 }}\n  duration = 1s\n}}\n' for i in range(n))
    return sim_spec() + works + 'workload "z" {\n' + tail + "}\n"


def _count_parses(monkeypatch) -> list[int]:
    """Where each parse of the recovery starts (0: the top of the file)."""
    starts: list[int] = []
    real = P._fast_parse

    def counting(lark, text, checkpoints=None):
        starts.append(checkpoints[-1][0] if checkpoints else 0)
        return real(lark, text, checkpoints)

    monkeypatch.setattr(P, "_fast_parse", counting)
    return starts


@pytest.mark.parametrize(
    "bad, code",
    [('  s = "say "hi" now"\n', "E005"), ('  s = "open\n', "E002"), ("  x = @\n", "E003"), ("  key 5\n", "E001")],
    ids=["inner-quote", "open-string", "stray-character", "missing-equals"],
)
def test_many_errors_at_the_end_of_a_long_spec_do_not_parse_it_from_the_top_each(monkeypatch, bad, code):
    text = _long_spec(1500, bad * 60)  # ~100 kB, the errors in its last lines
    starts = _count_parses(monkeypatch)
    tree, diags = P.parse(text, "t.soak")
    assert tree is None and len(diags) == P.MAX_SYNTAX_ERRORS and diags[0].code == code
    assert diags[0].span.line == text[: text.index('workload "z"')].count("\n") + 2
    assert starts.count(0) == 1, starts  # one parse from the top; the others near the errors
    assert all(s > len(text) - 3 * P.CHECKPOINT_EVERY for s in starts[1:]), starts


def test_a_lexer_error_resumes_where_the_lexer_stopped(monkeypatch):
    text = _long_spec(200, '  x = @\n  y = "open\n  z = $\n')
    starts = _count_parses(monkeypatch)
    tree, diags = P.parse(text, "t.soak")
    assert [d.code for d in diags] == ["E003", "E002", "E003"]
    assert len(starts) == 1  # three errors, one parse


def test_a_mend_that_joins_the_token_before_it_is_lexed_again():
    """`t@ue`: the '@' becomes '_' and `t_ue` is one name, as a parse from the top reads it."""
    tree, diags = P.parse(sim_spec().replace("follow_up = true", "follow_up = t@ue"), "t.soak")
    assert [(d.code, d.message) for d in diags] == [("E003", "unexpected character '@'")]


QUOTEY = st.lists(st.sampled_from(list('"#r\\\n ab_,.=[]{}') + ['"""']), max_size=60).map("".join)


@settings(max_examples=400, deadline=None)
@given(QUOTEY, st.integers(1, 12), st.integers(0, 6))
def test_the_resumable_quote_scan_answers_as_the_scan_from_the_top(text, upto, more):
    scan = P._QuoteScan()
    assert scan.find(text, upto) == P._unescaped_quote(text, upto)
    assert scan.find(text, upto + more) == P._unescaped_quote(text, upto + more)


LONG = (r'''"""(?:[^"\\]|\\.|"(?!""))*"""''', P._LONG, re.S)
STRING = (r'''"(?:[^"\\\n]|\\.)*"''', P._STR, 0)


@settings(max_examples=600, deadline=None)
@given(st.lists(st.sampled_from(['"', "\\", "\n", "a", " ", '"""']), max_size=40).map("".join), st.integers(0, 4))
def test_the_unrolled_string_regexes_match_what_the_textbook_ones_do(text, at):
    for textbook, unrolled, flags in (LONG, STRING):
        a, b = re.compile(textbook, flags).match(text, at), re.compile(unrolled, flags).match(text, at)
        assert (a and a.span()) == (b and b.span()), (textbook, text, at)


def test_the_grammar_uses_the_parser_s_string_regexes():
    grammar = P._grammar_text()
    assert f"LONG_STRING.3: /{P._LONG}/s" in grammar and f"STRING.2: /{P._STR}/" in grammar


def test_a_rule_method_declared_with_meta_gets_the_span_of_all_the_rule_matched(monkeypatch):
    """What a new grammar rule's method may use: `@v_args(meta=True)` gets, as lark's
    propagate_positions gave, the span from the rule's first token to its last, punctuation
    included (here a block's closing brace)."""
    from lark import v_args

    from soakspec.lang import ast as A

    @v_args(meta=True)
    def block(self, meta, children):
        label = children[1] if len(children) > 1 and isinstance(children[1], A.Str) else None
        body = tuple(children[2:] if label is not None else children[1:])
        return A.Block(str(children[0]), label, body, span=P._span(meta), kind_span=P._tok_span(children[0]))

    text = 'soak "x" {\n  issue = "1"\n}\nbackend "b" {\n  sim {}\n}\n'
    expected = _full(P.parse(text, "t.soak"))
    monkeypatch.setattr(P._ToAst, "block", block)
    monkeypatch.setattr(P, "_BUILDER", P._ToAst())
    P._parser.cache_clear()
    P._fast_parts.cache_clear()
    try:
        got = P.parse(text, "t.soak")
        assert _full(got) == expected
        assert got[0].body[1].span == P.Span(4, 1, 6, 2)
    finally:
        monkeypatch.undo()
        P._parser.cache_clear()
        P._fast_parts.cache_clear()
