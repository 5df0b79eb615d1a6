"""What the two readers of claims of change share: `changes` (compare's rows) and
`sweep_changes` (compare's Sweep row). Here, not in `changes`, because `changes` calls
`sweep_changes` and the other way round would be an import cycle.

- `half_unit`: how precisely a stated number is written -- half a unit of its last digit;
- `named_backends`: which backends a claim names, the same way for a row and a Sweep row.
"""

from __future__ import annotations

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
