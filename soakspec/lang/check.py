"""`SoakFile` -> `Spec`: names, references, types, units, ranges and contradictions.

`check(tree)` is pure: it never touches the file system, the network or a process (a spec
is code, like a Makefile, and checking it must be safe). It reports every problem it can
find in one pass, as `Diagnostic`s with the position of the offending node, and returns a
`Spec` only when there are no errors.

Diagnostic codes (see README "Diagnostics"):
  E1xx structure  E100 unknown block, E101 unknown key, E102 duplicate key, E103 missing,
                  E104 wrong type, E105 duplicate block, E106 duplicate name, E107 label
  E2xx units      E201 missing unit, E202 unknown unit, E203 wrong kind of unit, E204 range
  E3xx rules      E301 undefined backend, E302 unknown metric, E303 unknown function,
                  E304 percentile out of range, E305 type mismatch, E306 unknown scope
  E4xx semantics  E401 bucket longer than duration, E402 generic runtime boundary,
                  E403 contradictory settings, E404 unknown placeholder, E405 bad regex,
                  E406 bad URL, E407 nothing to run
  W5xx warnings
"""

from __future__ import annotations

import hashlib
import math
import re
import string as _string
from collections.abc import Callable, Iterable
from typing import Any

from soakspec.diagnostics import Diagnostic, Severity, Span
from soakspec.evidence.runtime import is_generic_label, validate_log_regex
from soakspec.lang import ast as A
from soakspec.lang import simtrace
from soakspec.lang import spec as S
from soakspec.lang.fmt import expr_text, fmt, rule_text, value_text
from soakspec.lang.metrics import (
    AGGREGATES,
    EVIDENCE_PREDICATES,
    METRICS,
    Kind,
    parse_percentile,
)
from soakspec.units import UNITS, Dimension, UNITS_BY_DIMENSION

PLACEHOLDERS = {"port", "host", "url", "model_path", "model_id", "model_revision", "backend"}
MAX_DURATION_S = 30 * 86400.0  # any duration in a spec; longer is a typo, and sums must stay finite

# One definition of "generic", shared with the evidence layer that re-checks it after a run.
is_generic_runtime_label = is_generic_label


class _Ctx:
    def __init__(self, path: str):
        self.path = path
        self.diags: list[Diagnostic] = []

    def error(self, code: str, msg: str, span: Span, hint: str | None = None) -> None:
        self.diags.append(Diagnostic(code, msg, span, self.path, Severity.ERROR, hint))

    def warn(self, code: str, msg: str, span: Span, hint: str | None = None) -> None:
        self.diags.append(Diagnostic(code, msg, span, self.path, Severity.WARNING, hint))


def _suggest(name: str, options: Iterable[str]) -> str | None:
    import difflib

    close = difflib.get_close_matches(name, list(options), n=1, cutoff=0.6)
    return f"did you mean '{close[0]}'?" if close else None


_MISSING = object()


