"""Redaction: secrets never reach the evidence directory, reports or progress output.

- `redact_env(env)`: variables whose *name* contains TOKEN, KEY, SECRET, PASSWORD, PASSWD,
  AUTH or CREDENTIAL (any case) become "<redacted>"; other values are scrubbed of
  credential-looking substrings (URL passwords, `hf_...`, `sk-...`, bearer tokens).
- `redact_argv(argv)`: values of secret flags (`--api-key X`, `--token=X`, `--password X`),
  header values (`-H "Authorization: Bearer X"`), `NAME=value` assignments with secret names,
  URL user:password@ parts and secret query parameters, and credential-looking values.
- `redact_text(text, secrets)`: replaces known secret values (longest first) and the same
  credential patterns; used for progress output and reports.
- `secret_values(env, argv)`: the values the two functions above removed, to pass to
  `redact_text` for anything else that might echo them (server logs shown to the user).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence

REDACTED = "<redacted>"

_SECRET_NAME = re.compile(r"TOKEN|KEY|SECRET|PASSWORD|PASSWD|AUTH|CREDENTIAL", re.IGNORECASE)

# Words that make a command-line flag secret. Matched per word, so `--max-tokens` and
# `--tokenizer` stay visible while `--api-key`, `--hf-token` and `--auth` are redacted.
_SECRET_FLAG_WORDS = frozenset(
    {"token", "key", "apikey", "secret", "password", "passwd", "pass", "auth", "authorization",
     "credential", "credentials", "bearer", "cookie"}
)

_SECRET_HEADERS = ("authorization", "proxy-authorization", "x-api-key", "api-key", "cookie",
                   "x-auth-token", "x-hf-token")

# Credential-looking values: well-known token prefixes and JWTs.
_CREDENTIAL = re.compile(
    r"""(?x)
    (?<![A-Za-z0-9])(?:
        hf_[A-Za-z0-9]{16,}
      | sk-(?:ant-|proj-)?[A-Za-z0-9_-]{16,}
      | gh[pousr]_[A-Za-z0-9]{20,}
      | github_pat_[A-Za-z0-9_]{20,}
      | glpat-[A-Za-z0-9_-]{20,}
      | xox[abprs]-[A-Za-z0-9-]{10,}
      | AKIA[0-9A-Z]{16}
      | eyJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]*
    )"""
)
_BEARER = re.compile(r"(?i)\b(bearer)(\s+)([^\s\"',;]+)")
_URL_USERINFO = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://)([^/\s@?#]+)@")
_QUERY_SECRET = re.compile(r"(?i)([?&;](?:[a-z0-9_.-]*(?:token|key|secret|password|passwd|auth|signature|sig)[a-z0-9_.-]*)=)([^&#\s]+)")
_HEADER = re.compile(r"(?i)^(\s*(?:" + "|".join(re.escape(h) for h in _SECRET_HEADERS) + r")\s*:\s*)(.*)$", re.DOTALL)
_ASSIGN = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)=(.*)$", re.DOTALL)
# Words inside one argv element that holds a whole command line (`sh -c "..."` of a shell backend).
_WORD = r"""('[^']*'|"(?:[^"\\]|\\.)*"|[^\s'";|&]+)"""
_CMD_FLAG = re.compile(r"(?<!\S)(--?[A-Za-z][A-Za-z0-9_.-]*)(=|\s+)(?!-)" + _WORD)
_CMD_ASSIGN = re.compile(r"(?<![^\s;&|(`'\"])([A-Za-z_][A-Za-z0-9_]*)=" + _WORD)
_CMD_HEADER = re.compile(r"(?i)(?<![\w-])(" + "|".join(re.escape(h) for h in _SECRET_HEADERS) + r")(\s*:\s*)([^'\"\n]+)")


def is_secret_name(name: str) -> bool:
    """Whether an environment variable (or `NAME=value`) name marks a secret."""
    return bool(_SECRET_NAME.search(name))


def _is_secret_flag(flag: str) -> bool:
    words = re.split(r"[-_.]+", flag.lstrip("-").lower())
    return any(w in _SECRET_FLAG_WORDS for w in words) or "apikey" in flag.lower().replace("-", "").replace("_", "")


def scrub(value: str) -> str:
    """Remove credential-looking substrings from a value that is not itself marked secret."""
    value = _URL_USERINFO.sub(lambda m: m.group(1) + REDACTED + "@", value)
    value = _QUERY_SECRET.sub(lambda m: m.group(1) + REDACTED, value)
    value = _BEARER.sub(lambda m: m.group(1) + m.group(2) + REDACTED, value)
    value = _CREDENTIAL.sub(REDACTED, value)
    return value


