"""Spec text for tests: one `sim {}` backend and one workload "w", the shape the dataset,
token-prompt and load-path tests each wrote out in full."""

from __future__ import annotations


def one_workload_spec(*, name: str, issue: str, before_load: str, load: str, after_load: str) -> str:
    """A spec: `soak "<name>"` with `issue`, backend "sim" (`sim {}`, runtime label
    "host-staged"), workload "w" holding `before_load`, a `load { <load> }` block and
    `after_load` (each one or more lines of `key = value`; later lines of `before_load` and
    `after_load` indented by two spaces, of `load` by four), a `require failed == 0` gate and
    one claim."""
    return f"""\
soak "{name}" {{
  issue = "{issue}"
}}
backend "sim" {{
  sim {{}}
  runtime {{
    label = "host-staged"
  }}
}}
workload "w" {{
  {before_load}
  load {{
    {load}
  }}
  {after_load}
}}
gate {{
  require failed == 0
}}
claims {{
  claim "test"
}}
"""