class _Body:
    """Typed access to a block's attributes; records which keys were used, reports the rest."""

    def __init__(self, ctx: _Ctx, block: A.Block | None, where: str, blocks: Iterable[str] = ()):
        self.ctx = ctx
        self.block = block
        self.where = where
        self.attrs: dict[str, A.Attribute] = {}
        self.blocks: dict[str, list[A.Block]] = {}
        self.allowed_blocks = set(blocks)
        self.used: set[str] = set()
        self.others: list[A.Statement] = []
        if block is None:
            return
        for stmt in block.body:
            if isinstance(stmt, A.Attribute):
                if stmt.key in self.attrs:
                    first = self.attrs[stmt.key].key_span
                    ctx.error("E102", f"duplicate key '{stmt.key}' in {where} (first set on line {first.line})", stmt.key_span)
                    continue
                self.attrs[stmt.key] = stmt
            elif isinstance(stmt, A.Block):
                self.blocks.setdefault(stmt.kind, []).append(stmt)
            else:
                self.others.append(stmt)

    @property
    def span(self) -> Span:
        return self.block.kind_span if self.block is not None else Span()

    def has(self, key: str) -> bool:
        return key in self.attrs

    def get(self, key: str) -> A.Attribute | None:
        self.used.add(key)
        return self.attrs.get(key)

    def sub(self, kind: str, where: str, blocks: Iterable[str] = ()) -> "_Body | None":
        found = self.blocks.get(kind, [])
        self.used.add(kind)
        if len(found) > 1:
            self.ctx.error("E105", f"'{kind}' may appear once in {self.where}", found[1].kind_span)
        if not found:
            return None
        blk = found[0]
        if blk.label is not None:
            self.ctx.error("E107", f"'{kind}' takes no name", blk.label.span)
        return _Body(self.ctx, blk, where, blocks)

    def finish(self, keys: Iterable[str]) -> None:
        keys = set(keys)
        for key, attr in self.attrs.items():
            if key not in self.used:
                self.ctx.error("E101", f"unknown key '{key}' in {self.where}", attr.key_span, _suggest(key, keys))
        for kind, blocks in self.blocks.items():
            if kind not in self.used:
                for blk in blocks:
                    self.ctx.error(
                        "E100",
                        f"unknown block '{kind}' in {self.where}",
                        blk.kind_span,
                        _suggest(kind, keys | self.allowed_blocks),
                    )
        for stmt in self.others:
            what = "rule" if isinstance(stmt, A.Rule) else f"'{stmt.kind}' line"
            allowed = "a gate block" if isinstance(stmt, A.Rule) else "the claims block"
            self.ctx.error("E100", f"a {what} belongs in {allowed}, not in {self.where}", stmt.span)

    # -- typed getters; each returns `default` (and reports) when the value is wrong

    def _type_error(self, attr: A.Attribute, expected: str) -> None:
        got = _describe(attr.value)
        self.ctx.error("E104", f"'{attr.key}' must be {expected}, not {got}", attr.value.span)

    def string(self, key: str, default: Any = None, required: bool = False) -> Any:
        attr = self.get(key)
        if attr is None:
            if required:
                self.ctx.error("E103", f"{self.where} needs '{key}'", self.span)
            return default
        if not isinstance(attr.value, A.Str):
            self._type_error(attr, "a string")
            return default
        return attr.value.value

    def word(self, key: str, choices: tuple[str, ...], default: Any = None) -> Any:
        attr = self.get(key)
        if attr is None:
            return default
        v = attr.value
        name = v.name if isinstance(v, A.Word) else v.value if isinstance(v, A.Str) else None
        if name is None:
            self._type_error(attr, "one of " + ", ".join(choices))
            return default
        if name not in choices:
            self.ctx.error("E104", f"'{key}' must be one of {', '.join(choices)}, not '{name}'", v.span, _suggest(name, choices))
            return default
        return name

    def boolean(self, key: str, default: bool) -> bool:
        attr = self.get(key)
        if attr is None:
            return default
        if not isinstance(attr.value, A.Bool):
            self._type_error(attr, "true or false")
            return default
        return attr.value.value

    def integer(self, key: str, default: Any = None, minimum: int | None = None, required: bool = False) -> Any:
        attr = self.get(key)
        if attr is None:
            if required:
                self.ctx.error("E103", f"{self.where} needs '{key}'", self.span)
            return default
        return _int_value(self.ctx, key, attr.value, minimum, default)

    def number(self, key: str, default: Any = None, lo: float | None = None, hi: float | None = None) -> Any:
        attr = self.get(key)
        if attr is None:
            return default
        v = attr.value
        if not isinstance(v, A.Num):
            self._type_error(attr, "a number")
            return default
        if (lo is not None and v.value < lo) or (hi is not None and v.value > hi):
            self.ctx.error("E204", f"'{key}' must be between {lo} and {hi}, not {v.value}", v.span)
            return default
        return float(v.value)

    def quantity(
        self, key: str, dim: Dimension, default: Any = None, required: bool = False, positive: bool = True, allow_zero: bool = False
    ) -> Any:
        attr = self.get(key)
        if attr is None:
            if required:
                self.ctx.error("E103", f"{self.where} needs '{key}'", self.span)
            return default
        val = _quantity_value(self.ctx, key, attr.value, dim)
        if val is None:
            return default
        if positive and (val < 0 or (val == 0 and not allow_zero)):
            self.ctx.error("E204", f"'{key}' must be {'zero or more' if allow_zero else 'more than zero'}", attr.value.span)
            return default
        return val

    def strings(self, key: str, default: tuple = (), required: bool = False) -> tuple[str, ...]:
        attr = self.get(key)
        if attr is None:
            if required:
                self.ctx.error("E103", f"{self.where} needs '{key}'", self.span)
            return default
        v = attr.value
        if not isinstance(v, A.List) or not all(isinstance(i, A.Str) for i in v.items):
            self._type_error(attr, "a list of strings")
            return default
        return tuple(i.value for i in v.items)

    def ints(self, key: str, minimum: int | None = None, required: bool = False, default: tuple = ()) -> tuple[int, ...]:
        """One integer or a list of them."""
        attr = self.get(key)
        if attr is None:
            if required:
                self.ctx.error("E103", f"{self.where} needs '{key}'", self.span)
            return default
        items = attr.value.items if isinstance(attr.value, A.List) else (attr.value,)
        if isinstance(attr.value, A.List) and not items:
            self.ctx.error("E204", f"'{key}' needs at least one value", attr.value.span)
            return default
        out = []
        for item in items:
            n = _int_value(self.ctx, key, item, minimum, None)
            if n is None:
                return default
            out.append(n)
        return tuple(out)

    def quantities(self, key: str, dim: Dimension, required: bool = False) -> tuple[float, ...]:
        attr = self.get(key)
        if attr is None:
            if required:
                self.ctx.error("E103", f"{self.where} needs '{key}'", self.span)
            return ()
        items = attr.value.items if isinstance(attr.value, A.List) else (attr.value,)
        out = []
        for item in items:
            v = _quantity_value(self.ctx, key, item, dim)
            if v is None:
                return ()
            if v <= 0:
                self.ctx.error("E204", f"'{key}' must be more than zero", item.span)
                return ()
            out.append(v)
        return tuple(out)


def _describe(v: A.Value) -> str:
    if isinstance(v, A.Str):
        return f"the string {value_text(v)}"
    if isinstance(v, A.Num):
        return f"the number {value_text(v)}"
    if isinstance(v, A.Quantity):
        return f"the quantity {value_text(v)}"
    if isinstance(v, A.Bool):
        return value_text(v)
    if isinstance(v, A.Word):
        return f"the name '{v.name}'"
    return "a list"


def _int_value(ctx: _Ctx, key: str, v: A.Value, minimum: int | None, default: Any) -> Any:
    if isinstance(v, A.Quantity):
        ctx.error("E104", f"'{key}' is a plain count and takes no unit (got {value_text(v)})", v.span)
        return default
    if not isinstance(v, A.Num) or not isinstance(v.value, int):
        ctx.error("E104", f"'{key}' must be a whole number, not {_describe(v)}", v.span)
        return default
    if minimum is not None and v.value < minimum:
        rel = "more than zero" if minimum == 1 else f"at least {minimum}"
        ctx.error("E204", f"'{key}' must be {rel}, not {v.value}", v.span)
        return default
    return v.value


