"""The OpenAI-compatible wire format, as vLLM's server emits it: pure functions, no I/O.

Requests: `parse_request(endpoint, body, config)` validates a `/v1/completions` or
`/v1/chat/completions` body into an `InferenceRequest`, or raises `ApiError` (HTTP 400, or 404
for an unknown model as vLLM does). Prompt tokens = whitespace-separated words of the prompt
(chat: of all message contents); a prompt given as token ids counts its ids. Those words or ids,
in order, are the request's `prompt_units`, the tokens the prefix cache blocks (`model.PrefixCache`).

Responses (shapes follow vLLM's `serving_completion.py` / `serving_chat.py`, serialised compactly):
* errors: `{"object":"error","message":..,"type":..,"param":..,"code":status}`;
* stream chunks: `data: {json}\\n\\n`, the last token chunk carries `finish_reason`; then, with
  `stream_options.include_usage`, a chunk with `"choices": []` and `usage`; then `data: [DONE]\\n\\n`.
  With `stream_options.continuous_usage_stats` (and `include_usage`, as vLLM requires) every
  chunk carries the cumulative `usage`.
  Chat streams begin with a `{"role":"assistant","content":""}` delta, sent with the first token.
* an engine failure mid-stream (vLLM's generator catches it): `data: {"error": {<error body>}}\\n\\n`
  followed by `data: [DONE]\\n\\n` -- the HTTP status stays 200.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import time
from collections.abc import Mapping, Sequence
from typing import Any

from soakspec.sim.config import SimConfig

__all__ = [
    "DONE",
    "ApiError",
    "InferenceRequest",
    "StreamRenderer",
    "error_body",
    "full_response",
    "models_body",
    "parse_request",
    "render_metrics",
]

DONE = b"data: [DONE]\n\n"
ENGINE_DEAD_MESSAGE = "EngineCore encountered an issue. See stack trace (above) for the root cause."
_STATUS_TYPES = {
    400: "BadRequestError",
    404: "NotFoundError",
    413: "BadRequestError",
    429: "TooManyRequestsError",
    500: "InternalServerError",
    503: "ServiceUnavailableError",
}


def _dumps(obj: object) -> str:
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False)


def _is_plain(text: str) -> bool:
    """Printable ASCII without quotes or backslashes (every simulated token): JSON needs no escaping."""
    return text.isascii() and text.isprintable() and '"' not in text and "\\" not in text


def _json_str(text: str) -> str:
    return '"' + text + '"' if _is_plain(text) else _dumps(text)


class ApiError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None, type_: str | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.type = type_ or _STATUS_TYPES.get(status, "BadRequestError")

    def body(self) -> dict[str, Any]:
        return error_body(self.status, self.message, self.param, self.type)


def error_body(status: int, message: str, param: str | None = None, type_: str | None = None) -> dict[str, Any]:
    return {
        "object": "error",
        "message": message,
        "type": type_ or _STATUS_TYPES.get(status, "BadRequestError"),
        "param": param,
        "code": status,
    }


@dataclasses.dataclass(frozen=True)
class InferenceRequest:
    endpoint: str  # "completions" | "chat"
    model: str
    prompt_tokens: int
    max_tokens: int
    stream: bool
    include_usage: bool
    continuous_usage: bool
    ignore_eos: bool
    request_id: str | None  # the body's `request_id`, if any
    # what was asked, for the trace: the prompt (chat: the last message's text content), its
    # first PROMPT_HEAD characters and its sha256, and the number of chat messages
    prompt_head: str = ""
    prompt_sha256: str = ""
    messages: int | None = None
    # the prompt's tokens as counted (words, or the token ids given): the prefix cache's blocks
    prompt_units: tuple[str, ...] | tuple[int, ...] = ()


PROMPT_HEAD = 64


def _prompt_text(endpoint: str, body: Mapping[str, Any]) -> str:
    if endpoint == "chat":
        content = body["messages"][-1].get("content")
        if isinstance(content, list):
            return " ".join(p["text"] for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
        return content if isinstance(content, str) else ""
    prompt = body["prompt"]
    if isinstance(prompt, list):
        return prompt[0] if len(prompt) == 1 and isinstance(prompt[0], str) else " ".join(map(str, prompt))
    return prompt


def _completion_prompt_tokens(prompt: object) -> tuple[str, ...] | tuple[int, ...]:
    """The prompt's tokens: its words, or the token ids it is."""
    if isinstance(prompt, str):
        return tuple(prompt.split())
    if isinstance(prompt, list) and prompt:
        if all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
            return tuple(prompt)  # token ids
        if len(prompt) == 1 and isinstance(prompt[0], str):
            return tuple(prompt[0].split())
        if all(isinstance(p, (str, list)) for p in prompt):
            raise ApiError(400, "the simulator serves one prompt per request (batched prompts are not supported)",
                           "prompt")
    raise ApiError(400, "prompt must be a string, a list of token ids, or a list of one string", "prompt")


