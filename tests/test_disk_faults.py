"""The run's I/O refused: stdout closed, the evidence filesystem full or gone, soakspec killed
in a phase. Each case states the exit code, the message, that no process the run started is
left, and that the evidence left reads as incomplete (never intact, never a PASS)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from soakspec.judge.testing import EvidenceBuilder, spec_from_text
from tests.test_judge_streaming import SIM_SPEC

PY = sys.executable
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(os.path.dirname(os.path.dirname(__file__))),
                                                                  os.environ.get("PYTHONPATH")]))}


def _closed_stdout() -> None:
    os.close(1)


@pytest.mark.parametrize("command", [["gate"], ["verify"], ["report"]])
def test_a_closed_stdout_is_said_as_such_not_as_a_bug(tmp_path, command):
    """`soakspec gate DIR >&-` (stdout closed: Python's sys.stdout is None) said "internal error:
    AttributeError: 'NoneType' object has no attribute 'write' (this is a bug ...)". It is
    stdout refusing the output, as `> /dev/full` is: one line saying so, exit 4 (the result never
    reached the caller), no traceback."""
    root = EvidenceBuilder(spec_from_text(SIM_SPEC)).write(tmp_path / "ev")
    proc = subprocess.run([PY, "-m", "soakspec", *command, str(root)], stdin=subprocess.DEVNULL, stderr=subprocess.PIPE,
                          text=True, timeout=120, preexec_fn=_closed_stdout, env=ENV, cwd=tmp_path)  # fmt: skip
    assert proc.returncode == 4, proc.stderr
    assert "internal error" not in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    assert f"soakspec {command[0]}: cannot write" in proc.stderr and "stdout is closed" in proc.stderr, proc.stderr
