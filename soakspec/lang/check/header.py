"""The single top-level blocks: `soak` (the header), `model`, `source` and `telemetry`."""

from __future__ import annotations

import re

from soakspec.diagnostics import Span
from soakspec.lang import ast as A
from soakspec.lang import spec as S
from soakspec.lang.check.core import Ctx, Key, Table
from soakspec.lang.check.walk import walk
from soakspec.units import Dimension

HEADER = Table(
    cls=S.Header,
    keys=(
        Key("issue", "str", "issue"),
        Key("description", "str", "description"),
        Key("parallel", "bool", "parallel"),
    ),
)

MODEL = Table(
    cls=S.Model,
    keys=(
        Key("id", "str", "id"),
        Key("revision", "str", "revision"),
        Key("path", "str", "path"),
        Key("served_name", "str", "served_name"),
    ),
)

SOURCE = Table(cls=S.Source, keys=(Key("repo", "str", "repo", required=True), Key("allow_dirty", "bool", "allow_dirty")))

TELEMETRY = Table(
    cls=S.Telemetry,
    keys=(
        Key("interval", "quantity", "interval_s", Dimension.DURATION),
        Key("require_gpus", "bool", "require_gpus"),
    ),
)

_REVISION = re.compile(r"[0-9a-f]{7,64}|[A-Za-z0-9._\-/]+")


def header(ctx: Ctx, blk: A.Block | None) -> S.Header:
    if blk is None:
        ctx.error("E103", "the spec needs a header: soak \"name\" { issue = \"...\" }", Span(1, 1, 1, 2))
        return S.Header(name="unnamed")
    b = walk(ctx, blk, HEADER, "the soak header")
    name = blk.label.value if blk.label is not None else None
    if not name:
        ctx.error("E107", "the soak header needs a name: soak \"name\" { ... }", blk.kind_span)
    return S.Header(name=name or "unnamed", **b.fields())


def model(ctx: Ctx, blk: A.Block | None) -> S.Model:
    if blk is None:
        return S.Model()
    if blk.label is not None:
        ctx.error("E107", "'model' takes no name; use id = \"...\"", blk.label.span)
    b = walk(ctx, blk, MODEL, "model")
    if b["revision"] is not None and not _REVISION.fullmatch(b["revision"]):
        ctx.error("E409", "model revision must be a commit hash or a tag", b.got("revision").span)
    return S.Model(**b.fields())


def source(ctx: Ctx, blk: A.Block | None) -> S.Source:
    if blk is None:
        return S.Source()
    return S.Source(**walk(ctx, blk, SOURCE, "source").fields())


def telemetry(ctx: Ctx, blk: A.Block | None) -> S.Telemetry:
    if blk is None:
        return S.Telemetry()
    return S.Telemetry(**walk(ctx, blk, TELEMETRY, "telemetry").fields())