def _chat_prompt_tokens(messages: object) -> tuple[str, ...]:
    """The words of every message's text, in order."""
    if not isinstance(messages, list) or not messages:
        raise ApiError(400, "messages must be a non-empty list", "messages")
    total: list[str] = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise ApiError(400, f"messages[{i}] must be an object with a string 'role'", "messages")
        content = m.get("content")
        if content is None:
            continue
        if isinstance(content, str):
            total += content.split()
        elif isinstance(content, list):
            for part in content:
                if isinstance(part, dict) and isinstance(part.get("text"), str):
                    total += part["text"].split()
                elif not isinstance(part, dict):
                    raise ApiError(400, f"messages[{i}].content parts must be objects", "messages")
        else:
            raise ApiError(400, f"messages[{i}].content must be a string or a list of parts", "messages")
    return tuple(total)


def tokenize_body(raw: bytes, config: SimConfig) -> dict[str, Any]:
    """vLLM's `/tokenize`: `{prompt}` or `{messages}` -> `{count, max_model_len, tokens}`, counted
    exactly as the simulator's usage counts prompt tokens (whitespace-separated words; the
    simulator's tokenizer adds no special tokens). The ids are the words' positions."""
    try:
        body = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ApiError(400, f"malformed JSON body: {e}") from None
    if not isinstance(body, dict):
        raise ApiError(400, "the request body must be a JSON object")
    if "messages" in body:
        count = len(_chat_prompt_tokens(body["messages"]))
    elif "prompt" in body:
        count = len(_completion_prompt_tokens(body["prompt"]))
    else:
        raise ApiError(400, "Either prompt or messages must be provided.", "prompt")
    return {"count": count, "max_model_len": config.max_model_len, "tokens": list(range(count))}


def _bool(body: Mapping[str, Any], name: str, default: bool = False) -> bool:
    value = body.get(name, default)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise ApiError(400, f"{name} must be a boolean", name)
    return value


