"""Quantities with units: durations, sizes, ratios and rates.

A quantity in a `.soak` file is a number immediately followed by its unit (`120s`, `50ms`,
`2GiB`, `95%`, `4rps`). Internally every quantity is converted to a base unit:
seconds, bytes, a fraction (95% -> 0.95) or requests per second.
"""

from __future__ import annotations

import enum
import re


class Dimension(enum.StrEnum):
    DURATION = "duration"
    SIZE = "size"
    RATIO = "ratio"
    RATE = "rate"


# unit -> (dimension, factor to the base unit)
UNITS: dict[str, tuple[Dimension, float]] = {
    "us": (Dimension.DURATION, 1e-6),
    "ms": (Dimension.DURATION, 1e-3),
    "s": (Dimension.DURATION, 1.0),
    "m": (Dimension.DURATION, 60.0),
    "h": (Dimension.DURATION, 3600.0),
    "B": (Dimension.SIZE, 1.0),
    "KiB": (Dimension.SIZE, 1024.0),
    "MiB": (Dimension.SIZE, 1024.0**2),
    "GiB": (Dimension.SIZE, 1024.0**3),
    "TiB": (Dimension.SIZE, 1024.0**4),
    "KB": (Dimension.SIZE, 1e3),
    "MB": (Dimension.SIZE, 1e6),
    "GB": (Dimension.SIZE, 1e9),
    "%": (Dimension.RATIO, 0.01),
    "rps": (Dimension.RATE, 1.0),
    "rpm": (Dimension.RATE, 1.0 / 60.0),
}

UNITS_BY_DIMENSION: dict[Dimension, tuple[str, ...]] = {
    dim: tuple(u for u, (d, _) in UNITS.items() if d is dim) for dim in Dimension
}

# Words people write for a unit, and the unit they mean (`10 seconds`, `10sec`): what a hint
# suggests in their place. A unit written in the wrong case (`10MS`, `2gib`) is `unit_for_word`'s.
UNIT_WORDS: dict[str, str] = {
    **dict.fromkeys(("sec", "secs", "second", "seconds"), "s"),
    **dict.fromkeys(("min", "mins", "minute", "minutes"), "m"),
    **dict.fromkeys(("hr", "hrs", "hour", "hours"), "h"),
    **dict.fromkeys(("msec", "msecs", "millisecond", "milliseconds"), "ms"),
    **dict.fromkeys(("usec", "usecs", "µs", "μs", "microsecond", "microseconds"), "us"),
    **dict.fromkeys(("byte", "bytes"), "B"),
    **dict.fromkeys(("percent", "pct"), "%"),
    **dict.fromkeys(("qps", "rpsec"), "rps"),
}


def unit_for_word(word: str) -> str | None:
    """The unit a word not itself a unit stands for (`seconds` -> `s`, `MS` -> `ms`), or None."""
    if word in UNITS:
        return word
    found = UNIT_WORDS.get(word) or UNIT_WORDS.get(word.lower())
    if found is not None:
        return found
    same = [u for u in UNITS if u.lower() == word.lower()]
    return same[0] if len(same) == 1 else None


def units_listed() -> str:
    """Every unit, by kind: what a hint lists when it cannot say which kind is meant."""
    return "; ".join(f"{' '.join(UNITS_BY_DIMENSION[d])} ({d}s)" for d in Dimension)

# A rate as prose writes it after a figure (`40 tok/s`, `8 req/s`, `12 tokens per second`): of
# requests (RATE's base unit, requests per second) or of output tokens, which no `.soak` quantity
# has. `prose_quantity` reads these and every duration unit.
_PER_SECOND = re.compile(r"^(?P<what>[A-Za-z]+)\s*(?:/\s*|\s+per\s+)s(?:ec(?:ond)?)?$", re.I)
_RATE_OF = {**dict.fromkeys(("req", "reqs", "request", "requests"), "rate"),
            **dict.fromkeys(("tok", "toks", "token", "tokens"), "token_rate")}


