"""`SoakFile` -> `Spec`: names, references, types, units, ranges and contradictions.

`check(tree)` is pure: it never touches the file system, the network or a process (a spec
is code, like a Makefile, and checking it must be safe). It reports every problem it can
find in one pass, as `Diagnostic`s with the position of the offending node, and returns a
`Spec` only when there are no errors.

One module per block (`header`, `backend`, `workload`, `gate`, `claims`), each a declarative
`Table` of its keys plus small named cross-field checks; `walk` is the one generic walker
(unknown, duplicate, missing, type, unit, range, suggestions). Codes: `soakspec.lang.codes`.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Callable, Mapping
from typing import Any

from soakspec.diagnostics import Diagnostic, Severity, Span
from soakspec.lang import ast as A
from soakspec.lang import spec as S
from soakspec.lang.check import backend, claims, compare, gate, header, layout, workload
from soakspec.lang.check.backend import BACKEND_BLOCKS, BACKEND_KEYS, PLACEHOLDERS
from soakspec.lang.check.core import MAX_DURATION_S, Ctx, suggest
from soakspec.lang.check.gate import SCOPES
from soakspec.lang.check.workload import MAX_BUCKETS_PER_LEVEL, MAX_LOAD_LEVEL, MAX_TOTAL_LOAD_S, WORKLOAD_KEYS
from soakspec.lang.fmt import fmt, strip_comments
from soakspec.lang.parser import gc_paused
from soakspec.lang.runtime_label import is_generic_label

__all__ = [
    "BACKEND_BLOCKS",
    "BACKEND_KEYS",
    "MAX_BUCKETS_PER_LEVEL",
    "MAX_DURATION_S",
    "MAX_LOAD_LEVEL",
    "MAX_TOTAL_LOAD_S",
    "PLACEHOLDERS",
    "SCOPES",
    "TOP_LEVEL",
    "WORKLOAD_KEYS",
    "check",
    "is_generic_runtime_label",
    "spec_hash",
]

# One definition of "generic", shared with the evidence layer that re-checks it after a run.
is_generic_runtime_label = is_generic_label

TOP_LEVEL = ("soak", "model", "source", "telemetry", "backend", "workload", "gate", "claims", "compare")
_NAMED = ("backend", "workload")


def spec_hash(tree: A.SoakFile) -> tuple[str, str]:
    """(canonical text, its sha256): `fmt` of the tree without its comments, so that a
    comment never makes retained evidence look stale."""
    text = fmt(strip_comments(tree))
    return text, hashlib.sha256(text.encode()).hexdigest()


def check(tree: A.SoakFile, path: str = "<string>", *, data_optional: bool = False,
          data_files: Mapping[str, Any] | None = None) -> tuple[S.Spec | None, list[Diagnostic]]:
    """`data_optional`: the spec a finished run embedded, checked to judge its evidence, and
    `data_files` its manifest's record of the data files it read (`Ctx`)."""
    with gc_paused():  # as for the parse: tens of thousands of objects, none of them garbage
        return _check(tree, path, data_optional, data_files)


def _check(tree: A.SoakFile, path: str, data_optional: bool = False,
           data_files: Mapping[str, Any] | None = None) -> tuple[S.Spec | None, list[Diagnostic]]:
    ctx = Ctx(path, elsewhere=layout.elsewhere, data_optional=data_optional, data_files=data_files)
    singles, named, again = _top_level(ctx, tree)
    erred: set[tuple[str, str]] = set()  # (kind, name) of the backends and workloads an error was reported in
    bks = _named(ctx, named["backend"], "backend", lambda b: _noting_errors(ctx, erred, "backend", b, backend.backend))
    wls = _named(ctx, named["workload"], "workload", lambda w: _noting_errors(ctx, erred, "workload", w, workload.workload))
    if not named["backend"]:
        ctx.error("E407", "the spec declares no backend", Span(1, 1, 1, 2), "add: backend \"name\" { launch = [...] } or { url = \"...\" } or { sim {} }")
    if not named["workload"]:
        ctx.error("E407", "the spec declares no workload", Span(1, 1, 1, 2), "add: workload \"name\" { ... }")
    parts = dict(
        header=header.header(ctx, singles.get("soak")),
        model=header.model(ctx, singles.get("model")),
        source=header.source(ctx, singles.get("source")),
        telemetry=header.telemetry(ctx, singles.get("telemetry")),
        gate=gate.gate(ctx, singles.get("gate"), {b.name: b for b in bks}),
        claims=claims.claims(ctx, singles.get("claims")),
        compare=compare.compare(ctx, singles.get("compare")),
    )
    known = {b.name: b for b in bks}
    single = {"soak": header.header, "model": header.model, "source": header.source, "telemetry": header.telemetry,
              "gate": lambda c, blk: gate.gate(c, blk, known), "claims": claims.claims, "compare": compare.compare}
    for blk in again:  # a block that may appear once, again: E105 above, and its body's own mistakes
        single[blk.kind](ctx, blk)
    workload.check_total_load(ctx, wls, len(bks), parts["header"].parallel)
    gate.check_scope_rules(ctx, parts["gate"], wls)
    gate.check_window_rules(ctx, parts["gate"], wls)
    # W509 estimates from the workloads' and backends' values: not from the defaults that stand
    # in for values refused above (a refused concurrency is not "concurrency 1")
    gate.planned_sample_warnings(ctx, parts["gate"], [w for w in wls if ("workload", w.name) not in erred],
                                 {b.name: b for b in bks if ("backend", b.name) not in erred})  # W509
    diags = collapse_repeated_warnings(ctx.diags)
    if any(d.severity is Severity.ERROR for d in diags):
        return None, diags
    text, sha = spec_hash(tree)
    spec = S.Spec(backends=tuple(bks), workloads=tuple(wls), canonical_text=text, sha256=sha, path=path, **parts)
    return spec, diags


