"""The run's I/O refused: stdout closed, the evidence filesystem full or gone, soakspec killed
in a phase. Each case states the exit code, the message, that no process the run started is
left, and that the evidence left reads as incomplete (never intact, never a PASS)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from soakspec.judge.testing import EvidenceBuilder, spec_from_text
from tests.runner_support import new_marker, run_env, sim_spec, soakspec_cmd, wait_no_survivors
from tests.test_faults import MAIN, _run_with, _start_runner  # a run, with a prelude; one started
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


# ------------------------------------------------------------------ the evidence directory removed or moved


@pytest.mark.parametrize("how", ["removed", "moved"])
def test_an_evidence_directory_removed_or_moved_mid_run_aborts_the_run_at_the_next_bucket(tmp_path, how):
    """`rm -rf` or `mv` of the evidence directory while the run loads: the writes into its open
    files go on succeeding (unlinked files, or the moved directory), so the run soaked for all
    its planned time into nowhere and only then said ENOENT, about a manifest that 'still says
    `running`' (there was none). The directory is now checked at every bucket's end: the run
    aborts there (exit 4, no server left) saying it was removed or moved, and a moved
    directory's evidence reads as incomplete."""
    marker = new_marker()
    out = tmp_path / "ev"
    proc = _start_runner(tmp_path, sim_spec(duration="30s", bucket="1s"), marker, out)
    moved = tmp_path / "moved"
    if how == "removed":
        shutil.rmtree(out)
    else:
        out.rename(moved)
    t0 = time.monotonic()
    _, err = proc.communicate(timeout=60)
    took = time.monotonic() - t0
    assert wait_no_survivors(marker) == []
    assert proc.returncode == 4, err
    assert took < 10, f"the run went on for {took:.1f} s after its directory was {how}"
    assert "the evidence directory was removed or moved during the run" in err, err
    assert "still says `running`" not in err and "Traceback" not in err, err
    assert f"{out} no longer holds the run's evidence" in err, err
    if how == "moved":
        v = subprocess.run(soakspec_cmd("verify", str(moved)), capture_output=True, text=True, timeout=60)
        assert v.returncode == 3, v.stdout + v.stderr  # incomplete (status running), not intact


# ------------------------------------------------------------------ the disk refusing a write at a given moment

# the disk refuses the end of requests.jsonl.gz's last gzip member, as the load's writers close
ENOSPC_ON_CLOSING_REQUESTS = (
    "import errno, sys; from soakspec.evidence import io; "
    "io.GzipJsonlWriter._finish = lambda self: (_ for _ in ()).throw("
    "io.EvidenceWriteError(self.path, OSError(errno.ENOSPC, 'No space left on device'))); "
)


def test_a_write_refused_as_the_load_closes_its_files_is_named_not_an_exception_group(tmp_path):
    """The disk refusing requests.jsonl.gz's last member as the backend's writers close (full
    in the last bucket, EIO on the last fsync) aborted the run with the reason 'the run failed:
    (1 sub-exception)': the path and the errno were nowhere. The close is recorded as every
    write of the load is: the reason names the file and ENOSPC (exit 4), and the evidence reads
    as incomplete."""
    proc, out = _run_with(tmp_path, ENOSPC_ON_CLOSING_REQUESTS)
    assert proc.returncode == 4, proc.stderr
    req = out / "backends" / "b0" / "requests.jsonl.gz"
    reason = f"cannot write evidence: {req}: cannot write evidence: No space left on device (ENOSPC)"
    assert f"soakspec run: {reason}" in proc.stderr.splitlines(), proc.stderr
    assert "sub-exception" not in proc.stderr + proc.stdout, proc.stderr
    m = json.loads((out / "manifest.json").read_text())
    assert m["status"] == "aborted" and m["incomplete_reason"] == reason, m["incomplete_reason"]
    v = subprocess.run(soakspec_cmd("verify", str(out)), capture_output=True, text=True, timeout=60)
    assert v.returncode == 3, v.stdout + v.stderr


# the disk refuses every gzip member of the server's log (the steps' and the last, server.log.gz)
ENOSPC_ON_SERVER_LOG_GZ = (
    "import errno, sys; from soakspec.evidence import serverlog; "
    "serverlog._append_member = lambda path, chunks: (_ for _ in ()).throw(OSError(errno.ENOSPC, 'No space left on device')); "
)