def parse_request(endpoint: str, raw: bytes, config: SimConfig) -> InferenceRequest:
    """Validate a request body; raise ApiError with vLLM's status and an OpenAI error body."""
    try:
        body = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ApiError(400, f"malformed JSON body: {e}") from None
    if not isinstance(body, dict):
        raise ApiError(400, "the request body must be a JSON object")

    model = body.get("model")
    if model is None:
        model = config.model
    elif not isinstance(model, str) or model not in config.model_names:
        raise ApiError(404, f"The model `{model}` does not exist.", "model", "NotFoundError")

    if endpoint == "chat":
        if "messages" not in body:
            raise ApiError(400, "Field required: messages", "messages")
        units = _chat_prompt_tokens(body["messages"])
        max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
        max_name = "max_completion_tokens" if "max_completion_tokens" in body else "max_tokens"
    else:
        if body.get("prompt") is None:
            raise ApiError(400, "Either prompt or prompt_embeds must be provided and non-empty.", "prompt")
        units = _completion_prompt_tokens(body["prompt"])
        max_tokens = body.get("max_tokens")
        max_name = "max_tokens"
    prompt_tokens = len(units)

    if max_tokens is None:
        max_tokens = min(config.default_max_tokens, max(config.max_model_len - prompt_tokens, 1))
    elif isinstance(max_tokens, bool) or not isinstance(max_tokens, int):
        raise ApiError(400, f"{max_name} must be an integer, got {max_tokens!r}", max_name)
    elif max_tokens < 1:
        raise ApiError(400, f"{max_name} must be at least 1, got {max_tokens}.", max_name)
    if prompt_tokens + max_tokens > config.max_model_len:
        raise ApiError(
            400,
            f"This model's maximum context length is {config.max_model_len} tokens. However, you requested "
            f"{prompt_tokens + max_tokens} tokens ({prompt_tokens} in the messages, {max_tokens} in the "
            "completion). Please reduce the length of the messages or completion.",
            max_name,
        )

    n = body.get("n", 1)
    if n not in (None, 1):
        raise ApiError(400, "the simulator supports n=1 only", "n")

    stream = _bool(body, "stream")
    options = body.get("stream_options")
    include_usage = continuous = False
    if options is not None:
        if not stream:
            raise ApiError(400, "Stream options can only be defined when `stream=True`.", "stream_options")
        if not isinstance(options, dict):
            raise ApiError(400, "stream_options must be an object", "stream_options")
        include_usage = _bool(options, "include_usage")
        continuous = include_usage and _bool(options, "continuous_usage_stats")  # vLLM: only with include_usage

    request_id = body.get("request_id")
    if request_id is not None and not isinstance(request_id, str):
        raise ApiError(400, "request_id must be a string", "request_id")

    return InferenceRequest(
        endpoint=endpoint,
        model=model,
        prompt_tokens=prompt_tokens,
        max_tokens=max_tokens,
        stream=stream,
        include_usage=include_usage,
        continuous_usage=continuous,
        ignore_eos=_bool(body, "ignore_eos"),
        request_id=request_id or None,
        prompt_head=(text := _prompt_text(endpoint, body))[:PROMPT_HEAD],
        prompt_sha256=hashlib.sha256(text.encode("utf-8", "replace")).hexdigest(),
        messages=len(body["messages"]) if endpoint == "chat" else None,
        prompt_units=units,
    )


def _usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0) -> dict[str, Any]:
    """OpenAI usage; with `cached_tokens` (vLLM gives them only with --enable-prompt-tokens-details,
    and only when there are some), `prompt_tokens_details.cached_tokens` too."""
    usage: dict[str, Any] = {
        "prompt_tokens": prompt_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "completion_tokens": completion_tokens,
    }
    if cached_tokens:
        usage["prompt_tokens_details"] = {"cached_tokens": cached_tokens}
    return usage


