"""THE request record: one type that the runner writes, `verify` validates and the judge reads.

`Record` (a frozen `msgspec.Struct`) is one finished request as it lies on disk, a line of
`backends/<name>/requests.jsonl.gz`. Decoding a line into it *is* the validation: types and
ranges are checked by one `msgspec` decode, in C, then the cross-field rules and the two hex
fields' patterns (`broken_rule`; for a block of lines at once, `_all_sound`),
at about a microsecond a record (benchmarks/README.md, "record decode"), and the JSON Schema
shipped as `schemas/request.schema.json` is generated from this type (`request_schema()`; a
test fails when the file drifts from it).

`RequestRecord` is the runner's *builder*: mutable while the request runs (the protocol fills
it in as bytes arrive), frozen once by `freeze()` when it ends.

Fields, their units and their meaning (times are epoch seconds of the run's `RunClock`, rounded
to 1 us on disk; durations are seconds):

  request_id      the id soakspec sent (x-request-id, the body's `user`)
  backend         the backend's name in the spec
  workload        the workload's name
  level           the load level's index (an int; a string in evidence that named levels)
  concurrency     closed loop: the level's concurrency; open loop: None
  rate            open loop: the level's rate (requests/s); closed loop: None
  bucket          the measured bucket the request *started* in (0, 1, ...), or a sentinel:
                  WARMUP_BUCKET (-1) started during warm-up, FOLLOW_UP_BUCKET (-2) the clean
                  follow-up request after the last level
  worker          the closed-loop worker (or open-loop slot) that sent it
  intended_start  when the schedule meant to send it (open loop: from the arrival process)
  start           when it was sent (None: never sent)
  first_byte      when the first response byte arrived
  first_token     when the first completion text (reasoning included) arrived; without text,
                  the first event whose per-chunk usage counted a token (None: not measured --
                  no text, and usage not per chunk, so the tokens' arrival is unknown)
  end             when the response finished (or failed)
  status          the HTTP status (None: no response)
  outcome         `Outcome`: exactly one per record
  error           the first error's text (at most ERROR_LIMIT characters; what it quotes of the
                  server redacted of the run's secrets, `RequestRecord.freeze`); None when completed
  finish_reason   the server's finish_reason
  server_id       the id the server gave the response (cmpl-...)
  prompt_tokens   usage.prompt_tokens (None: not reported)
  output_tokens   completion tokens (see tokens_source)
  tokens_source   `TokensSource`: where output_tokens came from
  itl_source      `ItlSource`: how the per-token gaps were attributed
  chunks          text chunks (SSE events with text, reasoning text included) received
  tpot            time per output token after the first chunk's k1: (last token - first_token)
                  / (tokens - k1), the mean of the ITL gaps (None: not streamed, fewer than 2
                  tokens, every token in the first chunk, or token times unknown)
  itl_us          inter-token gaps, whole microseconds, one per token after the first
                  chunk's k1 tokens (a chunk of k tokens: k gaps of its gap / k), so they sum to
                  last token - first_token (runner/protocol.py, "ITL"). Stored packed, one
                  string: lowercase hex of each gap as a little-endian uint32 (8 digits a gap:
                  `pack_gaps`); when a gap is 2**32 us (71.6 minutes) or longer, "w" and 16
                  digits a gap (uint64). Evidence written before format 3 holds a JSON array of
                  integers here, which every reader still takes. Read the gaps as numbers with
                  `Record.gaps_us` (or `itl`, in seconds), never from this field's text.
  output_sha256   sha256 of the completion text, a chat chunk's reasoning then its content (None: none)
  output_chars    characters of completion text (reasoning included)
  empty_text      a completed request whose tokens decoded to no text at all (nor reasoning)
  coalesced       ITL gaps that share a read stamp with the previous token (not independent samples)
  usage_decreased the stream's cumulative usage.completion_tokens went down at some point
  client_delay    seconds between the last bytes' arrival stamp and the client finishing them
  conversation    multi-turn chat (`multi_turn = true`): which conversation of the prompt file
                  the request's session sent, counted from 1 in the file's order (as `check`'s
                  W512 names them); None for any other request
  turn            multi-turn chat: which user turn of that conversation it sent, from 1 (its
                  history is every turn before it); None for any other request
  admitted        open loop with `max_concurrency`: when the request got its slot under the
                  spec's cap (intended_start <= admitted <= start); None without a cap (and in
                  evidence before format 5). The wait before it, admitted - intended_start, is
                  the request queued behind the cap the user declared (counted in its ttft and
                  latency, which still run from intended_start); only start - admitted is the
                  load generator's own lateness (`schedule_lag`)

Derived, defined once here (properties, never stored): `ttft` and `latency` measure from the
intended start (open-loop load: a late scheduler is charged, not hidden), or from `start` when
the record has no intended start; `schedule_lag` is start less `admitted`, else less
intended_start (the load generator's lateness: not the wait behind a declared cap), `cap_wait`
admitted less intended_start; `sent_ttft` and `sent_latency` are first_token and end less
`start` (from the send: the server's view, as vLLM's bench serve measures; `sent_since`); `gaps_us` is `itl_us` unpacked, `itl` the same in seconds. `tpot` is stored, because the
token times it comes from are not all kept.

Dict-style reading: `row["field"]`, `row.get("field", default)`, `"field" in row`, `keys()`,
`{**row}` work for the stored fields and the derived ones (ttft, latency, itl), so code written
against the JSON rows reads a `Record` unchanged. `Record` is registered as a `Mapping`.
"""

