"""Prompt files: the named formats a workload's `prompt_file` may be in, read once by `check`.

Formats (`prompt_format = ...`, or detected from the file's first non-blank character):

  - `text`: one prompt per non-empty line (the line, without its line break);
  - `jsonl`: one JSON object per line (or a JSON array of them) with a string `prompt` or
    `text`, or OpenAI chat `messages` (a list of `{role, content}` with a non-empty `user` one;
    only for `endpoint = chat`);
  - `sharegpt`: a JSON array, or JSONL, of objects with `conversations`, a list of
    `{from, value}` turns; the prompt is the first `human`/`user` turn (after an optional
    `system` turn, which chat requests send too), its answer the next `gpt`/`assistant` turn.
    A record with no such turn (an empty conversation, or one that starts with another
    speaker or an empty human turn; whitespace alone is empty, in every format) is skipped and counted (`Parsed.skipped`: `check` warns,
    W510); a file with no usable record is an error.

Detection, when `prompt_format` is not set: a file whose first non-blank character is `[` is a
JSON array, `{` is JSONL — either ShareGPT when its first record has `conversations`, else
`prompt`/`text`/`messages` records (a JSON array of those is read as `jsonl`); anything else
is text. A file is never guessed line by line: a pretty-printed JSON object in a
JSONL file is an error at its first line, and a text file that starts with `{` or `[` needs
`prompt_format = text`.

Output lengths (opt-in, `max_tokens_from_file = true`): a record's integer `max_tokens`,
`output_len` or `output_tokens`, or for ShareGPT the answer's length in whitespace-separated
words (no tokenizer is needed; a real server's tokenizer counts more tokens than words).

Every problem is a `DatasetError` with the 1-based line and column in the file: a record's
problem is where the record starts, so each record of a one-line JSON array (`json.dumps`)
keeps its own place, and its own identity: records are kept in order, whatever the layout.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from soakspec.diagnostics import line_col
from soakspec.lang.datafile import BEYOND_DECODER, MAX_FILE_BYTES, DataFileError, beyond_decoder, read_text
from soakspec.lang.replay import MAX_LENGTH  # tokens of one request, as for a replayed trace's lengths

__all__ = ["FORMATS", "MAX_FILE_BYTES", "MAX_PROMPTS", "DatasetError", "Parsed", "parse_dataset", "read_dataset"]

FORMATS = ("text", "jsonl", "sharegpt")
MAX_PROMPTS = 1_000_000
LENGTH_FIELDS = ("max_tokens", "output_len", "output_tokens")
HUMAN = ("human", "user")
ANSWER = ("gpt", "assistant", "chatgpt", "bing", "bard", "model")

Messages = tuple[tuple[str, str], ...]
Where = tuple[int, int]  # 1-based line and column where a record starts (a one-line array's records share line 1)
Prompt = str | Messages


class DatasetError(DataFileError):
    pass


@dataclasses.dataclass(frozen=True)
class Parsed:
    format: str
    sha256: str
    prompts: tuple[Prompt, ...]
    output_lens: tuple[int | None, ...]  # per prompt, when the record gives one
    conversations: tuple[Messages, ...] = ()  # every record's whole conversation (multi-turn chat)
    skipped: int = 0  # ShareGPT records with no human turn to send, left out
    first_skipped: Where | None = None  # where the first of them starts


def read_dataset(path: str, fmt: str | None, *, chat: bool, lengths: bool, turns: bool = False) -> Parsed:
    """Read and parse a prompt file (bounded: MAX_FILE_BYTES; never a FIFO or a directory)."""
    text, sha256 = read_text(path, DatasetError)
    return parse_dataset(text, fmt, chat=chat, lengths=lengths, turns=turns, sha256=sha256)


def parse_dataset(text: str, fmt: str | None, *, chat: bool, lengths: bool, turns: bool = False, sha256: str = "") -> Parsed:
    """`turns`: also keep every record's whole conversation (multi-turn chat)."""
    text = text.removeprefix("\ufeff")
    stripped = text.lstrip()
    if fmt is None:
        fmt = _detect(text, stripped)
    if fmt == "text":
        items: list[tuple[Where, Any]] = [((i, 1), line) for i, line in enumerate(text.split("\n"), 1) if line.strip()]
    else:  # each record with where it starts: one parse, so a record's prompt and conversation are the same record's
        items = _json_array(text, detected=fmt == "array") if stripped.startswith("[") else _jsonl(text)
        if fmt == "array":  # detected: ShareGPT when the first record has conversations, else prompt/text/messages
            fmt = "sharegpt" if items and isinstance(items[0][1], dict) and "conversations" in items[0][1] else "jsonl"
    records: list[tuple[Where, tuple[Prompt, int | None], Any]] = []
    skipped: list[Where] = []
    for at, obj in items:
        got = _text_line(obj) if fmt == "text" else _record(obj, at, fmt, chat, lengths)
        if got is None:
            skipped.append(at)
        else:
            records.append((at, (_sendable(got[0], at), got[1]), obj))
    if not records and skipped:
        raise DatasetError(f"has no usable ShareGPT record: none of its {len(skipped):,} records has a human turn to send "
                           "(each conversation is empty or does not start with a non-empty human turn, "
                           "after an optional system turn)", *skipped[0])  # fmt: skip
    if not records:
        raise DatasetError("has no prompts" + (f" ({fmt})" if fmt in FORMATS else ""))
    if len(records) > MAX_PROMPTS:
        raise DatasetError(f"has more than {MAX_PROMPTS:,} prompts", *records[MAX_PROMPTS][0])
    prompts = tuple(r[1][0] for r in records)
    convs: tuple[Messages, ...] = ()
    if turns:
        if fmt == "text":
            raise DatasetError("multi_turn needs conversations: a sharegpt file or jsonl 'messages' records, not text")
        convs = tuple(_sendable(_conversation(obj, at), at) for at, _, obj in records)
    return Parsed(fmt, sha256, prompts, tuple(r[1][1] for r in records), convs, len(skipped), skipped[0] if skipped else None)


