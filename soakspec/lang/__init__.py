"""The .soak language: `parse` (text -> AST), `check` (AST -> Spec), `fmt` (AST -> text)."""

from __future__ import annotations

import pathlib

from soakspec.diagnostics import Diagnostic, has_errors
from soakspec.lang.check import check, is_generic_runtime_label
from soakspec.lang.fmt import fmt
from soakspec.lang.parser import parse, parse_file
from soakspec.lang.spec import Spec

__all__ = ["check", "fmt", "is_generic_runtime_label", "load_spec", "parse", "parse_file", "Spec"]


def load_spec(path: str | pathlib.Path) -> tuple[Spec | None, list[Diagnostic], str]:
    """Read, parse and check a spec file. Returns (spec or None, diagnostics, source text)."""
    tree, diags, text = parse_file(path)
    if tree is None or has_errors(diags):
        return None, diags, text
    spec, more = check(tree, str(path))
    return spec, diags + more, text
