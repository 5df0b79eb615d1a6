"""Redaction: secrets never reach the evidence directory, reports or progress output.

- `redact_env(env, secrets)`: variables whose *name* contains TOKEN, KEY, SECRET, PASSWORD, PASSWD,
  AUTH or CREDENTIAL (any case) become "<redacted>"; other values are scrubbed of
  credential-looking substrings (URL passwords, `hf_...`, `sk-...`, bearer tokens, a `Basic`
  credential that decodes to `user:password`).
- `redact_argv(argv, secrets)`: values of secret flags (`--api-key X`, `--token=X`, `--password X`),
  header values (`-H "Authorization: Bearer X"`), `NAME=value` assignments with secret names,
  URL user:password@ parts and secret query parameters, and credential-looking values.
  Both also replace the run's known secret values (`secrets`) wherever else they appear.
- `redact_text(text, secrets)`: replaces known secret values (longest first) and the same
  credential patterns; used for progress output and reports.
- `secret_values(env, argv)`: the values the two functions above removed, to pass to
  `redact_text` for anything else that might echo them (server logs shown to the user).
- `inherited_secret_values(environ, overridden)`: the values of secret-named variables a
  launched server inherits from soakspec's own environment, secrets of the run as well.
- `Redactor`, `use_secrets(secrets)`, `record_redactor()`: the server's text a request record
  quotes (error bodies and events, finish_reason, the response id) is redacted of the run's
  secrets and the credential patterns when the record is frozen -- the one place every record
  passes before it is written (requests.jsonl.gz, the manifest's pre-flight and follow-up).
  A secret is found however the server wrote it: JSON-escaped (any character as `\\uXXXX`),
  percent-encoded, broken across two lines; and of a `Bearer X` value, X alone too.
- `is_secret_label(name)`: a Prometheus label whose name marks its value secret (`api_key`,
  `token`); the scrape writes such a value, and one the run's redactor finds a secret in, as a
  pseudonym (`runner/scrape.py`).
"""

from __future__ import annotations

import base64
import contextlib
import contextvars
import json
import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence

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
# `Basic <base64 of user:password>`: redacted when it decodes to a `user:password` (so the word
# "basic" in a sentence keeps the word after it).
_BASIC = re.compile(r"(?i)\b(basic)(\s+)([A-Za-z0-9+/]{4,}={0,2})(?![A-Za-z0-9+/=])")
_URL_USERINFO = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://)([^/\s@?#]+)@")
# A value ends where the URL does in the text around it: at a quote (a path in the spec text's
# string), a backslash (its JSON-escaped form), an angle bracket, or punctuation that ends the
# URL (`GET http://h/p?token=X: ConnectError`).
_QUERY_SECRET = re.compile(r"(?i)([?&;](?:[a-z0-9_.-]*(?:token|key|secret|password|passwd|auth|signature|sig)[a-z0-9_.-]*)=)"
                           r"([^&#\s\"'<>\\]+?)(?=[:,.;)\]]*(?:[&#\s\"'<>\\]|$))")
_HEADER = re.compile(r"(?i)^(\s*(?:" + "|".join(re.escape(h) for h in _SECRET_HEADERS) + r")\s*:\s*)(.*)$", re.DOTALL)
# An Authorization header's value: its scheme, then the credential a server may quote alone.
_SCHEME_VALUE = re.compile(r"(?i)\s*(?:bearer|basic|token|digest|apikey|api-key)\s+(\S+)\s*$")
_ASSIGN = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)=(.*)$", re.DOTALL)
# Words inside one argv element that holds a whole command line (`sh -c "..."` of a shell backend).
_WORD = r"""('[^']*'|"(?:[^"\\]|\\.)*"|[^\s'";|&]+)"""
_CMD_FLAG = re.compile(r"(?<!\S)(--?[A-Za-z][A-Za-z0-9_.-]*)(=|\s+)(?!-)" + _WORD)
_CMD_ASSIGN = re.compile(r"(?<![^\s;&|(`'\"])([A-Za-z_][A-Za-z0-9_]*)=" + _WORD)
_CMD_HEADER = re.compile(r"(?i)(?<![\w-])(" + "|".join(re.escape(h) for h in _SECRET_HEADERS) + r")(\s*:\s*)([^'\"\n]+)")


