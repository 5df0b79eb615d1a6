"""Text -> `SoakFile`: the Lark LALR parser, the tree transformer and comment attachment.

`parse(text, path)` never raises for bad input: it returns `(tree_or_None, diagnostics)`.
Syntax errors are all collected in one pass: after an unexpected character the offending
span is blanked (positions kept) and the text is parsed again; after an unexpected token the
parser skips it and resumes. At most one syntax error is reported per line, so a single
mistake does not cascade into a page of noise.
"""

from __future__ import annotations

import bisect
import contextlib
import dataclasses
import errno
import functools
import gc
import importlib.resources
import math
import os
import pathlib
import re
import select
import stat
import threading
import time
from types import SimpleNamespace

from lark import Lark, Token, Transformer, Tree, v_args
from lark.lexer import BasicLexer, ContextualLexer, LexerState, LexerThread
from lark.parsers.lalr_analysis import Shift
from lark.parsers.lalr_interactive_parser import InteractiveParser
from lark.parsers.lalr_parser_state import ParseConf, ParserState
from lark.utils import TextSlice
from lark.exceptions import UnexpectedCharacters, UnexpectedEOF, UnexpectedInput, UnexpectedToken, VisitError

from soakspec.diagnostics import Diagnostic, Span, line_col
from soakspec.lang import ast as A
from soakspec.units import UNITS, Dimension, unit_for_word, units_listed

MAX_SOURCE_BYTES = 1_000_000
# A long string and a one-line string, as the grammar's LONG_STRING and STRING match them (the
# unrolled-loop forms: a repetition per escape, not per character, so that re's backtracking
# stack does not grow with a long string -- 384 MB for one of 900 kB with the textbook forms).
_LONG = r'''"""[^"\\]*(?:(?:\\.|"(?!""))[^"\\]*)*"""'''
_STR = r'''"[^"\\\n]*(?:\\.[^"\\\n]*)*"'''
MAX_NESTING = 16
MAX_SYNTAX_ERRORS = 50


def _grammar_text() -> str:
    """The grammar ships inside the wheel as `soakspec/_grammar/soak.lark`; in a source
    checkout (or an editable install) it is read from the top-level `grammar/` directory."""
    try:
        res = importlib.resources.files("soakspec").joinpath("_grammar/soak.lark")
        if res.is_file():
            return res.read_text(encoding="utf-8")
    except (FileNotFoundError, ModuleNotFoundError):  # pragma: no cover
        pass
    path = pathlib.Path(__file__).resolve().parents[2] / "grammar" / "soak.lark"
    return path.read_text(encoding="utf-8")


@functools.cache
def _parser() -> Lark:
    """The LALR parser with the AST built inline: each rule's `_ToAst` method runs as the rule
    is reduced, so no parse tree is built and walked a second time (on a 1 MB spec the tree,
    its position propagation and the transform pass were three quarters of `check`'s time).
    Positions come from the tokens: `_Positions` gives a rule's method the span of everything
    the rule matched, punctuation included -- what lark's `propagate_positions` computed."""
    lark = Lark(
        _grammar_text(),
        parser="lalr",
        lexer="contextual",
        transformer=_BUILDER.callbacks(),
        maybe_placeholders=False,
    )
    _BUILDER.positioned(lark._callbacks)
    return lark


CHECKPOINT_EVERY = 16_384  # characters between the fast parser's saved states (for a parse again after a mend)


# The parse of a well-formed spec, in one loop: lark's contextual lexers (the same
# compiled alternations, tried in the same order, the same keyword check of a name) feeding
# lark's LALR table and rule callbacks directly -- the same shifts and reductions as
# `Lark.parse`, so the same `SoakFile`, without lark's per-token layers (a generator, a
# parser-state object and a method call per token; whitespace and comments lexed as tokens
# first). At the first character no terminal matches, or the first token the table has no
# action for, it stops and returns a `_Stuck`: the parser's state there, which lark's own
# parser takes over (`_Stuck.resume`) -- it raises that first error exactly as `Lark.parse`
# would have, and its error recovery goes on from there. Relies on the structure of lark
# 1.2/1.3 (checked in `_fast_parts`); without it, `_NOT_FAST`: lark parses it all.
#
# `checkpoints`: a list of saved states (position, line, line start, the stacks, the last
# token), every CHECKPOINT_EVERY characters; the parse starts from the last one there
# and appends more. Only error recovery passes it: the value stack's lists are shared with
# the checkpoints, which is harmless only because a parse that had an error is dropped.
def _fast_parse(lark: Lark, text: str, checkpoints: list | None = None):
    """A well-formed spec parsed in one loop; at its first error, a `_Stuck` (see above)."""
    parts = _fast_parts(lark)
    if parts is None:  # pragma: no cover - another lark
        return _NOT_FAST
    states, start_state, end_state, lexers, callbacks, term_callbacks, shift = parts
    end = len(text)
    pos, line, line_start, state_stack, value_stack, last = _fast_start(start_state, checkpoints)
    new_token = Token._future_new
    plans: dict[int, tuple] = {}
    next_checkpoint = pos + CHECKPOINT_EVERY if checkpoints is not None else end + 1
    while True:
        if pos >= next_checkpoint:
            checkpoints.append((pos, line, line_start, tuple(state_stack), tuple(value_stack), last))
            next_checkpoint = pos + CHECKPOINT_EVERY
        # ---- the next token, lexed by the lexer of the parser's state (lark's ContextualLexer)
        basic = lexers[state_stack[-1]]
        plan = plans.get(id(basic))
        if plan is None:
            plan = plans[id(basic)] = (basic.scanner._mres, basic.ignore_types, basic.newline_types, basic.callback)
        mres, ignore, newline, lex_callbacks = plan
        tok = None
        while pos < end:
            for mre in mres:
                m = mre.match(text, pos)
                if m is not None:
                    break
            else:
                return _Stuck(lark, text, state_stack, value_stack, (pos, line, line_start), last, None, False)
            value = m.group(0)
            type_ = m.lastgroup
            start, tline, tcol = pos, line, pos - line_start + 1
            if type_ in newline:
                n = value.count("\n")
                if n:
                    line += n
                    line_start = pos + value.rindex("\n") + 1
            pos += len(value)
            ignored = type_ in ignore
            if ignored and type_ not in lex_callbacks:
                continue
            t = new_token(type_, value, start, tline, tcol, line, pos - line_start + 1, pos)
            if type_ in lex_callbacks:
                t = lex_callbacks[type_](t)
            if not ignored:
                tok = t
                break
        is_end = tok is None
        if is_end:
            tok = Token.new_borrow_pos("$END", "", last) if last is not None else Token("$END", "", 0, 1, 1)
        else:
            last = tok
        # ---- lark's ParserState.feed_token
        while True:
            actions = states[state_stack[-1]]
            action_arg = actions.get(tok.type)
            if action_arg is None:
                return _Stuck(lark, text, state_stack, value_stack, (pos, line, line_start), last, tok, is_end)
            action, arg = action_arg
            if action is shift:
                state_stack.append(arg)
                value_stack.append(tok if tok.type not in term_callbacks else term_callbacks[tok.type](tok))
                break
            size = len(arg.expansion)
            if size:
                children = value_stack[-size:]
                del state_stack[-size:]
                del value_stack[-size:]
            else:
                children = []
            reduced = callbacks[arg](children)
            state_stack.append(states[state_stack[-1]][arg.origin.name][1])
            value_stack.append(reduced)
            if is_end and state_stack[-1] == end_state:
                return value_stack[-1]


def _fast_start(start_state, checkpoints: list | None) -> tuple:
    """Where `_fast_parse` starts: the top of the text, or the last checkpoint."""
    if not checkpoints:
        return 0, 1, 0, [start_state], [], None
    pos, line, line_start, states_saved, values_saved, last = checkpoints[-1]
    return pos, line, line_start, list(states_saved), list(values_saved), last


_NOT_FAST = object()


class _Stuck:
    """Where `_fast_parse` met the first syntax error: the LALR stacks, the lexer's position
    (after `token` when a token had no action, else where no terminal matched) and that token."""

    def __init__(self, lark, text, state_stack, value_stack, where, last_token, token, is_end):
        self.lark, self.text = lark, text
        self.state_stack, self.value_stack = state_stack, value_stack
        self.where, self.last_token, self.token, self.is_end = where, last_token, token, is_end

    def resume(self):
        """Go on in lark's own parser from this state: what `Lark.parse` does from here on --
        it raises the same first error, with its `interactive_parser`, for error recovery."""
        frontend = self.lark.parser
        inner = frontend.parser.parser
        lexer_state = LexerState(TextSlice(self.text, 0, len(self.text)), last_token=self.last_token)
        ctr = lexer_state.line_ctr
        pos, line, line_start = self.where
        ctr.char_pos, ctr.line, ctr.line_start_pos, ctr.column = pos, line, line_start, pos - line_start + 1
        thread = LexerThread(frontend.lexer, lexer_state)
        state = ParserState(ParseConf(inner.parse_table, inner.callbacks, "start"), thread, self.state_stack, self.value_stack)
        try:
            if self.token is not None:
                result = state.feed_token(self.token, self.is_end)
                if self.is_end:  # pragma: no cover - it had no action, so feed_token raised
                    return result
            return inner.parse_from_state(state, last_token=self.last_token)
        except UnexpectedInput as e:
            if getattr(e, "interactive_parser", None) is None:
                e.interactive_parser = InteractiveParser(inner, state, thread)
            raise


