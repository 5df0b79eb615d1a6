"""The renderers on synthetic evidence (`soakspec.judge.testing`): failing runs, hostile
strings, GPU telemetry present or absent, time-scaled runs. Fast: nothing runs."""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from soakspec.cli import main
from soakspec.judge.testing import spec_from_text, EvidenceBuilder, small_spec
from soakspec.lang import load_spec
from soakspec.report import FORMATS, evidence_meta, prepare, render
from soakspec.report.html import CHART_METRICS
from soakspec.report.md import md_cell, md_code

REPO = Path(__file__).resolve().parents[1]
SEED = REPO / "specs" / "dsv2lite.soak"
HOSTILE = "<script>alert(1)</script>"


@pytest.fixture(scope="module")
def seed():
    return load_spec(SEED)[0]


def failed_one(spec) -> EvidenceBuilder:
    b = EvidenceBuilder(spec)
    b.set_outcome(list(b.measured("nccl", level=1, bucket=1))[0], "failed", "engine died")
    return b


def cells(line: str) -> list[str]:
    return [c.strip() for c in re.split(r"(?<!\\)\|", line.strip())[1:-1]]


def results_rows(md: str) -> list[list[str]]:
    lines = md.splitlines()
    i = next(i for i, x in enumerate(lines) if x.startswith("| Backend |"))
    out = []
    for x in lines[i:]:
        if not x.startswith("|"):
            break
        out.append(cells(x))
    return out


# ------------------------------------------------------------------------------ failing runs


def test_failed_request_md_names_the_rule_and_the_bucket(seed):
    inp = prepare(seed, failed_one(seed).build())
    assert inp.verdict.outcome == "FAIL"
    md = inp.render("md")
    rows = {r[0]: r for r in results_rows(md)[2:]}
    assert rows["nccl"][4] == "1 / 0" and rows["nccl"][3] == "31"
    assert rows["host-staged"][4] == "0 / 0"
    # each backend's own status, not the run's verdict: host-staged passed every rule
    assert rows["nccl"][8] == "failed: failed == 0"
    assert rows["host-staged"][8].startswith("passed (")
    assert "**Verdict: FAIL** (1 of 15 required rules failed; " in md
    assert ("FAIL  [performance] failed == 0 — backend nccl, concurrency 8 (batches of 8), bucket 1 [" in md
            and '1 failed request (engine died)' in md)
    # provenance lines of the seed's "Retained Evidence"
    assert "- commit: 0123456789abcdef0123456789abcdef01234567" in md
    assert "- model revision: 604d5664dddd88a0433dbae533b7fe9472482de0" in md
    assert "batch mode (batches of 8), duration_s=120 per level, bucket_s=60" in md
    assert "- required trace coverage: 100%" in md


def test_failed_request_junit_has_a_failure_on_that_rule(seed):
    inp = prepare(seed, failed_one(seed).build())
    root = ET.fromstring(inp.render("junit"))
    cases = root.findall("./testsuite/testcase")
    assert len(cases) == len(inp.verdict.rules)
    failed = [(c.get("classname"), c.get("name")) for c in cases if c.find("failure") is not None]
    assert failed == [("performance", "failed == 0")]
    f = next(c for c in cases if c.get("name") == "failed == 0").find("failure")
    assert "engine died" in f.get("message") and f.get("type") == "fail"
    out = next(c for c in cases if c.get("name") == "failed == 0").find("system-out").text
    assert "observed: failed = 1" in out and "scope: backend" in out
    assert root.get("failures") == "1" and root.find("testsuite").get("failures") == "1"


# The JUnit shape CI systems read (Jenkins's junit-10.xsd, as pytest's tests validate against;
# Ant's adds <error>): the elements each may hold, the attributes each may carry and must.
JUNIT_CHILDREN = {"testsuites": {"testsuite"}, "testsuite": {"properties", "testcase", "system-out", "system-err"},
                  "properties": {"property"}, "property": set(),
                  "testcase": {"skipped", "error", "failure", "system-out", "system-err"},
                  "failure": set(), "error": set(), "skipped": set(), "system-out": set(), "system-err": set()}
