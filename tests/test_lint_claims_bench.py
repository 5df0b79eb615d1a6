"""vLLM `bench serve`'s result block ("Mean TTFT (ms):   45.21") in a review: `soakspec report
DIR --format bench` prints each backend and level in that layout, marked `Tool: soakspec`, and
`soakspec lint-claims --evidence DIR` checks such a block against the evidence (CB201, the
precision rule of every figure), scoped to the level its `Level:` line names; a block without
the mark is another tool's run and is not read (`soakspec.claims.figures`, `soakspec.report.bench`)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from soakspec import cli
from soakspec.judge.testing import EvidenceBuilder, small_spec

BOUNDARY = "\n\n## Claim boundary\n\nSynthetic evidence only.\n"
TTFT_C4 = 0.04087  # level 1 (concurrency 4) answers faster than level 0 (TTFT 100 ms)

# vLLM bench serve's block as it prints it (vllm/benchmarks/serve.py), from its own run
VLLM_BLOCK = """\
============ Serving Benchmark Result ============
Successful requests:                     1000
Failed requests:                         0
Benchmark duration (s):                  120.50
Request throughput (req/s):              8.30
Output token throughput (tok/s):         1062.40
Total token throughput (tok/s):          3187.10
---------------Time to First Token----------------
Mean TTFT (ms):                          45.21
Median TTFT (ms):                        42.10
P99 TTFT (ms):                           98.33
==================================================
"""


def _write(tmp: Path, spec, b: EvidenceBuilder) -> tuple[Path, Path]:
    d = b.write(tmp / "run")
    spec_file = tmp / "spec.soak"
    spec_file.write_text(spec.canonical_text)
    return d, spec_file


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> tuple[Path, Path]:
    """sim-fast at concurrency 2 and 4: TTFT 100 ms and 40.87 ms."""
    spec = small_spec(levels="[2, 4]", backends=("sim-fast",))
    b = EvidenceBuilder(spec)
    for r in b.measured("sim-fast", level=1):
        r["first_token"] = r["start"] + TTFT_C4
        r["ttft"] = TTFT_C4
    return _write(tmp_path_factory.mktemp("bench"), spec, b)


@pytest.fixture(scope="module")
def capped(tmp_path_factory) -> tuple[Path, Path]:
    """An open loop under max_concurrency = 1: TTFT 300 ms from the intended start, 100 ms from the send."""
    from test_max_concurrency import _waited

    spec = small_spec(mode="open", levels="[2rps]\n    max_concurrency = 1", backends=("a",))
    return _write(tmp_path_factory.mktemp("bench-capped"), spec, _waited(EvidenceBuilder(spec)))


def _bench(capsys, d: Path, *extra: str) -> str:
    assert cli.main(["report", str(d), "--format", "bench", *extra]) == 0
    return capsys.readouterr().out


def _blocks(text: str) -> list[str]:
    return [b for b in text.split("\n\n") if b.strip()]


def _lint(tmp_path: Path, capsys, doc: str, run: tuple[Path, Path]) -> tuple[int, list[str]]:
    d, spec_file = run
    p = tmp_path / "PR.md"
    p.write_text(doc + BOUNDARY)
    code = cli.main(["lint-claims", str(p), "--spec", str(spec_file), "--evidence", str(d)])
    out = capsys.readouterr().out
    return code, [line.removeprefix(f"{p}:") for line in out.splitlines() if re.match(rf"{re.escape(str(p))}:\d+:\d+: ", line)]


def _fenced(*blocks: str) -> str:
    return "# PR\n\n" + "\n".join(f"```\n{b.rstrip()}\n```\n" for b in blocks)


def _set(block: str, label: str, value: str) -> str:
    """`block` with the line labelled `label` stating `value` (bench serve's padding kept)."""
    out, n = re.subn(rf"^{re.escape(label)}\s.*$", f"{label:<40} {value}", block, flags=re.M)
    assert n == 1, (label, block)
    return out


# ---------------------------------------------------------------- the format


def test_report_format_bench_prints_each_level_as_bench_serve_prints_its_run(capsys, run):
    """One block per level, bench serve's labels and `{:<40} {:<10.2f}` layout, so a script that
    reads bench serve's block reads the level's figures; `Tool:`, `Backend:`, `Level:` say whose."""
    c2, c4 = _blocks(_bench(capsys, run[0]))
    assert c4.splitlines()[0] == "============ Serving Benchmark Result ============"
    assert c4.splitlines()[-1] == "=" * 50
    for line in ("Tool:                                    soakspec", "Backend:                                 sim-fast",
                 "Level:                                   concurrency 4", "Verdict:                                 PASS",
                 "Successful requests:                     16",
                 "---------------Time to First Token----------------", "Mean TTFT (ms):                          40.87",
                 "Median TTFT (ms):                        40.87", "P99 TTFT (ms):                           40.87",
                 "Request throughput (req/s):              0.13", "Output token throughput (tok/s):         8.53",
                 "-----Time per Output Token (excl. 1st token)------", "----------------End-to-end Latency----------------"):
        assert line in c4.splitlines(), (line, c4)
    assert "Mean TTFT (ms):                          100.00" in c2.splitlines()
    assert "P90 TTFT" not in c4 and "Time to First Token (from the send)" not in c4  # default p95, p99; no cap
    # --percentiles chooses the Pxx lines, as it chooses the Markdown table's columns
    c2, _ = _blocks(_bench(capsys, run[0], "--percentiles", "50,90"))
    assert [ln.split(":")[0] for ln in c2.splitlines() if "TTFT" in ln and ":" in ln] == ["Mean TTFT (ms)", "Median TTFT (ms)", "P90 TTFT (ms)"]


def test_a_capped_levels_block_gives_bench_serves_times_under_bench_serves_labels(capsys, capped):
    """bench serve's TTFT / E2EL under --max-concurrency start at the send (after the slot): a
    capped level's block gives the time from the send (100 ms) under those labels, as a script
    reading bench serve's block expects, and soakspec's from the intended start (300 ms, the wait
    for a slot counted) in sections of their own, named so. It gave 300 ms as "Median TTFT"."""
    (block,) = _blocks(_bench(capsys, capped[0]))
    lines = block.splitlines()
    assert "Median TTFT (ms):                        100.00" in lines
    assert "Time to First Token (from intended start)" in block
    assert "Median intended TTFT (ms):               300.00" in lines
    assert any(ln.startswith("Mean intended E2EL (ms):") for ln in lines) and "sent" not in block


# ---------------------------------------------------------------- lint-claims reads it


def test_soakspecs_bench_block_pasted_into_a_review_lints_clean(tmp_path, capsys, run, capped):
    for r in (run, capped):
        text = _bench(capsys, r[0])
        assert _lint(tmp_path, capsys, _fenced(*_blocks(text)), r) == (0, [])
        assert _lint(tmp_path, capsys, "# PR\n\n" + text, r) == (0, [])  # not fenced: the same


def test_an_edited_figure_in_soakspecs_bench_block_is_CB201(tmp_path, capsys, run):
    """Every figure the block states is checked at the precision it is written with (2 decimals):
    the count, the rates, the latency aggregates."""
    _, c4 = _blocks(_bench(capsys, run[0]))
    for label, value, msg in [
        ("Successful requests:", "17", "successful requests 17 requests for sim-fast; the evidence records sim-fast · concurrency 4: 16 requests"),
        ("Request throughput (req/s):", "0.20", "request rate 0.20 req/s"),
        ("Output token throughput (tok/s):", "8.60", "output throughput 8.60 tok/s"),
        ("Mean TTFT (ms):", "40.90", "TTFT mean 40.90 ms for sim-fast; the evidence records sim-fast · concurrency 4: 40.870 ms"),
        ("P95 TPOT (ms):", "15.00", "TPOT p95 15.00 ms"),
        ("Median E2EL (ms):", "900.00", "latency p50 900.00 ms"),
    ]:
        code, diags = _lint(tmp_path, capsys, _fenced(_set(c4, label, value)), run)
        assert code == 1, label
        (d,) = diags
        line = 4 + c4.splitlines().index(next(ln for ln in c4.splitlines() if ln.startswith(label)))
        assert d.startswith(f"{line}:42: CB201 states {msg}"), d


def test_a_block_is_compared_with_the_level_it_names(tmp_path, capsys, run):
    """The concurrency-4 block stating concurrency 2's TTFT (100 ms) is CB201; without its Level
    line the block names no level, and like a sentence naming none it holds when any level fits."""
    _, c4 = _blocks(_bench(capsys, run[0]))
    wrong = _set(c4, "Mean TTFT (ms):", "100.00")
    code, diags = _lint(tmp_path, capsys, _fenced(wrong), run)
    assert code == 1
    line = 4 + wrong.splitlines().index("Mean TTFT (ms):                          100.00")
    assert [d.split(" for ")[0] for d in diags] == [f"{line}:42: CB201 states TTFT mean 100.00 ms"], diags
    no_level = "\n".join(ln for ln in wrong.splitlines() if not ln.startswith("Level:"))
    assert _lint(tmp_path, capsys, _fenced(no_level), run) == (0, [])


def test_a_capped_blocks_times_are_checked_against_their_own_figures(tmp_path, capsys, capped):
    """A capped level's "Median TTFT (ms)" is the time from the send (sent_ttft), its "Median
    intended TTFT (ms)" the TTFT from the intended start: each edited is CB201 against its own."""
    (block,) = _blocks(_bench(capsys, capped[0]))
    for label, value, stated in (("Median TTFT (ms):", "300.00", "sent TTFT p50 300.00 ms"),
                                 ("Median intended TTFT (ms):", "100.00", "TTFT p50 100.00 ms")):
        code, diags = _lint(tmp_path, capsys, _fenced(_set(block, label, value)), capped)
        assert code == 1
        assert [re.sub(r"^\d+:\d+: CB201 states (.*?) for a;.*", r"\1", d) for d in diags] == [stated], diags


def _as_before(block: str) -> str:
    """A capped level's block as soakspec printed it before its labels followed bench serve's:
    TTFT / E2EL from the intended start, and sections "(from the send)" of "sent TTFT" / "sent E2EL"."""
    lines = block.splitlines()
    vals = {ln.split(":")[0]: ln for ln in lines}
    out = []
    for ln in lines:
        label = ln.split(":")[0]
        mine = label.replace(" TTFT", " intended TTFT").replace(" E2EL", " intended E2EL")
        if "from intended start" in ln:
            ln = f"{ln.strip('-').replace('from intended start', 'from the send'):-^50}"
        elif " intended " in label:  # the time from the send, under "sent"
            ln = f"{label.replace('intended', 'sent') + ':':<40} {vals[label.replace(' intended', '')].split()[-1]}"
        elif mine != label and mine in vals:  # the time from the intended start, under bench serve's label
            ln = f"{label + ':':<40} {vals[mine].split()[-1]}"
        out.append(ln)
    return "\n".join(out)


def test_a_capped_block_pasted_before_the_labels_changed_is_read_as_it_was_written(tmp_path, capsys, capped):
    """A block with sections "(from the send)" is the older layout: its "Median TTFT (ms)" is
    from the intended start (300 ms) and "Median sent TTFT (ms)" from the send (100 ms)."""
    (block,) = _blocks(_bench(capsys, capped[0]))
    old = _as_before(block)
    assert "Median TTFT (ms):                        300.00" in old and "Median sent TTFT (ms):                   100.00" in old, old
    assert _lint(tmp_path, capsys, _fenced(old), capped) == (0, [])
    code, diags = _lint(tmp_path, capsys, _fenced(_set(old, "Median sent TTFT (ms):", "300.00")), capped)
    assert code == 1 and len(diags) == 1 and "states sent TTFT p50 300.00 ms" in diags[0], diags


def test_bench_serves_own_block_is_another_tools_run_and_is_not_read(tmp_path, capsys, run):
    """vLLM's block (no `Tool: soakspec`) measured its own run: its figures are not the evidence's
    and are not contradicted by it, while soakspec's block beside it is checked."""
    _, c4 = _blocks(_bench(capsys, run[0]))
    code, diags = _lint(tmp_path, capsys, _fenced(VLLM_BLOCK, _set(c4, "Mean TTFT (ms):", "100.00")), run)
    assert code == 1
    assert len(diags) == 1 and " CB201 states TTFT mean 100.00 ms" in diags[0], diags
    assert _lint(tmp_path, capsys, _fenced(VLLM_BLOCK) + "\n" + VLLM_BLOCK, run) == (0, [])


def test_a_block_for_a_backend_the_evidence_did_not_run_is_no_other_backends(tmp_path, capsys, run):
    _, c4 = _blocks(_bench(capsys, run[0]))
    other = _set(_set(c4, "Backend:", "sim-slow"), "Mean TTFT (ms):", "999.00")
    assert _lint(tmp_path, capsys, _fenced(other), run) == (0, [])


# vLLM's block of a capped run at a request rate: the lines bench serve prints for its settings
VLLM_CAPPED = VLLM_BLOCK.replace(
    "Failed requests:                         0\n",
    "Failed requests:                         0\nMaximum request concurrency:             64\n"
    "Request rate configured (RPS):           8.00\n",
)


def test_bench_serves_own_block_unfenced_is_not_read_for_its_settings_either(tmp_path, capsys, run):
    """bench serve's block is another tool's run, fenced or not: its "Maximum request
    concurrency: 64" is no concurrency level of the evidence (it gave CB201 on the levels and
    CB301 on the scope) -- nor is its configured rate."""
    assert _lint(tmp_path, capsys, "# PR\n\n" + VLLM_CAPPED, run) == (0, [])
    assert _lint(tmp_path, capsys, _fenced(VLLM_CAPPED), run) == (0, [])


def test_the_verdict_line_of_soakspecs_block_is_checked_fenced_or_not(tmp_path, capsys, run):
    """A block's `Verdict:` is the run's outcome: "PASS" pasted over evidence that did not pass is
    CB201 fenced as unfenced (the fenced block's verdict was never read)."""
    _, c4 = _blocks(_bench(capsys, run[0]))
    wrong = _set(c4, "Verdict:", "FAIL")
    line = 4 + wrong.splitlines().index(next(ln for ln in wrong.splitlines() if ln.startswith("Verdict:")))
    for doc, at in ((_fenced(wrong), line), ("# PR\n\n" + wrong, line - 1)):
        code, diags = _lint(tmp_path, capsys, doc, run)
        assert code == 1 and [d.split(";")[0] for d in diags] == [f"{at}:42: CB201 states gate FAIL for sim-fast"], diags


def test_a_blocks_run_line_chooses_the_run_of_a_before_after(tmp_path, capsys):
    """Two runs of one backend (a before/after): a block's figures are its `Run:`'s, not
    whichever run fits -- the base run's block stating the new run's TTFT is CB201 against the base
    run's (it held, as the other run's), while the new run's block states it cleanly."""
    spec = small_spec(levels="[4]", backends=("sim-fast",))
    runs = []
    for name, ttft in (("base", 0.1), ("new", TTFT_C4)):
        b = EvidenceBuilder(spec, run_id=f"run-{name}")
        for r in b.measured("sim-fast"):
            r["first_token"] = r["start"] + ttft
            r["ttft"] = ttft
        runs.append(_write(tmp_path / name, spec, b))
    (base,), (new,) = (_blocks(_bench(capsys, r[0])) for r in runs)
    run_of = {blk: next(ln for ln in blk.splitlines() if ln.startswith("Run:")).split()[1] for blk in (base, new)}
    assert run_of[base] != run_of[new]
    p = tmp_path / "PR.md"
    args = ["lint-claims", str(p), "--spec", str(runs[0][1]), "--evidence", str(runs[0][0]), "--evidence", str(runs[1][0])]
    new_ttft = next(ln for ln in new.splitlines() if ln.startswith("Mean TTFT")).split()[-1]
    for blk, expect in ((new, []), (_set(base, "Mean TTFT (ms):", new_ttft), ["CB201"])):
        p.write_text(_fenced(blk) + BOUNDARY)
        cli.main(args)
        out = capsys.readouterr().out
        assert re.findall(r": (CB\d+) ", out) == expect, out
        if expect:
            assert "the evidence records sim-fast · concurrency 4: 100.000 ms\n" in out, out  # the base run's alone


def test_prose_after_a_block_without_its_closing_line_is_read(tmp_path, capsys, run):
    """A bench serve block pasted without its closing "=====" line ends at the first line that is
    not `Label: value`, a `---Section---` line or blank: the prose after it is read as prose. The
    block ran on to the next fence or 200 lines, and "completed 99999 requests" after it escaped
    the count check (exit 0)."""
    trimmed = VLLM_BLOCK.rstrip("\n").rsplit("\n", 1)[0] + "\n"
    assert not trimmed.rstrip().endswith("=")
    doc = "# PR\n\n" + trimmed + "\nThe run completed 99999 requests.\n"
    code, diags = _lint(tmp_path, capsys, doc, run)
    assert code == 1 and [re.sub(r"^\d+:\d+: (CB\d+) .*", r"\1", d) for d in diags] == ["CB201"], diags
    assert diags[0].startswith(f"{doc.splitlines().index('The run completed 99999 requests.') + 1}:"), diags
    assert _lint(tmp_path, capsys, "# PR\n\n" + trimmed + "\nThe run completed 32 requests.\n", run)[1] == []


def test_a_capped_levels_block_without_its_intended_start_sections_is_still_capped(tmp_path, capsys, capped):
    """A capped level's block pasted without its trailing "(from intended start)" sections: its
    plain TTFT / E2EL are still the time from the send, as the level it names is capped in the
    evidence. They were compared with the times from the intended start: 8 false CB201."""
    (block,) = _blocks(_bench(capsys, capped[0]))
    lines = block.splitlines()
    cut = next(k for k, ln in enumerate(lines) if "(from intended start)" in ln)
    trimmed = "\n".join(lines[:cut] + [lines[-1]])
    assert "intended" not in trimmed and trimmed.rstrip().endswith("=====")
    assert _lint(tmp_path, capsys, _fenced(trimmed), capped) == (0, [])
    code, diags = _lint(tmp_path, capsys, _fenced(_set(trimmed, "Median TTFT (ms):", "300.00")), capped)
    assert code == 1 and len(diags) == 1 and "states sent TTFT p50 300.00 ms" in diags[0], diags


# ---------------------------------------------------------------- failed requests, duration, peaks


@pytest.fixture(scope="module")
def failing(tmp_path_factory) -> tuple[Path, Path]:
    """sim-fast at concurrency 2 and 4, three of concurrency 4's requests not completed (two
    failed, one timed out): bench serve's "Failed requests" counts all three."""
    spec = small_spec(levels="[2, 4]", backends=("sim-fast",))
    b = EvidenceBuilder(spec)
    rows = list(b.measured("sim-fast", level=1))
    b.set_outcome(rows[0], "failed", "HTTP 500")
    b.set_outcome(rows[1], "failed", "HTTP 500", 500)
    b.set_outcome(rows[2], "timeout", "deadline passed before the response finished")
    return _write(tmp_path_factory.mktemp("bench-failing"), spec, b)


def test_the_block_states_failed_requests_and_the_levels_measured_duration(capsys, failing):
    """bench serve's "Failed requests" (every request that was not a success) and "Benchmark
    duration (s)" (here the level's measured wall time: its two 1-minute buckets), where bench
    serve prints them; its two Peak lines after the output throughput, as bench serve's."""
    c2, c4 = (b.splitlines() for b in _blocks(_bench(capsys, failing[0])))
    assert "Failed requests:                         0" in c2 and "Failed requests:                         3" in c4
    assert "Successful requests:                     13" in c4
    assert "Benchmark duration (s):                  120.00" in c4
    assert [ln.split(":")[0] for ln in c4[6:10]] == ["Successful requests", "Failed requests", "Benchmark duration (s)",
                                                     "Request throughput (req/s)"]  # bench serve's order
    assert [ln.split(":")[0] for ln in c4[10:14]] == ["Output token throughput (tok/s)", "Peak output token throughput (tok/s)",
                                                      "Peak concurrent requests", "Total token throughput (tok/s)"]


def test_the_blocks_duration_is_what_its_rates_divide_by(capsys, failing):
    """`Benchmark duration (s)` is the time the block's rates divide by: Request throughput x
    duration is the requests the server delivered in the level's buckets (results.json's
    bucket qps x wall time), not bench serve's first-send-to-last-response (README)."""
    import json

    c4 = _blocks(_bench(capsys, failing[0]))[1]
    fig = {ln.split(":")[0]: ln.split(":", 1)[1].strip() for ln in c4.splitlines() if ":" in ln}
    res = json.loads((failing[0] / "results.json").read_text())
    buckets = [w for w in res["backends"][0]["buckets"] if w.get("level") == 1]
    delivered = sum(w["qps"] * w["wall_s"] for w in buckets)
    assert float(fig["Benchmark duration (s)"]) == pytest.approx(sum(w["wall_s"] for w in buckets), abs=0.005)
    assert float(fig["Request throughput (req/s)"]) * float(fig["Benchmark duration (s)"]) == pytest.approx(delivered, abs=0.01 * 120)


def test_failed_requests_and_duration_as_written_lint_clean_and_edited_are_CB201(tmp_path, capsys, failing):
    """An unedited block passes (0 and 3 failed, 120 s); each of the three lines edited is CB201
    at the precision it is written with, naming the level's recorded figure; so is a Peak line
    edited (the level's peaks: tests/test_peak_figures.py)."""
    text = _bench(capsys, failing[0])
    assert _lint(tmp_path, capsys, _fenced(*_blocks(text)), failing) == (0, [])
    _, c4 = _blocks(text)
    for label, value, msg in [
        ("Failed requests:", "0", "failed requests 0 requests for sim-fast; the evidence records sim-fast · concurrency 4: 3 requests"),
        ("Failed requests:", "2", "failed requests 2 requests"),
        ("Benchmark duration (s):", "119.90", "benchmark duration 119.90 s for sim-fast; the evidence records "
                                              "sim-fast · concurrency 4: 120.000 s"),
        ("Benchmark duration (s):", "60.00", "benchmark duration 60.00 s"),
    ]:
        code, diags = _lint(tmp_path, capsys, _fenced(_set(c4, label, value)), failing)
        assert code == 1, (label, value)
        (d,) = diags
        line = 4 + c4.splitlines().index(next(ln for ln in c4.splitlines() if ln.startswith(label)))
        assert d.startswith(f"{line}:42: CB201 states {msg}"), d
    assert _lint(tmp_path, capsys, _fenced(_set(c4, "Benchmark duration (s):", "120")), failing) == (0, [])  # 120 ± 0.5
    for label, value, msg in [("Peak output token throughput (tok/s):", "500.00", "peak output token throughput 500.00 tok/s"),
                              ("Peak concurrent requests:", "4.00", "peak concurrent requests 4.00 requests")]:
        code, diags = _lint(tmp_path, capsys, _fenced(_set(c4, label, value)), failing)
        assert code == 1
        (d,) = diags
        assert f"CB201 states {msg} for sim-fast; the evidence records sim-fast · concurrency 4: " in d, d
    # bench serve's own block (no `Tool: soakspec`) keeps its Failed / duration / Peak lines unread
    own = VLLM_BLOCK.replace("Total token", "Peak output token throughput (tok/s):    9999.00\nTotal token", 1)
    assert _lint(tmp_path, capsys, _fenced(own), failing) == (0, [])


def test_a_blocks_level_line_is_that_level_not_another_workloads_at_the_same_load(tmp_path, capsys):
    """Two workloads at concurrency 2 (w1 timed, w2 counted), two backends: the block of
    `w1 / concurrency 2` holds w1's figures; w2's pasted into it are CB201, not read as w2's
    because both run at concurrency 2 (its `Level:` line is the label report wrote)."""
    from soakspec.judge.testing import spec_from_text

    bk = "\n".join(f'backend "{b}" {{\n  url = "http://127.0.0.1:8000"\n  runtime {{\n    label = "host-staged"\n  }}\n}}'
                   for b in ("a", "b"))
    w = 'workload "{}" {{\n  load {{\n    mode = closed\n    concurrency = [2]{}\n  }}\n  duration = 2m\n  bucket = 1m\n  deadline = 30s\n}}\n'
    spec = spec_from_text('soak "small" {}\n' + bk + "\n" + w.format("w1", "") + w.format("w2", "\n    requests_per_level = 30")
                          + "gate {\n  require failed == 0\n}\n")
    b = EvidenceBuilder(spec)
    for r in [r for r in b.measured("a", level=0) if r["workload"] == "w2"][:3]:
        b.set_outcome(r, "failed", "HTTP 500")
    run = _write(tmp_path, spec, b)
    blocks = _blocks(_bench(capsys, run[0]))
    w1 = next(x for x in blocks if "Backend:                                 a" in x and "w1 / concurrency 2" in x)
    w2 = next(x for x in blocks if "Backend:                                 a" in x and "w2 / concurrency 2" in x)
    assert "Failed requests:                         3" in w2 and "Failed requests:                         0" in w1
    assert _lint(tmp_path, capsys, _fenced(w1, w2), run) == (0, [])
    code, found = _lint(tmp_path, capsys, _fenced(_set(_set(w1, "Failed requests:", "3"), "Successful requests:", "13")), run)
    assert code == 1 and len(found) == 2 and all("CB201" in f for f in found), found
