"""`soakspec check`, `plan` and `fmt` from the command line (issue 2's acceptance criteria).

The bad specs live in `tests/bad_specs/`, one mistake per file (or several, for the files
that prove every error is reported in one run). Each file states what it must produce in
its first lines:

    # expect: LINE:COL CODE [text the message or hint must contain]

so adding a case is adding a file.
"""

from __future__ import annotations

import json
import pathlib
import re
import shutil
import subprocess
import sys

import pytest

from soakspec.cli import main

ROOT = pathlib.Path(__file__).resolve().parents[1]
DSV2LITE = ROOT / "specs" / "dsv2lite.soak"
BAD_DIR = pathlib.Path(__file__).resolve().parent / "bad_specs"
BAD_SPECS = sorted(BAD_DIR.glob("*.soak"))

# These run through the installed console script in a subprocess; the rest in-process.
SUBPROCESS_CASES = {
    "unknown_key",
    "unterminated_string",
    "unclosed_block",
    "unexpected_character",
    "invalid_regex",
    "several_errors",
    "several_syntax_errors",
}

HEADER = re.compile(r"^(?P<path>.+?):(?P<line>\d+):(?P<col>\d+): (?P<code>[EW]\d{3}) (?P<message>.*)$")
EXPECT = re.compile(r"^# expect: (?P<line>\d+):(?P<col>\d+) (?P<code>[EW]\d{3})(?: (?P<text>.+))?$")


def _cli() -> list[str]:
    script = pathlib.Path(sys.executable).with_name("soakspec")
    return [str(script)] if script.exists() else [sys.executable, "-m", "soakspec"]


def run_cli(*args: str, cwd: pathlib.Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*_cli(), *args], capture_output=True, text=True, timeout=60, cwd=cwd
    )


