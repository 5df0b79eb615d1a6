"""`soakspec report` on a real run: md, html, junit and json.

The evidence is a real `soakspec run` of the quick-start demo spec, shortened to seconds
(`quick_demo` in tests/conftest.py): the runner's own writers, at full scale, because a
time-scaled run can never PASS (the judge's built-in `full_scale_run` makes it INCONCLUSIVE) and
the md report of a *passing* run is what has to render as a table and pass `lint-claims`. The
45 s demo itself runs in the `slow` lane: its report passes `lint-claims` against the shipped
spec (below), and tests/test_runner.py runs it end to end. Failing and hostile
cases use the judge's synthetic evidence (tests/test_report_render.py).
"""

from __future__ import annotations

import contextlib
import io
import json
import re
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
import zlib
from pathlib import Path

import pytest

from runner_support import manifest, requests_of
from soakspec.cli import main
from soakspec.evidence import schema
from soakspec.evidence.testing import edit_requests
from soakspec.report.html import CHART_METRICS

REPO = Path(__file__).resolve().parents[1]
EXCLUDES = ("production readiness", "GPU performance", "long-prompt stability")



@pytest.fixture(scope="module")
def run_dir(quick_demo) -> Path:
    return quick_demo.run_dir


@pytest.fixture(scope="module")
def spec_path(quick_demo) -> Path:
    """The spec the run used."""
    return quick_demo.spec


def cli(*argv: str) -> tuple[int, str, str]:
    """`soakspec ARGV` in-process: (exit code, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(argv))
    return code, out.getvalue(), err.getvalue()


@pytest.fixture(scope="module")
def reports(run_dir) -> dict[str, tuple[int, str, str]]:
    """`soakspec report RUN --format F` once per format (verification takes a few seconds)."""
    return {fmt: cli("report", str(run_dir), "--format", fmt) for fmt in ("md", "html", "json", "junit")}


@pytest.fixture(scope="module")
def verdict(run_dir) -> dict:
    """verdict.json's shape, re-judged in-process from the evidence."""
    from soakspec.judge.cli_support import spec_for
    from soakspec.judge import judge, load_evidence

    evidence = load_evidence(run_dir)
    return judge(spec_for(evidence, None, str(run_dir))[0], evidence).to_json()


def table_rows(md: str) -> list[list[str]]:
    """The results table: the block of `|` lines starting at the `| Backend |` header, split
    into cells (GFM: `\\|` is a literal pipe, not a separator)."""
    lines = md.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("| Backend |"))
    block = []
    for line in lines[start:]:
        if not line.startswith("|"):
            break
        block.append([c.strip() for c in re.split(r"(?<!\\)\|", line.strip())[1:-1]])
    return block


# ------------------------------------------------------------------------------ the run


def test_demo_run_passes(reports, verdict):
    """The full-scale (shortened) demo passes its gate, and every format renders (exit 0)."""
    assert verdict["verdict"] == "PASS", verdict["summary"]
    for fmt, (code, out, err) in reports.items():
        assert code == 0, (fmt, err)
        assert out.endswith("\n") and err == ""


# ------------------------------------------------------------------------------ md


def test_md_results_table_shape(reports, run_dir):
    """Header + separator + one row per backend, the same column count on every line, the
    seed's columns, and GitHub-flavoured Markdown renders it as a table."""
    code, md, _ = reports["md"]
    rows = table_rows(md)
    assert rows[0] == ["Backend", "Runtime boundary", "Boundary check", "Completed", "Failed/timeouts", "Rejected",
                       "Disconnected", "Buckets", "Own rules", "Artifact SHA-256"]
    assert all(re.fullmatch(r"-{3,}", c) for c in rows[1])
    names = [b["name"] for b in manifest(run_dir)["backends"]]
    assert [r[0] for r in rows[2:]] == names == ["sim-fast", "sim-slow"]
    assert {len(r) for r in rows} == {10}
    for r in rows[2:]:
        assert r[8].startswith("passed (") and r[4] == "0 / 0" and r[7] == "4" and r[5] == r[6] == "0"

    from markdown_it import MarkdownIt

    html = MarkdownIt("commonmark").enable("table").render(md)
    tables = re.findall(r"<table>.*?</table>", html, re.S)
    results = next(t for t in tables if "<th>Artifact SHA-256</th>" in t)
    assert results.count("<tr>") == 1 + len(names)
    assert results.count("<th>") == 10 and results.count("<td>") == 10 * len(names)