@functools.cache
def _fast_parts(lark: Lark):
    """What `_fast_parse` reads from lark, or None when this lark is not built as it expects."""
    try:
        frontend = lark.parser
        lexer = frontend.lexer
        table = frontend.parser.parser.parse_table
        if type(lexer) is not ContextualLexer or not all(type(b) is BasicLexer for b in lexer.lexers.values()):
            return None  # pragma: no cover
        if frontend.lexer_conf.postlex is not None or not hasattr(Token, "_future_new"):
            return None  # pragma: no cover
        frontend.parser.parser.parse_from_state  # noqa: B018
        for b in set(lexer.lexers.values()):
            b.scanner._mres  # noqa: B018 - builds the scanner and its keyword callbacks, as lark's first use would
            b.callback, b.ignore_types, b.newline_types  # noqa: B018
        callbacks = frontend.parser.parser.callbacks
        term_callbacks = {k: v for k, v in callbacks.items() if isinstance(k, str)}
        return (table.states, table.start_states["start"], table.end_states["start"], lexer.lexers, callbacks, term_callbacks, Shift)
    except (AttributeError, KeyError):  # pragma: no cover - another lark
        return None


# Friendly names for terminals in "expected ..." messages.
_TERMINAL_NAMES = {
    "NAME": "a name",
    "STRING": "a string",
    "RAW_STRING": "a string",
    "LONG_STRING": "a string",
    "NUMBER": "a number",
    "QUANTITY": "a quantity",
    "COUNT_UNIT": "'requests'",
    "LBRACE": "'{'",
    "RBRACE": "'}'",
    "LSQB": "'['",
    "RSQB": "']'",
    "LPAR": "'('",
    "RPAR": "')'",
    "EQUAL": "'='",
    "COMMA": "','",
    "COMPARATOR": "a comparison",
    "SEVERITY": "'require', 'warn' or 'abort'",
    "CLAIM_KW": "'claim' or 'exclude'",
    "TRUE": "true",
    "FALSE": "false",
    "PER": "'per'",
    "ON": "'on'",
    "SLO_AND": "'and'",
    "SLO_FUNC": "'goodput' or 'goodput_rate'",
    "$END": "end of file",
}


# Blocks whose statements are rules, or claims (the checker's tables: gate.py, compare.py,
# claims.py -- tests/test_lang_diagnostics.py holds them to these); every other block holds keys
# and blocks.
RULE_BLOCKS = ("gate", "compare")
CLAIM_BLOCKS = ("claims",)
_STATEMENT_START = frozenset({"NAME", "SEVERITY", "CLAIM_KW"})


def _name_before_open(ip, opening: str, closing: str, skip: type | None = None) -> str | None:
    """The NAME token before the innermost `opening` token (LBRACE, LPAR) still open on the
    parser's stack (a `closing` one on the stack is one not yet reduced with its opening: the
    token after it had no action), passing over one value of type `skip` between them (a
    block's label); None where there is none, or no name before it."""
    stack = ip.parser_state.value_stack if ip is not None else ()
    closed = 0
    for i in range(len(stack) - 1, 0, -1):
        v = stack[i]
        if isinstance(v, Token) and v.type == closing:
            closed += 1
        elif isinstance(v, Token) and v.type == opening and closed:
            closed -= 1
        elif isinstance(v, Token) and v.type == opening:
            before = stack[i - 1]
            if skip is not None and isinstance(before, skip) and i >= 2:
                before = stack[i - 2]
            return str(before) if isinstance(before, Token) and before.type == "NAME" else None
    return None


def _enclosing_block(ip) -> str | None:
    """The kind of the block the parse is inside (`workload` in `workload "w" { ... }`), or
    None at the top of the file."""
    return _name_before_open(ip, "LBRACE", "RBRACE", skip=A.Str)


def _enclosing_call(ip) -> str | None:
    """The function the parse is inside the parentheses of (`p95` in `p95(ttft <= ...`), or
    None outside any."""
    return _name_before_open(ip, "LPAR", "RPAR")


def _describe_expected(expected: set[str], ip=None) -> str:
    if len(expected) > 1:  # `20 requests` (a count's word) is for one key: never what a list or a line missed
        expected = expected - {"COUNT_UNIT"}
    if "COMMA" in expected and "RPAR" in expected and _enclosing_call(ip) not in A.MULTI_ARG_FUNCTIONS:
        # the grammar takes `f(a, b)` for any name (a wrong count is the checker's error), but
        # only ratio() has a second argument: inside p95( ... the next thing is its ')'
        expected = expected - {"COMMA"}
    if {"STRING", "NUMBER", "QUANTITY"} <= expected:
        return " (expected a value: a string, number, quantity, name, list or table)"
    if expected - {"RBRACE", "$END"} == _STATEMENT_START:  # a statement: say which this block holds
        kind = _enclosing_block(ip)
        if kind is None:
            return " (expected a block)" if "RBRACE" not in expected else " (expected a statement or '}')"
        if kind in RULE_BLOCKS:
            return f" (expected a rule -- require, warn or abort --, a key = value or '}}' in {kind})"
        if kind in CLAIM_BLOCKS:
            return f" (expected claim \"...\", exclude \"...\" or '}}' in {kind})"
        return f" (expected a key = value, a block or '}}' in {kind})"
    names = sorted({_TERMINAL_NAMES.get(t, t.lower()) for t in expected})
    if not names:
        return ""
    if len(names) > 6:
        names = names[:6] + ["..."]
    return " (expected " + ", ".join(names) + ")"


def _describe_token(tok: Token) -> str:
    if tok.type == "$END":
        return "end of file"
    text = str(tok)
    if len(text) > 30:
        text = text[:27] + "..."
    return repr(text)


# ---------------------------------------------------------------- transformer


def _span(meta) -> Span:
    if getattr(meta, "empty", True) or meta.line is None:
        return Span()
    return Span(meta.line, meta.column, meta.end_line, meta.end_column)


def _tok_span(tok: Token) -> Span:
    return Span(tok.line, tok.column, tok.end_line, tok.end_column)


def _number(text: str) -> int | float:
    """A NUMBER token's value: an int when it has no fraction or exponent."""
    if "." in text or "e" in text or "E" in text:
        return float(text)
    return int(text)


_QUANTITY_RE = re.compile(r"(-?[0-9]+(?:\.[0-9]+)?(?:[eE][-+]?[0-9]+)?)([A-Za-z%]+)")


_SIMPLE_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", '"': '"', "\\": "\\", "/": "/", "'": "'", "0": "\0"}
_ESCAPES_HINT = ('the escapes are \\n \\t \\r \\0 \\" \\\' \\\\ \\/ and \\uXXXX (past U+FFFF a surrogate pair, '
                 '\\ud83d\\ude00); write a backslash as \\\\, or use a raw string r"..." (no escapes)')
_HEX4 = re.compile(r"[0-9a-fA-F]{4}")
_LOW_SURROGATE = re.compile(r"\\u[dD][c-fC-F][0-9a-fA-F]{2}")


def _unescape(body: str) -> tuple[str, list[tuple[int, int, str]]]:
    """A string's text with its escapes read: JSON's (a surrogate pair is its one character)
    plus \\' and \\0. Returns the text and its invalid escapes as (offset in `body`, length,
    what is wrong), for the parser to report at their place (an unknown escape, a \\u without
    four hex digits, a lone UTF-16 surrogate: no character a request body could encode); the
    text keeps an invalid escape as written."""
    if "\\" not in body:
        return body, []
    out: list[str] = []
    bad: list[tuple[int, int, str]] = []
    i = 0
    while True:
        j = body.find("\\", i)
        if j < 0 or j + 1 >= len(body):
            out.append(body[i:])
            return "".join(out), bad
        out.append(body[i:j])
        n = body[j + 1]
        if n in _SIMPLE_ESCAPES:
            out.append(_SIMPLE_ESCAPES[n])
            i = j + 2
            continue
        if n == "u" and _HEX4.fullmatch(body, j + 2, j + 6):
            code = int(body[j + 2 : j + 6], 16)
            if 0xD800 <= code < 0xDC00 and _LOW_SURROGATE.match(body, j + 6):  # a pair, as JSON writes a character beyond the BMP
                out.append(chr(0x10000 + ((code - 0xD800) << 10) + (int(body[j + 8 : j + 12], 16) - 0xDC00)))
                i = j + 12
                continue
            if not 0xD800 <= code < 0xE000:
                out.append(chr(code))
                i = j + 6
                continue
            bad.append((j, 6, f"escape '{body[j : j + 6]}' is half of a UTF-16 surrogate pair, not a character"))
        elif n == "u":
            digits = len(re.match(r"[0-9a-fA-F]{0,3}", body[j + 2 : j + 5]).group())  # type: ignore[union-attr]
            bad.append((j, 2 + digits, f"escape '{body[j : j + 2 + digits]}' needs four hex digits (\\uXXXX)"))
        elif n == "\n":
            bad.append((j, 1, "a backslash at the end of a line is not an escape"))
        else:
            bad.append((j, 2, f"invalid escape '\\{n}' in a string"))
        out.append("\\")
        i = j + 1


class _Meta:
    """What a `@v_args(meta=True)` method reads: the span of all the rule matched."""

    __slots__ = ("empty", "line", "column", "end_line", "end_column")

    def __init__(self, first, last):
        self.empty = first is None
        if first is not None:
            self.line, self.column = first
            self.end_line, self.end_column = last


