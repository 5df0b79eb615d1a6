"""Text -> `SoakFile`: the Lark LALR parser, the tree transformer and comment attachment.

`parse(text, path)` never raises for bad input: it returns `(tree_or_None, diagnostics)`.
Syntax errors are all collected in one pass: after an unexpected character the offending
span is blanked (positions kept) and the text is parsed again; after an unexpected token the
parser skips it and resumes. At most one syntax error is reported per line, so a single
mistake does not cascade into a page of noise.
"""

from __future__ import annotations

import bisect
import dataclasses
import functools
import importlib.resources
import math
import pathlib
import re

from lark import Lark, Token, Transformer, v_args
from lark.exceptions import UnexpectedCharacters, UnexpectedEOF, UnexpectedInput, UnexpectedToken, VisitError

from soakspec.diagnostics import Diagnostic, Span
from soakspec.lang import ast as A

MAX_SOURCE_BYTES = 1_000_000
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
    return Lark(
        _grammar_text(),
        parser="lalr",
        lexer="contextual",
        propagate_positions=True,
        maybe_placeholders=False,
    )


# Friendly names for terminals in "expected ..." messages.
_TERMINAL_NAMES = {
    "NAME": "a name",
    "STRING": "a string",
    "RAW_STRING": "a string",
    "LONG_STRING": "a string",
    "NUMBER": "a number",
    "QUANTITY": "a quantity",
    "LBRACE": "'{'",
    "RBRACE": "'}'",
    "LSQB": "'['",
    "RSQB": "']'",
    "LPAR": "'('",
    "RPAR": "')'",
    "EQUAL": "'='",
    "COMMA": "','",
    "COMPARATOR": "a comparison",
    "SEVERITY": "'require' or 'warn'",
    "CLAIM_KW": "'claim' or 'exclude'",
    "TRUE": "true",
    "FALSE": "false",
    "PER": "'per'",
    "ON": "'on'",
    "$END": "end of file",
}


def _describe_expected(expected: set[str]) -> str:
    if {"STRING", "NUMBER", "QUANTITY"} <= expected:
        return " (expected a value: a string, number, quantity, name, list or table)"
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
    if getattr(meta, "empty", True):
        return Span()
    return Span(meta.line, meta.column, meta.end_line, meta.end_column)


def _tok_span(tok: Token) -> Span:
    return Span(tok.line, tok.column, tok.end_line, tok.end_column)


def _number(text: str) -> int | float:
    if re.fullmatch(r"-?[0-9]+", text):
        return int(text)
    return float(text)


_QUANTITY_RE = re.compile(r"(-?[0-9]+(?:\.[0-9]+)?(?:[eE][-+]?[0-9]+)?)([A-Za-z%]+)")


def _unescape(body: str) -> str:
    # JSON-compatible escapes plus \' ; an invalid escape is an error for the checker to see,
    # but we keep lexing lenient: unknown escapes are kept verbatim.
    out = []
    i = 0
    simple = {"n": "\n", "t": "\t", "r": "\r", '"': '"', "\\": "\\", "/": "/", "'": "'", "0": "\0"}
    while i < len(body):
        c = body[i]
        if c == "\\" and i + 1 < len(body):
            n = body[i + 1]
            if n in simple:
                out.append(simple[n])
                i += 2
                continue
            if n == "u" and re.fullmatch(r"[0-9a-fA-F]{4}", body[i + 2 : i + 6] or ""):
                out.append(chr(int(body[i + 2 : i + 6], 16)))
                i += 6
                continue
            out.append(c)
            i += 1
            continue
        out.append(c)
        i += 1
    return "".join(out)


