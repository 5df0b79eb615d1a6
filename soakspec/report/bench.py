"""`--format bench`: each backend and level's figures in the layout of vLLM's `bench serve` (and
SGLang's `bench_serving`) result block, for reviewers who paste that block into a PR:

    ============ Serving Benchmark Result ============
    Tool:                                    soakspec
    Run:                                     <run id>
    Verdict:                                 PASS
    Backend:                                 sim-fast
    Level:                                   concurrency 4
    Successful requests:                     37
    Failed requests:                         0
    Benchmark duration (s):                  284.62
    Request throughput (req/s):              0.13
    Output token throughput (tok/s):         8.53
    Peak output token throughput (tok/s):    63.00
    Peak concurrent requests:                4.00
    Total token throughput (tok/s):          12.80
    ---------------Time to First Token----------------
    Mean TTFT (ms):                          40.87
    Median TTFT (ms):                        40.87
    P95 TTFT (ms):                           40.87
    ...
    ==================================================

One block per backend and level (bench serve runs one load; a soak runs several), the labels and
the `{:<40} {:<10.2f}` layout bench serve prints (vllm/benchmarks/serve.py), so a script that
reads bench serve's block reads this one. What differs, on purpose:

- `Verdict:` is the run's (PASS, FAIL, INCONCLUSIVE), stated once per block as the Markdown
  report states it once: a block pasted alone still says whether the run passed;
- the `Tool: soakspec` line says whose block it is: `soakspec lint-claims --evidence` checks a
  block that carries it against the evidence (`soakspec.claims.figures`) and leaves any other --
  bench serve's own, from another run -- alone. `Backend:` and `Level:` (the per-level table's
  label) say which figures it holds, so the check compares it with that level;
- the figures are soakspec's (`common.level_rows`, the per-level table's): requests/s and tokens/s
  are the level's buckets' weighted by wall time; TTFT and E2EL run from the request's intended
  start (`soakspec report`'s per-level table). At a level that declares `max_concurrency` bench
  serve's labels keep bench serve's meaning: there its clock starts at the send, after the wait for
  a slot, so `Mean TTFT (ms)` / `Mean E2EL (ms)` give results.json's `sent_ttft` / `sent_latency`,
  and two more sections, "Time to First Token (from intended start)" and "End-to-end Latency (from
  intended start)" (`Mean intended TTFT (ms)`, `Mean intended E2EL (ms)`), give soakspec's TTFT and
  latency with the wait counted. A script comparing this block with bench serve's compares like
  with like; the wait is where it is named. (Blocks printed before this put the intended-start
  figures under bench serve's labels and the send's in sections "(from the send)" of `sent TTFT`:
  `lint-claims` reads a block by the sections it has, so such a pasted block is checked as written);
- a figure the evidence has none of (no completed request, a run without streaming) is `n/a`,
  never a number. `Failed requests` is every measured request of the level that did not
  complete, whatever its kind (`common.not_completed`: bench serve counts every request that was
  not a success; the Markdown report's per-level table splits them by kind), and `Benchmark
  duration (s)` the level's measured wall time (results.json `levels[].wall_s`, from its
  measure_start to its measure_end, neither warmup nor drain): the time this block's rates
  divide by (each bucket's `qps` / tokens/s over its wall time, weighted by it). Those rates
  count what the server *delivered* in that window (requests that ended in a bucket), while
  `Successful requests` counts the level's measured requests by their start, so `Successful /
  duration` is not `Request throughput` where measured requests end after the window (a closed
  loop of 2-second answers measured for 4 s: 16 successful, 8 ended in the window, 2.00 req/s).
  bench serve differs on purpose: its duration runs from the first send to the last response
  (the drain included) and its throughput is successful / that duration (README, "Compared with
  other load generators").
- `Peak output token throughput (tok/s)` and `Peak concurrent requests`, where bench serve prints
  them (after the output throughput, both `{:<10.2f}`, so a count reads `4.00`): results.json's
  `peak_output_tokens_per_s` and `peak_concurrent_requests` of the level (`soakspec.judge.peaks`
  has the definitions). bench serve's over its successful requests, soakspec's over the level's
  measured requests that completed (the warm-up's, the failed ones' and the next level's are
  not counted, though the server held them too); the token bins are one-second bins as bench
  serve's, but counted from the level's `measure_start` rather than the first request's send,
  so the fullest second can differ by where the second boundaries fall; every token of a
  measured request counts, those after the measured window's end too, as bench serve counts its
  drain's. soakspec counts tokens, where bench serve counts chunk events (a chunk one token): a
  first chunk's tokens at the first token, a later chunk of k tokens spread over the gap before
  it as its ITL gaps place them (README, "How a run works"), so with several tokens a chunk
  soakspec's peak reads higher than bench serve's, and can put some of a chunk's tokens a second
  earlier. Concurrency is bench serve's exact sweep over [start, end) (older vLLM took the
  fullest one-second bin, which reads higher). Results from before soakspec recorded them have
  no such field: their blocks have no Peak lines, as they were printed then, and `lint-claims`
  flags a Peak line in such a block as added by hand.

Percentiles: Mean and Median always, then the listed percentiles other than the median
(`--percentiles`, default p95 and p99; bench serve's default is P99 alone).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from soakspec.report import common as C

WIDTH = 50
_HEAD = " Serving Benchmark Result "
# (results.json metric, bench serve's name, its section header) of a level with no cap, and of a
# capped level: bench serve's labels hold the time from the send there (its clock), and the time
# from the intended start is a section of its own (`intended`: what `lint-claims` reads it as)
_SECTIONS = (
    ("ttft", "TTFT", "Time to First Token"),
    ("tpot", "TPOT", "Time per Output Token (excl. 1st token)"),
    ("itl", "ITL", "Inter-token Latency"),
    ("latency", "E2EL", "End-to-end Latency"),
)
_CAPPED_SECTIONS = (
    ("sent_ttft", "TTFT", "Time to First Token"),
    ("tpot", "TPOT", "Time per Output Token (excl. 1st token)"),
    ("itl", "ITL", "Inter-token Latency"),
    ("sent_latency", "E2EL", "End-to-end Latency"),
    ("ttft", "intended TTFT", "Time to First Token (from intended start)"),
    ("latency", "intended E2EL", "End-to-end Latency (from intended start)"),
)

# (results.json level field, bench serve's label), in bench serve's order
_PEAKS = (
    ("peak_output_tokens_per_s", "Peak output token throughput (tok/s):"),
    ("peak_concurrent_requests", "Peak concurrent requests:"),
)


def _line(label: str, value: Any, fmt: str = "{:<10.2f}") -> str:
    v = C.num(value) if fmt != "{:<10}" else value
    shown = "n/a" if v is None else fmt.format(v)
    return f"{label:<40} {shown}".rstrip()


def _section(stats: Mapping[str, Any] | None, name: str, header: str, percentiles: Sequence[str]) -> list[str]:
    stats = stats or {}

    def ms(key: str) -> float | None:  # results.json's seconds, as bench serve's milliseconds
        v = C.num(stats.get(key))
        return None if v is None else v * 1000

    out = [f"{header:-^{WIDTH}}", _line(f"Mean {name} (ms):", ms("mean")), _line(f"Median {name} (ms):", ms("p50"))]
    out += [_line(f"P{p[1:]} {name} (ms):", ms(p)) for p in percentiles if p != "p50"]
    return out


def block(row: C.LevelRow, level: Mapping[str, Any], run_id: str | None, outcome: str | None,
          percentiles: Sequence[str]) -> list[str]:
    """One backend and level as bench serve's result block (lines, no trailing newline)."""
    completed = row.requests.get("completed") if isinstance(row.requests, Mapping) else None
    lines = [f"{_HEAD:=^{WIDTH}}", _line("Tool:", "soakspec", "{:<10}")]
    if run_id:
        lines.append(_line("Run:", C.one_line(run_id), "{:<10}"))
    if outcome:
        lines.append(_line("Verdict:", C.one_line(outcome), "{:<10}"))
    lines += [
        _line("Backend:", row.backend, "{:<10}"),
        _line("Level:", row.label, "{:<10}"),
        _line("Successful requests:", completed if isinstance(completed, int) and not isinstance(completed, bool) else None, "{:<10}"),
        _line("Failed requests:", C.not_completed(row.requests), "{:<10}"),
        _line("Benchmark duration (s):", level.get("wall_s")),
        _line("Request throughput (req/s):", row.qps),
        _line("Output token throughput (tok/s):", row.tokens_per_s),
    ]
    # results from before the peaks were recorded have neither field: no line, as printed then
    lines += [_line(label, level.get(key)) for key, label in _PEAKS if key in level]
    lines.append(_line("Total token throughput (tok/s):", row.total_tokens_per_s))
    capped = any(isinstance(level.get(m), Mapping) for m in ("sent_ttft", "sent_latency"))  # else null: no cap
    for metric, name, header in _CAPPED_SECTIONS if capped else _SECTIONS:
        stats = getattr(row, metric) if hasattr(row, metric) else level.get(metric)
        lines += _section(stats if isinstance(stats, Mapping) else None, name, header, percentiles)
    lines.append("=" * WIDTH)
    return lines


def render(verdict: Any, results: Mapping[str, Any], meta: Mapping[str, Any], spec: Any,
           percentiles: Sequence[str] = C.DEFAULT_PERCENTILES) -> str:
    run_id = meta.get("run_id") or getattr(verdict, "run_id", None)
    levels = [lv for _, lv, _ in C.levels_with_buckets(results)]
    out: list[str] = []
    for row, lv in zip(C.level_rows(results), levels):
        if out:
            out.append("")
        out += block(row, lv, run_id, getattr(verdict, "outcome", None), percentiles)
    return "\n".join(out) + "\n" if out else "No level measured: nothing to show in bench serve's layout.\n"
