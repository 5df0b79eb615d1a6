"""Reading an evidence directory into immutable values: the judge's only file I/O.

`load_evidence(run_dir)` verifies the directory (`soakspec.evidence.verify`: every artifact
re-hashed against manifest["artifacts"], unlisted/missing/unsafe files, schemas, partial lines)
and reads, per backend, requests.jsonl, traces.jsonl, telemetry.jsonl and followup.json -- in
one pass per JSONL file: verification hashes, decodes and validates each line and hands the
row over (`verify_evidence(rows=...)`), compacted as it arrives. server.log is not read here:
the evidence keeps its path, and the judge streams it from the run's start offset.
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
import functools
import hashlib
import os
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from soakspec import heap
from soakspec.evidence import layout
from soakspec.evidence.io import (EvidenceChanged, EvidenceError, EvidenceFormatError, EvidenceNotFound,  # noqa: F401 - EvidenceNotFound: the commands' import
                                  iter_jsonl, read_json, require_evidence_dir, sha256_file)
from soakspec.evidence.record import OUTCOMES  # noqa: F401  (the record type's, defined once; re-exported)
from soakspec.judge import gapbins, peaks
from soakspec.judge.clientsamples import ClientBuilder, ClientSamples, build_client, samples_of
from soakspec.judge.scrapes import ScrapeBuilder, Scrapes, build_scrapes
from soakspec.judge.table import RequestTable, TableBuilder, WindowSlots, build_table
from soakspec.lang.spec import Spec

# verify codes: the artifact no longer is what the run wrote
TAMPER_CODES = frozenset({"V101", "V102", "V103", "V106", "V107", "V109"})
# the evidence does not parse or does not follow its contract
MALFORMED_CODES = frozenset({"V104", "V105", "V108"})


MAX_PROBLEMS = 100  # unusable rows kept as examples per backend; the rest are counted


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
    """Everything one backend left behind, each artifact in one form however it was got: read
    from disk by `load_evidence`, or built in memory (tests, `judge/testing.py`) from rows,
    which the constructor turns into the same form (`traces` -> `StoredTraces`, `metrics` ->
    `Scrapes`, `client` -> `ClientSamples`), so no reader asks which it has. Rows are the parsed
    JSON objects (read-only by convention: nothing in the judge mutates them)."""

    name: str
    safe_name: str
    entry: Mapping[str, Any]  # the backend's manifest entry (levels, runtime_boundary, source, ...)
    # requests.jsonl rows, file order -- for evidence built in memory; `load_evidence` keeps
    # none: it streams them into `table` (`requests` reads whichever is there)
    records: tuple[Mapping[str, Any], ...] = ()
    # traces.jsonl: its rows, or (a backend whose traces the judge re-matches from server.log)
    # only where to read them again (`StoredTraces`)
    traces: StoredTraces = dataclasses.field(default_factory=lambda: StoredTraces())
    telemetry: tuple[Mapping[str, Any], ...] = ()
    followup: Mapping[str, Any] | None = None
    partial_tail: tuple[str, ...] = ()  # files of this backend that end in a cut-off line
    problems: tuple[str, ...] = ()  # rows the judge could not use, as "file:line: why" (the first MAX_PROBLEMS)
    server_log: str | None = None  # the retained server.log's text, for evidence built in memory
    server_log_path: str | None = None  # the retained server.log on disk: streamed from, never held
    # client.jsonl of this backend's load (the run root's file, split by `backend`): the load
    # generator's own health (runner/clienthealth.py), judged by `client_healthy`; as columns
    # (`ClientSamples`, built while the file is read)
    client: ClientSamples = dataclasses.field(default_factory=lambda: samples_of(()))
    mislabeled: tuple[str, ...] = ()  # stored labels the judge's re-derivation contradicts (`rederive`)
    # metrics.jsonl, the server's scraped /metrics (judge/servermetrics.py), as typed series
    # (`Scrapes`, built while the file is read: no row held)
    metrics: Scrapes = dataclasses.field(default_factory=lambda: build_scrapes(()))
    table: RequestTable | None = None  # the usable request records as typed columns (`soakspec.judge.table`)
    problems_total: int | None = None  # how many unusable rows there were (None: len(problems))
    # a partial judge's (`load_evidence(closed=...)`): usable requests not taken into `table`,
    # those of buckets not closed (None: every usable request was taken)
    left_out: int | None = None

    def __post_init__(self) -> None:
        # rows given (evidence built in memory) become the form `load_evidence` builds
        if not isinstance(self.traces, StoredTraces):
            object.__setattr__(self, "traces", StoredTraces(tuple(self.traces)))
        if not isinstance(self.metrics, Scrapes):
            object.__setattr__(self, "metrics", build_scrapes(self.metrics))
        if not isinstance(self.client, ClientSamples):
            object.__setattr__(self, "client", samples_of(self.client))

    @property
    def problem_count(self) -> int:
        return len(self.problems) if self.problems_total is None else self.problems_total

    @functools.cached_property
    def requests(self) -> RequestTable:
        """The backend's usable request records, as columns (built from `records` when the
        evidence was built in memory)."""
        if self.table is not None:
            return self.table
        levels = self.entry.get("levels") if isinstance(self.entry, Mapping) else None
        return build_table((r for r in self.records if request_problem(r) is None),
                           peaks.level_origins(levels if isinstance(levels, list) else ()))


@dataclasses.dataclass(frozen=True)
class Evidence:
    manifest: Mapping[str, Any]
    backends: tuple[BackendEvidence, ...]
    integrity: Integrity = Integrity(verified=False)
    manifest_sha256: str | None = None
    root: str | None = None
    # read up to its last closed bucket (`gate --partial`, `report` of a run not finished): what
    # a run not finished cannot have yet -- a final status and hashes, a cut-off last line, the
    # buckets and levels still to come, the follow-up -- is inconclusive, never a failure
    partial: bool = False

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
        spec, more = check(tree, "manifest.json#spec", data_optional=True)
    except Exception:  # noqa: BLE001 - an embedded spec this soakspec cannot read has no hash to compare
        return None
    return spec.sha256 if spec is not None and not has_errors(more) else None


_NUMBER_KEYS = ("start", "end", "intended_start", "first_token", "ttft", "latency", "tpot", "output_tokens", "prompt_tokens",
                "chunks")


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
    for key in _NUMBER_KEYS:
        v = row.get(key)
        t = type(v)
        if t is float or v is None or (t is int and -(2**63) <= v <= 2**63):
            continue  # the usual case, decided by type alone
        if not isinstance(v, (int, float)) or isinstance(v, bool):
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


def compact_payload(payload: dict[str, Any]) -> dict[str, Any]:
    """What the judge keeps of a trace's payload: the fields it reads, and the numbers (the
    payload's own times: the judge re-matches a trace by its id and times)."""
    return {k: v for k, v in payload.items()
            if k in _TRACE_PAYLOAD_KEYS or isinstance(v, (int, float)) and not isinstance(v, bool)}


