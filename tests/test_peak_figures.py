"""bench serve's "Peak output token throughput (tok/s)" and "Peak concurrent requests", per level:
results.json `levels[].peak_output_tokens_per_s` / `peak_concurrent_requests`, the bench block's
two lines in bench serve's wording, and `lint-claims` checking them (`soakspec.judge.peaks`)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from soakspec import cli
from soakspec.evidence.record import RequestRecord, decode_line
from soakspec.judge import peaks
from soakspec.judge.table import TableBuilder
from soakspec.judge.testing import EvidenceBuilder, small_spec

BOUNDARY = "\n\n## Claim boundary\n\nSynthetic evidence only.\n"
BURST = 3  # requests whose 64 tokens all fall in the level's second 10
PEAK_TOKENS = BURST * 64


def naive_token_seconds(rows, origin: float) -> dict[int, int]:
    """The reference: each token of each measured completed request, one at a time, in the
    second (from `origin`) it arrived in -- the first chunk's k1 tokens (output_tokens less the
    gaps, at least 1) at first_token, then one at each gap in turn, in whole µs."""
    out: dict[int, int] = {}
    for r in rows:
        if r["outcome"] != "completed" or r["bucket"] < 0 or r.get("first_token") is None:
            continue
        t = round((r["first_token"] - origin) * 1e6)
        k1 = max(1, r["output_tokens"] - len(r["itl"])) if r.get("output_tokens") is not None else 1
        out[t // 1_000_000] = out.get(t // 1_000_000, 0) + k1 - 1
        for gap in [0.0, *r["itl"]]:
            t += round(gap * 1e6)
            out[t // 1_000_000] = out.get(t // 1_000_000, 0) + 1
    return out


def naive_concurrency(intervals) -> int:
    """The reference: at each arrival, how many [start, end) hold that instant (one that ends
    there has left: bench serve's sweep puts a departure first)."""
    return max((sum(1 for a, b in intervals if a <= s < b) for s, _ in intervals), default=0)


def _known(b: EvidenceBuilder) -> float:
    """Level 0's measured requests rearranged so that its peaks are known: BURST requests in
    flight together from second 10.2 to 11.5, their 64 tokens 10 ms apart from 10.3 (all in
    second 10: 192 tokens), a fourth starting at 11.6 (after they ended: three in flight, though
    four were active in second 11), the rest one at a time, their tokens spread over a second.
    A warm-up request bursts tokens into second 10 too: it does not count (nor would a failed
    one: the property test below)."""
    lv = b.level("sim-fast", 0)
    ms = lv["measure_start"]
    rows = list(b.measured("sim-fast", level=0))
    placed = [(10.2, 11.5, 10.3, 0.01)] * BURST + [(11.6, 12.4, 11.7, 0.01)]
    placed += [(20.0 + 5 * k, 21.0 + 5 * k, 20.1 + 5 * k, 0.9 / 63) for k in range(len(rows) - len(placed))]
    for r, (s, e, ft, gap) in zip(rows, placed):
        r.update(intended_start=ms + s, start=ms + s, first_byte=ms + ft - 0.05, first_token=ms + ft, end=ms + e,
                 ttft=ft - s, latency=e - s, itl=[gap] * 63, tpot=(e - ft) / 63)
    # a warm-up request (bucket -1) whose tokens fall in second 10: not counted either
    warm = b.request("sim-fast", rows[0]["workload"], 0, -1, ms + 10.3, conc=2, rate=None)
    warm.update(first_token=ms + 10.4, end=ms + 10.5, itl=[0.001] * 63)
    b.records["sim-fast"].insert(0, warm)
    return ms


@pytest.fixture(scope="module")
def known(tmp_path_factory) -> tuple[Path, Path, EvidenceBuilder, float]:
    spec = small_spec(levels="[2, 4]", backends=("sim-fast",))
    b = EvidenceBuilder(spec)
    ms = _known(b)
    tmp = tmp_path_factory.mktemp("peaks")
    d = b.write(tmp / "run")
    spec_file = tmp / "spec.soak"
    spec_file.write_text(spec.canonical_text)
    return d, spec_file, b, ms


def _level0(d: Path) -> dict:
    doc = json.loads((d / "results.json").read_text())
    return next(lv for lv in doc["backends"][0]["levels"] if lv["index"] == 0)


def test_results_record_the_levels_peak_second_and_peak_concurrency(known):
    """results.json's level 0: 192 tokens in its fullest second (three requests' 64 tokens each,
    the warm-up request's left out) and three requests in flight at once -- both what
    a per-token loop and a naive sweep over the records find."""
    d, _, b, ms = known
    lv = _level0(d)
    rows = [r for r in b.records["sim-fast"] if r["level"] == 0]
    ref = naive_token_seconds(rows, ms)
    assert max(ref.values()) == PEAK_TOKENS == ref[10]
    assert lv["peak_output_tokens_per_s"] == PEAK_TOKENS
    done = [(r["start"], r["end"]) for r in rows if r["bucket"] >= 0 and r["outcome"] == "completed"]
    assert naive_concurrency(done) == BURST
    assert lv["peak_concurrent_requests"] == BURST
    # the level at concurrency 4 (untouched: one request at a time, each 64 tokens over 0.9 s)
    other = next(x for x in json.loads((d / "results.json").read_text())["backends"][0]["levels"] if x["index"] == 1)
    assert other["peak_concurrent_requests"] == 1 and 0 < other["peak_output_tokens_per_s"] <= 64


def _bench(capsys, d: Path) -> list[str]:
    assert cli.main(["report", str(d), "--format", "bench"]) == 0
    return [b for b in capsys.readouterr().out.split("\n\n") if b.strip()]


def test_the_bench_block_prints_the_peaks_in_bench_serves_words(capsys, known):
    """The two lines bench serve prints, with its labels, its `{:<40} {:<10.2f}` layout (a count
    reads 3.00, as bench serve prints it) and its order: after the output throughput."""
    block = _bench(capsys, known[0])[0].splitlines()
    i = block.index(next(ln for ln in block if ln.startswith("Output token throughput (tok/s):")))
    assert block[i + 1] == f"{'Peak output token throughput (tok/s):':<40} {PEAK_TOKENS:<10.2f}".rstrip()
    assert block[i + 2] == f"{'Peak concurrent requests:':<40} {BURST:<10.2f}".rstrip() == "Peak concurrent requests:                3.00"
    assert block[i + 3].startswith("Total token throughput (tok/s):")


def _lint(tmp_path: Path, capsys, doc: str, d: Path, spec_file: Path) -> tuple[int, list[str]]:
    p = tmp_path / "PR.md"
    p.write_text(doc + BOUNDARY)
    code = cli.main(["lint-claims", str(p), "--spec", str(spec_file), "--evidence", str(d)])
    out = capsys.readouterr().out
    return code, [ln.removeprefix(f"{p}:") for ln in out.splitlines() if re.match(rf"{re.escape(str(p))}:\d+:\d+: ", ln)]


def _set(block: str, label: str, value: str) -> str:
    out, n = re.subn(rf"^{re.escape(label)}\s.*$", f"{label:<40} {value}", block, flags=re.M)
    assert n == 1
    return out


def test_lint_claims_accepts_the_peaks_as_printed_and_flags_a_wrong_one(tmp_path, capsys, known):
    """The block as report printed it is clean; a Peak figure edited is CB201 naming the level's
    recorded figure, at the precision it is written with (192.00 holds, 191.00 and 4.00 do not)."""
    d, spec_file, _, _ = known
    block = _bench(capsys, d)[0]
    assert _lint(tmp_path, capsys, f"```\n{block}\n```", d, spec_file) == (0, [])
    for label, value, msg in [
        ("Peak output token throughput (tok/s):", "191.00",
         "peak output token throughput 191.00 tok/s for sim-fast; the evidence records sim-fast · concurrency 2: 192 tok/s"),
        ("Peak concurrent requests:", "4.00",
         "peak concurrent requests 4.00 requests for sim-fast; the evidence records sim-fast · concurrency 2: 3 requests"),
    ]:
        code, diags = _lint(tmp_path, capsys, f"```\n{_set(block, label, value)}\n```", d, spec_file)
        assert code == 1, (label, value)
        (got,) = diags
        assert f"CB201 states {msg}" in got, got
    assert _lint(tmp_path, capsys, f"```\n{_set(block, 'Peak concurrent requests:', '3')}\n```", d, spec_file) == (0, [])


def test_results_from_before_the_peaks_report_as_they_did(tmp_path, capsys, known):
    """A results.json written before the peaks were recorded (no such fields) is read as before:
    the bench renderer prints no Peak line for it and every other line as it did, and
    `lint-claims` reading the run beside such a stored results.json warns of nothing (CB402
    compares a stored peak only where one was stored), while a stored peak edited is CB402."""
    import shutil

    from soakspec.judge.cli_support import judge_and_write
    from soakspec.lang import load_spec
    from soakspec.report import bench

    d, spec_file, _, _ = known
    spec = load_spec(str(spec_file))[0]
    verdict, results = judge_and_write(d, spec)
    old = json.loads(json.dumps(results))
    for be in old["backends"]:
        for lv in be["levels"]:
            del lv["peak_output_tokens_per_s"], lv["peak_concurrent_requests"]
    now = bench.render(verdict, results, {"run_id": "r"}, spec).splitlines()
    before = bench.render(verdict, old, {"run_id": "r"}, spec).splitlines()
    assert [ln for ln in now if not ln.startswith("Peak")] == before and len(now) == len(before) + 4

    stored = Path(shutil.copytree(d, tmp_path / "old"))  # results.json is bound to the manifest, not hashed in it
    doc = json.loads((d / "results.json").read_text())
    for be in doc["backends"]:
        for lv in be["levels"]:
            del lv["peak_output_tokens_per_s"], lv["peak_concurrent_requests"]
    (stored / "results.json").write_text(json.dumps(doc))
    assert _lint(tmp_path, capsys, "Nothing measured here.", stored, spec_file) == (0, [])
    doc["backends"][0]["levels"][0]["peak_concurrent_requests"] = 7
    (stored / "results.json").write_text(json.dumps(doc))
    code, diags = _lint(tmp_path, capsys, "Nothing measured here.", stored, spec_file)
    assert len(diags) == 1 and "CB402" in diags[0] and "results.json records peak_concurrent_requests 7 for sim-fast · concurrency 2; re-judged: 3" in diags[0], diags


def _all_failed(tmp_path):
    """A one-level run whose every measured request failed (HTTP 500): no token, none
    completed, so no peak; its directory and spec file."""
    spec = small_spec(levels="[2]", backends=("sim-fast",), rules="require completed >= 0")
    b = EvidenceBuilder(spec)
    for r in list(b.measured("sim-fast", level=0)):
        b.set_outcome(r, "failed", "HTTP 500")
    d = b.write(tmp_path / "run")
    spec_file = tmp_path / "spec.soak"
    spec_file.write_text(spec.canonical_text)
    return d, spec_file


def test_a_peak_line_for_a_level_with_no_peak_is_added_by_hand(tmp_path, capsys):
    """Every measured request of a level failed: no token, no request completed -- results.json
    has null peaks, the block prints n/a, and a number written there is CB201, added by hand."""
    d, spec_file = _all_failed(tmp_path)
    lv = _level0(d)
    assert lv["peak_output_tokens_per_s"] is None and lv["peak_concurrent_requests"] is None
    (block,) = _bench(capsys, d)
    assert "Peak output token throughput (tok/s):    n/a" in block.splitlines()
    code, diags = _lint(tmp_path, capsys, f"```\n{_set(block, 'Peak concurrent requests:', '2.00')}\n```", d, spec_file)
    assert code == 1 and len(diags) == 1 and "peak concurrent requests 2.00 requests" in diags[0] and "added by hand" in diags[0]


# ---------------------------------------------------------------- the md and html reports' per-level table

def _report(capsys, d: Path, fmt: str) -> str:
    assert cli.main(["report", str(d), "--format", fmt]) == 0
    return capsys.readouterr().out


def _level_cells(md: str) -> tuple[list[str], dict[str, list[str]], dict[str, int]]:
    """The md report's per-level table: its head, each row's cells by its first cell, and each
    row's line number."""
    lines = md.splitlines()
    at = next(i for i, ln in enumerate(lines) if ln.startswith("| Backend / level |"))
    split = lambda ln: [c.strip() for c in re.split(r"(?<!\\)\|", ln.strip())[1:-1]]  # noqa: E731
    head, rows, where = split(lines[at]), {}, {}
    for i in range(at + 2, len(lines)):
        if not lines[i].startswith("|"):
            break
        cells = split(lines[i])
        rows[cells[0]], where[cells[0]] = cells, i + 1
    return head, rows, where


def test_the_md_and_html_level_tables_show_the_blocks_peaks_and_lint_clean(tmp_path, capsys, known):
    """The md report's per-level table has bench serve's two peaks beside the means they top --
    the figures the bench block prints (192 tokens in a second, 3 in flight), as whole numbers --
    and so has the html report's; the md report linted against its own evidence is clean, and a
    Peak cell edited is CB201 naming the level's recorded figure."""
    d, spec_file, _, _ = known
    md = _report(capsys, d, "md")
    head, rows, where = _level_cells(md)
    assert head[head.index("Output tok/s") + 1] == "Peak output tok/s"
    assert head[head.index("Mean in flight") + 1] == "Peak concurrent requests"
    row = rows["sim-fast · concurrency 2"]
    assert (row[head.index("Peak output tok/s")], row[head.index("Peak concurrent requests")]) == (str(PEAK_TOKENS), str(BURST))
    block = _bench(capsys, d)[0].splitlines()
    assert f"{'Peak output token throughput (tok/s):':<40} {PEAK_TOKENS:<10.2f}".rstrip() in block
    html = _report(capsys, d, "html")
    assert "<th>Peak output tok/s</th>" in html and "<th>Peak concurrent requests</th>" in html
    assert f'<td class="num">{PEAK_TOKENS}</td>' in html

    p = tmp_path / "report.md"
    p.write_text(md)
    assert cli.main(["lint-claims", str(p), "--spec", str(spec_file), "--evidence", str(d)]) == 0, capsys.readouterr().out
    capsys.readouterr()
    lines = md.splitlines()
    for col, value, msg in [("Peak output tok/s", "191", "peak output token throughput 191 tok/s for sim-fast; the evidence "
                             "records sim-fast · concurrency 2: 192 tok/s"),
                            ("Peak concurrent requests", "4", "peak concurrent requests 4 requests for sim-fast; the evidence "
                             "records sim-fast · concurrency 2: 3 requests")]:
        cells = list(row)
        cells[head.index(col)] = value
        edited = lines.copy()
        edited[where["sim-fast · concurrency 2"] - 1] = "| " + " | ".join(cells) + " |"
        p.write_text("\n".join(edited) + "\n")
        assert cli.main(["lint-claims", str(p), "--spec", str(spec_file), "--evidence", str(d)]) == 1
        out = [ln for ln in capsys.readouterr().out.splitlines() if "CB2" in ln]
        assert len(out) == 1 and f"{p}:{where['sim-fast · concurrency 2']}:" in out[0] and msg in out[0], out


def test_a_level_with_no_peak_shows_a_dash_and_a_number_there_is_added_by_hand(tmp_path, capsys):
    """A level whose measured requests all failed has no peak: the md and html tables show "-"
    (as for other missing figures), that report lints clean, and a number written in its Peak
    cell is CB201, added by hand -- as a Peak line in the bench block is."""
    d, spec_file = _all_failed(tmp_path)
    md = _report(capsys, d, "md")
    head, rows, where = _level_cells(md)
    (name,) = rows
    row = rows[name]
    assert row[head.index("Peak output tok/s")] == row[head.index("Peak concurrent requests")] == "-"
    html = _report(capsys, d, "html")
    i = html.index("<th>Peak output tok/s</th>")
    assert html.count("<th>", 0, i) >= 1 and "<td class=\"num\">-</td>" in html
    p = tmp_path / "report.md"
    p.write_text(md)
    assert cli.main(["lint-claims", str(p), "--spec", str(spec_file), "--evidence", str(d)]) == 0, capsys.readouterr().out
    capsys.readouterr()
    cells = list(row)
    cells[head.index("Peak concurrent requests")] = "2"
    lines = md.splitlines()
    lines[where[name] - 1] = "| " + " | ".join(cells) + " |"
    p.write_text("\n".join(lines) + "\n")
    assert cli.main(["lint-claims", str(p), "--spec", str(spec_file), "--evidence", str(d)]) == 1
    out = [ln for ln in capsys.readouterr().out.splitlines() if "CB2" in ln]
    assert len(out) == 1 and "peak concurrent requests 2 requests" in out[0] and "added by hand" in out[0], out


def test_a_usage_past_max_tokens_counts_its_chunks_in_the_peak_as_throughput_does(tmp_path, capsys):
    """A completed request whose usage claims 1000x the workload's max_tokens (the judge flags it
    `usage_mismatch`; the output throughput counts its chunks instead) counts one token a chunk in
    the peak too: its claimed first-chunk tokens do not inflate the fullest second (it read
    ~64,000 tok/s before, the loader counting them from the claimed count)."""
    spec = small_spec(levels="[2]", backends=("sim-fast",))
    cap = max(n for n in spec.workloads[0].max_tokens if n is not None)
    b = EvidenceBuilder(spec)
    bad = next(iter(b.measured("sim-fast", level=0)))
    assert bad["chunks"] == len(bad["itl"]) + 1  # one token a chunk, as the claim is not
    bad.update(output_tokens=cap * 1000, tokens_source="usage")
    d = b.write(tmp_path / "run")
    lv = _level0(d)
    assert lv["excluded"]["itl"] == {"usage contradicts the stream (usage_mismatch)": 1}  # the judge flagged it
    rows = [dict(r, output_tokens=r["chunks"]) if r is bad else r for r in b.records["sim-fast"] if r["level"] == 0]
    ref = naive_token_seconds(rows, lv["measure_start"])
    assert lv["peak_output_tokens_per_s"] == max(ref.values()) <= cap
    (block,) = _bench(capsys, d)
    assert f"{'Peak output token throughput (tok/s):':<40} {max(ref.values()):<10.2f}".rstrip() in block.splitlines()


def test_a_flagged_request_the_loader_did_not_count_takes_nothing_back():
    """A record with no outcome (the judge derives it: completed) was not counted in the token
    seconds as read (`peaks`: by the outcome the record states); flagged usage_mismatch, it takes
    back none of its claimed tokens from the second it would have been in -- the burst's 192
    stay the peak, where taking back ~64,000 from that second made another second the peak."""
    spec = small_spec(levels="[2, 4]", backends=("sim-fast",))
    cap = max(n for n in spec.workloads[0].max_tokens if n is not None)
    b = EvidenceBuilder(spec)
    ms = _known(b)
    fourth = list(b.measured("sim-fast", level=0))[BURST]
    fourth.update(first_token=ms + 10.35, first_byte=ms + 10.3, end=ms + 11.0, output_tokens=cap * 1000)
    del fourth["outcome"]
    from soakspec.judge.summary import summarize

    lv = next(x for x in summarize(b.build(), spec)["backends"][0]["levels"] if x["index"] == 0)
    assert lv["excluded"]["itl"] == {"usage contradicts the stream (usage_mismatch)": 1}
    assert lv["peak_output_tokens_per_s"] == PEAK_TOKENS


def test_the_first_chunks_of_rows_with_extras_are_the_row_paths():
    """A record the table keeps extras of (a field it has no column for, a count that is not an
    int, gaps that are not all numbers) has the first chunk the row-by-row path counted: 1 where
    its count or its gaps cannot say, else output_tokens less its gaps -- so the judge takes back
    from a flagged request what the loader put in."""
    row = dict(_ROW, workload="w", level=0, bucket=0)
    rows = [dict(row, request_id="x1", note={"a": 1}), dict(row, request_id="x2", output_tokens=70.0),
            dict(row, request_id="x3", itl=[0.01, "bad"], output_tokens=80),
            dict(row, request_id="x4", itl=[0.01] * 3, output_tokens=40, chunks=4, note="x"),
            dict(row, request_id="x5", itl=[0.01, 2**40], output_tokens=40, chunks=3)]
    t = TableBuilder(origins={("w", 0): 0.0}).extend(rows).finish()
    assert set(t.odd_rows.tolist()) >= {0, 1, 2, 3}
    assert t.first_chunks(np.arange(t.n)).tolist() == [max(1, row["output_tokens"] - len(row["itl"])), 1, 1, 37, 38]


# ---------------------------------------------------------------- the binned peak, property

_TEMPLATE = EvidenceBuilder(small_spec(levels="[2]", backends=("a",)))
_ROW = dict(next(_TEMPLATE.measured("a", level=0)))
ORIGINS = {("w", 0): 1000.25, ("w", 1): 1003.0}


@st.composite
def records(draw):
    n = draw(st.integers(1, 40))
    rows = []
    for i in range(n):
        level = draw(st.sampled_from([0, 1]))
        done = draw(st.booleans()) or draw(st.booleans())
        gaps = draw(st.lists(st.integers(0, 1_500_000), max_size=12))
        k1 = draw(st.sampled_from([1, 1, 2, 32]))  # the first chunk's tokens (`--stream-interval 32`: 32)
        ft = 1000.0 + draw(st.integers(0, 6_000_000)) / 1e6
        r = dict(_ROW, request_id=f"r-{i}", workload="w", level=level, bucket=draw(st.sampled_from([-1, 0, 1, 2])),
                 start=ft - 0.05, intended_start=ft - 0.05, first_byte=ft, first_token=ft, ttft=None, latency=None,
                 end=ft + sum(gaps) / 1e6 + 0.01, itl=[g / 1e6 for g in gaps], chunks=len(gaps) + 1,
                 output_tokens=len(gaps) + k1, tpot=None)
        if not done:
            r.update(outcome="failed", error="HTTP 500", status=500)
        rows.append(r)
    return rows


def _as_dict(bins: dict) -> dict:
    return {k: {i: int(v) for i, v in enumerate(a) if v} for k, a in bins.items()}


@settings(max_examples=60, deadline=None)
@given(records())
def test_the_binned_peak_is_a_per_token_loops(rows):
    """Property: a level's seconds of output tokens, counted a block at a time (the typed records
    `load_evidence` appends, `TableBuilder.add_records`) or a record at a time (`add`, of a dict
    or of a decoded record's dict, whose gaps are an array), are those
    a per-token loop over the measured completed records counts, level by level; so is the peak."""
    recs = [decode_line(RequestRecord.from_json(r).to_line()) for r in rows]
    blocked = TableBuilder(origins=ORIGINS)
    blocked.add_records(recs)
    by_row = TableBuilder(origins=ORIGINS).extend(rows)
    read_back = TableBuilder(origins=ORIGINS).extend(dict(r) for r in recs)  # a record's dict: its itl an array
    for t in (blocked.finish(), by_row.finish(), read_back.finish()):
        got = _as_dict(t.token_seconds or {})
        for key, origin in ORIGINS.items():
            ref = naive_token_seconds([r for r in rows if (r["workload"], r["level"]) == key], origin)
            assert got.get(key, {}) == {s: c for s, c in ref.items() if s >= 0}
            assert peaks.peak_tokens((t.token_seconds or {}).get(key)) == (max((c for s, c in ref.items() if s >= 0), default=None))
        # the first chunks' tokens as the judge re-reads them from the table (`first_chunks`: what
        # it takes back of a request it flags usage_mismatch) are those the loader counted
        assert t.first_chunks(np.arange(t.n)).tolist() == [max(1, r["output_tokens"] - len(r["itl"])) for r in rows]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 20), st.integers(0, 6)), max_size=30))
