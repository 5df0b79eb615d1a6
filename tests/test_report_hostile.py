"""Reports of evidence whose text is hostile: every format stays valid and shows the text as
it is, whatever the server, the spec or the evidence directory's path carries (backticks,
markup, pipes, control characters). Fast: synthetic evidence (`soakspec.judge.testing`),
except where a test says it runs a server."""

from __future__ import annotations

import re

import pytest
from markdown_it import MarkdownIt

from soakspec.judge.testing import EvidenceBuilder, small_spec, spec_from_text
from soakspec.report import prepare

TICK_NAME = "x`<img src=x onerror=alert(1)>`y"


def _md_html(md: str) -> str:
    return MarkdownIt("commonmark").enable("table").render(md)


def _code_spans(md: str) -> list[str]:
    """The text of every inline code span markdown-it finds in `md`."""
    out = []
    for tok in MarkdownIt("commonmark").enable("table").parse(md):
        for child in tok.children or ():
            if child.type == "code_inline":
                out.append(child.content)
    return out


def test_a_backend_name_with_backticks_stays_code_in_the_server_metrics_section():
    spec = spec_from_text(small_spec(backends=(TICK_NAME, "b")).canonical_text)
    md = prepare(spec, EvidenceBuilder(spec).build()).render("md")
    section = md[md.index("### Server metrics and CPU"):md.index("### Rules that did not pass")]
    assert "server CPU" in section and "scrapes of /metrics" in section
    html = _md_html(section)
    assert "<img" not in html, html
    assert sum(1 for s in _code_spans(section) if s == TICK_NAME) == 2, section


def test_a_pipe_outside_a_table_is_shown_as_it_is():
    """`\\|` keeps a code span in a table cell; in a list item it would show the backslash."""
    text = small_spec(backends=("a|b", "c")).canonical_text.replace('workload "w"', 'workload "w|1"')
    text = text.replace("}\n\ngate {", "}\n\n" + text[text.index('workload "w|1"'):text.index("\ngate {")].replace("w|1", "w2") + "\ngate {")
    spec = spec_from_text(text)
    md = prepare(spec, EvidenceBuilder(spec).build()).render("md")
    items = [line for line in md.splitlines() if line.startswith(("- ", "  - "))]
    spans = _code_spans("\n".join(items))
    assert "w|1" in spans and "a|b" in spans, items
    assert not any("\\|" in s for s in spans), spans
    assert "<td><code>a|b</code></td>" in _md_html(md)  # in a table: escaped, and shown without the backslash


# ------------------------------------------------------------------------------ compare

EVIL_DIR = "x`<img src=x onerror=alert(1)>`|y"


def _compare(tmp_path, capsys, fmt: str) -> str:
    from soakspec.cli import main

    spec = small_spec()
    base = EvidenceBuilder(spec, run_id="base").write(tmp_path / EVIL_DIR / "base")
    new = EvidenceBuilder(spec, run_id="new").write(tmp_path / "new")
    capsys.readouterr()
    main(["compare", str(base), str(new), "--format", fmt, "--resamples", "100"])
    return capsys.readouterr().out


def test_compare_md_shows_a_directory_with_backticks_as_code(tmp_path, capsys):
    """A CI checkout path carries the branch name, which the pull request's author chose."""
    md = _compare(tmp_path, capsys, "md")
    base_line = next(line for line in md.splitlines() if line.startswith("- base:"))
    assert "<img" not in _md_html(base_line), base_line
    assert str(tmp_path / EVIL_DIR / "base") in _code_spans(base_line)


def test_compare_html_forbids_every_fetch_and_carries_no_control_character(tmp_path, capsys):
    """As the report's page: a Content-Security-Policy of default-src 'none', and characters
    HTML cannot carry (a terminal escape in a directory name) shown as \\xNN."""
    from soakspec.cli import main

    spec = small_spec()
    base = EvidenceBuilder(spec, run_id="base").write(tmp_path / "b\x1b[31m")
    new = EvidenceBuilder(spec, run_id="new").write(tmp_path / "new")
    capsys.readouterr()
    main(["compare", str(base), str(new), "--format", "html", "--resamples", "100"])
    page = capsys.readouterr().out
    assert "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; style-src 'unsafe-inline'\">" in page
    assert "\x1b" not in page and "b\\x1b[31m" in page
    assert re.search(r"<(script|link|img|iframe|object)\b", page) is None


