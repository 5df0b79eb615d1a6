"""Reading an evidence directory into immutable values: the judge's only file I/O.

`load_evidence(run_dir)` verifies the directory first (`soakspec.evidence.verify`: every artifact
re-hashed against manifest["artifacts"], unlisted/missing/unsafe files, schemas, partial lines)
and then reads, per backend, requests.jsonl, traces.jsonl, telemetry.jsonl and followup.json.
Everything after this is pure: `summarize(evidence)` and `judge(spec, evidence)` never touch the
disk, so tests build `Evidence` values directly (see `soakspec.judge.testing`).

Readers are tolerant about row shapes the contract left open (a trace's payload under `payload`
or `trace`; RSS under `server_rss_bytes` or `rss`) and strict about what judging needs: a request
row without an id, a bucket or a known outcome is a problem, never silently dropped.
"""

from __future__ import annotations

import sys
from array import array

import dataclasses
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from soakspec.evidence import layout
from soakspec.evidence.io import EvidenceError, EvidenceFormatError, iter_jsonl, read_json, sha256_file

OUTCOMES = ("completed", "failed", "timeout", "rejected", "disconnected")

# verify codes: the artifact no longer is what the run wrote
TAMPER_CODES = frozenset({"V101", "V102", "V103", "V106", "V107", "V109"})
# the evidence does not parse or does not follow its contract
MALFORMED_CODES = frozenset({"V104", "V105", "V108"})


class EvidenceNotFound(EvidenceError):
    """`run_dir` is not an evidence directory (no manifest.json): a usage error."""


@dataclasses.dataclass(frozen=True)
class Finding:
    """One integrity observation: the file (relative to the run directory), a code, a message."""

    path: str
    code: str
    message: str
    line: int = 0

    def text(self) -> str:
        where = f"{self.path}:{self.line}" if self.line else self.path
        return f"{where}: {self.message}"


@dataclasses.dataclass(frozen=True)
class Integrity:
    """What re-hashing and re-reading the directory found.

    tampered   -- an artifact changed, is missing, is unlisted, unsafe, or bound to another manifest
    malformed  -- a file does not parse or does not match its schema
    incomplete -- the run says so itself (status, a partial last line, a held lock)
    """

    checked: int = 0
    tampered: tuple[Finding, ...] = ()
    malformed: tuple[Finding, ...] = ()
    incomplete: tuple[Finding, ...] = ()
    verified: bool = True  # False when no verification ran (Evidence built in memory)

    @property
    def ok(self) -> bool:
        return not self.tampered


@dataclasses.dataclass(frozen=True)
class BackendEvidence:
    """Everything one backend left behind. Rows are the parsed JSON objects (read-only by
    convention: nothing in the judge mutates them)."""

    name: str
    safe_name: str
    entry: Mapping[str, Any]  # the backend's manifest entry (levels, runtime_boundary, source, ...)
    records: tuple[Mapping[str, Any], ...] = ()  # requests.jsonl rows, file order
    traces: tuple[Mapping[str, Any], ...] = ()
    telemetry: tuple[Mapping[str, Any], ...] = ()
    followup: Mapping[str, Any] | None = None
    partial_tail: tuple[str, ...] = ()  # files of this backend that end in a cut-off line
    problems: tuple[str, ...] = ()  # rows the judge could not use, as "file:line: why"
    server_log: str | None = None  # the retained server.log (None: not retained or not loaded)
    mislabeled: tuple[str, ...] = ()  # stored labels the judge's re-derivation contradicts (`rederive`)


@dataclasses.dataclass(frozen=True)
class Evidence:
    manifest: Mapping[str, Any]
    backends: tuple[BackendEvidence, ...]
    integrity: Integrity = Integrity(verified=False)
    manifest_sha256: str | None = None
    root: str | None = None

    @property
    def run_id(self) -> str | None:
        rid = self.manifest.get("run_id")
        return rid if isinstance(rid, str) else None

    @property
    def spec_text(self) -> str | None:
        spec = self.manifest.get("spec")
        text = spec.get("text") if isinstance(spec, Mapping) else None
        return text if isinstance(text, str) else None

    @property
    def spec_sha256(self) -> str | None:
        spec = self.manifest.get("spec")
        sha = spec.get("sha256") if isinstance(spec, Mapping) else None
        return sha if isinstance(sha, str) else None

    def backend(self, name: str) -> BackendEvidence | None:
        for b in self.backends:
            if b.name == name:
                return b
        return None


