"""Trace files for `load { mode = replay  trace = "..." }`, read once by `check`.

Formats (`trace_format = ...`):

  - `mooncake` (the default): JSONL as Mooncake's traces publish it, one request per line:
    `{"timestamp": MS, "input_length": N, "output_length": M, "hash_ids": [...]}` -- the arrival
    time in milliseconds (any origin: offsets are taken from the first line's), the prompt and
    output lengths in tokens, and `hash_ids` (optional: a list of integers >= 0), the prompt's
    blocks in order: requests that list the same leading ids share that prefix (each id names a
    block of 512 tokens in Mooncake's traces; `hash_block` in the spec). Any other field is ignored.

Timestamps must not go backwards (a trace is in arrival order). Reading the file executes
nothing. Every problem is a `TraceFileError` with the 1-based line and column in the file.
"""

from __future__ import annotations

import dataclasses
import json
import math

from soakspec.lang.datafile import BEYOND_DECODER, MAX_FILE_BYTES, DataFileError, beyond_decoder, read_text

__all__ = ["FORMATS", "MAX_FILE_BYTES", "MAX_REQUESTS", "MOONCAKE_BLOCK", "REPLAY_TAIL_S", "TraceFile", "TraceFileError", "blocks_sent",
           "earlier_replay_rest", "parse_trace", "replay_rest",
           "read_trace", "sharing"]

FORMATS = ("mooncake",)
MAX_REQUESTS = 1_000_000
MAX_LENGTH = 10_000_000  # tokens of one request: larger is a corrupt line
MOONCAKE_BLOCK = 512  # tokens a hash id names in Mooncake's traces (the default `hash_block`)
MAX_HASH_ID = 2**63 - 1  # a block's id: a non-negative 64-bit integer (Mooncake's are small)


class TraceFileError(DataFileError):
    pass


@dataclasses.dataclass(frozen=True)
class TraceFile:
    format: str
    sha256: str
    offsets_s: tuple[float, ...]  # from the first request's arrival
    input_lens: tuple[int, ...]
    output_lens: tuple[int, ...]
    # per request, its `hash_ids` (() for a line without them); every id is one int object
    # however often it repeats, so a 10^6-line trace holds a pointer per id, not an int
    hash_ids: tuple[tuple[int, ...], ...] = dataclasses.field(default=(), repr=False)


def read_trace(path: str, fmt: str = "mooncake") -> TraceFile:
    """Read and parse a trace file (bounded: MAX_FILE_BYTES; never a FIFO or a directory)."""
    text, sha256 = read_text(path, TraceFileError)
    return parse_trace(text, fmt, sha256=sha256)


