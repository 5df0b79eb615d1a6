"""Runtime boundary: which runtime a claim is limited to, declared in the spec and checked
against what the server actually did during this run (pure; no I/O).

A boundary is a label (`NCCL 2.26.2, NCCL_IB_DISABLE=1, NCCL_P2P_DISABLE=1`, `host-staged`),
optionally a log regex whose `version` group (or first group) captures the runtime version
(`NCCL version (\\d+\\.\\d+\\.\\d+)`), an expected version, and required environment variables.
`NAME=VALUE` pairs in the label are checked against the launched environment too, and a version
in the label is the expected version when a log regex is declared.

Statuses:
  confirmed      everything declared that can be detected was detected and agrees
  missing        the log regex never matched, or a required variable is not set
  contradictory  the log shows another version (or several), or a variable has another value
  generic        the label says nothing specific ("", unknown, n/a, none, default, bare "nccl")
  undeclared     the spec declares no boundary
  declared       a specific label with nothing to detect (e.g. host-staged), or a label whose
                 version nothing in the log confirms

"confirmed" needs the log to confirm the version a label names. Without a declared log regex,
a label naming a runtime the judge knows how to find in a log (`DEFAULT_VERSION_PATTERNS`:
NCCL, RCCL, CUDA) is checked against that runtime's own version line: another version in the
log is a contradiction (`NCCL 2.26.2` with the log saying `NCCL version 2.18.1`), none leaves
the version declared, never confirmed -- even when the label's `NAME=VALUE` pairs match. Such a
runtime named without a version (`NCCL x.y.z`, `nccl 2`, `NCCL vX`) is generic.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from soakspec.evidence.redact import REDACTED, is_secret_name, redact_env, scrub
# Defined once in the language layer (the checker applies it before a run); re-exported here.
from soakspec.lang.runtime_label import is_generic_label, validate_log_regex  # noqa: F401

_LABEL_ENV = re.compile(r"\b([A-Z_][A-Z0-9_]*)=([^\s,;]+)")
_LABEL_VERSION = re.compile(r"(?<![\w.])v?(\d+(?:\.\d+)+)(?![\w.])")

_LABEL_WORDS = re.compile(r"[\s,;+()\[\]=]+")
# A runtime's own version line, for labels that name the runtime and a version but declare no
# log regex: (word in the label, case-insensitive) -> regex with a `version` group.
DEFAULT_VERSION_PATTERNS: tuple[tuple[str, str], ...] = (
    ("nccl", r"NCCL version (?P<version>\d+(?:\.\d+)+)"),
    ("rccl", r"RCCL version (?P<version>\d+(?:\.\d+)+)"),
    ("cuda", r"CUDA (?:version|Version:?) (?P<version>\d+(?:\.\d+)+)"),
)

STATUSES = ("confirmed", "missing", "contradictory", "generic", "undeclared", "declared")


@dataclasses.dataclass(frozen=True, slots=True)
class RuntimeDecl:
    """What the spec declares. `required_env` maps a variable to its expected value (None: any)."""

    label: str | None = None
    log_regex: str | None = None
    expected_version: str | None = None
    required_env: tuple[tuple[str, str | None], ...] = ()

    def __post_init__(self) -> None:
        env = self.required_env
        if isinstance(env, Mapping):
            env = env.items()
        object.__setattr__(self, "required_env", tuple(sorted((str(k), v) for k, v in env)))


@dataclasses.dataclass(frozen=True, slots=True)
class RuntimeBoundary:
    declared: str | None
    detected_version: str | None
    env_observed: tuple[tuple[str, str | None], ...]
    status: str
    display: str
    details: tuple[str, ...]

    def to_json(self) -> dict[str, Any]:
        """The manifest's `runtime_boundary` object."""
        return {
            "declared": self.declared,
            "detected": self.detected_version,
            "env_observed": dict(self.env_observed),
            "status": self.status,
            "display": self.display,
            "details": list(self.details),
        }


class _Lazy:
    """A log text read on first use."""

    def __init__(self, read: Callable[[], str]) -> None:
        self.read = read
        self.text: str | None = None

    def __str__(self) -> str:
        if self.text is None:
            self.text = self.read()
        return self.text


