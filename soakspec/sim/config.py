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
from typing import Any

# The option table is data the language checker reads too, so it lives in the language layer.
from soakspec.lang.simoptions import (  # noqa: F401
    KINDS,
    LAUNCH_OPTIONS,
    OPTIONS,
    REPEATABLE,
    SIM_OPTIONS,
    Option,
)

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
        if value == "--":
            # argparse takes "--" for the end of options even as `--name=--` and drops it (a
            # served_model_name of "--" became none): refused, never silently changed
            raise ValueError(f"sim option {name}: '--' cannot be passed on a command line (it ends the options)")
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
    empty_text_rate: float = 0.0
    zero_latency: bool = False
    drift: float = 0.0
    keep_alive_timeout: float = 5.0
    enable_prefix_caching: bool = True
    block_size: int = 16
    prefix_cache_blocks: int = 32768
    enable_prompt_tokens_details: bool = False
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
    metrics: bool = True

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
                          ("tokens_per_chunk", 1), ("queue_limit", 0), ("block_size", 1),
                          ("prefix_cache_blocks", 1)):
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
