"""Writers for the run's JSON documents other than the manifest, each checked by its schema."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from soakspec.evidence import layout
from soakspec.evidence.io import GzipJsonlWriter, JsonlWriter, write_json_atomic


def write_results(run_dir: str | os.PathLike, results: Mapping[str, Any]) -> str:
    """Validate (schema "results") and atomically write results.json; returns its sha256."""
    return write_json_atomic(layout.RunLayout(Path(run_dir)).results, results, schema="results")


def write_verdict(run_dir: str | os.PathLike, verdict: Mapping[str, Any]) -> str:
    """Validate (schema "verdict") and atomically write verdict.json; returns its sha256."""
    return write_json_atomic(layout.RunLayout(Path(run_dir)).verdict, verdict, schema="verdict")


def open_backend_dir(run_dir: str | os.PathLike, backend: str) -> Path:
    """Create and return `backends/<safe_name>/` for `backend`."""
    d = layout.RunLayout(Path(run_dir)).backend_dir(backend)
    d.mkdir(parents=True, exist_ok=True)
    return d


def request_writer(run_dir: str | os.PathLike, backend: str) -> GzipJsonlWriter:
    """An appender for backends/<safe_name>/requests.jsonl.gz (lines as `record.encode_line`
    makes them; `flush_fsync()` closes a bucket's gzip member)."""
    return GzipJsonlWriter(open_backend_dir(run_dir, backend) / layout.REQUESTS)


def trace_writer(run_dir: str | os.PathLike, backend: str) -> GzipJsonlWriter:
    """An appender for backends/<safe_name>/traces.jsonl.gz (gzip JSONL, as `collect` writes it)."""
    return GzipJsonlWriter(open_backend_dir(run_dir, backend) / layout.TRACES)


def telemetry_writer(run_dir: str | os.PathLike, backend: str) -> JsonlWriter:
    return JsonlWriter(open_backend_dir(run_dir, backend) / layout.TELEMETRY, schema="telemetry")