# ------------------------------------------------------------------------------ every format, any text

from hypothesis import HealthCheck, given, settings, strategies as st  # noqa: E402

HOSTILE_PARTS = st.sampled_from(["</script>", "<img src=x onerror=alert(1)>", '"', "'", "|", "`", "```", "\n# h\n", "[l](http://e.x)",
                                 "\x00", "\x01", "\x1f", "\x7f", "\ud800", "\udfff", "\ufffe", "\uffff", "]]>", "-->", "&amp;", "é名前",
                                 "\u2028", "\r", "\t", "L" * 700])
HOSTILE_TEXT = st.lists(st.one_of(HOSTILE_PARTS, st.text(max_size=8)), min_size=1, max_size=6).map("".join)


def _strict_json(text: str) -> dict:
    import json

    def refuse(constant: str) -> None:
        raise ValueError(f"{constant} is not JSON")

    return json.loads(text, parse_constant=refuse)


def _printable(text: str) -> str:
    from soakspec.commands.report import _printable as p

    return p(text)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(error=HOSTILE_TEXT, log=HOSTILE_TEXT, reason=HOSTILE_TEXT)
def test_every_format_stays_valid_whatever_the_server_said(error, log, reason):
    """A failed request's error, the crash diagnosis (server log lines), the abort reason and a
    failed pre-flight's error, each any text: JSON parses strictly (no NaN), JUnit parses, the
    HTML page carries no markup of the evidence's, the Markdown renders no HTML."""
    import xml.etree.ElementTree as ET

    spec = spec_from_text(small_spec(backends=("a", "b")).canonical_text)
    b = EvidenceBuilder(spec)
    b.set_outcome(list(b.measured("a"))[0], "failed", error)
    e = b.entry("a")
    e.update(crash_diagnosis=[log, "ok " + log], aborted_reason=reason, aborted_at=b.manifest["started_at_epoch"] + 3,
             preflight=[{"workload": "w", "passed": False, "record": {"error": error}}])
    b.manifest.update(status="aborted", incomplete_reason=reason, aborted_at=b.manifest["started_at_epoch"] + 3)
    inp = prepare(spec, b.build())
    out = {fmt: _printable(inp.render(fmt)) for fmt in ("md", "html", "json", "junit")}
    for text in out.values():
        text.encode("utf-8")  # no lone surrogate left
    doc = _strict_json(out["json"])
    assert doc["schema_version"] == 1 and doc["run"]["status"] == "aborted"
    ET.fromstring(out["junit"].encode("utf-8"))
    page = out["html"]
    assert re.search(r"<(script|img|link|iframe)\b", page) is None
    assert not re.search("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]", page)
    html = _md_html(out["md"])
    assert re.search(r"<(script|img|a)\b", html) is None, html
    assert not any(line.startswith("#") and not line.startswith(("## Retained", "### ")) for line in out["md"].splitlines())


# ------------------------------------------------------------------------------ a real run of a hostile server

