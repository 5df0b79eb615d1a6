"""`backend "name" { ... }`: how a server is launched (or reached), probed, traced and bounded."""

from __future__ import annotations

import re
import string as _string

from soakspec.diagnostics import Span
from soakspec.lang import ast as A
from soakspec.lang import simtrace
from soakspec.lang import spec as S
from soakspec.lang.check.core import Ctx, Key, Table, closest, describe
from soakspec.lang.check.walk import Body, sub, walk
from soakspec.lang.fmt import value_text
from soakspec.lang.runtime_label import is_generic_label, label_versions, unversioned_runtimes, validate_log_regex
from soakspec.lang.simoptions import SIM_OPTIONS
from soakspec.units import Dimension

PLACEHOLDERS = {"port", "host", "url", "model_path", "model_id", "model_revision", "backend"}
MAX_GPU_INDEX = 1023  # a device index (CUDA_VISIBLE_DEVICES); no host has more accelerators
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_URL = re.compile(r"(https?)://([^/\s:]+|\[[0-9a-fA-F:]+\])(:\d{1,5})?(/[^\s]*)?")
# The password of a URL's userinfo (`scheme://user:PASSWORD@`), and the value of a query
# parameter named like a secret (`?api_key=VALUE`): what a message quoting a URL must not repeat.
_URL_PASSWORD = re.compile(r"(?i)([a-z][a-z0-9+.-]*://[^/\s@?#:]*:)[^/\s]*@")  # up to the last '@' before a '/'
_URL_QUERY_SECRET = re.compile(r"(?i)([?&;][a-z0-9_.-]*(?:token|key|secret|password|passwd|auth|signature|sig)[a-z0-9_.-]*=)([^&#\s]+)")


def _shown_url(url: str) -> str:
    """A URL as a diagnostic may quote it: its password and secret-named query values are `***`
    (`http://user:***@host`). The spec's own line, quoted under the message, is the user's file."""
    url = _URL_PASSWORD.sub(lambda m: m.group(1) + "***@", url)
    return _URL_QUERY_SECRET.sub(lambda m: m.group(1) + "***", url)


BACKEND = Table(
    cls=S.Backend,
    keys=(
        Key("launch", "strings", "argv"),
        Key("shell", "str", "shell"),
        Key("url", "str", "url"),
        Key("cwd", "str", "cwd"),
        Key("shutdown_grace", "quantity", "shutdown_grace_s", Dimension.DURATION),
        Key("gpus", "ints", "gpus", minimum=0, maximum=MAX_GPU_INDEX, why="'gpus' lists device indices (0, 1, ...), not a count"),
        Key("log", "bool", "capture_log"),
        Key("api_key_env", "str", "api_key_env"),
        Key("log_file", "str", "log_file"),  # url: the running server's log file (spec-relative)
    ),
    blocks=("sim", "env", "ready", "runtime", "traces", "metrics"),
)
BACKEND_KEYS = tuple(k.name for k in BACKEND.keys)
BACKEND_BLOCKS = BACKEND.blocks

READY = Table(
    cls=S.Ready,
    keys=(
        Key("method", "word", "method", choices=("GET", "POST", "HEAD")),
        Key("path", "str", "path"),
        Key("status", "int", "status", minimum=100, maximum=599),
        Key("timeout", "quantity", "timeout_s", Dimension.DURATION),
        Key("interval", "quantity", "interval_s", Dimension.DURATION),
    ),
)

METRICS = Table(
    cls=S.ServerMetrics,
    keys=(
        Key("path", "str", "path"),
        Key("every", "quantity", "interval_s", Dimension.DURATION),
        Key("timeout", "quantity", "timeout_s", Dimension.DURATION),
        Key("enabled", "bool", "enabled"),
    ),
)

RUNTIME = Table(
    cls=S.RuntimeDecl,
    keys=(
        Key("label", "str", "label", required=True),
        Key("log_pattern", "str", "log_pattern"),
        Key("version", "str", "version"),
        Key("require_env", "strings", "require_env"),
    ),
)