def _quantity_value(ctx: _Ctx, key: str, v: A.Value, dim: Dimension) -> float | None:
    units = ", ".join(UNITS_BY_DIMENSION[dim])
    if isinstance(v, A.Num):
        if dim is Dimension.RATIO:
            if not 0 <= v.value <= 1:
                ctx.error("E204", f"'{key}' as a plain number is a fraction between 0 and 1; write {v.value}% for a percentage", v.span)
                return None
            return float(v.value)
        ctx.error("E201", f"'{key}' needs a unit: write {value_text(v)} followed by one of {units}", v.span)
        return None
    if not isinstance(v, A.Quantity):
        ctx.error("E104", f"'{key}' must be a {dim} ({units}), not {_describe(v)}", v.span)
        return None
    if v.unit not in UNITS:
        ctx.error("E202", f"unknown unit '{v.unit}' in {value_text(v)} (a {dim} takes {units})", v.span, _suggest(v.unit, UNITS_BY_DIMENSION[dim]))
        return None
    got_dim, factor = UNITS[v.unit]
    if got_dim is not dim:
        ctx.error("E203", f"'{key}' is a {dim} ({units}); {value_text(v)} is a {got_dim}", v.span)
        return None
    value = float(v.value) * factor
    if not math.isfinite(value) or (dim is Dimension.DURATION and abs(value) > MAX_DURATION_S):
        ctx.error("E204", f"'{key}' is too large" + (" (at most 30 days)" if dim is Dimension.DURATION else ""), v.span)
        return None
    return value


# ---------------------------------------------------------------- top level

TOP_LEVEL = ("soak", "model", "source", "telemetry", "backend", "workload", "gate", "claims")


def check(tree: A.SoakFile, path: str = "<string>") -> tuple[S.Spec | None, list[Diagnostic]]:
    ctx = _Ctx(path)
    singles: dict[str, A.Block] = {}
    backends: list[A.Block] = []
    workloads: list[A.Block] = []
    for stmt in tree.body:
        if isinstance(stmt, A.Block):
            if stmt.kind in ("backend", "workload"):
                (backends if stmt.kind == "backend" else workloads).append(stmt)
            elif stmt.kind in TOP_LEVEL:
                if stmt.kind in singles:
                    ctx.error("E105", f"'{stmt.kind}' may appear once (first on line {singles[stmt.kind].span.line})", stmt.kind_span)
                else:
                    singles[stmt.kind] = stmt
            else:
                ctx.error("E100", f"unknown block '{stmt.kind}'", stmt.kind_span, _suggest(stmt.kind, TOP_LEVEL))
        elif isinstance(stmt, A.Attribute):
            ctx.error("E101", f"unknown key '{stmt.key}' at the top level (settings go inside a block)", stmt.key_span)
        elif isinstance(stmt, A.Rule):
            ctx.error("E100", "a rule belongs in a gate block", stmt.span)
        else:
            ctx.error("E100", f"'{stmt.kind}' belongs in the claims block", stmt.span)

    header = _header(ctx, singles.get("soak"))
    model = _model(ctx, singles.get("model"))
    source = _source(ctx, singles.get("source"))
    telemetry = _telemetry(ctx, singles.get("telemetry"))
    bks = _named(ctx, backends, "backend", lambda b: _backend(ctx, b))
    wls = _named(ctx, workloads, "workload", lambda w: _workload(ctx, w))
    if not backends:
        ctx.error("E407", "the spec declares no backend", Span(1, 1, 1, 2), "add: backend \"name\" { launch = [...] } or { url = \"...\" } or { sim {} }")
    if not workloads:
        ctx.error("E407", "the spec declares no workload", Span(1, 1, 1, 2), "add: workload \"name\" { ... }")
    gate = _gate(ctx, singles.get("gate"), {b.name for b in bks})
    claims = _claims(ctx, singles.get("claims"))

    errors = [d for d in ctx.diags if d.severity is Severity.ERROR]
    if errors:
        return None, ctx.diags
    text = fmt(tree)
    spec = S.Spec(
        header=header,
        model=model,
        source=source,
        telemetry=telemetry,
        backends=tuple(bks),
        workloads=tuple(wls),
        gate=gate,
        claims=claims,
        canonical_text=text,
        sha256=hashlib.sha256(text.encode()).hexdigest(),
        path=path,
    )
    return spec, ctx.diags


def _named(ctx: _Ctx, blocks: list[A.Block], what: str, build: Callable[[A.Block], Any]) -> list:
    seen: dict[str, A.Block] = {}
    out = []
    for blk in blocks:
        if blk.label is None:
            ctx.error("E107", f"a {what} needs a name: {what} \"name\" {{ ... }}", blk.kind_span)
            continue
        name = blk.label.value
        if not name.strip() or len(name) > 64 or any(c in name for c in "\n\r\t\0"):
            ctx.error("E107", f"{what} name must be 1 to 64 characters on one line", blk.label.span)
            continue
        if name in seen:
            ctx.error("E106", f"duplicate {what} '{name}' (first declared on line {seen[name].span.line})", blk.label.span)
            continue
        seen[name] = blk
        item = build(blk)
        if item is not None:
            out.append(item)
    return out