def _compact_trace(row: Any) -> Any:
    if not isinstance(row, dict):
        return row
    payload = row.get("payload", row.get("trace"))
    out = {"request_id": row.get("request_id"), "matched": row.get("matched"), "trace_id": row.get("trace_id"),
           "times": row.get("times")}
    if isinstance(payload, dict):
        out["payload"] = compact_payload(payload)
    return out


# What the judge reads of a telemetry sample (the `PerSample` metrics of judge/registry.py: rss,
# cpu, gpu_memory, gpu_memory_device); the rest -- utilization, temperature, power, the pid --
# stays in telemetry.jsonl, hashed. A sample each 5 s for a day, on 8 GPUs: 78 MB held whole, 41 kept.
_TELEMETRY_KEYS = ("t", "server_pss_bytes", "server_rss_bytes", "rss", "server_cpu_percent")
_GPU_KEYS = ("memory_used", "process_memory_used")


def compact_telemetry(row: Any) -> Any:
    """What the judge keeps of a telemetry.jsonl row: the keys it reads, as they were (a key
    absent stays absent), and of `gpus` (when a list) each device's memory figures."""
    if not isinstance(row, dict):
        return row
    out = {k: row[k] for k in _TELEMETRY_KEYS if k in row}
    gpus = row.get("gpus")
    if isinstance(gpus, list):
        out["gpus"] = [{k: g[k] for k in _GPU_KEYS if k in g} for g in gpus if isinstance(g, Mapping)]
    return out