def run_inproc(capsys, *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


# ---------------------------------------------------------------- the committed spec


def test_check_dsv2lite_exits_0():
    r = run_cli("check", str(DSV2LITE))
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.strip() == f"{DSV2LITE}: ok"
    assert r.stderr == ""


def test_check_dsv2lite_json(capsys):
    code, out, _ = run_inproc(capsys, "check", "--format", "json", str(DSV2LITE))
    assert code == 0
    doc = json.loads(out)
    assert doc["schema_version"] == 1 and doc["ok"] is True and doc["diagnostics"] == []
    assert re.fullmatch(r"[0-9a-f]{64}", doc["files"][0]["sha256"])


def test_plan_dsv2lite_json_numbers(capsys):
    """2 backends × 2 levels × 2 buckets of 60 s; batches of 8 with a 12 s expected latency:
    at concurrency 4 a batch takes two 12 s rounds (5 batches = 40 requests in 120 s), at 8 one
    (10 batches = 80); 120 expected per backend (the retained run saw 14-16 batches). Wall
    time: 2 levels × 120 s + a 12 s follow-up = 252 s per backend, one after the other."""
    code, out, err = run_inproc(capsys, "plan", "--format", "json", str(DSV2LITE))
    assert code == 0, err
    p = json.loads(out)
    assert p["schema_version"] == 1
    assert p["soak"] == "dsv2lite-http-soak" and p["issue"] == "#465"
    assert p["parallel"] is False and p["rehearsal"] is False and p["time_scale"] == 1.0
    assert p["bucket_count"] == 8
    assert [b["name"] for b in p["backends"]] == ["host-staged", "nccl"]
    assert p["min_requests"] == 32
    assert p["expected_requests"] == 240
    assert p["est_wall_s"] == 504.0
    for b in p["backends"]:
        assert b["kind"] == "launch"
        assert b["follow_up"] is True
        assert b["min_requests"] == 16 and b["expected_requests"] == 120
        assert b["est_wall_s"] == 252.0
        assert b["max_wall_s"] > b["est_wall_s"]
        assert [lv["concurrency"] for lv in b["levels"]] == [4, 8]
        assert [lv["min_requests"] for lv in b["levels"]] == [8, 8]
        assert [lv["expected_requests"] for lv in b["levels"]] == [40, 80]
        for lv in b["levels"]:
            assert lv["workload"] == "short" and lv["mode"] == "batch" and lv["batch_requests"] == 8
            assert lv["duration_s"] == 120.0 and lv["warmup_s"] == 0.0 and lv["deadline_s"] == 120.0
            assert lv["buckets"] == [
                {"index": 0, "start_s": 0.0, "length_s": 60.0},
                {"index": 1, "start_s": 60.0, "length_s": 60.0},
            ]
    assert p["backends"][1]["runtime_boundary"] == "NCCL 2.26.2, NCCL_IB_DISABLE=1, NCCL_P2P_DISABLE=1"
    assert sum(b["max_wall_s"] for b in p["backends"]) == pytest.approx(p["max_wall_s"])


def test_plan_dsv2lite_text():
    r = run_cli("plan", str(DSV2LITE))
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert "2 backends × 2 levels × 2 buckets = 8 buckets in all" in out
    assert out.count("in 2 × 1m buckets") == 4
    assert out.count("requests: ≥ 16, expected ~120; wall time ≈ 4m12s") == 2
    assert "short / concurrency 4 (batches of 8): 2m in 2 × 1m buckets; requests ≥ 8, expected ~40" in out
    assert "short / concurrency 8 (batches of 8): 2m in 2 × 1m buckets; requests ≥ 8, expected ~80" in out
    assert "total: requests ≥ 32, expected ~240; wall time ≈ 8m24s" in out
    assert r.stderr == ""  # stdout carries the plan, nothing else is said


def test_plan_dsv2lite_is_stable_across_runs(capsys):
    _, first, _ = run_inproc(capsys, "plan", "--format", "json", str(DSV2LITE))
    _, second, _ = run_inproc(capsys, "plan", "--format", "json", str(DSV2LITE))
    assert first == second


def test_plan_time_scale_and_backend_filter(capsys):
    code, out, _ = run_inproc(capsys, "plan", "--format", "json", "--time-scale", "0.1", "--backend", "nccl", str(DSV2LITE))
    assert code == 0
    p = json.loads(out)
    assert [b["name"] for b in p["backends"]] == ["nccl"]
    assert p["bucket_count"] == 4
    assert p["est_wall_s"] == pytest.approx(25.2)
    assert p["backends"][0]["levels"][0]["buckets"][1] == {"index": 1, "start_s": 6.0, "length_s": 6.0}


@pytest.mark.parametrize(
    "args, message",
    [
        (["--time-scale", "0"], "--time-scale must be in (0, 1]"),
        (["--time-scale", "2"], "--time-scale must be in (0, 1]"),
        (["--backend", "vllm"], "no backend named 'vllm'"),
    ],
)
def test_plan_bad_flags(capsys, args, message):
    code, out, err = run_inproc(capsys, "plan", *args, str(DSV2LITE))
    assert code == 2
    assert message in err and out == ""


def test_fmt_check_dsv2lite_is_canonical():
    r = run_cli("fmt", "--check", str(DSV2LITE))
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout == "" and r.stderr == ""


def test_fmt_check_reports_unformatted_and_rewrites(tmp_path, capsys):
    f = tmp_path / "messy.soak"
    original = DSV2LITE.read_text().replace("  issue = ", "issue   =   ", 1)
    f.write_text(original)
    code, out, _ = run_inproc(capsys, "fmt", "--check", str(f))
    assert code == 1 and f"{f}: would reformat" in out
    assert f.read_text() == original  # --check changes nothing
    code, out, _ = run_inproc(capsys, "fmt", "--diff", str(f))
    assert code == 1 and "-issue   =   " in out and '+  issue = "#465"' in out
    code, _, err = run_inproc(capsys, "fmt", str(f))
    assert code == 0 and "reformatted" in err
    assert f.read_text() == DSV2LITE.read_text()


# ---------------------------------------------------------------- bad specs


def _expectations(path: pathlib.Path) -> list[dict]:
    lines = path.read_text(encoding="utf-8").splitlines()
    out = []
    for line in lines:
        m = EXPECT.match(line)
        if not m:
            break
        out.append({"line": int(m["line"]), "col": int(m["col"]), "code": m["code"], "text": m["text"]})
    assert out, f"{path.name} must start with '# expect: LINE:COL CODE'"
    return out


def _blocks(output: str) -> list[dict]:
    """Split rendered diagnostics into {header fields, source line, caret line, hint}."""
    lines = output.splitlines()
    blocks: list[dict] = []
    for i, line in enumerate(lines):
        m = HEADER.match(line)
        if m:
            blocks.append({**m.groupdict(), "line": int(m["line"]), "col": int(m["col"]), "rest": []})
        elif blocks and line.startswith("  "):
            blocks[-1]["rest"].append(line)
    return blocks


def _assert_rendered(output: str, path: str, source: str, expected: list[dict]) -> None:
    assert "Traceback" not in output
    blocks = _blocks(output)
    got = [(b["line"], b["col"], b["code"]) for b in blocks if b["code"].startswith("E")]
    want = [(e["line"], e["col"], e["code"]) for e in expected if e["code"].startswith("E")]
    assert got == want, output  # every error, nothing else, in line order
    for w in (e for e in expected if e["code"].startswith("W")):
        assert (w["line"], w["col"], w["code"]) in [(b["line"], b["col"], b["code"]) for b in blocks], output
    src_lines = source.splitlines()
    for b, e in zip((b for b in blocks if b["code"].startswith("E")), (e for e in expected if e["code"].startswith("E"))):
        assert b["path"] == path
        # the source line, then a caret under the reported column
        assert b["rest"][0] == "  " + src_lines[b["line"] - 1], output
        caret = b["rest"][1]
        assert re.fullmatch(r"  *\^~*", caret), output
        assert caret.index("^") == 2 + b["col"] - 1, output
        if e["text"]:
            assert e["text"] in b["message"] + "\n".join(b["rest"]), output
    n = len(want)
    assert output.rstrip().splitlines()[-1].startswith(f"Found {n} error{'s' if n != 1 else ''}"), output


def _ids(p: pathlib.Path) -> str:
    return p.stem


def test_there_are_enough_bad_specs():
    assert len(BAD_SPECS) >= 24
    several = [p for p in BAD_SPECS if len([e for e in _expectations(p) if e["code"].startswith("E")]) >= 4]
    assert several, "a file with several independent errors"
    for p in BAD_SPECS:  # every file is small and focused
        assert len(p.read_text().splitlines()) <= 30, p.name


@pytest.mark.parametrize("path", [p for p in BAD_SPECS if p.stem not in SUBPROCESS_CASES], ids=_ids)
def test_bad_spec_in_process(path, capsys):
    """`soakspec check` reports exactly the expected errors, with source line and caret,
    exits 2, and `--format json` reports the same positions."""
    expected = _expectations(path)
    code, out, err = run_inproc(capsys, "check", str(path))
    assert code == 2, out + err
    assert "Traceback" not in err and "internal error" not in err
    _assert_rendered(out, str(path), path.read_text(), expected)

    code, out, _ = run_inproc(capsys, "check", "--format", "json", str(path))
    assert code == 2
    doc = json.loads(out)
    assert doc["ok"] is False and doc["files"][0]["ok"] is False
    errors = sorted((d["line"], d["column"], d["code"]) for d in doc["diagnostics"] if d["severity"] == "error")
    assert errors == sorted((e["line"], e["col"], e["code"]) for e in expected if e["code"].startswith("E"))


@pytest.mark.parametrize("path", [p for p in BAD_SPECS if p.stem in SUBPROCESS_CASES], ids=_ids)
def test_bad_spec_subprocess(path):
    """The real console script, run from the spec's directory with a relative path."""
    r = run_cli("check", path.name, cwd=path.parent)
    assert r.returncode == 2, r.stdout + r.stderr
    assert r.stderr == ""
    _assert_rendered(r.stdout, path.name, path.read_text(), _expectations(path))


def test_subprocess_cases_exist():
    assert SUBPROCESS_CASES <= {p.stem for p in BAD_SPECS}


@pytest.mark.parametrize("path", BAD_SPECS, ids=_ids)
def test_bad_spec_plan_and_fmt(path, capsys):
    """`plan` refuses a bad spec with the same diagnostics (on stderr) and exit 2; `fmt`
    refuses a spec with syntax errors and leaves one with only semantic errors formatted."""
    expected = _expectations(path)
    code, out, err = run_inproc(capsys, "plan", str(path))
    assert code == 2 and out == ""
    _assert_rendered(err, str(path), path.read_text(), expected)
    syntax = any(e["code"] < "E100" for e in expected)
    text = path.read_text()
    code, out, err = run_inproc(capsys, "fmt", "--check", str(path))
    assert "Traceback" not in err
    if syntax:
        assert code == 2 and "E0" in err
    else:
        assert code in (0, 1) and err == ""
    assert path.read_text() == text


def test_several_errors_are_all_reported_in_line_order(capsys):
    path = BAD_DIR / "several_errors.soak"
    code, out, _ = run_inproc(capsys, "check", str(path))
    assert code == 2
    lines = [(b["line"], b["col"]) for b in _blocks(out)]
    assert len(lines) >= 4 and lines == sorted(lines)
    assert len({b["code"] for b in _blocks(out)}) >= 4  # independent mistakes, not one cascading
    assert out.rstrip().endswith(f"Found {len(lines)} errors.")


def test_check_many_files_reports_all_and_counts_once(capsys):
    paths = [str(BAD_DIR / "missing_unit.soak"), str(DSV2LITE), str(BAD_DIR / "unknown_unit.soak")]
    code, out, _ = run_inproc(capsys, "check", *paths)
    assert code == 2
    assert [b["path"] for b in _blocks(out)] == [paths[0], paths[2]]
    assert out.count("Found ") == 1 and out.rstrip().endswith("Found 2 errors.")


def test_check_missing_file_is_a_usage_error(capsys, tmp_path):
    code, out, err = run_inproc(capsys, "check", str(tmp_path / "nope.soak"))
    assert code == 2 and "E000" in out and "Traceback" not in out + err


def test_check_binary_file(capsys, tmp_path):
    f = tmp_path / "bin.soak"
    f.write_bytes(b"soak \xff\xfe {}\n")
    code, out, _ = run_inproc(capsys, "check", str(f))
    assert code == 2 and f"{f}:1:6: E003" in out


def test_warnings_do_not_fail_unless_strict(capsys, tmp_path):
    f = tmp_path / "warn.soak"
    f.write_text(
        'soak "x" {}\nbackend "a" { launch = ["./server"] }\nworkload "w" {\n  load { concurrency = 1 }\n  duration = 60s\n}\n'
    )
    code, out, _ = run_inproc(capsys, "check", str(f))
    assert code == 0 and f"{f}:2:1: W501" in out and "Found 1 warning." in out
    code, out, _ = run_inproc(capsys, "check", "--strict", str(f))
    assert code == 2


def test_no_tmp_files_left_by_fmt(tmp_path, capsys):
    f = tmp_path / "a.soak"
    shutil.copy(DSV2LITE, f)
    f.write_text(f.read_text() + "\n\n\n")
    assert run_inproc(capsys, "fmt", str(f))[0] == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.soak"]


# ---------------------------------------------------------------- line endings, BOM, stdin

def _stdin(monkeypatch, data: bytes) -> None:
    import io

    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(data), encoding="utf-8"))


