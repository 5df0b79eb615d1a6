"""`--out` of the commands that read evidence (`report`, `compare`, `combine`): refused before a
byte of evidence is read (a day-long soak's takes minutes), as a usage error, when it cannot be
right.

Never inside an evidence directory being read: a file written there is not in its manifest, so
`soakspec verify` then finds it (V103, exit 1) and `gate` FAILs artifacts_verified -- the report
of a passing run would have made the run fail.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable
from pathlib import Path

from soakspec.exitcodes import UsageError


def out_file(value: str) -> str | None:
    """The `--out` argument: a file name, or `-` for stdout (as no `--out`), the convention of
    every tool that writes a file or stdout; `-` was a file named "-" in the current directory."""
    return None if value == "-" else value


def refuse_inside_evidence(out: str, evidence_dirs: Iterable[str | os.PathLike]) -> None:
    """UsageError when `out` is one of `evidence_dirs` or lies under one (symlinks resolved)."""
    target = Path(out).resolve()
    for d in evidence_dirs:
        root = Path(d).resolve()
        if target == root or root in target.parents:
            raise UsageError(f"--out {out} is inside the evidence directory {d}: a file written there is not in its "
                             "manifest, and `soakspec verify` and `gate` would then fail the evidence; write it elsewhere")


def check_out_file(out: str, evidence_dirs: Iterable[str | os.PathLike]) -> None:
    """UsageError for an `--out FILE` that is a directory, whose directory does not exist, or
    that lies inside an evidence directory being read."""
    p = Path(out)
    if p.is_dir():
        raise UsageError(f"--out {out} is a directory; give a file name")
    if not p.parent.is_dir():
        raise UsageError(f"--out {out}: no such directory {p.parent}")
    refuse_inside_evidence(out, evidence_dirs)


def write_out_file(out: str | os.PathLike, data: bytes) -> None:
    """`data` into `--out FILE`: a regular file (or a new name) is replaced atomically
    (`write_bytes_atomic`: a reader sees the old report or the new one); a symlink, a device
    (`--out /dev/stdout`) or a FIFO is written through, as a shell's `>` writes it -- replaced,
    the link became a regular file and, for root, /dev/stdout or /dev/full a regular file in
    /dev. `EvidenceWriteError` when the write fails."""
    from soakspec.evidence.io import EvidenceWriteError, write_bytes_atomic

    try:
        st = os.lstat(out)
    except OSError:
        st = None
    if st is None or stat.S_ISREG(st.st_mode):
        write_bytes_atomic(out, data)
        return
    try:
        with open(out, "wb") as f:
            f.write(data)
    except OSError as e:
        raise EvidenceWriteError(out, e) from e