def _read_rows(path: Path, rel: str, problems: list[str], partial: list[str], *, required: bool, compact=None,
               read: dict[str, _Rows] | None = None, root: Path | None = None) -> Any:
    """Rows of a JSONL file, streamed and (with `compact`) compacted one at a time -- or, when
    verification already decoded the file (`read`), its rows from there. A file that is not
    `layout.plain_file` (a symlink, a FIFO: verification reports it, V106) is read as missing."""
    if not layout.plain_file(path, root):
        if required:
            problems.append(f"{rel}: missing")
        return []
    got = read.pop(rel, None) if read is not None else None
    if got is not None:
        rows, bad = got.result(), got.bad
    else:
        bad = []
        if path.name == layout.REQUESTS:  # decoded (and validated) as the record type, once
            from soakspec.evidence.record import iter_records

            rows = list(r for _, r in iter_records(path, bad))
        else:
            rows = [compact(r) if compact is not None else r for _, r in iter_jsonl(path, bad)]
    for line, message in bad:
        if message is None:
            partial.append(rel)
        else:
            problems.append(f"{rel}:{line}: {message}")
    return rows


class _Rows:
    """The rows of one JSONL file as verification decodes them, compacted as they arrive."""

    def __init__(self, compact) -> None:
        self.compact = compact
        self.rows: list[Any] = []
        self.bad: list[tuple[int, str | None]] = []

    def add(self, line: int, row: Any) -> None:
        self.rows.append(self.compact(row) if self.compact is not None else row)

    def end(self, bad_lines: list[tuple[int, str | None]], sha256: str | None = None) -> None:
        self.bad = list(bad_lines)

    def result(self) -> Any:
        """What the judge keeps of the file."""
        return self.rows


class _Built(_Rows):
    """A file verification decodes into a builder (`ScrapeBuilder` for metrics.jsonl,
    `ClientBuilder` for client.jsonl): each row taken in and dropped; the result is what the
    builder made of them."""

    def __init__(self, builder: ScrapeBuilder | ClientBuilder) -> None:
        super().__init__(None)
        self.builder = builder

    def add(self, line: int, row: Any) -> None:
        self.builder.add(row)

    def result(self) -> Any:
        return self.builder.finish()


@dataclasses.dataclass(frozen=True)
class Closed:
    """The requests a partial judge takes of one backend (`soakspec gate --partial`): those of
    its closed buckets, per (workload, level), and the warm-up of a level with one; none of a
    level with no closed bucket, none of the follow-up (bucket -2). The rest -- requests of
    buckets still open (or cut off by a kill) -- never reach the table."""

    buckets: Mapping[tuple[Any, Any], frozenset[int]]

    def keeps(self, workload: Any, level: Any, bucket: Any) -> bool:
        try:
            got = self.buckets.get((workload, level))
        except TypeError:  # an unhashable label (foreign evidence): no closed bucket names it
            return False
        if got is None or not isinstance(bucket, int):
            return False
        return bucket in got or (bucket < 0 and bucket != -2)