def _sha(capsys, path) -> str:
    code, out, _ = run_inproc(capsys, "check", "--format", "json", str(path))
    assert code == 0, out
    return json.loads(out)["files"][0]["sha256"]


LONG_STRING_SPEC = (
    'soak "x" {\n  description = """two\n  lines"""\n}\n\nbackend "a" {\n  url = "http://127.0.0.1:8000"\n}\n\n'
    'workload "w" {\n  load {\n    concurrency = 1\n  }\n  duration = 60s\n}\n'
)


def test_fmt_keeps_crlf_line_endings(tmp_path, capsys):
    """A formatted spec saved with CRLF line breaks (a Windows editor) is formatted: --check
    and --diff say nothing; fmt of an unformatted one writes CRLF back; the hash is the LF one's."""
    lf = DSV2LITE.read_text()
    crlf = tmp_path / "crlf.soak"
    crlf.write_bytes(lf.replace("\n", "\r\n").encode())
    assert run_inproc(capsys, "fmt", "--check", str(crlf)) == (0, "", "")
    assert run_inproc(capsys, "fmt", "--diff", str(crlf)) == (0, "", "")
    assert _sha(capsys, crlf) == _sha(capsys, DSV2LITE)
    crlf.write_bytes(lf.replace("  issue = ", "issue   =   ", 1).replace("\n", "\r\n").encode())
    code, out, _ = run_inproc(capsys, "fmt", "--diff", str(crlf))
    changed = [ln for ln in out.split("\n")[2:] if ln.startswith(("-", "+"))]
    assert code == 1 and changed == ['-issue   =   "#465"\r', '+  issue = "#465"\r']  # that line only
    assert run_inproc(capsys, "fmt", str(crlf))[0] == 0
    assert crlf.read_bytes() == lf.replace("\n", "\r\n").encode()
    assert run_inproc(capsys, "fmt", "--check", str(crlf))[0] == 0


