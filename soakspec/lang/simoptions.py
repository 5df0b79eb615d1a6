"""The simulator's option table: every `soakspec sim` option's name, kind, default and help.

Pure data, in the language layer because the checker validates a spec's `sim { ... }` block
against it (`SIM_OPTIONS`); `soakspec.sim.config` builds the flags and `SimConfig` from it.
Kinds and base units: "duration" seconds, "ratio" a fraction (0.05 = 5%), "size" bytes,
"int", "float", "str", "bool".
"""

from __future__ import annotations

from typing import Any, NamedTuple

KINDS = ("duration", "ratio", "int", "size", "str", "bool", "float")


class Option(NamedTuple):
    kind: str
    default: Any
    help: str
    repeatable: bool = False


# name -> Option. Order here is the order of `--help` and of `sim_argv` output.
# Launch options (where to listen, where traces go) are set by the runner, not by a spec.
_LAUNCH: dict[str, Option] = {
    "host": Option("str", "127.0.0.1", "address to bind; loopback only (127.0.0.1, ::1, localhost)"),
    "port": Option("int", 0, "TCP port; 0 picks a free one"),
    "port_file": Option("str", None, "write the bound port to this file (atomically) once listening"),
    "trace_file": Option("str", None, "append one JSON trace per finished request to this JSONL file"),
    "trace_log": Option("bool", True, "print `soakspec_sim_trace {json}` lines on stdout"),
}

_BEHAVIOUR: dict[str, Option] = {
    # the served model
    "model": Option("str", "sim-model", "served model name"),
    "served_model_name": Option("str", (), "extra accepted model name (repeatable)", repeatable=True),
    "max_model_len": Option("int", 8192, "prompt + max_tokens above this is a 400"),
    "default_max_tokens": Option("int", 16, "max_tokens when a request gives none"),
    "seed": Option("int", 0, "seed of every per-request random decision"),
    "runtime_banner": Option("str", None, "print this line verbatim on stdout at start-up"),
    "echo_env": Option("str", (), "print NAME=value of this environment variable at start-up (repeatable)",
                       repeatable=True),
    # scheduling
    "slots": Option("int", 16, "decode slots: sequences generated concurrently"),
    "queue_limit": Option("int", 0, "reply 429 when this many requests already wait (0 = unlimited)"),
    # timing
    "ttft": Option("duration", 0.05, "base time to first token (after the queue wait)"),
    "prefill_per_token": Option("duration", 0.0, "extra time to first token per prompt token"),
    "itl": Option("duration", 0.01, "inter-token latency"),
    "itl_jitter": Option("ratio", 0.0, "uniform +/- fraction applied to each inter-token latency"),
    "slowdown_per_active": Option("ratio", 0.0, "extra fraction of ITL per other active sequence"),
    "tokens_per_chunk": Option("int", 1, "tokens per SSE event after the first (the first token goes alone)"),
    "eos_rate": Option("ratio", 0.0, "probability a request without ignore_eos stops early (finish 'stop')"),
    "empty_text_rate": Option("ratio", 0.0, "probability a request's tokens all decode to empty text (still counted)"),
    "zero_latency": Option("bool", False, "ttft = itl = 0: write every event as fast as possible"),
    "drift": Option("ratio", 0.0, "TTFT and ITL grow by this fraction per minute of uptime (5% -> 0.05)"),
    "metrics": Option("bool", True, "serve Prometheus /metrics (false: it answers 404, like a server without one)"),
    "keep_alive_timeout": Option("duration", 5.0, "close an idle keep-alive connection after this (uvicorn: 5s)"),
    # automatic prefix caching (vLLM's: whole blocks of prompt tokens, keyed by their prefix)
    "enable_prefix_caching": Option("bool", True, "reuse cached whole blocks of a prompt's leading tokens: their "
                                    "prefill time is not spent (vLLM's --enable-prefix-caching, its default)"),
    "block_size": Option("int", 16, "prompt tokens a prefix-cache block holds (vLLM's --block-size)"),
    "prefix_cache_blocks": Option("int", 32768, ("blocks the prefix cache holds; a running request's are never evicted, the least "
                                                 "recently released go first")),
    "enable_prompt_tokens_details": Option("bool", False, "usage carries prompt_tokens_details.cached_tokens when "
                                           "some were cached (vLLM's --enable-prompt-tokens-details)"),
    # faults: per-request probabilities (they partition [0, 1): at most one fault per request)
    "error_rate": Option("ratio", 0.0, "reply HTTP 500 or 503 before streaming"),
    "stream_error_rate": Option("ratio", 0.0, "HTTP 200, some tokens, then an in-stream error event and [DONE]"),
    "stall_rate": Option("ratio", 0.0, "stop sending mid-stream; hold the connection until the client leaves"),
    "disconnect_rate": Option("ratio", 0.0, "close the TCP connection mid-stream"),
    "omit_done_rate": Option("ratio", 0.0, "finish normally but never send `data: [DONE]`"),
    "trace_drop_rate": Option("ratio", 0.0, "omit the trace of this fraction of requests"),
    # process-level faults and resources
    "memory_base": Option("size", 0.0, "simulated GPU memory in use at start (gauge sim_gpu_memory_used_bytes)"),
    "memory_growth": Option("size", 0.0, "simulated GPU memory growth per minute of uptime"),
    "crash_after_requests": Option("int", None, "exit abruptly (code 3) when request N+1 arrives"),
    "crash_after": Option("duration", None, "exit abruptly (code 3) this long after listening"),
    "startup_delay": Option("duration", 0.0, "wait this long before listening (a slow-starting server)"),
}

OPTIONS: dict[str, Option] = {**_LAUNCH, **_BEHAVIOUR}

#: {name: kind} of the options a spec's `sim { ... }` block may set.
SIM_OPTIONS: dict[str, str] = {name: o.kind for name, o in _BEHAVIOUR.items()}
#: {name: kind} of the options the runner sets when it launches the simulator.
LAUNCH_OPTIONS: dict[str, str] = {name: o.kind for name, o in _LAUNCH.items()}
#: options given once per value (`--echo-env A --echo-env B`); their value is a str or a list of str.
REPEATABLE: frozenset[str] = frozenset(name for name, o in OPTIONS.items() if o.repeatable)