from __future__ import annotations

import dataclasses
import enum
import math
import re
import sys
from array import array
from collections.abc import Mapping
from typing import Annotated, Any

import msgspec

from soakspec.evidence.redact import clip, record_redactor


class Outcome(enum.StrEnum):
    """How a request ended. Exactly one per record.

    COMPLETED    -- HTTP 200, >= 1 completion token (usage or counted text events), `data: [DONE]`,
                    no error anywhere. Its text may be empty (then `empty_text` is true).
    FAILED       -- the server answered but wrongly: status not 200 (except 4xx), an error event
                    or payload, a failing finish_reason (`FAILED_FINISH_REASONS`: "error",
                    or "abort", the engine dropped the request), no `[DONE]`, zero completion tokens
                    although max_tokens > 0, malformed SSE/JSON, an oversized event, a body in a
                content-encoding other than the identity soakspec asks for.
    TIMEOUT      -- the request's absolute deadline passed first.
    REJECTED     -- HTTP 4xx (including 429): the server refused the request.
    DISCONNECTED -- the connection failed (refused, closed, reset) before the response finished.
    """

    COMPLETED = "completed"
    FAILED = "failed"
    TIMEOUT = "timeout"
    REJECTED = "rejected"
    DISCONNECTED = "disconnected"


OUTCOMES: tuple[str, ...] = tuple(o.value for o in Outcome)

# The finish_reasons that say the server did not finish the response: "error", and "abort" (vLLM's
# and SGLang's reason for a request the engine dropped: preempted beyond recovery, cancelled
# internally, shut down). Its text is cut short however well-formed the stream: the request is
# FAILED ("finish_reason: abort"), by the runner (`soakspec.runner.protocol`) and by the judge
# re-deriving the outcome (`soakspec.judge.rederive.derive_outcome`) alike.
FAILED_FINISH_REASONS: tuple[str, ...] = ("error", "abort")
# the error of a request the runner itself cancelled in flight when the run was aborted (an
# interrupt): recorded disconnected, though it was not the server that ended it (runner/load.py)
CANCELLED_BY_ABORT = "the run was aborted before the response finished"
# the error's start of an arrival the backoff gate did not let through (runner/liveness.py):
# recorded, never sent -- so not one of a counted warmup's `warmup_sent` (judge/validity.py)
HELD_BACK = "held back: "


class TokensSource(enum.StrEnum):
    USAGE = "usage"  # the server's usage.completion_tokens
    COUNTED = "counted"  # no usage anywhere: one token per text chunk


class ItlSource(enum.StrEnum):
    USAGE = "usage"  # per-chunk token counts from cumulative (continuous) usage
    EXACT = "exact"  # final usage equals the number of text chunks: one token per chunk
    ESTIMATED = "estimated"  # final usage spread evenly over the text chunks
    COUNTED = "counted"  # no usage: one token per text chunk


WARMUP_BUCKET = -1  # started during a level's warm-up: recorded, never measured
FOLLOW_UP_BUCKET = -2  # the clean follow-up request after the last level
ERROR_LIMIT = 500  # characters of the first error message that are kept
# The bound on a response's completion tokens, one for both sides: the judge flags a request
# whose reported count exceeds it as `usage_mismatch` (`soakspec.judge.rederive.usage_problem`),
# and the runner splits a chunk's gap into one ITL gap per token only within it
# (`soakspec.runner.protocol`, "ITL"), so a bogus claim (a usage of 10^12) costs bounded work.
#
# A request that set max_tokens (every request soakspec sends does: the spec's max_tokens, a
# prompt file's or a replayed trace's lengths) has at most that many completion tokens, whatever
# the server's chunking and whether or not it may stop early: more is the server's bug. That is
# the bound (`usage_bound`). A server may legitimately put many tokens in one chunk (SGLang's and
# vLLM's `--stream-interval 32` send 32 a chunk; speculative decoding several), so no bound per
# chunk below max_tokens is sound. Only without a max_tokens (evidence the judge cannot tie to
# its workload) does a fixed bound per text chunk stand in: MAX_TOKENS_PER_CHUNK.
MAX_TOKENS_PER_CHUNK = 16


def usage_bound(max_tokens: int | None) -> int | None:
    """The most completion tokens a response to a request of `max_tokens` can have: max_tokens
    itself when the request set one (> 0); None when it did not (then MAX_TOKENS_PER_CHUNK a text
    chunk bounds the count)."""
    return max_tokens if max_tokens is not None and max_tokens > 0 else None


def measured(bucket: int) -> bool:
    """Whether a request of `bucket` belongs to a measured bucket (not warm-up, not follow-up)."""
    return bucket >= 0


_US = 1_000_000
NonNeg = Annotated[int, msgspec.Meta(ge=0)]
NonNegF = Annotated[float, msgspec.Meta(ge=0)]
# sha256 hex. Its pattern is checked with the packed gaps' (`shas_ok`, a block's `_all_sound`), not by
# the typed decode: a msgspec pattern was half of a record's decode (1.38 against 0.70 us a record)
_SHA_PATTERN = r"^[0-9a-f]{64}(?![\s\S])"  # not "$": Python's matches before a trailing newline
_SHA = re.compile(_SHA_PATTERN)