def is_secret_name(name: str) -> bool:
    """Whether an environment variable (or `NAME=value`) name marks a secret."""
    return bool(_SECRET_NAME.search(name))


def is_secret_label(name: str) -> bool:
    """Whether a Prometheus label's name marks its value secret (`api_key`, `token`,
    `auth`, `password`): by its words, as a flag's, so `max_tokens` or `keyspace` is none."""
    return _is_secret_flag(name)


def _is_secret_flag(flag: str) -> bool:
    words = re.split(r"[-_.]+", flag.lstrip("-").lower())
    return any(w in _SECRET_FLAG_WORDS for w in words) or "apikey" in flag.lower().replace("-", "").replace("_", "")


def scrub(value: str) -> str:
    """Remove credential-looking substrings from a value that is not itself marked secret."""
    value = _URL_USERINFO.sub(lambda m: m.group(1) + REDACTED + "@", value)
    value = _QUERY_SECRET.sub(lambda m: m.group(1) + REDACTED, value)
    value = _BEARER.sub(lambda m: m.group(1) + m.group(2) + REDACTED, value)
    value = _BASIC.sub(lambda m: m.group(1) + m.group(2) + REDACTED if _is_basic_credential(m.group(3)) else m.group(0), value)
    value = _CREDENTIAL.sub(REDACTED, value)
    return value


def _is_basic_credential(text: str) -> bool:
    try:
        return b":" in base64.b64decode(text + "=" * (-len(text) % 4), validate=True)
    except ValueError:
        return False


def redact_env(env: Mapping[str, str], secrets: Iterable[str] = ()) -> dict[str, str]:
    """A copy of `env` with secret-named variables replaced and other values scrubbed of
    credential patterns and of the run's `secrets` (a secret quoted in another variable)."""
    known = _known(secrets)
    return {k: (REDACTED if is_secret_name(k) else scrub(_replace(str(v), known))) for k, v in env.items()}


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


def redact_argv(argv: Sequence[str], secrets: Iterable[str] = ()) -> list[str]:
    """A copy of `argv` with secret values replaced by "<redacted>" (see the module docstring),
    and the run's `secrets` wherever else they appear (a token given as a plain argument)."""
    known = _known(secrets)
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
    return [_replace(a, known) for a in out] if known else out


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


# A secret-named variable's value that is no credential: a switch or a count
# (`TOKENIZERS_PARALLELISM=false`, `MAX_TOTAL_TOKENS=4096`).
_NOT_CREDENTIAL = re.compile(r"(?i)true|false|yes|no|on|off|none|null|[0-9]{1,7}")
# An inherited variable whose name holds a secret word only inside another (GIT_AUTHOR_NAME's
# AUTHOR) or that names a socket (SSH_AUTH_SOCK): its value is no credential, and a common one
# (a name, "soakspec") replaced wherever it occurs garbles what soakspec writes.
_NOT_CREDENTIAL_NAME = re.compile(r"(?i)AUTHOR|AUTH_SOCK")


def inherited_secret_values(environ: Mapping[str, str], overridden: Iterable[str] = ()) -> set[str]:
    """The secret values a launched server inherits from soakspec's own environment `environ`:
    those of its secret-named variables that the spec's env does not override (`overridden`),
    of at least MIN_SECRET_CHARS and not a switch, a count or a path (`HF_TOKEN_PATH`), nor
    named as no credential is (`_NOT_CREDENTIAL_NAME`). Only the values, for `redact_text` /
    `Redactor`: nothing records them, nor which variable held them."""
    skip = set(overridden)
    return {str(v) for k, v in environ.items()
            if k not in skip and is_secret_name(k) and not _NOT_CREDENTIAL_NAME.search(k) and v
            and len(str(v)) >= MIN_SECRET_CHARS and not _NOT_CREDENTIAL.fullmatch(str(v))
            and not str(v).startswith(("/", "~"))}  # fmt: skip


