"""The embedded OpenAI-compatible inference simulator (`soakspec sim`).

A real HTTP/1.1 server (trio + h11) that answers `/v1/completions` and `/v1/chat/completions`
in vLLM's shapes, with a deterministic, seeded behaviour model (slots, queue, TTFT/ITL, faults)
and one trace per request. Modules, one job each:

* `config`   -- the option table, `SimConfig`, `SIM_OPTIONS`, `sim_argv` (pure: no trio);
* `model`    -- the behaviour model: request plans, timelines, the slot scheduler (pure);
* `protocol` -- request validation and the OpenAI/vLLM response bytes (pure);
* `server`   -- the trio + h11 server, `serve(config, task_status=...)`.

Importing this package does not import trio: `serve` is loaded on first use, so the language
checker can use `SIM_OPTIONS` and `sim_argv` from a pure compile stage.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from soakspec.sim.config import LAUNCH_OPTIONS, SIM_OPTIONS, SimConfig, sim_argv

if TYPE_CHECKING:
    from soakspec.sim.server import serve

__all__ = ["LAUNCH_OPTIONS", "SIM_OPTIONS", "SimConfig", "serve", "sim_argv"]


def __getattr__(name: str) -> Any:
    if name == "serve":
        from soakspec.sim.server import serve

        return serve
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
