"""The fault matrix: `soakspec run` against servers that fail in every way we could think of.

Real processes, real sockets, real signals. Backends are the embedded simulator (its fault
knobs) or `tests/misbehaving/server.py` (a small stdlib server that misbehaves on purpose, one
`--mode` per protocol fault). Every case states the outcome class, the message and the exit
code it expects, and every run is marked so that `wait_no_survivors` can prove that no
process it started (server, reaper, grandchild) outlives it.

Exit codes: 4 for an aborted run; a run that completed is judged, so it exits 0 (pass), 1 (the
gate failed) or 3 (inconclusive, or no judge installed yet): `RUN_COMPLETED` below. The
existing lifecycle cases of `test_runner.py` (crash after N requests, `./no-such-server`, a 404
readiness probe, SIGINT/SIGTERM/SIGHUP teardown, SIGKILL of the runner, a second run into a
finished directory) are not repeated here; these tests extend them.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import resource
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from runner_support import (
    manifest,
    new_marker,
    pid_from_file,
    pid_running,
    requests_of,
    run_env,
    run_soakspec,
    run_spec,
    server_log_bytes,
    sim_spec,
    soakspec_cmd,
    wait_no_survivors,
    wait_not_running,
)

MISBEHAVING = Path(__file__).resolve().parent / "misbehaving" / "server.py"
RUN_COMPLETED = (0, 1, 3)
PY = sys.executable
SIM_BLOCK = "sim {\n    ttft = 20ms\n    itl = 5ms\n  }"


def _q(s: str) -> str:
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'


def launch_spec(argv: list[str], *, ready_timeout: str = "10s", grace: str = "2s", **kw) -> str:
    """`sim_spec` with backend b0 replaced by `launch = argv`."""
    kw.setdefault("duration", "1s")
    kw.setdefault("bucket", "1s")
    kw.setdefault("deadline", "3s")
    kw.setdefault("follow_up", False)
    launch = (
        f"launch = [{', '.join(_q(a) for a in argv)}]\n"
        f"  ready {{\n    timeout = {ready_timeout}\n    interval = 100ms\n  }}\n"
        f"  shutdown_grace = {grace}"
    )
    text = sim_spec(**kw)
    assert SIM_BLOCK in text
    return text.replace(SIM_BLOCK, launch, 1)


NO_ABORT = "require failed == 0\n  abort_default = false"  # for servers that fail every request on purpose


def misbehaving(mode: str = "ok", *flags: str) -> list[str]:
    return [PY, str(MISBEHAVING), "--port", "{port}", "--mode", mode, *flags]


def _verify(out: Path) -> subprocess.CompletedProcess:
    return subprocess.run(soakspec_cmd("verify", str(out)), capture_output=True, text=True, timeout=60)


def _printable(text: str) -> bool:
    return all(ch.isprintable() or ch in "\n\t" for ch in text)


def _one_line_no_traceback(stderr: str) -> None:
    assert "Traceback" not in stderr, stderr


# ------------------------------------------------------------------ backend faults


def _not_executable(tmp_path: Path) -> list[str]:
    script = tmp_path / "server.sh"
    script.write_text("#!/bin/sh\nexec sleep 60\n")
    script.chmod(0o644)
    return ["./server.sh", "--port", "{port}"]


BACKEND_CASES = {
    # case: (argv builder, expected message regex on stderr, text expected in the log tail)
    "command not found": (
        lambda tmp: ["soakspec-no-such-server-binary", "--port", "{port}"],
        r"backend 'b0': command not found: soakspec-no-such-server-binary",
        None,
    ),
    "not executable": (
        _not_executable,
        r"backend 'b0': cannot execute \./server\.sh: permission denied \(is it executable\?\)",
        None,
    ),
    "exits before ready": (
        lambda tmp: misbehaving("ok", "--exit-before-ready"),
        r"backend 'b0': exited with status 1 before it was ready",
        "giving up before listening",
    ),
    "crashes at start": (
        lambda tmp: misbehaving("ok", "--crash-at-start"),
        r"backend 'b0': exited with status 1 before it was ready",
        "RuntimeError: misbehaving server: crash at start",
    ),
    "never ready": (
        lambda tmp: [PY, "-c", "import time; print('sleeping, never listening', flush=True); time.sleep(600)"],
        r"backend 'b0': not ready after 2s \(GET http://127\.0\.0\.1:\d+/v1/models: ConnectError\)",
        "sleeping, never listening",
    ),
}


# "never ready" waits out the 2 s readiness timeout of a real server process: the slow lane
@pytest.mark.parametrize("case", [pytest.param(c, marks=pytest.mark.slow) if c == "never ready" else c for c in BACKEND_CASES])
def test_a_backend_that_cannot_start_aborts_the_run(tmp_path, case):
    """Outcome: aborted before any load, exit 4, one line naming the backend and the cause,
    the log tail when there is a log, no record, the manifest `aborted` with that reason."""
    build, message, tail = BACKEND_CASES[case]
    proc, out = run_spec(tmp_path, launch_spec(build(tmp_path), ready_timeout="2s"))
    assert proc.returncode == 4, proc.stderr
    _one_line_no_traceback(proc.stderr.split("last lines of")[0])
    assert re.search(message, proc.stderr), proc.stderr
    if tail is not None:
        assert "last lines of b0's log:" in proc.stderr
        assert tail in proc.stderr.split("last lines of b0's log:", 1)[1]
    m = manifest(out)
    assert m["status"] == "aborted"
    assert re.search(message, m["incomplete_reason"])
    assert requests_of(out) == []
    assert _verify(out).returncode == 3, "aborted evidence is intact but incomplete"


def test_port_taken_aborts_with_the_servers_own_message(tmp_path):
    """A server told to bind a port that is already bound exits before it is ready: exit 4,
    its exit status and its own error line (from the log tail) on stderr."""
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    port = holder.getsockname()[1]
    try:
        argv = [PY, "-m", "soakspec", "sim", "--host", "127.0.0.1", "--port", str(port)]
        proc, out = run_spec(tmp_path, launch_spec(argv))
    finally:
        holder.close()
    assert proc.returncode == 4, proc.stderr
    assert "backend 'b0': exited with status 4 before it was ready" in proc.stderr
    assert "Address already in use" in proc.stderr.split("last lines of b0's log:", 1)[1]
    assert manifest(out)["status"] == "aborted"


def test_binary_garbage_in_the_log_is_shown_as_readable_text(tmp_path):
    """A server that prints raw bytes (NUL, ANSI escapes, invalid UTF-8) and then dies: the
    log tail on stderr is still plain printable text."""
    proc, out = run_spec(tmp_path, launch_spec(misbehaving("ok", "--garbage", "--exit-before-ready")))
    assert proc.returncode == 4
    tail = proc.stderr.split("last lines of b0's log:", 1)[1]
    assert "giving up before listening" in tail and "starting" in tail
    assert _printable(proc.stderr), repr(proc.stderr)
    assert b"\x1b[2J" in server_log_bytes(out / "backends" / "b0"), "server.log keeps the raw bytes"


def test_binary_garbage_while_serving_does_not_disturb_the_run(tmp_path):
    """Outcome: a normal complete run; server.log holds the bytes as printed, and
    `log_tail` (what soakspec would show) reads it as printable text."""
    from soakspec.runner.procs import log_tail

    proc, out = run_spec(tmp_path, launch_spec(misbehaving("ok", "--garbage")))
    assert proc.returncode in RUN_COMPLETED, proc.stderr
    assert manifest(out)["status"] == "complete"
    rows = [r for r in requests_of(out) if r["bucket"] >= 0]
    assert rows and {r["outcome"] for r in rows} == {"completed"}
    raw = server_log_bytes(out / "backends" / "b0")  # server.log.gz: the bytes as printed
    assert b"\x00" in raw and b"listening on 127.0.0.1" in raw
    log = tmp_path / "server.log"  # as it was while the server ran (what log_tail reads then)
    log.write_bytes(raw)
    tail = log_tail(log)
    assert "\ufffd" in tail and _printable(tail), "undecodable bytes and control characters are replaced"
    assert _verify(out).returncode in (0, 3)


@pytest.mark.slow
def test_a_server_that_ignores_sigterm_is_killed_after_the_grace(tmp_path):
    """Teardown: SIGTERM, the spec's grace (1 s), then SIGKILL of the group; the manifest
    records stop_signal SIGKILL and the exit status -9; the run itself completed."""
    t0 = time.monotonic()
    proc, out = run_spec(tmp_path, launch_spec(misbehaving("ok", "--ignore-sigterm"), grace="1s"))
    assert proc.returncode in RUN_COMPLETED, proc.stderr
    b = manifest(out)["backends"][0]
    assert manifest(out)["status"] == "complete"
    assert b["stop_signal"] == "SIGKILL"
    assert b["exit_status"] == -signal.SIGKILL
    assert time.monotonic() - t0 < 30


def test_a_crash_mid_stream_aborts_and_the_cut_request_is_recorded(tmp_path):
    """The server process exits while streaming: the cut request is `disconnected`, the run
    aborts (exit 4) with the exit status, and the evidence stays valid (verify: intact,
    incomplete) -- including requests the abort itself cancelled."""
    proc, out = run_spec(tmp_path, launch_spec(misbehaving("die-mid-stream"), load="mode = closed\n    concurrency = [2]"),
                         "--no-preflight")  # fmt: skip
    assert proc.returncode == 4, proc.stderr
    assert "backend 'b0': server exited with status 1 during the run" in proc.stderr
    assert "dying mid-stream" in proc.stderr
    rows = requests_of(out)
    assert rows and all(r["outcome"] == "disconnected" for r in rows), [(r["outcome"], r["error"]) for r in rows]
    assert any(r["error"] == "connection closed before the response finished" for r in rows)
    assert manifest(out)["status"] == "aborted"
    v = _verify(out)
    assert v.returncode == 3, v.stdout + v.stderr


def test_an_aborted_runs_json_report_states_the_exit_code_it_exits_with(tmp_path):
    """`run --format json` prints the verdict of the evidence so far; where the run aborted,
    its `exit_code` is the process's, 4, not the verdict's (a script reading stdout alone was
    told 1 while the process exited 4), and the reason is beside it."""
    proc, out = run_spec(tmp_path, launch_spec(misbehaving("die-mid-stream"), load="mode = closed\n    concurrency = [2]"),
                         "--no-preflight", "--format", "json")  # fmt: skip
    assert proc.returncode == 4, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["exit_code"] == 4
    assert "server exited with status 1" in doc["aborted_reason"]
    # verdict.json stays the evidence's judgement (what `soakspec gate DIR` exits with)
    written = json.loads((out / "verdict.json").read_text())
    assert written["verdict"] == doc["verdict"] != "PASS"
    assert written["exit_code"] == {"FAIL": 1, "INCONCLUSIVE": 3}[doc["verdict"]]


def test_a_crash_between_levels_keeps_the_finished_level(tmp_path):
    """Level 1 (concurrency 1, 1 s, ~0.6 s per request) sends exactly two requests; the
    simulator dies when the third -- the first of level 2 -- arrives. Level 1 stays complete
    with its two completed records; level 2 is cut; exit 4."""
    spec = sim_spec(
        sim="ttft = 600ms\n    itl = 1ms\n    crash_after_requests = 2",
        load="mode = closed\n    concurrency = [1, 2]",
        max_tokens=2, duration="1s", bucket="1s", deadline="5s", follow_up=False,
    )  # fmt: skip
    proc, out = run_spec(tmp_path, spec, "--no-preflight")  # the crash counts requests: none before the levels
    assert proc.returncode == 4, proc.stderr
    assert "backend 'b0': server exited with status 3 during the run" in proc.stderr
    levels = manifest(out)["backends"][0]["levels"]
    assert levels[0]["completed"] is True and levels[0]["sent"] == 2
    assert len(levels) == 2 and levels[1]["completed"] is False
    rows = requests_of(out)
    assert [r["outcome"] for r in rows if r["level"] == 0] == ["completed", "completed"]
    cut = [r for r in rows if r["level"] == 1]
    assert cut and all(r["outcome"] == "disconnected" for r in cut)


# ------------------------------------------------------------------ protocol faults

PROTOCOL_CASES = {
    # mode: (outcome of every request, error text)
    "malformed-json": ("failed", "malformed JSON in the response"),
    "reset": ("disconnected", "connection reset by peer (econnreset)"),
    "wrong-ctype": ("failed", "unexpected content-type 'application/json' for a stream"),
    "error-event": ("failed", "error event: out of KV cache blocks"),
    "no-done": ("failed", "stream ended without data: [DONE]"),
    "zero-tokens": ("failed", "0 completion tokens and no text"),
    "http10": ("completed", None),
    "chunked-edge": ("completed", None),
}


@pytest.mark.slow  # one real soak per fault (~2 s each); the in-process client tests cover the parsing
@pytest.mark.parametrize("mode", list(PROTOCOL_CASES))
def test_protocol_fault_gives_its_outcome_class(tmp_path, mode):
    """Each protocol fault is a per-request outcome, never a crash of the runner: the run
    completes (exit 0/1/3, not 4), every request gets the stated outcome and message, and
    the evidence verifies."""
    outcome, error = PROTOCOL_CASES[mode]
    # every request faults by design: no pre-flight, and the built-in abort (runner/abort.py) is
    # off, so each request keeps its own outcome
    proc, out = run_spec(tmp_path, launch_spec(misbehaving(mode), gate=NO_ABORT), "--no-preflight")
    assert proc.returncode in RUN_COMPLETED, proc.stderr
    _one_line_no_traceback(proc.stderr)
    assert manifest(out)["status"] == "complete"
    rows = requests_of(out)
    assert len(rows) >= 3, proc.stderr
    assert {r["outcome"] for r in rows} == {outcome}, {(r["outcome"], r["error"]) for r in rows}
    for r in rows:
        if error is None:
            assert r["error"] is None and r["output_tokens"] == 4 and r["chunks"] == 4
        else:
            assert error in r["error"], r["error"]
    assert _verify(out).returncode in (0, 3)


@pytest.mark.slow
def test_one_byte_per_second_ends_at_the_deadline(tmp_path):
    """A server that drips its response (status line included) at 1 byte/s: the request's
    absolute deadline (2 s) fires and it is a `timeout`, the level still ends on time."""
    t0 = time.monotonic()
    proc, out = run_spec(tmp_path, launch_spec(misbehaving("slow"), deadline="2s", load="mode = closed\n    concurrency = [1]"),
                         "--no-preflight")  # fmt: skip
    assert proc.returncode in RUN_COMPLETED, proc.stderr
    rows = requests_of(out)
    assert len(rows) == 1
    (r,) = rows
    assert r["outcome"] == "timeout" and r["error"] == "deadline passed before the response finished"
    assert 1.9 <= r["latency"] <= 2.6
    assert time.monotonic() - t0 < 30


def _vm_hwm_kib(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def test_a_10mb_sse_line_fails_the_request_and_memory_stays_bounded(tmp_path):
    """`data: ` + 10 MB without a newline, at concurrency 2 for 1 s: each request fails as
    soon as the line passes the 1 MiB event limit, and the runner's peak RSS (VmHWM, sampled
    from /proc while it runs) stays under 200 MB."""
    spec = tmp_path / "t.soak"
    spec.write_text(launch_spec(misbehaving("huge-line"), load="mode = closed\n    concurrency = [2]", gate=NO_ABORT))
    marker = new_marker()
    out = tmp_path / "ev"
    proc = subprocess.Popen(
        soakspec_cmd("run", str(spec), "--out", str(out), "--quiet", "--no-preflight"),  # every request fails
        cwd=tmp_path, env=run_env(marker), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    peak = 0
    result: dict = {}
    reader = threading.Thread(target=lambda: result.update(zip(("out", "err"), proc.communicate(timeout=90))))
    reader.start()
    while proc.poll() is None:
        hwm = _vm_hwm_kib(proc.pid)
        if hwm:
            peak = max(peak, hwm)
        time.sleep(0.02)
    reader.join()
    assert wait_no_survivors(marker) == []
    assert proc.returncode in RUN_COMPLETED, result.get("err")
    assert 0 < peak < 200 * 1024, f"runner peak RSS {peak} KiB"
    rows = requests_of(out)
    assert len(rows) >= 2
    assert {(r["outcome"], r["error"]) for r in rows} == {("failed", "SSE event too large")}


# ------------------------------------------------------------------ runner faults


def _start_runner(tmp_path: Path, spec_text: str, marker: str, out: Path, wait_for: str = "requests"):
    spec = tmp_path / "t.soak"
    spec.write_text(spec_text)
    proc = subprocess.Popen(
        soakspec_cmd("run", str(spec), "--out", str(out), "--quiet"),
        cwd=tmp_path, env=run_env(marker), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    req = out / "backends" / "b0" / "requests.jsonl.gz"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if req.exists() and req.stat().st_size > 0:
            return proc
        if proc.poll() is not None:
            raise AssertionError(f"runner exited early: {proc.communicate()}")
        time.sleep(0.05)
    proc.kill()
    raise AssertionError("no request was recorded within 30 s")


def test_a_signal_mid_bucket_leaves_evidence_that_verifies(tmp_path):
    """Extends test_runner's signal cases: after SIGTERM mid-bucket (requests in flight), the
    evidence is intact -- `soakspec verify` says incomplete (exit 3), not corrupt (exit 1):
    requests cut by the teardown are recorded as `disconnected` with a reason."""
    marker = new_marker()
    out = tmp_path / "ev"
    proc = _start_runner(tmp_path, sim_spec(sim="ttft = 100ms\n    itl = 20ms", duration="30s", bucket="10s", max_tokens=32), marker, out)
    time.sleep(0.5)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=30)
    assert wait_no_survivors(marker) == []
    assert proc.returncode == 4, err
    v = _verify(out)
    assert v.returncode == 3, v.stdout + v.stderr
    assert "interrupted by SIGTERM" in v.stdout + v.stderr
    cut = [r for r in requests_of(out) if r["error"] == "the run was aborted before the response finished"]
    assert cut, "requests in flight at the signal are recorded"
    assert all(r["outcome"] == "disconnected" and r["end"] is not None for r in cut)


def test_a_launcher_that_daemonizes_its_server_leaves_nothing_running(tmp_path):
    """`sh -c "(setsid server &); sleep 3"`: the server leaves the launcher's process group and,
    once the subshell is gone, its parent too, so neither the group's signals nor the process
    tree found it: it served on after the run (an audit killed it by hand). The launch's own
    environment marker finds it: the run aborts when the launcher exits, saying the server was
    daemonized, and stops it."""
    daemon = " ".join(shlex.quote(a) for a in misbehaving("ok"))
    spec = launch_spec(["sh", "-c", f"(setsid {daemon} > /dev/null 2>&1 &); sleep 3"], duration="20s", bucket="2s",
                       load="mode = closed\n    concurrency = [2]")
    proc, out = run_spec(tmp_path, spec)  # asserts that no process of the run is left behind
    assert proc.returncode == 4, proc.stderr
    reason = json.loads((out / "manifest.json").read_text())["incomplete_reason"]
    assert "server exited with status 0 during the run, leaving 1 of its processes running outside its process group" in reason
    assert "launch the server in the foreground" in reason


def test_the_reaper_ends_what_carries_a_launchs_marker_when_soakspec_dies():
    """soakspec SIGKILLed with a daemonized server: the reaper was told the launch's marker and
    ends the process that carries it, in a session of its own, when its pipe closes unclean."""
    from soakspec.runner.procs import SERVER_MARKER, Reaper

    marker = f"test-{os.getpid()}-{time.monotonic_ns()}"
    escaped = subprocess.Popen([PY, "-c", "import time; time.sleep(60)"], env={**os.environ, SERVER_MARKER: marker},
                               start_new_session=True)  # fmt: skip
    reaper = Reaper()
    reaper.start()
    try:
        reaper.watch_marker(marker)
        proc = reaper._proc
        assert proc is not None and proc.stdin is not None
        proc.stdin.close()  # as if soakspec died: no "done"
        proc.wait(timeout=10)
        assert escaped.wait(timeout=10) == -signal.SIGTERM
    finally:
        if escaped.poll() is None:
            escaped.kill()
            escaped.wait()
        reaper._proc = None


@pytest.mark.parametrize("gap", [0.1, 0.6])
def test_a_second_sigterm_while_the_run_stops_does_not_kill_it_unfinished(tmp_path, gap):
    """A service manager or an impatient user sends SIGTERM twice: the second, while the
    evidence is being finished or judged, killed soakspec (exit 143, no verdict, an audit saw
    it 3 times in 3). Now it is said and absorbed until the manifest is final, skips or stops
    the judging after: exit 4, the manifest final (`aborted`), no server left. (One that comes
    once soakspec has judged and printed everything ends it as asked: then the verdict is
    there.)"""
    marker = new_marker()
    out = tmp_path / "ev"
    proc = _start_runner(tmp_path, sim_spec(sim="ttft = 100ms\n    itl = 20ms", duration="30s", bucket="10s", max_tokens=32), marker, out)
    time.sleep(0.5)
    proc.send_signal(signal.SIGTERM)
    time.sleep(gap)
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=30)
    assert wait_no_survivors(marker) == []
    if proc.returncode == -signal.SIGTERM:  # after everything was done
        assert (out / "verdict.json").is_file() and "run aborted: interrupted by SIGTERM" in err, err
    else:
        assert proc.returncode == 4, err
    m = json.loads((out / "manifest.json").read_text())
    assert m["status"] == "aborted" and "interrupted by SIGTERM" in m["incomplete_reason"], m["status"]
    v = _verify(out)
    assert v.returncode == 3, v.stdout + v.stderr  # incomplete, not corrupt


@pytest.mark.slow
def test_sigkill_of_the_runner_kills_a_server_that_ignores_sigterm(tmp_path):
    """SIGKILL of soakspec: the reaper SIGTERMs, then SIGKILLs the server (which ignores
    SIGTERM); the evidence left behind is readable: `soakspec verify` reports it incomplete
    (exit 3), with no integrity problem."""
    marker = new_marker()
    out = tmp_path / "ev"
    spec = launch_spec(misbehaving("ok", "--ignore-sigterm"), duration="30s", bucket="10s")
    proc = _start_runner(tmp_path, spec, marker, out)
    proc.kill()
    proc.communicate(timeout=10)
    assert wait_no_survivors(marker, timeout=10) == []
    assert manifest(out)["status"] == "running"
    v = _verify(out)
    assert v.returncode == 3, v.stdout + v.stderr
    assert "V201" in v.stdout + v.stderr
    gate = subprocess.run(soakspec_cmd("gate", str(out)), capture_output=True, text=True, timeout=60)
    assert gate.returncode == 3, gate.stdout + gate.stderr
    _one_line_no_traceback(gate.stderr)


def test_disk_full_while_writing_evidence_aborts_cleanly(tmp_path):
    """RLIMIT_FSIZE (64 KiB per file, SIGXFSZ ignored so writes fail with EFBIG) on the
    runner: requests.jsonl hits the limit mid-run. One line names the path and the errno,
    exit 4, no traceback, servers stopped; what was written verifies as incomplete."""

    def limit() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (64 * 1024, 64 * 1024))

    spec = tmp_path / "t.soak"
    # the server's own log off (it would reach the limit first: requests.jsonl.gz is compressed)
    spec.write_text(sim_spec(sim="ttft = 5ms\n    itl = 1ms", max_tokens=64, duration="20s", bucket="1s", follow_up=False,
                             load="mode = closed\n    concurrency = [4]",
                             extra_backend="  log = false\n  traces {\n    source = none\n  }\n"))  # fmt: skip
    marker = new_marker()
    out = tmp_path / "ev"
    proc = subprocess.run(
        soakspec_cmd("run", str(spec), "--out", str(out), "--quiet"),
        cwd=tmp_path, env=run_env(marker), capture_output=True, text=True, timeout=90, preexec_fn=limit,
    )  # fmt: skip
    assert wait_no_survivors(marker) == []
    assert proc.returncode == 4, proc.stderr
    _one_line_no_traceback(proc.stderr)
    req = out / "backends" / "b0" / "requests.jsonl.gz"
    line = f"soakspec run: cannot write evidence: {req}: cannot write evidence: File too large (EFBIG)"
    assert line in proc.stderr.splitlines(), proc.stderr
    m = manifest(out)
    assert m["status"] == "aborted" and "EFBIG" in m["incomplete_reason"]
    assert req.stat().st_size <= 64 * 1024
    assert _verify(out).returncode == 3


# `soakspec run` whose collection after the load fails (an I/O error reading the server's log,
# say); and one whose disk also refuses the final manifest
EIO_IN_COLLECT = ("import errno, sys; from soakspec.runner import collect as c; "
                  "c._collect = lambda plan, rec: (_ for _ in ()).throw(OSError(errno.EIO, 'Input/output error')); ")
ENOSPC_ON_FINAL_MANIFEST = ("import os; write = os.write; "
                            "os.write = lambda fd, data: (_ for _ in ()).throw(OSError(errno.ENOSPC, 'No space left on device')) "
                            "if '.manifest.json.tmp' in os.readlink(f'/proc/self/fd/{fd}') and b'\"running\"' not in bytes(data) "
                            "else write(fd, data); ")  # fmt: skip
MAIN = "from soakspec.cli import main; sys.exit(main(sys.argv[1:]))"
COLLECT_REASON = "[b0] could not finish the evidence: OSError: [Errno 5] Input/output error"


def _run_with(tmp_path: Path, prelude: str) -> tuple[subprocess.CompletedProcess, Path]:
    spec = tmp_path / "t.soak"
    spec.write_text(sim_spec(duration="2s", bucket="1s"))
    marker = new_marker()
    out = tmp_path / "ev"
    proc = subprocess.run([PY, "-c", prelude + MAIN, "run", str(spec), "--out", str(out), "--quiet"],
                          cwd=tmp_path, env=run_env(marker), capture_output=True, text=True, timeout=90)  # fmt: skip
    assert wait_no_survivors(marker) == []
    return proc, out


# Ctrl-C as the run collects its evidence, after the whole load and the follow-up: the signal
# lands while collect runs on its worker thread (trio's watch, `engine._signals`, hears it)
SIGINT_IN_COLLECT = ("import os, signal, sys, time; from soakspec.runner import collect as c; real = c._collect; "
                     "c._collect = lambda plan, rec: (os.kill(os.getpid(), signal.SIGINT), time.sleep(0.5), real(plan, rec))[2]; ")


def test_a_ctrl_c_after_the_load_ended_keeps_the_run_complete(tmp_path):
    """A soak ran every level and its follow-up; Ctrl-C came while soakspec matched traces and
    wrote the manifest (minutes, for a day-long soak). The manifest said `aborted: interrupted
    by SIGINT`, and `require completed_run` FAILed a run whose every level and bucket had been
    measured -- the whole soak lost to an impatient key. The load was over: the run is
    complete, and the signal only skips the judging (exit 4, saying so, as one that comes
    after the run's own watch does)."""
    proc, out = _run_with(tmp_path, SIGINT_IN_COLLECT)
    assert proc.returncode == 4, proc.stdout + proc.stderr
    m = manifest(out)
    assert m["status"] == "complete" and m["incomplete_reason"] is None, (m["status"], m["incomplete_reason"])
    assert all(lv["completed"] for lv in m["backends"][0]["levels"])
    assert "SIGINT after the load ended" in proc.stderr, proc.stderr
    assert (f"not judged; the evidence in {out} is complete (`soakspec gate --write {out}` judges it and writes its verdict)"
            in proc.stderr), proc.stderr
    assert "internal error" not in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    gate = subprocess.run([PY, "-c", "import sys; " + MAIN, "gate", "--write", str(out)], cwd=tmp_path, env=run_env(new_marker()),
                          capture_output=True, text=True, timeout=90)
    assert "completed_run" in gate.stdout and "status is aborted" not in gate.stdout, gate.stdout


def test_a_failure_collecting_the_evidence_aborts_the_run_with_its_reason(tmp_path):
    """A failure after the load, while a backend's evidence is collected (`runner/collect.py`),
    ends the manifest `aborted` with that failure as its reason (exit 4) -- not `running`
    behind a schema error about the backend's entry: the entry holds what was known
    (`unfinished_entry`: the levels that ran, `collect_error`), so `verify` reads the evidence
    as incomplete and `gate` judges it, naming the reason."""
    proc, out = _run_with(tmp_path, EIO_IN_COLLECT)
    assert proc.returncode == 4, proc.stdout + proc.stderr
    _one_line_no_traceback(proc.stderr)
    assert "schema" not in proc.stderr and "internal error" not in proc.stderr, proc.stderr
    assert f"soakspec run: run aborted: {COLLECT_REASON}" in proc.stderr.splitlines(), proc.stderr
    m = manifest(out)
    assert m["status"] == "aborted" and m["incomplete_reason"] == COLLECT_REASON, m["incomplete_reason"]
    (entry,) = m["backends"]
    assert entry["collect_error"] == "OSError: [Errno 5] Input/output error"
    assert entry["levels"] and entry["model"]["fingerprint"] is None and "not fingerprinted" in entry["model"]["reason"]
    assert requests_of(out), "the requests the load recorded stay"
    v = _verify(out)
    assert v.returncode == 3, v.stdout + v.stderr  # incomplete, nothing corrupt
    assert f"run status is aborted: {COLLECT_REASON}" in v.stdout
    gate = subprocess.run(soakspec_cmd("gate", str(out)), capture_output=True, text=True, timeout=60)
    assert gate.returncode == 3, gate.stdout + gate.stderr
    _one_line_no_traceback(gate.stderr)
    assert f"completed_run — the run's status is aborted: {COLLECT_REASON}" in gate.stdout, gate.stdout


def test_a_final_manifest_the_disk_refuses_leaves_the_first_one_readable(tmp_path):
    """The disk refusing the final manifest (ENOSPC) leaves the start-of-run manifest whole
    (it is replaced atomically: no temporary file left), and says both the write error and
    how the run had ended; `verify` reads the evidence as never finalized (exit 3)."""
    proc, out = _run_with(tmp_path, EIO_IN_COLLECT + ENOSPC_ON_FINAL_MANIFEST)
    assert proc.returncode == 4, proc.stdout + proc.stderr
    _one_line_no_traceback(proc.stderr)
    lines = proc.stderr.splitlines()
    assert f"soakspec run: error: {out / 'manifest.json'}: cannot write evidence: No space left on device (ENOSPC)" in lines, proc.stderr
    assert (f"soakspec run: the final manifest could not be written; {out / 'manifest.json'} still says `running` "
            f"(the run ended aborted: {COLLECT_REASON})") in lines, proc.stderr  # fmt: skip
    assert manifest(out)["status"] == "running"
    assert not [p.name for p in out.iterdir() if ".tmp" in p.name]
    v = _verify(out)
    assert v.returncode == 3, v.stdout + v.stderr
    assert "V204" in v.stdout


def test_a_verdict_the_disk_refuses_is_said_as_such_not_as_a_bug(tmp_path):
    """The manifest final, the disk refusing verdict.json (ENOSPC): exit 4 with the write error
    and the run's own reason, never "internal error ... this is a bug"; the evidence verifies
    and `gate` judges it."""
    refuse = ENOSPC_ON_FINAL_MANIFEST.replace(".manifest.json.tmp", ".verdict.json.tmp")
    proc, out = _run_with(tmp_path, EIO_IN_COLLECT + refuse)
    assert proc.returncode == 4, proc.stdout + proc.stderr
    _one_line_no_traceback(proc.stderr)
    assert "internal error" not in proc.stderr, proc.stderr
    lines = proc.stderr.splitlines()
    assert (f"soakspec run: error: {out / 'verdict.json'}: cannot write evidence: No space left on device (ENOSPC); "
            f"the evidence is kept: `soakspec gate --write {out}` judges it and writes what is missing") in lines, proc.stderr  # fmt: skip
    assert f"soakspec run: run aborted: {COLLECT_REASON}" in lines, proc.stderr
    assert manifest(out)["status"] == "aborted" and not (out / "verdict.json").exists()
    assert _verify(out).returncode == 3
    gate = subprocess.run(soakspec_cmd("gate", str(out)), capture_output=True, text=True, timeout=60)
    assert gate.returncode == 3 and COLLECT_REASON in gate.stdout, gate.stdout + gate.stderr


@pytest.mark.slow
def test_a_second_run_into_a_directory_in_use_is_refused(tmp_path):
    """While a run writes into --out, a second run into the same directory is refused (exit
    2, a usage error: nothing ran; "in use by pid N") and does not disturb the first, which
    finishes complete."""
    marker = new_marker()
    out = tmp_path / "ev"
    first = _start_runner(tmp_path, sim_spec(duration="3s", bucket="1s"), marker, out)
    second = run_soakspec(["run", str(tmp_path / "t.soak"), "--out", str(out), "--quiet"], marker, tmp_path)
    assert second.returncode == 2
    assert f"evidence directory {out} is in use by pid {first.pid}" in second.stderr
    _, err = first.communicate(timeout=60)
    assert first.returncode in RUN_COMPLETED, err
    assert manifest(out)["status"] == "complete"
    assert wait_no_survivors(marker) == []


# ------------------------------------------------------------------ kept-alive connections (issue 15)


def test_a_server_that_drops_every_second_kept_alive_request_fails_the_gate(tmp_path):
    """The server reads the second request of each kept-alive connection and closes it without
    answering. Every dropped request is its own `disconnected` record (the client never resends
    it silently on a fresh connection), about half of all requests, and `disconnected == 0`
    FAILs (exit 1)."""
    spec = launch_spec(misbehaving("drop-second"), load="mode = closed\n    concurrency = [2]",
                       gate="require disconnected == 0")  # fmt: skip
    proc, out = run_spec(tmp_path, spec)
    assert proc.returncode == 1, proc.stderr
    assert manifest(out)["status"] == "complete"
    rows = requests_of(out)
    outcomes = [r["outcome"] for r in rows]
    dropped = [r for r in rows if r["outcome"] == "disconnected"]
    assert set(outcomes) == {"completed", "disconnected"}, {(r["outcome"], r["error"]) for r in rows}
    assert {r["error"] for r in dropped} == {"connection closed before the response"}
    assert abs(len(dropped) - outcomes.count("completed")) <= 2  # one of every two, per connection
    log = server_log_bytes(out / "backends" / "b0").decode()
    assert log.count("dropping request") == len(dropped)  # each drop the server made is on the record


def test_a_server_that_closes_idle_connections_drops_nothing(tmp_path):
    """uvicorn's keep-alive timeout, shortened: the server closes a connection idle for 0.2 s;
    requests come every 0.5 s on the same (idle) connection. The client sees the close before
    sending and reconnects: every request completes, nothing is `disconnected`, the gate passes."""
    spec = launch_spec(misbehaving("idle-close", "--idle-close", "0.2"),
                       load="mode = open\n    rate = [2rps]\n    arrival = constant", duration="2s",
                       gate="require disconnected == 0\n  require failed == 0")  # fmt: skip
    proc, out = run_spec(tmp_path, spec)
    rows = requests_of(out)
    assert len(rows) >= 4, proc.stderr
    assert {(r["outcome"], r["error"]) for r in rows} == {("completed", None)}
    log = server_log_bytes(out / "backends" / "b0").decode()
    assert log.count("closing a connection idle for 0.2 s after 1 requests") >= len(rows) - 1  # the idle closes happened
    assert manifest(out)["status"] == "complete"
    assert proc.returncode in (0, 3), proc.stderr  # 3: too few samples for a verdict, never a FAIL


# ------------------------------------------------------------------ the server's own word (issue 16)


EMPTY_TEXT_SPEC = sim_spec(sim="ttft = 20ms\n    itl = 5ms\n    empty_text_rate = 100%", duration="1s", follow_up=False)


def test_empty_text_completions_are_completed_and_flagged(tmp_path):
    """The simulator's `empty_text_rate = 100%`: every request gets its tokens (usage counts
    them, `finish_reason: length`, `[DONE]`) but they decode to empty text. The server says
    they completed: every record is `completed` with `empty_text`, its tokens counted, its TTFT
    at the first token event."""
    proc, out = run_spec(tmp_path, EMPTY_TEXT_SPEC)
    assert proc.returncode in RUN_COMPLETED, proc.stderr
    assert manifest(out)["status"] == "complete"
    rows = requests_of(out)
    assert rows and {(r["outcome"], r["error"], r["empty_text"]) for r in rows} == {("completed", None, True)}
    assert {r["output_tokens"] for r in rows} == {8} and {r["output_chars"] for r in rows} == {0}
    assert all(r["ttft"] is not None and 0.015 <= r["ttft"] for r in rows)
    assert _verify(out).returncode in (0, 3)


EMPTY_TEXT_GATE = "require failed == 0\n  require empty_text >= 1\n  require completed_run"


def test_the_gate_counts_empty_text_completions_as_completed(tmp_path):
    """Issue 16's must-show, at the verdict: empty-text completions are completed (`failed == 0`
    holds) and counted as `empty_text`; a 0-token stream is failed (test_faults' zero-tokens)."""
    spec = EMPTY_TEXT_SPEC.replace("require failed == 0", EMPTY_TEXT_GATE)
    assert spec != EMPTY_TEXT_SPEC
    proc, _ = run_spec(tmp_path, spec, "--format", "json")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rules = {r["rule"]: r for r in json.loads(proc.stdout)["rules"]}
    assert rules["failed == 0"]["status"] == "pass"
    assert rules["empty_text >= 1"]["status"] == "pass"


def test_a_server_stopped_by_the_file_size_limit_it_inherited_says_so(tmp_path):
    """soakspec under `ulimit -f` (here 256 KiB): the server it launches inherits the limit and
    fails writing past it -- a launch that writes a 1 MB file (a cache, its own log file) before
    listening; Python ignores SIGXFSZ, so the write raises EFBIG and the server exits 1. The
    message said only "exited with status 1 before it was ready"; it names the limit and the
    fix."""

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (256 * 1024, 256 * 1024))

    chatty = [PY, "-c", "import time; open('cache.bin', 'wb').write(b'x' * 1_000_000); time.sleep(600)"]
    spec = tmp_path / "t.soak"
    spec.write_text(launch_spec(chatty, ready_timeout="20s"))
    marker = new_marker()
    out = tmp_path / "ev"
    proc = subprocess.run(soakspec_cmd("run", str(spec), "--out", str(out), "--quiet"), cwd=tmp_path,
                          env=run_env(marker), capture_output=True, text=True, timeout=90, preexec_fn=limit)
    assert wait_no_survivors(marker) == []
    err = proc.stderr[:2000]
    assert proc.returncode == 4, err
    assert "backend 'b0': exited with status 1 before it was ready; soakspec runs under a file-size limit" in err, err
    assert "(ulimit -f) of 262144 bytes" in err and "ulimit -f unlimited" in err and "File too large" in err, err
    assert "file-size limit" in manifest(out)["incomplete_reason"]


