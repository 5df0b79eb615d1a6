"""An open-loop rate sweep (README "Sweeps") against a real vLLM that soakspec launches (CPU
build, tiny model), its probes checked against vLLM's own /metrics:

- the search found a figure (`max_sustainable_rate`, or "at least X" where X is the grid's top
  or the next level could not be judged), and every probe is in results.json with its status;
- the runner's own judgement of each probe (right after it, `tail_pending`) is the gate's
  re-judgement with every client sample: no "runner's own judgement ... differs" note (before
  the runner judged each probe's client health, it held a 6 rps probe the gate found the
  client saturated in, and this test failed there);
- every probe's schedule was proven and its load generator healthy -- or, where the lane's 2
  cores (vLLM's engine takes them) saturated the client, that probe is INCONCLUSIVE with the
  client's reason, never a FAIL, the runner did not count it as holding, and the run's
  client_healthy names it (exit 3, not 1). The test prints which; it FAILs only on a probe
  judged against the server wrongly, and is skipped (not passed) when the client was saturated
  in every probe, as then nothing of the server was measured;
- vLLM's view: for each probe, `vllm:request_success_total` between the scrape answered
  before it started and the first after its drain is at least the requests soakspec sent in
  it (warmup and measured) that completed, and at most every request it sent plus the other
  requests (a neighbouring probe's, the pre-flight) in flight between the two scrapes --
  exactly them when none was and every one completed; over the run exactly every request sent
  (probes and pre-flight) where every one completed, else between the completed and all. Every
  request of a probe that held completed; an overloaded probe's may time out (that is the
  server's answer at that rate, which the search judged, not a wrong judgement); and
  at the found level vLLM's own TTFT histogram has more than half its first tokens under the
  rule's threshold (vLLM times from the request's arrival at its API server, so its TTFT is
  at most the client's: a client p50 under the threshold is one of vLLM's too).

`REALSERVER_KEEP=DIR` keeps a copy of the run's evidence and vLLM's final /metrics there.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from lane import LANE_CLIENT, run_launched, vllm_head

from soakspec.evidence.record import iter_records

pytestmark = pytest.mark.realserver

# 64 tokens a request: at 4 rps vLLM's CPU engine answers the first token in ~100 ms (the
# median; the lane's 2 cores shared with the client); at 12 rps the median TTFT was 249 and
# 324 ms in two runs, so the search ends inside the grid -- or reads "at least X" where the
# level above X was INCONCLUSIVE (or X is 18 rps, the grid's top), which the test accepts: the
# claim is then only a lower bound. From ~8 rps up the client was saturated in some runs
# (vLLM's engine takes the cores): those probes are INCONCLUSIVE, the search goes on below
# them. 2 rps is the lowest: 8 samples in 4 s. 9 levels, 2..18 rps: at most 5 probes of 4.5 s
# each (warmup and window; ~60-100 s with drains, judging and vLLM's start and stop), under
# max_wall whatever the search does.
THRESHOLD_S = 0.25  # one of vLLM's TTFT histogram bounds
RULE = f"p50(ttft) < {THRESHOLD_S * 1000:g}ms per level"
# The lane's lenient client thresholds (lane.LANE_CLIENT: vLLM's engine takes the 2 cores) but
# for the schedule lag: an open loop's TTFT counts from the intended start, so the lag the lane
# lets pass (p99 up to 1 s) is in the rule's TTFT. With it, a sweep's FAILs were the client's:
# 12 rps FAILed at p50(ttft) 304 ms with a schedule lag of p50 159 ms, p90 432 ms, while vLLM's
# own histogram had every one of that window's 25 first tokens within 250 ms. At 100 ms, a probe
# the client sent that late is INCONCLUSIVE, not a FAIL of the server.
SWEEP_CLIENT = LANE_CLIENT.replace("client_schedule_lag = 1s", "client_schedule_lag = 100ms")
assert SWEEP_CLIENT != LANE_CLIENT
SWEEP_SPEC = vllm_head("an open-loop rate sweep", name="vllm-sweep") + f"""workload "sweep" {{
  endpoint = completions
  prompt_words = 8
  max_tokens = 64
  ignore_eos = true
  load {{
    mode = open
    rate = [2rps, 18rps]
    rate_step = 2rps
    search = bisect
    max_wall = 60s
  }}
  warmup = 500ms
  duration = 4s
  bucket = 1s
  deadline = 20s
  follow_up = false
}}
gate {{
{SWEEP_CLIENT}  require completed_run
  require {RULE}
}}
"""


def _scrapes(out: Path) -> list[dict]:
    return [s for s in (json.loads(line) for line in (out / "backends" / "vllm" / "metrics.jsonl").read_text().splitlines() if line)
            if s["ok"]]


def _counter(scrape: dict, family: str) -> float:
    return scrape["families"].get(family, {}).get("value", 0.0)


def _before(scrapes: list[dict], t: float) -> dict | None:
    """The last scrape answered by `t` (its start plus its time: the counters at or before `t`)."""
    done = [s for s in scrapes if s["t"] + s["seconds"] <= t]
    return done[-1] if done else None


def _after(scrapes: list[dict], t: float) -> dict | None:
    """The first scrape started at or after `t` (the counters at or after `t`)."""
    return next((s for s in scrapes if s["t"] >= t), None)


def _below(hist: dict, bound: float) -> float:
    return next(c for le, c in hist["buckets"] if le is not None and abs(le - bound) < 1e-9)


def test_an_open_loop_rate_sweep_finds_a_rate_vllms_own_counters_agree_with(lane, tmp_path):
    (tmp_path / "spec.soak").write_text(SWEEP_SPEC)
    proc, out = run_launched(lane, tmp_path, tmp_path / "spec.soak", timeout=300)
    sys.stderr.write("".join(line + "\n" for line in proc.stderr.splitlines() if "sweep:" in line))
    assert proc.returncode in (0, 3), proc.stdout[-3000:] + proc.stderr[-3000:]
    verdict = json.loads(proc.stdout)
    results = json.loads((out / "results.json").read_text())
    manifest = json.loads((out / "manifest.json").read_text())
    (entry,) = manifest["backends"]
    rules = {r["rule"]: r for r in verdict["rules"]}
    (sweep,) = results["sweep"]
    line = rules["sweep rate (bisect)"]
    sys.stderr.write(f"{line['rule']}: {line['status']} -- {line['message']}\n")

    # the runner's own judgement of every probe is the gate's re-judgement
    assert sweep["runner_disagrees"] is False and "judgement of a probe differs" not in line["message"], line
    probes = sweep["probes"]
    assert [p["level"] for p in probes] == [lv["index"] for lv in entry["levels"]] == list(range(len(probes)))
    assert [p["value"] for p in probes] == [p["value"] for p in entry["sweep"]["probes"]]
    assert 2 <= len(probes) <= 5 and not sweep["bounded_by_wall_time"]
    for p in probes:
        assert p["runner_passed"] == p["passed"], p
        assert p["status"] in ("pass", "fail", "inconclusive") and p["passed"] == (p["status"] == "pass"), p

    # every probe's schedule proven and its client healthy -- or INCONCLUSIVE by the client, never a FAIL
    (healthy,) = [r for r in verdict["rules"] if r["metric"] == "client_healthy"]
    sys.stderr.write(f"client_healthy: {healthy['status']} -- {healthy['message'][:600]}\n")
    by_client = [p for p in probes if p.get("client") or p.get("schedule") != "proven"]
    judged = [p for p in probes if p not in by_client]
    for p in probes:
        sys.stderr.write(f"probe {p['level']}: {p['value']:g} rps {p['status'].upper()} (schedule {p.get('schedule')}"
                         f"{', client: ' + p['client'][:200] if p.get('client') else ''}) -- {p['why'][:200]}\n")
    for p in by_client:
        assert p["status"] == "inconclusive" and "INCONCLUSIVE" in entry["sweep"]["probes"][p["level"]]["why"], p
        named = [healthy["message"]] + [d["message"] for d in healthy["details"]]  # the message names the first
        assert any(f"probe at {p['value']:g} rps is INCONCLUSIVE in the search" in m for m in named), healthy
    if by_client:
        sys.stderr.write(f"{len(by_client)} of {len(probes)} probes INCONCLUSIVE by the load generator on this machine "
                         f"(not the server's failure): the run is INCONCLUSIVE (exit {proc.returncode})\n")
        assert healthy["status"] == "inconclusive" and proc.returncode == 3, (healthy, proc.returncode)
    else:
        assert healthy["status"] == "pass" and f"it sent on its schedule in {len(probes)} open-loop level" in healthy["message"], healthy
        assert proc.returncode == 0, proc.stdout[-3000:]
    if not judged:
        pytest.skip("the load generator was saturated in every probe on this machine: nothing of the server was measured")

    # the figure, or a lower bound of it, with the probes' statuses in results.json
    found = sweep["result"]
    assert found is not None, line
    assert results["figures"]["max_sustainable_rate"] == found == entry["sweep"]["result"]
    top = [p for p in probes if p["passed"] and p["value"] == found]
    assert top and all(not p["passed"] for p in probes if p["value"] > found), probes
    nxt = found + 2
    failed_next = [p for p in probes if p["value"] == nxt and p["status"] == "fail"]
    assert (sweep["lower_bound"] is None) == bool(failed_next), sweep
    sys.stderr.write(f"max_sustainable_rate = {'at least ' if sweep['lower_bound'] else ''}{found:g} rps"
                     f"{' (' + sweep['lower_bound'] + ')' if sweep['lower_bound'] else ''}\n")
    assert line["status"] == "pass" and line["observed"] == found

    # vLLM's own counters: every request soakspec sent in each probe, none more
    scrapes = _scrapes(out)
    rows = [dict(r) for _, r in iter_records(out / "backends" / "vllm" / "requests.jsonl.gz")]
    preflight = entry.get("preflight") or []
    levels = entry["levels"]
    for lv in levels:
        sent = [r for r in rows if r["level"] == lv["index"]]
        a, b = _before(scrapes, lv["started_at"]), _after(scrapes, lv["drained_at"])
        assert a is not None and b is not None, (lv["index"], lv["started_at"], lv["drained_at"])
        counted = _counter(b, "vllm:request_success_total") - _counter(a, "vllm:request_success_total")
        # the requests of the neighbouring probes and the pre-flight in flight between the two
        # scrapes: vLLM may have counted them in either
        others = [r for r in rows + [p["record"] for p in preflight]
                  if r["level"] != lv["index"] and r["end"] >= a["t"] and r["start"] <= b["t"] + b["seconds"]]
        sys.stderr.write(f"probe {lv['index']} ({lv['rate']:g} rps): soakspec sent {len(sent)}, vLLM counted {counted:g} "
                         f"between the scrapes around it ({len(others)} other requests in flight then)\n")
        done = [r for r in sent if r["outcome"] == "completed"]
        assert len(sent) >= 2, lv["index"]
        if probes[lv["index"]]["passed"]:  # a probe that held: every request answered
            assert len(done) == len(sent), (lv["index"], [r["outcome"] for r in sent if r["outcome"] != "completed"])
        assert len(done) <= counted <= len(sent) + len(others), (lv["index"], counted, len(done), len(sent), len(others))
    success = sum(float(ln.rsplit(" ", 1)[1]) for ln in (tmp_path / "metrics.txt").read_text().splitlines()
                  if ln.startswith("vllm:request_success_total{"))
    sys.stderr.write(f"vllm:request_success_total = {success:g}; soakspec sent {len(rows)} in {len(levels)} probes "
                     f"+ {len(preflight)} pre-flight\n")
    completed = sum(r["outcome"] == "completed" for r in rows + [p["record"] for p in preflight])
    if completed == len(rows) + len(preflight):
        assert success == completed
    else:  # a request that timed out may or may not have finished in vLLM
        assert completed <= success <= len(rows) + len(preflight), (success, completed, len(rows) + len(preflight))

    # vLLM's own TTFT over each probe's measured window (the first scrape in it to the last):
    # at the found level more than half its first tokens under the threshold, as the rule's PASS
    # says of the client's (printed for every probe; only the found level's is implied)
    seen = {}
    for lv in levels:
        a, b = _after(scrapes, lv["measure_start"]), _before(scrapes, lv["measure_end"])
        assert a is not None and b is not None, (f"probe {lv['index']}: no /metrics scrape answered within its measured "
                                                 f"window [{lv['measure_start']}, {lv['measure_end']}]", len(scrapes))
        ha, hb = (s["families"]["vllm:time_to_first_token_seconds"] for s in (a, b))
        seen[lv["index"]] = n, under = hb["count"] - ha["count"], _below(hb, THRESHOLD_S) - _below(ha, THRESHOLD_S)
        sys.stderr.write(f"probe {lv['index']} ({lv['rate']:g} rps): vLLM's own TTFT histogram has {under:g} of {n:g} first "
                         f"tokens within {THRESHOLD_S * 1000:g} ms; the rule {RULE}: {probes[lv['index']]['status'].upper()}\n")
    n, under = seen[top[0]["level"]]
    assert n >= 3 and under / n > 0.5, (found, under, n)