class _ToAst(Transformer):
    @v_args(meta=True)
    def start(self, meta, children):
        return A.SoakFile(tuple(children))

    @v_args(meta=True)
    def block(self, meta, children):
        kind_tok = children[0]
        rest = children[1:]
        label = None
        if rest and isinstance(rest[0], A.Str):
            label, rest = rest[0], rest[1:]
        return A.Block(str(kind_tok), label, tuple(rest), span=_span(meta), kind_span=_tok_span(kind_tok))

    def label(self, children):
        return children[0]

    @v_args(meta=True)
    def attribute(self, meta, children):
        key, value = children
        return A.Attribute(str(key), value, span=_span(meta), key_span=_tok_span(key))

    @v_args(meta=True)
    def claim(self, meta, children):
        kw, text = children
        return A.Claim(str(kw), text, span=_span(meta))

    @v_args(meta=True)
    def rule(self, meta, children):
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
        return A.Rule(severity, expr, op, threshold, scope, target, span=_span(meta))

    @v_args(meta=True)
    def scope(self, meta, children):
        kind = str(children[0])
        length = children[1] if len(children) > 1 else None
        if isinstance(length, Token):
            length = self._quantity_tok(length)
        return A.Scope(kind, length, span=_span(meta))

    def target(self, children):
        return children[0]

    @v_args(meta=True)
    def call(self, meta, children):
        name, arg = children
        return A.Call(str(name), arg, span=_span(meta))

    @v_args(meta=True)
    def metric_ref(self, meta, children):
        return A.MetricRef(str(children[0]), span=_span(meta))

    @v_args(meta=True)
    def string(self, meta, children):
        tok = children[0]
        text = str(tok)
        if tok.type == "RAW_STRING":
            return A.Str(text[2:-1], "raw", span=_tok_span(tok))
        if tok.type == "LONG_STRING":
            return A.Str(_unescape(text[3:-3]), "long", span=_tok_span(tok))
        return A.Str(_unescape(text[1:-1]), "plain", span=_tok_span(tok))

    def number(self, children):
        tok = children[0]
        return A.Num(_number(str(tok)), span=_tok_span(tok))

    def quantity(self, children):
        return self._quantity_tok(children[0])

    @staticmethod
    def _quantity_tok(tok: Token) -> A.Quantity:
        m = _QUANTITY_RE.fullmatch(str(tok))
        assert m is not None  # the lexer guarantees the shape
        return A.Quantity(_number(m.group(1)), m.group(2), span=_tok_span(tok))

    @v_args(meta=True)
    def true(self, meta, children):
        return A.Bool(True, span=_span(meta))

    @v_args(meta=True)
    def false(self, meta, children):
        return A.Bool(False, span=_span(meta))

    def word(self, children):
        tok = children[0]
        return A.Word(str(tok), span=_tok_span(tok))

    @v_args(meta=True)
    def list(self, meta, children):
        return A.List(tuple(c for c in children if c is not None), span=_span(meta))


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


def _nesting_depth(text: str) -> int:
    depth = best = 0
    for ch in re.sub(r'"""(?:[^"\\]|\\.|"(?!""))*"""|(?<![A-Za-z0-9_.\-])r"[^"\n]*"|"(?:[^"\\\n]|\\.)*"|#[^\n]*', "", text, flags=re.S):
        if ch in "{[(":
            depth += 1
            best = max(best, depth)
        elif ch in "}])":
            depth -= 1
    return best


def _blank(text: str, start: int, end: int) -> str:
    """Replace text[start:end] by spaces, keeping newlines (so line/col stay valid)."""
    seg = "".join("\n" if c == "\n" else " " for c in text[start:end])
    return text[:start] + seg + text[end:]


def parse(text: str, path: str = "<string>") -> tuple[A.SoakFile | None, list[Diagnostic]]:
    """Parse .soak source. Returns the tree (None if there were syntax errors) and diagnostics."""
    diags: list[Diagnostic] = []
    if len(text.encode("utf-8", "surrogatepass")) > MAX_SOURCE_BYTES:
        return None, [Diagnostic("E010", f"spec is larger than {MAX_SOURCE_BYTES // 1000} kB; refusing to parse it", Span(1, 1, 1, 2), path)]
    if "\0" in text:
        line = text[: text.index("\0")].count("\n") + 1
        return None, [Diagnostic("E003", "spec contains a NUL byte (is it a binary file?)", Span(line, 1, line, 2), path)]
    depth = _nesting_depth(text)
    if depth > MAX_NESTING:
        return None, [Diagnostic("E011", f"spec nests {depth} levels deep; at most {MAX_NESTING} are allowed", Span(1, 1, 1, 2), path)]

    errored_lines: set[int] = set()

    def add(code: str, msg: str, line: int, col: int, end_col: int | None = None, hint: str | None = None):
        if line in errored_lines or len(diags) >= MAX_SYNTAX_ERRORS:
            return
        errored_lines.add(line)
        diags.append(Diagnostic(code, msg, Span(line, col, line, end_col or col + 1), path, hint=hint))

    # An unterminated '"""' runs to the end of the file: what is left open there is its doing.
    swallowed = False

    def eof_error() -> None:
        if not swallowed:
            _eof_error(source, add)

    def on_error(e: UnexpectedInput) -> bool:
        if isinstance(e, UnexpectedCharacters):
            return False  # handled below by blanking the span and parsing again
        if e.token.type == "$END":
            eof_error()
            return False
        _token_error(e, add)
        _repair(e)
        return len(diags) < MAX_SYNTAX_ERRORS

    source = text
    for _attempt in range(MAX_SYNTAX_ERRORS + 1):
        parser = _parser()
        try:
            tree = parser.parse(source, on_error=on_error)
        except UnexpectedCharacters as e:
            start, end, filler = _lex_error(e, source, add)
            swallowed = swallowed or (end == len(source) and source.startswith('"""', start))
            source = source[:start] + filler + source[end:]
            continue
        except (UnexpectedEOF, UnexpectedToken) as e:
            if isinstance(e, UnexpectedEOF) or e.token.type == "$END":
                eof_error()
            return None, diags
        except UnexpectedInput as e:  # pragma: no cover - other lark errors
            add("E001", f"syntax error: {e.__class__.__name__}", e.line, e.column)
            return None, diags
        except VisitError as e:  # pragma: no cover - a transformer bug, surface the original
            raise e.orig_exc from None
        break
    else:  # pragma: no cover
        return None, diags
    if diags:
        return None, diags
    for tok in tree.scan_values(lambda v: isinstance(v, Token) and v.type in ("NUMBER", "QUANTITY")):
        number = _QUANTITY_RE.fullmatch(tok).group(1) if tok.type == "QUANTITY" else str(tok)
        if math.isinf(float(number)):  # also keeps int() from refusing a 5000-digit literal
            add("E001", f"number {_describe_token(tok)} is too large", tok.line, tok.column, tok.end_column if tok.end_line == tok.line else None)
    if diags:
        return None, diags
    try:
        soak = _ToAst().transform(tree)
    except VisitError as e:  # pragma: no cover
        raise e.orig_exc from None
    cs = sorted((_Comment(c) for c in _comment_tokens(text)), key=lambda c: (c.line, c.column))
    body, closing = _attach(soak.body, cs, None)
    return A.SoakFile(body, closing), diags


