"""The load generator out of file descriptors (EMFILE) is the client's failure, never the
server's: the requests it could not send are recorded as never sent (no `start`, an error
naming the limit), `client_healthy` makes the run INCONCLUSIVE saying so, no rule FAILs the
server for them, and nothing in the runner crashes -- the manifest always ends with a status
and a reason. `soakspec run` lifts its soft RLIMIT_NOFILE to the hard limit first."""

from __future__ import annotations

import errno
import json
import resource
import subprocess
import sys
from pathlib import Path

import pytest
import trio

from runner_support import manifest, new_marker, requests_of, run_env, sim_spec, soakspec_cmd, wait_no_survivors
from soakspec.runner.fdlimit import NOT_SENT, local_errno, not_sent_error

GATE = "require errors == 0"


def _spec(tmp_path: Path, concurrency: int) -> Path:
    spec = tmp_path / "t.soak"
    spec.write_text(sim_spec(sim="ttft = 20ms\n    itl = 5ms\n    slots = 512", load=f"mode = closed\n    concurrency = [{concurrency}]",
                             duration="2s", bucket="1s", deadline="2s", gate=GATE, follow_up=False))
    return spec


def _run(tmp_path: Path, spec: Path, nofile: tuple[int, int], cmd: list[str] | None = None) -> tuple[subprocess.CompletedProcess, Path]:
    """`soakspec run` (or `cmd`) with RLIMIT_NOFILE set to `nofile` (soft, hard) in the child."""
    marker = new_marker()
    out = tmp_path / "ev"
    argv = (cmd or soakspec_cmd()) + ["run", str(spec), "--out", str(out), "--quiet"]
    proc = subprocess.run(argv, cwd=tmp_path, env=run_env(marker), capture_output=True, text=True, timeout=60,
                          preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NOFILE, nofile))
    assert wait_no_survivors(marker) == []
    return proc, out


def _hard() -> int:
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    return 1 << 16 if hard == resource.RLIM_INFINITY else hard


@pytest.mark.parametrize("concurrency", [96, 200])
def test_out_of_file_descriptors_is_inconclusive_never_a_server_fail(tmp_path, concurrency):
    proc, out = _run(tmp_path, _spec(tmp_path, concurrency), (100, 100))
    text = proc.stdout + proc.stderr
    assert proc.returncode == 3, text  # INCONCLUSIVE: not 1 (a server FAIL), not 4 (a crash)
    assert "internal error" not in text and "FAIL" not in text, text
    m = manifest(out)
    assert m["status"] == "complete" and m["incomplete_reason"] is None
    assert m["host"]["open_files_limit"] == {"soft": 100, "hard": 100, "raised_from": None, "servers_soft": 100}
    recs = requests_of(out)
    unsent = [r for r in recs if r["start"] is None]
    assert unsent and len(unsent) < len(recs)
    assert all(r["outcome"] == "disconnected" and r["error"].startswith(NOT_SENT) for r in unsent)
    assert all("file descriptors (emfile)" in r["error"] and "open-files limit is 100" in r["error"]
               and "ulimit -n" in r["error"] for r in unsent)
    assert not [r for r in recs if (r["error"] or "").startswith("connect failed")]  # none is blamed on the server's port
    # said while it runs, and by the gate: client_healthy names it, errors == 0 is not judged
    assert "ran out of file descriptors" in proc.stderr and "ulimit -n" in proc.stderr
    verdict = json.loads((out / "verdict.json").read_text())
    rules = {r["rule"]: r for r in verdict["rules"]}
    assert verdict["verdict"] == "INCONCLUSIVE"
    assert rules["client_healthy"]["status"] == "inconclusive"
    assert "never sent (the load generator's own failure, not the server's)" in rules["client_healthy"]["message"]
    assert "ulimit -n" in rules["client_healthy"]["message"]
    errors = rules[GATE.removeprefix("require ")]
    assert errors["status"] == "inconclusive"
    assert errors["message"].startswith("not judged, the load generator did not send every request")


