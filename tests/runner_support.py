"""Helpers for tests that run `soakspec run` for real: specs from templates, a marker in the
environment to find every process a run started, and JSON/JSONL readers."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MARKER_VAR = "SOAKSPEC_TEST_MARKER"


def sim_spec(
    *,
    sim: str = "ttft = 20ms\n    itl = 5ms",
    load: str = "mode = closed\n    concurrency = [2]",
    duration: str = "2s",
    bucket: str = "1s",
    deadline: str = "5s",
    max_tokens: int = 8,
    gate: str = "require failed == 0",
    backends: int = 1,
    extra_backend: str = "",
    follow_up: bool = True,
    name: str = "t",
) -> str:
    """A small valid spec with `backends` simulated backends."""
    parts = [f'soak "{name}" {{\n  issue = "test"\n}}\n']
    for i in range(backends):
        parts.append(
            f'backend "b{i}" {{\n  sim {{\n    {sim}\n  }}\n  runtime {{\n    label = "host-staged"\n  }}\n{extra_backend}}}\n'
        )
    parts.append(
        textwrap.dedent(
            f"""\
            workload "w" {{
              prompt_words = 8
              max_tokens = {max_tokens}
              load {{
                {load}
              }}
              duration = {duration}
              bucket = {bucket}
              deadline = {deadline}
              follow_up = {"true" if follow_up else "false"}
            }}
            gate {{
              {gate}
            }}
            claims {{
              claim "test"
            }}
            """
        )
    )
    return "\n".join(parts)


def new_marker() -> str:
    return uuid.uuid4().hex


def run_env(marker: str) -> dict[str, str]:
    env = dict(os.environ)
    env[MARKER_VAR] = marker
    env.pop("CI", None)
    return env


def soakspec_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "soakspec", *args]


def run_soakspec(args: list[str], marker: str, cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        soakspec_cmd(*args), cwd=cwd, env=run_env(marker), capture_output=True, text=True, timeout=timeout
    )


def processes_with_marker(marker: str) -> list[int]:
    """Pids of live processes whose environment carries this test's marker."""
    needle = f"{MARKER_VAR}={marker}".encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as fh:
                env = fh.read()
            with open(f"/proc/{entry}/stat", "rb") as fh:
                state = fh.read().rsplit(b")", 1)[1].split()[0]
        except OSError:
            continue
        if state == b"Z":
            continue
        if needle in env.split(b"\0"):
            found.append(int(entry))
    return found


def wait_no_survivors(marker: str, timeout: float = 5.0) -> list[int]:
    """Survivors after up to `timeout` seconds (servers may still be exiting)."""
    deadline = time.monotonic() + timeout
    while True:
        alive = processes_with_marker(marker)
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.05)


def pid_running(pid: int) -> bool:
    """Whether `pid` is a live process (a zombie is not: it has ended, only not been reaped)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            state = fh.read().rsplit(b")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in (b"Z", b"X")


def pid_from_file(path: Path, timeout: float = 20.0) -> int:
    """The pid a process wrote to `path` (it writes it first thing: waited for, bounded)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        text = path.read_text().strip() if path.exists() else ""
        if text.isdigit():
            return int(text)
        time.sleep(0.02)
    raise AssertionError(f"{path} was never written")


def wait_not_running(pid: int, timeout: float = 5.0) -> bool:
    """True once `pid` no longer runs (within `timeout` seconds: a process may still be exiting)."""
    deadline = time.monotonic() + timeout
    while pid_running(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def server_log_bytes(backend_dir: Path) -> bytes:
    """A backend's retained server log as printed: server.log.gz once the run ended (server.log
    when it was killed before), decompressed."""
    from soakspec.evidence import layout
    from soakspec.evidence.serverlog import read_log

    path = layout.server_log_file(backend_dir)
    assert path is not None, f"no server log in {backend_dir}"
    return read_log(path)


def read_jsonl(path: Path) -> list[dict]:
    if Path(path).name == "requests.jsonl.gz":  # the record type, as plain dicts (derived keys too)
        from soakspec.evidence.record import iter_records

        return [dict(r) for _, r in iter_records(path)]
    if str(path).endswith(".gz"):  # traces.jsonl.gz: gzip JSONL
        from soakspec.evidence.io import iter_jsonl

        return [r for _, r in iter_jsonl(path)]
    rows = []
    for line in Path(path).read_text().splitlines():
        if line.strip():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                pass
    return rows


def manifest(run_dir: Path) -> dict:
    return json.loads((Path(run_dir) / "manifest.json").read_text())


def run_spec(tmp_path: Path, spec_text: str, *extra: str, timeout: float = 120) -> tuple[subprocess.CompletedProcess, Path]:
    """Write `spec_text`, run it with `soakspec run --quiet` into tmp_path/ev, and assert that
    no process the run started is left behind. Returns (completed process, evidence dir)."""
    spec = tmp_path / "t.soak"
    spec.write_text(spec_text)
    marker = new_marker()
    out = tmp_path / "ev"
    proc = run_soakspec(["run", str(spec), "--out", str(out), "--quiet", *extra], marker, tmp_path, timeout)
    survivors = wait_no_survivors(marker)
    assert survivors == [], f"processes left behind: {survivors}"
    return proc, out


def requests_of(out: Path, backend: str = "b0") -> list[dict]:
    """The request records of one backend of an evidence directory."""
    return read_jsonl(Path(out) / "backends" / backend / "requests.jsonl.gz")


def keep_alive_once(seen: dict, body: bytes):
    """A trio.serve_tcp handler that answers a connection's first request (200, `body`) and keeps
    it open, then closes it on the next one with nothing sent -- what a server's keep-alive
    timeout, racing a request sent on the idle connection, leaves the client. `seen["requests"]`
    counts the requests that arrived."""

    async def handler(stream) -> None:
        answered = False
        buf = b""
        while True:
            data = await stream.receive_some(65536)
            if not data:
                return
            buf += data
            if b"\r\n\r\n" not in buf:
                continue
            buf = b""
            seen["requests"] += 1
            if answered:
                await stream.aclose()
                return
            answered = True
            await stream.send_all(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: %d\r\n\r\n" % len(body) + body)

    return handler


def drops_every_request(seen: dict):
    """A trio.serve_tcp handler that reads a request and closes the connection unanswered."""

    async def handler(stream) -> None:
        if await stream.receive_some(65536):
            seen["requests"] += 1
        await stream.aclose()

    return handler