def test_peak_concurrency_is_a_naive_sweeps(pairs):
    """Property: the sorted sweep's peak is the most [start, end) holding one arrival's instant,
    ties included (whole seconds make many: one that ends as another starts has left)."""
    intervals = [(float(s), float(s + d)) for s, d in pairs]
    got = peaks.peak_concurrency(np.array([a for a, _ in intervals]), np.array([b for _, b in intervals]))
    assert got == (naive_concurrency(intervals) if intervals else None)


def test_a_block_with_a_gap_below_zero_counts_token_by_token():
    """Foreign evidence with a negative gap (cumulative gaps not ascending) is counted as the
    per-token loop counts it."""
    ts = peaks.TokenSeconds({("w", 0): 0.0})
    flat = np.array([900_000, -500_000, 700_000, 400_000], dtype=np.int64)
    ts.add_block(("w", 0), np.array([0.5, 2.0]), np.array([3, 1]), flat, np.array([0, 3]))
    # row 0: 0.5, 1.4, 0.9, 1.6 -> seconds 0, 1, 0, 1; row 1: 2.0, 2.4 -> 2, 2
    assert list(ts.finish()[("w", 0)][:3]) == [2, 2, 2]


def test_a_first_chunk_of_many_tokens_counts_them_all(tmp_path, capsys):
    """Every request's 64 tokens come in its one chunk (no ITL gap: the runner's `len(itl) ==
    output_tokens - k1`, k1 = 64). The peak second holds every token of the requests whose
    first token falls in it -- never below the level's mean output tok/s, as it read when only
    the first chunk's first token counted (1.00 against 8.53)."""
    spec = small_spec(levels="[2]", backends=("sim-fast",))
    b = EvidenceBuilder(spec)
    for rows in b.records.values():
        for r in rows:
            if r.get("first_token") is not None:
                r.update(itl=[], output_tokens=64, chunks=1, itl_source="usage", tpot=None, end=r["first_token"] + 0.001,
                         latency=r["first_token"] + 0.001 - r["start"])
    d = b.write(tmp_path / "run")
    lv = _level0(d)
    rows = [r for r in b.records["sim-fast"] if r["level"] == 0]
    ref = naive_token_seconds(rows, lv["measure_start"])
    assert lv["peak_output_tokens_per_s"] == max(ref.values()) == 64  # the requests are seconds apart
    (block,) = _bench(capsys, d)
    lines = dict(ln.split(":", 1) for ln in block.splitlines() if ":" in ln)
    mean = float(lines["Output token throughput (tok/s)"])
    peak = float(lines["Peak output token throughput (tok/s)"])
    assert peak == max(ref.values()) >= mean > 0, (peak, mean)