def _sendable(prompt: Prompt, at: Where) -> Prompt:
    """`prompt` as it is, if it can be sent: a request body is UTF-8, and a lone UTF-16
    surrogate (a JSON escape such as "\\ud800", half of a character: a dump that cut a pair in
    two) has no UTF-8 form. Found here, it is the record's error; missed, the runner's encode
    would fail after the servers started."""
    for text in (prompt,) if isinstance(prompt, str) else (t for turn in prompt for t in turn):
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as e:
            raise DatasetError(f"has a prompt with a lone UTF-16 surrogate, '\\u{ord(text[e.start]):04x}' at character {e.start + 1}: "
                               "half of a character, with no UTF-8 form, it cannot be sent in a request", *at) from None  # fmt: skip
    return prompt


def _conversation(obj: dict, at: Where) -> Messages:
    """A record as chat turns: ShareGPT's (`human` -> user, `gpt` -> assistant), `messages` as
    they are, a prompt/text as one user turn."""
    if "conversations" in obj:
        roles = {"system": "system", **{h: "user" for h in HUMAN}, **{a: "assistant" for a in ANSWER}}
        turns = []
        for t in obj["conversations"]:
            role = roles.get(t["from"].lower())
            if role is None:
                raise DatasetError(f"unknown ShareGPT speaker '{t['from']}' (human, gpt or system)", *at)
            turns.append((role, t["value"]))
        return tuple(turns)
    if "messages" in obj:
        return _messages(obj["messages"], at)
    return (("user", obj.get("prompt") or obj.get("text")),)


def _detect(text: str, stripped: str) -> str:
    if stripped.startswith("["):
        return "array"
    if stripped.startswith("{"):
        first = stripped.split("\n", 1)[0]
        try:
            obj = json.loads(first)
        except json.JSONDecodeError:
            line = text[: len(text) - len(stripped)].count("\n") + 1
            raise DatasetError(
                "starts with '{' but its first line is not a whole JSON object: JSONL needs one object per line "
                "(a pretty-printed JSON document is not JSONL); set prompt_format = text for plain text",
                line,
            ) from None
        except BEYOND_DECODER as e:
            raise DatasetError(beyond_decoder(e), *line_col(text, len(text) - len(stripped))) from None
        return "sharegpt" if isinstance(obj, dict) and "conversations" in obj else "jsonl"
    return "text"


def _text_line(line: str) -> tuple[Prompt, int | None]:
    return line.rstrip("\r"), None


def _json_array(text: str, detected: bool = False) -> list[tuple[Where, Any]]:
    """The items of a JSON array, in order, each with the line and column it starts at.
    `detected`: the format was guessed from the leading '[' (`[INST] ...` text starts so too)."""
    text_hint = "; a text file that starts with '[' needs prompt_format = text" if detected else ""
    dec = json.JSONDecoder()
    pos = len(text) - len(text.lstrip()) + 1  # after '['
    out: list[tuple[Where, Any]] = []
    n = len(text)

    def skip(p: int) -> int:
        while p < n and text[p] in " \t\r\n":
            p += 1
        return p

    line, line_start, counted = 1, 0, 0  # the line breaks before `counted`, and where its line starts

    def where(p: int) -> Where:
        """line_col(text, p), counting on from the last record's place: each record's line
        counted from the file's start made a large pretty-printed array quadratic."""
        nonlocal line, line_start, counted
        if p < counted:
            return line_col(text, p)
        breaks = text.count("\n", counted, p)
        if breaks:
            line, line_start = line + breaks, text.rfind("\n", counted, p) + 1
        counted = p
        return line, p - line_start + 1

    pos = skip(pos)
    if pos < n and text[pos] == "]":
        return out
    while True:
        try:
            obj, end = dec.raw_decode(text, pos)
        except json.JSONDecodeError as e:
            raise DatasetError(f"is not valid JSON: {e.msg}{text_hint}", *where(e.pos)) from None
        except BEYOND_DECODER as e:  # reported where the record starts: the decoder gives no position
            raise DatasetError(beyond_decoder(e), *where(pos)) from None
        out.append((where(pos), obj))
        pos = skip(end)
        if pos < n and text[pos] == ",":
            pos = skip(pos + 1)
            continue
        if pos < n and text[pos] == "]":
            if skip(pos + 1) != n:
                raise DatasetError("has text after the JSON array", *where(skip(pos + 1)))
            return out
        raise DatasetError(f"is not valid JSON: expected ',' or ']' in the array{text_hint}", *where(min(pos, n)))


