"""Diagnostics: `path:line:col: CODE message`, the source line and a caret.

Every stage that judges user input (the parser, the checker, the claim linter) reports
problems as `Diagnostic` values and never raises for a user mistake. Rendering lives here so
that every command prints the same shape (ruff/mypy style) and the same JSON.
"""

from __future__ import annotations

import unicodedata

import dataclasses
import enum
from collections.abc import Iterable, Sequence


class Severity(enum.StrEnum):
    ERROR = "error"
    WARNING = "warning"


@dataclasses.dataclass(frozen=True, slots=True)
class Span:
    """A 1-based source range. Spans never take part in AST equality."""

    line: int = 0
    column: int = 0
    end_line: int = 0
    end_column: int = 0

    @property
    def known(self) -> bool:
        return self.line > 0


NO_SPAN = Span()


@dataclasses.dataclass(frozen=True, slots=True)
class Diagnostic:
    code: str
    message: str
    span: Span = NO_SPAN
    path: str = "<string>"
    severity: Severity = Severity.ERROR
    hint: str | None = None

    def located(self, path: str) -> "Diagnostic":
        return dataclasses.replace(self, path=path)

    def as_json(self) -> dict:
        return {
            "path": self.path,
            "line": self.span.line,
            "column": self.span.column,
            "end_line": self.span.end_line,
            "end_column": self.span.end_column,
            "code": self.code,
            "severity": str(self.severity),
            "message": self.message,
            "hint": self.hint,
        }


def line_col(text: str, pos: int) -> tuple[int, int]:
    """1-based (line, column) of character offset `pos` of `text`: where a diagnostic points."""
    return text.count("\n", 0, pos) + 1, pos - (text.rfind("\n", 0, pos) + 1) + 1


def sort_key(d: Diagnostic) -> tuple:
    return (d.path, d.span.line, d.span.column, d.code, d.message)


SHOWN_COLUMNS = 120  # of a long source line, the part around the caret that is shown


def render_one(d: Diagnostic, source: str | None) -> str:
    """One diagnostic as text: the header line, then the source line and a caret."""
    return _render(d, source.split("\n") if source is not None else None)


def _render(d: Diagnostic, src_lines: list[str] | None) -> str:
    if d.span.known:
        head = f"{d.path}:{d.span.line}:{d.span.column}: {d.code} {d.message}"
    else:
        head = f"{d.path}: {d.code} {d.message}"
    if d.severity is Severity.WARNING:
        head += " [warning]"
    lines = [head]
    if src_lines is not None and d.span.known and 0 < d.span.line <= len(src_lines):
        lines += _excerpt(d.span, src_lines[d.span.line - 1].rstrip("\r"))
    if d.hint:
        lines.append(f"  hint: {d.hint}")
    return "\n".join(lines)


def _excerpt(span: Span, text: str) -> list[str]:
    """The source line and its caret; of a line longer than SHOWN_COLUMNS only the part
    around the caret, so that many diagnostics on one long line stay small."""
    col = max(1, span.column)
    width = span.end_column - col if span.end_line == span.line and span.end_column > col else 1
    width = max(1, min(width, len(text) - col + 1)) if len(text) >= col else 1
    if len(text) > SHOWN_COLUMNS:
        start = max(0, min(col - 1 - SHOWN_COLUMNS // 3, len(text) - SHOWN_COLUMNS))
        end = start + SHOWN_COLUMNS
        lead, tail = ("…" if start > 0 else ""), ("…" if end < len(text) else "")
        col = col - start + len(lead)
        width = max(1, min(width, end - (span.column - 1)))
        text = lead + text[start:end] + tail
    text = text.expandtabs(1)
    # the caret under the character on a terminal: wide (CJK) characters take two cells,
    # combining marks none (the column itself stays the character's, as editors count it)
    pad, under = _cells(text[:col - 1]), max(1, _cells(text[col - 1:col - 1 + width]))
    return [f"  {text}", "  " + " " * pad + "^" + "~" * (under - 1)]


def _cells(text: str) -> int:
    """Terminal cells `text` takes: 2 for an East Asian wide or full-width character, 0 for a
    combining mark or a zero-width format character, else 1."""
    n = 0
    for ch in text:
        if ch.isascii():
            n += 1
        elif unicodedata.combining(ch) or unicodedata.category(ch) == "Cf":
            continue
        else:
            n += 2 if unicodedata.east_asian_width(ch) in ("W", "F") else 1
    return n


def render_text(diags: Sequence[Diagnostic], sources: dict[str, str] | None = None) -> str:
    sources = sources or {}
    split: dict[str, list[str]] = {}  # each source split once, however many diagnostics it has

    def lines_of(path: str) -> list[str] | None:
        if path not in sources:
            return None
        if path not in split:
            split[path] = sources[path].split("\n")  # the parser counts only '\n' as a line break
        return split[path]

    out = [_render(d, lines_of(d.path)) for d in sorted(diags, key=sort_key)]
    errors = sum(1 for d in diags if d.severity is Severity.ERROR)
    warnings = len(diags) - errors
    if diags:
        parts = []
        if errors:
            parts.append(f"{errors} error{'s' if errors != 1 else ''}")
        if warnings:
            parts.append(f"{warnings} warning{'s' if warnings != 1 else ''}")
        out.append("Found " + " and ".join(parts) + ".")
    return terminal_safe("\n".join(out))


_CONTROLS = {c: "\ufffd" for c in [*range(0x20), 0x7F, *range(0x80, 0xA0)] if c != 0x0A}


def terminal_safe(text: str) -> str:
    """`text` with every control character but the newline shown as U+FFFD (one cell, as the
    character took for the caret): a spec's own bytes or strings (`issue = "\u001b[2J"`, a raw
    ESC on a line shown under a diagnostic) are shown, never obeyed by the terminal."""
    return text.translate(_CONTROLS)


def has_errors(diags: Iterable[Diagnostic]) -> bool:
    return any(d.severity is Severity.ERROR for d in diags)