HOSTILE_SERVER = r'''
import itertools, json, socket, sys, threading, time
EVIL = "</script><img src=x onerror=alert(1)> \"q\" 'a' | `b` # h [l](http://evil.example) \x01\x1f \ufffe ]]> \u00e9\u540d " + "L" * 2000
port = int(sys.argv[1]); die_after = float(sys.argv[2]); count = itertools.count()
def send(conn, status, ctype, body):
    conn.sendall(f"HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode() + body)
def handle(conn):
    try:
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = conn.recv(65536)
            if not chunk:
                return
            data += chunk
        head, _, rest = data.partition(b"\r\n\r\n")
        n = next((int(h.split(b":")[1]) for h in head.split(b"\r\n") if h.lower().startswith(b"content-length:")), 0)
        while len(rest) < n:
            rest += conn.recv(65536)
        line = head.split(b"\r\n")[0].decode()
        if line.startswith("GET /metrics"):
            label = EVIL[:60].replace("\\", "\\\\").replace('"', '\\"')
            return send(conn, "200 OK", "text/plain", ("# HELP vllm:num_requests_running " + EVIL[:80] + "\n# TYPE vllm:num_requests_running gauge\n"
                        f'vllm:num_requests_running{{model="{label}"}} NaN\nvllm:num_requests_waiting +Inf\n').encode())
        if line.startswith("GET"):
            return send(conn, "200 OK", "application/json", b'{"object":"list","data":[]}')
        k = next(count)
        print("log " + EVIL[:200] + "\x1b[31m", flush=True)
        if k % 3 == 0:
            return send(conn, "500 Internal", "application/json", json.dumps({"error": {"message": EVIL + "\ud800"}}).encode())
        if k % 3 == 1:
            ev = {"id": EVIL[:40], "object": "text_completion", "choices": [{"index": 0, "text": "a", "finish_reason": None}]}
            body = b"data: " + json.dumps(ev).encode() + b"\n\ndata: " + json.dumps({"error": {"message": EVIL}}).encode() + b"\n\ndata: [DONE]\n\n"
            return send(conn, "200 OK", "text/event-stream", body)
        ev = {"id": "x", "object": "text_completion", "choices": [{"index": 0, "text": "a b", "finish_reason": EVIL[:60] + "\udc80"}],
              "usage": {"prompt_tokens": 8, "completion_tokens": 2, "total_tokens": 10}}
        send(conn, "200 OK", "text/event-stream", b"data: " + json.dumps(ev).encode() + b"\n\ndata: [DONE]\n\n")
    except OSError:
        pass
    finally:
        conn.close()
srv = socket.socket(); srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); srv.bind(("127.0.0.1", port)); srv.listen(64)
srv.settimeout(0.2); t0 = time.monotonic()
print("ready " + EVIL[:100], flush=True)
while time.monotonic() - t0 < die_after:
    try:
        conn, _ = srv.accept()
    except socket.timeout:
        continue
    threading.Thread(target=handle, args=(conn,), daemon=True).start()
print("FATAL: CUDA error: " + EVIL[:300], flush=True)
sys.exit(1)
'''


@pytest.mark.slow
def test_a_real_run_of_a_server_whose_every_text_is_hostile_renders_every_format(tmp_path, capsys):
    """Runs a server (loopback) whose error bodies, error events, finish reasons, /metrics and
    log lines carry markup, pipes, backticks, controls, lone surrogates and 2,000-character
    messages, and which dies during the run (aborted: a crash diagnosis of its log lines); then
    `report` in every format and `compare` of it with itself in every format."""
    import sys
    import xml.etree.ElementTree as ET

    from runner_support import run_spec
    from soakspec.cli import main
    from test_faults import NO_ABORT, launch_spec

    server = tmp_path / "hostile.py"
    server.write_text(HOSTILE_SERVER)
    spec = launch_spec([sys.executable, str(server), "{port}", "1.5"], duration="3s", gate=NO_ABORT + "\n  require p99(ttft) < 1s")
    proc, out = run_spec(tmp_path, spec, "--no-preflight", timeout=90)
    assert proc.returncode in (1, 3, 4), proc.stderr[-2000:]
    texts = {}
    for fmt in ("md", "html", "json", "junit"):
        assert main(["report", str(out), "--format", fmt]) == 0
        texts[fmt] = capsys.readouterr().out
    doc = _strict_json(texts["json"])
    assert doc["run"]["status"] == "aborted" and doc["verdict"]["verdict"] == "FAIL"
    assert any("crash diagnosis" in line["label"] for line in doc["run"]["lines"])
    ET.fromstring(texts["junit"].encode("utf-8"))
    assert re.search(r"<(script|img|link|iframe)\b", texts["html"]) is None and "onerror=alert(1)" in texts["html"]
    assert re.search(r"<(script|img|a)\b", _md_html(texts["md"])) is None and "onerror=alert(1)" in texts["md"]
    for fmt in ("md", "html", "json"):
        main(["compare", str(out), str(out), "--format", fmt, "--resamples", "100"])
        text = capsys.readouterr().out
        if fmt == "json":
            assert _strict_json(text)["schema_version"] == 1
        elif fmt == "html":
            assert re.search(r"<(script|img|link|iframe)\b", text) is None
        else:
            assert re.search(r"<(script|img|a)\b", _md_html(text)) is None