JUNIT_ATTRS = {"testsuites": ({"name", "time", "tests", "failures", "errors", "skipped"}, set()),
               "testsuite": ({"name", "tests", "failures", "errors", "time", "skipped", "timestamp", "hostname", "id",
                              "package", "file", "log", "url", "version", "group"}, {"name", "tests", "failures", "errors"}),
               "property": ({"name", "value"}, {"name", "value"}),
               "testcase": ({"name", "time", "classname", "group"}, {"name"}),
               "failure": ({"type", "message"}, set()), "error": ({"type", "message"}, set()),
               "skipped": ({"type", "message"}, set()), "properties": (set(), set()),
               "system-out": (set(), set()), "system-err": (set(), set())}
SUREFIRE_TIME = re.compile(r"(([0-9]{0,3},)*[0-9]{3}|[0-9]{0,3})*(\.[0-9]{0,3})?")  # junit-10.xsd's `time`


def junit_problems(el: ET.Element) -> list[str]:
    """What in this JUnit document the schema above refuses (nothing: it validates)."""
    allowed, required = JUNIT_ATTRS[el.tag]
    out = [f"<{el.tag}> carries {a}" for a in set(el.attrib) - allowed] + [f"<{el.tag}> lacks {a}" for a in required - set(el.attrib)]
    if "time" in el.attrib and not SUREFIRE_TIME.fullmatch(el.get("time")):
        out.append(f"<{el.tag}> time={el.get('time')!r} is not a time")
    for child in el:
        out += [f"<{child.tag}> in <{el.tag}>"] if child.tag not in JUNIT_CHILDREN[el.tag] else junit_problems(child)
    return out


def test_junit_times_the_suite_by_the_run_and_no_rule_by_nothing(seed):
    """Every <testcase> said time="0" and so did the suite: a CI dashboard showed a two-hour soak
    as run in no time and each rule as timed at 0. The suite's time is the run's wall time
    (the manifest's start to end); a rule's judgement has no time of its own (each reads the
    whole run), so its <testcase> carries none -- never a 0 that reads as measured."""
    b = failed_one(seed)
    root = ET.fromstring(prepare(seed, b.build()).render("junit"))
    assert junit_problems(root) == []
    wall = b.manifest["ended_at_epoch"] - b.manifest["started_at_epoch"]
    assert wall > 0 and root.get("time") == root.find("testsuite").get("time") == f"{wall:.3f}"
    assert [c.get("time") for c in root.iter("testcase")] == [None] * len(list(root.iter("testcase")))
    b.manifest.update(status="running", ended_at=None, ended_at_epoch=None)  # never finalized: no end, no time
    unfinished = ET.fromstring(prepare(seed, b.build()).render("junit"))
    assert junit_problems(unfinished) == [] and unfinished.get("time") is None and unfinished.find("testsuite").get("time") is None


def test_inconclusive_required_rules_are_errors_with_the_reason(seed):
    """A required rule that could not be decided is a JUnit <error> (the run is INCONCLUSIVE,
    exit 3): as <skipped> it was, a CI dashboard that reads only the XML showed the run green."""
    inp = prepare(seed, EvidenceBuilder(seed, time_scale=0.1, rehearsal=True).build())
    assert inp.verdict.outcome == "INCONCLUSIVE"
    root = ET.fromstring(inp.render("junit"))
    errors = {c.get("name"): c.find("error") for c in root.iter("testcase") if c.find("error") is not None}
    assert "full_scale_run" in errors and "rehearsal" in errors["full_scale_run"].get("message")
    assert errors["full_scale_run"].get("type") == "inconclusive" and "rehearsal" in errors["full_scale_run"].text
    undecided = [r for r in inp.verdict.rules if r.status == "inconclusive" and r.severity != "warn"]
    assert root.get("errors") == root.find("testsuite").get("errors") == str(len(undecided)) == str(len(errors)) != "0"
    assert not root.findall(".//failure") and root.get("failures") == "0"
    skipped = [c for c in root.iter("testcase") if c.find("skipped") is not None]
    assert root.get("skipped") == str(len(skipped))
    assert all((r := next(r for r in inp.verdict.rules if r.rule == c.get("name"))).severity == "warn"
               or r.status == "not_evaluated" for c in skipped)
    md = inp.render("md")
    assert "- rehearsal: yes: every backend was replaced by the simulator" in md
    assert "- time scale: 0.1 (every duration was multiplied by 0.1); such a run cannot pass a full-scale gate" in md
    assert {r[8].split(":")[0] for r in results_rows(md)[2:]} == {"inconclusive"}
    assert all("full_scale_run" in r[8] for r in results_rows(md)[2:])