def prose_quantity(value: float, unit: str) -> tuple[str, float] | None:
    """A figure and the unit prose writes after it -> (what it measures, the value in its base
    unit): `12 ms` -> ("duration", 0.012), `2 req/s` / `2 rps` / `2 qps` -> ("rate", 2.0) in
    requests per second, `40 tok/s` / `40 tokens per second` -> ("token_rate", 40.0) in output
    tokens per second; None for any other unit (a size, a share). How `soakspec lint-claims`
    reads a change stated in a unit ("p99 TTFT fell by 12 ms"), with the `.soak` units' own
    table, so that the two cannot read a unit differently."""
    text = " ".join(unit.split())
    per = _PER_SECOND.match(text)
    if per is not None:
        kind = _RATE_OF.get(per.group("what").lower())
        return None if kind is None else (kind, value)
    name = unit_for_word(text)
    if name is None:
        return None
    dim, base = to_base(value, name)
    return (dim.value, base) if dim in (Dimension.DURATION, Dimension.RATE) else None


_QUANTITY = re.compile(r"^\s*(-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?)\s*([A-Za-z%]+)\s*$")


class UnitError(ValueError):
    pass


def to_base(value: float, unit: str) -> tuple[Dimension, float]:
    try:
        dim, factor = UNITS[unit]
    except KeyError:
        raise UnitError(f"unknown unit {unit!r}") from None
    return dim, value * factor


def parse_quantity(text: str, dimension: Dimension | None = None) -> float:
    """Parse `"50ms"` -> 0.05 (base unit). Used by command-line flags (e.g. `soakspec sim`).

    A bare number is accepted only when `dimension` is RATIO (a plain fraction).
    """
    m = _QUANTITY.match(text)
    if not m:
        if dimension is Dimension.RATIO:
            try:
                return float(text)
            except ValueError:
                pass
        want = ", ".join(UNITS_BY_DIMENSION[dimension]) if dimension else "a unit"
        raise UnitError(f"{text!r} is not a quantity (a number followed by {want})")
    dim, base = to_base(float(m.group(1)), m.group(2))
    if dimension is not None and dim is not dimension:
        raise UnitError(f"{text!r} is a {dim}, expected a {dimension}")
    return base


def format_duration(seconds: float) -> str:
    """Human text for a duration: 0.05 -> '50ms', 150 -> '2m30s'."""
    if seconds < 0:
        return "-" + format_duration(-seconds)
    if seconds < 1:
        ms = f"{seconds * 1000:.3g}"
        if float(ms) < 1000:
            return ms + "ms"
        seconds = 1.0  # 999.5ms and up is "1s" at three digits, not "1e+03ms"
    if seconds < 60:
        s = f"{seconds:.3g}" if seconds != int(seconds) else str(int(seconds))
        if float(s) < 60:
            return s + "s"
    total = int(round(seconds))
    h, rem = divmod(total, 3600)
    m, s = divmod(rem, 60)
    out = ""
    if h:
        out += f"{h}h"
    if m:
        out += f"{m}m"
    if s or not out:
        out += f"{s}s"
    return out


def format_size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.1f}{unit}" if unit != "B" else f"{int(n)}B"
        n /= 1024
    return f"{n}B"


def format_as(value: float, kind: str | None) -> str:
    """A value in base units as its kind reads (`lang.metrics.Kind`'s values: duration, size,
    ratio, rate, count, number): "1.12s", "2.0GiB", "100%" (a ratio: never a bare 1, read as
    one request), "4 rps", a count whole. Shared by the judge (`format_value`) and the runner's
    abort messages, which must say a value alike."""
    if kind == "duration":
        return format_duration(value)
    if kind == "size":
        return format_size(value)
    if kind == "ratio":
        return f"{value * 100:.4g}%"
    if kind == "rate":
        return f"{value:.4g} rps"
    if kind == "count" and float(value).is_integer():
        return str(int(value))
    return f"{value:.4g}"