# ------------------------------------------------------------------------------ packed ITL gaps
#
# A record's per-token gaps are one string, not a JSON array of decimal integers: the array was
# two thirds of a record's decode (benchmarks/README.md, "The floor of the present format"),
# and the packed string is decoded for a whole block of records with one `bytes.fromhex`
# (`unpack_block`). Hex rather than base64: records' strings concatenate into one valid hex
# string (base64's padding does not), it gzips smaller (80.9 bytes a record against 86.8 for
# base64 and 84.4 for the decimal text, at 64 tokens), and it is still readable by eye.
PACKED_PROBLEM = ("not packed gaps: lowercase hex, 8 digits a gap (a little-endian uint32 of whole "
                  "microseconds), or 'w' and 16 digits a gap (uint64, below 2**63)")
# what `packed_ok` and the JSON Schema accept (a wide gap must also be below 2**63, which a
# pattern cannot say); not "$": Python's matches before a trailing newline
_PACKED_PATTERN = r"^(?:(?:[0-9a-f]{8})*|w(?:[0-9a-f]{16})*)(?![\s\S])"
_PACKED = re.compile(_PACKED_PATTERN)
_BIG_ENDIAN = sys.byteorder == "big"
assert array("I").itemsize == 4 and array("Q").itemsize == 8 and array("q").itemsize == 8
_EMPTY_GAPS = array("q")


def pack_gaps(us: list[int]) -> str:
    """Whole-microsecond gaps as the record stores them (see `Record`'s `itl_us`): hex of
    little-endian uint32s, or "w" and uint64s when a gap needs them. Raises ValueError for a
    negative gap or one of 2**63 us or more (nothing the runner measures: it would be 292,000
    years)."""
    if not us:
        return ""
    try:
        a = array("I", us)
        wide = ""
    except OverflowError:
        if min(us) < 0 or max(us) >= 2**63:
            raise ValueError(f"ITL gap out of range: {min(us) if min(us) < 0 else max(us)} us") from None
        a, wide = array("Q", us), "w"
    if _BIG_ENDIAN:
        a.byteswap()
    return wide + a.tobytes().hex()


def packed_ok(s: str) -> bool:
    """Whether `s` is a packed gap string `unpack_gaps` reads (the JSON Schema's pattern, and
    each wide gap below 2**63)."""
    if _PACKED.match(s) is None:
        return False
    if s[:1] != "w":
        return True
    a = array("Q", bytes.fromhex(s[1:]))
    if _BIG_ENDIAN:
        a.byteswap()
    return max(a, default=0) < 2**63


def unpack_gaps(v: str | tuple[int, ...]) -> array:
    """The gaps of a record's `itl_us` (packed, or the array of evidence before format 3) as
    an int64 array. The string must be one `packed_ok` accepts (every reader checks it first:
    `Record.broken_rule`, a block's `_all_sound`)."""
    if type(v) is not str:
        return array("q", v)
    if not v:
        return _EMPTY_GAPS[:]
    if v[0] == "w":
        a = array("q", bytes.fromhex(v[1:]))
    else:
        a = array("I", bytes.fromhex(v))
    if _BIG_ENDIAN:
        a.byteswap()
    return a if a.typecode == "q" else array("q", a)


def extend_u32(into: array, v: Any) -> bool:
    """Append the gaps of a narrow packed string `v` to `into`, an array of 4-byte unsigned
    ints, straight from their bytes (a tenth of `unpack_gaps` and a copy); False, appending
    nothing, when `v` is not one (a wide or legacy value, or `into` of another type)."""
    if type(v) is not str or v[:1] == "w" or into.itemsize != 4 or into.typecode not in "IL":
        return False
    if not _BIG_ENDIAN:
        into.frombytes(bytes.fromhex(v))
        return True
    a = array(into.typecode, bytes.fromhex(v))
    a.byteswap()
    into.extend(a)
    return True


def unpack_block(gaps: list) -> tuple[Any, Any] | None:
    """(gap counts, every gap) of a block of records' `itl_us` values -- int64 numpy arrays,
    the gaps in record order -- in one `bytes.fromhex` when every value is a narrow packed
    string that `packed_ok` accepts; None when some value is not (a wide or legacy value, or
    a bad one: then read them one at a time)."""
    import numpy as np

    got = _narrow_block(gaps)
    if got is None:
        return None
    lens, joined = got
    return lens >> 3, np.frombuffer(bytes.fromhex(joined), dtype="<u4").astype(np.int64)


def _narrow_block(gaps: list) -> tuple[Any, str] | None:
    """(each value's length, the values joined) when every value of `gaps` is a narrow packed
    string `packed_ok` accepts, else None."""
    import numpy as np

    if not all(type(g) is str for g in gaps):
        return None
    lens = np.fromiter(map(len, gaps), dtype=np.int64, count=len(gaps))
    joined = "".join(gaps)
    return (lens, joined) if not (lens & 7).any() and _lower_hex(joined) else None


def shas_ok(shas: list[str | None]) -> bool:
    """Whether every value of `shas` is None or a sha256 in lowercase hex (`Record`'s
    output_sha256), a block at a time: one C pass over them all, no pattern a record."""
    given = [h for h in shas if h is not None]
    return all(len(h) == 64 for h in given) and _lower_hex("".join(given))


_HEX_DIGITS = b"0123456789abcdef"


def _lower_hex(text: str) -> bool:
    """Whether `text` is lowercase hex digits and nothing else: its ASCII bytes with every hex
    digit deleted are empty (one C pass; `str.lower()` and a comparison cost five times more)."""
    return text.isascii() and not text.encode("ascii").translate(None, _HEX_DIGITS)