def test_a_server_log_gz_the_disk_refuses_names_the_file_and_keeps_the_plain_log(tmp_path):
    """The disk full as the server's log is compressed after the load: the run was aborted with
    '[b0] could not finish the evidence: OSError: [Errno 28] No space left on device', naming no
    file. It names server.log.gz now (exit 4); server.log stays, whole, and the evidence reads
    as incomplete (verify and gate: 3)."""
    proc, out = _run_with(tmp_path, ENOSPC_ON_SERVER_LOG_GZ)
    assert proc.returncode == 4, proc.stderr
    d = out / "backends" / "b0"
    assert f"{d / 'server.log.gz'}: cannot write evidence: No space left on device (ENOSPC)" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    assert (d / "server.log").stat().st_size > 0 and not (d / "server.log.gz").exists()
    assert not [p.name for p in d.iterdir() if ".tmp" in p.name]
    m = json.loads((out / "manifest.json").read_text())
    assert m["status"] == "aborted" and "server.log.gz" in m["incomplete_reason"], m["incomplete_reason"]
    for command in ("verify", "gate"):
        r = subprocess.run(soakspec_cmd(command, str(out)), capture_output=True, text=True, timeout=60)
        assert r.returncode == 3, r.stdout + r.stderr


# ------------------------------------------------------------------ the disk full under the server's own log

FULL_NOTE = "is full ("
NOTE_END = "the server could not write its log, which may be why it exited"


def _full_disk_run(tmp_path: Path, out: Path, spec_text: str, prelude: str = "") -> subprocess.CompletedProcess:
    spec = tmp_path / "t.soak"
    spec.write_text(spec_text)
    marker = new_marker()
    proc = subprocess.run([PY, "-c", "import sys; " + prelude + MAIN, "run", str(spec), "--out", str(out), "--quiet"],
                          cwd=tmp_path, env=run_env(marker), capture_output=True, text=True, timeout=90)  # fmt: skip
    assert wait_no_survivors(marker) == []
    return proc


def test_a_server_that_exits_while_the_evidence_filesystem_is_full_is_said_so(tmp_path):
    """A server whose log (server.log, in the evidence directory) cannot be written because
    the disk is full exits (the simulator's print raises ENOSPC), and its log tail cannot say
    why: the run said only 'server exited with status 1 during the run' and the user looked
    for a server bug. The message now says the log's filesystem is full. (The disk is made to
    look full here -- os.statvfs answers 0 bytes free under the evidence directory -- and the
    server crashes on its own: tests/test_disk_faults.py's tmpfs case below fills a real one.)"""
    out = tmp_path / "ev"
    looks_full = ("import os; real = os.statvfs; "
                  "os.statvfs = lambda p: os.statvfs_result((4096, 4096, 100, 0, 0, 100, 0, 0, 0, 255)) "
                  f"if str(p).startswith({str(out)!r}) else real(p); ")  # fmt: skip
    proc = _full_disk_run(tmp_path, out, sim_spec(sim="ttft = 10ms\n    itl = 2ms\n    crash_after_requests = 6",
                                                  duration="5s", bucket="1s"), looks_full)  # fmt: skip
    assert proc.returncode == 4, proc.stderr
    first = proc.stderr.splitlines()[0]
    assert "server exited with status" in first and f"{out / 'backends' / 'b0' / 'server.log'} {FULL_NOTE}0 bytes free)" in first, first
    assert NOTE_END in first, first
    assert NOTE_END in json.loads((out / "manifest.json").read_text())["incomplete_reason"]


def test_a_server_that_exits_for_any_other_reason_gets_no_disk_note(tmp_path):
    out = tmp_path / "ev"
    proc = _full_disk_run(tmp_path, out, sim_spec(sim="ttft = 10ms\n    itl = 2ms\n    crash_after_requests = 6",
                                                  duration="5s", bucket="1s"))  # fmt: skip
    assert proc.returncode == 4, proc.stderr
    assert "server exited with status" in proc.stderr and NOTE_END not in proc.stderr, proc.stderr