def _edge_of(c, end: bool):
    """(line, column) where a reduced child begins (or, with `end`, ends): a token, an AST
    node (its span) or an expanded helper rule's Tree (its first or last child); None when it
    has no position (a token that error recovery inserted)."""
    if isinstance(c, Token):
        if c.line is None or c.end_line is None:
            return None
        return (c.end_line, c.end_column) if end else (c.line, c.column)
    span = getattr(c, "span", None)
    if span is not None:
        if not span.line:
            return None
        return (span.end_line, span.end_column) if end else (span.line, span.column)
    if isinstance(c, Tree):
        for x in reversed(c.children) if end else c.children:
            found = _edge_of(x, end)
            if found is not None:
                return found
    return None


def _punctuated(method):
    """Mark a rule method whose span includes punctuation that lark drops from its children
    (braces, brackets, parentheses, keywords): it reads the rule's raw children (`self.raw`)."""
    method.punctuated = True
    return method


def _between(first: Token, last: Token | Span) -> Span:
    """From a token to the end of a token or span (an attribute: its key to its value's end)."""
    if isinstance(last, Token):
        return Span(first.line, first.column, last.end_line, last.end_column)
    if first.line is None or not last.line:
        return Span()  # a token that error recovery inserted (the tree is dropped then)
    return Span(first.line, first.column, last.end_line, last.end_column)


class _ToAst(Transformer):
    """The rules' callbacks, run inline by the LALR parser (`_parser`). A method is named after
    its rule (or alias) and takes the rule's children; with `@v_args(meta=True)` it also gets
    the `meta` of everything the rule matched (its punctuation included), as with lark's
    `propagate_positions`. One instance serves every parse (under `_PARSE_LOCK`): `reset`
    before each."""

    def __init__(self):
        self.raw: list = []  # the children of the rule being reduced, punctuation included
        self.too_large: list[Token] = []  # number literals no float holds (reported after a clean parse)
        self.bad_escapes: list[tuple[Token, int, int, str]] = []  # (string, offset in it, length, why): likewise
        self.raw_strings: set[int] = set()  # where the lexer read a raw string (`_comment_tokens`)

    def reset(self) -> None:
        self.raw = []
        self.too_large = []
        self.bad_escapes = []
        self.raw_strings = set()

    def meta(self) -> _Meta:
        raw = self.raw
        first = last = None
        for c in raw:
            first = _edge_of(c, end=False)
            if first is not None:
                break
        for c in reversed(raw):
            last = _edge_of(c, end=True)
            if last is not None:
                break
        if first is None or last is None:
            return _Meta(None, None)
        return _Meta(first, last)

    def callbacks(self) -> SimpleNamespace:
        """The rule methods as lark's inline transformer calls them (`f(children)`); a method
        declared with `v_args` gets what that asks for, its `meta` computed by `meta()`."""
        ns = SimpleNamespace()
        for name in vars(type(self)):
            if name.startswith("_") or name in _BUILDER_API:
                continue
            f = getattr(self, name)
            wrapper = getattr(f, "visit_wrapper", None)
            if wrapper is None:
                setattr(ns, name, f)
            else:
                setattr(ns, name, functools.partial(self._visit, wrapper, f.base_func, name))
        return ns

    def _visit(self, wrapper, func, name, children):
        return wrapper(func, name, children, self.meta())

    def positioned(self, callbacks: dict) -> None:
        """Wrap the callback of each rule whose method needs positions beyond its children
        (a `v_args(meta=True)` method, or one marked `_punctuated`), so that the rule's raw
        children -- its punctuation included, before lark drops it -- are at hand while the
        method runs (`self.raw`, read by `meta()`). The other rules run unwrapped."""
        names = set()
        for n in vars(type(self)):
            f = getattr(type(self), n)
            if getattr(f, "visit_wrapper", None) is not None or getattr(f, "punctuated", False):
                names.add(n)
        for rule, cb in list(callbacks.items()):
            if isinstance(rule, str):  # a terminal's lexer callback
                continue
            if (rule.alias or rule.options.template_source or rule.origin.name) in names:
                callbacks[rule] = functools.partial(self._with_raw, cb)

    def _with_raw(self, cb, children):
        self.raw = children
        return cb(children)

    def _raw_span(self) -> Span:
        """The span from the first to the last token the rule matched (both are tokens in the
        punctuated rules: a name or bracket first, a bracket or name last)."""
        first, last = self.raw[0], self.raw[-1]
        if isinstance(first, Token) and isinstance(last, Token) and first.line is not None and last.end_line is not None:
            return Span(first.line, first.column, last.end_line, last.end_column)
        return _span(self.meta())  # a token that error recovery inserted (the tree is dropped then)

    def _checked_number(self, tok: Token, text: str) -> int | float:
        # only an exponent or 300+ digits can overflow a float (10**300 does not)
        if (len(text) > 300 or "e" in text or "E" in text) and math.isinf(float(text)):  # also keeps int() from refusing a 5000-digit literal
            self.too_large.append(tok)
            return 0
        return _number(text)

    def start(self, children):
        return A.SoakFile(tuple(children))

    @_punctuated
    def block(self, children):
        kind_tok = children[0]
        rest = children[1:]
        label = None
        if rest and isinstance(rest[0], A.Str):
            label, rest = rest[0], rest[1:]
        return A.Block(str(kind_tok), label, tuple(rest), span=self._raw_span(), kind_span=_tok_span(kind_tok))

    def label(self, children):
        return children[0]

    def attribute(self, children):
        key, value = children
        return A.Attribute(str(key), value, span=_between(key, value.span), key_span=_tok_span(key))

    def claim(self, children):
        kw, text = children
        return A.Claim(str(kw), text, span=_between(kw, text.span))

    def rule(self, children):
        severity = str(children[0])
        expr = children[1]
        op = threshold = scope = target = None
        rest = list(children[2:])
        if rest and isinstance(rest[0], Token) and rest[0].type == "COMPARATOR":
            op = str(rest.pop(0))
            threshold = rest.pop(0)
        for item in rest:
            if isinstance(item, A.Scope):
                scope = item
            elif isinstance(item, A.Str):
                target = item
        last = children[-1]
        return A.Rule(severity, expr, op, threshold, scope, target, span=_between(children[0], last if isinstance(last, Token) else last.span))

    @_punctuated
    def scope(self, children):
        kind = str(children[0])
        length = children[1] if len(children) > 1 else None
        if isinstance(length, Token):
            length = self._quantity_tok(length)
        return A.Scope(kind, length, span=self._raw_span())

    def target(self, children):
        return children[0]

    @_punctuated
    def call(self, children):
        name, arg = children
        return A.Call(str(name), arg, span=self._raw_span())

    @_punctuated
    def multi_call(self, children):
        name, *args = children
        return A.MultiCall(str(name), tuple(args), span=self._raw_span())

    @v_args(meta=True)
    def slo_call(self, meta, children):
        name, *conds = children
        return A.SloCall(str(name), tuple(c for c in conds if isinstance(c, A.Slo)), span=_span(meta))

    @v_args(meta=True)
    def slo(self, meta, children):
        name, op, value = children
        return A.Slo(str(name), str(op), value, span=_span(meta))

    @v_args(meta=True)
    def named_ref(self, meta, children):
        name, text = children
        return A.NamedRef(str(name), text.value, span=_span(meta))

    def metric_ref(self, children):
        return A.MetricRef(str(children[0]), span=_tok_span(children[0]))

    def string(self, children):
        tok = children[0]
        text = str(tok)
        if tok.type == "RAW_STRING":
            self.raw_strings.add(tok.start_pos)
            return A.Str(text[2:-1], "raw", span=_tok_span(tok))
        quote = 3 if tok.type == "LONG_STRING" else 1
        value, bad = _unescape(text[quote:-quote])
        for offset, length, what in bad:
            self.bad_escapes.append((tok, quote + offset, length, what))
        return A.Str(value, "long" if quote == 3 else "plain", span=_tok_span(tok))

    def number(self, children):
        tok = children[0]
        return A.Num(self._checked_number(tok, str(tok)), span=_tok_span(tok))

    def quantity(self, children):
        return self._quantity_tok(children[0])

    @_punctuated
    def counted(self, children):
        """`20 requests`: a count written with its word after a space, the same quantity as
        `20requests` (fmt writes it spaced: `fmt.value_text`)."""
        number, word = self.raw[0], self.raw[-1]
        return A.Quantity(self._checked_number(number, str(number)), str(word), span=self._raw_span())

    def _quantity_tok(self, tok: Token) -> A.Quantity:
        m = _QUANTITY_RE.fullmatch(str(tok))
        assert m is not None  # the lexer guarantees the shape
        return A.Quantity(self._checked_number(tok, m.group(1)), m.group(2), span=_tok_span(tok))

    @_punctuated
    def true(self, children):
        return A.Bool(True, span=self._raw_span())

    @_punctuated
    def false(self, children):
        return A.Bool(False, span=self._raw_span())

    def word(self, children):
        tok = children[0]
        return A.Word(str(tok), span=_tok_span(tok))

    @_punctuated
    def list(self, children):
        return A.List(tuple(c for c in children if c is not None), span=self._raw_span())


_BUILDER_API = frozenset({"reset", "meta", "callbacks", "positioned", "transform"})
_BUILDER = _ToAst()
_PARSE_LOCK = threading.Lock()


# ---------------------------------------------------------------- comments


class _Comment:
    __slots__ = ("line", "column", "text", "used")

    def __init__(self, tok: Token):
        self.line = tok.line
        self.column = tok.column
        self.text = str(tok)[1:].rstrip()
        if self.text.startswith(" "):
            self.text = self.text[1:]
        self.used = False


def _stmt_lines(stmt) -> tuple[int, int, int]:
    s = stmt.span
    return s.line, s.end_line, s.end_column