def _found_versions(regex: str, text: str) -> list[str]:
    text = str(text)
    pattern = re.compile(regex, re.MULTILINE)
    group: int | str = 0
    if "version" in pattern.groupindex:
        group = "version"
    elif pattern.groups:
        group = 1
    seen: list[str] = []
    for m in pattern.finditer(text):
        v = m.group(group)
        if v is not None and v.strip() and v.strip() not in seen:
            seen.append(v.strip())
    return seen


class BoundaryText:
    """The text of server.log that the runtime boundary is looked for in, built as the log is
    read: one rule for the runner's collection and the judge. It is every line except the
    trace lines (a long soak's log is mostly those, one a request), plus each trace line where
    the runtime pattern finds a match it has not found before. So a pattern that matches every
    trace line keeps one line for each version, not the whole log. What is held is then bounded
    by server.log's cap (its head and tail, `evidence/serverlog.py`), never by the soak's
    length. The versions `detect_runtime_boundary` finds in it are those it would find in the
    whole log, in the same order, except a match that spans a trace line and its neighbour.

    Fed either a block at a time (`add_block`: whole lines as bytes, with the byte spans of
    the trace lines among them, as `traces.scan_rows` finds them) or a line at a time
    (`add_line`). `done` marks the whole log read: only then is `text` the log's."""

    def __init__(self, runtime_pattern: str | None) -> None:
        self._rx = re.compile(runtime_pattern, re.MULTILINE) if runtime_pattern else None
        self._parts: list[str] = []
        self._seen: set[str] = set()
        self.complete = False

    def _trace_line(self, line: str) -> None:
        new = [m.group(0) for m in self._rx.finditer(line) if m.group(0) not in self._seen] if self._rx else []
        if new:
            self._seen.update(new)
            self._parts.append(line)

    def add_line(self, line: str, trace: bool) -> None:
        """One line (with its line end); `trace`: it holds a trace."""
        if trace:
            self._trace_line(line)
        else:
            self._parts.append(line)

    def add_block(self, block: bytes, trace_spans: list[tuple[int, int]]) -> None:
        """Whole lines as bytes; `trace_spans`: the [start, end) byte spans of the trace lines
        among them (line ends included), in order. What is not a trace line is decoded as
        UTF-8 (undecodable bytes replaced, as the log's lines are read everywhere)."""
        at = 0
        if self._rx is None or not trace_spans:
            for s, e in trace_spans:
                if s > at:
                    self._parts.append(block[at:s].decode("utf-8", "replace"))
                at = e
        else:
            ascii_text = block.decode("ascii") if block.isascii() else None
            if ascii_text is not None and self._rx.search(ascii_text) is None:
                ascii_text = ""  # no match anywhere in the block: no trace line of it is kept
            for s, e in trace_spans:
                if s > at:
                    self._parts.append(block[at:s].decode("utf-8", "replace"))
                if ascii_text != "":
                    self._trace_line(ascii_text[s:e] if ascii_text is not None else block[s:e].decode("utf-8", "replace"))
                at = e
        if at < len(block):
            self._parts.append(block[at:].decode("utf-8", "replace"))

    def done(self) -> None:
        self.complete = True

    def text(self) -> str:
        return "".join(self._parts)


def boundary_text(lines: Iterable[str], is_trace: Callable[[str], bool] | None, runtime_pattern: str | None) -> str:
    """`BoundaryText` over a log's lines (each up to and with its "\\n"), a trace line being
    one `is_trace` says holds a trace (`traces.trace_line_test`; None: the log holds none)."""
    out = BoundaryText(runtime_pattern)
    for line in lines:
        out.add_line(line, is_trace is not None and is_trace(line))
    out.done()
    return out.text()


def _norm_version(v: str) -> str:
    return v.strip().lower().removeprefix("v")