TRACES = Table(
    cls=S.Traces,
    keys=(
        Key("source", "word", "source", choices=("none", "log", "jsonl")),
        Key("pattern", "str", "pattern"),
        Key("file", "str", "file"),
        Key("id_field", "str", "id_field"),
        Key("id_forms", "strings", "id_forms"),
    ),
)

ENV = Table(keys=())

# The simulator's options, from its own table: kind -> how the checker reads the value.
_SIM_KEY = {
    "duration": dict(type="quantity", unit=Dimension.DURATION, allow_zero=True),
    "ratio": dict(type="quantity", unit=Dimension.RATIO, allow_zero=True),
    "size": dict(type="quantity", unit=Dimension.SIZE, allow_zero=True),
    "int": dict(type="int", minimum=0, maximum=10**9, why="the simulator's counts are at most 1,000,000,000"),
    "float": dict(type="number", maximum=1e9),
    "bool": dict(type="bool", default=False),
    "str": dict(type="str"),
}
# Where an option's range is narrower than its kind's, as the simulator itself refuses at start
# (soakspec.sim.config): caught here, by `check`, before anything is launched.
_SIM_RANGE = {
    "slots": dict(minimum=1), "max_model_len": dict(minimum=1), "default_max_tokens": dict(minimum=1),
    "tokens_per_chunk": dict(minimum=1),
    "block_size": dict(minimum=1, low="a block holds at least one token (vLLM's default: 16); to run without a prefix "
                                     "cache, set enable_prefix_caching = false"),
    "prefix_cache_blocks": dict(minimum=1, low="the cache holds at least one block (the default: 32768); to run without "
                                              "a prefix cache, set enable_prefix_caching = false"),
    "seed": dict(maximum=2**63 - 1, why="a seed is at most 9,223,372,036,854,775,807 (2^63 - 1)"),
    **{name: dict(maximum=1.0, why="a probability or a fraction: at most 100%")
       for name, kind in SIM_OPTIONS.items() if kind == "ratio" and name != "drift"},  # drift: growth per minute, may pass 100%
}  # fmt: skip
SIM = Table(keys=tuple(Key(name, field=name, **{**_SIM_KEY[kind], **_SIM_RANGE.get(name, {})})
                       for name, kind in sorted(SIM_OPTIONS.items())))  # fmt: skip


def backend(ctx: Ctx, blk: A.Block) -> S.Backend | None:
    where = f"backend '{blk.label.value}'"
    b = walk(ctx, blk, BACKEND, where)
    kind = _kind(ctx, b, where)
    _check_launch(ctx, b, kind, where)
    env = _env(ctx, b, where)
    has_log = _check_log_file(ctx, b, kind, where)
    runtime = _runtime(ctx, b, kind, where, {k for k, _ in env}, has_log)
    traces = _traces(ctx, b, kind, blk.kind_span, has_log)
    _check_log(ctx, b, kind, traces, runtime, where)
    if b["api_key_env"] is not None and not _ENV_NAME.fullmatch(b["api_key_env"]):
        ctx.error("E411", "'api_key_env' names an environment variable (the key itself is never written in a spec)", b.got("api_key_env").span)
    if kind == "url" and (b.has("cwd") or "env" in b.blocks or b["gpus"]):
        ctx.warn("W503", f"{where} is an already-running server (url); cwd, env and gpus are ignored", blk.kind_span)
    return S.Backend(
        name=blk.label.value,
        kind=kind,
        sim=_sim(ctx, b, where),
        env=env,
        ready=_ready(ctx, b, where),
        runtime=runtime,
        traces=traces,
        metrics=_metrics(ctx, b, where),
        span=blk.kind_span,
        **b.fields(),
    )


def _kind(ctx: Ctx, b: Body, where: str) -> str:
    """launch, shell, url or sim: exactly one."""
    kinds = [k for k in ("launch", "shell", "url") if b.has(k)] + (["sim"] if "sim" in b.blocks else [])
    if not kinds and not b.suggested & {"launch", "shell", "url", "sim"}:  # else reported as misspelled
        ctx.error("E103", f"{where} needs one of: launch = [argv...], shell = \"command\", url = \"http://...\", or a sim {{}} block", b.span)
    elif len(kinds) > 1:
        second = b.got(kinds[1]).key_span if b.has(kinds[1]) else b.blocks["sim"].kind_span
        ctx.error("E403", f"{where} sets both '{kinds[0]}' and '{kinds[1]}'; a backend is launched one way", second)
    return kinds[0] if kinds else "url"