def _attach(body: tuple, comments: list[_Comment], end_line: int | None) -> tuple[tuple, tuple[str, ...]]:
    """Attach comments (sorted, all lying inside this body's region) to statements."""
    out = []
    ci = 0
    n = len(comments)
    for idx, stmt in enumerate(body):
        start, end, end_col = _stmt_lines(stmt)
        leading = []
        while ci < n and comments[ci].line < start:
            leading.append(comments[ci].text)
            ci += 1
        inner = []
        while ci < n and comments[ci].line <= end and not (
            comments[ci].line == end and comments[ci].column >= end_col
        ):
            inner.append(comments[ci])
            ci += 1
        trailing = None
        next_start = _stmt_lines(body[idx + 1])[0] if idx + 1 < len(body) else None
        if ci < n and comments[ci].line == end and next_start != end:
            trailing = comments[ci].text
            ci += 1
        if isinstance(stmt, A.Block):
            inner_body, closing = _attach(stmt.body, inner, end)
            stmt = _replace(stmt, body=inner_body, closing_comments=closing, comments=tuple(leading), trailing=trailing)
        else:
            # Comments inside a multi-line attribute (a long list) move above it.
            leading.extend(c.text for c in inner)
            stmt = _replace(stmt, comments=tuple(leading), trailing=trailing)
        out.append(stmt)
    closing = tuple(c.text for c in comments[ci:] if end_line is None or c.line <= end_line)
    return tuple(out), closing


def _replace(obj, **changes):
    return dataclasses.replace(obj, **changes)


# ---------------------------------------------------------------- entry points


_NOT_CODE = re.compile(_LONG + r'|(?<![A-Za-z0-9_.\-])r"[^"\n]*"|' + _STR + r'|#[^\n]*', re.S)  # strings, comments
_BRACKET = re.compile(r"[{}\[\]()]")


def _nesting_depth(text: str) -> tuple[int, int]:
    """How deep the brackets outside strings and comments nest, and the offset of the first
    bracket that opens a level beyond MAX_NESTING (-1: none does)."""
    depth = best = 0
    first = -1
    pos = 0
    for m in [*_NOT_CODE.finditer(text), None]:
        end = m.start() if m is not None else len(text)
        for b in _BRACKET.finditer(text, pos, end):
            if b.group() in "{[(":
                depth += 1
                if depth > best:
                    best = depth
                    if depth > MAX_NESTING and first < 0:
                        first = b.start()
            else:
                depth -= 1
        if m is not None:
            pos = m.end()
    return best, first



def _blank(text: str, start: int, end: int) -> str:
    """Replace text[start:end] by spaces, keeping newlines (so line/col stay valid)."""
    seg = "".join("\n" if c == "\n" else " " for c in text[start:end])
    return text[:start] + seg + text[end:]


def _guard(text: str, path: str) -> Diagnostic | None:
    """Refuse, before parsing, what no spec can be: too large, binary, too deeply nested."""
    if len(text.encode("utf-8", "surrogatepass")) > MAX_SOURCE_BYTES:
        return Diagnostic("E010", f"spec is larger than {MAX_SOURCE_BYTES // 1000} kB; refusing to parse it", Span(1, 1, 1, 2), path)
    if "\0" in text:
        line, col = line_col(text, text.index("\0"))
        return Diagnostic("E003", "spec contains a NUL byte (is it a binary file?)", Span(line, col, line, col + 1), path)
    depth, at = _nesting_depth(text)
    if depth > MAX_NESTING:
        line, col = line_col(text, at)  # the bracket that opens the first level too many
        return Diagnostic("E011", f"spec nests {depth} levels deep; at most {MAX_NESTING} are allowed", Span(line, col, line, col + 1), path)
    return None


