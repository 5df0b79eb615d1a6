"""Long reads of evidence say how far they got, on stderr (`soakspec.evidence.readprogress`):
a plain line when a read has gone on for a while (not a TTY), nothing for a short one, nothing
at all for a caller that asked for no report."""

from __future__ import annotations

import gzip
import io
import os
import re
import subprocess
import sys

from soakspec.evidence import readprogress
from soakspec.evidence.io import iter_raw_blocks
from soakspec.evidence.traces import TraceSource, scan_log_rows


class _Clock:
    """A clock that moves `step` seconds each time it is read."""

    def __init__(self, step: float) -> None:
        self.t, self.step = 0.0, step

    def __call__(self) -> float:
        self.t += self.step
        return self.t


def _lines(tmp_path, name: str, data: bytes, step: float) -> list[str]:
    d = tmp_path / "backends" / "b"
    d.mkdir(parents=True)
    p = d / name
    p.write_bytes(data)
    out = io.StringIO()
    with readprogress.reporting(out, "gate", every_s=15.0, clock=_Clock(step), tty=False):
        blocks = list(iter_raw_blocks(p))
    assert b"".join(b for _, b in blocks) == (gzip.decompress(data) if name.endswith(".gz") else data)
    return out.getvalue().splitlines()


def _numbered(n: int) -> bytes:
    return b"".join(b'{"k": %d, "pad": "%s"}\n' % (i, b"x" * 90) for i in range(n))


def test_a_long_read_says_how_far_it_got_with_the_file_and_its_size(tmp_path):
    data = _numbered(36_000)  # ~3.8 MB: four reads of 1 MiB
    lines = _lines(tmp_path, "requests.jsonl", data, step=20.0)  # every read 20 s after the last
    assert lines and all(re.fullmatch(r"soakspec gate: reading backends/b/requests\.jsonl: \d+% \([\d,]+ of 4 MB\)", x)
                         for x in lines), lines
    pcts = [int(re.search(r": (\d+)%", x).group(1)) for x in lines]
    assert pcts == sorted(pcts) and pcts[-1] == 100 and len(pcts) == 4


def test_a_gzip_file_reports_its_compressed_bytes(tmp_path):
    data = gzip.compress(os.urandom(3 << 20), compresslevel=1)  # incompressible: ~3 MB stored
    lines = _lines(tmp_path, "requests.jsonl.gz", data, step=20.0)
    assert lines[-1].endswith(f"100% (3 of {len(data) / 1e6:,.0f} MB)"), lines


def test_a_short_read_prints_nothing(tmp_path):
    assert _lines(tmp_path, "requests.jsonl", _numbered(36_000), step=1.0) == []  # 4 reads in 4 s: under 15 s


def test_nothing_is_reported_without_a_reporter(tmp_path, capsys):
    p = tmp_path / "x.jsonl"
    p.write_bytes(_numbered(100))
    with open(p, "rb") as fh:
        assert readprogress.ticker(p, fh) is None
    list(iter_raw_blocks(p))
    assert capsys.readouterr().err == ""


def test_a_servers_log_is_reported_as_it_is_scanned(tmp_path):
    d = tmp_path / "backends" / "b"
    d.mkdir(parents=True)
    p = d / "server.log.gz"
    body = b"".join(b"noise %s\n" % os.urandom(40).hex().encode() for _ in range(60_000))  # ~5 MB, ~2.5 MB stored
    p.write_bytes(gzip.compress(body, compresslevel=1))
    out = io.StringIO()
    with readprogress.reporting(out, "report", clock=_Clock(20.0), tty=False):
        assert list(scan_log_rows(p, 0, TraceSource(kind="log", pattern=r"TRACE (?P<json>\{.*\})"))) == []
    lines = out.getvalue().splitlines()
    assert lines and all(x.startswith("soakspec report: reading backends/b/server.log.gz: ") for x in lines), lines
    assert lines[-1].startswith("soakspec report: reading backends/b/server.log.gz: 100% ")


def test_a_terminal_gets_a_bar_for_a_long_read_gone_when_the_read_ends(tmp_path, monkeypatch):
    started: list[str] = []
    start = readprogress._Reporter._bar_start
    monkeypatch.setattr(readprogress._Reporter, "_bar_start", lambda self, text, size: started.append(text) or start(self, text, size))
    out = io.StringIO()
    p = tmp_path / "r.jsonl"
    p.write_bytes(_numbered(36_000))
    with readprogress.reporting(out, "gate", clock=_Clock(5.0), tty=True):
        list(iter_raw_blocks(p))
        assert readprogress._REPORTER.get()._bar is None  # stopped at the end of the read
    assert len(started) == 1 and started[0].endswith("/r.jsonl")
    assert "soakspec gate: reading" not in out.getvalue()  # a bar, not the plain lines


def test_verify_on_a_small_run_writes_nothing_but_its_report(tmp_path):
    """Every command that reads evidence runs under the reporter; a short read shows nothing."""
    from soakspec.judge.testing import EvidenceBuilder, spec_from_text
    from tests.test_judge_streaming import SIM_SPEC

    root = EvidenceBuilder(spec_from_text(SIM_SPEC)).write(tmp_path / "ev")
    got = subprocess.run([sys.executable, "-m", "soakspec", "verify", str(root)], capture_output=True, text=True, timeout=120)
    assert got.returncode == 0, got.stderr
    assert "reading" not in got.stderr and "intact" in got.stdout