def test_not_evaluated_rules_are_skipped(seed):
    b = EvidenceBuilder(seed)
    b.entry("nccl")["source"]["commit_after"] = "f" * 40  # commit changed mid-run: provenance fails
    inp = prepare(seed, b.build())
    root = ET.fromstring(inp.render("junit"))
    status = {r.rule: r.status for r in inp.verdict.rules}
    for c in root.iter("testcase"):
        s = status[c.get("name")]
        assert (c.find("failure") is not None) == (s == "fail")
        assert (c.find("skipped") is not None) == (s in ("inconclusive", "not_evaluated"))
    assert "not_evaluated" in status.values()
    assert "changed during the run" in inp.render("md")


def test_cli_report_exits_0_when_rendered_and_gate_keeps_the_verdicts_code(seed, tmp_path, capsys):
    """`report` publishes a FAIL report under `set -e`; the verdict's code is `gate`'s."""
    ok = EvidenceBuilder(seed).write(tmp_path / "ok")
    bad = failed_one(seed).write(tmp_path / "bad")
    scaled = EvidenceBuilder(seed, time_scale=0.1).write(tmp_path / "scaled")
    for fmt in FORMATS:
        for d, word in ((ok, "PASS"), (bad, "FAIL"), (scaled, "INCONCLUSIVE")):
            assert main(["report", str(d), "--format", fmt]) == 0
            assert word in capsys.readouterr().out
    assert main(["gate", str(ok)]) == 0
    assert main(["gate", str(bad)]) == 1
    assert main(["gate", str(scaled)]) == 3
    assert main(["report", str(tmp_path / "nowhere")]) == 2
    capsys.readouterr()


def test_report_json_carries_the_verdict_gate_prints_notes_included(seed, tmp_path, capsys):
    """What `gate` says of retained evidence -- unsigned, a stored verdict.json that says
    otherwise -- the report says too (its json verdict is gate's, notes and all)."""
    import json

    root = EvidenceBuilder(seed).write(tmp_path / "run")
    doc = json.loads((root / "verdict.json").read_text())
    doc["outcome"] = "FAIL"
    (root / "verdict.json").write_text(json.dumps(doc))
    assert main(["gate", str(root), "--format", "json"]) == 0
    gate = json.loads(capsys.readouterr().out)
    assert main(["report", str(root), "--format", "json"]) == 0
    report = json.loads(capsys.readouterr().out)["verdict"]
    assert report["notes"] == gate["notes"]
    assert any("not signed" in n for n in gate["notes"]) and any("verdict.json says FAIL" in n for n in gate["notes"])
    assert main(["report", str(root), "--format", "md"]) == 0
    assert "verdict.json says FAIL" in capsys.readouterr().out


# ------------------------------------------------------------------------------ hostile input


@pytest.fixture(scope="module")
def hostile():
    """A backend named `<script>alert(1)</script>`, a failed request whose error carries markup,
    control characters and a lone surrogate, and a runtime boundary with pipes and backticks."""
    text = small_spec(backends=(HOSTILE, "b")).canonical_text
    at = text.rindex('"host-staged"')  # backend b's runtime label (the judge shows the spec's label)
    spec = spec_from_text(text[:at] + '"a | b `c` <i>d</i>"' + text[at + len('"host-staged"'):])
    b = EvidenceBuilder(spec)
    r = list(b.measured(HOSTILE))[0]
    b.set_outcome(r, "failed", "</pre></code>```\n<img src=x onerror=alert(2)> \x00\x1b[31m \udc80 & ]]> --> http://evil.example/x")
    return prepare(spec, b.build())