def _check_launch(ctx: Ctx, b: Body, kind: str, where: str) -> None:
    if b.ok("launch") and not b["launch"]:
        ctx.error("E205", "'launch' needs at least the program to run", b.got("launch").span)
    if b.ok("url") and not _URL.fullmatch(b["url"]):
        url = b["url"]
        hint = None
        if _URL_PASSWORD.match(url):
            hint = ("a URL carries no credentials: name the variable that holds the key with api_key_env = \"MY_ENV_VAR\" "
                    "(or a workload's header_env), and write the URL without them")
        ctx.error("E406", f"'url' must be an http(s) URL like http://127.0.0.1:8000, not {_shown_url(url)!r}", b.got("url").span, hint)
    for key in ("launch", "shell"):
        if not b.ok(key):
            continue
        node = b.got(key).node
        for item in node.items if isinstance(node, A.List) else (node,):
            _check_placeholders(ctx, item.value, item.span)
    if kind in ("launch", "shell"):
        texts = b["launch"] or ((b["shell"],) if b["shell"] else ())
        if not any("{port}" in t for t in texts):
            ctx.warn("W501", f"{where} never uses '{{port}}'; soakspec cannot tell the server which port to listen on", b.span)


def _check_placeholders(ctx: Ctx, text: str, span: Span) -> None:
    try:
        fields = [f for _, f, _, _ in _string.Formatter().parse(text) if f is not None]
    except ValueError:
        fields = ["<unbalanced brace>"]
    for field in fields:
        if field not in PLACEHOLDERS:
            known = ", ".join("{" + p + "}" for p in sorted(PLACEHOLDERS))
            near = closest(field, PLACEHOLDERS) if field != "<unbalanced brace>" else None
            hint = f"did you mean '{{{near}}}'?" if near else "write '{{' and '}}' for literal braces"
            ctx.error("E404", f"unknown placeholder '{{{field}}}' (known: {known})", span, hint)


def _env(ctx: Ctx, b: Body, where: str) -> tuple[tuple[str, str], ...]:
    eb = sub(ctx, b, "env", ENV, f"the env of {where}", free=True)
    if eb is None:
        return ()
    env = []
    for key, attr in eb.extra.items():
        if not _ENV_NAME.fullmatch(key):
            ctx.error("E411", f"'{key}' is not a valid environment variable name", attr.key_span)
        if isinstance(attr.value, A.Str):
            env.append((key, attr.value.value))
        elif isinstance(attr.value, (A.Num, A.Bool)):
            env.append((key, value_text(attr.value)))
        else:
            ctx.error("E104", f"env value '{key}' must be a string, not {describe(attr.value)}", attr.value.span)
    return tuple(env)


def _sim(ctx: Ctx, b: Body, where: str) -> tuple[tuple[str, object], ...]:
    sb = sub(ctx, b, "sim", SIM, f"the sim block of {where}")
    if sb is None:
        return ()
    for key in sorted(sb.values):
        v = sb[key] if sb.ok(key) and SIM_OPTIONS[key] == "str" else None
        if v == "--" or (isinstance(v, (list, tuple)) and "--" in v):  # (soakspec.sim.config refuses it at launch)
            ctx.error("E204", f"sim '{key}' cannot be \"--\": the simulator's command line reads it as the end of its options",
                      sb.got(key).span, "choose another name")
    return tuple((key, sb[key]) for key in sorted(sb.values) if sb.ok(key))


def _ready(ctx: Ctx, b: Body, where: str) -> S.Ready:
    rb = sub(ctx, b, "ready", READY, f"the ready probe of {where}")
    if rb is None:
        return S.Ready()
    if rb.ok("path") and not rb["path"].startswith("/"):
        ctx.error("E408", "ready 'path' must start with '/'", rb.got("path").span)
    return S.Ready(**rb.fields())