def parse_trace(text: str, fmt: str = "mooncake", *, sha256: str = "") -> TraceFile:
    if fmt not in FORMATS:
        raise TraceFileError(f"has an unknown format {fmt!r} (one of {', '.join(FORMATS)})")
    stamps: list[float] = []
    ins: list[int] = []
    outs: list[int] = []
    hashes: list[tuple[int, ...]] = []
    known: dict[int, int] = {}  # each id's one int object
    # a leading BOM is not part of the trace (as of a prompt file or a spec); lines end at LF (a
    # CR before it is JSON whitespace), never at str.splitlines' U+2028, \x85 or form feed, which
    # a JSON string may hold and an editor does not count as a line
    for n, line in enumerate(text.removeprefix("\ufeff").split("\n"), 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise TraceFileError(f"line {n} is not JSON: {e.msg}", n, e.colno) from None
        except BEYOND_DECODER as e:
            raise TraceFileError(f"line {n} {beyond_decoder(e)}", n) from None
        if not isinstance(obj, dict):
            raise TraceFileError(f"line {n} is not a JSON object (mooncake traces are one object per line)", n)
        ts = obj.get("timestamp")
        # json reads NaN, Infinity and 1e999 as floats: an arrival time none of them can be
        if isinstance(ts, bool) or not isinstance(ts, (int, float)) or not math.isfinite(ts) or ts < 0:
            raise TraceFileError(f"line {n} needs a 'timestamp' (milliseconds, a finite number >= 0)", n)
        if stamps and ts < stamps[-1]:
            raise TraceFileError(f"line {n}'s timestamp {ts:g} ms is before the previous line's ({stamps[-1]:g} ms): a trace is in arrival order", n)
        lens = []
        for key in ("input_length", "output_length"):
            v = obj.get(key)
            if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= MAX_LENGTH:
                raise TraceFileError(f"line {n} needs an integer '{key}' between 1 and {MAX_LENGTH:,}", n)
            lens.append(v)
        ids = obj.get("hash_ids", ())
        if not isinstance(ids, list) and ids != ():
            raise TraceFileError(f"line {n}'s 'hash_ids' is not a list (of integers >= 0, the prompt's blocks)", n)
        for h in ids:
            if isinstance(h, bool) or not isinstance(h, int) or not 0 <= h <= MAX_HASH_ID:
                raise TraceFileError(f"line {n}'s 'hash_ids' holds {json.dumps(h)[:40]}: each is an integer between 0 and 2**63 - 1", n)
        hashes.append(tuple(known.setdefault(h, h) for h in ids))
        stamps.append(float(ts))
        ins.append(lens[0])
        outs.append(lens[1])
        if len(stamps) > MAX_REQUESTS:
            raise TraceFileError(f"has more than {MAX_REQUESTS:,} requests", n)
    if not stamps:
        raise TraceFileError("has no requests")
    first = stamps[0]
    return TraceFile(fmt, sha256, tuple((t - first) / 1000.0 for t in stamps), tuple(ins), tuple(outs), tuple(hashes))


def blocks_sent(input_len: int, ids: tuple[int, ...], block: int) -> int:
    """How many of a request's hash_ids its prompt holds: those that start within its input
    length (the last one partial where the length is not a whole number of blocks)."""
    return min(len(ids), -(-input_len // block))


def sharing(offsets_s, input_lens, hash_ids, block: int, speed: float, until_s: float) -> tuple[int, int, int]:
    """(blocks, distinct blocks, requests listing more ids than their input length holds) of the
    prompts of the requests a replay sends (arrival before `until_s`, its warmup's included): one
    pass, a set of the distinct ids. The last count is a sign of a trace made with smaller blocks
    than `hash_block` (Mooncake lists exactly ceil(input_length / 512) ids)."""
    seen: set[int] = set()
    total = outrun = 0
    for off, n, ids in zip(offsets_s, input_lens, hash_ids):
        if off / speed >= until_s:
            break
        k = blocks_sent(n, ids, block)
        total += k
        outrun += k < len(ids)
        seen.update(ids[:k])
    return total, len(seen), outrun


REPLAY_TAIL_S = 0.001  # past a replay's last arrival, at least: so its last request is sent


def replay_rest(offsets_s: tuple[float, ...], speed: float, warmup: float, bucket: float | None) -> float:
    """A replay's measured window without `duration`: from the warmup to one mean inter-arrival
    gap past the trace's last arrival (the time that request stands for: the window then holds
    the trace's requests at the trace's mean rate), and no further than the end of the bucket
    that holds the last arrival -- so the last bucket is short where the trace ends inside it,
    its rates over its own length, not a whole bucket mostly idle that reads as a rate drop.
    A trace of one instant (one request, or all at one time) keeps one whole bucket."""
    last = offsets_s[-1] / speed
    if len(offsets_s) < 2 or last <= 0:
        rest = last + REPLAY_TAIL_S - warmup
        return math.ceil(rest / bucket - 1e-9) * bucket if bucket else rest
    end = last + max(last / (len(offsets_s) - 1), REPLAY_TAIL_S)
    if bucket:
        k = math.floor((last - warmup) / bucket) + 1
        if warmup + k * bucket <= last:  # a float just short of the edge: the next bucket holds it
            k += 1
        end = min(end, warmup + k * bucket)
    return end - warmup


def earlier_replay_rest(offsets_s: tuple[float, ...], speed: float, warmup: float, bucket: float | None) -> float:
    """The window `replay_rest` replaced (evidence written before it, whose manifest records the
    level's duration by this rule): the trace's span past the warmup, its last arrival included,
    rounded up to whole buckets -- a last bucket mostly idle where the trace ends just inside it.
    Kept so that such evidence, judged with its own spec, is the level that spec then planned
    (judge/validity.py `_ran_duration`)."""
    rest = offsets_s[-1] / speed + REPLAY_TAIL_S - warmup
    return math.ceil(rest / bucket - 1e-9) * bucket if bucket else rest
