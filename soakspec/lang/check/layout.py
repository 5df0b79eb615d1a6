"""Where each block is written: the tree of blocks, for the hint of a key in the wrong one.

A key its block does not have but another block does (`concurrency = [4]` in a workload, not
in its `load { }`) is an unknown key whose hint names the block that has it -- the nearest:
a block inside this one, the block this one is in, one beside it, else any that has it.
"""

from __future__ import annotations

import dataclasses

from soakspec.lang.check.backend import BACKEND, METRICS, READY, RUNTIME, SIM, TRACES
from soakspec.lang.check.compare import COMPARE
from soakspec.lang.check.core import Table
from soakspec.lang.check.gate import GATE
from soakspec.lang.check.header import HEADER, MODEL, SOURCE, TELEMETRY
from soakspec.lang.check.workload import CLOSED_PHASE, LOAD, OPEN_PHASE, SAMPLING, WORKLOAD


@dataclasses.dataclass(frozen=True)
class Place:
    kind: str  # the block's word (a phase's is its own name: "phase" here)
    tables: tuple[Table, ...]
    parent: str | None  # the kind of the block it is written in; None: the top level
    written: str  # how a hint names it from the block it is in
    anywhere: str = ""  # how a hint names it from elsewhere (default: `written`)
    # with several tables (a phase: closed-loop or open-loop), how a hint names each, in order
    variants: tuple[str, ...] = ()


def _nested(kind: str, parent: str, table: Table) -> Place:
    return Place(kind, (table,), parent, f"{kind} {{ ... }}", f"{kind} {{ ... }} of a {parent}")


PLACES: tuple[Place, ...] = (
    Place("soak", (HEADER,), None, 'the soak header, soak "name" { ... }'),
    Place("model", (MODEL,), None, "model { ... }"),
    Place("source", (SOURCE,), None, "source { ... }"),
    Place("telemetry", (TELEMETRY,), None, "telemetry { ... }"),
    Place("backend", (BACKEND,), None, 'backend "name" { ... }'),
    *(_nested(kind, "backend", table) for kind, table in (("sim", SIM), ("ready", READY), ("runtime", RUNTIME),
                                                          ("traces", TRACES), ("metrics", METRICS))),  # fmt: skip
    Place("workload", (WORKLOAD,), None, 'workload "name" { ... }'),
    _nested("load", "workload", LOAD),
    _nested("sampling", "workload", SAMPLING),
    Place("phase", (CLOSED_PHASE, OPEN_PHASE), "load", "a phase, phases { NAME { ... } }",
          "a phase of a workload's load, phases { NAME { ... } }",
          ("a closed-loop phase (load mode = closed; its workers: concurrency)",
           "an open-loop phase (load mode = open; its arrivals: rate)")),
    Place("gate", (GATE,), None, "gate { ... }"),
    Place("compare", (COMPARE,), None, "compare { ... }"),
)
TOP = Place("", (), None, "the top level")  # where the top-level blocks are written


def elsewhere(key: str, table: Table) -> Home | None:
    """Where `key`, unknown in a block walked with `table`, belongs (the checker's
    `Ctx.elsewhere`): a key of the same block in another mode (`concurrency` in an open-loop
    phase) says so -- naming the block one level up would lead to a second error there."""
    here = place_of(table)
    if here is not None and here.variants:
        own = next(i for i, t in enumerate(here.tables) if t is table)
        other = [i for i, t in enumerate(here.tables) if t is not table and t.key(key) is not None]
        if other:
            return Home(f"'{key}' belongs in {here.variants[other[0]]}; this is {here.variants[own]}")
    return home(key, here)


def place_of(table: Table) -> Place | None:
    """The place a block walked with `table` is in; None for a table not in PLACES (a free-form
    block's)."""
    return next((p for p in PLACES if any(t is table for t in p.tables)), None)


@dataclasses.dataclass(frozen=True)
class Home:
    """Where an unknown key belongs: the hint; whether that block is near (inside this one, the
    one this is in, or beside it: else a lookalike key of this block may be what was meant);
    and, when it is the one block inside this one that has the key, its kind (`inside`), or
    whether it is the block this one is in (`up`)."""

    hint: str
    near: bool = True
    inside: str | None = None
    up: bool = False


def home(key: str, here: Place | None) -> Home | None:
    """Where `key`, unknown in the block at `here` (None: a block not in PLACES), belongs; None
    when no block has it."""
    homes = [p for p in PLACES if p is not here and any(t.key(key) is not None for t in p.tables)]
    if not homes:
        return None
    if here is not None:
        inside = [p for p in homes if p.parent == (here.kind or None)]
        up = [p for p in homes if here.parent is not None and p.kind == here.parent]
        if up:  # `duration` in a load block: the workload's, or a phase's
            hint = _say(key, "one level up, in", [up[0].written])
            return Home(hint + (f" (or inside {' or '.join(p.written for p in inside)})" if inside else ""), up=True)
        if inside:
            return Home(_say(key, "inside", [p.written for p in inside]), inside=inside[0].kind if len(inside) == 1 else None)
        beside = [p for p in homes if p.parent == here.parent]
        if beside:
            return Home(_say(key, "inside", [p.written for p in beside]))
    return Home(_say(key, "inside", [p.anywhere or p.written for p in homes]), near=False)


def _say(key: str, where: str, places: list[str]) -> str:
    return f"'{key}' belongs {where} {' or '.join(places)}"
