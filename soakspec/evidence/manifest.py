"""Building and writing manifest.json (the runner decides when; this module decides what).

A run writes the manifest twice: `new_manifest(...)` + `write_manifest` at the start (status
"running", no artifacts), and `finalize_manifest` at the end, which hashes every file in the
directory into `artifacts` and sets the final status. All builders return new dicts and never
mutate their inputs. Secrets are redacted here (argv, env), before anything reaches the disk.
"""

from __future__ import annotations

import datetime as _dt
import os
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from soakspec.evidence import layout
from soakspec.evidence.io import sha256_file, sha256_text, write_json_atomic
from soakspec.evidence.redact import redact_argv, redact_env, redact_spec_text

SCHEMA_VERSION = 1
STATUSES = ("running", "complete", "incomplete", "aborted")
BACKEND_KINDS = ("launch", "shell", "url", "sim")


def utc_iso(epoch: float) -> str:
    """`2025-05-14T10:23:45.123Z` for an epoch time."""
    dt = _dt.datetime.fromtimestamp(epoch, tz=_dt.timezone.utc)
    return dt.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def new_manifest(
    *,
    run_id: str,
    spec_text: str,
    spec_path: str | None,
    rehearsal: bool = False,
    time_scale: float = 1.0,
    started_at: float | None = None,
    host: Mapping[str, Any] | None = None,
    gpus: Mapping[str, Any] | None = None,
    backends: Sequence[Mapping[str, Any]] = (),
    command: Sequence[str] | None = None,
    secrets: Iterable[str] = (),
    spec_secrets: Iterable[str] | None = None,
) -> dict[str, Any]:
    """The start-of-run manifest (status "running"). `host` defaults to `provenance.host_info()`;
    `gpus` to `{"available": False, ...}` -- pass `NvmlSource().gpu_inventory()`.
    The spec text is stored with `spec_secrets` (default `secrets`: the secrets the spec's own
    text can hold) and credential-looking values redacted (`spec_entry`), the command with
    `secrets`. A secret the run only inherited is never in the spec's text, and replacing it
    there could change what the stored spec says."""
    from soakspec import __version__
    from soakspec.evidence.provenance import host_info

    started = time.time() if started_at is None else started_at
    m: dict[str, Any] = {
        "schema_version": SCHEMA_VERSION,
        "soakspec_version": __version__,
        "run_id": run_id,
        "status": "running",
        "incomplete_reason": None,
        "rehearsal": bool(rehearsal),
        "time_scale": float(time_scale),
        "spec": spec_entry(spec_path, spec_text, secrets if spec_secrets is None else spec_secrets),
        "started_at": utc_iso(started),
        "started_at_epoch": started,
        "ended_at": None,
        "ended_at_epoch": None,
        "host": dict(host) if host is not None else host_info(),
        "gpus": dict(gpus) if gpus is not None else {"available": False, "reason": "not queried"},
        "backends": [dict(b) for b in backends],
        "artifacts": {},
    }
    if command is not None:
        m["command"] = redact_argv(command, secrets)
    return m


def spec_entry(path: str | None, text: str, secrets: Iterable[str] = ()) -> dict[str, Any]:
    """The manifest's `spec`: `text` stored with `secrets` (and credential-looking values)
    redacted; `sha256` that of the real (canonical) text, so the evidence names the spec it ran
    (staleness checks compare it with the spec file); and, when redaction changed the text,
    `text_sha256`: that of the stored text, which is what verification re-hashes (the real
    text's hash cannot be recomputed from a redacted copy)."""
    shown = redact_spec_text(text, secrets)
    entry: dict[str, Any] = {"path": path, "text": shown, "sha256": sha256_text(text)}
    if shown != text:
        entry["text_sha256"] = sha256_text(shown)
    return entry