@contextlib.contextmanager
def gc_paused():
    """No cyclic garbage collection inside: parsing a large spec creates some hundred thousand
    objects that all survive (tokens, nodes, spans, none of them in a cycle), and each of the
    collector's passes over the growing heap found nothing to free -- a third of the parse's
    time on a 1 MB spec. Reference counting still frees everything as usual; the collector is
    re-enabled (if it was) on the way out."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


BOM = "\ufeff"


def source_text(text: str) -> str:
    """The spec as the parser reads it, and as its diagnostics' positions count: without a
    leading BOM, CRLF line breaks as LF (no position moves: a dropped '\\r' ends its line, and
    line 1's columns are counted after the BOM); in a file with no LF at all, every CR is a line
    break (a classic Mac OS file), so that its errors point at their own lines, not at one line
    holding the whole file. A lone CR in a file that has LF breaks is a character (of a string)."""
    if text.startswith(BOM):
        text = text[1:]
    if "\r" not in text:
        return text
    if "\n" not in text:
        return text.replace("\r", "\n")
    return text.replace("\r\n", "\n")


def decode_source(raw: bytes, path: str) -> tuple[str | None, Diagnostic | None]:
    """A spec's bytes (a file's, stdin's) as text, BOM and line endings as written; or E010
    when they are too many, E003 when they are not UTF-8."""
    if len(raw) > MAX_SOURCE_BYTES:
        return None, Diagnostic("E010", f"spec is larger than {MAX_SOURCE_BYTES // 1000} kB; refusing to parse it", Span(), path)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        line_start = raw.rfind(b"\n", 0, e.start) + 1
        line = raw.count(b"\n", 0, e.start) + 1
        col = len(raw[line_start : e.start].decode("utf-8", "replace")) + 1  # characters before the bad byte
        return None, Diagnostic("E003", f"spec is not valid UTF-8 (byte 0x{raw[e.start]:02x})", Span(line, col, line, col + 1), path)
    return text, None


def parse(text: str, path: str = "<string>") -> tuple[A.SoakFile | None, list[Diagnostic]]:
    """Parse .soak source. Returns the tree (None if there were syntax errors) and diagnostics.

    A leading byte-order mark is not part of the spec (positions are counted without it, as
    `parse_file` returns the text), and a CRLF line break (or the CR of a CR-only file) reads as
    LF everywhere -- inside a long string too -- so that a spec saved by a Windows editor means,
    hashes and formats the same as the one it was copied from (`source_text`)."""
    text = source_text(text)
    refused = _guard(text, path)
    if refused is not None:
        return None, [refused]
    syntax = _Syntax(text, path)
    with _PARSE_LOCK, gc_paused():
        soak = syntax.run()
        too_large, bad_escapes, raw_strings = _BUILDER.too_large, _BUILDER.bad_escapes, _BUILDER.raw_strings
        _BUILDER.reset()
    if soak is None or syntax.diags:
        return None, syntax.diags
    literals = [(tok.line, tok.column, "E001", f"number {_describe_token(tok)} is too large", tok.end_column if tok.end_line == tok.line else None, None)
                for tok in too_large]  # fmt: skip
    literals += [_escape_error(*bad) for bad in bad_escapes]
    for line, col, code, msg, end_col, hint in sorted(literals, key=lambda d: d[:2]):
        syntax.add(code, msg, line, col, end_col, hint)
    if syntax.diags:
        return None, syntax.diags
    cs = sorted((_Comment(c) for c in _comment_tokens(text, raw_strings)), key=lambda c: (c.line, c.column))
    if not cs:
        return soak, []
    body, closing = _attach(soak.body, cs, None)
    return A.SoakFile(body, closing), []


def _escape_error(tok: Token, offset: int, length: int, what: str) -> tuple[int, int, str, str, int, str]:
    """E006 for an invalid escape `offset` characters into the string `tok` (a long string's
    escape may be lines below its opening quotes): (line, col, code, message, end col, hint)."""
    before = str(tok)[:offset]
    newlines = before.count("\n")
    col = tok.column + offset if not newlines else offset - before.rfind("\n")
    return tok.line + newlines, col, "E006", what, col + length, _ESCAPES_HINT


class _Syntax:
    """One parse with error recovery. Syntax errors are all collected in one pass: an
    unexpected character is replaced (positions kept) and the text parsed again; after an
    unexpected token the parser skips or repairs it and resumes; an unescaped quote inside a
    string is reported once and mended before anything that followed from it. At most one
    error is reported per line."""

    def __init__(self, text: str, path: str):
        self.source = text
        self.quotes = _QuoteScan()
        self.checkpoints: list = []  # the fast parser's states before its first error (`changed` drops the stale)
        self.path = path
        self.diags: list[Diagnostic] = []
        self.errored_lines: set[int] = set()
        self.swallowed = False  # an unterminated '"""' ran to the end of the file
        self.restart = False  # the source was mended: parse it again

    def add(self, code: str, msg: str, line: int, col: int, end_col: int | None = None, hint: str | None = None) -> None:
        if line in self.errored_lines or len(self.diags) >= MAX_SYNTAX_ERRORS:
            return
        self.errored_lines.add(line)
        self.diags.append(Diagnostic(code, msg, Span(line, col, line, end_col or col + 1), self.path, hint=hint))

    def run(self):
        lark = _parser()
        resume = None
        for _attempt in range(MAX_SYNTAX_ERRORS + 2):
            self.restart = False
            try:
                if resume is not None:
                    return self.recover(resume)
                return self.parse_once(lark)
            except UnexpectedCharacters as e:
                resume = None
                if not (self.restart or self.mend_quote(e.line)):
                    resume = self.resumable(e, self.lex_error(e))
            except (UnexpectedEOF, UnexpectedToken) as e:
                resume = None
                if self.restart or self.mend_quote(self.last_line):
                    continue
                if isinstance(e, UnexpectedEOF) or e.token.type == "$END":
                    self.eof_error()
                return None
            except UnexpectedInput as e:  # pragma: no cover - other lark errors
                self.add("E001", f"syntax error: {e.__class__.__name__}", e.line, e.column)
                return None
            except VisitError as e:  # pragma: no cover - a transformer bug, surface the original
                raise e.orig_exc from None
        return None  # pragma: no cover

    def parse_once(self, lark: Lark):
        """One parse of the source: `Lark.parse(source, on_error=self.on_error)`, with the
        error-free prefix parsed by `_fast_parse`."""
        _BUILDER.reset()
        fast = _fast_parse(lark, self.source, self.checkpoints)
        if fast is _NOT_FAST:  # pragma: no cover - another lark
            return lark.parse(self.source, on_error=self.on_error)
        if not isinstance(fast, _Stuck):
            return fast
        return self.recover(fast.resume)

    def recover(self, parse):
        """lark's `LALR_Parser.parse` error loop around `parse()`: each error goes to
        `on_error`, and parsing resumes where it says."""
        try:
            return parse()
        except UnexpectedInput as e:
            while True:
                if isinstance(e, UnexpectedCharacters):
                    s = e.interactive_parser.lexer_thread.state
                    p = s.line_ctr.char_pos
                if not self.on_error(e):
                    raise e
                if isinstance(e, UnexpectedCharacters):  # pragma: no cover - on_error refuses these
                    if p == s.line_ctr.char_pos:
                        s.line_ctr.feed(s.text.text[p : p + 1])
                try:
                    return e.interactive_parser.resume_parse()
                except UnexpectedToken as e2:
                    if isinstance(e, UnexpectedToken) and e.token.type == e2.token.type == "$END" and e.interactive_parser == e2.interactive_parser:
                        raise e2 from None
                    e = e2
                except UnexpectedCharacters as e2:
                    e = e2

    @property
    def last_line(self) -> int:
        return self.source.count("\n") + 1

    def on_error(self, e: UnexpectedInput) -> bool:
        if isinstance(e, UnexpectedCharacters):
            return False  # handled in run() by replacing the character and parsing again
        at_end = e.token.type == "$END"
        if not at_end and e.token.line in self.errored_lines:
            self.drop_stranded_word(e)  # `... per level }`: the '}' still closes the block
            return True  # this line has its error: drop the token, cheaply (no copy of the parser)
        if (self.mend_quote(self.last_line if at_end else e.token.line) or (not at_end and self.mend_equals(e))
                or self.mend_unit_space(len(self.source) if at_end else e.token.start_pos)):
            self.restart = True
            return False
        if self.drop_stranded_word(e):
            return len(self.diags) < MAX_SYNTAX_ERRORS
        if at_end:
            self.eof_error()
            return False
        if not _ended_too_soon(e, self.source, self.add, self.errored_lines):
            _token_error(e, self.source, self.add)
            _repair(e, self.source)
        return len(self.diags) < MAX_SYNTAX_ERRORS

    def mend_quote(self, upto_line: int) -> bool:
        """`"say "hi" now"`: report the unescaped quote, and make the line one string."""
        found = self.quotes.find(self.source, upto_line)
        if found is None:
            return False
        inner, last = found
        line = self.source.count("\n", 0, inner) + 1
        col = inner - (self.source.rfind("\n", 0, inner) + 1) + 1
        if self.source[inner - 1] == "\\":  # a raw string's `\\"` (a plain string's is an escape)
            opening = self.source.rfind('"', 0, inner)
            fixed = 'r"' + self.source[opening + 1 : last].replace('\\"', "\\x22") + '"'
            hint = (f"match a quote with \\x22 in a pattern: {fixed} (a raw string takes every character as written, up to "
                    "its first '\"'; in a plain string \\\" is a quote and \\\\ a backslash)")
            self.add("E005", "a raw string ends at this '\"': the backslash before it does not escape it", line, col, hint=hint)
        else:
            hint = 'escape a quote inside a string as \\" (or write the string as """...""")'
            self.add("E005", "unescaped '\"' inside a string: the string ends here", line, col, hint=hint)
        mended = self.source[inner:last].replace('"', "'")
        self.source = self.source[:inner] + mended + self.source[last:]
        self.changed(inner)
        return True

    def mend_equals(self, e: UnexpectedToken) -> bool:
        """`issue "x"` on a line of its own: the parser took it for a block header (`backend
        "b" {`) and reports the next line ("expected '{'"), then every line after. When the
        unexpected token starts a line, '{' was expected, and the line before is a key (not a
        block kind that takes a name) and a string alone, report the missing '=' there and
        write it into the space before the string (the source keeps its length)."""
        tok = e.token
        if "LBRACE" not in set(e.accepts or e.expected or ()) or not _first_on_line(tok, self.source):
            return False
        end = self.source.rfind("\n", 0, tok.start_pos)
        start = self.source.rfind("\n", 0, max(end, 0)) + 1
        m = _KEY_THEN_STRING.fullmatch(self.source, start, max(end, 0))
        if m is None or m.group("key") in _NAMED_BLOCKS or self.source.count("\n", 0, start) + 1 in self.errored_lines:
            return False
        line = self.source.count("\n", 0, start) + 1
        col = m.start("value") - start + 1
        self.add("E001", f"missing '=' between '{m.group('key')}' and its value", line, col,
                 hint=f"a key and its value are written with '=': {m.group('key')} = {m.group('value')}")
        gap = m.start("value") - 1  # the last blank before the string
        self.source = self.source[:gap] + "=" + self.source[gap + 1 :]
        self.changed(gap)
        return True

    def mend_unit_space(self, upto: int | None) -> bool:
        """`duration = 8 s`: the number ends the value and the unit starts a new statement, so
        the error lands on the next line ("unexpected 'bucket'") or at the end of the file.
        When a number and a unit word stand apart at the end of a value (before the line's
        end, a comment, ',' or a closing bracket) before the error, outside strings and
        comments, report that unit and write it onto its number (the line keeps its length)."""
        for m in _UNIT_APART.finditer(self.source, 0, len(self.source) if upto is None else upto):
            line_start = self.source.rfind("\n", 0, m.start()) + 1
            before = self.source[line_start:m.start()]
            line = self.source.count("\n", 0, m.start()) + 1
            if "#" in before or before.count('"') % 2 or line in self.errored_lines:
                continue
            number, gap, unit = m.group(1), m.group(2), m.group(3)
            col = m.start(3) - line_start + 1
            self.add("E001", f"unit '{unit}' stands apart from its number {number}", line, col, col + len(unit),
                     hint=f"write the unit right after the number, without a space: {number}{unit}")
            self.source = self.source[:m.start(2)] + unit + gap + self.source[m.end(3):]
            self.changed(m.start(2))
            return True
        return False

    def drop_stranded_word(self, e: UnexpectedToken) -> bool:
        """A word the parse took to start a statement, though it only followed a value on its
        line: `tokens` in `require p95(ttft) < 100 tokens`, `seconds` in `duration = 10
        seconds`, `_000_000` in `requests = 1_000_000`, `level` left over from `... on "a" per
        level` once 'per' was reported. Nothing after it can go on with it (a statement
        starting with a word wants '=', '{' or a name string next), so without this every line
        below it until a '=' was 'unexpected'. Report a word right after a number at the word
        (unless its line has its error already), drop the word from the parse, and go on with
        the token as if the word had not been written."""
        ip, tok = e.interactive_parser, e.token
        if ip is None:
            return False
        state = ip.parser_state
        word = state.value_stack[-1] if state.value_stack else None
        if not (isinstance(word, Token) and word.type == "NAME" and word.line is not None) or _first_on_line(word, self.source):
            return False
        if not set(e.accepts or e.expected or ()) <= _STATEMENT_GOES_ON:
            return False  # not a word at a statement's start
        at_end = tok.type == "$END"
        if word.line in self.errored_lines:
            report = None
        else:
            # the word ends what its line says: the token after it is on a later line, closes a
            # bracket or goes on with a rule (`100 tokens per level`)
            if not (at_end or tok.line > word.line or tok.type in _AFTER_A_VALUE):
                return False
            report = _word_after_number(self.source, word)
            if report is None:
                return False
        trial = ip.copy(deepcopy_values=False)
        del trial.parser_state.state_stack[-1], trial.parser_state.value_stack[-1]
        fits = at_end
        if not at_end:
            try:
                trial.feed_token(tok)
                fits = True
            except UnexpectedInput:
                pass
        if not fits and tok.line > word.line:
            return False  # the next line has a mistake of its own: report that one
        if report is not None:
            self.add("E001", report[0], word.line, word.column, word.end_column, hint=report[1])
        del state.state_stack[-1], state.value_stack[-1]
        if fits and not at_end:
            ip.feed_token(tok)
        return True

    def lex_error(self, e: UnexpectedCharacters) -> int:
        """Report it and mend the source; returns where the mended span starts."""
        start, end, filler = _lex_error(e, self.source, self.add)
        self.swallowed = self.swallowed or (end == len(self.source) and self.source.startswith('"""', start))
        self.source = self.source[:start] + filler + self.source[end:]
        self.changed(start)
        return start

    def changed(self, pos: int) -> None:
        """The source was mended from `pos` on: what was saved about the text after the start
        of that line is stale."""
        self.quotes.changed(self.source, pos)
        line_start = self.source.rfind("\n", 0, pos) + 1
        while self.checkpoints and self.checkpoints[-1][0] >= line_start:
            self.checkpoints.pop()

    def resumable(self, e: UnexpectedCharacters, start: int):
        """After a lexer error mended at or after where the lexer stopped (and not right after
        the last token, which the mend could join), the parse goes on from there over the
        mended source, instead of parsing the file again from its first line: the same tokens
        before it, the same state."""
        ip = getattr(e, "interactive_parser", None)
        if ip is None or start < e.pos_in_stream:
            return None
        state = ip.lexer_thread.state
        if state.line_ctr.char_pos != e.pos_in_stream or not hasattr(state.text, "text"):
            return None  # pragma: no cover - not where lark left it
        last = state.last_token
        if last is not None and last.end_pos is not None and last.end_pos >= start:
            return None  # the mend may join the token before it (`t@ue` -> `t_ue`): lex that again
        state.text = type(state.text)(self.source, 0, len(self.source))
        return ip.resume_parse

    def eof_error(self) -> None:
        if not self.swallowed:  # an unterminated '"""': what is left open there is its doing
            _eof_error(self.source, self.add)


_STRINGS_AND_COMMENTS = re.compile(
    rf'(?P<long>{_LONG})|(?P<raw>(?<![A-Za-z0-9_.\-])r"[^"\n]*")|(?P<str>{_STR})|(?P<comment>#[^\n]*)',
    re.S,
)


class _QuoteScan:
    """`_unescaped_quote`, resumable: error recovery asks it once per error, and a scan from
    the top of the file each time made a 1 MB spec with 50 errors near its end take a minute.
    Scanning resumes at the last checkpoint -- the end of a string or comment already found
    not to be the answer, on a line before any the recovery has changed since (the source is
    only ever changed in place, keeping its length: `changed` drops the later checkpoints) --
    with the same regex and the same rule, so the answer is `_unescaped_quote`'s."""

    def __init__(self):
        self.ends = [0]  # positions the scan may resume at (each the end of a match, or 0)
        self.lines = [1]  # the line each of those positions is on

    def changed(self, source: str, pos: int) -> None:
        line_start = source.rfind("\n", 0, pos) + 1
        keep = bisect.bisect_left(self.ends, line_start)
        del self.ends[max(keep, 1) :], self.lines[max(keep, 1) :]

    def find(self, source: str, upto_line: int) -> tuple[int, int] | None:
        pos, line = self.ends[-1], self.lines[-1]
        while True:
            # A string or comment starts at a '"' or '#' (a raw string one before its '"'):
            # when the next one is past the line asked about, so is the answer (found in C,
            # not by the regex trying every position of what may be a megabyte of text).
            quote, hash_ = source.find('"', pos), source.find("#", pos)
            nxt = min(x for x in (quote, hash_, len(source)) if x >= 0)
            if nxt >= len(source) or line + source.count("\n", pos, nxt) > upto_line:
                return None
            m = None
            if nxt - 1 >= pos and source[nxt - 1] == "r":
                m = _STRINGS_AND_COMMENTS.match(source, nxt - 1)
            if m is None:
                m = _STRINGS_AND_COMMENTS.match(source, nxt)
            if m is None:  # a quote that starts nothing (an unterminated string): step over it
                line += source.count("\n", pos, nxt + 1)
                pos = nxt + 1
                continue
            end = m.end()
            line += source.count("\n", pos, end)
            pos = end
            if line > upto_line:
                return None  # whatever comes next is past the line asked about
            if _string_ends_too_soon(m, source):
                line_end = source.find("\n", end)
                last = source.rfind('"', end, len(source) if line_end < 0 else line_end)
                if last >= 0:
                    return end - 1, last
            if line != self.lines[-1]:  # one checkpoint a line is enough
                self.ends.append(end)
                self.lines.append(line)
        return None


def _string_ends_too_soon(m: re.Match, source: str) -> bool:
    """Does the string `m` (a `_STRINGS_AND_COMMENTS` match) end at a quote the writer meant
    inside it? A plain string a word follows without a space (`"say "hi" now"`; not `["a,
    "b"]`, a missing quote), or a raw string ending in `\\"` that something other than a blank,
    ',' or a bracket follows (`r"v(\\d+)\\"?"`: a backslash does not escape a raw string's quote)."""
    end = m.end()
    if end >= len(source):
        return False
    if m.lastgroup == "str":
        return (source[end].isalnum() or source[end] == "_") and not m.group().rstrip('" \t').endswith(",")
    return m.lastgroup == "raw" and m.group().endswith('\\"') and source[end] not in ' \t\n,]})#'


def _unescaped_quote(source: str, upto_line: int) -> tuple[int, int] | None:
    """The first string (on a line up to `upto_line`) that a word follows without a space,
    with another '"' later on its line: `"say "hi" now"`. Returns (position of the quote that
    ended the string too early, position of the last '"' on the line)."""
    for m in _STRINGS_AND_COMMENTS.finditer(source):
        if not _string_ends_too_soon(m, source):
            continue
        end = m.end()
        if source.count("\n", 0, end) + 1 > upto_line:
            return None
        line_end = source.find("\n", end)
        last = source.rfind('"', end, len(source) if line_end < 0 else line_end)
        if last >= 0:
            return end - 1, last
    return None


def _comment_tokens(source: str, raw_strings: set[int] | None = None) -> list[Token]:
    """Comments with their positions. Strings are matched first, since they may contain '#'.
    Only called on text that parsed, so every string here is well formed. `raw_strings`: the
    offsets where the lexer read a raw string; an `r"` anywhere else is a name `r` before a
    string (`r"a\\" # b" {}`: a block `r` whose label holds `\\"` and '#'; read as a raw
    string, it would end at the `\\"` and make a comment of the label's rest)."""
    found: list[Token] = []
    line_starts = [0]
    for m in re.finditer("\n", source):
        line_starts.append(m.end())
    pos = 0
    while (m := _STRINGS_AND_COMMENTS.search(source, pos)) is not None:
        pos = m.end()
        if m.lastgroup == "raw" and raw_strings is not None and m.start() not in raw_strings:
            pos = m.start() + 1  # the name `r`: the string starts at its '"'
            continue
        if m.lastgroup != "comment":
            continue
        at = m.start()
        line = bisect.bisect_right(line_starts, at)
        col = at - line_starts[line - 1] + 1
        tok = Token("COMMENT", m.group(), start_pos=at, line=line, column=col)
        found.append(tok)
    return found


# What the parse may want after a word that starts a statement: '=' (a key), '{' or a name (a block).
_STATEMENT_GOES_ON = frozenset({"EQUAL", "LBRACE", "STRING", "RAW_STRING", "LONG_STRING"})
# Tokens that end a value or go on with a rule after one, on the value's line.
_AFTER_A_VALUE = frozenset({"RBRACE", "RSQB", "RPAR", "COMMA", "PER", "ON", "COMPARATOR"})
# a number at the end of the text before a word on its line, and the blanks between them
_NUMBER_THEN_BLANKS = re.compile(r"(?<![\w.\-])(-?[0-9]+(?:\.[0-9]+)?(?:[eE][-+]?[0-9]+)?)([ \t]*)$")


def _word_after_number(source: str, word: Token) -> tuple[str, str] | None:
    """(message, hint) for a word right after a number on its line (`100 tokens`, `10
    seconds`, `1_000_000`, read as the number 1 and the name `_000_000`), or None when no
    number is before it (outside a string or comment)."""
    line_start = source.rfind("\n", 0, word.start_pos) + 1
    before = source[line_start : word.start_pos]
    if "#" in before or before.count('"') % 2:
        return None
    m = _NUMBER_THEN_BLANKS.search(before)
    if m is None:
        return None
    number, gap, text = m.group(1), m.group(2), str(word)
    if not gap:
        if not text.startswith("_"):
            return None  # pragma: no cover - the lexer reads `100tokens` as one quantity
        written = number + text
        plain = written.replace("_", "")
        return (f"'_' does not group digits: {written} is read as the number {number} and the name {text!r}",
                f"write the number without '_': {plain}")
    unit = unit_for_word(text)
    if unit is not None:
        return (f"unexpected {text!r} after the number {number}",
                f"write the unit right after the number, without a space: {number}{unit}")
    return (f"unexpected {text!r} after the number {number}: it is not a unit",
            f"a value is one word: a count is a plain number ({number}), a quantity is a number with its unit right "
            f"after it ({number}ms); the units are {units_listed()}")


# a number and a unit word apart at the end of a value (`mend_unit_space`)
_UNIT_APART = re.compile(r"(?<![\w.\-])(-?[0-9]+(?:\.[0-9]+)?)([ \t]+)(" + "|".join(
    sorted((u for u in UNITS if u.isalpha()), key=len, reverse=True)) + r")(?![\w.])(?=[ \t]*(?:#[^\n]*)?$|[ \t]*[\],)}])", re.M)


def _token_error(e: UnexpectedToken, source: str, add) -> None:
    tok = e.token
    expected = set(e.accepts or e.expected or ())
    if tok.type == "$END":
        return
    text = str(tok)
    hint = None
    close = _closer_left_open(e, source, expected)
    if close is not None:  # `max_tokens = [16, 32` then the next key: report where the line ends
        line, col = _code_line_end(source, tok.start_pos)
        what = "list" if close == "]" else "parenthesis"
        add("E001", f"missing '{close}': the {what} is not closed at the end of this line", line, col,
            hint=f"close the {what} with '{close}' before the line ends")
        return
    if tok.type in ("NUMBER", "QUANTITY") and "EQUAL" in expected:
        hint = "did you forget '=' between a key and its value?"
    elif tok.type == "NAME" and (after_number := _word_after_number(source, tok)) is not None:  # `[2 tokens]`
        add("E001", after_number[0], tok.line, tok.column, tok.end_column, after_number[1])
        return
    elif tok.type == "NAME" and text.lower() in ("or", "and") and "SLO_AND" in expected:
        if text == "or":
            add("E001", "goodput's conditions cannot be joined with 'or'", tok.line, tok.column, tok.end_column,
                "goodput counts the requests that meet every condition, joined with 'and'; there is no 'or' (a rule "
                "for each condition checks each on its own)")
        else:
            add("E001", f"unexpected {text!r}", tok.line, tok.column, tok.end_column, "write 'and' in lower case")
        return
    elif tok.type == "QUANTITY" and (compound := _compound_duration(source, tok)) is not None:  # `1h30m`
        add("E001", compound[0], compound[2], compound[3], tok.end_column, compound[1])
        return
    elif tok.type in ("STRING", "RAW_STRING") and re.match(r"[ \t]*=(?!=)", source[tok.end_pos :]) and "NAME" in expected:
        key = str(tok)[2 if tok.type == "RAW_STRING" else 1 : -1]
        hint = (f"a key is written without quotes: {key} = ..." if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_.\-]*", key)
                else "a key is a name (letters, digits, '_', '.', '-'; not starting with a digit), written without quotes")
    elif tok.type == "PER" and (order := _scope_after_target(e, source)) is not None:
        add("E001", order[0], tok.line, tok.column, tok.end_column, order[1])
        return
    elif tok.type == "QUANTITY" and re.search(r"\bper[ \t]+$", source[source.rfind("\n", 0, tok.start_pos) + 1 : tok.start_pos]):
        hint = f"a scope of a length is a window: per window {text}"
    elif text == "=" and source[tok.end_pos : tok.end_pos + 1] in ("<", ">") and "COMPARATOR" in expected:  # `=<`, `=>`
        written = "=" + source[tok.end_pos]
        add("E001", f"unexpected {written!r}", tok.line, tok.column, tok.column + 2,
            f"write {written[::-1]!r}: a comparison is written with '=' second (<=, >=)")
        return
    elif text == "=" and re.match(r"[ \t]*(?:require|warn|abort)\b", source[source.rfind("\n", 0, tok.start_pos) + 1:tok.start_pos]):
        hint = "a rule compares with '==' (or !=, <, <=, >, >=): '=' gives a key its value"
    add(
        "E001",
        f"unexpected {_describe_token(tok)}{_describe_expected(expected, e.interactive_parser)}",
        tok.line,
        tok.column,
        tok.column + max(1, len(text)) if tok.end_line == tok.line else None,
        hint,
    )