def _header(ctx: _Ctx, blk: A.Block | None) -> S.Header:
    if blk is None:
        ctx.error("E103", "the spec needs a header: soak \"name\" { issue = \"...\" }", Span(1, 1, 1, 2))
        return S.Header(name="unnamed")
    b = _Body(ctx, blk, "the soak header")
    name = blk.label.value if blk.label is not None else None
    if not name:
        ctx.error("E107", "the soak header needs a name: soak \"name\" { ... }", blk.kind_span)
    h = S.Header(
        name=name or "unnamed",
        issue=b.string("issue"),
        description=b.string("description"),
        parallel=b.boolean("parallel", False),
    )
    b.finish(["issue", "description", "parallel"])
    return h


def _model(ctx: _Ctx, blk: A.Block | None) -> S.Model:
    if blk is None:
        return S.Model()
    b = _Body(ctx, blk, "model")
    if blk.label is not None:
        ctx.error("E107", "'model' takes no name; use id = \"...\"", blk.label.span)
    m = S.Model(id=b.string("id"), revision=b.string("revision"), path=b.string("path"), served_name=b.string("served_name"))
    b.finish(["id", "revision", "path", "served_name"])
    if m.revision is not None and not re.fullmatch(r"[0-9a-f]{7,64}|[A-Za-z0-9._\-/]+", m.revision):
        ctx.error("E204", "model revision must be a commit hash or a tag", b.get("revision").value.span)
    return m


def _source(ctx: _Ctx, blk: A.Block | None) -> S.Source:
    if blk is None:
        return S.Source()
    b = _Body(ctx, blk, "source")
    s = S.Source(repo=b.string("repo", required=True))
    b.finish(["repo"])
    return s


def _telemetry(ctx: _Ctx, blk: A.Block | None) -> S.Telemetry:
    if blk is None:
        return S.Telemetry()
    b = _Body(ctx, blk, "telemetry")
    t = S.Telemetry(
        interval_s=b.quantity("interval", Dimension.DURATION, 5.0),
        require_gpus=b.boolean("require_gpus", False),
    )
    b.finish(["interval", "require_gpus"])
    return t


# ---------------------------------------------------------------- backends

BACKEND_KEYS = ("launch", "shell", "url", "env", "cwd", "shutdown_grace", "gpus", "log", "api_key_env")
BACKEND_BLOCKS = ("sim", "env", "ready", "runtime", "traces")


