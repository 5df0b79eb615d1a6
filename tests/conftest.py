"""Fixtures shared across test modules.

`quick_demo` is the evidence of a real `soakspec run` -- the runner's own writers, records,
traces, telemetry, manifest and results -- of the quick-start demo spec shortened to seconds, made
once per session. Tests that need a *passing full-scale run* to render or judge use it instead
of the 45 s demo itself (a time-scaled run can never PASS: the judge's `full_scale_run` makes it
INCONCLUSIVE). The demo itself still runs end to end in the `slow` lane (tests/test_runner.py).
"""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DEMO = REPO / "specs" / "demo.soak"

# (demo text, shortened text): faster simulators and 2 s levels in 1 s buckets keep every shape
# the reports show (2 backends x 2 levels x 2 buckets, the same workload and claims) while each
# level still completes far more than the 45 requests p95 at 90 % confidence needs.
QUICK_EDITS = (
    ("    ttft = 40ms\n    itl = 8ms\n", "    ttft = 4ms\n    itl = 1ms\n"),
    ("    ttft = 80ms\n    itl = 15ms\n", "    ttft = 6ms\n    itl = 1ms\n"),
    ("  duration = 10s\n  bucket = 5s\n", "  duration = 2s\n  bucket = 1s\n"),
    # the report tests need a passing run on a shared, busy machine: one 60 ms stall makes a 1 s
    # bucket's event-loop lag p99 60 ms (client_healthy, tested in tests/test_clienthealth.py)
    ("gate {\n  confidence = 90%\n", "gate {\n  confidence = 90%\n  client_lag = 500ms\n  client_concurrency = 50%\n"),
)


def quick_demo_text() -> str:
    """specs/demo.soak with `QUICK_EDITS` applied; fails loudly when the demo drifts from them."""
    text = DEMO.read_text()
    for old, new in QUICK_EDITS:
        assert text.count(old) == 1, f"specs/demo.soak changed: {old!r} no longer occurs once"
        text = text.replace(old, new)
    return text


@dataclasses.dataclass(frozen=True)
class DemoRun:
    spec: Path  # the spec the run used
    run_dir: Path  # its evidence directory (treat as read-only: copy it to tamper)


@pytest.fixture(scope="session")
def quick_demo(tmp_path_factory) -> DemoRun:
    """A real, passing, full-scale `soakspec run` of the shortened demo (about 10 s)."""
    base = tmp_path_factory.mktemp("quick-demo")
    spec = base / "demo.soak"
    spec.write_text(quick_demo_text())
    out = base / "evidence"
    proc = subprocess.run([sys.executable, "-m", "soakspec", "run", str(spec), "--out", str(out), "--quiet"],
                          cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode in (0, 3), proc.stderr[-3000:] + proc.stdout[-3000:]
    assert (out / "manifest.json").is_file()
    return DemoRun(spec, out)