def test_md_values_are_the_evidence(reports, run_dir):
    """Completed and failures count requests.jsonl; the SHA-256 is the manifest's hash of it."""
    _, md, _ = reports["md"]
    m = manifest(run_dir)
    for row in table_rows(md)[2:]:
        name = row[0]
        recs = requests_of(run_dir, name)
        measured = [r for r in recs if r["bucket"] >= 0]
        assert row[3] == str(sum(r["outcome"] == "completed" for r in measured))
        assert row[9] == m["artifacts"][f"backends/{name}/requests.jsonl.gz"]
        entry = next(b for b in m["backends"] if b["name"] == name)
        assert row[1].strip("`") == entry["runtime_boundary"]["display"]
    assert "backends/<name>/requests.jsonl.gz" in md  # the footnote says what the hash is of
    assert re.search(r"^- hardware: (no GPU telemetry \(NVML not available\)|\d+x .+)$", md, re.M)
    assert "- workload: prompt_words=32, max_tokens=32,48, greedy, ignore-EOS, concurrency 4,8, closed loop," in md
    assert "- time scale: 1 (full scale)" in md and "- rehearsal: no" in md


def test_md_claim_boundary_lists_every_exclude_verbatim(reports):
    _, md, _ = reports["md"]
    section = md[md.index("### Claim Boundary"):]
    assert "This is short-shape sustained HTTP soak evidence against the embedded simulator." in section
    after = section[section.index("It does not claim:"):].splitlines()
    assert [line[2:] for line in after if line.startswith("- ")] == list(EXCLUDES)


