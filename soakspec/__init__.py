"""soakspec: declarative HTTP soak tests for LLM inference servers.

The pipeline, one stage per module: text -> `parse` -> AST -> `check` -> Spec -> `plan` -> Plan
-> `run` (trio) -> Evidence -> `judge` -> Verdict -> `render`.
"""

__version__ = "0.1.0"