class _TableRows(_Rows):
    """requests.jsonl as verification decodes it: each row checked (`request_problem`) and
    appended to the backend's columns, then dropped -- no row is held. With `closed` (a
    partial judge) only the rows it keeps are appended; `left_out` counts the others."""

    def __init__(self, keep_gaps: bool = False, windows: WindowSlots | None = None, closed: Closed | None = None,
                 edges: np.ndarray | None = None) -> None:
        super().__init__(None)
        self.closed = closed
        self.left_out = 0
        # the ITL gaps are counted per bucket (and window: `windows`) as they stream and not kept
        # (`table.GapCells`; binned past a few thousand distinct gaps a cell, cut at `edges`)
        self.builder = TableBuilder(keep_gaps=keep_gaps, windows=windows, gap_edges=edges)
        self.unusable: list[tuple[int, str]] = []  # (record number, why), the first MAX_PROBLEMS
        self.n_unusable = 0
        self.seen = 0
        self.batched = False  # fed by verification's blocks (`add_batch`), else a row at a time

    def add(self, line: int, row: Any) -> None:
        self.seen += 1
        why = request_problem(row)
        if why is None:
            if self.closed is not None and not self.closed.keeps(row.get("workload"), row.get("level"), row.get("bucket")):
                self.left_out += 1
                return
            self.builder.add(row)
        else:
            self.n_unusable += 1
            if len(self.unusable) < MAX_PROBLEMS:
                self.unusable.append((self.seen, why))

    def add_batch(self, first: int, recs: Sequence[Any]) -> None:
        """Consecutive typed records (`verify`'s `iter_record_batches`): a decoded `Record`
        always has a request id and an integer bucket, so none is unusable."""
        self.batched = True
        self.seen += len(recs)
        if self.closed is not None:
            keeps = self.closed.keeps
            kept = [r for r in recs if keeps(r.workload, r.level, r.bucket)]
            self.left_out += len(recs) - len(kept)
            recs = kept
        self.builder.add_records(recs)


class StoredTraces:
    """A backend's traces.jsonl as the judge holds it: its rows (compacted: `_compact_trace`),
    or -- a backend whose traces the judge re-matches from its server.log -- no row, only
    where to read them again. Read from disk that way, what each row claims (its `request_id`,
    and whether it says `matched`) is read again only when some record has no matched trace
    (`rederive._wrong_claims`), so a soak whose every record matched never reads them again,
    and none is held: a long soak has one row per request, and holding their ids cost ~20
    bytes a request and a tenth of the gate's time (benchmarks/README.md, "Soak scale").

    Verification hashed the file while it checked it (`sha256`); read again, the file must hash
    the same, or the judge stops with `EvidenceChanged` (a verdict resting on neither version
    is not given)."""

    __slots__ = ("_rows", "path", "sha256")

    def __init__(self, rows: tuple[Mapping[str, Any], ...] = (), *, path: str | os.PathLike | None = None,
                 sha256: str | None = None) -> None:
        self._rows = rows
        self.path = str(path) if path is not None else None
        self.sha256 = sha256

    @property
    def on_disk(self) -> bool:
        """Whether the rows are not held (read again from `path` when asked)."""
        return self.path is not None

    def _read(self) -> Iterator[Any]:
        assert self.path is not None
        hasher = hashlib.sha256()
        for _, row in iter_jsonl(self.path, [], hasher):
            yield row
        if self.sha256 is not None and hasher.hexdigest() != self.sha256:
            raise EvidenceChanged(f"{self.path} changed while it was being judged: it no longer hashes as it did when verified")

    def rows(self) -> tuple[Mapping[str, Any], ...]:
        """The rows with their ids, times and payloads (read again when they are not held)."""
        if self.path is None:
            return self._rows
        return tuple(r for r in map(_compact_trace, self._read()) if isinstance(r, dict))

    def matched_ids(self) -> Iterator[Any]:
        """The request id of every row that claims a match, in row order (any JSON value: the
        row's, unchecked)."""
        rows = self._read() if self.path is not None else iter(self._rows)
        for row in rows:
            if isinstance(row, dict) and row.get("matched") is True:
                yield row.get("request_id")

    def narrowed(self, request_ids: Iterable[str]) -> StoredTraces:
        """The rows about `request_ids` (a sweep's one probe; consumed only for rows held).
        Rows not held stay on disk: a claim about another probe's request names no record of
        this one, so it is never wrong there (`rederive._wrong_claims`)."""
        if self.path is not None:
            return self
        keep = set(request_ids)
        return StoredTraces(tuple(t for t in self._rows if str(t.get("request_id")) in keep))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, StoredTraces):
            return NotImplemented
        return (self._rows, self.path, self.sha256) == (other._rows, other.path, other.sha256)

    def __repr__(self) -> str:
        return f"StoredTraces(path={self.path!r})" if self.path is not None else f"StoredTraces({len(self._rows)} rows)"


