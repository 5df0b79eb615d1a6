"""What the two readers of claims of change share: `changes` (compare's rows) and
`sweep_changes` (compare's Sweep row). Here, not in `changes`, because `changes` calls
`sweep_changes` and the other way round would be an import cycle.

- `half_unit`: how precisely a stated number is written -- half a unit of its last digit;
- `named_backends`: which backends a claim names, the same way for a row and a Sweep row;
- `LIST_JOIN`: what joins the metrics of one list, for both readers;
- `Magnitude`: a claimed size of a change, as `changes._magnitudes` reads it -- for a row and,
  through the callable `changes` hands `sweep_changes.sweep_claims`, for the Sweep row (one
  reader of "rose 20%", "by 4 rps", "~20%", "at least 1.2x" for both).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable


def half_unit(num: str, approx: bool = False) -> float:
    """Half a unit of the last stated digit ("12" 0.5, "1.3" 0.05, "1,200" 0.5; "~10" 5 after an
    approximation word: `figures`' rule, where an integer's trailing zeros are not digits)."""
    n = num.replace(",", "")
    if "." in n:
        return 10.0 ** -len(n.split(".")[1]) / 2
    if approx and n.strip("0"):
        return 10.0 ** (len(n) - len(n.rstrip("0"))) / 2
    return 0.5


def named_backends(names: Iterable[str], texts: Iterable[str]) -> set[str]:
    """The `names` (backends, and a comparison's new backends) that the first of `texts` to name
    any of them names, as a whole word ("b1", not "b10" nor "sim-fast" for "sim"); empty where
    none does. A claim's clause comes first, then its sentence: a backend named in the clause
    scopes it, else one named in the sentence."""
    names = tuple(names)
    for text in texts:
        said = {n for n in names if re.search(rf"(?<![\w-]){re.escape(n)}(?![\w-])", text, re.I)}
        if said:
            return said
    return set()


# what joins two metrics of one list ("TTFT, ITL and latency", "p95 TTFT, ITL, or the max
# sustainable rate", "TTFT/ITL", "TTFT & ITL"): a comma, slash, ampersand, "and" / "or" (with or
# without a serial comma), then an article a review may put before the next name. One definition
# for `changes._is_list` and `sweep_changes._listed`: a list that groups under one direction for a
# row groups so for the Sweep row too (the two had drifted: ", or" and "the" read in one only)
LIST_JOIN = re.compile(r"\s*(?:,|/|&|and|or|,\s*and|,\s*or)?\s*(?:(?:the|its|our)\s+)?", re.I)


@dataclasses.dataclass(frozen=True, slots=True)
class Magnitude:
    """A claimed size of the change, as candidate ranges any of which may hold: `ranges` of the
    relative change new / base - 1, `differences` of the difference new - base in the row's
    base unit (seconds, tokens/s, requests/s, or a share for errors); `text` as written.

    A row is compare's interval of one of the two (`ChangeRow.absolute`); the other is that
    interval scaled by the row's base as measured (`_interval`). compare states no separate
    interval of the difference of two percentiles or means -- its bootstrap and Fieller
    intervals are of the ratio -- so "fell by 12 ms" is held against (low x base, high x base):
    the difference compare's table shows (102.3 ms → 76.6 ms) lies in it whenever its
    percentage lies in the interval of the ratio, and a claim rendered from the row is never
    flagged. For errors the reverse: "errors fell 50%" read as of the share is held against
    the interval of the difference divided by the base's share."""

    text: str
    ranges: tuple[tuple[float, float], ...]
    start: int
    end: int
    differences: tuple[tuple[float, float], ...] = ()