def test_a_scrape_error_quoting_the_servers_line_is_shown_as_written():
    """prometheus_client's parse error quotes the server's line; GitHub would strike `~~...~~`
    through and emphasise `_..._` at word edges (underscores inside a word, prompt_words, stay)."""
    spec = spec_from_text(small_spec().canonical_text)
    b = EvidenceBuilder(spec)
    err = "not Prometheus text format: ValueError: Invalid line: ~~GPU ok~~ _see runbook_ __now__ ~x~ vllm:num_requests_running"
    b.entry("a")["metrics"].update(failed=1, first_error=err)
    b.metrics["a"][0].update(ok=False, error=err, families={})
    md = prepare(spec, b.build()).render("md")
    line = next(x for x in md.splitlines() if "scrapes of /metrics failed" in x)
    html = MarkdownIt("commonmark").enable(["table", "strikethrough"]).render(line)
    assert "<s>" not in html and "<em>" not in html and "<strong>" not in html, html
    assert "~~GPU ok~~ _see runbook_ __now__ ~x~ vllm:num_requests_running" in html, html
    assert "prompt_words" in md  # the workload line: an underscore inside a word is not escaped


# ------------------------------------------------------------------------------ the JSON shapes README names


def _readme_keys(anchor: str) -> set[str]:
    from pathlib import Path

    text = " ".join((Path(__file__).resolve().parents[1] / "README.md").read_text().split())
    body = text[text.index(anchor) + len(anchor):].split("}", 1)[0]
    return {k.split(":")[0].strip() for k in body.split(",")}


def test_the_report_and_compare_json_documents_have_the_keys_readme_names(tmp_path, capsys):
    spec = spec_from_text(small_spec().canonical_text)
    doc = _strict_json(prepare(spec, EvidenceBuilder(spec).build()).render("json"))
    assert set(doc) == _readme_keys("strict JSON document (finite numbers only, no NaN), `{") and doc["schema_version"] == 1
    doc = _strict_json(_compare(tmp_path, capsys, "json"))
    assert set(doc) == _readme_keys("`--format json` is one document, `{") and doc["schema_version"] == 1


def test_a_claim_or_exclusion_that_starts_like_markdown_stays_one_list_item():
    """`- # Fastest` would be a heading inside the list, `- ---` a rule that ends it, `- 1) x`
    and `- + x` lists of their own: each claim and exclusion is one item, shown as written."""
    written = ["# Fastest server ever", "1) first", "- multi-node", "---", "+ x", "12. twelve"]
    text = small_spec().canonical_text + "\nclaims {\n" + "".join(
        f'  {"claim" if i < 2 else "exclude"} "{w}"\n' for i, w in enumerate(written)) + "}\n"
    spec = spec_from_text(text)
    md = prepare(spec, EvidenceBuilder(spec).build()).render("md")
    html = _md_html(md[md.index("### Claim Boundary"):])
    assert re.search(r"<(h1|hr|ol)\b", html) is None and html.count("<ul>") == 2, html
    items = re.findall(r"<li>(.*?)</li>", html)
    assert items == ["# Fastest server ever", "1) first", "- multi-node", "---", "+ x", "12. twelve"], items


def test_compare_json_stays_strict_json_when_a_base_statistic_is_all_but_zero():
    """A base TTFT of 1e-320 s (a subnormal: as good as 0, whose relative change is undefined)
    made new / base - 1 overflow: compare --format json wrote `Infinity`, which no strict
    parser takes, and the Markdown '+inf%'."""
    from soakspec.compare import compare
    from soakspec.compare.render import render

    spec = small_spec(duration="4m", bucket="1m")

    def run(ttft: float, run_id: str):
        b = EvidenceBuilder(spec, per_bucket=30, run_id=run_id)
        for r in b.measured("a"):
            r.update(ttft=ttft, first_token=r["start"] + ttft)
        return b.build()

    c = compare(run(1e-320, "base"), run(0.5, "new"), resamples=200)
    doc = _strict_json(render(c, "json"))
    ttft = [r for r in doc["rows"] if r["metric"] == "ttft"]
    assert ttft and all(r["change"] is None and r["ci_low"] is None and r["verdict"] == "insufficient samples" for r in ttft), ttft
    assert "inf" not in render(c, "md")


