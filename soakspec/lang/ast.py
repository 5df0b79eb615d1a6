"""The syntax tree of a .soak file: frozen dataclasses with source spans.

The tree mirrors the grammar (`grammar/soak.lark`) and knows nothing about what the keys
mean; that is `soakspec.lang.check`'s job. Spans never take part in equality (comments
do), so `parse(fmt(tree)) == tree` is a meaningful property.

Comments are attached to statements: `comments` are the full-line comments directly above a
statement, `trailing` the comment at the end of its last line. Comments before a block's
closing brace, or at the end of the file, are kept as `closing_comments`.
"""

from __future__ import annotations

import dataclasses
from typing import Union

from soakspec.diagnostics import NO_SPAN, Span


def _span() -> Span:
    return dataclasses.field(default=NO_SPAN, compare=False, repr=False)


def _comments() -> tuple[str, ...]:
    return dataclasses.field(default=(), repr=False)


# ---------------------------------------------------------------- values


@dataclasses.dataclass(frozen=True, slots=True)
class Str:
    value: str
    style: str = "plain"  # plain | raw | long   (how fmt writes it)
    span: Span = _span()


@dataclasses.dataclass(frozen=True, slots=True)
class Num:
    value: int | float
    span: Span = _span()


# The words of a count of requests (`warmup = 20 requests`): a quantity's unit written after a
# space (`fmt` writes it so; `20requests` reads the same)
COUNT_UNITS = ("request", "requests")


@dataclasses.dataclass(frozen=True, slots=True)
class Quantity:
    """A number with its unit exactly as written (`50ms`; a count's word after a space, `20
    requests`: COUNT_UNITS); conversion happens in check."""

    value: int | float
    unit: str
    span: Span = _span()


@dataclasses.dataclass(frozen=True, slots=True)
class Bool:
    value: bool
    span: Span = _span()


@dataclasses.dataclass(frozen=True, slots=True)
class Word:
    """A bare word used as a value: `endpoint = completions`, `sampling = greedy`."""

    name: str
    span: Span = _span()


@dataclasses.dataclass(frozen=True, slots=True)
class List:
    items: tuple["Value", ...]
    span: Span = _span()


Value = Union[Str, Num, Quantity, Bool, Word, List]


# ---------------------------------------------------------------- rule expressions


@dataclasses.dataclass(frozen=True, slots=True)
class MetricRef:
    name: str
    span: Span = _span()


@dataclasses.dataclass(frozen=True, slots=True)
class Call:
    func: str
    arg: "Expr"
    span: Span = _span()


# The functions of several expressions (`MultiCall`): the parser's "expected ..." lists a ','
# inside no other call (`p95(ttft <= 1s` expects ')'), and the checker knows each one
MULTI_ARG_FUNCTIONS = frozenset({"ratio"})


@dataclasses.dataclass(frozen=True, slots=True)
class MultiCall:
    """`ratio(server("a_total"), server("b_total"))`: a function of two or more expressions.
    The grammar takes any number so that a wrong count is the checker's error (with its code,
    caret and hint), not a parse error; the checker knows only `ratio` of two server counters."""

    func: str
    args: tuple["Expr", ...]
    span: Span = _span()


@dataclasses.dataclass(frozen=True, slots=True)
class Slo:
    """One condition of an SLO set: `ttft < 500ms`."""

    metric: str
    op: str
    threshold: "Value"
    span: Span = _span()


@dataclasses.dataclass(frozen=True, slots=True)
class SloCall:
    """`goodput(ttft < 500ms and tpot < 50ms)`: a function of a set of per-request conditions."""

    func: str
    conditions: tuple[Slo, ...]
    span: Span = _span()


@dataclasses.dataclass(frozen=True, slots=True)
class NamedRef:
    """`server("vllm:num_requests_waiting")`: a metric named by a string (`func` is the word
    before the parenthesis; the checker knows `server`, the server's own Prometheus metrics)."""

    func: str
    name: str
    span: Span = _span()


Expr = Union[MetricRef, Call, MultiCall, SloCall, NamedRef]


# ---------------------------------------------------------------- statements


@dataclasses.dataclass(frozen=True, slots=True)
class Attribute:
    key: str
    value: Value
    span: Span = _span()
    key_span: Span = _span()
    comments: tuple[str, ...] = _comments()
    trailing: str | None = dataclasses.field(default=None, repr=False)


@dataclasses.dataclass(frozen=True, slots=True)
class Scope:
    kind: str  # run | backend | level | bucket | window
    length: Quantity | None = None
    span: Span = _span()


@dataclasses.dataclass(frozen=True, slots=True)
class Rule:
    severity: str  # require | warn
    expr: Expr
    op: str | None = None
    threshold: Value | None = None
    scope: Scope | None = None
    target: Str | None = None  # on "backend"
    span: Span = _span()
    comments: tuple[str, ...] = _comments()
    trailing: str | None = dataclasses.field(default=None, repr=False)


@dataclasses.dataclass(frozen=True, slots=True)
class Claim:
    kind: str  # claim | exclude
    text: Str
    span: Span = _span()
    comments: tuple[str, ...] = _comments()
    trailing: str | None = dataclasses.field(default=None, repr=False)


@dataclasses.dataclass(frozen=True, slots=True)
class Block:
    kind: str
    label: Str | None
    body: tuple["Statement", ...]
    span: Span = _span()
    kind_span: Span = _span()
    comments: tuple[str, ...] = _comments()
    trailing: str | None = dataclasses.field(default=None, repr=False)
    closing_comments: tuple[str, ...] = _comments()


Statement = Union[Attribute, Rule, Claim, Block]


@dataclasses.dataclass(frozen=True, slots=True)
class SoakFile:
    body: tuple[Statement, ...]
    closing_comments: tuple[str, ...] = _comments()
