"""The judge's single-pass, streaming reading of an evidence directory judges exactly as a
naive reader does: every record and trace decoded into plain dicts, every server.log read
whole into memory, verification run on its own first (the reference, written here).

`load_evidence` now hashes, decodes and validates each JSONL file in one pass (rows handed
over by `verify_evidence(rows=...)`), compacts rows as they arrive and streams server.log
from the run's start offset; the property: same verdict, same results.json, on generated
evidence with failures, missing traces, an offset into the log, undecodable log bytes and
cut-off lines."""

from __future__ import annotations

import dataclasses
import gzip
import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from soakspec.evidence import layout
from soakspec.evidence.io import iter_jsonl, read_json, sha256_file
from soakspec.evidence.record import iter_records
from soakspec.evidence.serverlog import read_log
import soakspec.judge.table as table_mod
from soakspec.judge import measures, stats
from soakspec.judge.evidence import BackendEvidence, Evidence, StoredTraces, _integrity, load_evidence
from soakspec.judge.joined import join
from soakspec.judge.judge import judge_run
from soakspec.judge.summary import summarize_run
from soakspec.judge.testing import EvidenceBuilder, small_spec, spec_from_text

SIM_SPEC = """\
soak "streamed" {}
backend "s" {
  sim {
    slots = 4
  }
  runtime {
    label = "host-staged"
  }
}
workload "w" {
  max_tokens = 8
  load {
    mode = closed
    concurrency = [2]
  }
  duration = 2m
  bucket = 1m
  deadline = 30s
}
gate {
  require failed == 0
  require trace_coverage >= 90%
  require p95(ttft) < 2s
  require p99(itl) < 1s
}
"""


def naive_load(root: Path) -> Evidence:
    """The reference: verify first, then decode every line again into plain dicts and read
    each server.log whole -- everything in memory, nothing compacted or streamed."""
    manifest = read_json(root / layout.MANIFEST)
    integrity = _integrity(root)
    backends = []
    for entry in manifest["backends"]:
        safe = layout.safe_name(entry["name"])
        d = root / layout.BACKENDS / safe
        rel = f"{layout.BACKENDS}/{safe}/"
        problems: list[str] = []
        partial: list[str] = []

        def rows(fname: str, required: bool) -> list:
            if not (d / fname).is_file():
                if required:
                    problems.append(f"{rel}{fname}: missing")
                return []
            bad: list = []
            if fname == layout.REQUESTS:  # the record type, each copied into a plain dict
                out = [dict(r) for _, r in iter_records(d / fname, bad)]
            else:
                out = [r for _, r in iter_jsonl(d / fname, bad)]
            for line, message in bad:
                if message is None:
                    partial.append(rel + fname)
                else:
                    problems.append(f"{rel}{fname}:{line}: {message}")
            return out

        from soakspec.judge.evidence import request_problem

        records = []
        for i, row in enumerate(rows(layout.REQUESTS, True), start=1):
            why = request_problem(row)
            if why:
                problems.append(f"{rel}{layout.REQUESTS}: record {i}: {why}")
            else:
                records.append(row)
        traces = [r for r in rows(layout.TRACES, False) if isinstance(r, dict)]
        telemetry = [r for r in rows(layout.TELEMETRY, False) if isinstance(r, dict)]
        metrics = [r for r in rows(layout.METRICS, False) if isinstance(r, dict)]  # the server's scraped /metrics
        lpath = layout.server_log_file(d)  # server.log.gz (or a killed run's server.log), read whole
        log = read_log(lpath).decode("utf-8", "replace") if lpath is not None else None
        fpath = d / layout.FOLLOWUP
        followup = read_json(fpath) if fpath.is_file() else None
        backends.append(BackendEvidence(entry["name"], safe, entry, tuple(records), tuple(traces), tuple(telemetry),
                                        followup, tuple(partial), tuple(problems), server_log=log, metrics=tuple(metrics)))
    return Evidence(manifest, tuple(backends), integrity, sha256_file(root / layout.MANIFEST), str(root))


def _figures(spec, ev: Evidence) -> tuple[dict, dict]:
    run = join(spec, ev)
    return judge_run(run).to_json(), json.loads(json.dumps(summarize_run(run), default=str))


