"""The real-server lane: tests against a real vLLM (CPU build) that soakspec launches.

Not part of the default run (`-m realserver` selects it; see setup.sh and run.sh). A lane that
was asked for but is not set up FAILS with the setup command, rather than skipping: a skipped
real-server check must never read as a passed one.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def lane() -> Path:
    d = Path(os.environ.get("REALSERVER_DIR", REPO / ".realserver"))
    if not (d / "V" / "bin" / "vllm").exists() or not (d / "tiny" / "config.json").exists():
        pytest.fail(f"the real-server lane is not set up in {d}: run `bash tests/realserver/setup.sh`")
    return d
