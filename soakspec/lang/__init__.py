"""The .soak language: `parse` (text -> AST), `check` (AST -> Spec), `fmt` (AST -> text)."""

from __future__ import annotations

import pathlib
from collections.abc import Mapping
from typing import Any

from soakspec.diagnostics import Diagnostic, has_errors
from soakspec.lang.check import check, is_generic_runtime_label
from soakspec.lang.fmt import fmt
from soakspec.lang.parser import parse, parse_file, source_text
from soakspec.lang.spec import Spec

__all__ = ["check", "fmt", "is_generic_runtime_label", "load_spec", "load_text", "parse", "parse_file", "Spec"]


def load_spec(path: str | pathlib.Path) -> tuple[Spec | None, list[Diagnostic], str]:
    """Read, parse and check a spec file. Returns (spec or None, diagnostics, source text)."""
    tree, diags, text = parse_file(path)
    if tree is None or has_errors(diags):
        return None, diags, text
    spec, more = check(tree, str(path))
    return spec, diags + more, text


def load_text(text: str, path: str, *, data_optional: bool = False,
              data_files: Mapping[str, Any] | None = None) -> tuple[Spec | None, list[Diagnostic], str]:
    """`load_spec` of text already read (`soakspec check -`: stdin), shown as `path`; relative
    paths in it are taken from the working directory. `data_optional`: a finished run's
    embedded spec, checked to judge its evidence: its data files are looked for where the spec
    names them and where its manifest recorded them (`data_files`: `recorded_data_files`), and
    taken only with the sha256 the run read; a prompt file found nowhere is W513, not an error
    (`check.requests.dataset`), a replayed trace still E423 (its levels are planned from it).
    Returns (spec or None, diagnostics, the source text the diagnostics' positions count in)."""
    tree, diags = parse(text, path)
    shown = source_text(text)
    if tree is None or has_errors(diags):
        return None, diags, shown
    spec, more = check(tree, path, data_optional=data_optional, data_files=data_files)
    return spec, diags + more, shown