def test_the_soft_open_files_limit_is_lifted_to_the_hard_one(tmp_path):
    hard = _hard()
    if hard < 1024:
        pytest.skip(f"the hard open-files limit here is {hard}")
    proc, out = _run(tmp_path, _spec(tmp_path, 96), (100, hard))
    # PASS; or, on a machine whose CPUs other work takes, INCONCLUSIVE for the load
    # generator's lag alone -- never for descriptors, never a FAIL
    assert proc.returncode in (0, 3), proc.stdout + proc.stderr
    rules = {r["rule"]: r for r in json.loads((out / "verdict.json").read_text())["rules"]}
    assert [n for n, r in rules.items() if r["status"] != "pass" and n != "client_healthy"] == [], rules
    assert "never sent" not in rules["client_healthy"]["message"] and "ulimit" not in proc.stderr
    assert manifest(out)["host"]["open_files_limit"] == {"soft": hard, "hard": hard, "raised_from": 100, "servers_soft": 100}
    assert all(r["start"] is not None for r in requests_of(out))


# a `soakspec run` whose schema files cannot be opened mid-run (as when the load holds every
# descriptor), or whose client-health writer has a bug: neither may leave the manifest `running`
EMFILE_IN_SCHEMA = ("import errno, sys; from soakspec.evidence import schema as s; s.preload = lambda *a: None; load = s._load; "
                    "s._load = lambda name: load(name) if name != 'client' else "
                    "(_ for _ in ()).throw(OSError(errno.EMFILE, 'Too many open files', name)); "
                    "from soakspec.cli import main; sys.exit(main(sys.argv[1:]))")
BUG_IN_WRITER = ("import sys; from soakspec.runner import clienthealth as c; "
                 "c.ClientLog.write = lambda self, sample: (_ for _ in ()).throw(RuntimeError('a bug')); "
                 "from soakspec.cli import main; sys.exit(main(sys.argv[1:]))")


def test_fd_exhaustion_where_no_request_records_it_ends_the_run_naming_the_limit(tmp_path):
    proc, out = _run(tmp_path, _spec(tmp_path, 2), (4096, 4096), [sys.executable, "-c", EMFILE_IN_SCHEMA])
    assert proc.returncode == 4 and "internal error" not in proc.stderr, proc.stdout + proc.stderr
    m = manifest(out)
    assert m["status"] == "aborted", m["status"]
    assert "ran out of file descriptors (emfile)" in m["incomplete_reason"] and "ulimit -n" in m["incomplete_reason"]
    assert m["backends"] and m["backends"][0]["levels"]  # what ran is in the manifest


def test_a_runner_bug_still_ends_the_manifest_aborted_with_its_reason(tmp_path):
    proc, out = _run(tmp_path, _spec(tmp_path, 2), (4096, 4096), [sys.executable, "-c", BUG_IN_WRITER])
    assert proc.returncode == 4 and "internal error" in proc.stderr, proc.stdout + proc.stderr
    m = manifest(out)
    assert m["status"] == "aborted" and m["incomplete_reason"].startswith("internal error:"), m["incomplete_reason"]
    assert "a bug" in m["incomplete_reason"]


def test_schemas_that_cannot_be_read_before_the_load_end_the_manifest_aborted(tmp_path):
    """The schemas are compiled before any server starts (`schema.preload`); one that cannot be
    read there (a broken install) still ends the manifest, aborted with the reason, not `running`."""
    broken = ("import sys; from soakspec.evidence import schema as s; "
              "s.preload = lambda *a: (_ for _ in ()).throw(OSError(2, 'No such file or directory', 'request.schema.json')); "
              "from soakspec.cli import main; sys.exit(main(sys.argv[1:]))")  # fmt: skip
    proc, out = _run(tmp_path, _spec(tmp_path, 2), (4096, 4096), [sys.executable, "-c", broken])
    assert proc.returncode == 4, proc.stdout + proc.stderr
    m = manifest(out)
    assert m["status"] == "aborted" and "request.schema.json" in m["incomplete_reason"], m["incomplete_reason"]