class _ClaimRows(_Rows):
    """traces.jsonl of a backend whose traces the judge re-matches from its log: verification
    checks it and hands over no row, only its bad lines and its hash (`StoredTraces` reads
    the rows again, when they are needed)."""

    wants_rows = False

    def __init__(self, path: str | os.PathLike) -> None:
        super().__init__(None)
        self.path = path
        self.sha256: str | None = None

    def end(self, bad_lines: list[tuple[int, str | None]], sha256: str | None = None) -> None:
        super().end(bad_lines, sha256)
        self.sha256 = sha256

    def result(self) -> StoredTraces:
        return StoredTraces(path=self.path, sha256=self.sha256)


_COMPACTORS = {layout.REQUESTS: _compact_request, layout.TRACES: _compact_trace, layout.TELEMETRY: compact_telemetry}


def _integrity(root: Path, read: dict[str, _Rows] | None = None, from_log: frozenset[str] = frozenset(),
               windows: Mapping[str, WindowSlots] | None = None, closed: Mapping[str, Closed] | None = None,
               edges: np.ndarray | None = None) -> Integrity:
    """Verify `root`. `read`, when given, receives the rows of every backend's requests,
    traces and telemetry file as verification decodes them (rel path -> rows): one pass hashes,
    decodes and validates each file, and the judge reads it from there. `windows`: per
    backend directory, where its levels' cells are cut (`table.WindowSlots`)."""
    from soakspec.evidence.verify import verify_evidence

    def rows(rel: str) -> _Rows | None:
        if read is not None and rel == layout.CLIENT:  # the run root's client health, read from here too
            read[rel] = sink = _Built(ClientBuilder())
            return sink
        parts = rel.split("/")
        if read is None or len(parts) != 3 or parts[0] != layout.BACKENDS:
            return None
        if parts[2] == layout.METRICS:
            read[rel] = sink = _Built(ScrapeBuilder())
            return sink
        if parts[2] not in _COMPACTORS:
            return None
        if parts[2] == layout.REQUESTS:
            read[rel] = sink = _TableRows(windows=(windows or {}).get(parts[1]), closed=(closed or {}).get(parts[1]), edges=edges)
            return sink
        if parts[2] == layout.TRACES and parts[1] in from_log:
            read[rel] = sink = _ClaimRows(root / rel)
            return sink
        read[rel] = sink = _Rows(_COMPACTORS[parts[2]])
        return sink

    report = verify_evidence(root, spec_sha256=embedded_spec_sha256, rows=rows)
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


