"""Test helpers built from the evidence model: sample records and a whole synthetic evidence
directory written with the real writers. Used by soakspec's own tests (and handy for the
judge's); hypothesis is imported only by the strategy functions."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from soakspec.evidence import layout
from soakspec.evidence.io import JsonlWriter, RunLock, write_bytes_atomic, write_json_atomic
from soakspec.evidence.manifest import backend_entry, finalize_manifest, new_manifest, write_manifest
from soakspec.evidence.results import write_results, write_verdict

T0 = 1_747_000_000.0  # a fixed wall-clock origin for synthetic runs

SAMPLE_SPEC = 'backend "a" { url "http://127.0.0.1:8000" }\n'


def sample_request(i: int = 0, backend: str = "a", bucket: int = 0, **overrides: Any) -> dict[str, Any]:
    """A completed, schema-valid requests.jsonl record."""
    start = T0 + i * 0.5
    text = f"output {i}"
    rec: dict[str, Any] = {
        "request_id": f"run1-{backend}-{i:05d}",
        "backend": backend,
        "workload": "short",
        "level": 0,
        "concurrency": 4,
        "rate": None,
        "bucket": bucket,
        "worker": i % 4,
        "intended_start": start,
        "start": start,
        "first_byte": start + 0.01,
        "first_token": start + 0.02,
        "end": start + 0.3,
        "status": 200,
        "outcome": "completed",
        "error": None,
        "finish_reason": "length",
        "server_id": f"cmpl-run1-{backend}-{i:05d}-0",
        "prompt_tokens": 16,
        "output_tokens": 8,
        "tokens_source": "usage",
        "itl_source": "chunks",
        "chunks": 8,
        "ttft": 0.02,
        "latency": 0.3,
        "tpot": 0.04,
        "itl": [0.04] * 7,
        "output_sha256": hashlib.sha256(text.encode()).hexdigest(),
        "output_chars": len(text),
    }
    rec.update(overrides)
    return rec


def sample_results(run_id: str, backends: Sequence[str], per_backend: int) -> dict[str, Any]:
    counts = {"total": per_backend, "completed": per_backend, "failed": 0, "timeout": 0, "rejected": 0, "disconnected": 0}
    return {
        "schema_version": 1,
        "run_id": run_id,
        "backends": [
            {
                "name": b,
                "safe_name": layout.safe_name(b),
                "requests": counts,
                "buckets": [{"bucket": 0, "level": 0, "concurrency": 4, "wall_s": 60.0, "requests": counts,
                             "qps": per_backend / 60.0, "ttft": {"p50": 0.02, "p95": 0.02, "p99": 0.02}}],
                "followup": {"passed": True},
            }
            for b in backends
        ],
    }


def build_evidence_dir(
    run_dir: str | os.PathLike,
    *,
    backends: Sequence[str] = ("a", "b"),
    requests_per_backend: int = 3,
    status: str = "complete",
    run_id: str = "run1",
) -> dict[str, Any]:
    """Write a small, valid evidence directory like a finished run would; returns its manifest."""
    root = Path(run_dir)
    with RunLock(root):
        m = new_manifest(
            run_id=run_id, spec_text=SAMPLE_SPEC, spec_path="specs/sample.soak", started_at=T0,
            host={"hostname": "h", "cpu_model": "cpu", "cpu_cores": 2, "memory_total": 1 << 30,
                  "kernel": "6.0", "os": "Linux", "python_version": "3.11", "soakspec_version": "0.1.0"},
            backends=[backend_entry(name=b, kind="sim", argv=["soakspec", "sim", "--api-key", "sekrit-123"],
                                    env={"HF_TOKEN": "hf_abcdefghijklmnopqrstuvwxyz"}, pid=1000 + i,
                                    started_at=T0, ready_at=T0 + 1.5)
                      for i, b in enumerate(backends)],
        )
        write_manifest(root, m)
        for b in backends:
            d = layout.RunLayout(root).backend_dir(b)
            d.mkdir(parents=True, exist_ok=True)
            with JsonlWriter(d / layout.REQUESTS, schema="request") as w:
                for i in range(requests_per_backend):
                    w.write(sample_request(i, backend=b))
            with JsonlWriter(d / layout.TELEMETRY, schema="telemetry") as w:
                w.write({"schema_version": 1, "t": T0 + 1, "server_pid": 1000, "server_rss_bytes": 1 << 20, "gpus": None})
            write_json_atomic(d / layout.BUCKETS, {"schema_version": 1, "buckets": [{"bucket": 0}]})
            write_json_atomic(d / layout.FOLLOWUP, {"schema_version": 1, "passed": True})
            write_bytes_atomic(d / layout.SERVER_LOG, b"server starting\nready\n")
        write_results(root, sample_results(run_id, backends, requests_per_backend))
        write_verdict(root, {"schema_version": 1, "verdict": "PASS", "rules": []})
        if status == "running":
            return m
        return finalize_manifest(root, m, status, None if status == "complete" else "interrupted", ended_at=T0 + 130)


# --- hypothesis strategies ------------------------------------------------------------------


def secrets_strategy():
    """Secret-looking values: 8-40 characters that cannot be confused with argv structure."""
    from hypothesis import strategies as st

    return st.text(alphabet="abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.~+", min_size=8, max_size=40)
