"""`soakspec verify`: is an evidence directory exactly what its run wrote, and is it complete?

Integrity problems (exit 1):
  V101 an artifact's bytes changed since the manifest hashed them
  V102 an artifact the manifest lists is missing (results.json and verdict.json a complete run
       needs: V205, V206)
  V103 a file exists but the manifest does not list it
  V104 a JSON document or JSONL record does not match its schema
  V105 a file does not parse (invalid JSON, a corrupt whole JSONL line)
  V106 an unsafe or non-regular entry (a listed path escaping the directory, a symlink...)
  V107 results/verdict written after the manifest are bound to a different manifest
  V108 files disagree with each other (run id, backend of a record, a record naming no worker
       in a level the manifest says ran in more than one load process)
  V109 the spec embedded in the manifest no longer hashes to the sha256 the manifest records
       (checked when the caller gives `spec_sha256`, the spec language's own hash: `soakspec
       verify` and the judge do)
Incompleteness (exit 3 when there is no integrity problem):
  V201 the manifest status is running, incomplete or aborted
  V202 a JSONL file ends in a partial line, or a gzip one (requests.jsonl.gz, traces.jsonl.gz) in an unfinished gzip member
       (a write was cut off: a run killed mid-bucket); its whole lines are still read
  V203 a run still holds the directory's lock
  V204 files were never hashed because the run never finalized its manifest
  V205 a complete run has no results.json yet (and the manifest does not list one)
  V206 a complete run has no verdict.json yet (and the manifest does not list one)

results.json and verdict.json may be written after the final manifest (they can then carry the
manifest's sha256 in `manifest_sha256`): such a file is accepted unlisted when that hash matches.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import stat
from collections.abc import Callable
from pathlib import Path, PurePosixPath
from typing import Annotated, Any, Literal, Protocol

import msgspec

from soakspec.diagnostics import Diagnostic, Severity, Span
from soakspec.evidence import layout
from soakspec.evidence.io import (EvidenceError, EvidenceFormatError, EvidenceNotFound, iter_jsonl_typed, loads, lock_holder,
                                  read_json, require_evidence_dir, sha256_file)
from soakspec.evidence.manifest import stored_spec_sha256
from soakspec.exitcodes import ExitCode

SCHEMA_VERSION = 1
MAX_ERRORS_PER_FILE = 20

# Which schema validates which file, by name.
_JSON_SCHEMAS = {layout.RESULTS: "results", layout.VERDICT: "verdict"}
_JSONL_SCHEMAS = {layout.TRACES: "trace", layout.TELEMETRY: "telemetry", layout.METRICS: "metrics", layout.CLIENT: "client"}  # requests: decoded as `Record`
_MAY_FOLLOW_MANIFEST = (layout.RESULTS, layout.VERDICT)


class _ShortTrace(msgspec.Struct, forbid_unknown_fields=True):
    """A traces.jsonl.gz row as the runner writes it for a trace that is a line of the
    evidence's server.log (no times, no payload: the line holds them). Stricter than the trace
    schema (no other key, every field its schema type), so a block of rows that decodes as this
    type is valid without a schema check (`io.iter_jsonl_typed`); any other row -- a trace with
    times and payload, a foreign key, a broken value -- is decoded and validated as before.
    tests/test_verify_fast_rows.py checks the type against the schema."""

    schema_version: Literal[1]
    trace_id: str | None
    request_id: str | None
    matched: bool
    reason: Literal["unknown_id", "outside_window", "no_id", "incomplete"] | None
    source: str
    offset: Annotated[int, msgspec.Meta(ge=0)] | None
    window_checked: bool | msgspec.UnsetType = msgspec.UNSET
    wall_step_s: float | msgspec.UnsetType = msgspec.UNSET


_FAST_ROWS = {layout.TRACES: msgspec.json.Decoder(_ShortTrace)}


def list_files(run_dir: str | os.PathLike) -> tuple[list[str], list[str]]:
    """(regular files, other entries) under `run_dir` as sorted POSIX relpaths, without
    manifest.json, .lock and manifest.json.sig at the top level (but among the other entries
    when one of them is not a regular file). Symlinks are never followed."""
    root = Path(run_dir)
    files: list[str] = []
    others: list[str] = []
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        rel_dir = Path(dirpath).relative_to(root)
        for d in list(dirnames):
            if os.path.islink(os.path.join(dirpath, d)):
                others.append((rel_dir / d).as_posix())
                dirnames.remove(d)
        for f in filenames:
            rel = (rel_dir / f).as_posix()
            mode = os.lstat(os.path.join(dirpath, f)).st_mode
            if rel in layout.NOT_ARTIFACTS:
                if not stat.S_ISREG(mode):  # a FIFO named .lock, a symlinked signature: not what a run leaves
                    others.append(rel)
                continue
            (files if stat.S_ISREG(mode) else others).append(rel)
    return sorted(files), sorted(others)


def finalize_artifacts(run_dir: str | os.PathLike) -> dict[str, str]:
    """{relpath: sha256} of every regular file in the run directory except manifest.json and
    .lock: the runner stores this as manifest["artifacts"] when the run ends."""
    root = Path(run_dir)
    files, _ = list_files(root)
    return {rel: sha256_file(root / rel) for rel in files}


def _safe_relpath(rel: str) -> bool:
    if not rel or "\\" in rel or "\x00" in rel:
        return False
    p = PurePosixPath(rel)
    return not p.is_absolute() and all(part not in ("", ".", "..") for part in rel.split("/"))


@dataclasses.dataclass(frozen=True, slots=True)
class VerifyReport:
    run_dir: str
    manifest_status: str | None
    artifacts_checked: int  # files the manifest lists with a sha256, re-hashed (what `run` counts)
    records_checked: int
    diagnostics: tuple[Diagnostic, ...]
    bound_checked: int = 0  # results.json / verdict.json: not artifacts, bound by manifest_sha256

    @property
    def problems(self) -> tuple[Diagnostic, ...]:
        return tuple(d for d in self.diagnostics if d.severity is Severity.ERROR)

    @property
    def incomplete(self) -> tuple[Diagnostic, ...]:
        return tuple(d for d in self.diagnostics if d.severity is Severity.WARNING)

    @property
    def result(self) -> str:
        return "failed" if self.problems else "incomplete" if self.incomplete else "ok"

    @property
    def exit_code(self) -> ExitCode:
        return {"failed": ExitCode.GATE_FAILED, "incomplete": ExitCode.INCONCLUSIVE, "ok": ExitCode.OK}[self.result]

    def to_json(self) -> dict[str, Any]:
        return {
            "schema_version": SCHEMA_VERSION,
            "run_dir": self.run_dir,
            "result": self.result,
            "exit_code": int(self.exit_code),
            "manifest_status": self.manifest_status,
            "artifacts_checked": self.artifacts_checked,
            "bound_checked": self.bound_checked,
            "records_checked": self.records_checked,
            "problems": [d.as_json() for d in self.problems],
            "incomplete": [d.as_json() for d in self.incomplete],
        }

    def render_text(self) -> str:
        lines = []
        for d in self.problems + self.incomplete:
            where = f"{d.path}:{d.span.line}:{d.span.column}" if d.span.known else d.path
            tag = " [incomplete]" if d.severity is Severity.WARNING else ""
            lines.append(f"{where}: {d.code} {d.message}{tag}")
        # results.json and verdict.json are conclusions written after the manifest: they name it
        # (manifest_sha256), no hash covers their content, and `gate` re-derives both -- said so,
        # so that "intact" is not read as "its verdict is the run's"
        bound = ("; results.json and verdict.json name this manifest but are conclusions no hash covers"
                 if self.bound_checked == 2 else "; its result file names this manifest but is a conclusion no hash covers")
        bound = f"{bound}: `soakspec gate` re-derives them" if self.bound_checked else ""
        checked = f"{self.artifacts_checked} artifact{'s' if self.artifacts_checked != 1 else ''} and " \
                  f"{self.records_checked} record{'s' if self.records_checked != 1 else ''} checked{bound}"
        n = len(self.problems)
        if n:
            more = "; the run is also incomplete" if self.incomplete else ""
            lines.append(f"Found {n} problem{'s' if n != 1 else ''} in {self.run_dir} ({checked}){more}.")
        elif self.incomplete:
            lines.append(f"{self.run_dir}: intact but incomplete (status {self.manifest_status}; {checked}).")
        else:
            lines.append(f"{self.run_dir}: intact and complete ({checked}).")
        return "\n".join(lines)


class RowSink(Protocol):
    """Where `verify_evidence(rows=...)` hands the rows of one JSONL file as it checks them.

    A sink whose `wants_rows` is False (absent: True) is handed no row, only the file's end:
    its bad lines and the sha256 the check took while it read the file (a reader that reads
    the file again later, and rarely, can tell that it changed meanwhile). The check then makes
    no row object for a line its typed decoder took (`io.iter_jsonl_typed(plain=False)`)."""

    def add(self, line: int, row: Any) -> None: ...

    def end(self, bad_lines: list[tuple[int, str | None]], sha256: str | None = None) -> None: ...


class _Checker:
    def __init__(self, run_dir: str | os.PathLike, spec_sha256: Callable[[str], str | None] | None = None,
                 rows: Callable[[str], RowSink | None] | None = None):
        self.root = Path(run_dir)
        self.spec_sha256 = spec_sha256
        self.rows = rows
        self.hashes: dict[str, str] = {}  # rel -> sha256 of a JSONL file, taken while it was decoded
        self.shown = str(run_dir).rstrip("/") or "/"
        self.diags: list[Diagnostic] = []
        self.artifacts_checked = 0
        self.bound_checked = 0
        self.records_checked = 0

    def path(self, rel: str) -> str:
        return f"{self.shown}/{rel}"

    def error(self, rel: str, code: str, message: str, line: int = 0) -> None:
        self.diags.append(Diagnostic(code, message, Span(line, 1 if line else 0), self.path(rel)))

    def note(self, rel: str, code: str, message: str) -> None:
        self.diags.append(Diagnostic(code, message, path=self.path(rel), severity=Severity.WARNING))

    def schema_errors(self, rel: str, schema: str, obj: Any, line: int = 0, budget: list[int] | None = None) -> bool:
        from soakspec.evidence.schema import errors_for

        errors = errors_for(schema, obj)
        for pointer, message in errors:
            if budget is not None:
                budget[0] -= 1
                if budget[0] < 0:
                    continue
            self.error(rel, "V104", f"{pointer or '/'}: {message} (schema {schema})", line)
        if budget is not None and budget[0] < 0 and not line:  # one document: say how many more
            self.error(rel, "V104", f"... and {-budget[0]} more schema errors")
        return not errors

    # -- the checks -------------------------------------------------------------------------

    def run(self) -> VerifyReport:
        manifest_path = require_evidence_dir(self.shown) / layout.MANIFEST
        try:
            manifest = read_json(manifest_path)
        except EvidenceFormatError as e:
            self.error(layout.MANIFEST, "V105", str(e).split(": ", 1)[-1], e.line)
            return self.report(None)
        if not isinstance(manifest, dict):
            self.error(layout.MANIFEST, "V104", "/: the manifest is not a JSON object")
            return self.report(None)
        self.schema_errors(layout.MANIFEST, "manifest", manifest, budget=[MAX_ERRORS_PER_FILE])
        status = manifest.get("status") if isinstance(manifest.get("status"), str) else None
        manifest_sha = sha256_file(manifest_path)

        holder = lock_holder(self.root)
        if holder is not None:
            self.note(layout.LOCK, "V203", f"a run is still writing this directory (pid {holder or 'unknown'})")
        if status != "complete":
            reason = manifest.get("incomplete_reason")
            self.note(layout.MANIFEST, "V201", f"run status is {status or 'unknown'}" + (f": {reason}" if reason else ""))

        artifacts = manifest.get("artifacts")
        artifacts = artifacts if isinstance(artifacts, dict) else {}
        files, others = list_files(self.root)
        present = set(files)
        # One pass over each JSONL file hashes, decodes, validates (and hands the rows to
        # `rows`); its findings are reported after the hash checks, in the same order as before.
        before, self.diags = self.diags, []
        for rel in files:
            self._check_content(rel, manifest)
        content, self.diags = self.diags, before

        for rel in others:
            self.error(rel, "V106", "not a regular file (symlinks and special files are not evidence)")
        listed_ok: set[str] = set()
        for rel, want in sorted(artifacts.items()):
            if not _safe_relpath(rel):
                self.error(layout.MANIFEST, "V106", f"artifact path {rel!r} is not a plain relative path inside the directory")
                continue
            if rel not in present:
                if rel not in others:
                    self.error(rel, "V102", "listed in manifest.json but missing")
                continue
            got = self.hashes.get(rel) or sha256_file(self.root / rel)
            self.artifacts_checked += 1
            if got != want:
                self.error(rel, "V101", f"changed since the manifest was written (sha256 {got[:12]}..., manifest lists {str(want)[:12]}...)")
            else:
                listed_ok.add(rel)

        unlisted = [rel for rel in files if rel not in artifacts]
        never_finalized = status != "complete" and not artifacts
        for rel in list(unlisted):
            if rel in _MAY_FOLLOW_MANIFEST:
                bound = self._bound_to_manifest(rel, manifest_sha)
                if bound is True:
                    self.bound_checked += 1  # not an artifact: `run` and the manifest do not count it
                    unlisted.remove(rel)
                    listed_ok.add(rel)
                    continue
                if bound is False:
                    self.error(rel, "V107", "is bound to a different manifest (manifest_sha256 does not match manifest.json)")
                    unlisted.remove(rel)
                    continue
        if never_finalized and unlisted:
            self.note(layout.MANIFEST, "V204",
                      f"{len(unlisted)} file{'s' if len(unlisted) != 1 else ''} never hashed: the run did not finalize its manifest")
        else:
            for rel in unlisted:
                self.error(rel, "V103", "exists but is not listed in manifest.json")

        if status == "complete" and layout.RESULTS not in present and layout.RESULTS not in artifacts:
            self.note(layout.RESULTS, "V205", "missing: the run's results were never written (`soakspec gate --write DIR` writes them)")
        if status == "complete" and layout.VERDICT not in present and layout.VERDICT not in artifacts:
            self.note(layout.VERDICT, "V206", "missing: the run's verdict was never written (`soakspec gate --write DIR` writes it)")
        self._check_spec(manifest)

        # Content checks on every file that is present (changed or not: report all we can).
        self.diags.extend(content)
        return self.report(status)

    def _check_spec(self, manifest: dict) -> None:
        spec = manifest.get("spec")
        if self.spec_sha256 is None or not isinstance(spec, dict):
            return
        text, want = spec.get("text"), stored_spec_sha256(spec)
        if not isinstance(text, str) or not isinstance(want, str):
            return
        got = self.spec_sha256(text)
        if got is not None and got != want:
            self.error(layout.MANIFEST, "V109", f"the embedded spec hashes to {got[:12]}..., not the sha256 the manifest records "
                       f"({want[:12]}...): the spec text was changed after the run")

    def _bound_to_manifest(self, rel: str, manifest_sha: str) -> bool | None:
        try:
            doc = loads((self.root / rel).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        bound = doc.get("manifest_sha256") if isinstance(doc, dict) else None
        if not isinstance(bound, str):
            return None
        return bound == manifest_sha

    def _check_content(self, rel: str, manifest: dict) -> None:
        name = PurePosixPath(rel).name
        path = self.root / rel
        if name.endswith(".json"):
            try:
                doc = read_json(path)
            except EvidenceFormatError as e:
                self.error(rel, "V105", str(e).split(": ", 1)[-1], e.line)
                return
            if rel in _JSON_SCHEMAS:
                self.schema_errors(rel, _JSON_SCHEMAS[rel], doc, budget=[MAX_ERRORS_PER_FILE])
                run_id = doc.get("run_id") if isinstance(doc, dict) else None
                if run_id is not None and run_id != manifest.get("run_id"):
                    self.error(rel, "V108", f"run_id {run_id!r} differs from the manifest's {manifest.get('run_id')!r}")
        elif name == layout.REQUESTS:
            self._check_requests(rel, path, _split_levels(manifest))
        elif name.endswith(".jsonl") or name == layout.TRACES:  # traces.jsonl.gz: iter_jsonl reads gzip
            bad_lines: list[tuple[int, str | None]] = []
            schema = _JSONL_SCHEMAS.get(name)
            budget = [MAX_ERRORS_PER_FILE]
            parts = rel.split("/")
            expect_dir = parts[1] if len(parts) == 3 and parts[0] == layout.BACKENDS else None
            hasher = hashlib.sha256()
            sink = self.rows(rel) if self.rows is not None else None
            wanted = sink is not None and getattr(sink, "wants_rows", True)
            fast = _FAST_ROWS.get(name)
            # streamed: a long soak's file never sits in memory
            for line, rec, typed in iter_jsonl_typed(path, bad_lines, hasher, fast, plain=wanted):
                self.records_checked += 1
                if schema and not typed:  # a typed row is valid by its type (`_ShortTrace`)
                    self.schema_errors(rel, schema, rec, line, budget)
                if name == layout.REQUESTS and expect_dir and isinstance(rec, dict) and isinstance(rec.get("backend"), str):
                    if layout.safe_name(rec["backend"]) != expect_dir:
                        budget[0] -= 1
                        if budget[0] >= 0:
                            self.error(rel, "V108", f"record of backend {rec['backend']!r} in the directory of another backend", line)
                if wanted:
                    sink.add(line, rec)
            self.hashes[rel] = hasher.hexdigest()
            if sink is not None:
                sink.end(bad_lines, self.hashes[rel])
            for line, message in [b for b in bad_lines if b[1] is not None][:MAX_ERRORS_PER_FILE]:
                self.error(rel, "V105", message, line)
            if any(message is None for _, message in bad_lines):
                self.note(rel, "V202", "ends in a partial line (a write was cut off); it is ignored")
            if budget[0] < 0:
                self.error(rel, "V104", f"... and {-budget[0]} more problems in this file")

    def _check_requests(self, rel: str, path: Path, split: dict[tuple[str, str, int], int]) -> None:
        """requests.jsonl.gz: one pass hashes, decompresses, decodes and validates each line as a
        `Record` (the type is the schema) and hands it to the row sink. `split`: the levels that
        ran in more than one load process (`_split_levels`), whose records must name a worker."""
        from soakspec.evidence.record import iter_record_batches

        bad_lines: list[tuple[int, str | None]] = []
        invalid: list[tuple[int, str, str]] = []
        budget = [MAX_ERRORS_PER_FILE]
        parts = rel.split("/")
        expect_dir = parts[1] if len(parts) == 3 and parts[0] == layout.BACKENDS else None
        hasher = hashlib.sha256()
        sink = self.rows(rel) if self.rows is not None else None
        batch = getattr(sink, "add_batch", None)
        dirs: dict[str, bool] = {}  # backend name -> its records belong in this directory
        for first, recs in iter_record_batches(path, bad_lines, hasher, schema_errors=invalid):
            self.records_checked += len(recs)
            if expect_dir:
                for name in {r.backend for r in recs}:
                    if name not in dirs:
                        dirs[name] = layout.safe_name(name) == expect_dir
                if not all(dirs[r.backend] for r in recs):
                    for line, rec in enumerate(recs, first):
                        if not dirs[rec.backend]:
                            budget[0] -= 1
                            if budget[0] >= 0:
                                self.error(rel, "V108", f"record of backend {rec.backend!r} in the directory of another backend", line)
            if split and any(r.worker is None for r in recs):
                for line, rec in enumerate(recs, first):
                    parts = split.get((rec.backend, rec.workload, rec.level)) if rec.worker is None else None
                    if parts:
                        budget[0] -= 1
                        if budget[0] >= 0:
                            self.error(rel, "V108", f"record names no worker, but the manifest says its level (workload "
                                       f"{rec.workload!r}, level {rec.level}) ran in {parts} load processes (--workers): "
                                       "which one sent it is unknown", line)
            if batch is not None:
                batch(first, recs)
            elif sink is not None:
                for line, rec in enumerate(recs, first):
                    sink.add(line, rec)
        self.records_checked += len(invalid)
        # a file that stopped being gzip part-way was not read to its end: hash it whole
        done = not bad_lines or bad_lines[-1][1] is None or "gzip" not in bad_lines[-1][1]
        self.hashes[rel] = hasher.hexdigest() if done else sha256_file(path)
        if sink is not None:
            sink.end(bad_lines + [(line, f"{p or '/'}: {m}") for line, p, m in invalid])
        for line, pointer, message in invalid:
            budget[0] -= 1
            if budget[0] >= 0:
                self.error(rel, "V104", f"{pointer or '/'}: {message} (schema request)", line)
        for line, message in [b for b in bad_lines if b[1] is not None][:MAX_ERRORS_PER_FILE]:
            self.error(rel, "V105", message, line)
        if any(message is None for _, message in bad_lines):
            self.note(rel, "V202", "ends in a cut-off write (a partial line or an unfinished gzip member: the run "
                      "stopped mid-bucket); its whole lines are read, the cut is ignored")
        if budget[0] < 0:
            self.error(rel, "V104", f"... and {-budget[0]} more problems in this file")

    def report(self, status: str | None) -> VerifyReport:
        return VerifyReport(self.shown, status, self.artifacts_checked, self.records_checked, tuple(self.diags),
                            self.bound_checked)


def _split_levels(manifest: dict) -> dict[tuple[str, str, int], int]:
    """(backend, workload, level index) -> its load processes, for every level the manifest
    says ran in more than one (its entry's `workers`, written only by `soakspec run --workers N`
    and only since that option exists). A record of such a level names the worker that sent it
    -- the runner has always written an int -- and the judge reads its process from it
    (`judge/capproof.py`); one with a null worker belongs to no process, which no soakspec
    wrote, so `verify` refuses it (V108). The request schema still allows null: a level with no
    `workers` (one process, or evidence from before `--workers`) verifies as it always did."""
    out: dict[tuple[str, str, int], int] = {}
    backends = manifest.get("backends")
    for b in backends if isinstance(backends, list) else []:
        levels = b.get("levels") if isinstance(b, dict) else None
        for lv in levels if isinstance(levels, list) and isinstance(b.get("name"), str) else []:
            n = lv.get("workers") if isinstance(lv, dict) else None
            if type(n) is int and n > 1 and isinstance(lv.get("workload"), str) and type(lv.get("index")) is int:
                out[(b["name"], lv["workload"], lv["index"])] = n
    return out


def verify_evidence(run_dir: str | os.PathLike, *, spec_sha256: Callable[[str], str | None] | None = None,
                    rows: Callable[[str], RowSink | None] | None = None) -> VerifyReport:
    """Check an evidence directory (see the module docstring). Raises `EvidenceNotFound` when
    `run_dir` is not a directory or holds no manifest.json. `spec_sha256(text)`, when given, is
    the spec language's hash of a spec text (None: it does not check): with it, the embedded
    spec is checked against its recorded sha256 (V109). `rows(rel)`, when given, may return a
    `RowSink` for the JSONL file `rel` (relative to the run directory): it gets every row the
    check decoded, then the file's bad lines -- so a reader (the judge) needs no second pass."""
    return _Checker(run_dir, spec_sha256, rows).run()
