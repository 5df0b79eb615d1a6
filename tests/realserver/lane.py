"""What the real-server lane's tests share."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

# The lane runs vLLM's CPU build and soakspec on the same (2-core) machine: vLLM's busy engine
# takes the CPUs (machine CPU 99 %), so the client's event-loop lag (p99 ~120 ms) and its
# achieved concurrency (1.2 of 2 for 8 ms requests) fall outside client_healthy's defaults and
# the run is rightly INCONCLUSIVE. The lane checks protocol and lifecycle against a real
# server, not latency, so its gates get lenient client thresholds (`lenient_client`); on a
# machine where the server has its own GPU and CPUs the defaults apply.
LANE_CLIENT = "  client_lag = 1s\n  client_concurrency = 10%\n  client_schedule_lag = 1s\n"


def vllm_head(what: str, extra_args: str = "", name: str = "vllm-workloads") -> str:
    """The spec's start every lane test that launches vLLM shares: its soak, the tiny model and
    the launched backend (CPU build, `extra_args` appended to `vllm serve`'s argv as spec text,
    e.g. `, "--block-size", "32"`); the test writes its workload and gate after it."""
    return f"""
soak "{name}" {{
  issue = "real-server lane: {what}"
}}
model {{
  id = "tiny"
  path = "models/tiny"
}}
backend "vllm" {{
  launch = ["vllm", "serve", "{{model_path}}", "--served-model-name", "{{model_id}}",
            "--host", "{{host}}", "--port", "{{port}}", "--max-model-len", "1024",
            "--dtype", "bfloat16"{extra_args}]
  env {{
    VLLM_TARGET_DEVICE = "cpu"
    VLLM_CPU_KVCACHE_SPACE = "1"
  }}
  ready {{
    path = "/v1/models"
    timeout = 5m
  }}
  shutdown_grace = 30s
}}
"""


def lenient_client(text: str) -> str:
    """`text` with LANE_CLIENT added at the top of its gate block."""
    assert text.count("\ngate {\n") == 1, "a lane spec has one gate block"
    return text.replace("\ngate {\n", "\ngate {\n" + LANE_CLIENT)


# `vllm` on the PATH for the run: starts the real vLLM in its own session and, when soakspec
# stops it (SIGTERM), first reads the server's /metrics -- the counters over the whole run, as
# the server was launched fresh -- then forwards the signal.
WRAPPER = """#!{python}
import os, signal, subprocess, sys, urllib.request
args = sys.argv[1:]
port = args[args.index("--port") + 1]
child = subprocess.Popen([{real!r}, *args], start_new_session=True)
open({pidfile!r}, "w").write(str(child.pid))
def on_term(*_):
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{{port}}/metrics", timeout=10) as r:
            open({metrics!r}, "wb").write(r.read())
    finally:
        os.killpg(child.pid, signal.SIGTERM)
signal.signal(signal.SIGTERM, on_term)
sys.exit(child.wait())
"""


def run_launched(lane: Path, tmp_path: Path, spec: Path, timeout: float) -> tuple[subprocess.CompletedProcess, Path]:
    """`soakspec run spec --out tmp_path/ev --format json` against a vLLM that soakspec launches
    through WRAPPER (the lane's tiny model at `models/tiny`; vLLM's /metrics as they stand when
    soakspec stops it in tmp_path/metrics.txt), and any vLLM still running after it killed.
    `REALSERVER_KEEP=DIR` keeps a copy of tmp_path (evidence, metrics.txt) in DIR to read after."""
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "tiny").symlink_to(lane / "tiny")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    wrapper = bin_dir / "vllm"
    wrapper.write_text(WRAPPER.format(python=sys.executable, real=str(lane / "V" / "bin" / "vllm"),
                                      pidfile=str(tmp_path / "vllm.pid"), metrics=str(tmp_path / "metrics.txt")))
    wrapper.chmod(0o755)
    env = dict(os.environ, PATH=f"{bin_dir}{os.pathsep}{lane / 'V' / 'bin'}{os.pathsep}{os.environ['PATH']}")
    out = tmp_path / "ev"
    proc = subprocess.run(
        [sys.executable, "-m", "soakspec", "run", str(spec), "--out", str(out), "--format", "json"],
        capture_output=True, text=True, env=env, timeout=timeout,
    )
    try:
        os.killpg(int((tmp_path / "vllm.pid").read_text()), signal.SIGKILL)  # gone already, normally
    except (OSError, ValueError):
        pass
    if os.environ.get("REALSERVER_KEEP"):
        keep = Path(os.environ["REALSERVER_KEEP"]) / tmp_path.name
        shutil.rmtree(keep, ignore_errors=True)
        shutil.copytree(tmp_path, keep, symlinks=True)
    return proc, out