def test_hostile_backend_name_is_escaped_in_html(hostile):
    page = hostile.render("html")
    assert HOSTILE not in page and "<script" not in page.lower()
    assert "<img" not in page and "onerror=alert(2)>" not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "\x00" not in page and "\x1b" not in page and "\\x00" in page
    charts = re.findall(r'<svg class="chart" data-backend="([^"]*)" data-metric="([^"]*)"', page)
    names = ("&lt;script&gt;alert(1)&lt;/script&gt;", "b")
    # and the server's side: the builder's /metrics queue and cache gauges, the server's CPU
    server = ("server:vllm:num_requests_running", "server:vllm:num_requests_waiting", "server:vllm:kv_cache_usage_perc", "cpu")
    assert sorted(charts) == sorted((n, m) for n in names for m in CHART_METRICS + server)
    page.encode("utf-8")  # no lone surrogate left


def test_hostile_strings_keep_the_md_table_and_code_block_intact(hostile):
    md = hostile.render("md")
    rows = results_rows(md)
    assert {len(r) for r in rows} == {10} and len(rows) == 4
    assert rows[2][0] == md_code(HOSTILE) == "`<script>alert(1)</script>`"
    assert rows[3][1] == "`` a \\| b `c` <i>d</i> ``"
    # the rules block: its fence is longer than any backtick run inside, so nothing escapes it
    block = re.search(r"^(`{3,})text\n(.*?)^\1$", md, re.S | re.M)
    assert block and len(block.group(1)) > 3 and "engine" not in block.group(2)
    assert "<img src=x" in block.group(2)  # inside the code block: shown, never rendered
    outside = md.replace(block.group(0), "")
    assert "<img" not in outside and "<script>" not in outside.replace("`<script>alert(1)</script>`", "")

    from markdown_it import MarkdownIt

    html = MarkdownIt("commonmark").enable("table").render(md)
    assert "<script>" not in html and "<img" not in html and "<i>" not in html


def test_hostile_strings_junit_parses(hostile):
    xml = hostile.render("junit")
    root = ET.fromstring(xml)
    f = next(c for c in root.iter("testcase") if c.get("name") == "failed == 0").find("failure")
    assert "onerror=alert(2)" in f.text and "\\x00" in f.text and "\\x1b" in f.text
    xml.encode("utf-8")


def test_hostile_strings_json_is_valid(hostile):
    text = hostile.render("json")
    doc = json.loads(text)
    assert doc["schema_version"] == 1 and doc["verdict"]["verdict"] == "FAIL"


# ------------------------------------------------------------------------------ details


def test_gpu_memory_chart_with_and_without_gpu_telemetry(seed):
    b = EvidenceBuilder(seed)
    page = prepare(seed, b.build()).render("html")
    svg = re.search(r'<svg class="chart" data-backend="nccl" data-metric="gpu_memory".*?</svg>', page, re.S).group(0)
    assert "<polyline" in svg and "GiB" in svg and "no GPU telemetry" not in svg
    for rows in b.telemetry.values():
        for row in rows:
            row["gpus"] = None
    page = prepare(seed, b.build()).render("html")
    svg = re.search(r'<svg class="chart" data-backend="nccl" data-metric="gpu_memory".*?</svg>', page, re.S).group(0)
    assert "<polyline" not in svg and "no GPU telemetry (NVML not available)" in " ".join(
        re.findall(r">([^<]+)</text>", svg))


def test_hardware_line_names_the_gpus(seed):
    b = EvidenceBuilder(seed)
    dev = {"name": "NVIDIA GeForce RTX 5090", "index": 0}
    b.manifest["gpus"] = {"available": True, "cuda_version": "12.8", "driver_version": "570.86", "devices": [dev, dict(dev, index=1)]}
    md = prepare(seed, b.build()).render("md")
    assert "- hardware: 2x NVIDIA GeForce RTX 5090, CUDA 12.8, driver 570.86" in md
    b.manifest["gpus"] = {"available": False, "reason": "libnvidia-ml.so.1 not found"}
    # the raw reason (an exception's text) stays in the manifest, never in a PR report
    for fmt in ("md", "html"):
        text = prepare(seed, b.build()).render(fmt)
        assert "no GPU telemetry (NVML not available)" in text and "libnvidia-ml" not in text


def test_a_backend_missing_from_the_evidence_is_a_not_run_row(seed):
    b = EvidenceBuilder(seed)
    b.manifest["backends"] = [e for e in b.manifest["backends"] if e["name"] != "nccl"]
    md = prepare(seed, b.build()).render("md")
    rows = {r[0]: r for r in results_rows(md)[2:]}
    assert rows["nccl"][8] == "not run" and rows["nccl"][3] == "-"


