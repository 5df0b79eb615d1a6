"""Reading a spec is bounded: never more than the 1 MB limit (`/dev/zero` is a clean E010,
not a MemoryError), never an endless wait on a FIFO; and `fmt` writes through a symlink."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys
import threading

import pytest

from soakspec.cli import main
from soakspec.exitcodes import ExitCode
from soakspec.lang import parse_file
from soakspec.lang import parser as P

ROOT = pathlib.Path(__file__).resolve().parents[1]
DEMO = ROOT / "specs" / "demo.soak"


@pytest.mark.skipif(not os.path.exists("/dev/zero"), reason="needs /dev/zero")
def test_check_dev_zero_is_a_clean_e010(capsys):
    code = main(["check", "/dev/zero"])
    out, err = capsys.readouterr()
    assert code is ExitCode.USAGE
    assert "/dev/zero: E010 spec is larger than 1000 kB; refusing to parse it" in out
    assert "Traceback" not in out + err and "internal error" not in err


def test_reading_stops_just_past_the_limit(monkeypatch):
    """The reader asks for at most MAX_SOURCE_BYTES + 1 bytes in all, whatever the file holds."""
    asked = []
    real_read = os.read

    def counting_read(fd, n):
        asked.append(n)
        return real_read(fd, n)

    monkeypatch.setattr(P.os, "read", counting_read)
    tree, diags, _ = parse_file("/dev/zero")
    assert tree is None and [d.code for d in diags] == ["E010"]
    assert sum(asked) == P.MAX_SOURCE_BYTES + 1


def test_large_regular_file_is_e010(tmp_path):
    f = tmp_path / "big.soak"
    f.write_text("# " + "x" * (P.MAX_SOURCE_BYTES + 10) + "\n")
    tree, diags, _ = parse_file(f)
    assert tree is None and [d.code for d in diags] == ["E010"]


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
def test_check_on_a_fifo_without_writer_does_not_block(tmp_path):
    """The wait for a writer is bounded (FIFO_WAIT_S, shortened here), then E000."""
    fifo = tmp_path / "spec.soak"
    os.mkfifo(fifo)
    code = (
        "from soakspec.lang import parser as P\n"
        "P.FIFO_WAIT_S = 0.5\n"
        f"tree, diags, _ = P.parse_file({str(fifo)!r})\n"
        "assert tree is None and [d.code for d in diags] == ['E000'], diags\n"
        "assert 'nothing was written to the pipe' in diags[0].message\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
def test_check_reads_a_fifo_that_is_written(tmp_path, capsys):
    fifo = tmp_path / "spec.soak"
    os.mkfifo(fifo)

    def write() -> None:
        with open(fifo, "w") as fh:  # blocks until the reader opens
            fh.write(DEMO.read_text())

    t = threading.Thread(target=write, daemon=True)
    t.start()
    code = main(["check", str(fifo)])
    t.join(timeout=30)
    assert code is ExitCode.OK, capsys.readouterr()


def test_fmt_writes_through_a_symlink(tmp_path, capsys):
    target = tmp_path / "real.soak"
    target.write_text(DEMO.read_text().replace("  issue = ", "issue   =   ", 1))
    link = tmp_path / "link.soak"
    link.symlink_to(target.name)
    assert main(["fmt", str(link)]) is ExitCode.OK
    assert link.is_symlink() and os.readlink(link) == target.name
    assert target.read_text() == DEMO.read_text()
    capsys.readouterr()