@pytest.fixture
def small_tmpfs(tmp_path):
    """A 48 KiB tmpfs: a real full disk (mounting needs root; skipped otherwise, saying why)."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root (the statvfs seam above covers the message without it)")
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=48k", "tmpfs", str(mnt)], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", str(mnt)], check=True)


def test_a_real_full_disk_mid_run_aborts_saying_the_disk_is_full(tmp_path, small_tmpfs):
    """The evidence on a 48 KiB tmpfs: it fills during the load. Whichever write meets it first
    -- soakspec's own (requests.jsonl.gz: ENOSPC) or the server's log (the server exits) --
    the run aborts (exit 4, no server left, no traceback) saying the disk is full, and what was
    written reads as incomplete: never intact, never a PASS."""
    out = small_tmpfs / "ev"
    proc = _full_disk_run(tmp_path, out, sim_spec(duration="20s", bucket="1s",
                                                  load="mode = closed\n    concurrency = [4]", max_tokens=16))  # fmt: skip
    assert proc.returncode == 4, proc.stderr
    assert "Traceback" not in proc.stderr and "internal error" not in proc.stderr, proc.stderr
    first = proc.stderr.splitlines()[0]
    assert "No space left on device (ENOSPC)" in first or NOTE_END in first, first
    for command in (["verify"], ["gate"], ["gate", "--partial"]):
        r = subprocess.run(soakspec_cmd(*command, str(out)), capture_output=True, text=True, timeout=60)
        assert r.returncode == 3, (command, r.stdout + r.stderr)


# ------------------------------------------------------------------ a url backend's log_file copied onto a full disk


def test_a_log_file_copy_the_disk_refuses_raises_with_the_entry(tmp_path):
    """`ExternalLog.copy_into` onto a disk that refuses the copy (/dev/full: ENOSPC) raised
    nothing: it noted the error in the manifest entry, and the run went on `complete` with a
    server.log lacking what the server logged. It raises `LogCopyRefused` now (an evidence
    write error), carrying the entry; a source it cannot read is still only noted."""
    from soakspec.runner.logfile import ExternalLog, LogCopyRefused

    log = tmp_path / "srv.log"
    log.write_bytes(b"stale\n")
    ext = ExternalLog.at_start(str(log))
    with log.open("ab") as f:
        f.write(b"fresh\n" * 100)
    with pytest.raises(LogCopyRefused) as refused:
        ext.copy_into(Path("/dev/full"))
    assert "No space left on device (ENOSPC)" in str(refused.value)
    assert refused.value.entry["error"].startswith("cannot write /dev/full: OSError: [Errno 28]")
    assert ExternalLog.at_start(str(tmp_path / "none.log")).copy_into(tmp_path / "x.log")["error"] is not None


# the disk refuses server.log's fsync as the url backend's log_file is copied into it
ENOSPC_ON_SERVER_LOG_FSYNC = (
    "import errno, os; fsync = os.fsync; "
    "os.fsync = lambda fd: (_ for _ in ()).throw(OSError(errno.ENOSPC, 'No space left on device')) "
    "if os.readlink(f'/proc/self/fd/{fd}').endswith('/server.log') else fsync(fd); "
)


def test_a_url_backends_log_copied_onto_a_full_disk_aborts_the_run(tmp_path):
    """A url backend's log_file, copied into server.log after the load, onto a disk that
    refuses it: the run said `complete` (exit 0) and judged a server.log without the traces
    the server logged. It aborts now (exit 4), naming server.log and ENOSPC; the manifest's
    log_file entry says it could not be written, and the evidence reads as incomplete."""
    from tests.test_logfile import _free_port, _spec_text

    port = _free_port()
    log = tmp_path / "sim.log"
    log.write_bytes(b"")
    spec = tmp_path / "ext.soak"
    spec.write_text(_spec_text('  log_file = "sim.log"\n', port))
    out = tmp_path / "ev"
    marker = new_marker()
    with log.open("ab") as f:
        sim = subprocess.Popen(soakspec_cmd("sim", "--host", "127.0.0.1", "--port", str(port), "--model=sim-model",
                                            "--ttft=5ms", "--itl=1ms", "--runtime-banner=simrt 1.2.3"),
                               stdout=f, stderr=subprocess.STDOUT, env=run_env(marker))  # fmt: skip
    try:
        run = subprocess.run([PY, "-c", "import sys; " + ENOSPC_ON_SERVER_LOG_FSYNC + MAIN, "run", str(spec), "--out",
                              str(out), "--quiet"], cwd=tmp_path, env=run_env(marker), capture_output=True, text=True,
                             timeout=90)  # fmt: skip
    finally:
        sim.terminate()
        sim.wait(timeout=10)
    assert wait_no_survivors(marker) == []
    dest = out / "backends" / "ext" / "server.log"
    reason = f"cannot write evidence: {dest}: cannot write evidence: No space left on device (ENOSPC)"
    assert run.returncode == 4, run.stdout + run.stderr
    assert f"soakspec run: {reason}" in run.stderr.splitlines(), run.stderr
    m = json.loads((out / "manifest.json").read_text())
    assert m["status"] == "aborted" and m["incomplete_reason"] == reason, m["incomplete_reason"]
    (entry,) = m["backends"]
    assert entry["log_file"]["error"].startswith(f"cannot write {dest}"), entry["log_file"]
    v = subprocess.run(soakspec_cmd("verify", str(out)), capture_output=True, text=True, timeout=60)
    assert v.returncode == 3, v.stdout + v.stderr


# ------------------------------------------------------------------ SIGKILL while the server's log is compressed


@pytest.mark.parametrize("written", [0, 40])
def test_a_kill_while_the_log_is_compressed_keeps_its_moved_head_readable(tmp_path, written):
    """soakspec killed while `collect` compressed a server.log whose head earlier steps had moved
    out (server.log.moved.gz; punched out of server.log): `finish` first renamed the moved part
    to a temporary name, so the killed run left server.log, its state, and its head under a
    name no reader knows -- server.log then read from its start, the head as NUL bytes and its
    traces gone. The rest is now appended to the moved file itself (beyond the bytes its state
    counts), so a kill at any point leaves the log reading as it did before `finish`. (A child
    process ends by os._exit in the middle of the compression, having written `written` bytes
    of the new member.)"""
    from soakspec.evidence import layout, serverlog
    from soakspec.evidence.serverlog import read_log
    from tests.test_serverlog import stepped_log

    p, c, _ = stepped_log(tmp_path)
    assert c.raw_offset > 0
    before = read_log(p)
    assert not before.startswith(b"\0")

    def killed(path, chunks):
        with open(path, "ab") as f:
            f.write(b"\x1f\x8b\x08\x00" + b"\0" * (written - 4) if written else b"")
        os._exit(9)

    pid = os.fork()
    if pid == 0:  # the child: killed in the middle of finish's compression
        try:
            serverlog._append_member = killed
            c.finish()
        finally:
            os._exit(1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 9
    assert layout.server_log_file(tmp_path) == p  # no server.log.gz: the run did not finish
    assert read_log(p) == before
    assert not [q.name for q in tmp_path.iterdir() if ".tmp" in q.name]


# ------------------------------------------------------------------ report --out onto what is not a regular file


def _read_fifo(path: Path, got: list[bytes]) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # opened before the writer: its open does not block
    deadline = time.monotonic() + 60
    chunks = []
    try:
        while time.monotonic() < deadline:
            try:
                b = os.read(fd, 1 << 16)
            except BlockingIOError:
                time.sleep(0.02)
                continue
            if not b and chunks:  # the writer closed it
                break
            if not b:  # no writer yet
                time.sleep(0.02)
                continue
            chunks.append(b)
    finally:
        os.close(fd)
    got.append(b"".join(chunks))


def test_report_out_onto_a_fifo_or_a_symlink_writes_through_it(tmp_path):
    """`soakspec report DIR --out F` renamed a new file over F whatever it was: a FIFO (or, for
    root, `--out /dev/stdout`, `--out /dev/full`: an audit found /dev/full a regular file after
    one) was replaced by a regular file -- the reader never got the report, the device was gone
    -- and a symlink became a file, its target left stale. Such an --out is written through now,
    as a shell's `>` writes it; a regular file is still replaced atomically."""
    import threading

    root = EvidenceBuilder(spec_from_text(SIM_SPEC)).write(tmp_path / "ev")
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    got: list[bytes] = []
    reader = threading.Thread(target=_read_fifo, args=(fifo, got))
    reader.start()
    time.sleep(0.1)
    r = subprocess.run(soakspec_cmd("report", str(root), "--out", str(fifo)), capture_output=True, text=True, timeout=120,
                       env=ENV, cwd=tmp_path)  # fmt: skip
    reader.join(timeout=70)
    assert r.returncode == 0, r.stderr
    assert fifo.is_fifo(), "the FIFO was replaced by a regular file"
    assert got and got[0].startswith(b"## "), got

    target = tmp_path / "real.md"
    target.write_text("old\n")
    link = tmp_path / "link.md"
    link.symlink_to(target)
    r = subprocess.run(soakspec_cmd("report", str(root), "--out", str(link)), capture_output=True, text=True, timeout=120,
                       env=ENV, cwd=tmp_path)  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert link.is_symlink() and target.read_text().startswith("## "), target.read_text()[:80]