def test_a_runner_bugs_reason_loses_the_runs_secrets(tmp_path):
    """The reason an unforeseen error leaves in the manifest (and on stderr) is the exception's
    text, which may quote what the server sent: the run's secrets are redacted from it."""
    secret = "hf_plantedBugSecret0123456789"
    spec = tmp_path / "t.soak"
    spec.write_text(sim_spec(load="mode = closed\n    concurrency = [2]", duration="2s", bucket="1s", follow_up=False,
                             extra_backend=f'  env {{\n    HF_TOKEN = "{secret}"\n  }}\n'))
    bug = BUG_IN_WRITER.replace("RuntimeError('a bug')", f"RuntimeError('a bug near {secret}')")
    proc, out = _run(tmp_path, spec, (4096, 4096), [sys.executable, "-c", bug])
    assert proc.returncode == 4, proc.stdout + proc.stderr
    m = manifest(out)
    assert m["status"] == "aborted" and "a bug near <redacted>" in m["incomplete_reason"], m["incomplete_reason"]
    assert secret not in (out / "manifest.json").read_text()
    assert secret not in proc.stdout + proc.stderr


def test_local_exhaustion_is_found_anywhere_in_the_exception_chain():
    emfile = OSError(errno.EMFILE, "Too many open files")
    wrapped = OSError("all attempts to connect to 127.0.0.1:1 failed")
    wrapped.__cause__ = BaseExceptionGroup("attempts", [emfile])
    assert local_errno(wrapped) == errno.EMFILE
    assert not_sent_error(wrapped).startswith(NOT_SENT + "the load generator ran out of file descriptors (emfile)")
    assert local_errno(ConnectionRefusedError(errno.ECONNREFUSED, "refused")) is None
    assert not_sent_error(ConnectionResetError(errno.ECONNRESET, "reset")) is None


def test_a_refused_attempt_beside_a_local_error_is_the_servers_failure():
    """`localhost` tried as ::1 (EADDRNOTAVAIL where loopback has no IPv6) and 127.0.0.1
    (ECONNREFUSED: the server is down): the server's failure, never filed as not sent -- else
    liveness would never see the refusals and a dead server would read INCONCLUSIVE."""
    wrapped = OSError("all attempts to connect to localhost:1 failed")
    wrapped.__cause__ = BaseExceptionGroup("attempts", [OSError(errno.EADDRNOTAVAIL, "Cannot assign requested address"),
                                                        ConnectionRefusedError(errno.ECONNREFUSED, "Connection refused")])
    assert local_errno(wrapped) is None and not_sent_error(wrapped) is None


def test_a_connect_the_client_cannot_make_is_recorded_never_sent(monkeypatch):
    """The h11 client's record of a connect that fails with EMFILE: no start, not sent."""
    from soakspec.runner import h11client
    from soakspec.runner.clock import RunClock
    from soakspec.runner.protocol import Endpoint, RequestShape
    from soakspec.runner.records import RequestRecord

    async def refuse(*a, **k):
        raise OSError(errno.EMFILE, "Too many open files")

    monkeypatch.setattr(h11client.trio, "open_tcp_stream", refuse)

    async def main() -> RequestRecord:
        conn = h11client.H11Connection("127.0.0.1", 9, RunClock())
        rec = RequestRecord(request_id="r", backend="b", workload="w", level=0, concurrency=1, bucket=0)
        await conn.send(RequestShape(Endpoint.COMPLETIONS, "sim", "x", max_tokens=8), "r", (), rec)
        return rec

    rec = trio.run(main)
    assert rec.start is None and rec.intended_start is not None and rec.end is not None
    assert str(rec.outcome) == "disconnected" and rec.error.startswith(NOT_SENT)
    assert rec.freeze().broken_rule() is None


