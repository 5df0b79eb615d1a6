"""AST -> canonical .soak text (`soakspec fmt`).

Canonical form: two-space indentation, one statement per line, one blank line between
top-level blocks, `key = value`, lists on one line when they fit in 88 columns (else
filled into lines after '[', with a trailing comma), comments kept (full-line comments above their
statement, trailing comments after it). `fmt` is pure and idempotent, and
`parse(fmt(tree)) == tree` for every tree the parser can produce (tested with hypothesis).
"""

from __future__ import annotations

import dataclasses

from soakspec.lang import ast as A

INDENT = "  "
WIDTH = 88


def fmt(tree: A.SoakFile) -> str:
    out: list[str] = []
    for i, stmt in enumerate(tree.body):
        if i and (isinstance(stmt, A.Block) or isinstance(tree.body[i - 1], A.Block)):
            out.append("")
        _stmt(stmt, 0, out)
    if tree.closing_comments:
        if tree.body:
            out.append("")
        out.extend(_comment(c, 0) for c in tree.closing_comments)
    return "\n".join(out) + "\n" if out else ""


def in_style_of(out: str, original: str) -> str:
    """`fmt`'s text written as the file it came from was: CRLF line breaks when the original's
    first line ends in CRLF (a mixed file takes its first line's), CR when it has no LF at all
    (a classic Mac OS file), and its leading UTF-8 BOM when it had one. None changes what the
    spec means (the parser reads CRLF and CR as LF, inside a long string too, and skips a BOM),
    so the spec hash is the same; keeping them means `fmt` changes layout, never the encoding
    conventions of the editor that saved the file."""
    first = original.find("\n")
    if first > 0 and original[first - 1] == "\r":
        out = out.replace("\n", "\r\n")
    elif first < 0 and "\r" in original:
        out = out.replace("\n", "\r")
    return "\ufeff" + out if original.startswith("\ufeff") else out


def strip_comments(tree: A.SoakFile) -> A.SoakFile:
    """The same tree without any comment (what `Spec.sha256` hashes)."""
    return A.SoakFile(tuple(_strip(s) for s in tree.body))


def _strip(stmt: A.Statement) -> A.Statement:
    """The statement without comments -- itself when it has none (most have none, and a copy
    of each of a 1 MB spec's 50,000 statements was half of `spec_hash`)."""
    if isinstance(stmt, A.Block):
        body = tuple(_strip(s) for s in stmt.body)
        if stmt.comments or stmt.trailing is not None or stmt.closing_comments or any(a is not b for a, b in zip(body, stmt.body)):
            return dataclasses.replace(stmt, body=body, comments=(), trailing=None, closing_comments=())
        return stmt
    if stmt.comments or stmt.trailing is not None:
        return dataclasses.replace(stmt, comments=(), trailing=None)
    return stmt


def _comment(text: str, depth: int) -> str:
    return f"{INDENT * depth}# {text}".rstrip() if text else f"{INDENT * depth}#"


def _with_trailing(line: str, trailing: str | None) -> str:
    if trailing is None:
        return line
    return f"{line}  # {trailing}".rstrip() if trailing else f"{line}  #"


def _stmt(stmt: A.Statement, depth: int, out: list[str]) -> None:
    pad = INDENT * depth
    out.extend(_comment(c, depth) for c in stmt.comments)
    if isinstance(stmt, A.Block):
        head = stmt.kind + (f" {string(stmt.label)}" if stmt.label is not None else "")
        if not stmt.body and not stmt.closing_comments:
            out.append(_with_trailing(f"{pad}{head} {{}}", stmt.trailing))
            return
        out.append(f"{pad}{head} {{")
        for inner in stmt.body:
            _stmt(inner, depth + 1, out)
        out.extend(_comment(c, depth + 1) for c in stmt.closing_comments)
        out.append(_with_trailing(f"{pad}}}", stmt.trailing))
    elif isinstance(stmt, A.Attribute):
        lines = value_lines(stmt.value, depth, len(pad) + len(stmt.key) + 3)
        lines[0] = f"{pad}{stmt.key} = {lines[0]}"
        lines[-1] = _with_trailing(lines[-1], stmt.trailing)
        out.extend(lines)
    elif isinstance(stmt, A.Rule):
        out.append(_with_trailing(pad + rule_text(stmt), stmt.trailing))
    elif isinstance(stmt, A.Claim):
        out.append(_with_trailing(f"{pad}{stmt.kind} {string(stmt.text)}", stmt.trailing))
    else:  # pragma: no cover
        raise TypeError(f"not a statement: {stmt!r}")