def _jsonl(text: str) -> list[tuple[Where, Any]]:
    out = []
    for i, line in enumerate(text.split("\n"), 1):
        if not line.strip():
            continue
        try:
            out.append(((i, len(line) - len(line.lstrip()) + 1), json.loads(line)))
        except json.JSONDecodeError as e:
            raise DatasetError(f"is not one JSON object per line (JSONL): {e.msg}", i, e.colno) from None
        except BEYOND_DECODER as e:
            raise DatasetError(beyond_decoder(e), i, len(line) - len(line.lstrip()) + 1) from None
    return out


def _record(obj: Any, at: Where, fmt: str, chat: bool, lengths: bool) -> tuple[Prompt, int | None] | None:
    """A record's prompt and output length; None for a ShareGPT record with no human turn to send."""
    if not isinstance(obj, dict):
        raise DatasetError(f"each record must be a JSON object, not {type(obj).__name__}", *at)
    if fmt == "sharegpt":
        got = _sharegpt(obj, at, chat)
        if got is None:
            return None
        prompt, answer_len = got
    else:
        prompt, answer_len = _jsonl_prompt(obj, at, chat), None
    if not lengths:
        return prompt, None
    for name in LENGTH_FIELDS:
        v = obj.get(name)
        if v is not None:
            if not isinstance(v, int) or isinstance(v, bool) or not 1 <= v <= MAX_LENGTH:
                raise DatasetError(f"'{name}' must be a whole number of tokens, from 1 to {MAX_LENGTH:,}", *at)
            return prompt, v
    if answer_len is None:
        want = "an answer turn or " if fmt == "sharegpt" else ""
        raise DatasetError(f"max_tokens_from_file = true, but this record has {want}no {'/'.join(LENGTH_FIELDS)}", *at)
    return prompt, answer_len


def _jsonl_prompt(obj: dict, at: Where, chat: bool) -> Prompt:
    for name in ("prompt", "text"):
        if name in obj:
            if not isinstance(obj[name], str) or not obj[name].strip():  # as a text file's blank line is no prompt
                raise DatasetError(f"'{name}' must be a non-empty string (not only whitespace)", *at)
            return obj[name]
    if "messages" in obj:
        if not chat:
            raise DatasetError("'messages' records are chat messages: they need endpoint = chat", *at)
        return _messages(obj["messages"], at)
    if "conversations" in obj:
        raise DatasetError("this record is ShareGPT ('conversations'): set prompt_format = sharegpt", *at)
    raise DatasetError("a JSONL record needs a 'prompt', 'text' or 'messages' field", *at)


def _messages(msgs: Any, at: Where) -> Messages:
    if not isinstance(msgs, list) or not msgs:
        raise DatasetError("'messages' must be a non-empty list", *at)
    out = []
    for m in msgs:
        if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
            raise DatasetError("each message needs a string 'role' and 'content'", *at)
        out.append((m["role"], m["content"]))
    if not any(role == "user" and content.strip() for role, content in out):  # as a prompt must be non-empty
        raise DatasetError("'messages' needs a non-empty 'user' message: a request with none has nothing to answer", *at)
    return tuple(out)


def _sharegpt(obj: dict, at: Where, chat: bool) -> tuple[Prompt, int | None] | None:
    """None (the record is skipped, and counted) when its conversation is empty or does not start
    with a non-empty human turn after an optional system turn, as real ShareGPT dumps have; a
    record that is not ShareGPT at all (no list of {from, value} turns) is an error."""
    conv = obj.get("conversations")
    if not isinstance(conv, list):
        raise DatasetError("a ShareGPT record needs 'conversations', a list of {from, value} turns", *at)
    turns = []
    for t in conv:
        if not isinstance(t, dict) or not isinstance(t.get("from"), str) or not isinstance(t.get("value"), str):
            raise DatasetError("each ShareGPT turn needs a string 'from' and 'value'", *at)
        turns.append((t["from"].lower(), t["value"]))
    i = 1 if turns and turns[0][0] == "system" else 0
    if i >= len(turns) or turns[i][0] not in HUMAN or not turns[i][1].strip():
        return None
    answer = turns[i + 1] if i + 1 < len(turns) and turns[i + 1][0] in ANSWER else None
    answer_len = max(1, len(answer[1].split())) if answer else None
    if chat and i == 1:
        return (("system", turns[0][1]), ("user", turns[1][1])), answer_len
    return turns[i][1], answer_len
