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


def _run(tmp_path: Path, prelude: str, spec_text: str) -> tuple[subprocess.CompletedProcess, Path]:
    """`soakspec run` after `prelude` (Python run before soakspec is imported); every process it
    started gone after."""
    spec = tmp_path / "t.soak"
    spec.write_text(spec_text)
    marker = new_marker()
    out = tmp_path / "ev"
    proc = subprocess.run([PY, "-c", prelude + MAIN, "run", str(spec), "--out", str(out), "--quiet"],
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