def recorded_data_files(manifest: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """The data files the run read, as its manifest records them, by kind and workload:
    `"prompt"` each workload's prompt file (the spec's `prompt_files`: absolute path, format,
    sha256; `Plan.prompt_files`), `"trace"` each replayed trace file (its levels' `shape`:
    `source`, format, sha256 -- recorded since replays were, so older evidence has it too). A
    kind the manifest does not record (evidence from before, a hand-made manifest) is empty.
    What re-checking the run's embedded spec looks for (`lang.check.requests.run_file`)."""
    spec = manifest.get("spec")
    prompts = spec.get("prompt_files") if isinstance(spec, Mapping) else None
    traces: dict[str, Any] = {}
    backends = manifest.get("backends")
    for b in backends if isinstance(backends, list) else ():
        levels = b.get("levels") if isinstance(b, Mapping) else None
        for lv in levels if isinstance(levels, list) else ():
            shape = lv.get("shape") if isinstance(lv, Mapping) else None
            if isinstance(shape, Mapping) and shape.get("kind") == "replay" and isinstance(lv.get("workload"), str):
                traces.setdefault(lv["workload"], {"path": shape.get("source"), "format": shape.get("format"),
                                                   "sha256": shape.get("sha256")})
    return {"prompt": prompts if isinstance(prompts, dict) else {}, "trace": traces}


def stored_spec_sha256(spec: Mapping[str, Any]) -> Any:
    """What the manifest's stored spec text must hash to: `text_sha256` when the text was
    redacted, else `sha256` (see `spec_entry`)."""
    return spec["text_sha256"] if "text_sha256" in spec else spec.get("sha256")


def source_entry(repo: str | os.PathLike | None, before: Mapping[str, Any] | None = None,
                 after: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The backend's `source` from two `provenance.git_state` results (before/after the run)."""
    before, after = before or {}, after or {}
    reasons = [r for r in (before.get("reason"), after.get("reason")) if r]
    return {
        "repo": str(repo) if repo is not None else None,
        "commit_before": before.get("commit"),
        "commit_after": after.get("commit"),
        "dirty_before": before.get("dirty"),
        "dirty_after": after.get("dirty"),
        "reason": "; ".join(dict.fromkeys(reasons)) or None,
    }


def model_entry(model_id: str | None, path: str | os.PathLike | None = None,
                revision: str | None = None) -> dict[str, Any]:
    """The backend's `model`: id, revision (given, or from a hub snapshot path), fingerprint."""
    from soakspec.evidence.provenance import model_fingerprint, model_revision

    fp = model_fingerprint(path) if path is not None else {"sha256": None, "files": {}, "reason": "no model path declared"}
    return {
        "id": model_id,
        "revision": revision if revision is not None else (model_revision(path) if path is not None else None),
        "path": str(path) if path is not None else None,
        "fingerprint": fp["sha256"],
        "fingerprint_files": fp["files"],
        "reason": fp["reason"],
    }


def backend_entry(
    *,
    name: str,
    kind: str,
    argv: Sequence[str] | None = None,
    env: Mapping[str, str] | None = None,
    cwd: str | os.PathLike | None = None,
    url: str | None = None,
    pid: int | None = None,
    started_at: float | None = None,
    ready_at: float | None = None,
    exit_status: int | None = None,
    stop_signal: str | None = None,
    runtime_boundary: Any = None,
    source: Mapping[str, Any] | None = None,
    model: Mapping[str, Any] | None = None,
    server_binary: Mapping[str, Any] | None = None,
    secrets: Iterable[str] = (),
) -> dict[str, Any]:
    """One entry of `backends`. `env` is only what the spec sets (never os.environ); argv and
    env are redacted here, of the run's `secrets` too wherever they appear (a token also given
    as a plain argument, or quoted in another variable). `runtime_boundary` may be a
    `RuntimeBoundary` or its JSON."""
    if kind not in BACKEND_KINDS:
        raise ValueError(f"backend kind must be one of {BACKEND_KINDS}, not {kind!r}")
    from soakspec.evidence.redact import scrub

    if runtime_boundary is None:
        rb: dict[str, Any] = {"declared": None, "detected": None, "env_observed": {}, "status": "undeclared",
                              "display": "undeclared", "details": []}
    elif hasattr(runtime_boundary, "to_json"):
        rb = runtime_boundary.to_json()
    else:
        rb = dict(runtime_boundary)
    return {
        "name": name,
        "safe_name": layout.safe_name(name),
        "kind": kind,
        "url": scrub(url) if url else url,
        "argv": redact_argv(argv, secrets) if argv is not None else None,
        "env": redact_env(env or {}, secrets),
        "cwd": str(cwd) if cwd is not None else None,
        "pid": pid,
        "started_at": utc_iso(started_at) if started_at is not None else None,
        "ready_at": utc_iso(ready_at) if ready_at is not None else None,
        "ready_seconds": max(0.0, ready_at - started_at) if started_at is not None and ready_at is not None else None,
        "exit_status": exit_status,
        "stop_signal": stop_signal,
        "runtime_boundary": rb,
        "source": dict(source) if source is not None else source_entry(None),
        "model": dict(model) if model is not None else model_entry(None),
        "server_binary": dict(server_binary) if server_binary is not None else None,
    }


def write_manifest(run_dir: str | os.PathLike, manifest: Mapping[str, Any]) -> str:
    """Validate and atomically write `<run_dir>/manifest.json`; returns its sha256."""
    return write_json_atomic(layout.RunLayout(Path(run_dir)).manifest, manifest, schema="manifest")


def finalize_manifest(
    run_dir: str | os.PathLike,
    manifest: Mapping[str, Any],
    status: str,
    incomplete_reason: str | None = None,
    ended_at: float | None = None,
) -> dict[str, Any]:
    """Hash every artifact, set the final status and end time, write the manifest; returns it.

    `status` is "complete", "incomplete" or "aborted" (the last two need a reason)."""
    from soakspec.evidence.verify import finalize_artifacts

    if status not in STATUSES or status == "running":
        raise ValueError(f"final status must be complete, incomplete or aborted, not {status!r}")
    if status != "complete" and not incomplete_reason:
        raise ValueError(f"a run that ends {status} needs an incomplete_reason")
    ended = time.time() if ended_at is None else ended_at
    final = dict(manifest)
    final.update(
        status=status,
        incomplete_reason=None if status == "complete" else incomplete_reason,
        ended_at=utc_iso(ended),
        ended_at_epoch=ended,
        artifacts=finalize_artifacts(run_dir),
    )
    write_manifest(run_dir, final)
    return final


def manifest_sha256(run_dir: str | os.PathLike) -> str:
    """SHA-256 of manifest.json as written: what results/verdict written later bind to."""
    return sha256_file(layout.RunLayout(Path(run_dir)).manifest)
