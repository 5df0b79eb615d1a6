"""What makes a runtime boundary label specific, and whether a log regex can confirm a version.

Defined here, in the language layer, because the checker rejects a generic label before
anything runs (E402); the evidence layer (`soakspec.evidence.runtime`) re-applies the same
rule to what a run observed and imports it from here.
"""

from __future__ import annotations

import re

GENERIC_WORDS = frozenset(
    {"", "unknown", "n/a", "na", "none", "default", "defaults", "generic", "tbd", "todo", "?", "-",
     "any", "auto", "null", "unspecified", "standard", "normal", "runtime", "backend"}
)  # fmt: skip
# Runtime names that say nothing without a version or a mode.
RUNTIME_NAMES = frozenset(
    {"nccl", "rccl", "cuda", "rocm", "hip", "gloo", "mpi", "ucx", "nvshmem", "torch", "pytorch",
     "cpu", "gpu", "tensorrt", "trt", "vllm", "sglang", "xla", "tpu"}
)  # fmt: skip
TOKEN_SPLIT = re.compile(r"[\s,;+()\[\]]+")


def is_generic_label(label: str | None) -> bool:
    """True when a runtime boundary label names nothing specific: empty, "unknown", "n/a",
    "none", "default", or only bare runtime names with no version or mode ("nccl", "NCCL default")."""
    text = (label or "").strip().lower()
    if text in GENERIC_WORDS:
        return True
    tokens = [t for t in TOKEN_SPLIT.split(text) if t]
    return all(t in GENERIC_WORDS or t in RUNTIME_NAMES for t in tokens)


def validate_log_regex(regex: str) -> str | None:
    """None when `regex` can detect a version, else why not (for the compiler)."""
    try:
        compiled = re.compile(regex)
    except re.error as e:
        return f"invalid regular expression: {e}"
    if compiled.groups == 0:
        return "the pattern needs a group capturing the version, e.g. (\\d+\\.\\d+\\.\\d+)"
    return None