def test_the_file_size_limit_note_is_certain_only_where_the_limit_stopped_the_server(tmp_path, monkeypatch):
    """Killed by SIGXFSZ (a server that does not ignore it), or a log at the limit: the limit
    stopped it. Any other unsuccessful exit under a limit: it may be why. No limit, or a clean
    exit: nothing said."""
    from soakspec.runner import procs

    log = tmp_path / "server.log"
    log.write_bytes(b"x" * 100)
    monkeypatch.setattr(resource, "getrlimit", lambda what: (1000, 1000))
    assert procs.full_disk_note(log, -signal.SIGXFSZ).endswith(
        "a server that writes a larger file is stopped -- raise the limit (ulimit -f unlimited)")
    assert "which may be why it exited" in procs.full_disk_note(log, 1)
    assert procs.full_disk_note(log, 0) == ""
    log.write_bytes(b"x" * 1000)
    assert "and its log reached" in procs.full_disk_note(log, 1) and "may be why" not in procs.full_disk_note(log, 1)
    monkeypatch.setattr(resource, "getrlimit", lambda what: (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
    assert procs.full_disk_note(log, -signal.SIGXFSZ) == ""


# ------------------------------------------------------------------ a port another process answers


def _picks(port: int) -> str:
    """A prelude for `_run_spec_with`: soakspec's free-port choice lands on `port` (as when another
    process takes the port between soakspec's choice and its server's bind, or a container still
    publishes it with nothing listening on this host)."""
    return f"import sys; import soakspec.runner.procs as _p; _p.free_port = lambda host='127.0.0.1': {port}; "


def _run_spec_with(tmp_path: Path, prelude: str, spec_text: str) -> tuple[subprocess.CompletedProcess, Path]:
    spec = tmp_path / "t.soak"
    spec.write_text(spec_text)
    marker = new_marker()
    out = tmp_path / "ev"
    proc = subprocess.run([PY, "-c", prelude + MAIN, "run", str(spec), "--out", str(out), "--quiet"],
                          cwd=tmp_path, env=run_env(marker), capture_output=True, text=True, timeout=90)  # fmt: skip
    assert wait_no_survivors(marker) == []
    return proc, out


def _answer_everything(srv: socket.socket, stop: threading.Event) -> None:
    """Answer each HTTP request on `srv` (listening) with 200 and `{}` until `stop` is set."""
    srv.settimeout(0.1)
    while not stop.is_set():
        try:
            conn, _ = srv.accept()
        except OSError:
            continue
        with conn:
            conn.settimeout(2)
            try:
                conn.recv(65536)
                conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n"
                             b"connection: close\r\n\r\n{}")
            except OSError:
                pass


def test_a_port_another_process_answers_is_refused_before_anything_is_launched(tmp_path):
    """A server left from an earlier run answers at the port soakspec picked: soakspec refuses
    before launching anything -- the spec's server command never runs (it would write its marker
    file first thing), exit 4, the backend, the address and the listening process (this test's own
    pid) named -- rather than probing, loading and measuring the old server in the new one's place."""
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    port = holder.getsockname()[1]
    stop = threading.Event()
    answering = threading.Thread(target=_answer_everything, args=(holder, stop), daemon=True)
    answering.start()
    ran = tmp_path / "server-ran"
    argv = [PY, "-c", "import sys, time; open(sys.argv[1], 'w').write('ran'); time.sleep(30)", str(ran), "{port}"]
    try:
        proc, out = _run_spec_with(tmp_path, _picks(port), launch_spec(argv))
    finally:
        stop.set()
        answering.join(5)
        holder.close()
    assert proc.returncode == 4, proc.stderr
    assert not ran.exists(), "the spec's server command was run"
    _one_line_no_traceback(proc.stderr)
    said = f"backend 'b0': 127.0.0.1:{port}, the port soakspec picked for it, already accepts connections (PID {os.getpid()}: "
    assert said in proc.stderr, proc.stderr
    assert "nothing was launched: a server left from an earlier run" in proc.stderr
    m = manifest(out)
    assert m["status"] == "aborted" and f"127.0.0.1:{port}" in m["incomplete_reason"]
    assert requests_of(out) == []
    assert _verify(out).returncode == 3, "aborted evidence is intact but incomplete"


def test_a_server_that_dies_while_another_process_answers_its_probe_is_never_ready(tmp_path):
    """soakspec's server dies while its readiness probe is in flight, and another process (which
    took the port after soakspec looked: it did not listen then) answers the probe: the death wins
    -- the run aborts saying the server died before it was ready and who answered, and no request
    goes to the other process."""
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))  # bound, not listening: the check before launching finds nothing
    port = holder.getsockname()[1]
    pidfile = tmp_path / "server.pid"
    argv = [PY, "-c", "import os, sys, time; open(sys.argv[1], 'w').write(str(os.getpid())); time.sleep(60)",
            str(pidfile), "{port}"]  # fmt: skip
    stop = threading.Event()
    seen: list[bytes] = []

    def take_the_port_then_answer() -> None:
        pid = pid_from_file(pidfile)
        holder.listen()
        holder.settimeout(20)
        conn, _ = holder.accept()  # soakspec's readiness probe
        with conn:
            seen.append(conn.recv(65536))
            os.kill(pid, signal.SIGKILL)  # the server dies while the probe waits for its answer
            deadline = time.monotonic() + 10
            while pid_running(pid) and time.monotonic() < deadline:
                time.sleep(0.01)
            conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\nconnection: close\r\n\r\n{}")
        _answer_everything(holder, stop)

    helper = threading.Thread(target=take_the_port_then_answer, daemon=True)
    helper.start()
    try:
        proc, out = _run_spec_with(tmp_path, _picks(port), launch_spec(argv))
    finally:
        stop.set()
        helper.join(25)
        holder.close()
    assert proc.returncode == 4, proc.stderr
    assert seen and seen[0].startswith(b"GET /v1/models "), seen
    said = (f"backend 'b0': killed by SIGKILL before it was ready; http://127.0.0.1:{port}/v1/models was answered "
            "by another process listening on its port, which soakspec did not start")
    assert said in proc.stderr, proc.stderr
    assert requests_of(out) == [] and not manifest(out)["backends"][0].get("preflight")