_SCOPE_TEXT = re.compile(r"per[ \t]+[A-Za-z_][A-Za-z0-9_.\-]*(?:[ \t]+-?[0-9][0-9.eE+\-]*[A-Za-z%]+)?")


_QUANTITY_BEFORE = re.compile(r"(?<![\w.\-])(-?[0-9]+(?:\.[0-9]+)?)([A-Za-z]+)[ \t]*$")


def _compound_duration(source: str, tok: Token) -> tuple[str, str, int, int] | None:
    """(message, hint, line, column) for a duration written in two units, `1h30m` or `1h 30m`:
    the lexer reads `1h` as the value and `30m` as a token no statement starts with. The
    hint writes the sum in the largest unit that holds it whole (90m)."""
    line_start = source.rfind("\n", 0, tok.start_pos) + 1
    first = _QUANTITY_BEFORE.search(source, line_start, tok.start_pos)
    m = _QUANTITY_RE.fullmatch(str(tok))
    if first is None or m is None:
        return None
    parts = [(first.group(1), first.group(2)), (m.group(1), m.group(2))]
    if any(UNITS.get(unit, (None,))[0] is not Dimension.DURATION for _, unit in parts):
        return None
    total = sum(float(n) * UNITS[unit][1] for n, unit in parts)
    if not math.isfinite(total):  # `3600m1e999s`: no sum to suggest (round(inf) raised OverflowError)
        return None
    written = source[first.start() : tok.end_pos]
    for unit in ("h", "m", "s", "ms", "us"):
        n = total / UNITS[unit][1]
        if abs(n - round(n)) < 1e-9 * max(1.0, abs(n)):
            break
    col = first.start() - line_start + 1
    return (f"compound duration {written!r} is not supported: a duration is one number and one unit",
            f"write {round(n)}{unit}", tok.line, col)


