"""`claims { claim "..."  exclude "..." }`: the boundary of what the evidence may support."""

from __future__ import annotations

from soakspec.lang import ast as A
from soakspec.lang import spec as S
from soakspec.lang.check.core import Ctx, Table
from soakspec.lang.check.walk import walk

CLAIMS = Table(cls=S.ClaimBoundary, keys=(), statements=(A.Claim,))


def claims(ctx: Ctx, blk: A.Block | None) -> S.ClaimBoundary:
    if blk is None:
        return S.ClaimBoundary()
    b = walk(ctx, blk, CLAIMS, "claims")
    found: dict[str, list[str]] = {"claim": [], "exclude": []}
    seen: set[str] = set()
    for stmt in b.statements:
        text = stmt.text.value.strip()
        if not text:
            ctx.error("E205", f"an empty {stmt.kind} says nothing", stmt.text.span)
            continue
        if text.lower() in seen:
            ctx.warn("W506", f"{stmt.kind} {text!r} is listed twice", stmt.text.span)
        seen.add(text.lower())
        found[stmt.kind].append(text)
    if not found["claim"]:
        ctx.warn("W507", "the claim boundary states no claim", blk.kind_span)
    return S.ClaimBoundary(tuple(found["claim"]), tuple(found["exclude"]))