def test_fmt_of_crlf_long_strings_is_idempotent_and_hashes_as_lf(tmp_path, capsys):
    """A long string's line breaks in a CRLF file are line breaks, as in the LF file: the same
    value (no '\\r' in it), the same hash, and fmt writes it back unchanged."""
    lf, crlf = tmp_path / "lf.soak", tmp_path / "crlf.soak"
    lf.write_text(LONG_STRING_SPEC)
    crlf.write_bytes(LONG_STRING_SPEC.replace("\n", "\r\n").encode())
    assert run_inproc(capsys, "fmt", "--check", str(lf))[0] == 0  # the fixture is canonical
    assert run_inproc(capsys, "fmt", "--check", str(crlf)) == (0, "", "")
    assert _sha(capsys, crlf) == _sha(capsys, lf)
    from soakspec.lang import load_spec

    assert load_spec(crlf)[0].header.description == "two\n  lines"
    crlf.write_bytes(LONG_STRING_SPEC.replace("\n", "\r\n").replace("soak \"x\" {", "soak  \"x\"{", 1).encode())
    assert run_inproc(capsys, "fmt", str(crlf))[0] == 0
    once = crlf.read_bytes()
    assert once == LONG_STRING_SPEC.replace("\n", "\r\n").encode()
    assert run_inproc(capsys, "fmt", str(crlf))[0] == 0 and crlf.read_bytes() == once