def load_evidence(run_dir: str | os.PathLike, *, entries: list[dict] | None = None,
                  windows: Iterable[float] = (), closed: Mapping[str, Closed] | None = None,
                  itl_thresholds: Iterable[float] = ()) -> Evidence:
    """Verify and read an evidence directory. Raises `EvidenceNotFound` when there is no
    manifest.json, `EvidenceFormatError` when the manifest does not parse. `entries`, when
    given, are the backend entries to read instead of the manifest's (a run still going has
    none yet: `soakspec gate --partial` makes them from buckets.jsonl). `windows`: the window
    lengths of the spec's `per window` rules (`spec_windows`), so that each window's ITL is
    counted as the requests stream, as each bucket's is; any spec judges the result, a window
    of another length reads the gaps again. `closed`, by backend name: the requests each
    backend's table takes (`Closed`: a partial judge's closed buckets); a backend named there
    gets `left_out`, how many it did not take (not given: every usable request is taken).
    `itl_thresholds`: the thresholds (seconds) the spec's ITL rules compare with
    (`spec_itl_thresholds`): a cell with too many distinct gaps to count each counts them in
    bins cut there, so that those rules stay exact (`judge/gapbins.py`)."""
    root = require_evidence_dir(run_dir)
    mpath = root / layout.MANIFEST
    manifest = read_json(mpath)
    if not isinstance(manifest, dict):
        raise EvidenceFormatError(mpath, 1, "the manifest is not a JSON object")
    manifest_sha = sha256_file(mpath)
    read: dict[str, _Rows] = {}
    if entries is None:
        entries = manifest.get("backends")
    # backends whose traces the run took from server.log: the judge re-matches them from there
    from_log = frozenset(layout.safe_name(e["name"]) for e in entries if isinstance(e, dict) and isinstance(e.get("name"), str)
                         and e.get("trace_source") == "log"
                         and layout.server_log_file(root / layout.BACKENDS / layout.safe_name(e["name"]), root) is not None) \
        if isinstance(entries, list) else frozenset()
    windows = tuple(windows)
    # per backend, where its levels' cells are cut: the spec's windows, and each level's seconds
    # (its measure_start: the output tokens per second of bench serve's peak, `judge.peaks`)
    slots = {layout.safe_name(e["name"]): WindowSlots(e.get("levels") or (), windows) for e in entries
             if isinstance(e, dict) and isinstance(e.get("name"), str) and isinstance(e.get("levels") or [], list)} \
        if isinstance(entries, list) else {}
    cut = {layout.safe_name(name): c for name, c in (closed or {}).items()}
    edges = gapbins.edges_for(itl_thresholds)
    integrity = _integrity(root, read, from_log, slots, cut, edges)

    backends = []
    client = _client_rows(root, read)
    for entry in entries if isinstance(entries, list) else []:
        if isinstance(entry, dict) and isinstance(entry.get("name"), str):
            safe = layout.safe_name(entry["name"])
            be = _load_backend(root, entry, read, from_log, slots.get(safe), cut.get(safe), edges)
            backends.append(dataclasses.replace(be, client=client[be.name]) if be.name in client else be)
    heap.release()  # the blocks' decoded records and per-block arrays, freed in the heap's middle
    return Evidence(manifest, tuple(backends), integrity, manifest_sha, str(run_dir))


def _client_rows(root: Path, read: dict[str, _Rows] | None = None) -> dict[str, ClientSamples]:
    """client.jsonl by backend, as columns in time order (absent in evidence from before it was
    written; a row that is not an object with a `backend` and a numeric `t` is skipped). Built
    as verification decoded the rows (`read`), else read here."""
    path = root / layout.CLIENT
    if not layout.plain_file(path, root):
        return {}
    got = read.pop(layout.CLIENT, None) if read is not None else None
    if got is not None:
        return got.result()
    errors: list[tuple[int, str | None]] = []
    got_rows = build_client(r for _, r in iter_jsonl(path, errors))
    # a corrupt line (not a cut-off last one): verification reports it (the file is hashed)
    return {} if any(m is not None for _, m in errors) else got_rows


def _read_requests(path: Path, rel: str, problems: list[str], partial: list[str],
                   read: dict[str, _Rows], windows: WindowSlots | None = None,
                   closed: Closed | None = None, root: Path | None = None,
                   edges: np.ndarray | None = None) -> tuple[RequestTable, int, int]:
    """requests.jsonl into columns, one row at a time (from verification's decoding when it
    ran, else streamed here); unusable rows become problems (the first MAX_PROBLEMS; also
    returned: how many more there were, and how many usable rows `closed` left out)."""
    name = rel + layout.REQUESTS
    plain = layout.plain_file(path, root)  # a symlink or FIFO is never followed nor opened
    sink = read.pop(name, None) if plain else None
    if not isinstance(sink, _TableRows):
        sink = _TableRows(windows=windows, closed=closed, edges=edges)
        if not plain:
            problems.append(f"{name}: missing")
            return TableBuilder().finish(), 0, 0
        bad: list[tuple[int, str | None]] = []
        for line, row in iter_jsonl(path, bad):
            sink.add(line, row)
        sink.end(bad)
    kept = more = 0  # lines that do not decode as a record and rows unusable: the first MAX_PROBLEMS kept
    for line, message in sink.bad:
        if message is None:
            partial.append(name)
        elif kept < MAX_PROBLEMS:
            problems.append(f"{name}:{line}: {message}")
            kept += 1
        else:
            more += 1
    room = MAX_PROBLEMS - kept
    problems.extend(f"{name}: record {i}: {why}" for i, why in sink.unusable[:room])
    table = sink.builder.finish(reload=functools.partial(_reread, path, sink.batched, windows, sink.closed, edges))
    return table, more + sink.n_unusable - min(len(sink.unusable), room), sink.left_out


