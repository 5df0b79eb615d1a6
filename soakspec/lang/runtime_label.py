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


# Runtimes whose behaviour depends on their version: a label that names one must say which
# (at least major.minor: "NCCL 2.26.2", "CUDA 12.4", "vLLM v0.32.0"; "nccl 2" or "NCCL x.y.z"
# is not a version). A mode ("host-staged", "NCCL_IB_DISABLE=1") names no runtime.
VERSIONED_RUNTIMES = frozenset(
    {"nccl", "rccl", "cuda", "rocm", "hip", "nvshmem", "ucx", "torch", "pytorch", "tensorrt",
     "trt", "vllm", "sglang", "xla", "cudnn", "openmpi"}
)  # fmt: skip
# A runtime's name as a word: not part of an identifier (NCCL_IB_DISABLE) or a compound (cuda-graphs, torch.compile).
_RUNTIME_MENTION = re.compile(
    r"(?<![A-Za-z0-9_])(" + "|".join(sorted(VERSIONED_RUNTIMES, key=len, reverse=True)) + r")(?![A-Za-z0-9_]|[-.][A-Za-z])",
    re.IGNORECASE,
)
# A concrete version: v?MAJOR.MINOR[.PATCH...] with an optional pre-release or local suffix
# (0.32.0rc1, 2.26.2-1, 12.4.1+cu124); "2.x" and "2.26.x" are not versions.
LABEL_VERSION = re.compile(
    r"(?<![\w.])[vV]?(?P<version>(?>\d+(?:\.\d+)+))(?:[-+][A-Za-z0-9.]+|(?:rc|a|b|post|dev)\d*)?(?!\w|\.\w)"
)
_CLAUSE = re.compile(r"[,;+|]")


def label_versions(label: str | None) -> tuple[str, ...]:
    """The concrete versions a label states, in order, without a leading 'v'."""
    return tuple(m.group("version") for m in LABEL_VERSION.finditer(label or ""))


def unversioned_runtimes(label: str | None) -> tuple[str, ...]:
    """The versioned runtimes a label names without a concrete version in the same clause
    (clauses are separated by , ; + or |): ("NCCL",) for "NCCL x.y.z" or "nccl 2"."""
    missing: list[str] = []
    for clause in _CLAUSE.split(label or ""):
        for m in _RUNTIME_MENTION.finditer(clause):
            if not LABEL_VERSION.search(clause, m.end()) and m.group(1) not in missing:
                missing.append(m.group(1))
    return tuple(missing)
