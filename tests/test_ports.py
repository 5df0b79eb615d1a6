"""The ports of launched servers: each one the run's own, and answered by its own server.

Two gaps, each tested through real processes on 127.0.0.1:

- `procs.free_port` asks the OS for a free port by binding port 0 and closing the socket, so two
  asks (or one ask and a server that has not bound yet) can get the same number: a run's
  `PortAllocator` remembers what it handed out and asks again (bounded). The seam: the run's
  `procs.free_port` replaced (before soakspec imports it) by one that gives the same port twice,
  as the OS may.
- a port taken after the check before launching, while the launched server loads: the readiness
  probe is answered by that other process. At readiness the listener on the port must belong to
  the launched server's process tree (`procs.port_owner`), else the run aborts naming it.
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import threading
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from runner_support import manifest, new_marker, pid_from_file, requests_of, run_env, wait_no_survivors

PY = sys.executable
MAIN = "from soakspec.cli import main; sys.exit(main(sys.argv[1:]))"
SIM_ARGV = [PY, "-m", "soakspec", "sim", "--port", "{port}", "--ttft", "5ms", "--itl", "1ms", "--model", "default",
            "--no-trace-log"]  # fmt: skip


def _q(s: str) -> str:
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _spec(backends: dict[str, list[str]], *, parallel: bool, probe: str = "/v1/models") -> str:
    """One launched backend per entry (name -> argv), a 1 s level each."""
    parts = [f'soak "ports" {{\n  issue = "ports"\n  parallel = {"true" if parallel else "false"}\n}}\n']
    for name, argv in backends.items():
        parts.append(
            f'backend "{name}" {{\n  launch = [{", ".join(_q(a) for a in argv)}]\n'
            f'  ready {{\n    path = "{probe}"\n    timeout = 20s\n    interval = 100ms\n  }}\n'
            f'  shutdown_grace = 2s\n  runtime {{\n    label = "x"\n  }}\n}}\n'
        )
    parts.append(
        'workload "w" {\n  prompt_words = 8\n  max_tokens = 4\n  load {\n    mode = closed\n    concurrency = [1]\n  }\n'
        '  duration = 1s\n  bucket = 1s\n  deadline = 3s\n  follow_up = false\n}\n'
        'gate {\n  require failed == 0\n}\nclaims {\n  claim "ports"\n}\n'
    )
    return "\n".join(parts)


def _run(tmp_path: Path, prelude: str, spec_text: str, quiet: bool = True) -> tuple[subprocess.CompletedProcess, Path]:
    """`soakspec run` after `prelude` (Python run before soakspec is imported); every process it
    started gone after. `quiet`: with --quiet (its progress lines left out)."""
    spec = tmp_path / "t.soak"
    spec.write_text(spec_text)
    marker = new_marker()
    out = tmp_path / "ev"
    proc = subprocess.run([PY, "-c", prelude + MAIN, "run", str(spec), "--out", str(out)] + ["--quiet"] * quiet,
                          cwd=tmp_path, env=run_env(marker), capture_output=True, text=True, timeout=120)  # fmt: skip
    assert wait_no_survivors(marker) == [], "a process the run started outlived it"
    return proc, out


def _os_gives_twice(port: int) -> str:
    """A prelude: the OS's free-port answer (`procs.free_port`) is `port` for the first two asks,
    then the real one -- as when the OS hands a port out again before the first taker binds it."""
    return ("import sys; import soakspec.runner.procs as _p; _real = _p.free_port; _n = [0]\n"
            f"def _twice(host='127.0.0.1'):\n    _n[0] += 1\n    return {port} if _n[0] <= 2 else _real(host)\n"
            "_p.free_port = _twice\n")  # fmt: skip


def _unused_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_launched_backends_are_given_distinct_ports_when_the_os_repeats_one(tmp_path):
    """Two simulators launched side by side while the OS answers the same free port twice: each is
    given its own port, both serve and the run completes -- rather than both being started on one
    port, where the second cannot bind (or the first answers for both) and the run aborts."""
    port = _unused_port()
    proc, out = _run(tmp_path, _os_gives_twice(port), _spec({"b0": SIM_ARGV, "b1": SIM_ARGV}, parallel=True))
    assert proc.returncode in (0, 3), proc.stderr
    m = manifest(out)
    assert m["status"] == "complete", m.get("incomplete_reason")
    urls = [b["url"] for b in m["backends"]]
    assert len(set(urls)) == 2, urls
    assert f"http://127.0.0.1:{port}" in urls, "the first ask's port is used"
    for b in m["backends"]:
        assert b["port_listener"]["owner"] == "server", b["port_listener"]
        assert b["port_listener"]["pid"] is not None
    assert requests_of(out, "b0") and requests_of(out, "b1")


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(1024, 1040), min_size=1, max_size=40), st.integers(1, 8))
def test_the_allocator_never_hands_out_a_port_twice(answers, tries):
    """Whatever the OS answers, a run's allocator hands out each port at most once, and says it
    has none (None) only after `tries` answers in a row that it had already handed out."""
    from soakspec.runner.procs import PortAllocator

    it = iter(answers)
    asked: list[int] = []

    def pick(host: str) -> int:
        asked.append(next(it))
        return asked[-1]

    alloc = PortAllocator(pick=pick, tries=tries)
    given_out: list[int] = []
    while len(answers) - len(asked) >= tries:
        start = len(asked)
        port = alloc.allocate("127.0.0.1")
        this = asked[start:]
        if port is None:
            assert len(this) == tries and all(p in given_out for p in this)
        else:
            assert port not in given_out and this[-1] == port and all(p in given_out for p in this[:-1])
            given_out.append(port)
    assert sorted(alloc.handed_out) == sorted(given_out)


SLEEPER = "import os, sys, time; open(sys.argv[1], 'w').write(str(os.getpid())); time.sleep(60)"


def test_a_port_another_process_took_while_the_server_loads_aborts_naming_it(tmp_path):
    """The launched server is still loading (it sleeps, never binds) when another process binds its
    port and answers its readiness probe: that answer does not make the backend ready. The run
    aborts (exit 4) naming the listener -- its pid (this test's) and command line --, the server
    is stopped, and the other process receives nothing but readiness probes: no pre-flight, no load."""
    decoy = socket.socket()
    decoy.bind(("127.0.0.1", 0))  # bound, not listening: the check before launching finds the port free
    port = decoy.getsockname()[1]
    pidfile = tmp_path / "server.pid"
    seen: list[bytes] = []
    stop = threading.Event()

    def take_the_port_and_answer() -> None:
        pid_from_file(pidfile)  # the server was launched
        decoy.listen()
        decoy.settimeout(0.1)
        while not stop.is_set():
            try:
                conn, _ = decoy.accept()
            except OSError:
                continue
            with conn:
                conn.settimeout(2)
                try:
                    seen.append(conn.recv(65536))
                    conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n"
                                 b"connection: close\r\n\r\n{}")
                except OSError:
                    pass

    helper = threading.Thread(target=take_the_port_and_answer, daemon=True)
    helper.start()
    prelude = f"import sys; import soakspec.runner.procs as _p; _p.free_port = lambda host='127.0.0.1': {port}\n"
    try:
        proc, out = _run(tmp_path, prelude, _spec({"b0": [PY, "-c", SLEEPER, str(pidfile), "{port}"]},
                                                  parallel=False, probe="/health"))  # fmt: skip
    finally:
        stop.set()
        helper.join(10)
        decoy.close()
    assert proc.returncode == 4, proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    said = (f"backend 'b0': http://127.0.0.1:{port}/health was answered by another process listening on its port "
            f"(PID {os.getpid()}: ")
    assert said in proc.stderr, proc.stderr
    assert "not the launched server" in proc.stderr and "no load was sent -- stop it, then run again" in proc.stderr, proc.stderr
    assert seen, "the decoy answered no readiness probe: the case is not exercised"
    assert all(r.startswith(b"GET /health ") for r in seen), [r[:40] for r in seen]
    m = manifest(out)
    assert m["status"] == "aborted" and f"PID {os.getpid()}" in m["incomplete_reason"]
    b0 = m["backends"][0]
    assert b0["ready_at"] is None and not b0.get("preflight")
    assert b0["stop_signal"] in ("SIGTERM", "SIGKILL"), "the launched server was stopped"
    assert requests_of(out) == []


def test_a_server_its_launcher_started_as_a_child_owns_its_port(tmp_path):
    """The listener is a child of the launched command (a shell that runs the server and waits
    for it), not the launched process itself: it is the server's, the run completes, and the
    manifest names the child's pid as the port's listener."""
    pidfile = tmp_path / "shell.pid"
    sim = " ".join(a if a != "{port}" else '"$1"' for a in SIM_ARGV)
    argv = ["sh", "-c", f'echo $$ > "$0"; {sim}; exit $?', str(pidfile), "{port}"]
    proc, out = _run(tmp_path, "import sys\n", _spec({"b0": argv}, parallel=False))
    assert proc.returncode in (0, 3), proc.stderr
    b0 = manifest(out)["backends"][0]
    assert b0["port_listener"]["owner"] == "server", b0["port_listener"]
    assert b0["port_listener"]["pid"] not in (None, b0["pid"]), "the shell's child holds the socket"
    assert b0["pid"] == pid_from_file(pidfile)


def test_where_proc_cannot_tell_the_run_goes_on_and_the_manifest_says_why(tmp_path):
    """No listening socket for the port in this network namespace (as with a container's published
    port: the seam makes /proc show none): whose socket answers is not known, the run goes on,
    and the manifest's `port_listener` says it was not checked and why -- as the progress line
    on stderr does, in a sentence that says the run goes on."""
    prelude = "import sys; import soakspec.runner.procs as _p; _p.listening = lambda port, host=None: _p.Listening(0, ())\n"
    proc, out = _run(tmp_path, prelude, _spec({"b0": SIM_ARGV}, parallel=False), quiet=False)
    assert proc.returncode in (0, 3), proc.stderr
    assert re.search(r"\[b0\] which process answers at http://127\.0\.0\.1:\d+\S* was not checked \(no process of "
                     r"this host's network namespace listens there: a forwarded port, a container's\?\): the run goes "
                     r"on, and the manifest's port_listener says why", proc.stderr), proc.stderr
    m = manifest(out)
    assert m["status"] == "complete"
    listener = m["backends"][0]["port_listener"]
    assert listener["owner"] == "unknown" and "no process of this host's network namespace listens there" in listener["reason"]


def test_only_sockets_that_take_the_probed_address_count():
    """`procs.listening`: a socket listening on 127.0.0.1 is this test's process for 127.0.0.1
    and for any address, and no socket for ::1 (a listener there does not answer 127.0.0.1's
    connections, nor the other way round)."""
    from soakspec.runner.procs import listening

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        for host in ("127.0.0.1", "localhost", None):
            seen = listening(port, host)
            assert seen.sockets == 1 and seen.holders[0][0] == os.getpid(), (host, seen)
        assert listening(port, "::1").sockets == 0


def test_a_listener_in_another_namespace_is_not_known_and_one_in_ours_is_another(tmp_path):
    """`procs.port_owner` for a launched server (a sleeping process) while another process holds
    its port: one in soakspec's namespaces is "other", named by pid and command line; one in a
    mount namespace of its own (a container's server on the host network, which the container
    engine starts, not the launch) is "unknown", with the reason -- never taken for the server."""
    import shutil

    import trio

    from soakspec.runner.procs import Server, port_owner

    listen = ("import socket, sys, time; s = socket.socket(); s.bind(('127.0.0.1', int(sys.argv[1]))); s.listen(); "
              "print('ok', flush=True); time.sleep(30)")  # fmt: skip

    async def main() -> None:
        sleeper = await trio.lowlevel.open_process([PY, "-c", "import time; time.sleep(30)"], start_new_session=True)
        server = Server("b0", sleeper, sleeper.pid, None, 0.0)
        try:
            for prefix, owner in (([], "other"), (["unshare", "-m"], "unknown")):
                if prefix and (shutil.which("unshare") is None or subprocess.run([*prefix, "true"]).returncode != 0):
                    continue  # no mount namespace to be had here
                port = _unused_port()
                holder = subprocess.Popen([*prefix, PY, "-c", listen, str(port)], stdout=subprocess.PIPE, text=True)
                try:
                    assert holder.stdout.readline().strip() == "ok"
                    found = port_owner(server, "127.0.0.1", port)
                    assert found.owner == owner, found
                    assert found.via == {"other": "other", "unknown": "namespace"}[owner], found
                    assert found.pid == holder.pid or prefix, found  # unshare may fork: its child listens
                    if owner == "other":
                        assert found.command is not None and found.command.startswith(PY), found
                    else:
                        assert "another PID or mount namespace" in found.reason, found
                finally:
                    holder.kill()
                    holder.wait()
        finally:
            sleeper.kill()
            await sleeper.wait()

    trio.run(main)


def test_the_manifest_records_what_held_the_port_as_a_fact(monkeypatch):
    """`port_listener.via` says what held the launched server's port -- its own socket, a
    container engine's port forward, none in soakspec's network namespace, an unreadable
    process -- as a value `compare` reads, not a phrase in `reason` (which says it to a person
    and may be reworded). Evidence written before `via` is read by its reason text as it ran:
    for every kind the runner writes, that reading and the reading of `via` agree."""
    import types

    from soakspec.evidence import netpath
    from soakspec.runner import procs

    me = os.getpid()
    server = procs.Server("b0", types.SimpleNamespace(pid=me), me, None, 0.0)
    seen = {
        "server": procs.Listening(1, ((me, "python -m soakspec sim"),)),
        "forward": procs.Listening(1, ((1, "/usr/bin/docker-proxy -proto tcp -host-port 8000"),)),
        "unseen": procs.Listening(0, ()),
        "unreadable": procs.Listening(1, (), procs.NOT_READABLE),
    }
    for via, listening in seen.items():
        monkeypatch.setattr(procs, "listening", lambda port, host=None, s=listening: s)
        written = procs.port_owner(server, "127.0.0.1", 8000).to_json()
        assert written["via"] == via, written
        assert via in netpath.VIAS
        before = {k: v for k, v in written.items() if k != "via"}  # as the manifest said it before `via`
        assert netpath.hop(written) == netpath.hop(before), (via, written)
    assert netpath.hop({"owner": "unknown", "via": "forward", "pid": 1, "reason": None}) == netpath.THROUGH_FORWARD