def test_report_json_of_a_drift_from_an_all_but_zero_baseline_is_written():
    """A first bucket whose TTFT is 1e-320 s (as good as 0) made drift(p50(ttft)) +inf%: report
    --format json then stopped with an internal error (no Infinity in JSON), the other formats
    printed '+inf%'. A relative change that is not a number is none, as for a zero baseline."""
    spec = small_spec("require failed == 0\n  warn drift(p50(ttft)) <= 25% per level", duration="4m", bucket="1m")
    b = EvidenceBuilder(spec, per_bucket=30)
    for r in b.measured("a"):
        t = 1e-320 if r["start"] < b.manifest["started_at_epoch"] + 90 else 0.5
        r.update(ttft=t, first_token=r["start"] + t)
    inp = prepare(spec, b.build())
    doc = _strict_json(inp.render("json"))
    drift = next(r for r in doc["verdict"]["rules"] if r["rule"].startswith("drift"))
    assert drift["observed"] is None and drift["status"] != "pass", drift
    assert "inf%" not in inp.render("md")


def test_a_bidi_override_in_a_servers_error_cannot_reorder_the_report():
    """U+202E (right-to-left override) and its kin reorder how the rest of a line is shown
    (CVE-2021-42574, 'Trojan Source'): an error ending in '\\u202eSSAP' reads as 'PASS'. The
    human-readable formats show them as \\uNNNN, as other characters they cannot carry."""
    import xml.etree.ElementTree as ET

    spec = spec_from_text(small_spec().canonical_text)
    b = EvidenceBuilder(spec)
    b.set_outcome(list(b.measured("a"))[0], "failed", "engine died \u202eSSAP\u202c \u2066x\u2069 \u202a\u202b\u202d\u2067\u2068")
    inp = prepare(spec, b.build())
    junit = inp.render("junit")
    ET.fromstring(junit)
    for fmt, text in (("md", inp.render("md")), ("html", inp.render("html")), ("junit", junit)):
        assert not re.search("[\u202a-\u202e\u2066-\u2069]", text), fmt
        assert "\\u202eSSAP\\u202c" in text, fmt


def test_a_metrics_gauge_near_the_largest_float_is_not_a_measurement():
    """A server's /metrics may answer any finite number (`vllm:num_requests_running 1.7e308`):
    the per-bucket mean summed past the largest float, and `run`, `gate` and `report` (every
    format) stopped with an internal error (OverflowError). Such a value is read as one that is
    not a number (as NaN is: no value, a rule on it INCONCLUSIVE); one within 1e300 is charted."""
    import xml.etree.ElementTree as ET

    from soakspec.judge.testing import metrics_rows

    spec = spec_from_text(small_spec().canonical_text)
    b = EvidenceBuilder(spec)
    rows = b.metrics["a"]
    b.metrics["a"] = metrics_rows(rows[0]["t"], rows[-1]["t"], running=1.7e308, waiting=1e300)
    inp = prepare(spec, b.build())
    doc = _strict_json(inp.render("json"))
    fams = doc["results"]["backends"][0]["server_metrics"]["families"]
    per = fams["vllm:num_requests_running"]["per_bucket"]  # no value: only how many scrapes gave none
    assert per and all(set(e) == {"nan_scrapes"} and e["nan_scrapes"] > 0 for e in per.values())
    assert {e["max"] for e in fams["vllm:num_requests_waiting"]["per_bucket"].values()} == {1e300}
    ET.fromstring(inp.render("junit"))
    assert "vllm:num_requests_running" in inp.render("md")
    page = inp.render("html")
    svg = re.search(r'<svg class="chart" data-backend="a" data-metric="server:vllm:num_requests_waiting".*?</svg>', page, re.S).group(0)
    assert "<circle" in svg


def test_a_soak_name_ending_in_a_hash_keeps_it_in_the_heading():
    """`## Retained evidence: load #` -- a closing sequence to Markdown, which drops it."""
    text = small_spec().canonical_text.replace('soak "small"', 'soak "load test #"')
    spec = spec_from_text(text)
    md = prepare(spec, EvidenceBuilder(spec).build()).render("md")
    assert "<h2>Retained evidence: load test #</h2>" in _md_html(md.splitlines()[0])


def _surrogate_evidence(tmp_path):
    """An aborted run's evidence whose manifest holds the JSON escape \\ud800 (a lone surrogate,
    as a server's text can carry) in its abort reasons."""
    spec = spec_from_text(small_spec().canonical_text)
    b = EvidenceBuilder(spec)
    b.entry("a").update(aborted_reason="MARK died")
    b.manifest.update(status="aborted", incomplete_reason="MARK why")
    d = b.write(tmp_path / "ev")
    m = d / "manifest.json"
    m.write_text(m.read_text().replace("MARK", "\\ud800"))
    return d


