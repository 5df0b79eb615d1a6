"""The simulator's trace contract, defined once.

The embedded simulator prints one `soakspec_sim_trace {json}` line per finished request on its
stdout. The checker gives a `sim` backend (and the runner, in a rehearsal, every backend) a
`traces` block that reads exactly these lines; the simulator writes them. All three import
the format from here, so it cannot drift. It lives in `lang` because `lang` may import nothing
above it, and the checker needs it.
"""

from __future__ import annotations

__all__ = ["TRACE_PREFIX", "TRACE_PATTERN", "ID_FORMS"]

TRACE_PREFIX = "soakspec_sim_trace "
TRACE_PATTERN = r"soakspec_sim_trace (?P<json>\{.*\})"
# The simulator answers completions as `cmpl-{id}-0` and chat as `chatcmpl-{id}`, as vLLM does.
ID_FORMS = ("cmpl-{id}-0", "chatcmpl-{id}", "cmpl-{id}", "{id}")