def test_a_cr_only_spec_points_at_its_own_lines_and_fmt_keeps_cr(tmp_path, capsys):
    """A spec saved with lone CR line breaks (classic Mac OS) reads as the LF one: its errors
    point at their own line and show it (not line 1 holding the whole file), it hashes as the
    LF file, and fmt writes CR back."""
    lf = LONG_STRING_SPEC.replace("  duration = 60s\n", "  duration = 60s\n  bogus = 1\n")
    cr = tmp_path / "cr.soak"
    cr.write_bytes(lf.replace("\n", "\r").encode())
    code, out, err = run_inproc(capsys, "check", str(cr))
    line = lf.split("\n").index("  bogus = 1") + 1
    said = out + err
    assert code == 2 and f"cr.soak:{line}:3: E101 unknown key 'bogus'" in said and "\n    bogus = 1\n" in said, said
    cr.write_bytes(LONG_STRING_SPEC.replace("\n", "\r").encode())
    lf_file = tmp_path / "lf.soak"
    lf_file.write_text(LONG_STRING_SPEC)
    assert run_inproc(capsys, "fmt", "--check", str(cr)) == (0, "", "")
    assert _sha(capsys, cr) == _sha(capsys, lf_file)
    cr.write_bytes(LONG_STRING_SPEC.replace("= 60s", "=   60s").replace("\n", "\r").encode())
    assert run_inproc(capsys, "fmt", str(cr))[0] == 0
    assert cr.read_bytes() == LONG_STRING_SPEC.replace("\n", "\r").encode()


def test_fmt_stdin_keeps_crlf(monkeypatch, capsys):
    _stdin(monkeypatch, LONG_STRING_SPEC.replace("\n", "\r\n").replace("= 60s", "=   60s").encode())
    code, out, _ = run_inproc(capsys, "fmt", "-")
    assert code == 0 and out == LONG_STRING_SPEC.replace("\n", "\r\n")


