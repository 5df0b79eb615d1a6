"""The JSON Schemas (Draft 2020-12) shipped in `soakspec/evidence/schemas/`.

`load_schema("manifest")` reads `manifest.schema.json` through importlib.resources (cached);
`validate(name, obj)` returns readable errors, each prefixed with the JSON pointer of the value.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Mapping
from importlib import resources
from typing import Any

SCHEMA_NAMES = ("manifest", "results", "request", "verdict", "trace", "telemetry", "client")

_MAX_MESSAGE = 240


def _resource_name(name: str) -> str:
    name = name.removesuffix(".json").removesuffix(".schema")
    if name not in SCHEMA_NAMES:
        raise KeyError(f"no evidence schema named {name!r} (have: {', '.join(SCHEMA_NAMES)})")
    return f"{name}.schema.json"


@functools.cache
def _load(name: str) -> str:
    return resources.files("soakspec.evidence").joinpath("schemas", _resource_name(name)).read_text("utf-8")


def load_schema(name: str) -> dict:
    """The schema called `name` ("manifest", "results", "request", ...), as a fresh dict."""
    return json.loads(_load(name))


@functools.cache
def _validator(name: str):
    from jsonschema import Draft202012Validator

    schema = load_schema(name)
    Draft202012Validator.check_schema(schema)
    return Draft202012Validator(schema)


def json_pointer(parts) -> str:
    return "".join("/" + str(p).replace("~", "~0").replace("/", "~1") for p in parts)


@functools.cache
def _fast(name: str):
    """A compiled yes/no check for schema `name` (fastjsonschema), ~20x faster than walking
    the schema with jsonschema, which matters for `verify` over millions of JSONL lines.

    fastjsonschema knows drafts up to 07; our schemas use only keywords whose meaning is the
    same there (type, enum, const, required, properties, items, if/then, pattern, minimum,
    exclusiveMinimum as a number, propertyNames, $ref to #/$defs/...). A test checks that both
    validators agree on valid and mutated documents. Only a "no" pays for jsonschema's
    detailed, pointer-labelled errors."""
    import fastjsonschema

    schema = load_schema(name)
    schema["$schema"] = "http://json-schema.org/draft-07/schema#"
    return fastjsonschema.compile(schema)


def is_valid(name: str, obj: Any) -> bool:
    import fastjsonschema

    try:
        _fast(_resource_name(name).removesuffix(".schema.json"))(obj)
    except fastjsonschema.JsonSchemaException:
        return False
    return True


_REQUEST_KEYS = frozenset((
    "request_id", "backend", "workload", "level", "concurrency", "rate", "bucket", "worker",
    "intended_start", "start", "first_byte", "first_token", "end", "status", "outcome", "error", "finish_reason",
    "server_id", "prompt_tokens", "output_tokens", "tokens_source", "itl_source", "chunks", "ttft", "latency",
    "tpot", "itl", "output_sha256", "output_chars",
))  # fmt: skip
# written by the runner since it records empty-text completions (and, #17, coalescing, usage
# going down, the client's processing delay); older evidence lacks them
_OPTIONAL_REQUEST_KEYS = frozenset(("empty_text", "coalesced", "usage_decreased", "client_delay"))
_OPTIONAL_REQUEST_OK = {
    "empty_text": lambda v: type(v) is bool,
    "usage_decreased": lambda v: type(v) is bool,
    "coalesced": lambda v: type(v) is int and v >= 0,
    "client_delay": lambda v: v is None or (type(v) in (int, float) and v >= 0),
}
_OUTCOMES = frozenset(("completed", "failed", "timeout", "rejected", "disconnected"))
_SHA256 = re.compile(r"[0-9a-f]{64}")
_NUM = (int, float)


def _opt_num(v: Any, low: float | None = None) -> bool:
    return v is None or (type(v) in _NUM and (low is None or v >= low))


def _opt_int(v: Any, low: int | None = None, high: int | None = None) -> bool:
    return v is None or (type(v) is int and (low is None or v >= low) and (high is None or v <= high))


def _opt_str(v: Any) -> bool:
    return v is None or type(v) is str


def request_certainly_valid(r: Any) -> bool:
    """True only when `r` is a valid request record (schema "request"): the runner's own shape,
    checked field by field in plain Python, ~30x faster than the compiled schema, which a
    verification of millions of lines needs. False means "not proven": the schema decides
    (`errors_for`). Stricter than the schema (exactly its 29 required keys, and its optional
    ones only with their type; integers as int), never looser -- tests/test_evidence_schema_fast.py
    checks that on mutated records."""
    if type(r) is not dict:
        return False
    optional = _OPTIONAL_REQUEST_KEYS.intersection(r)
    if len(r) - len(optional) != len(_REQUEST_KEYS) or not _REQUEST_KEYS.issuperset(r.keys() - optional):
        return False
    if not all(_OPTIONAL_REQUEST_OK[k](r[k]) for k in optional):
        return False
    rid, backend, outcome, error, itl, sha = r["request_id"], r["backend"], r["outcome"], r["error"], r["itl"], r["output_sha256"]
    if not (type(rid) is str and rid and type(backend) is str and backend and type(r["workload"]) is str):
        return False
    if type(r["level"]) not in (int, str) or type(r["bucket"]) is not int or type(outcome) is not str or outcome not in _OUTCOMES:
        return False
    if not (_opt_int(r["concurrency"], 1) and _opt_int(r["worker"], 0) and _opt_int(r["status"], 100, 599)
            and _opt_int(r["prompt_tokens"], 0) and _opt_int(r["output_tokens"], 0)):
        return False
    chunks, chars, rate = r["chunks"], r["output_chars"], r["rate"]
    if not (type(chunks) is int and chunks >= 0 and type(chars) is int and chars >= 0):
        return False
    if not (rate is None or (type(rate) in _NUM and rate > 0)):
        return False
    if not (_opt_num(r["intended_start"]) and _opt_num(r["start"]) and _opt_num(r["first_byte"]) and _opt_num(r["first_token"])
            and _opt_num(r["end"]) and _opt_num(r["ttft"], 0) and _opt_num(r["latency"], 0) and _opt_num(r["tpot"], 0)):
        return False
    if not (_opt_str(error) and _opt_str(r["finish_reason"]) and _opt_str(r["server_id"]) and _opt_str(r["tokens_source"])
            and _opt_str(r["itl_source"])):
        return False
    if not (sha is None or (type(sha) is str and _SHA256.fullmatch(sha))):
        return False
    if type(itl) is not list or not all(type(g) is float for g in itl) or (itl and not min(itl) >= 0):
        return False
    if outcome == "completed":
        return r["end"] is not None and r["latency"] is not None and error is None
    return type(error) is str and bool(error)


_CERTAIN = {"request": request_certainly_valid}


def errors_for(schema: str | Mapping, obj: Any) -> list[tuple[str, str]]:
    """[(json_pointer, message)] for `obj`, sorted by pointer; empty when valid."""
    if isinstance(schema, str):
        certain = _CERTAIN.get(schema)
        if certain is not None and certain(obj):
            return []
        if is_valid(schema, obj):
            return []
        validator = _validator(_resource_name(schema).removesuffix(".schema.json"))
    else:
        from jsonschema import Draft202012Validator

        validator = Draft202012Validator(dict(schema))
    out = []
    for err in validator.iter_errors(obj):
        message = err.message
        if len(message) > _MAX_MESSAGE:
            message = message[: _MAX_MESSAGE - 3] + "..."
        out.append((json_pointer(err.absolute_path), message))
    return sorted(set(out))


def validate(name: str, obj: Any) -> list[str]:
    """Errors of `obj` against schema `name`, each "pointer: message" ("/" for the root)."""
    return [f"{p or '/'}: {m}" for p, m in errors_for(name, obj)]
