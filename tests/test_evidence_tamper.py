"""Evidence directories tampered with the way a careless edit, a crash or a hostile copy leaves
them: a symlink out of the directory, a FIFO where a file was. `verify`, `gate` and
`lint-claims` say so, never follow the link (into /etc/passwd, another run's files), never
block on the FIFO, and never crash."""

from __future__ import annotations

import builtins
import contextlib
import gzip
import io
import json
import os
import shutil
import signal
from pathlib import Path

import pytest

from soakspec.cli import main as cli_main
from soakspec.evidence.testing import build_evidence_dir
from soakspec.evidence.verify import verify_evidence


@contextlib.contextmanager
def within(seconds: float):
    """Fail (TimeoutError) instead of hanging: an open of a FIFO with no writer blocks forever."""

    def expired(signum, frame):
        raise TimeoutError(f"still running after {seconds}s (blocked on a FIFO?)")

    old = signal.signal(signal.SIGALRM, expired)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def run_cli(capsys, *args, seconds: float = 60):
    with within(seconds):
        code = cli_main([*map(str, args)])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def opened(monkeypatch):
    """The real paths every `open` of the command resolved to (what a symlink led it to read)."""
    seen: list[str] = []
    real = io.open

    def spy(file, *a, **k):
        if isinstance(file, (str, os.PathLike)):
            seen.append(os.path.realpath(file))
        return real(file, *a, **k)

    monkeypatch.setattr(builtins, "open", spy)
    monkeypatch.setattr(io, "open", spy)
    return seen


@pytest.fixture
def demo_copy(quick_demo, tmp_path):
    d = tmp_path / "run"
    shutil.copytree(quick_demo.run_dir, d, symlinks=True)
    return d


def _backend(run_dir: Path) -> Path:
    return sorted((run_dir / "backends").iterdir())[0]


# ------------------------------------------------------------------ symlinks out of the directory


def test_gate_never_reads_through_a_symlinked_artifact(demo_copy, tmp_path, capsys, opened):
    outside = tmp_path / "outside.jsonl"
    outside.write_text("root:x:0:0:root:/root:/bin/bash\n")
    tel = _backend(demo_copy) / "telemetry.jsonl"
    tel.unlink()
    tel.symlink_to(outside)
    opened.clear()  # what the test itself wrote
    code, out, _ = run_cli(capsys, "gate", demo_copy)
    assert code == 1 and "telemetry.jsonl: not a regular file" in out
    assert str(outside) not in opened  # reported, never followed
    assert "invalid JSON" not in out


def test_gate_never_reads_a_backend_directory_symlinked_elsewhere(demo_copy, tmp_path, capsys, opened):
    b = _backend(demo_copy)
    elsewhere = tmp_path / "elsewhere"
    shutil.move(str(b), elsewhere)
    b.symlink_to(elsewhere, target_is_directory=True)
    opened.clear()
    code, out, _ = run_cli(capsys, "gate", demo_copy)
    assert code == 1 and f"backends/{b.name}: not a regular file" in out
    assert not [p for p in opened if p.startswith(str(elsewhere))]


def test_a_symlinked_manifest_is_not_evidence(demo_copy, tmp_path, capsys, opened):
    """A manifest.json symlinked to a copy of the run's own manifest outside the directory was
    read through, and `verify` said "intact and complete"; one symlinked to /etc/passwd was read."""
    outside = tmp_path / "manifest-copy.json"
    shutil.move(str(demo_copy / "manifest.json"), outside)
    (demo_copy / "manifest.json").symlink_to(outside)
    opened.clear()
    for command in ("verify", "gate"):
        code, out, err = run_cli(capsys, command, demo_copy)
        assert code == 2 and "intact" not in out and "PASS" not in out
        assert "manifest.json is a symlink" in err
    assert str(outside) not in opened


def test_a_fifo_manifest_is_named_as_such(tmp_path, capsys):
    d = tmp_path / "run1"
    build_evidence_dir(d)
    (d / "manifest.json").unlink()
    os.mkfifo(d / "manifest.json")
    code, _, err = run_cli(capsys, "verify", d, seconds=20)
    assert code == 2 and "manifest.json is not a regular file" in err and "no manifest.json" not in err


# ------------------------------------------------------------------ FIFOs and hostile small files


def test_a_fifo_lock_neither_hangs_verify_nor_passes(tmp_path, capsys):
    """A FIFO named .lock blocked `verify` and `gate` forever (the lock check opened it)."""
    d = tmp_path / "run1"
    build_evidence_dir(d)
    os.mkfifo(d / ".lock")
    with within(20):
        r = verify_evidence(d)
    assert r.exit_code == 1 and [(x.code, Path(x.path).name) for x in r.problems] == [("V106", ".lock")]
    code, out, _ = run_cli(capsys, "verify", d, seconds=20)
    assert code == 1 and ".lock: V106 not a regular file" in out


def _killed_log(run_dir: Path) -> Path:
    """One backend's server.log.gz made what a run killed before its end leaves: server.log."""
    b = _backend(run_dir)
    (b / "server.log").write_bytes(gzip.decompress((b / "server.log.gz").read_bytes()))
    (b / "server.log.gz").unlink()
    return b


def test_a_hostile_moved_log_state_is_neither_a_crash_nor_a_hang(demo_copy, capsys):
    """server.log.moved.json nested 100,000 deep crashed `gate` (RecursionError, exit 4); a
    FIFO there blocked it forever."""
    b = _killed_log(demo_copy)
    (b / "server.log.moved.gz").write_bytes(gzip.compress(b""))
    state = b / "server.log.moved.json"
    state.write_text("[" * 100_000 + "]" * 100_000)
    code, out, err = run_cli(capsys, "gate", demo_copy)
    assert code == 1 and "internal error" not in err and "artifacts_verified" in out
    state.unlink()
    os.mkfifo(state)
    code, out, err = run_cli(capsys, "gate", demo_copy, seconds=30)
    assert code == 1 and "server.log.moved.json: not a regular file" in out


def test_lint_claims_does_not_block_on_a_fifo_result_file(quick_demo, demo_copy, tmp_path, capsys):
    """lint-claims --evidence read results.json / verdict.json with no check: a FIFO blocked it."""
    doc = tmp_path / "doc.md"
    doc.write_text("The run passed its gate.\n")
    for name in ("results.json", "verdict.json"):
        (demo_copy / name).unlink()
        os.mkfifo(demo_copy / name)
    code, out, err = run_cli(capsys, "lint-claims", doc, "--spec", quick_demo.spec, "--evidence", demo_copy, seconds=60)
    assert code in (0, 1) and "internal error" not in err