def test_only_a_loopback_port_that_accepts_is_taken():
    """`port_taken`: a listening loopback port is taken, named with the process that listens (this
    test's own); a bound port that does not listen is free; an address that is not loopback is not
    looked at (soakspec launches servers on loopback only, and never connects elsewhere to check)."""
    from soakspec.runner.procs import port_taken

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        assert port_taken("127.0.0.1", port) is None
        s.listen()
        held = port_taken("127.0.0.1", port)
        assert held is not None and held.startswith(f" (PID {os.getpid()}: "), held
        assert port_taken("192.0.2.1", port) is None  # TEST-NET-1: would hang or refuse, never tried


# ------------------------------------------------------------------ a grandchild that escapes everything

ESCAPING_SERVER = """\
import os, socket, sys, time
pidfile, port = sys.argv[1], sys.argv[2]
if os.fork() == 0:
    if os.fork() == 0:
        os.setsid()  # out of the server's session and process group
        # re-exec with an empty environment: no SOAKSPEC_SERVER marker, no test marker
        code = ("import os, socket, sys, time; s = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen(); "
                "open(sys.argv[1], 'w').write(str(os.getpid())); time.sleep(120)")
        os.execve(sys.executable, [sys.executable, "-c", code, pidfile], {})
    os._exit(0)  # its parent exits: the grandchild is an orphan, out of the server's process tree
os.wait()
os.execv(sys.executable, [sys.executable, MISBEHAVING, "--port", port, *sys.argv[3:]])
"""