def redact_text(text: str, secrets: Iterable[str] = ()) -> str:
    """`text` with every known secret value (longest first) and credential-looking substring
    replaced by "<redacted>"."""
    return scrub(_replace(text, sorted({s for s in secrets if s}, key=len, reverse=True)))


_SPEC_ASSIGN = re.compile(r'\b([A-Za-z_][A-Za-z0-9_.-]*)(\s*=\s*)"((?:[^"\\\n]|\\.)*)"')


def redact_spec_text(text: str, secrets: Iterable[str] = ()) -> str:
    """A spec's text as the evidence stores it: `redact_text` with the secrets a `Redactor`
    keeps (at least MIN_SECRET_CHARS), and a shorter one only where a secret-named key is
    given it (`USE_AUTH = "1"`). Replacing every "1" of the text made the stored spec
    unreadable (`concurrency = [<redacted>6]`), so `gate` and `report` refused the evidence."""
    values = {str(v) for v in secrets if v}
    short = {v for v in values if len(v) < MIN_SECRET_CHARS}
    out = redact_text(text, values - short)
    if not short:
        return out

    def one(m: re.Match[str]) -> str:
        if m.group(3) in short and is_secret_name(m.group(1)):
            return f'{m.group(1)}{m.group(2)}"{REDACTED}"'
        return m.group(0)

    return _SPEC_ASSIGN.sub(one, out)


def _known(secrets: Iterable[str]) -> list[str]:
    """The run's secrets to look for in a value (longest first): those a `Redactor` keeps, so
    `USE_AUTH=1` does not turn every "1" of an argv into "<redacted>"."""
    return sorted({str(s) for s in secrets if s and len(str(s)) >= MIN_SECRET_CHARS}, key=len, reverse=True)


def _replace(text: str, known: Sequence[str]) -> str:
    for s in known:
        text = text.replace(s, REDACTED)
    return text


# ------------------------------------------------------------------------------ the server's text in records

# A known secret value shorter than this is no credential (`USE_AUTH=1`, `NUM_TOKENS=64`), and
# replacing it would garble every message that holds those characters (progress output keeps
# the same rule). In an identifier (a response id) a value must be longer still: a short one
# (`MAX_TOTAL_TOKENS=4096`) turns up in random ids by chance, and a redacted id no longer
# matches its trace.
MIN_SECRET_CHARS = 4
MIN_ID_SECRET_CHARS = 8

# Where each `scrub` pattern can match: a text without any of these has no credential pattern
# (`_CREDENTIAL`'s prefixes, `_BEARER`, `_BASIC`, `_URL_USERINFO`'s "://", `_QUERY_SECRET`'s "=").
_ANCHORS = r"hf_|sk-|gh[pousr]_|github_pat_|glpat-|xox[abprs]-|AKIA|eyJ|(?i:bearer)|(?i:basic)|://|="