def _backend(ctx: _Ctx, blk: A.Block) -> S.Backend | None:
    name = blk.label.value
    where = f"backend '{name}'"
    b = _Body(ctx, blk, where, BACKEND_BLOCKS)
    kinds = [k for k in ("launch", "shell", "url") if b.has(k)] + (["sim"] if "sim" in b.blocks else [])
    if not kinds:
        ctx.error("E103", f"{where} needs one of: launch = [argv...], shell = \"command\", url = \"http://...\", or a sim {{}} block", blk.kind_span)
    elif len(kinds) > 1:
        second = b.attrs[kinds[1]].key_span if kinds[1] in b.attrs else b.blocks["sim"][0].kind_span
        ctx.error("E403", f"{where} sets both '{kinds[0]}' and '{kinds[1]}'; a backend is launched one way", second)
    kind = kinds[0] if kinds else "url"

    argv = b.strings("launch")
    if b.has("launch") and isinstance(b.attrs["launch"].value, A.List) and not b.attrs["launch"].value.items:
        ctx.error("E204", "'launch' needs at least the program to run", b.attrs["launch"].value.span)
    shell = b.string("shell")
    url = b.string("url")
    if url is not None:
        m = re.fullmatch(r"(https?)://([^/\s:]+|\[[0-9a-fA-F:]+\])(:\d{1,5})?(/[^\s]*)?", url)
        if not m:
            ctx.error("E406", f"'url' must be an http(s) URL like http://127.0.0.1:8000, not {url!r}", b.attrs["url"].value.span)
    for key in ("launch", "shell"):
        attr = b.attrs.get(key)
        if attr is None:
            continue
        texts = [(i.value, i.span) for i in attr.value.items if isinstance(i, A.Str)] if isinstance(attr.value, A.List) else [(attr.value.value, attr.value.span)] if isinstance(attr.value, A.Str) else []
        for text, span in texts:
            for field in _placeholders(text):
                if field not in PLACEHOLDERS:
                    ctx.error("E404", f"unknown placeholder '{{{field}}}' (known: {', '.join('{' + p + '}' for p in sorted(PLACEHOLDERS))})", span, "write '{{' and '}}' for literal braces")
    if kind in ("launch", "shell"):
        has_port = any("{port}" in t for t in (argv or ((shell,) if shell else ())))
        if not has_port:
            ctx.warn("W501", f"{where} never uses '{{port}}'; soakspec cannot tell the server which port to listen on", blk.kind_span)

    sim_opts: tuple = ()
    if "sim" in b.blocks:
        sim_opts = _sim_options(ctx, b.sub("sim", f"the sim block of {where}"))

    env: list[tuple[str, str]] = []
    envb = b.sub("env", f"the env of {where}")
    if envb is not None:
        for key, attr in envb.attrs.items():
            envb.used.add(key)
            if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):
                ctx.error("E104", f"'{key}' is not a valid environment variable name", attr.key_span)
            if isinstance(attr.value, A.Str):
                env.append((key, attr.value.value))
            elif isinstance(attr.value, (A.Num, A.Bool)):
                env.append((key, value_text(attr.value)))
            else:
                ctx.error("E104", f"env value '{key}' must be a string, not {_describe(attr.value)}", attr.value.span)
        envb.finish([])
    if b.has("env"):
        b.get("env")
        ctx.error("E104", "'env' is a block: env { NAME = \"value\" }", b.attrs["env"].key_span)

    ready = S.Ready()
    rb = b.sub("ready", f"the ready probe of {where}")
    if rb is not None:
        ready = S.Ready(
            method=rb.word("method", ("GET", "POST", "HEAD"), "GET"),
            path=rb.string("path", "/v1/models"),
            status=rb.integer("status", 200, minimum=100),
            timeout_s=rb.quantity("timeout", Dimension.DURATION, 600.0),
            interval_s=rb.quantity("interval", Dimension.DURATION, 0.5),
        )
        if not ready.path.startswith("/"):
            ctx.error("E204", "ready 'path' must start with '/'", rb.attrs["path"].value.span)
        if ready.status > 599:
            ctx.error("E204", "ready 'status' must be an HTTP status (100-599)", rb.attrs["status"].value.span)
        rb.finish(["method", "path", "status", "timeout", "interval"])

    runtime = None
    rt = b.sub("runtime", f"the runtime boundary of {where}")
    if rt is not None:
        label = rt.string("label", required=True)
        pattern = rt.string("log_pattern")
        version = rt.string("version")
        require_env = rt.strings("require_env")
        rt.finish(["label", "log_pattern", "version", "require_env"])
        if label is not None and is_generic_runtime_label(label):
            ctx.error(
                "E402",
                f"runtime boundary {label!r} is generic; name the runtime and its version or mode (e.g. \"NCCL 2.26.2, NCCL_IB_DISABLE=1\" or \"host-staged\")",
                rt.attrs["label"].value.span,
            )
        if pattern is not None:
            problem = validate_log_regex(pattern)
            if problem is not None:
                ctx.error("E405", f"runtime log_pattern: {problem}", rt.attrs["log_pattern"].value.span)
        if version is not None and pattern is None:
            ctx.error("E403", "runtime 'version' is confirmed from the log: add log_pattern = r\"... (\\d+\\.\\d+\\.\\d+)\"", rt.attrs["version"].key_span)
        env_names = {k for k, _ in env}
        for n in require_env:
            if n not in env_names:
                ctx.warn("W502", f"runtime requires env '{n}' that this backend's env block does not set (it must then come from the caller's environment)", rt.attrs["require_env"].value.span)
        if label is not None:
            runtime = S.RuntimeDecl(label=label, log_pattern=pattern, version=version, require_env=require_env)

    traces = S.Traces()
    tb = b.sub("traces", f"the traces of {where}")
    if tb is not None:
        src = tb.word("source", ("none", "log", "jsonl"), "none")
        pattern = tb.string("pattern")
        file = tb.string("file")
        id_field = tb.string("id_field", "request_id")
        forms = tb.strings("id_forms", S.Traces.id_forms)
        tb.finish(["source", "pattern", "file", "id_field", "id_forms"])
        if src == "log" and pattern is None:
            ctx.error("E103", "traces from the log need a 'pattern' with a (?P<json>...) or (?P<id>...) group", tb.span)
        if src == "jsonl" and file is None:
            ctx.error("E103", "traces from a JSONL file need 'file'", tb.span)
        if pattern is not None:
            rx = _check_regex(ctx, pattern, tb.attrs["pattern"].value.span)
            if rx is not None and not ({"json", "id"} & set(rx.groupindex)):
                ctx.error("E405", "trace 'pattern' needs a named group (?P<json>...) for a JSON payload or (?P<id>...) for a request id", tb.attrs["pattern"].value.span)
        for f in forms:
            if "{id}" not in f:
                ctx.error("E204", f"id form {f!r} must contain '{{id}}'", tb.attrs["id_forms"].value.span)
        traces = S.Traces(source=src, pattern=pattern, file=file, id_field=id_field, id_forms=forms)
    if kind == "sim" and tb is None:
        traces = S.Traces(source="log", pattern=simtrace.TRACE_PATTERN, id_forms=simtrace.ID_FORMS)
    if kind == "url" and traces.source == "log":
        ctx.error("E403", "traces from the server log need a launched backend; for a url backend use source = jsonl", tb.span if tb else blk.kind_span)

    grace = b.quantity("shutdown_grace", Dimension.DURATION, 10.0)
    gpus = b.ints("gpus", minimum=0)
    capture = b.boolean("log", True)
    if not capture and (traces.source == "log" or (runtime is not None and runtime.log_pattern is not None)):
        ctx.error(
            "E403",
            f"{where} sets log = false, but reads its {'traces' if traces.source == 'log' else 'runtime boundary'} from the server log",
            b.attrs["log"].value.span,
        )
    cwd = b.string("cwd")
    api_key_env = b.string("api_key_env")
    if api_key_env is not None and not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", api_key_env):
        ctx.error("E104", "'api_key_env' names an environment variable (the key itself is never written in a spec)", b.attrs["api_key_env"].value.span)
    b.finish(BACKEND_KEYS + BACKEND_BLOCKS)
    if kind == "url" and (b.has("cwd") or envb is not None or gpus):
        ctx.warn("W503", f"{where} is an already-running server (url); cwd, env and gpus are ignored", blk.kind_span)
    return S.Backend(
        name=name,
        kind=kind,
        argv=argv,
        shell=shell,
        url=url,
        sim=sim_opts,
        env=tuple(env),
        cwd=cwd,
        ready=ready,
        shutdown_grace_s=grace,
        gpus=gpus,
        capture_log=capture,
        api_key_env=api_key_env,
        runtime=runtime,
        traces=traces,
        span=blk.kind_span,
    )


