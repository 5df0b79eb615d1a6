"""The one walker: a block and its `Table` in, a `Body` of checked values (with spans) out."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Any

from soakspec.diagnostics import Span
from soakspec.lang import ast as A
from soakspec.lang.check.core import Ctx, Got, Table, closest, convert

_WHAT = {A.Rule: ("rule", "a gate block"), A.Claim: ("claim", "the claims block")}


class Body:
    """A walked block. `b[key]` is the checked value, or the table's default when the key is
    absent or was wrong (and reported); `b.got(key)` the value as written, with its spans."""

    def __init__(self, ctx: Ctx, block: A.Block | None, table: Table, where: str):
        self.ctx = ctx
        self.table = table
        self.where = where
        self.span = block.kind_span if block is not None else Span()
        self.values: dict[str, Got] = {}
        self.blocks: dict[str, A.Block] = {}
        self.statements: list[A.Statement] = []
        self.extra: dict[str, A.Attribute] = {}  # attributes of a free-form block (env)
        self.suggested: set[str] = set()  # keys an unknown key was taken for
        self.moved: dict[str, set[str]] = {}  # {block inside this one: its keys written here instead}
        self.moved_up: set[str] = set()  # keys of the block this one is in, written here instead

    def __getitem__(self, key: str) -> Any:
        got = self.values.get(key)
        if got is not None and got.ok:
            return got.value
        k = self.table.key(key)
        return self.table.default(k) if k is not None else None

    def has(self, key: str) -> bool:
        return key in self.values

    def ok(self, key: str) -> bool:
        return key in self.values and self.values[key].ok

    def got(self, key: str) -> Got:
        return self.values[key]

    def require(self, key: str, msg: str | None = None) -> bool:
        """Report a missing key, unless an unknown key was already taken for it."""
        if key in self.values:
            return True
        if key not in self.suggested:
            self.ctx.error("E103", msg or f"{self.where} needs '{key}'", self.span)
        return False

    def fields(self) -> dict[str, Any]:
        """{dataclass field: value} for every key of the table that maps to a field."""
        return {k.field: self[k.name] for k in self.table.keys if k.field is not None}


def walk(ctx: Ctx, block: A.Block | None, table: Table, where: str, free: bool = False, taken: Iterable[str] = ()) -> Body:
    """Check a block against its table. `free`: any key is allowed (an env block). `taken`:
    keys reported as written in the block around this one, not missing here too."""
    body = Body(ctx, block, table, where)
    body.suggested.update(taken)
    if block is None:
        return body
    attrs = _attributes(ctx, block, where)
    for key, attr in attrs.items():
        k = table.key(key)
        if k is not None:
            body.values[key] = convert(ctx, k, attr)
        elif free:
            body.extra[key] = attr
        else:
            _unknown_key(ctx, body, attr)
    _sub_blocks(ctx, body, block)
    _statements(ctx, body, block)
    for k in table.keys:
        if k.required:
            body.require(k.name)
    return body


def _attributes(ctx: Ctx, block: A.Block, where: str) -> dict[str, A.Attribute]:
    attrs: dict[str, A.Attribute] = {}
    for stmt in block.body:
        if not isinstance(stmt, A.Attribute):
            continue
        if stmt.key in attrs:
            first = attrs[stmt.key].key_span
            ctx.error("E102", f"duplicate key '{stmt.key}' in {where} (first set on line {first.line})", stmt.key_span)
            continue
        attrs[stmt.key] = stmt
    return attrs


# A key named as `vllm bench serve` names its option, and the key that says it here: what a
# did-you-mean offers where the spelling is too far off for `closest` to find it.
VLLM_NAMES = {"range_ratio": "length_range", "random_range_ratio": "length_range"}


def _unknown_key(ctx: Ctx, body: Body, attr: A.Attribute) -> None:
    if attr.key in body.table.blocks:
        ctx.error("E104", f"'{attr.key}' is a block: {attr.key} {{ ... }}", attr.key_span)
        return
    belongs = ctx.elsewhere(attr.key, body.table) if ctx.elsewhere is not None else None
    if belongs is not None and belongs.near:  # a nearby block's key: name that block, not a lookalike of this one
        if belongs.inside is not None:  # not also missing there (nor that block, when absent)
            body.suggested.add(belongs.inside)
            body.moved.setdefault(belongs.inside, set()).add(attr.key)
        elif belongs.up:
            body.moved_up.add(attr.key)
        ctx.error("E101", f"unknown key '{attr.key}' in {body.where}", attr.key_span, belongs.hint)
        return
    options = [k.name for k in body.table.keys] + list(body.table.blocks)
    meant = VLLM_NAMES.get(attr.key)
    if meant not in options:
        meant = closest(attr.key, [o for o in options if o not in body.values] or options)
    if meant is not None:
        body.suggested.add(meant)
    hint = f"did you mean '{meant}'?" if meant else None
    if belongs is not None:  # a far block's key: said too, after a lookalike of this block's
        hint = f"{hint} ({belongs.hint})" if hint else belongs.hint
    ctx.error("E101", f"unknown key '{attr.key}' in {body.where}", attr.key_span, hint)


def _sub_blocks(ctx: Ctx, body: Body, block: A.Block) -> None:
    for stmt in block.body:
        if not isinstance(stmt, A.Block):
            continue
        if stmt.kind not in body.table.blocks and body.table.key(stmt.kind) is not None:
            body.suggested.add(stmt.kind)  # reported here: not also as missing
            ctx.error("E104", f"'{stmt.kind}' is a key in {body.where}, not a block", stmt.kind_span, f"write {stmt.kind} = <value>")
        elif stmt.kind not in body.table.blocks:
            options = list(body.table.blocks) + [k.name for k in body.table.keys]
            meant = closest(stmt.kind, options)
            if meant is not None:
                body.suggested.add(meant)
            hint = f"did you mean '{meant}'?" if meant else None
            ctx.error("E100", f"unknown block '{stmt.kind}' in {body.where}", stmt.kind_span, hint)
        elif stmt.kind in body.blocks:
            ctx.error("E105", f"'{stmt.kind}' may appear once in {body.where}", stmt.kind_span)
        else:
            if stmt.label is not None:
                ctx.error("E107", f"'{stmt.kind}' takes no name", stmt.label.span)
            body.blocks[stmt.kind] = stmt


def _statements(ctx: Ctx, body: Body, block: A.Block) -> None:
    for stmt in block.body:
        if isinstance(stmt, (A.Attribute, A.Block)):
            continue
        if isinstance(stmt, body.table.statements):
            body.statements.append(stmt)
            continue
        what, allowed = _WHAT[type(stmt)]
        ctx.error("E108", f"a {what} belongs in {allowed}, not in {body.where}", stmt.span)


def sub(ctx: Ctx, body: Body, kind: str, table: Table, where: str, free: bool = False) -> Body | None:
    """Walk the sub-block `kind` of a walked block, or None when it is absent."""
    blk = body.blocks.get(kind)
    if blk is None:
        return None
    inner = walk(ctx, blk, table, where, free, taken=body.moved.get(kind, ()))
    body.suggested |= inner.moved_up  # written in there: not also missing out here
    return inner


def walk_settings(ctx: Ctx, blk: A.Block, table: Table, where: str) -> tuple[Body, dict[str, Any]]:
    """A top-level block of settings that takes no name (`gate`, `compare`): walked, and its
    `confidence` kept at least 50 % and below 100 % (else reported and left at its default).
    Returns the body and its fields."""
    if blk.label is not None:
        ctx.error("E107", f"'{where}' takes no name", blk.label.span)
    b = walk(ctx, blk, table, where)
    fields = b.fields()
    if b.ok("confidence") and not 0.5 <= b["confidence"] < 1:
        ctx.error("E204", "'confidence' must be at least 50% and below 100%", b.got("confidence").span)
        fields["confidence"] = table.default(table.key("confidence"))
    return b, fields


def replace_default(table: Table, **defaults: Any) -> Table:
    """The same table with other defaults (e.g. a sampling block defaults to temperature 1)."""
    keys = tuple(dataclasses.replace(k, default=defaults[k.name]) if k.name in defaults else k for k in table.keys)
    return dataclasses.replace(table, keys=keys)