class StreamRenderer:
    """SSE events of one streamed response. Only the token text and counts change between chunks,
    so the JSON around them is built once (the zero-latency benchmark writes millions of these)."""

    def __init__(self, req: InferenceRequest, response_id: str, model: str, created: int | None = None):
        self.req = req
        self.chat = req.endpoint == "chat"
        created = int(time.time()) if created is None else created
        obj = "chat.completion.chunk" if self.chat else "text_completion"
        self._head = f'data: {{"id":{_dumps(response_id)},"object":"{obj}","created":{created},"model":{_dumps(model)},'
        if self.chat:
            self._choice = '"choices":[{"index":0,"delta":{"content":'
            self._tail_open = '},"logprobs":null,"finish_reason":'
        else:
            self._choice = '"choices":[{"index":0,"text":'
            self._tail_open = ',"logprobs":null,"finish_reason":'

    def _usage_field(self, completion_tokens: int) -> str:
        if self.req.continuous_usage:
            return ',"usage":' + _dumps(_usage(self.req.prompt_tokens, completion_tokens))
        return "" if self.chat else ',"usage":null'

    def role_event(self) -> bytes:
        """Chat only: the first chunk, announcing the assistant role."""
        return (
            self._head + '"choices":[{"index":0,"delta":{"role":"assistant","content":""},'
            '"logprobs":null,"finish_reason":null}]' + self._usage_field(0) + "}\n\n"
        ).encode()

    def token_event(self, text: str, completion_tokens: int, finish_reason: str | None) -> bytes:
        return self.token_events((text,), (completion_tokens,), finish_reason)

    def token_events(self, texts: Sequence[str], ends: Sequence[int], finish_reason: str | None) -> bytes:
        """Consecutive token events: `ends[i]` = completion tokens once event i is sent;
        `finish_reason` goes on the last one (None while the stream goes on)."""
        pre = self._head + self._choice
        post = self._tail_open + 'null,"stop_reason":null}]'
        n_plain = len(texts) - (finish_reason is not None)  # events without a finish_reason
        if n_plain <= 0:
            out = ""
        elif self.req.continuous_usage:
            out = "".join(
                pre + _json_str(t) + post + self._usage_field(e) + "}\n\n" for t, e in zip(texts[:n_plain], ends)
            )
        else:
            post += self._usage_field(0) + "}\n\n"
            plain = texts[:n_plain]
            if _is_plain("".join(plain)):  # nothing to escape: the whole run is one join
                out = pre + '"' + ('"' + post + pre + '"').join(plain) + '"' + post
            else:
                out = "".join(pre + _json_str(t) + post for t in plain)
        if finish_reason is not None and texts:
            out += (
                pre + _json_str(texts[-1]) + self._tail_open + f'"{finish_reason}","stop_reason":null}}]'
                + self._usage_field(ends[-1]) + "}\n\n"
            )
        return out.encode()

    def usage_event(self, completion_tokens: int, cached_tokens: int = 0) -> bytes:
        """The final usage chunk (`stream_options.include_usage`); `cached_tokens`: as `_usage`."""
        usage = _usage(self.req.prompt_tokens, completion_tokens, cached_tokens)
        return (self._head + '"choices":[],"usage":' + _dumps(usage) + "}\n\n").encode()

    @staticmethod
    def error_event(message: str = ENGINE_DEAD_MESSAGE, status: int = 500) -> bytes:
        return ("data: " + _dumps({"error": error_body(status, message)}) + "\n\n").encode()


def full_response(
    req: InferenceRequest, response_id: str, model: str, text: str, completion_tokens: int, finish_reason: str,
    created: int | None = None, cached_tokens: int = 0,
) -> dict[str, Any]:
    """The non-streaming response body; `cached_tokens`: as `_usage`."""
    created = int(time.time()) if created is None else created
    usage = _usage(req.prompt_tokens, completion_tokens, cached_tokens)
    if req.endpoint == "chat":
        return {
            "id": response_id,
            "object": "chat.completion",
            "created": created,
            "model": model,
            "choices": [{
                "index": 0,
                "message": {"role": "assistant", "content": text, "tool_calls": []},
                "logprobs": None,
                "finish_reason": finish_reason,
                "stop_reason": None,
            }],
            "usage": usage,
            "prompt_logprobs": None,
        }
    return {
        "id": response_id,
        "object": "text_completion",
        "created": created,
        "model": model,
        "choices": [{
            "index": 0,
            "text": text,
            "logprobs": None,
            "finish_reason": finish_reason,
            "stop_reason": None,
            "prompt_logprobs": None,
        }],
        "usage": usage,
    }


def models_body(config: SimConfig, created: int) -> dict[str, Any]:
    return {
        "object": "list",
        "data": [
            {
                "id": name,
                "object": "model",
                "created": created,
                "owned_by": "vllm",
                "root": config.model,
                "parent": None,
                "max_model_len": config.max_model_len,
            }
            for name in config.model_names
        ],
    }