def rule_text(rule: A.Rule) -> str:
    parts = [rule.severity, expr_text(rule.expr)]
    if rule.op is not None and rule.threshold is not None:
        parts += [rule.op, value_text(rule.threshold)]
    if rule.scope is not None:
        parts += ["per", rule.scope.kind]
        if rule.scope.length is not None:
            parts.append(value_text(rule.scope.length))
    if rule.target is not None:
        parts += ["on", string(rule.target)]
    return " ".join(parts)


def expr_text(expr: A.Expr) -> str:
    if isinstance(expr, A.SloCall):
        conds = " and ".join(f"{c.metric} {c.op} {value_text(c.threshold)}" for c in expr.conditions)
        return f"{expr.func}({conds})"
    if isinstance(expr, A.Call):
        return f"{expr.func}({expr_text(expr.arg)})"
    if isinstance(expr, A.MultiCall):
        return f"{expr.func}({', '.join(expr_text(a) for a in expr.args)})"
    if isinstance(expr, A.NamedRef):
        return f'{expr.func}("{_escape(expr.name, False)}")'
    return expr.name


def number(v: int | float) -> str:
    if isinstance(v, bool):  # pragma: no cover - bools are Bool nodes
        raise TypeError("bool is not a number")
    return str(v) if isinstance(v, int) else repr(float(v))


_ESCAPES = {'"': '\\"', "\\": "\\\\", "\n": "\\n", "\t": "\\t", "\r": "\\r"}


def _escape(s: str, keep_newlines: bool) -> str:
    out = []
    for ch in s:
        if ch == "\n" and keep_newlines:
            out.append(ch)
        elif ch in _ESCAPES:
            out.append(_ESCAPES[ch])
        elif ord(ch) < 0x20 or ch == "\x7f" or 0xD800 <= ord(ch) <= 0xDFFF:
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(ch)
    return "".join(out)


def string(s: A.Str) -> str:
    if s.style == "raw" and '"' not in s.value and "\n" not in s.value:
        return f'r"{s.value}"'
    if s.style == "long":
        return '"""' + _escape(s.value, keep_newlines=True) + '"""'
    return '"' + _escape(s.value, keep_newlines=False) + '"'


def value_text(v: A.Value) -> str:
    if isinstance(v, A.Str):
        return string(v)
    if isinstance(v, A.Num):
        return number(v.value)
    if isinstance(v, A.Quantity):
        return f"{number(v.value)} {v.unit}" if v.unit in A.COUNT_UNITS else f"{number(v.value)}{v.unit}"
    if isinstance(v, A.Bool):
        return "true" if v.value else "false"
    if isinstance(v, A.Word):
        return v.name
    if isinstance(v, A.List):
        return "[" + ", ".join(value_text(i) for i in v.items) + "]"
    raise TypeError(f"not a value: {v!r}")  # pragma: no cover


def value_lines(v: A.Value, depth: int, used: int) -> list[str]:
    """A value as one or more lines. A list too wide for one line is broken after '[' and
    its items filled greedily into lines of at most WIDTH columns, with a trailing comma."""
    one = value_text(v)
    if not isinstance(v, A.List) or not v.items or used + len(one) <= WIDTH:
        return one.split("\n") if "\n" in one else [one]
    pad = INDENT * (depth + 1)
    lines = ["["]
    current = ""
    for item in v.items:
        text = value_text(item) + ","
        if "\n" in text:  # a long string with newlines gets lines of its own
            if current:
                lines.append(pad + current)
                current = ""
            item_lines = text.split("\n")
            lines.append(pad + item_lines[0])
            lines.extend(item_lines[1:])
            continue
        if current and len(pad) + len(current) + 1 + len(text) > WIDTH:
            lines.append(pad + current)
            current = text
        else:
            current = f"{current} {text}" if current else text
    if current:
        lines.append(pad + current)
    lines.append(INDENT * depth + "]")
    return lines
