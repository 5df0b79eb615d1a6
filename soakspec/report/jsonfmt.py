"""`--format json`: `{schema_version, verdict, results}` -- verdict.json's and results.json's
shapes (each carries its own schema_version and validates against its schema), recomputed from
the evidence. Sorted keys, two-space indent, finite numbers only."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

SCHEMA_VERSION = 1


def document(verdict: Any, results: Mapping[str, Any]) -> dict[str, Any]:
    return {"schema_version": SCHEMA_VERSION, "verdict": verdict.to_json(), "results": dict(results)}


def render(verdict: Any, results: Mapping[str, Any], meta: Mapping[str, Any], spec: Any) -> str:
    return json.dumps(document(verdict, results), indent=2, sort_keys=True, ensure_ascii=False, allow_nan=False) + "\n"
