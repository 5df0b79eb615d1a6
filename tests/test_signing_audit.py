"""Signed evidence under attack (an audit of `run --sign` and `verify --allowed-signers`).

- A key with a passphrase and no ssh-agent holding it is a usage error before the run (a test
  signature is made first), saying to load it with ssh-add -- not a failure after the whole
  soak that says 'incorrect passphrase supplied'.
"""

from __future__ import annotations

import contextlib
import io
import shutil
import subprocess
from pathlib import Path

import pytest

from runner_support import new_marker, run_soakspec, sim_spec, wait_no_survivors
from soakspec.cli import main

SSH_KEYGEN = shutil.which("ssh-keygen")
pytestmark = pytest.mark.skipif(SSH_KEYGEN is None, reason="ssh-keygen (OpenSSH) is not installed: signing cannot be tested")

SPEC = sim_spec(duration="1s", load="mode = closed\n    concurrency = [1]")


def cli(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(argv))
    return code, out.getvalue(), err.getvalue()


def keygen(path: Path, passphrase: str = "") -> Path:
    subprocess.run([SSH_KEYGEN, "-q", "-t", "ed25519", "-N", passphrase, "-C", "audit", "-f", str(path)], check=True, timeout=60)
    return path


def test_a_key_with_a_passphrase_and_no_agent_is_a_usage_error_before_the_run(tmp_path, monkeypatch):
    key = keygen(tmp_path / "locked", passphrase="secret phrase")
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    spec = tmp_path / "t.soak"
    spec.write_text(SPEC)
    marker = new_marker()
    try:
        proc = run_soakspec(["run", str(spec), "--out", str(tmp_path / "ev"), "--sign", str(key), "--quiet"], marker, tmp_path)
    finally:
        assert wait_no_survivors(marker) == []
    assert proc.returncode == 2, proc.stderr
    assert proc.stdout == "" and not (tmp_path / "ev").exists()  # nothing ran
    assert "passphrase" in proc.stderr and f"ssh-add {key}" in proc.stderr and "Enter passphrase:" not in proc.stderr