# the disk refuses client.jsonl (the load generator's health samples) during the load
ENOSPC_ON_CLIENT_JSONL = (
    "import errno, sys; from soakspec.evidence import io; from soakspec.runner import clienthealth; "
    "clienthealth.ClientLog.write = lambda self, sample: (_ for _ in ()).throw("
    "io.EvidenceWriteError(self._writer.path, OSError(errno.ENOSPC, 'No space left on device'))); "
)


def test_a_client_jsonl_the_disk_refuses_is_said_as_an_evidence_write(tmp_path):
    """client.jsonl refused mid-load: the run aborted with 'the run failed:  (1 sub-exception)'
    (then, naming the leaf, 'the run failed: ...'), where every other evidence write the load
    makes says 'cannot write evidence: PATH: ... (ENOSPC)'. Now so does this one (exit 4)."""
    proc, out = _run_with(tmp_path, ENOSPC_ON_CLIENT_JSONL)
    assert proc.returncode == 4, proc.stderr
    reason = f"cannot write evidence: {out / 'client.jsonl'}: cannot write evidence: No space left on device (ENOSPC)"
    assert f"soakspec run: {reason}" in proc.stderr.splitlines(), proc.stderr
    assert json.loads((out / "manifest.json").read_text())["incomplete_reason"] == reason