def _placeholders(text: str) -> list[str]:
    try:
        return [f for _, f, _, _ in _string.Formatter().parse(text) if f is not None]
    except ValueError:
        return ["<unbalanced brace>"]


def _check_regex(ctx: _Ctx, pattern: str, span: Span):
    try:
        return re.compile(pattern)
    except re.error as e:
        ctx.error("E405", f"invalid regular expression: {e}", span)
        return None


def _sim_options(ctx: _Ctx, b: _Body | None) -> tuple:
    if b is None:
        return ()
    try:
        from soakspec.sim.config import SIM_OPTIONS
    except ImportError:  # pragma: no cover - the simulator ships with the package
        SIM_OPTIONS = {}
    kinds = {"duration": Dimension.DURATION, "ratio": Dimension.RATIO, "size": Dimension.SIZE}
    out = []
    for key in sorted(b.attrs):
        kind = SIM_OPTIONS.get(key)
        if kind is None or key in ("host", "port", "port_file"):
            continue  # reported by finish() as unknown
        if kind in kinds:
            v = b.quantity(key, kinds[kind], positive=True, allow_zero=True)
        elif kind == "int":
            v = b.integer(key, minimum=0)
        elif kind == "float":
            v = b.number(key)
        elif kind == "bool":
            v = b.boolean(key, False)
        else:
            v = b.string(key)
        if v is not None:
            out.append((key, v))
    b.finish([k for k in SIM_OPTIONS if k not in ("host", "port", "port_file")])
    return tuple(out)


# ---------------------------------------------------------------- workloads

MAX_BUCKETS_PER_LEVEL = 10_000  # the plan lists every bucket; a 1 ms bucket over 24 h would never finish
MAX_LOAD_LEVEL = 1_000_000  # with MAX_DURATION_S, keeps the plan's request estimates finite

WORKLOAD_KEYS = (
    "endpoint", "stream", "prompt_words", "prompt_file", "max_tokens", "sampling", "ignore_eos",
    "duration", "bucket", "warmup", "deadline", "follow_up", "expected_latency",
)  # fmt: skip


def _workload(ctx: _Ctx, blk: A.Block) -> S.Workload | None:
    name = blk.label.value
    where = f"workload '{name}'"
    b = _Body(ctx, blk, where, ("load", "sampling"))
    endpoint = b.word("endpoint", ("completions", "chat"), "completions")
    stream = b.boolean("stream", True)
    prompt_words = b.integer("prompt_words", minimum=1)
    prompt_file = b.string("prompt_file")
    if prompt_words is not None and prompt_file is not None:
        ctx.error("E403", f"{where} sets both 'prompt_words' and 'prompt_file'", b.attrs["prompt_file"].key_span)
    if prompt_words is None and prompt_file is None and not b.has("prompt_words"):
        prompt_words = 64
    max_tokens = b.ints("max_tokens", minimum=1, default=(64,))
    ignore_eos = b.boolean("ignore_eos", True)

    sampling = S.Sampling()
    if b.has("sampling") and "sampling" in b.blocks:
        ctx.error("E403", "'sampling' is either a word (greedy) or a block, not both", b.blocks["sampling"][0].kind_span)
    if b.has("sampling"):
        b.word("sampling", ("greedy",))
    sb = b.sub("sampling", f"the sampling of {where}")
    if sb is not None:
        temperature = sb.number("temperature", 1.0, lo=0.0, hi=10.0)
        top_k = sb.integer("top_k", minimum=1)
        top_p = sb.number("top_p", 1.0, lo=0.0, hi=1.0)
        if sb.has("top_p") and top_p == 0:
            ctx.error("E204", "'top_p' must be more than 0", sb.attrs["top_p"].value.span)
        seed = sb.integer("seed", minimum=0)
        sb.finish(["temperature", "top_k", "top_p", "seed"])
        sampling = S.Sampling(greedy=temperature == 0, temperature=temperature, top_k=top_k, top_p=top_p, seed=seed)

    load = S.Load("closed", (1,))
    lb = b.sub("load", f"the load of {where}")
    if lb is None:
        ctx.error("E103", f"{where} needs a load block: load {{ mode = closed  concurrency = [4, 8] }}", blk.kind_span)
    else:
        mode = lb.word("mode", ("closed", "batch", "open"), "closed")
        if mode in ("closed", "batch"):
            conc = lb.ints("concurrency", minimum=1, required=True)
            requests = lb.integer("requests", minimum=1, required=(mode == "batch"))
            if mode == "closed" and requests is not None:
                ctx.error("E403", "'requests' sets the batch size of mode = batch; closed-loop load runs for the duration", lb.attrs["requests"].key_span)
            for key in ("rate", "arrival", "seed"):
                if lb.has(key):
                    lb.get(key)
                    ctx.error("E403", f"'{key}' belongs to open-loop load (mode = open)", lb.attrs[key].key_span)
            load = S.Load(mode, conc or (1,), requests)
        else:
            rates = lb.quantities("rate", Dimension.RATE, required=True)
            arrival = lb.word("arrival", ("constant", "poisson"), "constant")
            seed = lb.integer("seed", 0, minimum=0)
            for key in ("concurrency", "requests"):
                if lb.has(key):
                    lb.get(key)
                    ctx.error("E403", f"'{key}' belongs to closed-loop load; open-loop load sets 'rate'", lb.attrs[key].key_span)
            load = S.Load("open", (), None, rates or (1.0,), arrival, seed)
        lb.finish(["mode", "concurrency", "requests", "rate", "arrival", "seed"])
        levels = load.levels
        if len(set(levels)) != len(levels):
            ctx.warn("W504", "the same load level is listed twice", lb.span)
        key = "rate" if mode == "open" else "concurrency"
        if levels and max(levels) > MAX_LOAD_LEVEL and key in lb.attrs:
            what = "requests/s" if mode == "open" else "workers"
            ctx.error("E204", f"'{key}' is more than {MAX_LOAD_LEVEL:,} {what}", lb.attrs[key].value.span)

    duration = b.quantity("duration", Dimension.DURATION, required=True)
    bucket = b.quantity("bucket", Dimension.DURATION)
    warmup = b.quantity("warmup", Dimension.DURATION, 0.0, allow_zero=True)
    deadline = b.quantity("deadline", Dimension.DURATION, 300.0)
    follow_up = b.boolean("follow_up", True)
    expected_latency = b.quantity("expected_latency", Dimension.DURATION)
    b.finish(WORKLOAD_KEYS + ("load",))

    if duration is not None and load.mode == "open" and load.rates and min(load.rates) * duration < 1:
        ctx.warn(
            "W508",
            f"at {min(load.rates):g} rps for {value_text(b.attrs['duration'].value)} a level expects fewer than one request",
            b.attrs["duration"].value.span,
        )
    if duration is not None and bucket is not None and bucket > duration + 1e-9:
        ctx.error(
            "E401",
            f"bucket ({value_text(b.attrs['bucket'].value)}) is longer than the duration ({value_text(b.attrs['duration'].value)}); a level would have no complete bucket",
            b.attrs["bucket"].value.span,
        )
    elif duration is not None and bucket is not None:
        ratio = duration / bucket
        if ratio > MAX_BUCKETS_PER_LEVEL:
            ctx.error("E204", f"bucket ({value_text(b.attrs['bucket'].value)}) cuts each level into {math.ceil(ratio - 1e-9)} buckets; at most {MAX_BUCKETS_PER_LEVEL} are allowed", b.attrs["bucket"].value.span)
        elif abs(ratio - round(ratio)) > 1e-6:
            ctx.warn("W505", "the duration is not a whole number of buckets; the last bucket of each level will be short", b.attrs["bucket"].value.span)
    if duration is None:
        return None
    return S.Workload(
        name=name,
        endpoint=endpoint,
        stream=stream,
        prompt_words=prompt_words,
        prompt_file=prompt_file,
        max_tokens=max_tokens,
        sampling=sampling,
        ignore_eos=ignore_eos,
        load=load,
        duration_s=duration,
        bucket_s=bucket if bucket is not None else duration,
        warmup_s=warmup,
        deadline_s=deadline,
        follow_up=follow_up,
        expected_latency_s=expected_latency,
        span=blk.kind_span,
    )