def render_metrics(
    model: str, running: int, waiting: int, success: Mapping[str, int], failure: Mapping[str, int],
    prompt_tokens: int, generation_tokens: int, memory_bytes: float,
    *, slots: int | None = None, ttft: Any = None, prefix_cache: tuple[int, int] = (0, 0),
) -> str:
    """Prometheus text exposition. vLLM's names where vLLM has the metric; `sim_` otherwise.
    `prefix_cache` (queried tokens, cached tokens found) gives vllm:prefix_cache_queries_total and
    vllm:prefix_cache_hits_total (vLLM exports them with caching off too, at 0).
    `slots` (the decode slots) gives vllm:kv_cache_usage_perc as the share of them running;
    `ttft` (a `model.Histogram`) gives vllm:time_to_first_token_seconds; the simulator never
    preempts, so vllm:num_preemptions_total stays 0."""
    lbl = f'model_name="{model}"'
    lines = [
        "# HELP vllm:num_requests_running Number of requests in model execution batches.",
        "# TYPE vllm:num_requests_running gauge",
        f"vllm:num_requests_running{{{lbl}}} {float(running)}",
        "# HELP vllm:num_requests_waiting Number of requests waiting to be processed.",
        "# TYPE vllm:num_requests_waiting gauge",
        f"vllm:num_requests_waiting{{{lbl}}} {float(waiting)}",
        "# HELP vllm:request_success_total Count of successfully processed requests.",
        "# TYPE vllm:request_success_total counter",
    ]
    for reason in sorted({"stop", "length", *success}):
        lines.append(f'vllm:request_success_total{{finished_reason="{reason}",{lbl}}} {float(success.get(reason, 0))}')
    lines += [
        "# HELP sim_request_failure_total Requests that did not complete, by terminal reason.",
        "# TYPE sim_request_failure_total counter",
    ]
    for reason in sorted({"cancelled", "disconnected", "error", "rejected", *failure}):
        lines.append(f'sim_request_failure_total{{reason="{reason}",{lbl}}} {float(failure.get(reason, 0))}')
    lines += [
        "# HELP vllm:prompt_tokens_total Number of prefill tokens processed.",
        "# TYPE vllm:prompt_tokens_total counter",
        f"vllm:prompt_tokens_total{{{lbl}}} {float(prompt_tokens)}",
        "# HELP vllm:generation_tokens_total Number of generation tokens processed.",
        "# TYPE vllm:generation_tokens_total counter",
        f"vllm:generation_tokens_total{{{lbl}}} {float(generation_tokens)}",
        "# HELP vllm:num_preemptions_total Cumulative number of preemption from the engine.",
        "# TYPE vllm:num_preemptions_total counter",
        f"vllm:num_preemptions_total{{{lbl}}} 0.0",
        "# HELP vllm:prefix_cache_queries_total Prefix cache queries, in terms of number of queried tokens.",
        "# TYPE vllm:prefix_cache_queries_total counter",
        f"vllm:prefix_cache_queries_total{{{lbl}}} {float(prefix_cache[0])}",
        "# HELP vllm:prefix_cache_hits_total Prefix cache hits, in terms of number of cached tokens.",
        "# TYPE vllm:prefix_cache_hits_total counter",
        f"vllm:prefix_cache_hits_total{{{lbl}}} {float(prefix_cache[1])}",
    ]
    if slots:
        lines += [
            "# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.",
            "# TYPE vllm:kv_cache_usage_perc gauge",
            f"vllm:kv_cache_usage_perc{{{lbl}}} {min(1.0, running / slots)}",
        ]
    if ttft is not None:
        lines += [
            "# HELP vllm:time_to_first_token_seconds Histogram of time to first token in seconds.",
            "# TYPE vllm:time_to_first_token_seconds histogram",
        ]
        for le, n in ttft.cumulative():
            lines.append(f'vllm:time_to_first_token_seconds_bucket{{le="{le}",{lbl}}} {float(n)}')
        lines += [
            f'vllm:time_to_first_token_seconds_bucket{{le="+Inf",{lbl}}} {float(ttft.count)}',
            f"vllm:time_to_first_token_seconds_count{{{lbl}}} {float(ttft.count)}",
            f"vllm:time_to_first_token_seconds_sum{{{lbl}}} {float(ttft.sum)}",
        ]
    lines += [
        "# HELP sim_gpu_memory_used_bytes Simulated GPU memory in use.",
        "# TYPE sim_gpu_memory_used_bytes gauge",
        f"sim_gpu_memory_used_bytes {float(memory_bytes)}",
    ]
    return "\n".join(lines) + "\n"