class Record(msgspec.Struct, frozen=True, gc=False, omit_defaults=False, forbid_unknown_fields=True):
    """One finished request (see the module docstring for every field)."""

    request_id: Annotated[str, msgspec.Meta(min_length=1)]
    backend: Annotated[str, msgspec.Meta(min_length=1)]
    workload: str
    level: int | str
    concurrency: Annotated[int, msgspec.Meta(ge=1)] | None
    rate: Annotated[float, msgspec.Meta(gt=0)] | None
    bucket: int
    worker: NonNeg | None
    intended_start: float | None
    start: float | None
    first_byte: float | None
    first_token: float | None
    end: float | None
    status: Annotated[int, msgspec.Meta(ge=100, le=599)] | None
    outcome: Outcome
    error: str | None
    finish_reason: str | None
    server_id: str | None
    prompt_tokens: NonNeg | None
    output_tokens: NonNeg
    tokens_source: TokensSource
    itl_source: ItlSource
    chunks: NonNeg
    tpot: NonNegF | None
    itl_us: str | tuple[NonNeg, ...]  # packed (`pack_gaps`); an array in evidence before format 3
    output_sha256: str | None  # 64 lowercase hex digits (`shas_ok`)
    output_chars: NonNeg
    empty_text: bool = False
    coalesced: NonNeg = 0
    usage_decreased: bool = False
    client_delay: NonNegF | None = None
    conversation: Annotated[int, msgspec.Meta(ge=1)] | None = None
    turn: Annotated[int, msgspec.Meta(ge=1)] | None = None
    admitted: float | None = None

    def broken_rule(self) -> tuple[str, str] | None:
        """(JSON pointer, why) of the first cross-field rule this record breaks, or None. Checked
        by every reader (`decode_line`, `iter_records`), not when the runner freezes a record:
        a run writes what happened and `verify` says what is wrong with it."""
        sha = self.output_sha256
        if sha is not None and _SHA.match(sha) is None:
            return "/output_sha256", f"{sha[:80]!r} is not a sha256 in lowercase hex"
        gaps = self.itl_us
        if type(gaps) is str:
            if not packed_ok(gaps):
                return "/itl_us", PACKED_PROBLEM
        elif gaps and max(gaps) >= 2**63:  # evidence before format 3: an array
            return "/itl_us", "a gap of 2**63 us or more"
        if self.outcome is Outcome.COMPLETED:
            if self.end is None:
                return "/end", "a completed request needs an end time"
            if self.error is not None:
                return "/error", "a completed request has no error"
        elif not self.error:
            return "/error", f"a {self.outcome.value} request needs a non-empty error"
        lat = self.latency
        if lat is not None and lat < 0:
            return "/end", "end is before the (intended) start"
        t = self.ttft
        if t is not None and t < 0:
            return "/first_token", "first_token is before the (intended) start"
        adm = self.admitted
        if adm is not None and self.intended_start is not None and adm < self.intended_start:
            return "/admitted", "admitted is before the intended start"
        if adm is not None and self.start is not None and adm > self.start:
            return "/admitted", "admitted is after the start"
        return None

    # ---------------------------------------------------------------- derived
    @property
    def sent_at(self) -> float | None:
        """What durations measure from: the intended start, or the start without one."""
        return self.intended_start if self.intended_start is not None else self.start

    @property
    def ttft(self) -> float | None:
        """Time to first token (s), from `sent_at`."""
        t = self.sent_at
        return None if self.first_token is None or t is None else self.first_token - t

    @property
    def latency(self) -> float | None:
        """End-to-end latency (s), from `sent_at`."""
        t = self.sent_at
        return None if self.end is None or t is None else self.end - t

    @property
    def sent_ttft(self) -> float | None:
        """Time to first token (s) from the send (`start`), whatever the request waited before
        it: what the server was asked to do and took (`sent_since`)."""
        return sent_since(self.first_token, self.start)

    @property
    def sent_latency(self) -> float | None:
        """End-to-end latency (s) from the send (`start`) (`sent_since`)."""
        return sent_since(self.end, self.start)

    @property
    def schedule_lag(self) -> float | None:
        """The load generator's lateness (s): start less `admitted` (the slot under a declared
        `max_concurrency`), else less the intended start; None unsent or without an intended start."""
        return schedule_lag(self.start, self.intended_start, self.admitted)

    @property
    def cap_wait(self) -> float | None:
        """The wait behind a declared `max_concurrency` (s): admitted less the intended start."""
        return None if self.admitted is None or self.intended_start is None else self.admitted - self.intended_start

    @property
    def gaps_us(self) -> array:
        """The inter-token gaps in whole microseconds (an integer array), unpacked."""
        return unpack_gaps(self.itl_us)

    @property
    def itl(self) -> array:
        """The inter-token gaps in seconds (a float array)."""
        return array("d", [g / _US for g in unpack_gaps(self.itl_us)])

    @property
    def measured(self) -> bool:
        return self.bucket >= 0

    # ---------------------------------------------------------------- dict-style reading
    def __getitem__(self, key: str) -> Any:
        if key in _READABLE:
            return getattr(self, key)
        raise KeyError(key)

    def get(self, key: str, default: Any = None) -> Any:
        return getattr(self, key) if key in _READABLE else default

    def __contains__(self, key: object) -> bool:
        return key in _READABLE

    def keys(self) -> tuple[str, ...]:
        return READ_KEYS

    def __iter__(self):
        return iter(READ_KEYS)

    def __len__(self) -> int:
        return len(READ_KEYS)

    def items(self):
        return [(k, getattr(self, k)) for k in READ_KEYS]

    def values(self):
        return [getattr(self, k) for k in READ_KEYS]

    def to_json(self) -> dict[str, Any]:
        """The on-disk object (plain JSON types), as `encode_line` writes it."""
        d = msgspec.to_builtins(self)
        if type(self.itl_us) is not str:
            d["itl_us"] = list(self.itl_us)  # JSON's array, as a decoded line has it
        return d


