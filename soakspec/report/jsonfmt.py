"""`--format json`: `{schema_version, verdict, results, backend_status, run}` (`run`: how the run
went -- status, abort time and reason, crash diagnosis, pre-flight, `only`; report.common.run_state_json) -- verdict.json's and results.json's
shapes (each carries its own schema_version and validates against its schema), recomputed from
the evidence. Sorted keys, two-space indent, finite numbers only."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

SCHEMA_VERSION = 1


def document(verdict: Any, results: Mapping[str, Any], meta: Mapping[str, Any] | None = None) -> dict[str, Any]:
    doc = {"schema_version": SCHEMA_VERSION, "verdict": verdict.to_json(), "results": dict(results)}
    statuses = (meta or {}).get("backend_status")
    if isinstance(statuses, Mapping):
        doc["backend_status"] = {n: s.to_json() for n, s in statuses.items()}
    if meta is not None:
        from soakspec.report.common import run_state_json

        doc["run"] = run_state_json(meta)
    return doc


def render(verdict: Any, results: Mapping[str, Any], meta: Mapping[str, Any], spec: Any) -> str:
    return json.dumps(document(verdict, results, meta), indent=2, sort_keys=True, ensure_ascii=False, allow_nan=False) + "\n"