MIN_SCRAPE_INTERVAL_S = 0.1


def _metrics(ctx: Ctx, b: Body, where: str) -> S.ServerMetrics:
    """`metrics { path  every  timeout  enabled }`; absent: the default scrape (not declared)."""
    mb = sub(ctx, b, "metrics", METRICS, f"the metrics endpoint of {where}")
    if mb is None:
        return S.ServerMetrics()
    if mb.ok("path") and not mb["path"].startswith("/"):
        ctx.error("E408", "metrics 'path' must start with '/'", mb.got("path").span)
    if mb.ok("every") and mb["every"] < MIN_SCRAPE_INTERVAL_S:
        ctx.error("E204", f"metrics 'every' must be at least {MIN_SCRAPE_INTERVAL_S:g}s", mb.got("every").span)
    fields = mb.fields()
    return S.ServerMetrics(**fields, declared=bool(fields.get("enabled", True)))


def _check_log_file(ctx: Ctx, b: Body, kind: str, where: str) -> bool:
    """`log_file`: the log of a url backend (read from its offset at run start). True when the
    backend has a server log soakspec can read: a url backend with `log_file`."""
    if not b.ok("log_file"):
        return False
    if kind != "url":
        ctx.error("E403", f"{where} is launched by soakspec, which captures its log: 'log_file' is for a url backend's log",
                  b.got("log_file").key_span, "remove log_file")
        return False
    if not b["log_file"].strip():
        ctx.error("E205", "'log_file' needs the path of the server's log file", b.got("log_file").span)
        return False
    return True


def _runtime(ctx: Ctx, b: Body, kind: str, where: str, env_names: set[str], has_log: bool = False) -> S.RuntimeDecl | None:
    rt = sub(ctx, b, "runtime", RUNTIME, f"the runtime boundary of {where}")
    if rt is None:
        return None
    label, pattern = rt["label"], rt["log_pattern"]
    if label is not None and is_generic_label(label):
        ctx.error(
            "E402",
            f"runtime boundary {label!r} is generic; name the runtime and its version or mode (e.g. \"NCCL 2.26.2, NCCL_IB_DISABLE=1\" or \"host-staged\")",
            rt.got("label").span,
        )
    elif label is not None:
        _check_label_version(ctx, rt, label)
    if pattern is not None and kind == "url" and not has_log:
        ctx.error(
            "E413",
            f"{where} is an already-running server (url): soakspec has no log of it, so 'log_pattern' can never confirm the runtime",
            rt.got("log_pattern").key_span,
            "name the server's log with log_file = \"...\", or remove log_pattern (and version); the label alone then states the runtime",
        )
    elif pattern is not None and (problem := validate_log_regex(pattern)) is not None:
        ctx.error("E405", f"runtime log_pattern: {problem}", rt.got("log_pattern").span)
    if rt["version"] is not None and pattern is None and kind == "url" and not has_log:
        ctx.error(
            "E413",
            f"{where} is an already-running server (url): soakspec has no log of it to confirm 'version' from",
            rt.got("version").key_span,
            "remove 'version' and state the version in the label",
        )
    elif rt["version"] is not None and pattern is None:
        ctx.error("E403", "runtime 'version' is confirmed from the log: add log_pattern = r\"... (\\d+\\.\\d+\\.\\d+)\"", rt.got("version").key_span)
    if kind == "url" and rt["require_env"]:
        ctx.error(
            "E412",
            f"{where} is an already-running server (url): its environment is not soakspec's to see, so 'require_env' can never be confirmed",
            rt.got("require_env").span,
            "remove require_env, and name the mode in the label instead (e.g. \"NCCL 2.26.2, NCCL_IB_DISABLE=1\")",
        )
        return S.RuntimeDecl(**rt.fields()) if label is not None else None
    unset = [n for n in rt["require_env"] if n not in env_names]
    if unset:
        names = ", ".join(f"'{n}'" for n in unset)
        what, it = (f"env {names}", "it") if len(unset) == 1 else (f"{len(unset)} env variables ({names})", "they")
        ctx.warn(
            "W502",
            f"runtime requires {what} that this backend's env block does not set ({it} must then come from the caller's environment)",
            rt.got("require_env").span,
        )
    return S.RuntimeDecl(**rt.fields()) if label is not None else None


