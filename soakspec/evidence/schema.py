"""The JSON Schemas (Draft 2020-12) shipped in `soakspec/evidence/schemas/`.

`load_schema("manifest")` reads `manifest.schema.json` through importlib.resources (cached);
`validate(name, obj)` returns readable errors, each prefixed with the JSON pointer of the value.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping
from importlib import resources
from typing import Any

SCHEMA_NAMES = ("manifest", "results", "request", "verdict", "trace", "telemetry", "metrics", "client")

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


def preload(*names: str) -> None:
    """Read and compile these schemas now (all when none is named). `soakspec run` does it
    before its load: a file opened mid-run (a first telemetry or client-health line) could
    meet a process whose load holds every file descriptor it may open."""
    import fastjsonschema  # noqa: F401 - imported now, for the same reason

    for name in names or SCHEMA_NAMES:
        _fast(_resource_name(name).removesuffix(".schema.json"))


def is_valid(name: str, obj: Any) -> bool:
    import fastjsonschema

    try:
        _fast(_resource_name(name).removesuffix(".schema.json"))(obj)
    except fastjsonschema.JsonSchemaException:
        return False
    return True


def request_certainly_valid(r: Any) -> bool:
    """True only when `r` (a decoded JSON object) is a valid request record: it converts to
    `soakspec.evidence.record.Record`, the type the schema is generated from, whose decode
    checks the types, ranges and cross-field rules in C. False means "not proven": the schema
    decides (`errors_for`), with pointer-labelled errors. Never looser than the schema:
    tests/test_schema_fastpath.py checks that on mutated records."""
    import msgspec

    from soakspec.evidence.record import Record

    if type(r) is not dict:
        return False
    try:
        return msgspec.convert(r, Record).broken_rule() is None
    except (msgspec.ValidationError, TypeError, ValueError):
        return False


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