# ---------------------------------------------------------------- gate

SCOPES = ("run", "backend", "level", "bucket", "window")
_DIM_OF_KIND = {Kind.DURATION: Dimension.DURATION, Kind.SIZE: Dimension.SIZE, Kind.RATIO: Dimension.RATIO, Kind.RATE: Dimension.RATE}


def _gate(ctx: _Ctx, blk: A.Block | None, backend_names: set[str]) -> S.Gate:
    if blk is None:
        return S.Gate()
    b = _Body(ctx, blk, "gate")
    if blk.label is not None:
        ctx.error("E107", "'gate' takes no name", blk.label.span)
    confidence = b.quantity("confidence", Dimension.RATIO, 0.95)
    if confidence is not None and not 0.5 <= confidence < 1:
        ctx.error("E204", "'confidence' must be at least 50% and below 100%", b.attrs["confidence"].value.span)
        confidence = 0.95
    min_samples = b.integer("min_samples", 1, minimum=1)
    allow_rehearsal = b.boolean("allow_rehearsal", False)
    trace_window = b.quantity("trace_window", Dimension.DURATION, 5.0)
    rules = []
    others = []
    for stmt in b.others:
        if isinstance(stmt, A.Rule):
            r = _rule(ctx, stmt, backend_names)
            if r is not None:
                rules.append(r)
        else:
            others.append(stmt)
    b.others = others
    b.finish(["confidence", "min_samples", "allow_rehearsal", "trace_window"])
    return S.Gate(tuple(rules), confidence, min_samples, allow_rehearsal, trace_window)


