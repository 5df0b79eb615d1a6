"""Simulator options: one table, three views.

`OPTIONS` is the single source of truth for every `soakspec sim` flag: its python name, kind,
default and help. From it come

* `SIM_OPTIONS` / `LAUNCH_OPTIONS` -- {name: kind} for the language checker, which validates a
  spec's `sim { ttft = 50ms ... }` block without importing trio (this module must stay pure);
* `sim_argv(options)` -- {name: value in base units} -> the flag list for `python -m soakspec sim`;
* `SimConfig` -- the frozen, validated configuration the server runs with
  (`SimConfig.from_options` is the same validation the command line applies).

Kinds and base units: "duration" seconds, "ratio" a fraction (0.05 = 5%), "size" bytes,
"int", "float", "str", "bool". Names use underscores; the flag is `--` + name with dashes.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import math
from collections.abc import Mapping
from typing import Any, NamedTuple

__all__ = [
    "KINDS",
    "LAUNCH_OPTIONS",
    "OPTIONS",
    "REPEATABLE",
    "SIM_OPTIONS",
    "Option",
    "SimConfig",
    "flag_name",
    "sim_argv",
]

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
    "zero_latency": Option("bool", False, "ttft = itl = 0: write every event as fast as possible"),
    "drift": Option("ratio", 0.0, "TTFT and ITL grow by this fraction per minute of uptime (5% -> 0.05)"),
    "keep_alive_timeout": Option("duration", 5.0, "close an idle keep-alive connection after this (uvicorn: 5s)"),
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

FAULT_RATES = ("error_rate", "stream_error_rate", "stall_rate", "disconnect_rate", "omit_done_rate")


def flag_name(name: str) -> str:
    return "--" + name.replace("_", "-")


def _number(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"sim option {name}: expected a number, got {value!r}")
    f = float(value)
    if not math.isfinite(f):
        raise ValueError(f"sim option {name}: {value!r} is not finite")
    return f


def _format(name: str, kind: str, value: object) -> str:
    if kind == "str":
        if not isinstance(value, str):
            raise ValueError(f"sim option {name}: expected a string, got {value!r}")
        return value
    if kind == "int":
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"sim option {name}: expected an integer, got {value!r}")
        return str(value)
    f = _number(name, value)
    if kind == "size":
        return f"{int(f)}B" if f.is_integer() else f"{f!r}B"
    text = repr(f)
    return text + "s" if kind == "duration" else text  # ratio and float: a bare number


def sim_argv(options: Mapping[str, object]) -> list[str]:
    """{option: value in base units} -> flags for `python -m soakspec sim`.

    Pure: types are checked (ValueError on an unknown name or a wrong type), ranges are not
    (`SimConfig.from_options` does that). `None` means "the default" and emits nothing. Flags
    use the `--name=value` form so that values starting with `-` stay values; booleans become
    `--name` / `--no-name`. Output follows the order of `OPTIONS`, so equal inputs give equal argv.
    """
    unknown = sorted(set(options) - set(OPTIONS))
    if unknown:
        raise ValueError(f"unknown sim option(s): {', '.join(unknown)}")
    argv: list[str] = []
    for name, opt in OPTIONS.items():
        if name not in options or options[name] is None:
            continue
        value = options[name]
        flag = flag_name(name)
        if opt.kind == "bool":
            if not isinstance(value, bool):
                raise ValueError(f"sim option {name}: expected true or false, got {value!r}")
            argv.append(flag if value else "--no-" + flag[2:])
        elif opt.repeatable:
            values = [value] if isinstance(value, str) else value
            if not isinstance(values, (list, tuple)):
                raise ValueError(f"sim option {name}: expected a string or a list of strings, got {value!r}")
            argv.extend(f"{flag}={_format(name, opt.kind, v)}" for v in values)
        else:
            argv.append(f"{flag}={_format(name, opt.kind, value)}")
    return argv


def _loopback(host: str) -> str:
    if host == "localhost":
        return "127.0.0.1"
    try:
        addr = ipaddress.ip_address(host)
    except ValueError:
        raise ValueError(f"host {host!r} is not an IP address (use 127.0.0.1, ::1 or localhost)") from None
    if not addr.is_loopback:
        raise ValueError(f"refusing to bind to non-loopback address {host} (soakspec sim serves loopback only)")
    return str(addr)


@dataclasses.dataclass(frozen=True)
class SimConfig:
    """Everything the simulator does, in base units. Build with `SimConfig(...)` or `from_options`;
    `__post_init__` validates ranges and normalises the host (ValueError on a bad value)."""

    host: str = "127.0.0.1"
    port: int = 0
    port_file: str | None = None
    trace_file: str | None = None
    trace_log: bool = True
    model: str = "sim-model"
    served_model_name: tuple[str, ...] = ()
    max_model_len: int = 8192
    default_max_tokens: int = 16
    seed: int = 0
    runtime_banner: str | None = None
    echo_env: tuple[str, ...] = ()
    slots: int = 16
    queue_limit: int = 0
    ttft: float = 0.05
    prefill_per_token: float = 0.0
    itl: float = 0.01
    itl_jitter: float = 0.0
    slowdown_per_active: float = 0.0
    tokens_per_chunk: int = 1
    eos_rate: float = 0.0
    zero_latency: bool = False
    drift: float = 0.0
    keep_alive_timeout: float = 5.0
    error_rate: float = 0.0
    stream_error_rate: float = 0.0
    stall_rate: float = 0.0
    disconnect_rate: float = 0.0
    omit_done_rate: float = 0.0
    trace_drop_rate: float = 0.0
    memory_base: float = 0.0
    memory_growth: float = 0.0
    crash_after_requests: int | None = None
    crash_after: float | None = None
    startup_delay: float = 0.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "host", _loopback(self.host))
        object.__setattr__(self, "served_model_name", tuple(self.served_model_name))
        object.__setattr__(self, "echo_env", tuple(self.echo_env))
        problems: list[str] = []
        if not 0 <= self.port <= 65535:
            problems.append(f"port {self.port} is out of range 0..65535")
        if not self.model:
            problems.append("model name is empty")
        for name, low in (("slots", 1), ("max_model_len", 1), ("default_max_tokens", 1),
                          ("tokens_per_chunk", 1), ("queue_limit", 0)):
            if getattr(self, name) < low:
                problems.append(f"{name} must be at least {low}, got {getattr(self, name)}")
        if self.crash_after_requests is not None and self.crash_after_requests < 0:
            problems.append(f"crash_after_requests must be >= 0, got {self.crash_after_requests}")
        for name, opt in OPTIONS.items():
            value = getattr(self, name)
            if value is None:
                continue
            if opt.kind in ("duration", "size") and value < 0:
                problems.append(f"{name} must not be negative, got {value}")
            if opt.kind == "ratio" and name != "drift" and not 0 <= value <= 1:
                problems.append(f"{name} must be between 0 and 1 (0%..100%), got {value}")
        if self.drift < 0:
            problems.append(f"drift must not be negative, got {self.drift}")
        total = sum(getattr(self, n) for n in FAULT_RATES)
        if total > 1 + 1e-9:
            problems.append(f"the fault rates ({', '.join(FAULT_RATES)}) add up to {total:g}, more than 1")
        if problems:
            raise ValueError("; ".join(problems))

    @classmethod
    def from_options(cls, options: Mapping[str, object]) -> SimConfig:
        """Validate {option: value in base units} exactly as the command line would."""
        unknown = sorted(set(options) - set(OPTIONS))
        if unknown:
            raise ValueError(f"unknown sim option(s): {', '.join(unknown)}")
        kwargs: dict[str, Any] = {}
        for name, value in options.items():
            if value is None:
                continue
            opt = OPTIONS[name]
            if opt.repeatable:
                value = (value,) if isinstance(value, str) else tuple(value)  # type: ignore[arg-type]
                for v in value:
                    _format(name, opt.kind, v)
            elif opt.kind == "bool":
                if not isinstance(value, bool):
                    raise ValueError(f"sim option {name}: expected true or false, got {value!r}")
            else:
                _format(name, opt.kind, value)
                if opt.kind in ("duration", "ratio", "size", "float"):
                    value = float(value)  # type: ignore[arg-type]
            kwargs[name] = value
        return cls(**kwargs)

    @property
    def model_names(self) -> tuple[str, ...]:
        return (self.model, *(n for n in self.served_model_name if n != self.model))

    def options(self) -> dict[str, object]:
        """The non-default options, in base units: `sim_argv(cfg.options())` relaunches this config."""
        return {name: getattr(self, name) for name, opt in OPTIONS.items() if getattr(self, name) != opt.default}
