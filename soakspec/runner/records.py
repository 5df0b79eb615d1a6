"""One flat record per request: the rows of `requests.jsonl`.

The caller creates a `RequestRecord` with the request's identity (id, backend, workload, level,
bucket, worker and, for open-loop load, the intended start); the client fills in what happened.
`to_json()` is the on-disk schema: exactly the keys in `RECORD_KEYS`, in that order; the runner
writes it as `to_line()` (the same line `dumps_line` makes, in a fraction of the time).

Times are epoch seconds from the run's `RunClock`. Durations are derived, not stored twice:
`ttft = first_token - intended_start`, `latency = end - intended_start` (open-loop load measures
from when the request *should* have been sent, so a late scheduler is charged, not hidden).
`tpot` and `itl` come from token arrival times that the record does not keep, so they are fields.
Durations in the JSON are rounded to 1 µs.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import math
from typing import Any


class Outcome(enum.StrEnum):
    """How a request ended. Exactly one per record.

    COMPLETED    -- HTTP 200, >= 1 completion token (usage or counted text events), `data: [DONE]`,
                    no error anywhere. Its text may be empty (then `empty_text` is true).
    FAILED       -- the server answered but wrongly: status not 200 (except 4xx), an error event
                    or payload, `finish_reason: error`, no `[DONE]`, zero completion tokens
                    although max_tokens > 0, malformed SSE/JSON, an oversized event.
    TIMEOUT      -- the request's absolute deadline passed first.
    REJECTED     -- HTTP 4xx (including 429): the server refused the request.
    DISCONNECTED -- the connection failed (refused, closed, reset) before the response finished.
    """

    COMPLETED = "completed"
    FAILED = "failed"
    TIMEOUT = "timeout"
    REJECTED = "rejected"
    DISCONNECTED = "disconnected"


class TokensSource(enum.StrEnum):
    USAGE = "usage"  # the server's usage.completion_tokens
    COUNTED = "counted"  # no usage anywhere: one token per text chunk


class ItlSource(enum.StrEnum):
    USAGE = "usage"  # per-chunk token counts from cumulative (continuous) usage
    EXACT = "exact"  # final usage equals the number of text chunks: one token per chunk
    ESTIMATED = "estimated"  # final usage spread evenly over the text chunks
    COUNTED = "counted"  # no usage: one token per text chunk


WARMUP_BUCKET = -1
FOLLOW_UP_BUCKET = -2
ERROR_LIMIT = 500  # characters of the first error message that are kept

RECORD_KEYS: tuple[str, ...] = (
    "request_id", "backend", "workload", "level", "concurrency", "rate", "bucket", "worker",
    "intended_start", "start", "first_byte", "first_token", "end",
    "status", "outcome", "error", "finish_reason", "server_id",
    "prompt_tokens", "output_tokens", "tokens_source", "itl_source", "chunks",
    "ttft", "latency", "tpot", "itl", "output_sha256", "output_chars", "empty_text",
    "coalesced", "usage_decreased", "client_delay",
)  # fmt: skip
# Keys a record written before they existed may lack (`from_json` fills in the default).
OPTIONAL_KEYS: frozenset[str] = frozenset({"empty_text", "coalesced", "usage_decreased", "client_delay"})

_DERIVED = frozenset({"ttft", "latency"})


def _round_us(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds, 6)


_str = json.encoder.encode_basestring  # type: ignore[attr-defined]  # a str as json.dumps(ensure_ascii=False) writes it


def _opt_str(v: str | None) -> str:
    return "null" if v is None else _str(v)


def _num(v: float | None) -> str:
    """A number as `json.dumps(allow_nan=False)` writes it (int or float repr)."""
    if v is None:
        return "null"
    if not math.isfinite(v):
        raise ValueError(f"number out of range for JSON: {v!r}")
    return repr(v)


def _us(v: float | None) -> str:
    return _num(_round_us(v))


@dataclasses.dataclass(slots=True)
class RequestRecord:
    """What happened to one request. Mutable while the request runs; written once when done."""

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
    # ITL gaps (of `itl`) that share a read / receive stamp with the previous token: not
    # independent samples (several tokens in one read, or one chunk's gap split k ways)
    coalesced: int = 0
    # the stream's cumulative usage.completion_tokens went down at some point (the judge counts
    # the request as usage_mismatch)
    usage_decreased: bool = False
    # seconds from the arrival stamp of the response's last bytes (`end`) to the client having
    # processed them: a measure of the client, not the server (None: the request did not end
    # with a whole response)
    client_delay: float | None = None

    @property
    def ttft(self) -> float | None:
        """Time to first token, from the intended start."""
        if self.first_token is None or self.intended_start is None:
            return None
        return self.first_token - self.intended_start

    @property
    def latency(self) -> float | None:
        """End-to-end latency, from the intended start."""
        if self.end is None or self.intended_start is None:
            return None
        return self.end - self.intended_start

    def to_json(self) -> dict[str, Any]:
        """The requests.jsonl row: exactly `RECORD_KEYS`, plain JSON types."""
        return {
            "request_id": self.request_id,
            "backend": self.backend,
            "workload": self.workload,
            "level": self.level,
            "concurrency": self.concurrency,
            "rate": self.rate,
            "bucket": self.bucket,
            "worker": self.worker,
            "intended_start": self.intended_start,
            "start": self.start,
            "first_byte": self.first_byte,
            "first_token": self.first_token,
            "end": self.end,
            "status": self.status,
            "outcome": self.outcome.value,
            "error": self.error,
            "finish_reason": self.finish_reason,
            "server_id": self.server_id,
            "prompt_tokens": self.prompt_tokens,
            "output_tokens": self.output_tokens,
            "tokens_source": self.tokens_source.value,
            "itl_source": self.itl_source.value,
            "chunks": self.chunks,
            "ttft": _round_us(self.ttft),
            "latency": _round_us(self.latency),
            "tpot": _round_us(self.tpot),
            "itl": [round(g, 6) for g in self.itl],
            "output_sha256": self.output_sha256,
            "output_chars": self.output_chars,
            "empty_text": self.empty_text,
            "coalesced": self.coalesced,
            "usage_decreased": self.usage_decreased,
            "client_delay": _round_us(self.client_delay),
        }

    def to_line(self) -> bytes:
        """The requests.jsonl line: `dumps_line(self.to_json())` encoded, made in one go.

        The load generator writes one per request, and `json.dumps` of the dict (keys sorted,
        every ITL value rounded and then printed shortest) was a tenth of its CPU. This writes the
        same keys in the same (sorted) order with the same separators; ITL values are printed
        with six decimals ("%.6f": the digits `round(g, 6)` keeps), so every value reads back
        exactly as from `to_json()` (tests/test_records.py), though `0.0` appears as `0.000000`.
        Raises ValueError for a NaN or infinite time, as `dumps_line` does.
        """
        itl = ",".join(["%.6f" % g for g in self.itl])
        if "n" in itl:  # nan, inf
            raise ValueError(f"ITL value out of range for JSON in {self.request_id}")
        return (
            f'{{"backend":{_str(self.backend)},"bucket":{self.bucket!r},"chunks":{self.chunks!r},'
            f'"client_delay":{_us(self.client_delay)},"coalesced":{self.coalesced!r},'
            f'"concurrency":{_num(self.concurrency)},"empty_text":{"true" if self.empty_text else "false"},'
            f'"end":{_num(self.end)},"error":{_opt_str(self.error)},'
            f'"finish_reason":{_opt_str(self.finish_reason)},"first_byte":{_num(self.first_byte)},'
            f'"first_token":{_num(self.first_token)},"intended_start":{_num(self.intended_start)},'
            f'"itl":[{itl}],"itl_source":"{self.itl_source.value}","latency":{_us(self.latency)},'
            f'"level":{self.level!r},"outcome":"{self.outcome.value}","output_chars":{self.output_chars!r},'
            f'"output_sha256":{_opt_str(self.output_sha256)},"output_tokens":{self.output_tokens!r},'
            f'"prompt_tokens":{_num(self.prompt_tokens)},"rate":{_num(self.rate)},'
            f'"request_id":{_str(self.request_id)},"server_id":{_opt_str(self.server_id)},'
            f'"start":{_num(self.start)},"status":{_num(self.status)},'
            f'"tokens_source":"{self.tokens_source.value}","tpot":{_us(self.tpot)},"ttft":{_us(self.ttft)},'
            f'"usage_decreased":{"true" if self.usage_decreased else "false"},'
            f'"worker":{self.worker!r},"workload":{_str(self.workload)}}}\n'
        ).encode()

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> RequestRecord:
        """Read a requests.jsonl row back. `ttft` and `latency` are recomputed from the times."""
        missing = [k for k in RECORD_KEYS if k not in d and k not in OPTIONAL_KEYS]
        extra = [k for k in d if k not in RECORD_KEYS]
        if missing or extra:
            raise ValueError(f"not a request record: missing {missing}, unexpected {extra}")
        fields = {k: v for k, v in d.items() if k not in _DERIVED}
        fields["outcome"] = Outcome(fields["outcome"])
        fields["tokens_source"] = TokensSource(fields["tokens_source"])
        fields["itl_source"] = ItlSource(fields["itl_source"])
        fields["itl"] = list(fields["itl"])
        return cls(**fields)