def redact_env(env: Mapping[str, str]) -> dict[str, str]:
    """A copy of `env` with secret-named variables replaced and other values scrubbed."""
    return {k: (REDACTED if is_secret_name(k) else scrub(str(v))) for k, v in env.items()}


def _redact_arg(arg: str) -> str:
    m = _HEADER.match(arg)
    if m:
        return m.group(1) + REDACTED
    m = _ASSIGN.match(arg)
    if m and is_secret_name(m.group(1)):
        return f"{m.group(1)}={REDACTED}"
    return scrub(_redact_command(arg) if any(c.isspace() for c in arg) else arg)


def _command_secrets(cmd: str) -> list[tuple[int, int]]:
    """Spans of secret values inside a command line: `--api-key X`, `NAME_TOKEN=X`, `Authorization: X`."""
    spans = [m.span(3) for m in _CMD_HEADER.finditer(cmd)]
    spans += [m.span(3) for m in _CMD_FLAG.finditer(cmd) if _is_secret_flag(m.group(1))]
    spans += [m.span(2) for m in _CMD_ASSIGN.finditer(cmd) if is_secret_name(m.group(1))]
    return spans


def _redact_command(cmd: str) -> str:
    for start, end in sorted(_merge(_command_secrets(cmd)), reverse=True):
        cmd = cmd[:start] + REDACTED + cmd[end:]
    return cmd


def _merge(spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for s, e in sorted(spans):
        if out and s <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], e))
        else:
            out.append((s, e))
    return out


def redact_argv(argv: Sequence[str]) -> list[str]:
    """A copy of `argv` with secret values replaced by "<redacted>" (see the module docstring)."""
    out: list[str] = []
    hide_next = False
    for arg in argv:
        arg = str(arg)
        if hide_next:
            hide_next = False
            if not arg.startswith("--"):
                out.append(REDACTED)
                continue
        if arg.startswith("-") and len(arg) > 1 and not arg.startswith("---"):
            flag, eq, value = arg.partition("=")
            if _is_secret_flag(flag):
                if eq:
                    out.append(f"{flag}={REDACTED}")
                else:  # its value follows, unless the flag is a switch (`--no-auth --port 1`)
                    hide_next = True
                    out.append(arg)
                continue
            if eq:
                out.append(f"{flag}={_redact_arg(value)}")
                continue
        out.append(_redact_arg(arg))
    return out


def secret_values(env: Mapping[str, str] | None = None, argv: Sequence[str] | None = None) -> set[str]:
    """The values `redact_env` / `redact_argv` would hide, for `redact_text`."""
    found: set[str] = set()
    for k, v in (env or {}).items():
        if v and is_secret_name(k):
            found.add(str(v))
    args = [str(a) for a in (argv or [])]
    for i, arg in enumerate(args):
        if arg.startswith("-") and len(arg) > 1:
            flag, eq, value = arg.partition("=")
            if _is_secret_flag(flag):
                if eq and value:
                    found.add(value)
                elif not eq and i + 1 < len(args) and args[i + 1] and not args[i + 1].startswith("--"):
                    found.add(args[i + 1])
                continue
            arg = value if eq else arg
        m = _HEADER.match(arg)
        if m and m.group(2).strip():
            found.add(m.group(2).strip())
            parts = m.group(2).split(None, 1)
            if len(parts) == 2:
                found.add(parts[1].strip())
        m = _ASSIGN.match(arg)
        if m and is_secret_name(m.group(1)) and m.group(2):
            found.add(m.group(2))
        if any(c.isspace() for c in arg):
            for s, e in _command_secrets(arg):
                value = arg[s:e].strip("'\"")
                found.add(value)
                found.update(value.split(None, 1)[1:])  # `Bearer X`: X alone too
    for text in [*(str(v) for v in (env or {}).values()), *args]:
        found.update(m.group(0) for m in _CREDENTIAL.finditer(text))
    return {s for s in found if s}


def redact_text(text: str, secrets: Iterable[str] = ()) -> str:
    """`text` with every known secret value (longest first) and credential-looking substring
    replaced by "<redacted>"."""
    for s in sorted({s for s in secrets if s}, key=len, reverse=True):
        text = text.replace(s, REDACTED)
    return scrub(text)