def _check_label_version(ctx: Ctx, rt: Body, label: str) -> None:
    """A label that names a versioned runtime states its version (major.minor at least), and
    that version is the block's `version` when both are given."""
    missing = unversioned_runtimes(label)
    if missing:
        names = " and ".join(missing)
        ctx.error(
            "E416",
            f"runtime label {label!r} names {names} without a concrete version (at least major.minor, e.g. 2.26 or 2.26.2)",
            rt.got("label").span,
            f"write the version the server runs, e.g. \"{missing[0]} 2.26.2\"; a mode without a runtime name (\"host-staged\") needs none",
        )
        return
    versions = label_versions(label)
    version = rt["version"]
    if version is not None and versions and version.strip().lower().removeprefix("v") not in versions:
        stated = ", ".join(versions)
        ctx.error(
            "E417",
            f"runtime 'version' is {version!r} but the label states {stated}",
            rt.got("version").span,
            "make the label and 'version' name the same version",
        )


def _traces(ctx: Ctx, b: Body, kind: str, span: Span, has_log: bool = False) -> S.Traces:
    tb = sub(ctx, b, "traces", TRACES, f"the traces of {b.where}")
    if tb is None:
        if kind == "sim":
            return S.Traces(source="log", pattern=simtrace.TRACE_PATTERN, id_forms=simtrace.ID_FORMS)
        return S.Traces()
    src = tb["source"]
    if src == "log" and tb["pattern"] is None:
        ctx.error("E103", "traces from the log need a 'pattern' with a (?P<json>...) or (?P<id>...) group", tb.span)
    if src == "jsonl" and tb["file"] is None:
        ctx.error("E103", "traces from a JSONL file need 'file'", tb.span)
    if src == "jsonl" and tb.has("pattern"):
        ctx.error(
            "E415",
            "JSONL traces are read by field name, not with a regular expression: 'pattern' would be ignored",
            tb.got("pattern").key_span,
            "remove 'pattern'; name the request id field with id_field = \"request_id\"",
        )
    elif tb["pattern"] is not None:
        _check_trace_pattern(ctx, tb["pattern"], tb.got("pattern").span)
    for f in tb["id_forms"]:
        if "{id}" not in f:
            ctx.error("E410", f"id form {f!r} must contain '{{id}}'", tb.got("id_forms").span)
    if kind == "url" and src == "log" and not has_log:
        ctx.error(
            "E413",
            f"{b.where} is an already-running server (url): soakspec has no log of it to read traces from",
            tb.got("source").span,
            "name the server's log with log_file = \"...\", or use source = jsonl and file = \"...\" (the server's trace file)",
        )
    return S.Traces(**tb.fields())


def _check_trace_pattern(ctx: Ctx, pattern: str, span: Span) -> None:
    try:
        rx = re.compile(pattern)
    except re.error as e:
        ctx.error("E405", f"invalid regular expression: {e}", span)
        return
    if not ({"json", "id"} & set(rx.groupindex)):
        ctx.error("E405", "trace 'pattern' needs a named group (?P<json>...) for a JSON payload or (?P<id>...) for a request id", span)


def _check_log(ctx: Ctx, b: Body, kind: str, traces: S.Traces, runtime: S.RuntimeDecl | None, where: str) -> None:
    """What is read from the server log needs one: a launched backend that captures it. (A url
    backend has none: its log_pattern and log traces are reported by `_runtime` and `_traces`.)"""
    pattern = runtime is not None and runtime.log_pattern is not None
    if kind == "url" or b["log"] or not (traces.source == "log" or pattern):
        return
    what = "traces" if traces.source == "log" else "runtime boundary"
    ctx.error("E413", f"{where} sets log = false, but reads its {what} from the server log", b.got("log").span, "remove log = false, or stop reading the log")