def embedded_spec_sha256(text: str) -> str | None:
    """The sha256 of the spec `text` as the spec language computes it (`Spec.sha256`), or None
    when it does not check with this soakspec. Never the bytes' hash: the language decides what
    a spec's identity covers."""
    from soakspec.diagnostics import has_errors
    from soakspec.lang import check, parse

    try:
        tree, diags = parse(text, "manifest.json#spec")
        if tree is None or has_errors(diags):
            return None
        spec, more = check(tree, "manifest.json#spec")
    except Exception:  # noqa: BLE001 - an embedded spec this soakspec cannot read has no hash to compare
        return None
    return spec.sha256 if spec is not None and not has_errors(more) else None


def request_problem(row: Any) -> str | None:
    """Why a requests.jsonl row cannot be judged, or None."""
    if not isinstance(row, Mapping):
        return "not a JSON object"
    if not isinstance(row.get("request_id"), str) or not row.get("request_id"):
        return "no request_id"
    b = row.get("bucket")
    if not isinstance(b, int) or isinstance(b, bool):
        return "no integer bucket"
    if row.get("outcome") is not None and row.get("outcome") not in OUTCOMES:  # absent: re-derived
        return f"unknown outcome {row.get('outcome')!r}"
    for key in ("start", "end", "intended_start", "first_token", "ttft", "latency", "tpot", "output_tokens", "prompt_tokens", "chunks"):
        v = row.get(key)
        if v is not None and (not isinstance(v, (int, float)) or isinstance(v, bool)):
            return f"{key} is not a number"
        if isinstance(v, int) and abs(v) > 2**63:
            return f"{key} is an integer of {len(str(abs(v)))} digits, not a measurement"
    return None


def _compact_request(row: Any) -> Any:
    """A long soak holds hundreds of thousands of records in memory while it is judged: keep
    the per-token gaps as a float array (8 bytes a gap instead of ~32) and share repeated
    strings -- the keys above all: `json.loads` makes new key strings for every line, over
    half of a row's memory (benchmarks/judge_memory.py). The values are unchanged."""
    if not isinstance(row, dict):
        return row
    itl = row.get("itl")
    if isinstance(itl, list) and all(type(g) is float or type(g) is int for g in itl):
        row["itl"] = array("d", itl)
    for key in ("backend", "workload", "outcome", "tokens_source", "itl_source", "finish_reason"):
        v = row.get(key)
        if type(v) is str:
            row[key] = sys.intern(v)
    return {sys.intern(k): v for k, v in row.items()}


# What the judge reads of a trace row (coverage and terminal reasons); the rest of the server's
# payload stays in traces.jsonl, hashed, for a reader who wants it.
_TRACE_PAYLOAD_KEYS = ("terminal_reason", "finish_reason", "status", "active", "pending")


def _compact_trace(row: Any) -> Any:
    if not isinstance(row, dict):
        return row
    payload = row.get("payload", row.get("trace"))
    out = {"request_id": row.get("request_id"), "matched": row.get("matched"), "trace_id": row.get("trace_id"),
           "times": row.get("times")}
    if isinstance(payload, dict):
        # the payload's own times stay: the judge re-matches a trace by its id and times
        out["payload"] = {k: v for k, v in payload.items()
                          if k in _TRACE_PAYLOAD_KEYS or isinstance(v, (int, float)) and not isinstance(v, bool)}
    return out


def _read_rows(path: Path, rel: str, problems: list[str], partial: list[str], *, required: bool, compact=None) -> list[Any]:
    """Rows of a JSONL file, streamed and (with `compact`) compacted one at a time."""
    if not path.is_file():
        if required:
            problems.append(f"{rel}: missing")
        return []
    bad: list[tuple[int, str | None]] = []
    rows = [compact(r) if compact is not None else r for _, r in iter_jsonl(path, bad)]
    for line, message in bad:
        if message is None:
            partial.append(rel)
        else:
            problems.append(f"{rel}:{line}: {message}")
    return rows


