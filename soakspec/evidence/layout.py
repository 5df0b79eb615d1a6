"""Where things live inside an evidence directory, and `safe_name` for backend directories."""

from __future__ import annotations

import dataclasses
import hashlib
import os
import re
import stat
from pathlib import Path

MANIFEST = "manifest.json"
RESULTS = "results.json"
VERDICT = "verdict.json"
LOCK = ".lock"
MANIFEST_SIG = "manifest.json.sig"  # optional SSH signature of manifest.json (evidence/signing.py)
BACKENDS = "backends"

REQUESTS = "requests.jsonl.gz"  # gzip, one member per bucket (evidence/record.py: the line format)
BUCKETS = "buckets.jsonl"  # one line per closed bucket, written (and fsynced) as the run goes
TELEMETRY = "telemetry.jsonl"
TRACES = "traces.jsonl.gz"  # gzip JSONL (evidence/io.py reads it); log-sourced rows point into server.log
SERVER_LOG = "server.log"  # as the server writes it, during the run (and after a run killed before it ended)
SERVER_LOG_GZ = "server.log.gz"  # server.log capped and compressed when the run ends: wins over server.log
SERVER_LOG_MOVED = "server.log.moved.gz"  # what was moved out of server.log while the run went (evidence/serverlog.py)
SERVER_LOG_MOVED_STATE = "server.log.moved.json"  # how far it was moved: a killed run's log reads both
FOLLOWUP = "followup.json"
# followup.json's reason when the run ended (an abort, an interrupt) before the follow-up was sent
FOLLOWUP_NOT_SENT = "the follow-up request was not sent (the run ended before it)"
METRICS = "metrics.jsonl"  # the server's scraped Prometheus metrics (runner/scrape.py)
CLIENT = "client.jsonl"  # at the run root: the load generator's own health (runner/clienthealth.py)

# Files never listed in manifest["artifacts"]: the manifest cannot hash itself (nor its
# signature, written after it), and the lock exists only while a run writes.
NOT_ARTIFACTS = frozenset({MANIFEST, LOCK, MANIFEST_SIG})

_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")
_HASH_SUFFIX = re.compile(r"-[0-9a-f]{8}$")
_MAX_STEM = 64


def safe_name(name: str) -> str:
    """A single path component for `name` that can never escape its parent directory.

    Names made of [A-Za-z0-9._-] (no leading dot or dash, at most 64 characters) are kept as they
    are. Anything else is sanitised and gets `-<8 hex of sha256(name)>` appended, so distinct
    names stay distinct: `../../etc` -> `etc-<hash>`. A kept name never ends in such a suffix
    (a name that does is treated as changed), so a kept name cannot collide with a changed one.
    """
    stem = _UNSAFE.sub("-", name).lstrip(".-").rstrip(".-")
    stem = re.sub(r"-{2,}", "-", stem)[:_MAX_STEM].rstrip(".-")
    if stem == name and stem and not _HASH_SUFFIX.search(stem):
        return stem
    digest = hashlib.sha256(name.encode("utf-8", "surrogatepass")).hexdigest()[:8]
    return f"{stem or 'backend'}-{digest}"


def plain_file(path: Path | str, root: Path | str | None = None) -> bool:
    """Whether `path` is a regular file that a reader of evidence may open: not a symlink, FIFO,
    device or directory, and (with `root`, the evidence directory it lies in) reached through
    no symlinked directory below `root`. `verify` reports any other entry (V106); a reader
    treats it as absent, so that a symlink is never followed out of the directory (into
    /etc/passwd, a file of another run) and a FIFO never blocks it."""
    p = Path(path)
    try:
        if not stat.S_ISREG(os.lstat(p).st_mode):
            return False
    except (OSError, ValueError):
        return False
    if root is None:
        return True
    top = Path(root)
    d = p.parent
    while d != top and d != d.parent:
        if d.is_symlink():
            return False
        d = d.parent
    return d == top


def server_log_file(backend_dir: Path | str, root: Path | str | None = None) -> Path | None:
    """The backend's retained server log: `server.log.gz` (written whole when the run ended) wins
    over `server.log` (a run killed before it ended leaves only that); None when neither is a
    plain file (`plain_file`, inside `root` when given). Open it with
    `evidence.serverlog.open_log` (reads both)."""
    d = Path(backend_dir)
    for name in (SERVER_LOG_GZ, SERVER_LOG):
        p = d / name
        if plain_file(p, root):
            return p
    return None


@dataclasses.dataclass(frozen=True, slots=True)
class RunLayout:
    """Paths inside one run's evidence directory (`<out>/<run_id>`)."""

    root: Path

    def __post_init__(self) -> None:
        object.__setattr__(self, "root", Path(self.root))

    @property
    def manifest(self) -> Path:
        return self.root / MANIFEST

    @property
    def results(self) -> Path:
        return self.root / RESULTS

    @property
    def verdict(self) -> Path:
        return self.root / VERDICT

    @property
    def lock(self) -> Path:
        return self.root / LOCK

    @property
    def client(self) -> Path:
        return self.root / CLIENT

    def backend_dir(self, backend: str) -> Path:
        return self.root / BACKENDS / safe_name(backend)

    def requests(self, backend: str) -> Path:
        return self.backend_dir(backend) / REQUESTS

    def buckets(self, backend: str) -> Path:
        return self.backend_dir(backend) / BUCKETS

    def telemetry(self, backend: str) -> Path:
        return self.backend_dir(backend) / TELEMETRY

    def traces(self, backend: str) -> Path:
        return self.backend_dir(backend) / TRACES

    def server_log(self, backend: str) -> Path:
        return self.backend_dir(backend) / SERVER_LOG

    def server_log_gz(self, backend: str) -> Path:
        return self.backend_dir(backend) / SERVER_LOG_GZ

    def followup(self, backend: str) -> Path:
        return self.backend_dir(backend) / FOLLOWUP

    def metrics(self, backend: str) -> Path:
        return self.backend_dir(backend) / METRICS