Mapping.register(Record)

RECORD_KEYS: tuple[str, ...] = Record.__struct_fields__  # the on-disk keys, in the order written
DERIVED_KEYS: tuple[str, ...] = ("ttft", "latency", "itl")
READ_KEYS: tuple[str, ...] = RECORD_KEYS + DERIVED_KEYS
_READABLE = frozenset(READ_KEYS)
# Keys a record written before they existed may lack (decoding fills in the default).
OPTIONAL_KEYS: frozenset[str] = frozenset(RECORD_KEYS[len(RECORD_KEYS) - len(Record.__struct_defaults__):])


# ------------------------------------------------------------------------------ on disk

_ENCODER = msgspec.json.Encoder()
_DECODER = msgspec.json.Decoder(Record)
_BLOCK_DECODER = msgspec.json.Decoder(list[Record])  # a block of lines at once (`io.decode_block`)


def encode_line(rec: Record) -> bytes:
    """One requests line: compact JSON of `rec`, newline-terminated."""
    return _ENCODER.encode(rec) + b"\n"


def encode_lines(recs: list[Record]) -> bytes:
    """`encode_line` of each record, joined: one msgspec call for a batch (the same bytes)."""
    return _ENCODER.encode_lines(recs)


def decode_lines_lenient(data: bytes) -> list[Record]:
    """`decode_lenient` of each non-blank line of `data`, the lines that decode: one msgspec
    call when all do (the usual case), line by line otherwise."""
    try:
        return _DECODER.decode_lines(data)
    except msgspec.DecodeError:
        return [r for line in data.splitlines() if line.strip() and (r := decode_lenient(line)) is not None]


def decode_line(line: bytes | str) -> Record:
    """Decode and validate one line (raises `msgspec.ValidationError` / `msgspec.DecodeError`)."""
    rec = _DECODER.decode(line)
    broken = rec.broken_rule()
    if broken is not None:
        raise msgspec.ValidationError(f"{broken[1]} - at `$.{broken[0][1:]}`")
    return rec


def decode_lenient(line: bytes | str) -> Record | None:
    """A line as a `Record` when it has the record's shape (its cross-field rules unchecked), else
    None: for what the runner itself watches while it runs (abort rules, bucket lines), which
    must never stop a run over a record `verify` will report afterwards."""
    try:
        return _DECODER.decode(line)
    except msgspec.DecodeError:
        return None


def error_pointer(err: Exception) -> tuple[str, str]:
    """(JSON pointer, message) of a msgspec decode error: "... - at `$.bucket`" -> "/bucket"."""
    text = str(err)
    msg, sep, where = text.rpartition(" - at `")
    if not sep:
        return "", text
    path = where.rstrip("`")
    parts = []
    for part in path.removeprefix("$").replace("]", "").replace("[", ".").split("."):
        if part:
            parts.append(part)
    return "".join("/" + p for p in parts), msg


def _round6(t: float) -> float:
    """`round(t, 6)`, exactly, at a third of its cost for the values a record holds.

    `round(t, 6)` rounds the exact binary value of t to 6 decimals (through a decimal string)
    and returns the double nearest that decimal. For 0 < t < 4e9, x = t * 1e6 is below 2**52,
    so the product's rounding error is at most 0.25: when x lies within 0.25 of the integer k,
    the exact t * 10**6 lies within 0.5 of k (no tie), k is the correctly rounded count of
    microseconds, and k / 1e6 -- one correctly rounded division of two exact doubles -- is the
    double nearest k * 10**-6, the very value round() returns. Anything else (near a tie, zero,
    negative, huge, NaN, inf) goes to round() itself. tests/test_records.py checks the identity.
    """
    if 0.0 < t < 4e9:
        x = t * 1e6
        k = round(x)
        if -0.25 < x - k < 0.25:
            return k / 1e6
    return round(t, 6)


def sent_since(stamp: float | None, start: float | None) -> float | None:
    """A duration from the send, defined once (the record's `sent_ttft` and `sent_latency`, the
    judge's row and column forms): `stamp` (first_token, end) less `start`, the moment the
    request went out on its connection -- after any wait for a slot under the spec's
    `max_concurrency` and any lateness of the load generator. What vLLM's `bench serve` and
    SGLang's `bench_serving` call TTFT and E2EL (their clock starts at the send, after their
    semaphore): the server's own view. `ttft` and `latency` run from the intended start instead
    (an open loop's truth: the user waited in the queue too). Equal to them for a closed loop,
    whose intended start is its start. None: not sent, or no such stamp."""
    if stamp is None or start is None:
        return None
    return stamp - start