def _same(spec, root: Path, chunked: bool = False) -> None:
    streamed, reference = load_evidence(root), naive_load(root)
    assert [b.problems for b in streamed.backends] == [b.problems for b in reference.backends]
    assert [b.partial_tail for b in streamed.backends] == [b.partial_tail for b in reference.backends]
    assert all(b.server_log is None for b in streamed.backends)  # never held: streamed from disk
    assert streamed.integrity == reference.integrity
    with pytest.MonkeyPatch.context() as mp:
        if chunked:  # every selection's per-request percentiles read as a day's are: a few rows at a time
            mp.setattr(measures, "CHUNKED_ROWS", 1)
            mp.setattr(table_mod, "SCAN_CHUNK", 3)
            mp.setattr(stats, "SELECT_GATHER", 2)
        v1, s1 = _figures(spec, streamed)
    v2, s2 = _figures(spec, reference)
    assert v1 == v2
    assert s1 == s2


SPECS = {
    "url, jsonl traces": lambda: small_spec("require failed == 0\nrequire trace_coverage >= 90%\nrequire p95(ttft) < 2s\n"
                                            "require p99(itl) < 1s\nrequire p50(latency) < 1s\n"
                                            "require p99(tpot) < 1s per bucket", levels="[2]", duration="3m"),
    "sim, traces in server.log": lambda: spec_from_text(SIM_SPEC),
}


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(kind=st.sampled_from(sorted(SPECS)), failures=st.lists(st.integers(0, 40), max_size=4),
       untraced=st.lists(st.integers(0, 40), max_size=4), offset=st.sampled_from([0, None]),
       garbage=st.booleans(), cut=st.sampled_from([None, layout.REQUESTS, layout.TRACES]), per_bucket=st.integers(2, 9),
       chunked=st.booleans())
def test_streaming_judge_equals_naive_reference(tmp_path_factory, kind, failures, untraced, offset, garbage, cut, per_bucket,
                                                chunked):
    spec = SPECS[kind]()
    b = EvidenceBuilder(spec, per_bucket=per_bucket)
    name = spec.backends[0].name
    measured = list(b.measured(name))
    for i in failures:
        b.set_outcome(measured[i % len(measured)], "failed", "boom", 500)
    for i in untraced:
        b.untrace(measured[i % len(measured)]["request_id"], name)
    log = b.log_of(name)
    head = "old run line\n\xff\xfe not utf-8\n" if garbage else "old run line\n"
    if offset is None:  # the run started after an older run's lines: only what follows counts
        b.server_logs[name] = head + log
        b.entry(name)["server_log_offset"] = len(head.encode("latin-1" if garbage else "utf-8"))
    elif garbage:
        b.server_logs[name] = log + "tail \udcff?\n".encode("utf-8", "surrogateescape").decode("utf-8", "replace")
    root = b.write(tmp_path_factory.mktemp("run") / "ev")
    if garbage:  # real undecodable bytes on disk, then re-hash as a run would have
        p = root / layout.BACKENDS / layout.safe_name(name) / layout.SERVER_LOG_GZ
        data = read_log(p).replace("\xff\xfe".encode("utf-8"), b"\xff\xfe")
        p.write_bytes(gzip.compress(data + b"late \xc3 line\n"))
        if offset is None:
            b.entry(name)["server_log_offset"] = len(b"old run line\n\xff\xfe not utf-8\n")
        _rehash(root, b)
    if cut is not None:
        p = root / layout.BACKENDS / layout.safe_name(name) / cut
        with open(p, "ab") as fh:  # a line cut mid-write (requests: in a gzip member cut before its trailer)
            fh.write(gzip.compress(b'{"request_id": "cut-off')[:-4] if cut in (layout.REQUESTS, layout.TRACES) else b'{"request_id": "cut-off')
    _same(spec, root, chunked)


def _rehash(root: Path, b: EvidenceBuilder) -> None:
    """Recompute the manifest's hashes (and the entry's offset) after an edit on disk."""
    from soakspec.evidence.manifest import write_manifest
    from soakspec.evidence.verify import finalize_artifacts

    m = read_json(root / layout.MANIFEST)
    for e in m["backends"]:
        e.update({k: v for k, v in b.entry(e["name"]).items() if k == "server_log_offset"})
    m["artifacts"] = {}
    (root / layout.RESULTS).unlink()
    (root / layout.VERDICT).unlink()
    m["artifacts"] = finalize_artifacts(root)
    write_manifest(root, m)


def test_a_server_log_is_not_held_in_memory(tmp_path):
    spec = spec_from_text(SIM_SPEC)
    root = EvidenceBuilder(spec).write(tmp_path / "ev")
    ev = load_evidence(root)
    assert ev.backends[0].server_log is None
    assert ev.backends[0].server_log_path is not None and Path(ev.backends[0].server_log_path).is_file()
    # its stored trace rows are not held: their claims are read again from the file if some
    # record goes unmatched (the judge re-matches from the log)
    claims = ev.backends[0].traces
    assert isinstance(claims, StoredTraces) and claims.on_disk
    assert Path(claims.path).name == layout.TRACES and Path(claims.path).is_file()
    full = claims.rows()
    assert full and list(claims.matched_ids()) == [t["request_id"] for t in full if t.get("matched") is True]
    _same(spec, root)
    # the log's traces were matched from the file: trace coverage is complete
    v, _ = _figures(spec, ev)
    cov = next(r for r in v["rules"] if "trace_coverage" in r["text"])
    assert cov["status"] == "pass", cov