# ------------------------------------------------------------------ results.json / verdict.json never written

ENOSPC_ON_VERDICT = ("import errno, os, sys; write = os.write; "
                     "os.write = lambda fd, data: (_ for _ in ()).throw(OSError(errno.ENOSPC, 'No space left on device')) "
                     "if '.verdict.json.tmp' in os.readlink(f'/proc/self/fd/{fd}') else write(fd, data); ")  # fmt: skip


def test_a_finished_run_whose_verdict_the_disk_refused_can_be_judged_and_written_later(tmp_path):
    """A run that finished, complete and passing, whose disk refused verdict.json: `run` said
    "the evidence is kept: `soakspec gate DIR` judges it", but gate said INCONCLUSIVE (verify:
    V206 'never written (judge the run to write it)') and no command wrote it, so the run could
    never pass, whatever space was freed. `gate --write DIR` now judges it as `run` does at its
    end and writes what is missing (bound to the manifest); then gate PASSes and verify is clean.
    It writes nothing for a run still going, and refuses --spec."""
    proc, out = _run_with(tmp_path, ENOSPC_ON_VERDICT)
    assert proc.returncode == 4, proc.stderr
    assert f"`soakspec gate --write {out}`" in proc.stderr, proc.stderr
    gate = subprocess.run(soakspec_cmd("gate", str(out)), capture_output=True, text=True, timeout=60)
    assert gate.returncode == 3, gate.stdout + gate.stderr  # no verdict recorded: not a PASS
    refused = subprocess.run(soakspec_cmd("gate", "--write", "--spec", str(tmp_path / "t.soak"), str(out)),
                             capture_output=True, text=True, timeout=60)  # fmt: skip
    assert refused.returncode == 2 and not (out / "verdict.json").exists(), refused.stderr
    wrote = subprocess.run(soakspec_cmd("gate", "--write", str(out)), capture_output=True, text=True, timeout=60)
    # judged as `run` judges at its end: PASS -- or INCONCLUSIVE only where this machine's load
    # generator lagged during the real run (client_healthy; CI once saw a 55 ms event-loop p99),
    # never for the files that were missing
    assert wrote.returncode in (0, 3), wrote.stdout + wrote.stderr
    if wrote.returncode == 3:
        assert "could not be decided (client_healthy)" in wrote.stdout, wrote.stdout
    assert "wrote the missing results.json and verdict.json" in wrote.stderr
    assert (out / "verdict.json").is_file()
    v = subprocess.run(soakspec_cmd("verify", str(out)), capture_output=True, text=True, timeout=60)
    assert v.returncode == 0, v.stdout + v.stderr
    again = subprocess.run(soakspec_cmd("gate", str(out)), capture_output=True, text=True, timeout=60)
    assert again.returncode == wrote.returncode, again.stdout + again.stderr