def _rule(ctx: _Ctx, r: A.Rule, backend_names: set[str]) -> S.Rule | None:
    text = rule_text(r)
    ok = True
    wrapper = None
    expr = r.expr
    if isinstance(expr, A.Call) and expr.func in ("drift", "slope"):
        wrapper = expr.func
        expr = expr.arg
        if not isinstance(expr, A.Call):
            ctx.error("E305", f"{wrapper}() takes an aggregate such as {wrapper}(p95(ttft))", expr.span)
            return None
    agg = None
    percentile = None
    if isinstance(expr, A.Call):
        if not isinstance(expr.arg, A.MetricRef):
            ctx.error("E305", f"{expr.func}() takes a metric name, not another function", expr.arg.span)
            return None
        metric_node = expr.arg
        agg = expr.func
        if agg in ("drift", "slope"):
            ctx.error("E305", f"{agg}() must be the outermost function", expr.span)
            return None
        if re.fullmatch(r"p-?[0-9.]+", agg):
            percentile = parse_percentile(agg)
            if percentile is None:
                ctx.error("E304", f"percentile '{agg}' is outside (0, 100]; write p50, p95, p99 or p99.9", expr.span)
                ok = False
        elif agg not in AGGREGATES:
            ctx.error("E303", f"unknown function '{agg}'", expr.span, _suggest(agg, list(AGGREGATES) + ["drift", "slope", "p50", "p95", "p99"]))
            return None
    else:
        metric_node = expr
    metric = metric_node.name
    if metric in EVIDENCE_PREDICATES:
        kind = EVIDENCE_PREDICATES[metric]
        klass = "validity" if metric == "completed_run" else "evidence"
        if agg is not None or wrapper is not None:
            ctx.error("E305", f"'{metric}' is an evidence check, not a metric to aggregate", expr.span)
            return None
    elif metric in METRICS:
        m = METRICS[metric]
        klass = "performance"
        if agg is None:
            if not m.bare_ok:
                ctx.error("E305", f"'{metric}' is a distribution; aggregate it, e.g. p99({metric}) or mean({metric})", metric_node.span)
                return None
            agg = "count"
        elif percentile is not None or agg.startswith("p"):
            if "p" not in m.aggregates:
                ctx.error("E305", f"a percentile does not apply to '{metric}' ({m.description})", expr.span)
                return None
        elif agg not in m.aggregates:
            ctx.error("E305", f"{agg}() does not apply to '{metric}' ({m.description})", expr.span)
            return None
        kind = m.result_kind(agg)
    else:
        ctx.error("E302", f"unknown metric '{metric}'", metric_node.span, _suggest(metric, list(METRICS) + list(EVIDENCE_PREDICATES)))
        return None
    if wrapper is not None:
        kind = Kind.RATIO
        klass = "performance"

    # threshold
    threshold = None
    if r.op is None:
        if kind is not Kind.BOOL:
            ctx.error("E305", f"'{expr_text(r.expr)}' needs a comparison, e.g. {expr_text(r.expr)} <= ...", r.expr.span)
            ok = False
    else:
        if kind is Kind.BOOL:
            ctx.error("E305", f"'{metric}' is a yes/no check; write just: {r.severity} {metric}", r.threshold.span)
            ok = False
        elif kind in _DIM_OF_KIND:
            threshold = _quantity_value(ctx, expr_text(r.expr), r.threshold, _DIM_OF_KIND[kind])
            ok = ok and threshold is not None
        else:  # a plain number (count, tokens, tokens/s)
            if isinstance(r.threshold, A.Quantity):
                ctx.error("E305", f"'{expr_text(r.expr)}' is a plain number; {value_text(r.threshold)} has a unit", r.threshold.span)
                ok = False
            elif not isinstance(r.threshold, A.Num):
                ctx.error("E104", f"the threshold must be a number, not {_describe(r.threshold)}", r.threshold.span)
                ok = False
            else:
                threshold = float(r.threshold.value)
    # scope
    scope = "backend"
    window = None
    if r.scope is not None:
        scope = r.scope.kind
        if scope not in SCOPES:
            ctx.error("E306", f"unknown scope 'per {scope}' (use per run, backend, level, bucket or window <duration>)", r.scope.span, _suggest(scope, SCOPES))
            ok = False
        elif scope == "window":
            if r.scope.length is None:
                ctx.error("E103", "'per window' needs a length, e.g. per window 30s", r.scope.span)
                ok = False
            else:
                window = _quantity_value(ctx, "window", r.scope.length, Dimension.DURATION)
                ok = ok and window is not None
        elif r.scope.length is not None:
            ctx.error("E305", "only 'per window' takes a length", r.scope.length.span)
            ok = False
    elif wrapper is not None:
        scope = "level"
    if wrapper is not None and scope not in ("level", "backend"):
        ctx.error("E305", f"{wrapper}() compares buckets over time; use per level or per backend", r.scope.span if r.scope else r.span)
        ok = False
    target = None
    if r.target is not None:
        target = r.target.value
        if target not in backend_names:
            ctx.error("E301", f"rule names backend '{target}', which the spec does not declare", r.target.span, _suggest(target, backend_names))
            ok = False
    if not ok:
        return None
    return S.Rule(
        severity=r.severity,
        klass=klass,
        expr=S.Expr(metric=metric, agg=agg, percentile=percentile, wrapper=wrapper, text=expr_text(r.expr)),
        op=r.op,
        threshold=threshold,
        threshold_text=value_text(r.threshold) if r.threshold is not None else None,
        scope=scope,
        window_s=window,
        backend=target,
        text=text,
        span=r.span,
    )


def _claims(ctx: _Ctx, blk: A.Block | None) -> S.ClaimBoundary:
    if blk is None:
        return S.ClaimBoundary()
    b = _Body(ctx, blk, "claims")
    claims, excludes = [], []
    others = []
    seen: set[str] = set()
    for stmt in b.others:
        if isinstance(stmt, A.Claim):
            text = stmt.text.value.strip()
            if not text:
                ctx.error("E204", f"an empty {stmt.kind} says nothing", stmt.text.span)
                continue
            if text.lower() in seen:
                ctx.warn("W506", f"{stmt.kind} {text!r} is listed twice", stmt.text.span)
            seen.add(text.lower())
            (claims if stmt.kind == "claim" else excludes).append(text)
        else:
            others.append(stmt)
    b.others = others
    b.finish([])
    if not claims:
        ctx.warn("W507", "the claim boundary states no claim", blk.kind_span)
    return S.ClaimBoundary(tuple(claims), tuple(excludes))
