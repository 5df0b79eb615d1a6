"""Provenance: what exactly ran. Source commit, model fingerprint, server binary hash, host.

`git_state` runs git in a subprocess: call it from `run` only, never from check/plan/fmt.
Every function here returns a value with a `reason` instead of raising when something cannot be
determined: missing provenance is recorded, and the judge decides what it means.
"""

from __future__ import annotations

import fnmatch
import hashlib
import os
import platform
import re
import shutil
import socket
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from soakspec.evidence.io import sha256_file

GIT_TIMEOUT_S = 10.0

# Files that identify a model without reading its weights.
FINGERPRINT_PATTERNS = (
    "config.json",
    "generation_config.json",
    "tokenizer*.json",
    "tokenizer.model",
    "special_tokens_map.json",
    "*.safetensors.index.json",
    "pytorch_model.bin.index.json",
)

_HF_SNAPSHOT = re.compile(r"^[0-9a-f]{40}$")


def _git(repo: Path, *args: str, timeout: float) -> subprocess.CompletedProcess:
    env = dict(os.environ, GIT_OPTIONAL_LOCKS="0", LC_ALL="C", GIT_TERMINAL_PROMPT="0")
    return subprocess.run(
        ["git", "-C", str(repo), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        stdin=subprocess.DEVNULL,
    )


def git_state(repo_path: os.PathLike | str, timeout: float = GIT_TIMEOUT_S) -> dict:
    """`{"commit", "dirty", "reason"}` for the repository at `repo_path`.

    commit: `git rev-parse HEAD` (None with a reason when not a repository, no commits, git
    missing or timing out). dirty: whether tracked files differ from HEAD (`git status
    --porcelain --untracked-files=no`; untracked files do not count, since evidence directories
    often live inside the repository). Uses GIT_OPTIONAL_LOCKS=0 so it never writes the index.
    """
    repo = Path(repo_path)
    if not repo.is_dir():
        return {"commit": None, "dirty": None, "reason": f"{repo} is not a directory"}
    try:
        head = _git(repo, "rev-parse", "--verify", "HEAD", timeout=timeout)
        if head.returncode != 0:
            msg = (head.stderr.strip().splitlines() or ["git rev-parse failed"])[-1]
            return {"commit": None, "dirty": None, "reason": f"{repo}: {msg}"}
        status = _git(repo, "status", "--porcelain", "--untracked-files=no", timeout=timeout)
    except FileNotFoundError:
        return {"commit": None, "dirty": None, "reason": "git is not installed"}
    except subprocess.TimeoutExpired:
        return {"commit": None, "dirty": None, "reason": f"{repo}: git timed out after {timeout:g}s"}
    commit = head.stdout.strip()
    if status.returncode != 0:
        msg = (status.stderr.strip().splitlines() or ["git status failed"])[-1]
        return {"commit": commit, "dirty": None, "reason": f"{repo}: {msg}"}
    return {"commit": commit, "dirty": bool(status.stdout.strip()), "reason": None}


def model_fingerprint(path: os.PathLike | str) -> dict:
    """`{"sha256", "files", "reason"}`: SHA-256 over the sorted (name, sha256) pairs of the
    config and tokenizer files directly in the model directory (never the weights).

    The digest input is one line per file, `"<name>\\0<sha256>\\n"`, in name order.
    """
    root = Path(path)
    if not root.is_dir():
        return {"sha256": None, "files": {}, "reason": f"{root} is not a directory"}
    files: dict[str, str] = {}
    for entry in sorted(root.iterdir(), key=lambda p: p.name):
        if any(fnmatch.fnmatchcase(entry.name, pat) for pat in FINGERPRINT_PATTERNS) and entry.is_file():
            files[entry.name] = sha256_file(entry)
    if not files:
        return {"sha256": None, "files": {}, "reason": f"{root} has no config or tokenizer files"}
    h = hashlib.sha256()
    for name in sorted(files):
        h.update(f"{name}\0{files[name]}\n".encode())
    return {"sha256": h.hexdigest(), "files": files, "reason": None}


def model_revision(path: os.PathLike | str) -> str | None:
    """The Hugging Face revision when `path` is a hub snapshot (`.../snapshots/<40 hex>/...`)."""
    parts = Path(path).parts
    for i, part in enumerate(parts[:-1]):
        if part == "snapshots" and _HF_SNAPSHOT.match(parts[i + 1]):
            return parts[i + 1]
    return None


def resolve_executable(argv0: str, cwd: os.PathLike | str | None = None, env: Mapping[str, str] | None = None) -> Path | None:
    """The file `argv0` names: a path (relative to `cwd`) or a name found on PATH."""
    if not argv0:
        return None
    if os.sep in argv0 or (os.altsep and os.altsep in argv0):
        p = Path(argv0)
        if not p.is_absolute():
            p = Path(cwd or os.getcwd()) / p
        return p if p.is_file() else None
    search = (env or {}).get("PATH") or os.environ.get("PATH", os.defpath)
    found = shutil.which(argv0, path=search)
    return Path(found) if found else None


def binary_sha256(
    argv: Sequence[str], cwd: os.PathLike | str | None = None, env: Mapping[str, str] | None = None
) -> dict | None:
    """`{"path", "resolved", "sha256"}` of the file argv[0] names, or None when it names none."""
    if not argv:
        return None
    p = resolve_executable(argv[0], cwd, env)
    if p is None:
        return None
    resolved = p.resolve()
    try:
        digest = sha256_file(resolved)
    except OSError:
        return None
    return {"path": str(p), "resolved": str(resolved), "sha256": digest}


def _cpu_model() -> str | None:
    try:
        for line in Path("/proc/cpuinfo").read_text(errors="replace").splitlines():
            key, _, value = line.partition(":")
            if key.strip() in ("model name", "Hardware", "cpu model"):
                return value.strip() or None
    except OSError:
        pass
    return platform.processor() or None


def _memory_total() -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def _os_name() -> str:
    try:
        for line in Path("/etc/os-release").read_text().splitlines():
            if line.startswith("PRETTY_NAME="):
                return line.split("=", 1)[1].strip().strip('"')
    except OSError:
        pass
    return platform.platform()


def host_info() -> dict:
    """The manifest's `host`: hostname, CPU model, cores, memory total (bytes), kernel, OS,
    Python and soakspec versions."""
    from soakspec import __version__

    return {
        "hostname": socket.gethostname(),
        "cpu_model": _cpu_model(),
        "cpu_cores": os.cpu_count(),
        "memory_total": _memory_total(),
        "kernel": platform.release(),
        "os": _os_name(),
        "python_version": sys.version.split()[0],
        "soakspec_version": __version__,
    }