def detect_runtime_boundary(
    decl: RuntimeDecl | None, env: Mapping[str, str], log_text: str | Callable[[], str]
) -> RuntimeBoundary:
    """Judge the declared boundary against the launched `env` and the server log text written
    during this run (see the module docstring for the statuses). `log_text` may be a function
    that reads it: it is called only when a version pattern has to be searched for, so a
    judge of a long soak reads a big server.log whole only when the declaration needs it."""
    if callable(log_text):
        reader = log_text
        log_text = _Lazy(reader)  # type: ignore[assignment]
    if decl is None or (
        decl.label is None and not decl.log_regex and not decl.required_env and not decl.expected_version
    ):
        return RuntimeBoundary(None, None, (), "undeclared", "undeclared", ("the spec declares no runtime boundary",))

    label = decl.label.strip() if decl.label is not None else None
    if label is not None and is_generic_label(label):
        return RuntimeBoundary(
            label, None, (), "generic", label or "(empty)",
            (f"runtime boundary {label!r} is generic: name the runtime version or mode",),
        )

    required = dict(decl.required_env)
    for name, value in _LABEL_ENV.findall(label or ""):
        required.setdefault(name, value)
    expected = decl.expected_version
    label_version = None
    if label:
        m = _LABEL_VERSION.search(_LABEL_ENV.sub("", label))
        label_version = m.group(1) if m else None
    if expected is None and decl.log_regex:
        expected = label_version
    implicit_regex = None
    words = {t for t in _LABEL_WORDS.split((label or "").lower()) if t}
    if not decl.log_regex and (expected or label_version):
        implicit_regex = next((rx for word, rx in DEFAULT_VERSION_PATTERNS if word in words), None)
    versioned = next((word for word, _ in DEFAULT_VERSION_PATTERNS if word in words), None)
    if versioned is not None and not (expected or label_version) and not decl.log_regex:
        # `NCCL x.y.z`, `nccl 2`, `NCCL vX`: a versioned runtime named without its version
        return RuntimeBoundary(
            label, None, (), "generic", label or "(empty)",
            (f"runtime boundary {label!r} names {versioned.upper()} without a version (like 2.26.2): "
             "name the version, or declare a log_pattern that detects it",),
        )

    contradictions: list[str] = []
    missing: list[str] = []
    confirmations: list[str] = []
    detected: str | None = None

    if decl.log_regex:
        versions = _found_versions(decl.log_regex, log_text)
        if not versions:
            missing.append(f"log pattern {decl.log_regex!r} not found in the server log written during this run")
        else:
            detected = ", ".join(versions)
            if len({_norm_version(v) for v in versions}) > 1:
                contradictions.append(f"the server log reports several versions: {detected}")
            elif expected is not None and _norm_version(versions[0]) != _norm_version(expected):
                contradictions.append(f"the server log reports version {versions[0]} but {expected} is declared")
            else:
                confirmations.append(f"the server log reports version {versions[0]}")
    unconfirmed: str | None = None
    if not decl.log_regex and (expected or label_version):
        want = expected or label_version
        found = _found_versions(implicit_regex, log_text) if implicit_regex else []
        if found and any(_norm_version(v) != _norm_version(want) for v in found):  # type: ignore[arg-type]
            detected = ", ".join(found)
            contradictions.append(f"the server log reports version {detected} but {want} is declared")
        elif found:
            detected = found[0]
            confirmations.append(f"the server log reports version {found[0]}")
        else:
            unconfirmed = want
    observed: dict[str, str | None] = {}
    for name, want in sorted(required.items()):
        have = env.get(name)
        observed[name] = have
        # the details are stored and reported: a secret-named variable's value is not said
        secret = is_secret_name(name)
        shown_have, shown_want = (REDACTED, REDACTED) if secret else (scrub(str(have)), scrub(str(want)))
        if have is None:
            missing.append(f"{name} is not set in the launched environment")
        elif want is not None and have != want:
            contradictions.append(f"{name}={shown_have} in the launched environment but {name}={shown_want} is declared")
        else:
            confirmations.append(f"{name}={shown_have} in the launched environment")

    shown = redact_env({k: v for k, v in observed.items() if v is not None})
    observed_red = tuple(sorted((k, shown.get(k)) for k in observed))

    if contradictions:
        status = "contradictory"
    elif missing:
        status = "missing"
    elif (decl.log_regex or required or detected) and unconfirmed is None:
        status = "confirmed"
    else:
        status = "declared"

    details = [*contradictions, *missing, *confirmations]
    if unconfirmed is not None:
        details.append(f"version {unconfirmed} is declared but nothing in the server log confirms it"
                       + ("" if implicit_regex else " (no log pattern can detect it)"))
    if status == "declared":
        details.append("nothing to detect: the label is recorded as declared")

    if label:
        display = label
    else:
        parts = [f"version {detected}"] if detected else ([f"version {expected}"] if expected else [])
        parts += [f"{k}={v}" for k, v in sorted(required.items()) if v is not None]
        display = ", ".join(parts) or "declared"
    return RuntimeBoundary(label, detected, observed_red, status, display, tuple(details))