def _scope_after_target(e: UnexpectedToken, source: str) -> tuple[str, str | None] | None:
    """(message, hint) for `... on "a" per level`: the grammar takes the scope before the
    target (`rule: SEVERITY expr (COMPARATOR value)? scope? target?`), so a 'per' right after
    the parse read `on "name"` is in the wrong order; the hint writes the rule in the right one."""
    ip, tok = e.interactive_parser, e.token
    stack = ip.parser_state.value_stack if ip is not None else ()
    if len(stack) < 2 or not (isinstance(stack[-2], Token) and stack[-2].type == "ON") or not isinstance(stack[-1], A.Str):
        return None
    on = stack[-2]
    target = source[on.start_pos : tok.start_pos].strip()
    message = f"'per' after '{target}': a rule's scope comes before its backend"
    severity = next((v for v in reversed(stack) if isinstance(v, Token) and v.type == "SEVERITY"), None)
    scope = _SCOPE_TEXT.match(source, tok.start_pos)
    if scope is None or severity is None or severity.start_pos is None or "\n" in source[severity.start_pos : tok.start_pos]:
        return message, f"write 'per' and its scope before '{target}'"
    rule = source[severity.start_pos : on.start_pos].strip()
    return message, f"write {rule} {scope.group(0)} {target}"


# What a statement cut short at the end of its line still needs, after its last word: a
# placeholder of that kind lets the parse go on, and the hint says what to write.
_MISSING = (("NAME", "_", None), ("STRING", '""', None), ("QUANTITY", "1s", None), ("NUMBER", "1", None))
_AFTER_HINTS = {
    "per": "write the scope: per run, backend, level, phase, turn, bucket or window 30s",
    "on": 'write the backend as a string: on "name"',
    "=": "give the key its value on the same line, e.g. duration = 60s",
    **{op: f"write the threshold on the same line, e.g. p95(ttft) {op} 1s" for op in ("<", "<=", ">", ">=", "==", "!=")},
}
_FIRST_WORD = re.compile(r"[ \t]*([A-Za-z_][A-Za-z0-9_.\-]*)")


def _ended_too_soon(e: UnexpectedToken, source: str, add, errored_lines: set[int]) -> bool:
    """A statement cut short at the end of its line -- `require p95(ttft) <`, `... per`,
    `... on`, `key =` -- with the next statement on the next line: report the missing part at
    the end of the short line, not the next line's first token (and not, after it, every
    token the parse could not fit), and let the parse go on as if it had been written.
    `key =` then `other = 1`: the parse took `other` for the value, and stopped at its '='."""
    tok, ip = e.token, e.interactive_parser
    if ip is None or tok.type == "$END" or tok.start_pos is None:
        return False
    line_start = source.rfind("\n", 0, tok.start_pos) + 1
    if not _first_on_line(tok, source) and line_start > 0:
        # the parse took the line's first word to finish the line before (`per` then `require`
        # on the next line: a scope named 'require'), and stopped later on this line
        line, col = _code_line_end(source, line_start)
        code_start = _line_offset(source, line)
        last = _LAST_WORD.search(source, code_start, code_start + col - 1)
        first = _FIRST_WORD.match(source, line_start)
        if last is None or last.group(0) not in _AFTER_HINTS or first is None or line >= tok.line:
            return False
        what = f"'{first.group(1)}' on the next line starts a statement of its own"
        add("E001", f"the line ends too soon: {last.group(0)!r} needs something after it ({what})", line, col,
            hint=_AFTER_HINTS[last.group(0)])
        errored_lines.add(tok.line)  # the rest of that line is dropped: no second error for it
        return True
    if not _first_on_line(tok, source):
        return False
    expected = set(e.accepts or e.expected or ())
    for name, text, _ in _MISSING:
        if name not in expected:
            continue
        trial = ip.copy(deepcopy_values=False)
        try:
            trial.feed_token(Token.new_borrow_pos(name, text, tok))
            trial.feed_token(tok)
        except UnexpectedInput:
            continue
        line, col = _code_line_end(source, tok.start_pos)
        last = _LAST_WORD.search(source, 0, _line_offset(source, line) + col - 1)
        after = last.group(0) if last else ""
        add("E001", f"the line ends too soon: {after!r} needs something after it{_describe_expected(expected)}", line, col,
            hint=_AFTER_HINTS.get(after))
        ip.feed_token(Token.new_borrow_pos(name, text, tok))
        ip.feed_token(tok)
        return True
    return False


_LAST_WORD = re.compile(r"(?:[A-Za-z_][A-Za-z0-9_.\-]*|<=|>=|==|!=|[<>=(\[,])(?=[ \t]*$)")


def _line_offset(source: str, line: int) -> int:
    """The offset where 1-based `line` starts."""
    pos = 0
    for _ in range(line - 1):
        pos = source.index("\n", pos) + 1
    return pos


def _first_on_line(tok: Token, source: str) -> bool:
    """Is `tok` the first thing on its line (a new statement, by the writer's layout)?"""
    start = tok.start_pos
    if start is None or not source:
        return False
    return not source[source.rfind("\n", 0, start) + 1 : start].strip()