def outcomes_text(counts: Any, most: int = 4) -> str:
    """Outcome counts in words, most first ("40 connection refused, 2 HTTP 500"): what a fired
    abort saw (the runner's `abort.Fired.describe`, the judge's `abort_fired`, from the
    manifest's `aborts` entry). Past `most` kinds, the rest are summed ("3 other")."""
    items = sorted(((str(k), int(v)) for k, v in dict(counts).items() if isinstance(v, int) and v > 0),
                   key=lambda kv: (-kv[1], kv[0]))
    parts = [f"{n} {k}" for k, n in items[:most]]
    rest = sum(n for _, n in items[most:])
    return ", ".join(parts + ([f"{rest} other"] if rest else []))


def schedule_lag(start: float | None, intended: float | None, admitted: float | None = None) -> float | None:
    """The load generator's lateness behind what it was due to do, defined once (the record's
    `schedule_lag`, the judge's row and column forms, the abort rules): start less `admitted`
    -- an open loop's request waiting for a slot under the spec's `max_concurrency` was not due
    until the slot was free -- else less the intended start. None: not sent, or no intended start
    (a record without one has no schedule to be late for, whatever else it says)."""
    if start is None or intended is None:
        return None
    return start - (admitted if admitted is not None else intended)


def _round_us(t: float | None) -> float | None:
    if t is None:
        return None
    if 0.0 < t < 4e9:  # finite: `_round6`'s fast case, inline
        x = t * 1e6
        k = round(x)
        if -0.25 < x - k < 0.25:
            return k / 1e6
    elif not math.isfinite(t):
        raise ValueError(f"time out of range for JSON: {t!r}")
    return round(t, 6)


_TO_US = 1e6.__mul__  # g * 1e6 (== g * 1_000_000: the int converts to the same double)


# ------------------------------------------------------------------------------ the runner's builder


@dataclasses.dataclass(slots=True)
class RequestRecord:
    """What happened to one request. Mutable while the request runs; `freeze()` when done.

    `itl` holds the per-token gaps in seconds as the protocol measures them; freezing rounds
    them to whole microseconds (`Record.itl_us`) and the times to 1 us."""

    request_id: str
    backend: str = ""
    workload: str = ""
    level: int = 0
    concurrency: int | None = None
    rate: float | None = None
    bucket: int = 0
    worker: int = 0
    intended_start: float | None = None
    start: float | None = None
    first_byte: float | None = None
    first_token: float | None = None
    end: float | None = None
    status: int | None = None
    outcome: Outcome = Outcome.FAILED
    error: str | None = None
    finish_reason: str | None = None
    server_id: str | None = None
    prompt_tokens: int | None = None
    output_tokens: int = 0
    tokens_source: TokensSource = TokensSource.COUNTED
    itl_source: ItlSource = ItlSource.COUNTED
    chunks: int = 0
    tpot: float | None = None
    itl: list[float] = dataclasses.field(default_factory=list)
    output_sha256: str | None = None
    output_chars: int = 0
    # a completed request whose tokens decoded to no text at all (special tokens, partial UTF-8)
    empty_text: bool = False
    coalesced: int = 0
    usage_decreased: bool = False
    client_delay: float | None = None
    conversation: int | None = None  # multi-turn chat: the file's conversation (from 1) and its user turn (from 1)
    turn: int | None = None
    admitted: float | None = None  # open loop under max_concurrency: when its slot was free (`Record.admitted`)

    @property
    def ttft(self) -> float | None:
        """Time to first token, as `Record.ttft` (from the intended start, else the start)."""
        t = self.intended_start if self.intended_start is not None else self.start
        return None if self.first_token is None or t is None else self.first_token - t

    @property
    def latency(self) -> float | None:
        """End-to-end latency, as `Record.latency`."""
        t = self.intended_start if self.intended_start is not None else self.start
        return None if self.end is None or t is None else self.end - t

    def freeze(self) -> Record:
        """The finished record. Raises ValueError for a NaN or infinite time or gap (nothing
        is written then).

        The text it quotes from the server -- `error` (HTTP bodies, error events, protocol
        errors), `finish_reason`, `server_id` -- is redacted first, in this builder too (so a
        message made from it afterwards, a pre-flight or follow-up reason, is redacted as
        well): the run's secrets and credential patterns (`redact.record_redactor`). Every
        record passes here before it is written, whichever path wrote it."""
        self.redact()
        itl = self.itl
        if itl and not math.isfinite(s := sum(itl)):
            raise ValueError(f"ITL value out of range for JSON in {self.request_id}: {s!r}")
        tpot = self.tpot
        if tpot is not None and not math.isfinite(tpot):
            raise ValueError(f"tpot out of range for JSON in {self.request_id}")
        cd = self.client_delay
        return Record(
            self.request_id, self.backend, self.workload, self.level, self.concurrency, self.rate, self.bucket,
            self.worker, _round_us(self.intended_start), _round_us(self.start), _round_us(self.first_byte),
            _round_us(self.first_token), _round_us(self.end), self.status, self.outcome, self.error,
            self.finish_reason, self.server_id, self.prompt_tokens, self.output_tokens, self.tokens_source,
            self.itl_source, self.chunks, None if tpot is None else _round6(tpot),
            pack_gaps(list(map(round, map(_TO_US, itl)))), self.output_sha256, self.output_chars, self.empty_text,
            self.coalesced, self.usage_decreased, None if cd is None else _round6(cd), self.conversation, self.turn,
            _round_us(self.admitted),
        )  # fmt: skip

    def redact(self) -> None:
        """Redact the server's text this builder holds (see `freeze`); idempotent. A lone
        UTF-16 surrogate in it (a JSON escape such as "\\ud800" in the server's body: half a
        character, which no UTF-8 line can hold) is shown as that escape."""
        red = record_redactor()
        err = self.error
        if err is not None:
            shown = red.text(_escape_surrogates(err))
            if shown != err:
                self.error = clip(shown, ERROR_LIMIT)
        if self.finish_reason is not None:
            self.finish_reason = red.ident(_escape_surrogates(self.finish_reason))
        if self.server_id is not None:
            self.server_id = red.ident(_escape_surrogates(self.server_id))

    def to_json(self) -> dict[str, Any]:
        """The on-disk object of the frozen record."""
        return self.freeze().to_json()

    def to_line(self) -> bytes:
        """The requests line of the frozen record (`encode_line(freeze())`)."""
        return _ENCODER.encode(self.freeze()) + b"\n"

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> RequestRecord:
        """A builder holding a stored record: a `Record`, its JSON object, or a row of the
        format before `Record` (`itl` in seconds, stored `ttft`/`latency`, which are derived)."""
        if isinstance(d, Record):
            r = d
        else:
            d = dict(d)
            itl = d.pop("itl", None)
            d.pop("ttft", None)
            d.pop("latency", None)
            if itl is not None and "itl_us" not in d:
                d["itl_us"] = [round(g * _US) for g in itl]
            r = msgspec.convert(d, Record)
        return cls(**{k: getattr(r, k) for k in RECORD_KEYS if k != "itl_us"}, itl=[g / _US for g in r.gaps_us])