def test_md_passes_lint_claims(reports, run_dir, spec_path, tmp_path, capsys):
    """By construction: the md report of the run, linted against the spec and the evidence,
    has no finding (text and JSON output) -- its per-level table's Peak columns, which the
    linter reads, included (results.json's peaks of each level)."""
    _, md, _ = reports["md"]
    lines = md.splitlines()
    at = next(i for i, x in enumerate(lines) if x.startswith("| Backend / level |"))
    head = [c.strip() for c in lines[at].strip("|").split("|")]
    block = lines[at + 2:]
    block = block[:next((i for i, x in enumerate(block) if not x.startswith("|")), len(block))]
    rows = [[c.strip() for c in x.strip("|").split("|")] for x in block]
    results = json.loads((run_dir / "results.json").read_text())
    peaks = [(str(lv["peak_output_tokens_per_s"]), str(lv["peak_concurrent_requests"]))
             for be in results["backends"] for lv in be["levels"]]
    assert [(r[head.index("Peak output tok/s")], r[head.index("Peak concurrent requests")]) for r in rows] == peaks
    doc = tmp_path / "PR.md"
    doc.write_text(md)
    assert main(["lint-claims", str(doc), "--spec", str(spec_path), "--evidence", str(run_dir)]) == 0
    assert capsys.readouterr().out.strip() == f"{doc}: no findings"
    assert main(["lint-claims", str(doc), "--spec", str(spec_path), "--evidence", str(run_dir), "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["diagnostics"] == []


def test_md_edited_table_is_caught_by_lint_claims(reports, run_dir, spec_path, tmp_path, capsys):
    """The linter does read the generated table: a changed count is a finding on its line."""
    _, md, _ = reports["md"]
    row = table_rows(md)[2]
    line = next(i for i, x in enumerate(md.splitlines(), 1) if x.startswith(f"| {row[0]} |"))
    doctored = md.replace(f"| {row[3]} | {row[4]} |", f"| {int(row[3]) + 1} | {row[4]} |", 1)
    doc = tmp_path / "PR.md"
    doc.write_text(doctored)
    assert main(["lint-claims", str(doc), "--spec", str(spec_path), "--evidence", str(run_dir)]) == 1
    assert f"{doc}:{line}:" in capsys.readouterr().out


# ------------------------------------------------------------------------------ html


def test_html_is_self_contained_with_one_chart_per_backend_per_metric(reports, run_dir):
    _, page, _ = reports["html"]
    assert page.startswith("<!DOCTYPE html>")
    for ref in ("http://", "https://", "<script", "src=", "href=", "url(", "@import", "<link", "<img", "<iframe"):
        assert ref not in page.lower(), ref
    charts = re.findall(r'<svg class="chart" data-backend="([^"]*)" data-metric="([^"]*)"', page)
    names = [b["name"] for b in manifest(run_dir)["backends"]]
    # then the server's side (report/serverview.py): the simulator's queue and cache gauges from
    # its /metrics (no rule names a server metric) and the server's CPU
    server = ("server:vllm:num_requests_running", "server:vllm:num_requests_waiting", "server:vllm:kv_cache_usage_perc", "cpu")
    assert sorted(charts) == sorted((n, m) for n in names for m in CHART_METRICS + server)
    # the latency charts are real charts with a point per bucket, not placeholders
    for n in names:
        svg = re.search(rf'<svg class="chart" data-backend="{n}" data-metric="ttft".*?</svg>', page, re.S).group(0)
        # p50/p95/p99, one line per level each: no line joins the two levels
        assert svg.count("<polyline") == 3 * 2 and svg.count("<circle") == 3 * 4
    assert "no GPU telemetry" in page  # NVML is unavailable here: GPU memory says so


def _png_pixels_vary(data: bytes) -> int:
    """Distinct byte values in the PNG's decompressed image data (a blank page has 1-3)."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat = 8, b""
    while pos < len(data):
        n = int.from_bytes(data[pos:pos + 4], "big")
        kind = data[pos + 4:pos + 8]
        if kind == b"IDAT":
            idat += data[pos + 8:pos + 8 + n]
        pos += 12 + n
    return len(set(zlib.decompress(idat)))


@pytest.mark.skipif(shutil.which("chromium") is None, reason="Chromium is not installed (apt-get install chromium)")
def test_html_renders_in_headless_chromium(run_dir, tmp_path, capsys):
    page = tmp_path / "report.html"
    assert main(["report", str(run_dir), "--format", "html", "--out", str(page)]) == 0
    capsys.readouterr()
    shot = tmp_path / "shot.png"
    proc = subprocess.run(
        ["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         f"--user-data-dir={tmp_path / 'profile'}", f"--screenshot={shot}", "--window-size=1280,2000",
         page.resolve().as_uri()],
        capture_output=True, text=True, timeout=180,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    data = shot.read_bytes()
    assert len(data) > 20_000, len(data)
    assert _png_pixels_vary(data) > 64


# ------------------------------------------------------------------------------ junit, json


def test_junit_one_testcase_per_rule(reports, run_dir, verdict):
    _, xml, _ = reports["junit"]
    root = ET.fromstring(xml)
    cases = root.findall("./testsuite/testcase")
    assert [(c.get("classname"), c.get("name")) for c in cases] == [(r["class"], r["rule"]) for r in verdict["rules"]]
    assert root.get("tests") == str(len(verdict["rules"]))
    assert not root.findall(".//failure") and root.get("failures") == "0"
    props = {p.get("name"): p.get("value") for p in root.iter("property")}
    assert props["verdict"] == "PASS" and props["run_id"] == manifest(run_dir)["run_id"]
    # a warn rule that did not hold (the real demo's drift warning may fire on a busy host) says so first
    outs = [c.find("system-out").text for c in cases]
    assert all(t.startswith("rule: ") or (t.startswith("WARNING: ") and "\nrule: " in t) for t in outs)


def test_json_validates(reports):
    _, out, _ = reports["json"]
    doc = json.loads(out)
    assert set(doc) == {"schema_version", "verdict", "results", "backend_status", "run"} and doc["schema_version"] == 1
    assert doc["run"]["status"] == "complete" and doc["run"]["preflight"] is True
    assert {n: b["status"] for n, b in doc["backend_status"].items()} == {"sim-fast": "passed", "sim-slow": "passed"}
    assert not schema.validate("verdict", doc["verdict"])
    assert not schema.validate("results", doc["results"])
    assert doc["verdict"]["verdict"] == "PASS"


# ------------------------------------------------------------------------------ the command


def test_out_writes_the_file_and_nothing_to_stdout(reports, run_dir, tmp_path, capsys):
    dest = tmp_path / "r.md"
    assert main(["report", str(run_dir), "--out", str(dest)]) == 0
    out, err = capsys.readouterr()
    assert out == "" and f"wrote {dest}" in err
    _, md, _ = reports["md"]
    assert dest.read_text() == md
    assert [p.name for p in tmp_path.iterdir()] == ["r.md"]  # no temporary file left behind


def test_a_stored_verdict_is_never_trusted(run_dir, tmp_path):
    """A verdict.json that says FAIL (bound to the right manifest) changes nothing: the report
    re-judges the evidence."""
    copy = tmp_path / "run"
    shutil.copytree(run_dir, copy)
    v = json.loads((copy / "verdict.json").read_text())
    v.update(verdict="FAIL", exit_code=1)
    (copy / "verdict.json").write_text(json.dumps(v))
    code, md, _ = cli("report", str(copy), "--format", "md")
    assert code == 0 and "**Verdict: PASS**" in md


def test_edited_evidence_fails_and_names_the_file(run_dir, tmp_path):
    copy = tmp_path / "run"
    shutil.copytree(run_dir, copy)
    p = copy / "backends" / "sim-slow" / "requests.jsonl.gz"
    edit_requests(p, lambda t: t.replace('"outcome":"completed"', '"outcome":"failed"', 1))
    code, md, _ = cli("report", str(copy), "--format", "md")
    assert code == 0  # rendered; the verdict's exit code is the gate's
    assert cli("gate", str(copy))[0] == 1
    assert "**Verdict: FAIL**" in md
    # the changed file is sim-slow's: its row fails artifacts_verified; sim-fast's evidence is intact
    own = {r[0]: r[8] for r in table_rows(md)[2:]}
    assert own["sim-slow"].startswith("failed: ") and "artifacts_verified" in own["sim-slow"]
    assert "artifacts_verified" not in own["sim-fast"]
    assert "FAIL  [evidence] artifacts_verified — backends/sim-slow/requests.jsonl.gz: changed since the manifest was written" in md
    code, xml, _ = cli("report", str(copy), "--format", "junit")
    assert code == 0
    failed = [c.get("name") for c in ET.fromstring(xml).iter("testcase") if c.find("failure") is not None]
    assert "artifacts_verified" in failed


def test_a_newer_spec_rejudges_and_says_so(run_dir, spec_path, tmp_path):
    strict = tmp_path / "strict.soak"
    strict.write_text(spec_path.read_text().replace("require p95(ttft) < 1s per level", "require p95(ttft) < 1ms per level"))
    code, md, err = cli("report", str(run_dir), "--format", "md", "--spec", str(strict))
    assert code == 0 and "**Verdict: FAIL**" in md
    assert cli("gate", str(run_dir), "--spec", str(strict))[0] == 1
    assert "differs from the spec the run used" in err
    assert "FAIL  [performance] p95(ttft) < 1ms per level" in md
    assert "- note: judged with a spec" in md


@pytest.mark.slow
def test_the_shipped_demo_reports_a_pass_that_lint_claims_accepts(tmp_path, capsys):
    """The quick start as a reviewer would use it, on the shipped spec itself (about 50 s): the
    45 s demo passes, and its md report linted against specs/demo.soak has no finding."""
    demo = REPO / "specs" / "demo.soak"
    out = tmp_path / "demo"
    proc = subprocess.run([sys.executable, "-m", "soakspec", "run", str(demo), "--out", str(out), "--quiet"],
                          cwd=REPO, capture_output=True, text=True, timeout=300)
    # PASS; on a machine whose CPUs other work takes, INCONCLUSIVE for the load generator's
    # health alone (#17) -- and its report lints clean all the same
    assert proc.returncode in (0, 3), proc.stderr[-3000:] + proc.stdout[-3000:]
    code, md, _ = cli("report", str(out), "--format", "md")
    if proc.returncode == 3:
        verdict = json.loads((out / "verdict.json").read_text())
        undecided = {r["rule"] for r in verdict["rules"] if r["severity"] == "require" and r["status"] != "pass"}
        assert "client_healthy" in undecided and undecided <= {"client_healthy", "p95(ttft) < 1s per level", "mean(itl) < 50ms"}
    assert code == 0 and ("**Verdict: PASS**" in md if proc.returncode == 0 else "**Verdict: INCONCLUSIVE**" in md)
    assert "### Load generator" in md
    assert "- workload: prompt_words=32, max_tokens=32,48, greedy, ignore-EOS, concurrency 4,8, closed loop," in md
    doc = tmp_path / "PR.md"
    doc.write_text(md)
    assert main(["lint-claims", str(doc), "--spec", str(demo), "--evidence", str(out)]) == 0
    assert capsys.readouterr().out.strip() == f"{doc}: no findings"


def test_usage_errors_exit_2(tmp_path, capsys):
    assert main(["report", str(tmp_path / "nowhere")]) == 2
    assert "no such evidence directory" in capsys.readouterr().err
    assert main(["report", str(tmp_path)]) == 2
    with pytest.raises(SystemExit) as e:
        main(["report", str(tmp_path), "--format", "pdf"])
    assert e.value.code == 2


def test_a_server_metric_no_scrape_returned_is_unknown_not_unexposed():
    """The Markdown report's server-metrics lines: a family absent from /metrics that answered
    is "not exposed by the server"; when every scrape failed (HTTP 500, garbage) nobody knows."""
    from soakspec.judge.testing import small_spec
    from soakspec.report.serverview import md_lines

    spec = small_spec('require max(server("vllm:num_requests_waiting")) <= 4 per bucket')

    def lines(scrapes: int, failed: int) -> list[str]:
        sm = {"status": "failing" if failed else "ok", "scrapes": scrapes, "failed": failed, "first_error": "HTTP 500",
              "path": "/metrics", "families": {}}
        return md_lines({"backends": [{"name": "a", "buckets": [], "server_metrics": sm}]}, spec)

    assert "  - `vllm:num_requests_waiting`: unknown (no scrape of /metrics succeeded)" in lines(5, 5)
    assert "  - `vllm:num_requests_waiting`: not exposed by the server" in lines(5, 1)


def test_the_html_chart_of_an_absent_family_says_what_the_markdown_says():
    """The HTML report's empty chart for a family no scrape returned says what the Markdown
    line says (one wording, `serverview.absent_family`): not exposed when the server
    answered, unknown when it never did -- not the scrape failures alone as if they were why."""
    from soakspec.judge.testing import small_spec
    from soakspec.report.serverview import html_charts, md_lines

    spec = small_spec('require max(server("vllm:num_requests_waiting")) <= 4 per bucket')
    for scrapes, failed, said in ((5, 5, "unknown (no scrape of /metrics succeeded)"), (5, 1, "not exposed by the server")):
        sm = {"status": "failing", "scrapes": scrapes, "failed": failed, "first_error": "HTTP 500", "path": "/metrics",
              "families": {}}
        b = {"name": "a", "buckets": [{"workload": "w", "level": 0, "bucket": 0, "started": 0.0, "ended": 60.0}],
             "server_metrics": sm}
        (chart,) = [c for c in html_charts(b, None, spec) if "num_requests_waiting" in c]
        text = " ".join(re.findall(r'class="empty"[^>]*>([^<]*)<', chart))
        assert text.startswith(said) and f"{failed} of {scrapes} scrapes" in text, text
        assert f"  - `vllm:num_requests_waiting`: {said}" in md_lines({"backends": [b]}, spec)