def test_a_record_spanning_years_costs_what_its_counted_seconds_do():
    """A record whose tokens span ~116 days, ending just after the level's origin (a clock that
    jumped; 5000 gaps of 2000 s, each a value a block takes): its one token inside the level's
    seconds is counted, without an edge for each of the ~10^7 seconds it crosses before them
    (a few hundred MB and seconds of work before, now a few MB)."""
    import tracemalloc

    origin = 1e7 + 1000.0
    gaps = [2000.0] * 5000
    r = dict(_ROW, request_id="r-far", workload="w", level=0, bucket=0, start=999.0, intended_start=999.0,
             first_byte=1000.0, first_token=origin - sum(gaps) + 0.5, end=origin + 1.0, ttft=None, latency=None,
             itl=gaps, chunks=len(gaps) + 1, output_tokens=len(gaps) + 1, tpot=None)
    rec = decode_line(RequestRecord.from_json(r).to_line())
    b = TableBuilder(origins={("w", 0): origin})
    tracemalloc.start()
    try:
        b.add_records([rec])
        t = b.finish()
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert _as_dict(t.token_seconds or {}) == {("w", 0): {0: 1}}
    assert peak < 20 << 20, peak


def test_a_peak_concurrency_column_is_the_highest_level_run_not_a_peak_figure(tmp_path, capsys):
    """"Peak concurrency" in a review's table is the highest concurrency level it ran, not bench
    serve's peak concurrent requests: it is not read as a Peak figure (no CB201 where the records'
    peak in flight differs from the level's number), while "Peak concurrent requests" still is."""
    spec = small_spec(levels="[2, 4]", backends=("a",), rules="require completed >= 0")
    d = EvidenceBuilder(spec).write(tmp_path / "run")
    spec_file = tmp_path / "spec.soak"
    spec_file.write_text(spec.canonical_text)
    p = tmp_path / "review.md"
    p.write_text("| Backend | Peak concurrency |\n|---|---|\n| a | 4 |\n")
    assert cli.main(["lint-claims", str(p), "--spec", str(spec_file), "--evidence", str(d)]) == 0, capsys.readouterr().out
    capsys.readouterr()
    p.write_text("| Backend | Peak concurrent requests |\n|---|---|\n| a | 4 |\n")
    assert cli.main(["lint-claims", str(p), "--spec", str(spec_file), "--evidence", str(d)]) == 1
    assert "peak concurrent requests 4" in capsys.readouterr().out