_SURROGATE = re.compile("[\ud800-\udfff]")


def _escape_surrogates(text: str) -> str:
    """`text` with each lone surrogate written as its JSON escape (`\\ud800`)."""
    return text if text.isascii() else _SURROGATE.sub(lambda m: f"\\u{ord(m.group(0)):04x}", text)


# ------------------------------------------------------------------------------ the schema


def request_schema() -> dict[str, Any]:
    """The JSON Schema of a requests line, generated from `Record` plus the cross-field rules
    of `Record.broken_rule` that JSON Schema can state (`schemas/request.schema.json`)."""
    generated = msgspec.json.schema(Record)
    defs = generated.get("$defs", {})
    body = dict(defs.pop("Record"))
    body.pop("title", None)
    body.pop("description", None)
    schema: dict[str, Any] = {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": "urn:soakspec:evidence:request:5",
        "title": "one finished request (a line of backends/<name>/requests.jsonl.gz)",
        "description": "Generated from soakspec.evidence.record.Record (its docstring says what each field means). "
                       "Times are epoch seconds rounded to 1 us; tpot and client_delay are seconds; itl_us are "
                       "whole microseconds, packed: lowercase hex of little-endian uint32s (or 'w' and "
                       "uint64s), a JSON array of integers in evidence before format 3. "
                       "bucket -1 is warm-up, -2 the follow-up request. Format 4 added conversation and turn "
                       "(multi-turn chat; absent in format 3: read as null); format 5 added admitted (an open loop's "
                       "slot under max_concurrency; absent before: read as null).",
    }
    schema |= body
    props = schema["properties"] = dict(schema["properties"])
    props["output_sha256"] = {"anyOf": [{"type": "string", "pattern": _SHA_PATTERN}, {"type": "null"}]}
    props["itl_us"] = {  # the packed string's pattern (`packed_ok`; not checked by the typed decode, which is faster without it)
        "anyOf": [{"type": "string", "pattern": _PACKED_PATTERN},
                  {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 2**63 - 1},
                   "description": "evidence before format 3"}],
    }
    schema["additionalProperties"] = False  # forbid_unknown_fields: a key the type does not know is an error
    schema["allOf"] = [
        {"if": {"properties": {"outcome": {"const": "completed"}}, "required": ["outcome"]},
         "then": {"properties": {"end": {"type": "number"}, "error": {"type": "null"}}}},
        {"if": {"properties": {"outcome": {"enum": [o for o in OUTCOMES if o != "completed"]}}, "required": ["outcome"]},
         "then": {"properties": {"error": {"type": "string", "minLength": 1}}}},
    ]
    if defs:
        schema["$defs"] = defs
    return schema


__all__ = [
    "DERIVED_KEYS", "ERROR_LIMIT", "FOLLOW_UP_BUCKET", "HELD_BACK", "OPTIONAL_KEYS", "OUTCOMES", "READ_KEYS", "RECORD_KEYS", "WARMUP_BUCKET",
    "ItlSource", "Outcome", "Record", "RequestRecord", "TokensSource", "decode_lenient", "decode_line", "decode_lines_lenient", "encode_line",
    "encode_lines",
    "error_pointer", "iter_record_batches", "iter_records",
    "measured", "outcomes_text", "pack_gaps", "packed_ok", "request_schema", "schedule_lag", "sent_since", "unpack_block", "unpack_gaps",
]


# ------------------------------------------------------------------------------ reading a stream


def iter_records(path, errors: list[tuple[int, str | None]] | None = None, hasher: Any = None, *,
                 schema_errors: list[tuple[int, str, str]] | None = None, start: int = 0):
    """Yield `(line_number, Record)` from a requests file (gzip or plain), decoding and
    validating each line once, streamed. `hasher` is fed every byte of the file (one pass
    hashes, decodes and validates). Lines that do not parse go into `errors` as `(line,
    message)`; a cut-off last line or gzip member as `(line, None)` (see `io.iter_jsonl`).
    Lines that parse but break the record's rules go into `schema_errors` as `(line, pointer,
    message)` when given, else into `errors`. `start`: read from that byte offset, a gzip
    member's first byte (`io.iter_raw_blocks`)."""
    for first, recs in iter_record_batches(path, errors, hasher, schema_errors=schema_errors, start=start):
        for k, rec in enumerate(recs):
            yield first + k, rec