def test_check_reads_stdin(monkeypatch, capsys):
    """`check -` reads the spec from stdin, shown as <stdin> (as `fmt -` shows it)."""
    _stdin(monkeypatch, DSV2LITE.read_bytes())
    code, out, err = run_inproc(capsys, "check", "-")
    assert (code, out.strip(), err) == (0, "<stdin>: ok", "")
    _stdin(monkeypatch, DSV2LITE.read_bytes())
    code, out, _ = run_inproc(capsys, "check", "--format", "json", "-")
    doc = json.loads(out)
    assert code == 0 and doc["files"][0]["path"] == "<stdin>" and doc["files"][0]["sha256"] == _sha(capsys, DSV2LITE)
    bad = (BAD_DIR / "concurrency_too_large.soak").read_text()
    _stdin(monkeypatch, bad.encode())
    code, out, _ = run_inproc(capsys, "check", "-")
    _assert_rendered(out, "<stdin>", bad, _expectations(BAD_DIR / "concurrency_too_large.soak"))
    assert code == 2
    _stdin(monkeypatch, b"soak \xff {}\n")
    code, out, _ = run_inproc(capsys, "check", "-")
    assert code == 2 and "<stdin>:1:6: E003 spec is not valid UTF-8 (byte 0xff)" in out  # at the byte


def test_check_stdin_once_and_beside_files(monkeypatch, capsys):
    _stdin(monkeypatch, DSV2LITE.read_bytes())
    code, out, _ = run_inproc(capsys, "check", str(DSV2LITE), "-")
    assert code == 0 and out.splitlines() == [f"{DSV2LITE}: ok", "<stdin>: ok"]
    _stdin(monkeypatch, DSV2LITE.read_bytes())
    code, _, err = run_inproc(capsys, "check", "-", "-")
    assert code == 2 and "`-` (stdin) can be given once" in err


def test_check_stdin_through_the_console_script():
    r = subprocess.run([*_cli(), "check", "-"], input=DSV2LITE.read_text(), capture_output=True, text=True, timeout=60)
    assert (r.returncode, r.stdout.strip()) == (0, "<stdin>: ok"), r.stderr


BOM = "\ufeff"


def test_a_leading_bom_is_accepted(tmp_path, capsys):
    """A UTF-8 BOM (some Windows editors write one) is not part of the spec: it checks, hashes
    as without it, and line 1's columns are counted after it."""
    f = tmp_path / "bom.soak"
    f.write_text(BOM + DSV2LITE.read_text(), encoding="utf-8")
    code, out, _ = run_inproc(capsys, "check", str(f))
    assert code == 0 and out.strip() == f"{f}: ok"
    assert _sha(capsys, f) == _sha(capsys, DSV2LITE)
    f.write_text(BOM + 'soak "x" { issue = 5 }\n' + DSV2LITE.read_text().split("\n", 5)[-1], encoding="utf-8")
    code, out, _ = run_inproc(capsys, "check", str(f))
    assert code == 2 and f"{f}:1:20: E104" in out and "\\ufeff" not in out and BOM not in out


def test_fmt_keeps_a_leading_bom(tmp_path, capsys, monkeypatch):
    """fmt changes layout, never the encoding the editor chose: a formatted file with a BOM
    passes --check, and an unformatted one is rewritten with its BOM (stdin too)."""
    f = tmp_path / "bom.soak"
    f.write_text(BOM + DSV2LITE.read_text(), encoding="utf-8")
    assert run_inproc(capsys, "fmt", "--check", str(f)) == (0, "", "")
    f.write_text(BOM + DSV2LITE.read_text().replace("  issue = ", "issue   =   ", 1), encoding="utf-8")
    assert run_inproc(capsys, "fmt", str(f))[0] == 0
    assert f.read_text(encoding="utf-8") == BOM + DSV2LITE.read_text()
    _stdin(monkeypatch, (BOM + LONG_STRING_SPEC.replace("= 60s", "=   60s")).encode())
    assert run_inproc(capsys, "fmt", "-") == (0, BOM + LONG_STRING_SPEC, "")


def test_check_json_lists_diagnostics_in_the_order_the_text_shows_them(capsys):
    """`check --format json` and the text output list the same diagnostics in the same order
    (by line and column): the checker reports by stage, not in source order."""
    f = BAD_DIR / "several_errors.soak"
    code, out, _ = run_inproc(capsys, "check", "--format", "json", str(f))
    places = [(d["line"], d["column"]) for d in json.loads(out)["diagnostics"]]
    assert code == 2 and len(places) > 1 and places == sorted(places)
    code, text, _ = run_inproc(capsys, "check", str(f))
    shown = [(int(m["line"]), int(m["col"])) for m in map(HEADER.match, text.splitlines()) if m]
    assert shown == places