def test_rendering_is_pure_and_deterministic(seed):
    ev = failed_one(seed).build()
    a, b = prepare(seed, ev), prepare(seed, ev)
    for fmt in FORMATS:
        assert a.render(fmt) == b.render(fmt) == render(a.verdict, a.results, a.meta, seed, fmt)
    assert set(a.meta) >= set(evidence_meta(ev))  # prepare adds each backend's own status, nothing else changes
    with pytest.raises(ValueError, match="unknown report format"):
        render(a.verdict, a.results, a.meta, seed, "pdf")


def test_md_cells_are_plain_when_harmless_and_code_otherwise():
    assert md_cell("host-staged") == "host-staged"
    assert md_cell("NCCL 2.26.2, NCCL_IB_DISABLE=1") == "`NCCL 2.26.2, NCCL_IB_DISABLE=1`"
    assert md_cell("") == "-"
    assert md_code("a`b") == "`` a`b ``" and md_code("x|y") == "`x\\|y`"


def test_report_never_starts_a_process(seed, tmp_path, monkeypatch, capsys):
    """A spec is code; `soakspec report` only reads it (the dsv2lite spec launches binaries)."""
    import os
    import subprocess

    def refuse(*args, **kwargs):
        raise AssertionError(f"a process was started: {args!r}")

    for mod, name in ((subprocess, "Popen"), (os, "system"), (os, "popen"), (os, "fork"), (os, "posix_spawn"),
                      (os, "posix_spawnp"), (os, "execv"), (os, "execve"), (os, "execvp"), (os, "execvpe")):
        monkeypatch.setattr(mod, name, refuse)
    root = EvidenceBuilder(seed).write(tmp_path / "run")
    for fmt in FORMATS:
        assert main(["report", str(root), "--format", fmt, "--spec", str(SEED)]) == 0
    capsys.readouterr()


def test_the_workload_line_names_token_exact_prompts():
    """A workload of token-exact prompts (`prompt_tokens`, a shared prefix) printed a workload
    line with no prompt at all ("- workload: max_tokens=64, ..."): the report's reader could not
    tell what the server was sent. It names the lengths and the prefix, as the spec says them."""
    text = small_spec().canonical_text.replace("  duration = 2m", "  prompt_tokens = [128, 512]\n  prefix_tokens = 32\n  duration = 2m")
    spec = spec_from_text(text)
    md = prepare(spec, EvidenceBuilder(spec).build()).render("md")
    assert "- workload: prompt_tokens=128,512, prefix_tokens=32, max_tokens=64, " in md, md[md.index("- workload"):][:200]


def test_the_workload_line_names_the_cap_the_count_and_the_burstiness():
    """`vllm bench serve --request-rate 20 --burstiness 0.5 --max-concurrency 8 --num-prompts 200`
    as a spec printed "open loop, rates 20 rps (poisson arrivals, seed 1), duration_s=30 per
    level": no cap (which puts the queue's wait in every TTFT), no count (the level ran 200
    requests, not 30 s of them), no burstiness. The line states each as the spec says it."""
    from soakspec.report.common import workload_line

    text = ('soak "s" {}\nbackend "b" {\n  sim {}\n}\nworkload "w" {\n  prompt_words = 8\n  max_tokens = 8\n'
            '  load {\n    mode = open\n    rate = [20rps]\n    burstiness = 0.5\n    seed = 1\n    max_concurrency = 8\n'
            '    requests_per_level = 200\n  }\n  duration = 30s\n  bucket = 5s\n  deadline = 10s\n}\n')
    line = workload_line(spec_from_text(text).workloads[0])
    assert "open loop, rates 20 rps (poisson arrivals, burstiness 0.5, seed 1), max_concurrency=8, requests_per_level=200" in line, line
    assert "duration_s=30 per level (at most: the count ends it)" in line, line
    closed = workload_line(spec_from_text(text.replace("rate = [20rps]\n    burstiness = 0.5\n    seed = 1\n    max_concurrency = 8\n",
                                                       "concurrency = [8]\n").replace("mode = open", "mode = closed")).workloads[0])
    assert "concurrency 8, closed loop, requests_per_level=200" in closed, closed