class Redactor:
    """`redact_text` with one run's secrets fixed once, for the server's text that a request
    record quotes (`RequestRecord.freeze`): every record, so a text holding no secret and no
    credential pattern costs one regex search.

    Besides each value as given, its JSON-escaped form is redacted (a secret inside a JSON
    error body, as the server wrote it). `text` (free text: an error message) also redacts a
    secret cut off at the text's end (a message kept to ERROR_LIMIT characters, a body read to
    its first bytes): a trailing prefix of a secret of at least MIN_SECRET_CHARS. `ident`
    (the response id, finish_reason) uses the secrets of at least MIN_ID_SECRET_CHARS."""

    __slots__ = ("source", "secrets", "_hit", "_id_secrets", "_id_hit", "_encoded", "_log_hit", "_log_keyed")

    def __init__(self, secrets: Iterable[str] = ()) -> None:
        given = {str(s) for s in secrets if s}
        # a header value `Bearer X` (header_env, a spec's env): the server quotes X alone too
        given.update([m.group(1) for s in given if (m := _SCHEME_VALUE.match(s))])
        self.source = tuple(sorted({s for s in given if len(s) >= MIN_SECRET_CHARS}))
        forms = set(self.source)
        forms.update(json.dumps(s)[1:-1] for s in self.source)
        self.secrets = tuple(sorted(forms, key=len, reverse=True))
        self._id_secrets = tuple(s for s in self.secrets if len(s) >= MIN_ID_SECRET_CHARS)
        longest = sorted(self.source, key=len, reverse=True)
        # each secret however the server encoded it (see `_encoded`), and broken across lines
        self._encoded = re.compile("|".join(_encoded(s, lines=True) for s in longest)) if longest else None
        self._hit = self._pattern([_encoded(s, lines=True) for s in longest])
        self._id_hit = self._pattern([re.escape(s) for s in self._id_secrets])
        logged = [s for s in longest if len(s) >= MIN_ID_SECRET_CHARS]
        self._log_hit = re.compile("|".join(_encoded(s) for s in logged)) if logged else None
        short = [s for s in longest if len(s) < MIN_ID_SECRET_CHARS]
        self._log_keyed = re.compile(_LOG_KEYED.format(values="|".join(map(re.escape, short)))) if short else None

    @staticmethod
    def _pattern(secrets: Sequence[str]) -> re.Pattern[str]:
        return re.compile("|".join([*secrets, _ANCHORS]))

    def text(self, text: str) -> str:
        """Free text (an error message): every secret, credential pattern and cut-off secret.
        A secret is found in any of the forms a server writes it in (`_encoded`): JSON's
        `\\u0073k-...`, a URL's `p%40ss`, or broken by a line end (a wrapped log line), whose
        pieces are each replaced (the text keeps its lines)."""
        if self._hit.search(text) is not None:
            text = redact_text(text, self.secrets)
            if self._encoded is not None:
                text = self._encoded.sub(_redact_pieces, text)
        for s in self.source:
            text = _cut_secret(text, s)
        return text

    def log_mask(self) -> Callable[[bytes], bytes] | None:
        """What the server's own log goes through on its way into server.log.gz
        (`evidence/serverlog.py`): a line with each of the run's secrets of MIN_ID_SECRET_CHARS
        or more (in any form `_encoded` finds) overwritten by as many `*` bytes as it took, so
        that every byte offset into the log (a trace row's, the cut's record) is unchanged.
        A shorter secret (MIN_SECRET_CHARS to MIN_ID_SECRET_CHARS - 1) is masked where the log
        gives it to a secret-named key or flag (`_LOG_KEYED`: `API_KEY=abc123`, `--api-key
        abc123`, `"token": "abc123"`, and vLLM's `non-default args: {'api_key': ['abc123']}`,
        printed at start-up until vllm-project/vllm#52523),
        and left elsewhere: masking a short word wherever it occurs could cut a request id out
        of a trace line. None: no secret to mask."""
        hit, keyed = self._log_hit, self._log_keyed
        if hit is None and keyed is None:
            return None
        short = [s for s in self.source if len(s) < MIN_ID_SECRET_CHARS]  # a line without any: no keyed search

        def mask(line: bytes) -> bytes:
            text = line.decode("utf-8", "surrogateescape")
            spans = [] if hit is None else [m.span() for m in hit.finditer(text)]
            if keyed is not None and any(s in text for s in short):
                spans += [m.span("value") for m in keyed.finditer(text) if _is_secret_flag(m.group("name"))]
            if not spans:
                return line
            out, at = [], 0
            for a, b in sorted(spans):
                if b <= at:
                    continue
                a = max(a, at)
                out += [text[at:a].encode("utf-8", "surrogateescape"), b"*" * len(text[a:b].encode("utf-8", "surrogateescape"))]
                at = b
            out.append(text[at:].encode("utf-8", "surrogateescape"))
            return b"".join(out)

        return mask

    def ident(self, text: str) -> str:
        """A short server string (a response id, a finish_reason)."""
        if self._id_hit.search(text) is None:
            return text
        return redact_text(text, self._id_secrets)