def _reread(path: Path, batched: bool, windows: WindowSlots | None = None, closed: Closed | None = None,
            edges: np.ndarray | None = None) -> RequestTable:
    """requests.jsonl.gz read again the way it was read first (verification's blocks, or a
    line at a time, and the same rows taken: `closed`), into a table that keeps its ITL gaps:
    what a table that counted them per bucket reads them from when a computation needs one
    request's gaps (`table.LazyGaps`)."""
    sink = _TableRows(keep_gaps=True, windows=windows, closed=closed, edges=edges)
    if batched:
        from soakspec.evidence.record import iter_record_batches

        for first, recs in iter_record_batches(path, [], schema_errors=[]):
            sink.add_batch(first, recs)
    else:
        for line, row in iter_jsonl(path, []):
            sink.add(line, row)
    return sink.builder.finish()


def _load_backend(root: Path, entry: dict, read: dict[str, _Rows], from_log: frozenset[str],
                  windows: WindowSlots | None = None, closed: Closed | None = None,
                  edges: np.ndarray | None = None) -> BackendEvidence:
    """One backend's records, traces, telemetry and follow-up, read once each (rows already
    decoded by verification come from `read`)."""
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
    table, more, left_out = _read_requests(d / layout.REQUESTS, rel, problems, partial, read, windows, closed, root, edges)
    traces: Any = _read_rows(d / layout.TRACES, rel + layout.TRACES, problems, partial, required=False, compact=_compact_trace,
                             read=read, root=root)
    if not isinstance(traces, StoredTraces):
        traces = StoredTraces(tuple(r for r in traces if isinstance(r, dict)))
    telemetry = [r for r in _read_rows(d / layout.TELEMETRY, rel + layout.TELEMETRY, problems, partial, required=False,
                                       compact=compact_telemetry, read=read, root=root)
                 if isinstance(r, dict)]
    metrics = _read_rows(d / layout.METRICS, rel + layout.METRICS, problems, partial, required=False, read=read, root=root)
    lpath = layout.server_log_file(d, root)  # server.log.gz, else server.log (a run killed before it ended)
    # never read whole: the judge streams it from the run's start offset (`rederive`)
    server_log_path = str(lpath) if lpath is not None else None
    followup = None
    fpath = d / layout.FOLLOWUP
    if layout.plain_file(fpath, root):
        try:
            doc = read_json(fpath)
            followup = doc if isinstance(doc, dict) else None
            if followup is None:
                problems.append(f"{rel}{layout.FOLLOWUP}: not a JSON object")
        except EvidenceFormatError as e:
            problems.append(f"{rel}{layout.FOLLOWUP}:{e.line}: does not parse")
    return BackendEvidence(
        name=name,
        safe_name=safe,
        entry=entry,
        table=table,
        problems_total=len(problems) + more if more else None,
        traces=traces,
        telemetry=tuple(telemetry),
        followup=followup,
        partial_tail=tuple(partial),
        problems=tuple(problems),
        server_log_path=server_log_path,
        metrics=metrics,
        left_out=left_out if closed is not None else None,
    )


def spec_windows(spec: Spec) -> tuple[float, ...]:
    """The window lengths of `spec`'s `per window` rules (for `load_evidence(windows=...)`)."""
    return tuple(sorted({r.window_s for r in spec.gate.rules if r.scope == "window" and r.window_s}))


def spec_itl_thresholds(spec: Spec) -> tuple[float, ...]:
    """The thresholds `spec`'s ITL rules (not a drift or slope of one: a relative change)
    compare with (for `load_evidence(itl_thresholds=...)`)."""
    return tuple(sorted({r.threshold for r in spec.gate.rules
                         if r.expr.metric == "itl" and r.expr.wrapper is None and r.threshold is not None}))