@dataclasses.dataclass
class _Counted:
    n: int = 0


def test_each_jsonl_file_is_decoded_once(tmp_path, monkeypatch):
    """One pass: verification hands its decoded rows to the judge, which does not read again."""
    from soakspec.evidence import io

    spec = spec_from_text(SIM_SPEC)
    root = EvidenceBuilder(spec).with_client().write(tmp_path / "ev")
    seen: dict[str, int] = {}

    def counting(real):
        def read(path, *a, **k):  # every JSONL reader (lines, blocks, typed records) opens its file here
            seen[Path(path).name] = seen.get(Path(path).name, 0) + 1
            return real(path, *a, **k)
        return read

    monkeypatch.setattr(io, "iter_raw_lines", counting(io.iter_raw_lines))
    monkeypatch.setattr(io, "iter_raw_blocks", counting(io.iter_raw_blocks))
    load_evidence(root)
    # buckets.jsonl: verified (the judge does not read it); metrics.jsonl and client.jsonl once too
    assert seen == {layout.REQUESTS: 1, layout.TRACES: 1, layout.TELEMETRY: 1, layout.BUCKETS: 1, layout.METRICS: 1, layout.CLIENT: 1}


def test_a_whole_run_read_a_few_rows_at_a_time_gets_the_same_verdict(monkeypatch):
    """A day's ttft, latency and tpot are read a chunk of requests at a time for a percentile and
    for the count beyond a threshold (measures.CHUNKED_ROWS: never held at once). Thresholds
    placed on the values themselves -- where the point estimate passes but too many samples lie
    beyond for the confidence, where it passes, where it fails -- get, rule by rule, the verdict
    (figures and messages) the values held at once give."""
    import random

    rng = random.Random(7)
    base = small_spec(levels="[2, 4]", duration="4m")
    b = EvidenceBuilder(base, per_bucket=80)
    recs = list(b.measured("a"))
    for r in recs:
        ttft = rng.lognormvariate(-2.0, 0.5)
        gaps = [rng.lognormvariate(-4.0, 0.3) for _ in r["itl"]]
        r.update(ttft=ttft, first_token=r["start"] + ttft, itl=gaps, tpot=sum(gaps) / max(1, len(gaps)),
                 latency=ttft + sum(gaps), end=r["start"] + ttft + sum(gaps))
    ttfts = sorted(r["ttft"] for r in recs)
    lats = sorted(r["latency"] for r in recs)
    at = lambda xs, f: xs[int(len(xs) * f)]
    rules = (f"require p95(ttft) < {at(ttfts, 0.955) * 1e3:.3f}ms\nrequire p95(ttft) < {at(ttfts, 0.999) * 1e3:.3f}ms\n"
             f"require p50(ttft) < {at(ttfts, 0.3) * 1e3:.3f}ms\nrequire p90(latency) <= {at(lats, 0.93) * 1e3:.3f}ms\n"
             f"require p10(latency) > {at(lats, 0.05) * 1e3:.3f}ms\nrequire p99(tpot) < 1s\nrequire p50(tpot) >= 1ms")
    spec = small_spec(rules, levels="[2, 4]", duration="4m")
    b.spec = spec
    ev = b.build()
    run = join(spec, ev)
    want, want_summary = judge_run(run).to_json(), summarize_run(run)
    monkeypatch.setattr(measures, "CHUNKED_ROWS", 1)
    monkeypatch.setattr(table_mod, "SCAN_CHUNK", 7)
    monkeypatch.setattr(stats, "SELECT_GATHER", 5)
    read = []  # how many rows each read of per-request values took
    values = measures.PerRequest.values
    monkeypatch.setattr(measures.PerRequest, "values", lambda self, records: read.append(len(records)) or values(self, records))
    run = join(spec, ev)
    got = judge_run(run).to_json()
    assert got == want
    assert {"pass", "fail", "inconclusive"} <= {r["status"] for r in got["rules"]}
    read.clear()
    got_summary = summarize_run(run)
    # results.json's ttft / latency / tpot (count, p50/p95/p99, mean, min, max) the same, bit for
    # bit, every level's values read a chunk of rows at a time
    assert got_summary == want_summary
    assert read and max(read) <= 7
