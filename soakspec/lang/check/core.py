"""The generic half of the checker: a key table per block, and one walker over it.

A block is described by a `Table` of `Key`s (name -> value type, unit kind, range, and the
`Spec` dataclass field whose default is the key's default). `walk` goes over a block once and
reports, from the table alone, every unknown key or block (with a suggestion of what is valid
there), duplicate, missing required key, wrong type, wrong unit and out-of-range value. What it
returns, a `Body`, carries each value with its spans, so that the cross-field checks of each
block (small named functions beside its table) point at the right place.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import math
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from soakspec.diagnostics import Diagnostic, Severity, Span
from soakspec.lang import ast as A
from soakspec.lang.codes import CODES
from soakspec.lang.fmt import value_text
from soakspec.units import UNITS, UNITS_BY_DIMENSION, Dimension, unit_for_word

MAX_DURATION_S = 30 * 86400.0  # any duration in a spec; longer is a typo, and sums must stay finite
# The ceiling of a quantity key whose table row names no `maximum`, by its unit kind. Every
# numeric key is bounded, so that what `check` passes `plan` and `run` can hold: a value past
# these is a typo (an extra zero, a pasted number), never a real soak.
MAX_RATE_RPS = 1_000_000.0  # as many requests/s as workers (workload.MAX_LOAD_LEVEL): far past one load generator
MAX_SIZE_BYTES = float(2**50)  # 1 PiB: past any accelerator's memory (a simulated one included)
MAX_RATIO = 100.0  # 10000 %: a growth or slowdown fraction; probabilities and shares say maximum=1.0
DEFAULT_MAXIMUM = {Dimension.DURATION: MAX_DURATION_S, Dimension.RATE: MAX_RATE_RPS, Dimension.SIZE: MAX_SIZE_BYTES,
                   Dimension.RATIO: MAX_RATIO}  # fmt: skip


class Ctx:
    """Where diagnostics go: one per `check` call. `elsewhere(key, table)`: where a key unknown
    in the block walked with `table` belongs instead (`layout.elsewhere`, which knows every
    block's table: given here because those modules import the walker)."""

    def __init__(self, path: str, elsewhere: Callable[[str, Table], Any] | None = None, data_optional: bool = False,
                 data_files: Mapping[str, Any] | None = None):
        self.path = path
        self.elsewhere = elsewhere
        # a finished run's embedded spec, checked to judge its evidence: a prompt file that is
        # not here (the evidence copied elsewhere, a relative path from another folder) is a
        # warning, W513, and the workload has no dataset -- what a run sent is in its records;
        # `data_files`: the manifest's record of the files the run read, by kind ("prompt",
        # "trace") and workload (path, sha256: `evidence.manifest.recorded_data_files`), where
        # each is looked for too and which a file found must be
        self.data_optional = data_optional
        self.data_files = data_files or {}
        self.diags: list[Diagnostic] = []
        self.errors = 0  # how many of `diags` are errors

    def error(self, code: str, msg: str, span: Span, hint: str | None = None) -> None:
        assert code in CODES, code
        self.errors += 1
        self.diags.append(Diagnostic(code, msg, span, self.path, Severity.ERROR, hint))

    def warn(self, code: str, msg: str, span: Span, hint: str | None = None) -> None:
        assert code in CODES, code
        self.diags.append(Diagnostic(code, msg, span, self.path, Severity.WARNING, hint))


MAX_SPELLING_CANDIDATES = 256


def closest(name: str, options: Iterable[str]) -> str | None:
    """What was probably meant: a valid word the name begins with (`chat_completions` ->
    `chat`), else the closest by spelling. Answers are remembered (the same misspelling in a
    thousand copied blocks is looked up once), and among more than MAX_SPELLING_CANDIDATES
    options (a `on "..."` over thousands of backend names) only those of a length within a
    third of the name's are compared by spelling, at most that many -- a did-you-mean, not a
    search, so that checking stays linear in the spec."""
    return _closest(name, tuple(options))


@functools.lru_cache(maxsize=4096)
def _closest(name: str, options: tuple[str, ...]) -> str | None:
    lower = name.lower()
    prefixed = [o for o in options if len(o) >= 3 and lower.startswith(o.lower())]
    if prefixed:
        return max(prefixed, key=len)
    if len(options) > MAX_SPELLING_CANDIDATES:
        slack = max(2, len(name) // 3)
        options = tuple(o for o in options if abs(len(o) - len(name)) <= slack)[:MAX_SPELLING_CANDIDATES]
    close = difflib.get_close_matches(name, options, n=1, cutoff=0.6)
    return close[0] if close else None


def suggest(name: str, options: Iterable[str]) -> str | None:
    found = closest(name, options)
    return f"did you mean '{found}'?" if found else None


# ---------------------------------------------------------------- tables

NO_DEFAULT = object()


@dataclasses.dataclass(frozen=True)
class Key:
    """One key of a block. `type` is one of CONVERTERS; `field` names the `Spec` dataclass
    field the value goes to (its default is the key's default unless `default` is given)."""

    name: str
    type: str
    field: str | None = None
    unit: Dimension | None = None
    choices: tuple[str, ...] = ()
    minimum: float | None = None
    maximum: float | None = None  # every int and number key names one (tests/test_lang_tables.py); quantities: DEFAULT_MAXIMUM
    why: str | None = None  # why the maximum: the hint of the E204 past it
    low: str | None = None  # int keys: the hint of the E204 below the minimum (what to write instead)
    required: bool = False
    allow_zero: bool = False  # durations and rates must be more than zero unless allowed
    default: Any = NO_DEFAULT
    hints: tuple[tuple[str, str], ...] = ()  # (wrong word, hint) for words


@dataclasses.dataclass(frozen=True)
class Table:
    """A block: its keys, the sub-blocks it may hold, and which statements (rules, claims)."""

    keys: tuple[Key, ...]
    cls: type | None = None  # the Spec dataclass whose field defaults are the defaults
    blocks: tuple[str, ...] = ()
    statements: tuple[type, ...] = ()

    def key(self, name: str) -> Key | None:
        return _by_name(self.keys).get(name)

    def default(self, k: Key) -> Any:
        if k.default is not NO_DEFAULT:
            return k.default
        if k.required:
            return None
        if self.cls is not None and k.field is not None:
            f = _fields(self.cls).get(k.field)
            if f is not None:
                if f.default is not dataclasses.MISSING:
                    return f.default
                if f.default_factory is not dataclasses.MISSING:
                    return f.default_factory()
        return None


_KEYS_BY_NAME: dict[int, tuple[tuple[Key, ...], dict[str, Key]]] = {}


def _by_name(keys: tuple[Key, ...]) -> dict[str, Key]:
    """A table's keys by name (the first of a name wins, as the linear search did), built once
    per keys tuple: `Table.key` is asked for every key of every block."""
    found = _KEYS_BY_NAME.get(id(keys))
    if found is None or found[0] is not keys:
        index: dict[str, Key] = {}
        for k in keys:
            index.setdefault(k.name, k)
        if len(_KEYS_BY_NAME) > 256:  # tables made on the fly (`replace_default`): keep it bounded
            _KEYS_BY_NAME.clear()
        found = _KEYS_BY_NAME[id(keys)] = (keys, index)
    return found[1]


@functools.cache
def _fields(cls: type) -> dict[str, dataclasses.Field]:
    """A dataclass's fields by name, looked up once (defaults are read for every key of every block)."""
    return {f.name: f for f in dataclasses.fields(cls)}


@dataclasses.dataclass(frozen=True)
class Got:
    """A key as written: its converted value (when it was valid) and its spans."""

    key: str
    value: Any
    ok: bool
    span: Span  # the value
    key_span: Span
    node: A.Value


# ---------------------------------------------------------------- value conversion


def describe(v: A.Value) -> str:
    if isinstance(v, A.Str):
        return f"the string {value_text(v)}"
    if isinstance(v, A.Num):
        return f"the number {value_text(v)}"
    if isinstance(v, A.Quantity):
        return f"the quantity {value_text(v)}"
    if isinstance(v, A.Bool):
        return value_text(v)
    if isinstance(v, A.Word):
        return f"the name '{v.name}'"
    return "a list"


class Bad(Exception):
    """A value is wrong; already reported."""


def number_text(x: float) -> str:
    """A bound or a value as a reader takes it in: 4,000,000 and 0.5, not 4e+06; a pasted
    300-digit number as its size."""
    if isinstance(x, int) or (isinstance(x, float) and x.is_integer() and abs(x) < 1e16):
        n = int(x)
        return f"{n:,}" if abs(n) < 10**20 else f"a {len(str(abs(n)))}-digit number"
    return f"{x:g}"


def too_large(ctx: Ctx, key: str, shown: str, maximum: float, span: Span, why: str | None) -> None:
    """E204 for a value past its key's maximum, with the reason as the hint."""
    hint = why or "a larger value is almost certainly a typo"
    ctx.error("E204", f"'{key}' must be at most {number_text(maximum)}, not {shown}", span, hint)
    raise Bad


def int_value(ctx: Ctx, key: str, v: A.Value, minimum: float | None, maximum: float | None = None, why: str | None = None,
              low: str | None = None) -> int:
    if isinstance(v, A.Quantity):
        ctx.error("E104", f"'{key}' is a plain count and takes no unit (got {value_text(v)})", v.span)
        raise Bad
    if isinstance(v, A.Num) and isinstance(v.value, float) and v.value.is_integer() and abs(v.value) < 1e16:
        # `1e1`, `2.0`: a whole value written as a float (with a point or an exponent)
        ctx.error("E104", f"'{key}' takes a whole number, written in digits without a decimal point or an exponent", v.span,
                  f"write {int(v.value)}")
        raise Bad
    if not isinstance(v, A.Num) or not isinstance(v.value, int):
        ctx.error("E104", f"'{key}' must be a whole number, not {describe(v)}", v.span)
        raise Bad
    if minimum is not None and v.value < minimum:
        rel = "more than zero" if minimum == 1 else f"at least {minimum:g}"
        ctx.error("E204", f"'{key}' must be {rel}, not {number_text(v.value)}", v.span, low)
        raise Bad
    if maximum is not None and v.value > maximum:
        too_large(ctx, key, number_text(v.value), maximum, v.span, why)
    return v.value


def quantity_value(ctx: Ctx, key: str, v: A.Value, dim: Dimension) -> float:
    units = ", ".join(UNITS_BY_DIMENSION[dim])
    if isinstance(v, A.Num):
        if dim is Dimension.RATIO:
            if not 0 <= v.value <= 1:
                ctx.error("E204", f"'{key}' as a plain number is a fraction between 0 and 1; write {v.value}% for a percentage", v.span)
                raise Bad
            return float(v.value)
        ctx.error("E201", f"'{key}' needs a unit: write {value_text(v)} followed by one of {units}", v.span)
        raise Bad
    if not isinstance(v, A.Quantity):
        ctx.error("E104", f"'{key}' must be a {dim} ({units}), not {describe(v)}", v.span)
        raise Bad
    if v.unit not in UNITS:
        meant = unit_for_word(v.unit)  # `10sec`, `10seconds`, `5MS`: another way to write a unit
        hint = (f"write {value_text(A.Quantity(v.value, meant))}" if meant is not None and UNITS[meant][0] is dim
                else suggest(v.unit, UNITS_BY_DIMENSION[dim]))
        ctx.error("E202", f"unknown unit '{v.unit}' in {value_text(v)} (a {dim} takes {units})", v.span, hint)
        raise Bad
    got_dim, factor = UNITS[v.unit]
    if got_dim is not dim:
        ctx.error("E203", f"'{key}' is a {dim} ({units}); {value_text(v)} is a {got_dim}", v.span)
        raise Bad
    value = float(v.value) * factor
    if not math.isfinite(value) or (dim is Dimension.DURATION and abs(value) > MAX_DURATION_S):
        ctx.error("E204", f"'{key}' is too large" + (" (at most 30 days)" if dim is Dimension.DURATION else ""), v.span,
                  "a soak's durations are at most 30 days; a longer one is a typo" if dim is Dimension.DURATION else None)
        raise Bad
    return value


def _type_error(ctx: Ctx, k: Key, v: A.Value, expected: str) -> None:
    ctx.error("E104", f"'{k.name}' must be {expected}, not {describe(v)}", v.span)
    raise Bad


def _str(ctx: Ctx, k: Key, v: A.Value) -> str:
    if not isinstance(v, A.Str):
        _type_error(ctx, k, v, "a string")
    return v.value


def _word(ctx: Ctx, k: Key, v: A.Value) -> str:
    name = v.name if isinstance(v, A.Word) else v.value if isinstance(v, A.Str) else None
    if name is None:
        _type_error(ctx, k, v, "one of " + ", ".join(k.choices))
    if name not in k.choices:
        hint = dict(k.hints).get(name) or suggest(name, k.choices)
        ctx.error("E109", f"'{k.name}' must be one of {', '.join(k.choices)}, not '{name}'", v.span, hint)
        raise Bad
    return name


def _bool(ctx: Ctx, k: Key, v: A.Value) -> bool:
    if not isinstance(v, A.Bool):
        _type_error(ctx, k, v, "true or false")
    return v.value


def _int(ctx: Ctx, k: Key, v: A.Value) -> int:
    return int_value(ctx, k.name, v, k.minimum, k.maximum, k.why, k.low)


def _number(ctx: Ctx, k: Key, v: A.Value) -> float:
    if not isinstance(v, A.Num):
        _type_error(ctx, k, v, "a number")
    between = f"between {number_text(k.minimum)} and {number_text(k.maximum)}" if None not in (k.minimum, k.maximum) else None
    if k.minimum is not None and v.value < k.minimum:
        ctx.error("E204", f"'{k.name}' must be {between or f'at least {number_text(k.minimum)}'}, not {number_text(v.value)}", v.span)
        raise Bad
    if k.maximum is not None and v.value > k.maximum:
        if between is not None:
            hint = k.why or "a larger value is almost certainly a typo"
            ctx.error("E204", f"'{k.name}' must be {between}, not {number_text(v.value)}", v.span, hint)
            raise Bad
        too_large(ctx, k.name, number_text(v.value), k.maximum, v.span, k.why)
    return float(v.value)


def _positive(ctx: Ctx, k: Key, val: float, span: Span) -> float:
    if val < 0 or (val == 0 and not k.allow_zero):
        ctx.error("E204", f"'{k.name}' must be {'zero or more' if k.allow_zero else 'more than zero'}", span)
        raise Bad
    return val


def _quantity(ctx: Ctx, k: Key, v: A.Value) -> float:
    value = _positive(ctx, k, quantity_value(ctx, k.name, v, k.unit), v.span)
    maximum = k.maximum if k.maximum is not None else DEFAULT_MAXIMUM[k.unit]
    if value > maximum:  # durations past MAX_DURATION_S were refused by quantity_value already
        scale, unit = {Dimension.RATIO: (100, "%"), Dimension.RATE: (1, "rps"), Dimension.SIZE: (1024.0**-4, "TiB")}.get(k.unit, (1, "s"))
        shown = number_text(maximum * scale) + unit
        hint = k.why or "a larger value is almost certainly a typo"
        ctx.error("E204", f"'{k.name}' must be at most {shown}, not {value_text(v)}", v.span, hint)
        raise Bad
    return value


MAX_WARMUP_REQUESTS = 1_000_000_000  # a warmup's count: as requests_per_level (workload.MAX_LEVEL_REQUESTS)


@dataclasses.dataclass(frozen=True)
class RequestCount:
    """A count of requests written as a quantity (`warmup = 20 requests`), as a key that takes a
    duration or a count converts it: kept apart from a duration in seconds."""

    n: int


def _duration_or_count(ctx: Ctx, k: Key, v: A.Value) -> float | RequestCount:
    """A duration (`10s`, in seconds) or a count of requests (`20 requests`, a `RequestCount`):
    the count a whole number from 1 to MAX_WARMUP_REQUESTS, a bare number neither."""
    if isinstance(v, A.Num):
        shown = value_text(v)
        ctx.error("E201", f"'{k.name}' needs a unit: a duration ({shown}s) or a count of requests ({shown} requests)", v.span,
                  f"write {k.name} = {shown}s to warm up for {shown} seconds, or {k.name} = {shown} requests for {shown} requests")
        raise Bad
    if not isinstance(v, A.Quantity) or v.unit not in A.COUNT_UNITS:
        return _quantity(ctx, k, v)
    n = v.value
    if isinstance(n, float) and not (n.is_integer() and abs(n) < 1e16):
        ctx.error("E104", f"'{k.name}' counts whole requests, not {value_text(v)}", v.span)
        raise Bad
    n = int(n)
    if n < 1:
        ctx.error("E204", f"'{k.name}' must be at least 1 request, not {value_text(v)}", v.span,
                  f"a warmup sends at least one request; for none, remove '{k.name}' (or write {k.name} = 0s)")
        raise Bad
    if n > MAX_WARMUP_REQUESTS:
        too_large(ctx, k.name, value_text(v), MAX_WARMUP_REQUESTS, v.span,
                  "more than a billion warmup requests is days of load: is there an extra digit?")
    return RequestCount(n)


def _strings(ctx: Ctx, k: Key, v: A.Value) -> tuple[str, ...]:
    if not isinstance(v, A.List) or not all(isinstance(i, A.Str) for i in v.items):
        _type_error(ctx, k, v, "a list of strings")
    return tuple(i.value for i in v.items)


def _items(ctx: Ctx, k: Key, v: A.Value) -> tuple[A.Value, ...]:
    """One value or a non-empty list of them."""
    if not isinstance(v, A.List):
        return (v,)
    if not v.items:
        ctx.error("E205", f"'{k.name}' needs at least one value", v.span)
        raise Bad
    return v.items


def _ints(ctx: Ctx, k: Key, v: A.Value) -> tuple[int, ...]:
    return tuple(_int(ctx, k, i) for i in _items(ctx, k, v))


def _quantities(ctx: Ctx, k: Key, v: A.Value) -> tuple[float, ...]:
    return tuple(_quantity(ctx, k, i) for i in _items(ctx, k, v))


CONVERTERS = {
    "str": _str,
    "word": _word,
    "bool": _bool,
    "int": _int,
    "number": _number,
    "quantity": _quantity,
    "duration_or_count": _duration_or_count,
    "strings": _strings,
    "ints": _ints,
    "quantities": _quantities,
}


def convert(ctx: Ctx, k: Key, attr: A.Attribute) -> Got:
    try:
        value, ok = CONVERTERS[k.type](ctx, k, attr.value), True
    except Bad:
        value, ok = None, False
    return Got(attr.key, value, ok, attr.value.span, attr.key_span, attr.value)