def _integrity(root: Path) -> Integrity:
    from soakspec.evidence.verify import verify_evidence

    report = verify_evidence(root, spec_sha256=embedded_spec_sha256)
    prefix = report.run_dir.rstrip("/") + "/"
    tampered, malformed, incomplete = [], [], []
    for d in report.diagnostics:
        rel = d.path[len(prefix):] if d.path.startswith(prefix) else d.path
        f = Finding(rel, d.code, d.message, d.span.line if d.span.known else 0)
        if d.code in TAMPER_CODES:
            tampered.append(f)
        elif d.code in MALFORMED_CODES:
            malformed.append(f)
        else:
            incomplete.append(f)
    return Integrity(report.artifacts_checked, tuple(tampered), tuple(malformed), tuple(incomplete), True)


def load_evidence(run_dir: str | os.PathLike) -> Evidence:
    """Verify and read an evidence directory. Raises `EvidenceNotFound` when there is no
    manifest.json, `EvidenceFormatError` when the manifest does not parse."""
    root = Path(run_dir)
    mpath = root / layout.MANIFEST
    if not root.is_dir():
        raise EvidenceNotFound(f"{run_dir}: no such evidence directory")
    if not mpath.is_file():
        raise EvidenceNotFound(f"{run_dir}: no {layout.MANIFEST} (not an evidence directory)")
    manifest = read_json(mpath)
    if not isinstance(manifest, dict):
        raise EvidenceFormatError(mpath, 1, "the manifest is not a JSON object")
    manifest_sha = sha256_file(mpath)
    integrity = _integrity(root)

    backends = []
    entries = manifest.get("backends")
    for entry in entries if isinstance(entries, list) else []:
        if not isinstance(entry, dict) or not isinstance(entry.get("name"), str):
            continue
        name = entry["name"]
        safe = layout.safe_name(name)
        if entry.get("safe_name") not in (None, safe):
            # never follow a manifest-supplied directory name: it could point anywhere
            safe_note = f"manifest safe_name {entry.get('safe_name')!r} differs from {safe!r}; using {safe!r}"
        else:
            safe_note = None
        d = root / layout.BACKENDS / safe
        rel = f"{layout.BACKENDS}/{safe}/"
        problems: list[str] = [safe_note] if safe_note else []
        partial: list[str] = []
        raw = _read_rows(d / layout.REQUESTS, rel + layout.REQUESTS, problems, partial, required=True, compact=_compact_request)
        records = []
        for i, row in enumerate(raw, start=1):
            why = request_problem(row)
            if why:
                problems.append(f"{rel}{layout.REQUESTS}: record {i}: {why}")
            else:
                records.append(row)
        del raw
        traces = [
            r
            for r in _read_rows(d / layout.TRACES, rel + layout.TRACES, problems, partial, required=False, compact=_compact_trace)
            if isinstance(r, dict)
        ]
        telemetry = [r for r in _read_rows(d / layout.TELEMETRY, rel + layout.TELEMETRY, problems, partial, required=False) if isinstance(r, dict)]
        server_log = None
        lpath = d / layout.SERVER_LOG
        if lpath.is_file() and not lpath.is_symlink():
            server_log = lpath.read_bytes().decode("utf-8", "replace")
        followup = None
        fpath = d / layout.FOLLOWUP
        if fpath.is_file():
            try:
                doc = read_json(fpath)
                followup = doc if isinstance(doc, dict) else None
                if followup is None:
                    problems.append(f"{rel}{layout.FOLLOWUP}: not a JSON object")
            except EvidenceFormatError as e:
                problems.append(f"{rel}{layout.FOLLOWUP}:{e.line}: does not parse")
        backends.append(
            BackendEvidence(
                name=name,
                safe_name=safe,
                entry=entry,
                records=tuple(records),
                traces=tuple(traces),
                telemetry=tuple(telemetry),
                followup=followup,
                partial_tail=tuple(partial),
                problems=tuple(problems),
                server_log=server_log,
            )
        )
    return Evidence(manifest, tuple(backends), integrity, manifest_sha, str(run_dir))