def _comment_tokens(source: str) -> list[Token]:
    """Comments with their positions. Strings are matched first, since they may contain '#'.
    Only called on text that parsed, so every string here is well formed."""
    found: list[Token] = []
    pattern = re.compile(
        r'(?P<long>"""(?:[^"\\]|\\.|"(?!""))*""")|(?P<raw>(?<![A-Za-z0-9_.\-])r"[^"\n]*")|(?P<str>"(?:[^"\\\n]|\\.)*")|(?P<comment>#[^\n]*)',
        re.S,
    )
    line_starts = [0]
    for m in re.finditer("\n", source):
        line_starts.append(m.end())
    for m in pattern.finditer(source):
        if m.lastgroup != "comment":
            continue
        pos = m.start()
        line = bisect.bisect_right(line_starts, pos)
        col = pos - line_starts[line - 1] + 1
        tok = Token("COMMENT", m.group(), start_pos=pos, line=line, column=col)
        found.append(tok)
    return found


def _token_error(e: UnexpectedToken, add) -> None:
    tok = e.token
    expected = set(e.accepts or e.expected or ())
    if tok.type == "$END":
        return
    text = str(tok)
    hint = None
    if tok.type in ("NUMBER", "QUANTITY") and "EQUAL" in expected:
        hint = "did you forget '=' between a key and its value?"
    add(
        "E001",
        f"unexpected {_describe_token(tok)}{_describe_expected(expected)}",
        tok.line,
        tok.column,
        tok.column + max(1, len(text)) if tok.end_line == tok.line else None,
        hint,
    )


def _repair(e: UnexpectedToken) -> None:
    """After reporting a missing '=' (`key 5`), ',' (`[1 2]`), ']' (`[1, 2 }`) or ')'
    (`p95(ttft <= 1s`), insert it, so that parsing goes on from where the writer meant and
    the next line does not report a second error."""
    ip = e.interactive_parser
    if ip is None:
        return
    for name, text in (("EQUAL", "="), ("COMMA", ","), ("RSQB", "]"), ("RPAR", ")")):
        if name not in ip.accepts():
            continue
        trial = ip.copy()
        try:
            trial.feed_token(Token(name, text))
            trial.feed_token(e.token)
        except UnexpectedInput:
            continue
        ip.feed_token(Token(name, text))
        ip.feed_token(e.token)
        return


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
    if ch == "\\":
        add("E003", "unexpected '\\' outside a string", e.line, e.column)
    else:
        add("E003", f"unexpected character {ch!r}", e.line, e.column)
    if ch == "\n":
        return pos, pos + 1, "\n"
    # Where a value or a name is expected (`key = @`, `dura@tion`) the character becomes a
    # name; elsewhere (`duration = 60s;`) it is blanked, so that it does not start a statement.
    line_start = source.rfind("\n", 0, pos) + 1
    before = source[line_start:pos].rstrip()
    prev, after = source[pos - 1 : pos] if pos > line_start else "", source[pos + 1 : pos + 2]
    joins = (prev.isalnum() or prev == "_") and (after.isalnum() or after == "_")
    return pos, pos + 1, "_" if before[-1:] in ("=", "[", ",", "(", "<", ">") or joins else " "


def _eof_error(source: str, add) -> None:
    """The file ended inside a block or list: point at the bracket that was never closed."""
    stack: list[tuple[str, int]] = []
    stripped = re.sub(
        r'"""(?:[^"\\]|\\.|"(?!""))*"""|(?<![A-Za-z0-9_.\-])r"[^"\n]*"|"(?:[^"\\\n]|\\.)*"|#[^\n]*',
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


def parse_file(path: str | pathlib.Path) -> tuple[A.SoakFile | None, list[Diagnostic], str]:
    """Read and parse a file. Returns (tree, diagnostics, source text)."""
    p = pathlib.Path(path)
    try:
        raw = p.read_bytes()
    except OSError as e:
        return None, [Diagnostic("E000", f"cannot read spec: {e.strerror or e}", Span(), str(path))], ""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        line = raw[: e.start].count(b"\n") + 1
        return None, [Diagnostic("E003", "spec is not valid UTF-8", Span(line, 1, line, 2), str(path))], ""
    tree, diags = parse(text, str(path))
    return tree, diags, text