# A short secret given to a secret-named key or flag in a log line: the name (checked by
# `_is_secret_flag`, a word at a time, so `max_tokens` is no secret name), a separator (an
# assignment or a mapping's colon, with the quotes and the opening bracket a printed dict or
# list puts around a value, or the space after a flag), and the value as a whole word.
_LOG_KEYED = (r"(?P<name>[A-Za-z_][A-Za-z0-9_.-]*)(?:['\"]?\s*[:=]\s*[\[(]?\s*[bu]?['\"]?|\s+['\"]?)"
              r"(?P<value>{values})(?![A-Za-z0-9_.~+/=-])")


_JSON_SHORT = {'"': '\\"', "\\": "\\\\", "/": "\\/", "\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _encoded(secret: str, *, lines: bool = False) -> str:
    """A regular expression for `secret` as a server may write it: each character as itself,
    as a JSON escape (`\\u0073`, either case, a surrogate pair past U+FFFF; `\\/`, `\\"`) or
    percent-encoded (`%40`, either case: a URL or form body), in any mix -- a JSON encoder
    escapes what it likes (.NET's `+` as `\\u002B`, Go's `&` as `\\u0026`). With `lines`, a line
    end may fall between two characters (a log line wrapped or cut)."""
    parts = []
    for c in secret:
        alts = [re.escape(c)]
        if ord(c) > 0xFFFF:
            hi, lo = divmod(ord(c) - 0x10000, 0x400)
            alts.append(f"\\\\u(?i:{0xD800 + hi:04x})\\\\u(?i:{0xDC00 + lo:04x})")
        else:
            alts.append(f"\\\\u(?i:{ord(c):04x})")
        if c in _JSON_SHORT:
            alts.append(re.escape(_JSON_SHORT[c]))
        alts.append("".join(f"%(?i:{b:02x})" for b in c.encode("utf-8")))
        parts.append("(?:" + "|".join(alts) + ")")
    return ("(?:\\r?\\n)?" if lines else "").join(parts)


_LINE_PIECE = re.compile(r"[^\r\n]+")


def _redact_pieces(m: re.Match[str]) -> str:
    """A secret's match replaced, one marker for each line it spans."""
    return _LINE_PIECE.sub(REDACTED, m.group(0))


def clip(text: str, limit: int) -> str:
    """`text` cut to at most `limit` characters without cutting a "<redacted>" in two: a marker
    the limit would cut ends the text whole instead (a redacted text can be longer than the
    text it came from)."""
    n = len(REDACTED)
    if len(text) <= limit:
        return text
    i = text.rfind(REDACTED, max(0, limit - n + 1), limit + n - 1)  # the one marker that can straddle the limit
    if i == -1:
        return text[:limit]
    if limit < n:  # no room for a marker: the text ends before it
        return clip(text[:i], limit)
    return clip(text[:i], limit - n) + REDACTED


def _cut_secret(text: str, secret: str) -> str:
    """`text` with a prefix of `secret` (at least MIN_SECRET_CHARS) that ends it replaced."""
    head = secret[:MIN_SECRET_CHARS]
    i = text.find(head, max(0, len(text) - len(secret) + 1))
    while i != -1:
        if secret.startswith(text[i:]):
            return text[:i] + REDACTED
        i = text.find(head, i + 1)
    return text


_RECORD_REDACTOR: contextvars.ContextVar[Redactor] = contextvars.ContextVar("soakspec_record_redactor", default=Redactor())


def record_redactor() -> Redactor:
    """The redactor of the run in progress (credential patterns only outside a run)."""
    return _RECORD_REDACTOR.get()


def use_secrets(secrets: Iterable[str]) -> contextvars.Token[Redactor]:
    """From now on in this context -- and the trio tasks and threads started from it -- request
    records are frozen with `secrets` redacted (`RequestRecord.freeze`). The runner calls it
    once at a run's start (`runner/engine.py`: inside `trio.run`, so it ends with the run) and a
    `--workers` process once with the run's secrets from its job."""
    return _RECORD_REDACTOR.set(Redactor(secrets))


@contextlib.contextmanager
def redacting(secrets: Iterable[str]) -> Iterator[Redactor]:
    """`use_secrets` for the duration of a `with` block."""
    token = use_secrets(secrets)
    try:
        yield _RECORD_REDACTOR.get()
    finally:
        _RECORD_REDACTOR.reset(token)