def test_the_run_summary_shows_the_peaks(known):
    """`soakspec run`'s printed per-level table shows the two peaks beside the means they top,
    and its --format json carries them -- the figures the bench block prints; a level without
    one reads "-" (as its other missing figures)."""
    from soakspec.report.runsummary import summary_json, summary_lines

    d, _, _, _ = known
    results = json.loads((d / "results.json").read_text())
    lines = summary_lines(results, d)
    at = next(i for i, ln in enumerate(lines) if ln.strip().startswith("backend") and "req/s" in ln)
    head = re.split(r"\s{2,}", lines[at].strip())
    assert head[head.index("tok/s") + 1] == "peak tok/s" and head[head.index("in flight") + 1] == "peak concurrent requests"
    row = re.split(r"\s{2,}", lines[at + 1].strip())
    assert (row[head.index("peak tok/s")], row[head.index("peak concurrent requests")]) == (str(PEAK_TOKENS), str(BURST))
    level = next(lv for lv in summary_json(results, d)["levels"] if lv["level"] == 0)
    assert (level["peak_output_tokens_per_s"], level["peak_concurrent_requests"]) == (PEAK_TOKENS, BURST)
    for lv in results["backends"][0]["levels"]:
        lv["peak_output_tokens_per_s"] = lv["peak_concurrent_requests"] = None
    row = re.split(r"\s{2,}", summary_lines(results, d)[at + 1].strip())
    assert row[head.index("peak tok/s")] == row[head.index("peak concurrent requests")] == "-"