def test_gate_json_of_a_manifest_carrying_a_lone_surrogate_is_printed(tmp_path, capsys):
    """A manifest whose abort reason holds the JSON escape \\ud800 (a lone surrogate: no UTF-8
    stream takes it) stopped gate --format json with an internal error (UnicodeEncodeError,
    exit 4), where gate's text and every report format print it as \\ud800."""
    import subprocess
    import sys

    d = _surrogate_evidence(tmp_path)
    p = subprocess.run([sys.executable, "-m", "soakspec", "gate", str(d), "--format", "json"], capture_output=True, timeout=120)
    assert p.returncode in (1, 3), p.stderr.decode()[-500:]
    doc = _strict_json(p.stdout.decode("utf-8"))
    assert "\ud800" in json_text(doc)  # the escape, read back as what the manifest holds


def json_text(doc) -> str:
    import json

    return json.dumps(doc, ensure_ascii=False)


def test_verify_of_a_manifest_carrying_a_lone_surrogate_says_what_it_found(tmp_path):
    """The same manifest (an escaped lone surrogate): verify's text stopped with an internal
    error (exit 4) instead of naming the changed file (exit 1)."""
    import subprocess
    import sys

    d = _surrogate_evidence(tmp_path)
    p = subprocess.run([sys.executable, "-m", "soakspec", "verify", str(d)], capture_output=True, timeout=120)
    assert p.returncode == 1 and "internal error" not in p.stderr.decode(), p.stderr.decode()[-500:]
    assert "\\ud800" in p.stdout.decode("utf-8")


def test_a_threshold_near_the_largest_float_still_draws_the_page():
    """`require mean(throughput) < 1.7e308` checks (no unit bounds a rate), and the chart's
    axis grew past the largest float to show the line: report --format html stopped with an
    internal error (OverflowError: cannot convert float infinity to integer)."""
    from soakspec.report.charts import Series, Threshold, line_chart

    spec = spec_from_text(small_spec("require failed == 0\n  require mean(throughput) < 1.7e308").canonical_text)
    page = prepare(spec, EvidenceBuilder(spec).build()).render("html")
    svg = re.search(r'<svg class="chart" data-backend="a" data-metric="throughput".*?</svg>', page, re.S).group(0)
    assert 'class="threshold"' in svg and "<circle" in svg
    for top in (1.5e308, 1.79e308):  # the axis rounded up past the largest float: its tick labels overflowed
        svg = line_chart("a", "m", "t", "u", [Series("s", ((1.0, top),), "#000")], [], 2.0, str, thresholds=[Threshold(top, "x")])
        assert "<circle" in svg and "inf" not in svg


def test_combine_of_a_manifest_carrying_a_lone_surrogate_writes_and_prints_it(tmp_path):
    """The same escaped lone surrogate stopped `combine` with an internal error twice: writing
    combined.json (`encode` of text with no UTF-8) and printing its summary. The file now holds
    the surrogate as its JSON escape (reading back as the same string), stdout the escape."""
    import json
    import subprocess
    import sys

    d = _surrogate_evidence(tmp_path)
    p = subprocess.run([sys.executable, "-m", "soakspec", "combine", str(d), "--out", str(tmp_path / "c")],
                       capture_output=True, timeout=120)
    assert p.returncode in (1, 3) and "internal error" not in p.stderr.decode(), p.stderr.decode()[-500:]
    assert "\\ud800" in p.stdout.decode("utf-8")
    assert "\ud800" in json.dumps(json.loads((tmp_path / "c" / "combined.json").read_bytes()), ensure_ascii=False)


@given(st.text(alphabet=st.characters(categories=["Cs", "Ll", "Nd", "Zs", "Cc", "Lo"]), max_size=40))
def test_evidence_json_holds_any_string_a_server_sent(text):
    """json_bytes: what dumps_json / dumps_line make of any string -- lone surrogates included --
    is UTF-8 that reads back as that string."""
    import json

    from soakspec.evidence.io import dumps_json, dumps_line, json_bytes

    for dumped in (dumps_json({"t": text}), dumps_line({"t": text})):
        assert json.loads(json_bytes(dumped).decode("utf-8")) == {"t": text}