def iter_record_batches(path, errors: list[tuple[int, str | None]] | None = None, hasher: Any = None, *,
                        schema_errors: list[tuple[int, str, str]] | None = None, start: int = 0):
    """`iter_records` a run of consecutive lines at a time: yield `(first_line_number,
    records)`, the records of lines first, first + 1, ... (a bad line ends a run). A block of
    whole lines is decoded in one msgspec call (`io.decode_block`); only a block that holds a bad
    line is decoded again line by line, to say which line and why. Same records, errors and
    hashing as `iter_records`."""
    from soakspec.evidence.io import decode_block, iter_raw_blocks

    cut: list[int] = []
    for first, block in _guarded(iter_raw_blocks(path, hasher, cut, start), errors):
        if not block.endswith(b"\n"):  # the cut-off end of the file
            if errors is not None:
                errors.append((first, None))
            break
        recs = decode_block(_BLOCK_DECODER, block)  # one record a line, or None
        if recs is not None and _all_sound(recs):
            yield first, recs
            continue
        yield from _line_by_line(block, first, errors, schema_errors)
    if cut and errors is not None and not any(m is None for _, m in errors):
        errors.append((cut[0] + 1, None))


def _all_sound(recs: list[Record]) -> bool:
    """Whether no record of `recs` breaks a cross-field rule (`Record.broken_rule`), checked a
    field at a time (a block with one that does is read line by line, which says which and why)."""
    import numpy as np

    if not shas_ok([r.output_sha256 for r in recs]):
        return False
    gaps = [r.itl_us for r in recs]
    if _narrow_block(gaps) is None and not all(packed_ok(g) if type(g) is str else not g or max(g) < 2**63 for g in gaps):
        return False
    done = [r.outcome is Outcome.COMPLETED for r in recs]
    if any((e is not None) if d else not e for d, e in zip(done, [r.error for r in recs])):
        return False
    end = np.array([r.end for r in recs], dtype=np.float64)  # None: NaN
    if np.isnan(end[np.array(done, dtype=bool)]).any():
        return False
    start = np.array([r.start for r in recs], dtype=np.float64)
    intended = np.array([r.intended_start for r in recs], dtype=np.float64)
    sent = np.where(np.isnan(intended), start, intended)
    first_token = np.array([r.first_token for r in recs], dtype=np.float64)
    admitted = [r.admitted for r in recs]
    with np.errstate(invalid="ignore"):
        if admitted.count(None) != len(admitted):  # an open loop under max_concurrency: intended <= admitted <= start
            adm = np.array(admitted, dtype=np.float64)
            if (adm < intended).any() or (adm > start).any():
                return False
        return not ((end - sent < 0).any() or (first_token - sent < 0).any())  # NaN: no value, no rule


def _line_by_line(block: bytes, first: int, errors, schema_errors):
    """A block with a bad line: each line decoded on its own (runs of good ones yielded)."""
    run: list[Record] = []
    run_at = first
    for i, raw in enumerate((line + b"\n" for line in block.split(b"\n")[:-1]), first):  # on \n alone, as the lines are counted
        why = _record_problem(raw)
        if isinstance(why, Record):
            if not run:
                run_at = i
            run.append(why)
            continue
        if run:
            yield run_at, run
            run = []
        pointer, message, is_schema = why
        if is_schema and schema_errors is not None:
            schema_errors.append((i, pointer, message))
        elif errors is not None:
            errors.append((i, f"{pointer or '/'}: {message}" if is_schema else message))
    if run:
        yield run_at, run


def _record_problem(raw: bytes) -> Record | tuple[str, str, bool]:
    """The line's record, or (pointer, message, is_schema): what is wrong with it."""
    try:
        rec = _DECODER.decode(raw)
    except msgspec.DecodeError as e:  # ValidationError included: the slow path says which it is
        why = _not_json(raw)
        if why is not None:
            return "", why, False
        pointer, message = error_pointer(e)
        return pointer, message, True
    broken = rec.broken_rule()
    if broken is None:
        return rec
    return broken[0], broken[1], True


def _not_json(raw: bytes) -> str | None:
    """Why a line that did not decode as a `Record` is not JSON within the evidence limits at
    all (`io.loads`: nesting, digits, NaN), or None when it is JSON (then it is a record that
    breaks its type). Only lines that failed pay for this second look."""
    import json

    from soakspec.evidence.io import loads

    if not raw.strip():
        return "empty line"
    try:
        loads(raw.decode("utf-8"))
    except UnicodeDecodeError:
        return "not UTF-8"
    except json.JSONDecodeError as e:
        return f"invalid JSON: {e.msg} (column {e.colno})"
    except (RecursionError, ValueError) as e:
        return f"JSON beyond the decoder's limits: {str(e)[:120]}"
    return None


def _guarded(lines, errors):
    """`lines`, ending (with the reason in `errors`) where the file stops being gzip or JSONL."""
    from soakspec.evidence.io import EvidenceFormatError

    try:
        yield from lines
    except EvidenceFormatError as e:
        if errors is not None:
            errors.append((e.line, str(e).split(": ", 2)[-1]))