def test_gate_write_of_a_run_never_finalized_writes_nothing(tmp_path):
    """A killed run (manifest `running`): nothing to judge in full, nothing written (exit 2)."""
    from soakspec.evidence import layout
    from soakspec.evidence.io import read_json
    from soakspec.evidence.manifest import write_manifest

    root = EvidenceBuilder(spec_from_text(SIM_SPEC)).write(tmp_path / "ev")
    m = read_json(root / layout.MANIFEST)
    m["status"] = "running"
    write_manifest(root, m)
    for f in (layout.RESULTS, layout.VERDICT):
        (root / f).unlink(missing_ok=True)
    r = subprocess.run(soakspec_cmd("gate", "--write", str(root)), capture_output=True, text=True, timeout=60, env=ENV)
    assert r.returncode == 2 and "holds no finished run (status running)" in r.stderr, r.stderr
    assert not (root / layout.VERDICT).exists() and not (root / layout.RESULTS).exists()


# ------------------------------------------------------------------ stderr refuses its writes


def _stderr_onto_dev_full() -> None:
    fd = os.open("/dev/full", os.O_WRONLY)
    os.dup2(fd, 2)
    os.close(fd)


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
def test_a_stderr_that_refuses_writes_neither_stops_a_run_nor_changes_its_exit_code(tmp_path):
    """`soakspec run SPEC 2> run.log` with run.log's disk full (here `2>/dev/full`; a `2>&1 | tee`
    whose tee died is the same: EPIPE): the first progress line failed to print, which killed
    the run before its first request (no verdict.json, manifest `aborted`), and the internal
    error's own line failed too, so Python exited 1 -- "a gate rule failed". stderr carries
    progress and messages, never the result: the run goes on, its evidence and exit code are
    those of a run whose stderr was read."""
    marker = new_marker()
    (tmp_path / "t.soak").write_text(sim_spec(duration="1s", bucket="1s"))
    proc = subprocess.run(soakspec_cmd("run", "t.soak", "--out", "ev"), cwd=tmp_path, env={**run_env(marker), **ENV},
                          stdout=subprocess.PIPE, text=True, timeout=120, preexec_fn=_stderr_onto_dev_full)  # fmt: skip
    assert proc.returncode == 0, proc.stdout
    assert "PASS: all" in proc.stdout
    manifest = json.loads((tmp_path / "ev" / "manifest.json").read_text())
    assert manifest["status"] == "complete"
    assert (tmp_path / "ev" / "verdict.json").exists()
    assert wait_no_survivors(marker) == []


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
@pytest.mark.parametrize(("args", "code"), [(["gate", "no-such-dir"], 2), (["run", "no-such.soak"], 2),
                                            (["check", "--no-such-flag"], 2)])  # fmt: skip
def test_a_usage_error_whose_message_stderr_refuses_still_exits_2(tmp_path, args, code):
    """Its one line could not be printed, so the exception escaped and Python exited 1 (a failed
    gate, to a CI script) in place of 2 (usage: nothing ran)."""
    proc = subprocess.run([PY, "-m", "soakspec", *args], cwd=tmp_path, env=ENV, stdin=subprocess.DEVNULL,
                          stdout=subprocess.PIPE, text=True, timeout=60, preexec_fn=_stderr_onto_dev_full)  # fmt: skip
    assert proc.returncode == code


def test_a_stderr_reader_that_leaves_mid_run_does_not_abort_the_soak(tmp_path):
    """`soakspec run SPEC 2>&1 | tee run.log` and tee is gone (killed, its terminal closed) while
    the soak runs: the next progress line raised BrokenPipeError in the runner, which aborted the
    run as "internal error: BrokenPipeError" (manifest `aborted`) and exited 1. What was left of
    the soak -- its load, follow-up and verdict -- is unaffected by who reads its progress."""
    marker = new_marker()
    (tmp_path / "t.soak").write_text(sim_spec(duration="3s", bucket="1s"))
    proc = subprocess.Popen(soakspec_cmd("run", "t.soak", "--out", "ev"), cwd=tmp_path, env={**run_env(marker), **ENV},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert proc.stderr.readline().startswith("[b0] starting")
        proc.stderr.close()  # the reader leaves; progress lines follow every second
        out, _ = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 0, out
    manifest = json.loads((tmp_path / "ev" / "manifest.json").read_text())
    assert manifest["status"] == "complete", manifest.get("incomplete_reason")
    assert "PASS: all" in out
    assert wait_no_survivors(marker) == []
