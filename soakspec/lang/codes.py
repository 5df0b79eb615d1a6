"""Every diagnostic code the parser and the checker report, declared once with its meaning.

One code, one meaning: a code names a kind of mistake, never a place in the checker. The
README's code table ("Diagnostics") is tested against `CODES` (tests/test_lang_codes.py), and
the checker and parser may only report codes declared here.

Families: E0xx syntax, E1xx structure, E2xx units and ranges, E3xx rules, E4xx semantics,
W5xx warnings.
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class Code:
    code: str
    title: str


CODES: dict[str, Code] = {
    c.code: c
    for c in (
        # E0xx syntax
        Code("E000", "the spec file cannot be read"),
        Code("E001", "unexpected token"),
        Code("E002", "unterminated string"),
        Code("E003", "unexpected character, NUL byte or invalid UTF-8"),
        Code("E004", "bracket never closed"),
        Code("E005", "unescaped quote inside a string"),
        Code("E006", "invalid escape in a string"),
        Code("E010", "spec too large"),
        Code("E011", "spec nested too deep"),
        # E1xx structure
        Code("E100", "unknown block"),
        Code("E101", "unknown key"),
        Code("E102", "duplicate key"),
        Code("E103", "missing key or block"),
        Code("E104", "wrong type of value"),
        Code("E105", "duplicate block"),
        Code("E106", "duplicate name"),
        Code("E107", "block name missing, not allowed or malformed"),
        Code("E108", "statement in the wrong block"),
        Code("E109", "not one of the allowed words"),
        # E2xx units and ranges
        Code("E201", "missing unit"),
        Code("E202", "unknown unit"),
        Code("E203", "wrong kind of unit"),
        Code("E204", "value out of range"),
        Code("E205", "empty list or text"),
        # E3xx rules
        Code("E301", "undefined backend"),
        Code("E302", "unknown metric"),
        Code("E303", "unknown function"),
        Code("E304", "percentile outside (0, 100]"),
        Code("E305", "type mismatch in a rule"),
        Code("E306", "unknown scope"),
        # E4xx semantics
        Code("E401", "bucket or abort window longer than the duration"),
        Code("E402", "generic runtime boundary"),
        Code("E403", "contradictory settings"),
        Code("E404", "unknown placeholder"),
        Code("E405", "invalid or unusable regular expression"),
        Code("E406", "invalid URL"),
        Code("E407", "nothing to run"),
        Code("E408", "invalid HTTP path"),
        Code("E409", "invalid model revision"),
        Code("E410", "trace id form without {id}"),
        Code("E411", "invalid environment variable name"),
        Code("E412", "required env of a server soakspec does not launch"),
        Code("E413", "reads a server log the backend does not have"),
        Code("E414", "trace coverage of a backend without traces"),
        Code("E415", "pattern on JSONL traces"),
        Code("E416", "runtime named without a concrete version"),
        Code("E417", "runtime label and version disagree"),
        Code("E418", "planned load time over the limit"),
        Code("E419", "prompt file unreadable, malformed or of an unrecognised format"),
        Code("E420", "body field or header soakspec sets itself"),
        Code("E421", "secret written in a plain header"),
        Code("E422", "abort rule the runner cannot evaluate live"),
        Code("E423", "replay trace file unreadable or malformed"),
        Code("E424", "body asks for more than one answer a request"),
        Code("E425", "min_duration longer than the level's duration bound (no level could complete)"),
        # W5xx warnings
        Code("W501", "launched backend never uses {port}"),
        Code("W502", "required env not set by the backend"),
        Code("W503", "setting ignored for a url backend"),
        Code("W504", "load level listed twice"),
        Code("W505", "duration not a whole number of buckets"),
        Code("W506", "claim listed twice"),
        Code("W507", "claim boundary states no claim"),
        Code("W508", "fewer than one request expected per level"),
        Code("W509", "percentile or goodput share rule with too few planned samples per scope"),
        Code("W510", "prompt file records skipped (no human turn to send)"),
        Code("W511", "prompt file shorter than a level's planned requests (prompts repeat)"),
        Code("W512", "multi-turn conversations whose turns do not alternate user and assistant"),
        Code("W513", "a run's embedded spec names a prompt file that is not here (judged without it)"),
        Code("W514", "seed set where every arrival is constant and nothing else is drawn (it seeds nothing)"),
        Code("W515", "an open loop's rate × duration sends fewer than its requests_per_level (the duration ends the level first)"),
        Code("W516", "a replay's hash_block or seed without shared prefix blocks (it changes nothing)"),
        Code("W517", "an open loop's buckets expect so few arrivals that some will hold none (min_samples INCONCLUSIVE)"),
        Code("W518", "min_duration shorter than a bucket (it guarantees no whole bucket)"),
    )
}


def title(code: str) -> str:
    """The meaning of a registered code; KeyError for an unregistered one."""
    return CODES[code].title


def markdown_table() -> str:
    """The README's code table, generated from `CODES`."""
    rows = ["| code | meaning |", "|---|---|"]
    rows += [f"| {c.code} | {c.title} |" for c in CODES.values()]
    return "\n".join(rows)