def _noting_errors(ctx: Ctx, erred: set[tuple[str, str]], kind: str, blk: A.Block, build: Callable[[Ctx, A.Block], Any]) -> Any:
    """`build(ctx, blk)`, noting (kind, name) in `erred` when it reported an error."""
    before = ctx.errors
    item = build(ctx, blk)
    if ctx.errors > before:
        erred.add((kind, blk.label.value))
    return item


def collapse_repeated_warnings(diags: list[Diagnostic]) -> list[Diagnostic]:
    """Each distinct warning once: a warning repeated word for word (the same code and message,
    e.g. W505 in a hundred copied workloads) is reported at its first place, with a count."""
    counts: dict[tuple[str, str], int] = {}
    for d in diags:
        if d.severity is Severity.WARNING:
            counts[(d.code, d.message)] = counts.get((d.code, d.message), 0) + 1
    out, seen = [], set()
    for d in diags:
        key = (d.code, d.message)
        if d.severity is not Severity.WARNING or counts[key] == 1:
            out.append(d)
        elif key not in seen:
            seen.add(key)
            out.append(dataclasses.replace(d, message=f"{d.message} (and {counts[key] - 1} more like it)"))
    return out


def _top_level(ctx: Ctx, tree: A.SoakFile) -> tuple[dict[str, A.Block], dict[str, list[A.Block]], list[A.Block]]:
    """The blocks that may appear once (the first of each), the named ones by kind, and the
    second and later of a block that may appear once (E105: its body is still checked)."""
    singles: dict[str, A.Block] = {}
    named: dict[str, list[A.Block]] = {k: [] for k in _NAMED}
    again: list[A.Block] = []
    for stmt in tree.body:
        if isinstance(stmt, A.Block) and stmt.kind in _NAMED:
            named[stmt.kind].append(stmt)
        elif isinstance(stmt, A.Block) and stmt.kind in singles:
            first = singles[stmt.kind].span.line
            ctx.error("E105", f"'{stmt.kind}' may appear once (first on line {first})", stmt.kind_span)
            again.append(stmt)
        elif isinstance(stmt, A.Block) and stmt.kind in TOP_LEVEL:
            singles[stmt.kind] = stmt
        elif isinstance(stmt, A.Block):
            ctx.error("E100", f"unknown block '{stmt.kind}'", stmt.kind_span, suggest(stmt.kind, TOP_LEVEL))
        elif isinstance(stmt, A.Attribute):
            belongs = layout.home(stmt.key, layout.TOP)
            ctx.error("E101", f"unknown key '{stmt.key}' at the top level (settings go inside a block)", stmt.key_span,
                      belongs.hint if belongs is not None else None)
        elif isinstance(stmt, A.Rule):
            ctx.error("E108", "a rule belongs in a gate block", stmt.span)
        else:
            ctx.error("E108", f"'{stmt.kind}' belongs in the claims block", stmt.span)
    return singles, named, again


def _named(ctx: Ctx, blocks: list[A.Block], what: str, build: Callable[[A.Block], Any]) -> list:
    seen: dict[str, A.Block] = {}
    out = []
    for blk in blocks:
        if blk.label is None:
            ctx.error("E107", f"a {what} needs a name: {what} \"name\" {{ ... }}", blk.kind_span)
            continue
        name = blk.label.value
        if not name.strip() or len(name) > 64 or any(c in name for c in "\n\r\t\0"):
            ctx.error("E107", f"{what} name must be 1 to 64 characters on one line", blk.label.span)
            continue
        if name in seen:
            ctx.error("E106", f"duplicate {what} '{name}' (first declared on line {seen[name].span.line})", blk.label.span)
            build(blk)  # its body's mistakes are reported too (all at once), the block itself is not kept
            continue
        seen[name] = blk
        item = build(blk)
        if item is not None:
            out.append(item)
    return out