def _closer_left_open(e: UnexpectedToken, source: str, expected: set[str]) -> str | None:
    """']' or ')' when the unexpected token starts a line and closing a bracket left open at the
    end of the line before lets the parse take it (`max_tokens = [16, 32` then the next key),
    else None (`[` / `1` / `2`: a missing ',' inside a list laid out one item a line)."""
    tok, ip = e.token, e.interactive_parser
    if ip is None or not _first_on_line(tok, source) or "EQUAL" in expected:
        return None
    for name, text in (("RSQB", "]"), ("RPAR", ")")):
        if name in expected:
            trial = ip.copy(deepcopy_values=False)
            try:
                trial.feed_token(Token(name, text))
                trial.feed_token(tok)
            except UnexpectedInput:
                continue
            return text
    return None


def _code_line_end(source: str, before: int) -> tuple[int, int]:
    """(line, column) just after the last character of code before `before`, on the last line
    before it that holds any (a trailing comment and blank lines skipped)."""
    end = source.rfind("\n", 0, before)
    while end > 0:
        start = source.rfind("\n", 0, end) + 1
        code = source[start:end]
        if "#" in code and '"' not in code:
            code = code[: code.index("#")]
        code = code.rstrip()
        if code:
            return source.count("\n", 0, start) + 1, len(code) + 1
        end = start - 1
    return 1, 1


def _repair(e: UnexpectedToken, source: str) -> None:
    """After reporting a missing '=' (`key 5`), ',' (`[1 2]`), ']' (`[1, 2 }`) or ')'
    (`p95(ttft <= 1s`), insert it, so that parsing goes on from where the writer meant and
    the next line does not report a second error."""
    ip = e.interactive_parser
    if ip is None:
        return
    if e.token.type == "NAME" and str(e.token).lower() in ("or", "and") and "SLO_AND" in ip.accepts():
        ip.feed_token(Token.new_borrow_pos("SLO_AND", "and", e.token))  # reported: read it as 'and', and go on
        return
    order = (("EQUAL", "="), ("COMMA", ","), ("RSQB", "]"), ("RPAR", ")"))
    if e.token.type != "$END" and _first_on_line(e.token, source):
        order = order[2:] + order[:2]  # a bracket left open at a line's end: close it, not `, next_key`
    for name, text in order:
        if name not in ip.accepts():
            continue
        trial = ip.copy(deepcopy_values=False)
        try:
            trial.feed_token(Token(name, text))
            trial.feed_token(e.token)
        except UnexpectedInput:
            continue
        ip.feed_token(Token(name, text))
        ip.feed_token(e.token)
        return


_KEY_BEFORE = re.compile(r"\s*[A-Za-z_][A-Za-z0-9_.\-]*")
# a line that is a key, blanks and one short string, and nothing else (a comment aside)
_KEY_THEN_STRING = re.compile(r'[ \t]*(?P<key>[A-Za-z_][A-Za-z0-9_.\-]*)[ \t]+(?P<value>"[^"\n\\]*")[ \t]*(?:#[^\n]*)?')
_NAMED_BLOCKS = ("soak", "backend", "workload")  # block kinds that take a name: `backend "b"` then '{'



def _lex_error(e: UnexpectedCharacters, source: str, add) -> tuple[int, int, str]:
    """Report a lexer error; return (start, end, filler): the span of source to replace, and
    a replacement of the same length that lexes cleanly, so that parsing can go on without
    the error cascading (an unterminated string becomes an empty one, a stray character a
    name or a blank)."""
    pos = e.pos_in_stream
    line_end = source.find("\n", pos)
    if line_end < 0:
        line_end = len(source)
    ch = source[pos]
    if source.startswith('""', pos - 2) and pos >= 2:  # lark took '""' as an empty string
        pos -= 2
        e.column -= 2
    if source[pos] == '"' or source.startswith('r"', pos):
        if source.startswith('"""', pos):
            add("E002", "unterminated string: '\"\"\"' is never closed", e.line, e.column)
            return pos, len(source), _blank(source, pos, len(source))[pos:]
        add("E002", "unterminated string: the closing '\"' is missing on this line", e.line, e.column)
        n = line_end - pos
        tail = source[pos:line_end].rstrip()
        if len(tail) >= 3 and tail[-1] in "{[":  # `backend "a {`: keep the bracket the line opens
            return pos, line_end, ('""' + " " * (len(tail) - 3) + tail[-1]).ljust(n)
        return pos, line_end, ('""' + " " * (n - 2)) if n >= 2 else "_"
    line_start = source.rfind("\n", 0, pos) + 1
    before = source[line_start:pos].rstrip()
    if ch == "\\":
        add("E003", "unexpected '\\' outside a string", e.line, e.column)
    elif ch == ":" and _KEY_BEFORE.fullmatch(before):  # `prompt_words: 128`: read it as '='
        value = source[pos + 1 : line_end].strip()[:30] or "value"
        add("E003", "unexpected character ':'", e.line, e.column, hint=f"a key and its value are written with '=': {before.strip()} = {value}")
        return pos, pos + 1, "="
    else:
        add("E003", f"unexpected character {ch!r}", e.line, e.column)
    if ch == "\n":
        return pos, pos + 1, "\n"
    # Where a value or a name is expected (`key = @`, `dura@tion`) the character becomes a
    # name; elsewhere (`duration = 60s;`) it is blanked, so that it does not start a statement.
    prev, after = source[pos - 1 : pos] if pos > line_start else "", source[pos + 1 : pos + 2]
    joins = (prev.isalnum() or prev == "_") and (after.isalnum() or after == "_")
    return pos, pos + 1, "_" if before[-1:] in ("=", "[", ",", "(", "<", ">") or joins else " "


def _eof_error(source: str, add) -> None:
    """The file ended inside a block or list: point at the bracket that was never closed."""
    stack: list[tuple[str, int]] = []
    stripped = re.sub(
        _LONG + r'|(?<![A-Za-z0-9_.\-])r"[^"\n]*"|' + _STR + r'|#[^\n]*',
        lambda m: re.sub(r"[^\n]", " ", m.group()),
        source,
        flags=re.S,
    )
    for i, ch in enumerate(stripped):
        if ch in "{[(":
            stack.append((ch, i))
        elif ch in "}])" and stack:
            stack.pop()
    if stack:
        ch, pos = stack[-1]
        line = source.count("\n", 0, pos) + 1
        col = pos - (source.rfind("\n", 0, pos) + 1) + 1
        closer = {"{": "}", "[": "]", "(": ")"}[ch]
        add("E004", f"'{ch}' is never closed (expected '{closer}' before the end of the file)", line, col)
    else:
        line = source.count("\n") + 1
        add("E001", "unexpected end of file", line, 1)


FIFO_WAIT_S = 10.0  # how long a named pipe (`soakspec check <(...)`) may take to deliver the spec


class Unreadable(Exception):
    """A file that gave nothing within the wait (a pipe nobody writes to)."""


_Unreadable = Unreadable


def _read_spec(path: pathlib.Path) -> bytes:
    return read_bounded(path, MAX_SOURCE_BYTES)


def read_bounded(path: str | pathlib.Path, limit: int) -> bytes:
    """At most `limit` + 1 bytes of the file: never more (`/dev/zero`), and never an unbounded
    wait (a FIFO nobody writes to: `Unreadable` after FIFO_WAIT_S). More than `limit` bytes
    back means the file is too large. OSError for what cannot be opened or read."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        mode = os.fstat(fd).st_mode
        if stat.S_ISDIR(mode):
            raise IsADirectoryError(errno.EISDIR, "Is a directory")
        pipe = stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode)
        deadline = time.monotonic() + FIFO_WAIT_S
        chunks: list[bytes] = []
        size = 0
        while size <= limit:
            try:
                chunk = os.read(fd, min(1 << 16, limit + 1 - size))
            except BlockingIOError:
                left = deadline - time.monotonic()
                if left <= 0 or not select.select([fd], [], [], left)[0]:
                    raise _Unreadable(f"nothing arrived from the pipe within {FIFO_WAIT_S:g} s") from None
                continue
            if not chunk and pipe and not size and time.monotonic() < deadline:
                time.sleep(0.05)  # a FIFO whose writer has not opened it yet reads as empty
                continue
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        if pipe and not size:
            raise _Unreadable(f"nothing was written to the pipe within {FIFO_WAIT_S:g} s")
        return b"".join(chunks)
    finally:
        os.close(fd)


def parse_file(path: str | pathlib.Path) -> tuple[A.SoakFile | None, list[Diagnostic], str]:
    """Read and parse a file. Returns (tree, diagnostics, source text: what the diagnostics'
    positions count in, a leading BOM dropped)."""
    text, refused = read_source(path)
    if text is None:
        shown = ""
        if refused is not None and refused.code == "E003":  # not UTF-8: the line shown with U+FFFD at the byte
            with contextlib.suppress(OSError, _Unreadable):
                # as written: E003's position counts '\n' in the bytes (`decode_source`)
                shown = _read_spec(pathlib.Path(path)).decode("utf-8", "replace").removeprefix(BOM)
        return None, [refused], shown
    tree, diags = parse(text, str(path))
    return tree, diags, source_text(text)


def read_source(path: str | pathlib.Path) -> tuple[str | None, Diagnostic | None]:
    """A spec file's text as written (BOM and line endings kept: `fmt` keeps them), or the
    diagnostic that says why it cannot be read (E000, E010, E003)."""
    try:
        raw = _read_spec(pathlib.Path(path))
    except OSError as e:
        return None, Diagnostic("E000", f"cannot read spec: {e.strerror or e}", Span(), str(path))
    except _Unreadable as e:
        return None, Diagnostic("E000", f"cannot read spec: {e}", Span(), str(path))
    return decode_source(raw, str(path))
