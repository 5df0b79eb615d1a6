"""Diagnostics: `path:line:col: CODE message`, the source line and a caret.

Every stage that judges user input (the parser, the checker, the claim linter) reports
problems as `Diagnostic` values and never raises for a user mistake. Rendering lives here so
that every command prints the same shape (ruff/mypy style) and the same JSON.
"""

from __future__ import annotations

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


def sort_key(d: Diagnostic) -> tuple:
    return (d.path, d.span.line, d.span.column, d.code, d.message)


def render_one(d: Diagnostic, source: str | None) -> str:
    """One diagnostic as text: the header line, then the source line and a caret."""
    if d.span.known:
        head = f"{d.path}:{d.span.line}:{d.span.column}: {d.code} {d.message}"
    else:
        head = f"{d.path}: {d.code} {d.message}"
    if d.severity is Severity.WARNING:
        head += " [warning]"
    lines = [head]
    if source is not None and d.span.known:
        src_lines = source.split("\n")  # the parser counts only '\n' as a line break
        if 0 < d.span.line <= len(src_lines):
            text = src_lines[d.span.line - 1].rstrip("\r").expandtabs(1)
            col = max(1, d.span.column)
            width = 1
            if d.span.end_line == d.span.line and d.span.end_column > col:
                width = d.span.end_column - col
            width = max(1, min(width, len(text) - col + 1)) if len(text) >= col else 1
            lines.append(f"  {text}")
            lines.append("  " + " " * (col - 1) + "^" + "~" * (width - 1))
    if d.hint:
        lines.append(f"  hint: {d.hint}")
    return "\n".join(lines)


def render_text(diags: Sequence[Diagnostic], sources: dict[str, str] | None = None) -> str:
    sources = sources or {}
    out = [render_one(d, sources.get(d.path)) for d in sorted(diags, key=sort_key)]
    errors = sum(1 for d in diags if d.severity is Severity.ERROR)
    warnings = len(diags) - errors
    if diags:
        parts = []
        if errors:
            parts.append(f"{errors} error{'s' if errors != 1 else ''}")
        if warnings:
            parts.append(f"{warnings} warning{'s' if warnings != 1 else ''}")
        out.append("Found " + " and ".join(parts) + ".")
    return "\n".join(out)


def has_errors(diags: Iterable[Diagnostic]) -> bool:
    return any(d.severity is Severity.ERROR for d in diags)