@pytest.mark.parametrize("ending", ["passes", "passes with --workers 2", "the server dies", "SIGINT", "SIGKILL"])
def test_a_grandchild_that_leaves_the_session_and_its_environment_is_stopped(tmp_path, ending):
    """A server whose grandchild calls setsid() and re-execs itself with an empty environment
    (a daemonizing helper): neither the process group, nor the process tree, nor the launch's
    environment marker finds it, and it outlived every run. soakspec is its run's child subreaper,
    so the orphan is re-parented to it and stopped at teardown -- whether the run passes (its
    `--workers` load processes, children in sessions of their own too, are not taken for orphans),
    aborts because the server died, or is interrupted -- and by the reaper process, told each
    orphan the run adopted, when soakspec itself is SIGKILLed."""
    script = tmp_path / "escaping.py"
    script.write_text(ESCAPING_SERVER.replace("MISBEHAVING", repr(str(MISBEHAVING))))
    pidfile = tmp_path / "grandchild.pid"
    crash = ["--mode", "die-mid-stream"] if ending == "the server dies" else []
    argv = [PY, str(script), str(pidfile), "{port}", *crash]
    spec_text = launch_spec(argv, duration="20s" if ending.startswith("SIG") else "2s")
    grandchild = None
    try:
        if ending.startswith("SIG"):
            marker = new_marker()
            proc = _start_runner(tmp_path, spec_text, marker, tmp_path / "ev")
            grandchild = pid_from_file(pidfile)
            proc.send_signal(getattr(signal, ending))
            _, err = proc.communicate(timeout=60)
            assert wait_no_survivors(marker) == []
            rc = proc.returncode
            if ending == "SIGKILL":  # nothing of soakspec's own says anything: the reaper ends it
                assert rc == -signal.SIGKILL
                assert wait_not_running(grandchild, timeout=10), f"the escaped grandchild {grandchild} outlived soakspec"
                return
        else:
            done, out = run_spec(tmp_path, spec_text, *(["--workers", "2"] if "workers" in ending else []))
            rc, err = done.returncode, done.stderr
            grandchild = pid_from_file(pidfile)
            if ending.startswith("passes"):
                m = manifest(out)
                assert m["status"] == "complete", m["incomplete_reason"]
                assert m["host"]["child_subreaper"] == {"enabled": True, "reason": None}
                if "workers" in ending:
                    assert [lv["workers"] for lv in m["backends"][0]["levels"]] == [2]
        assert rc in (RUN_COMPLETED if ending.startswith("passes") else (4,)), err
        assert wait_not_running(grandchild), f"the escaped grandchild {grandchild} outlived the run"
        assert "found as orphans soakspec adopted" in err, err
    finally:
        if grandchild is not None and pid_running(grandchild):
            os.kill(grandchild, signal.SIGKILL)