def _out_of_fds(fn, leave: int = 0):
    """`fn()` with this process out of file descriptors for real (EMFILE): its soft open-files
    limit lowered to what it holds and the few left filled, but `leave` of them; both given back
    after."""
    import os

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    held = []
    resource.setrlimit(resource.RLIMIT_NOFILE, (len(os.listdir("/proc/self/fd")) + 8, hard))
    try:
        while True:
            try:
                held.append(os.open("/dev/null", os.O_RDONLY))
            except OSError as e:
                assert e.errno == errno.EMFILE
                break
        for _ in range(leave):
            os.close(held.pop())
        return fn()
    finally:
        for fd in held:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_a_telemetry_sample_taken_out_of_file_descriptors_is_unknown_not_an_aborted_run():
    """A 6 s level at concurrency 120 under `ulimit -n 90`: the requests the client could not
    connect were recorded as never sent, as promised -- then the server's telemetry sample
    listed /proc, met EMFILE too, and its OSError aborted the run (exit 4, "... ([Errno 24] Too
    many open files: '/proc')") instead of the INCONCLUSIVE run the README promises. A sample
    that cannot read /proc whole has its server figures unknown (None, never a partial sum)."""
    import os

    from soakspec.evidence.telemetry import CpuMeter, telemetry_record

    cpu = CpuMeter()
    row = _out_of_fds(lambda: telemetry_record(None, os.getpid(), 1.0, cpu))
    assert row["server_pid"] == os.getpid()
    assert (row["server_rss_bytes"], row["server_pss_bytes"], row["server_cpu_s"], row["server_cpu_percent"]) == (None,) * 4
    whole = telemetry_record(None, os.getpid(), 2.0, cpu)  # with descriptors again: measured
    assert whole["server_rss_bytes"] > 0 and whole["server_cpu_s"] > 0


def test_stopping_a_server_out_of_file_descriptors_still_signals_it():
    """`stop` lists the groups a server's descendants moved to from /proc before its first
    SIGTERM; out of file descriptors (EMFILE) that listing raised, so the server's own group
    was never signalled by the run (only the reaper, after soakspec exited, ended it) and the
    run aborted at its end. The listing now gives what it can (the server's own group is always
    signalled; what carries the launch's marker, and the reaper, stop the rest)."""
    import os
    import signal as sig

    from soakspec.runner.procs import Server, stop

    async def main():
        proc = await trio.lowlevel.open_process([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
        server = Server("b", proc, proc.pid, None, 0.0)
        try:
            held = []
            soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
            resource.setrlimit(resource.RLIMIT_NOFILE, (len(os.listdir("/proc/self/fd")) + 8, hard))
            try:
                while True:
                    try:
                        held.append(os.open("/dev/null", os.O_RDONLY))
                    except OSError:
                        break
                with trio.fail_after(20):
                    await stop(server, 5.0, 5.0, None)
            finally:
                for fd in held:
                    os.close(fd)
                resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
            assert proc.returncode == -sig.SIGTERM and server.stop_signal == "SIGTERM"
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()

    trio.run(main)


def test_a_telemetry_sample_whose_proc_listing_misses_processes_is_unknown_not_a_partial_sum():
    """Out of file descriptors with one left, /proc itself is listed but no process's stat can
    be read: `_ppid_map` skipped each one silently (as if it had exited), the server's tree was
    the server alone, and its children's memory and CPU went missing from a figure recorded as
    measured. A process whose stat is refused (EMFILE) makes the sample's figures unknown."""
    import os

    from soakspec.evidence.telemetry import CpuMeter, telemetry_record

    code = "import subprocess, sys, time; k = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); print(k.pid, flush=True); time.sleep(60)"
    parent = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        parent.stdout.readline()  # its child started

        # one left: /proc itself is listed, no process's stat can be read
        row = _out_of_fds(lambda: telemetry_record(None, parent.pid, 1.0, CpuMeter()), leave=1)
        assert (row["server_rss_bytes"], row["server_pss_bytes"], row["server_cpu_s"]) == (None,) * 3, row
        whole = telemetry_record(None, parent.pid, 2.0, CpuMeter())  # with descriptors again: measured
        assert whole["server_rss_bytes"] > 0
    finally:
        os.killpg(parent.pid, 9)  # the server and its child
        parent.wait()
