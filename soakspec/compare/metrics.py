"""What `soakspec compare` compares: each metric (`METRICS`, by name `BY_NAME`), how it is sampled
and which way is worse, the statistics that make its rows, and a multi-turn level's rows per turn
(`TURN_METRICS`). The rows themselves are `soakspec.compare.rows`.

Rows. Per matched (backend, level): first `ratio(errors)`, the share of its measured requests
that did not complete (the gate's `errors`: failed, timed out, rejected, disconnected) -- every
other row is over completed requests only and cannot see a server that fails a quarter of its
requests; then p50, p95 and p99 of ttft, itl, tpot and latency (per
completed measured request; itl: every inter-token gap, as the gate counts it), and the mean
over buckets of qps and output tokens/s (`throughput`) -- each computed with the gate's own
metric implementations (`soakspec.judge.registry`) and the one percentile of
`soakspec.judge.stats` (linear interpolation, type 7), over each run's records re-derived as the
gate re-derives them (`judge.joined.rederived`: a server's trace errors, usage that contradicts
the stream), so a compared number is the number the report and the gate show. A rule may ask for another percentile; it gets its own row.

From the send. At a level that declares max_concurrency (in both runs), p50, p95 and p99 of
sent_ttft and sent_latency follow latency's rows: TTFT and latency from the send, after the wait
for a slot -- the server's view, what vLLM's bench serve reports under --max-concurrency --
where ttft and latency run from the intended start and count the queue (the user's view). There
the two read apart: a queue that grew with the server unchanged is a ttft regression and no
change of sent_ttft; a server slower by what the queue got shorter is the reverse
(tests/test_compare_sent.py). Same statistics, same interval (the design-effect bootstrap), same
family. At an uncapped level sent_ttft is ttft less only the client's own lateness (closed loop:
equal), so its rows would say nothing the ttft rows do not, while each would widen every
interval of the comparison (Bonferroni: m rows, each at 1 - (1 - confidence) / m): they are not
made there, and a capped level's pair adds six rows to m. Nor where only one run declared a cap:
the cap itself changed, and a run read up front (`RunSamples.read(keep=False)`) keeps the sent_*
samples of its capped levels only -- 8 bytes a request (16 where not compact) it would hold
for nothing at every other level (with `from_send`, an open-loop level's too, for the check
below). An uncapped open-loop level's sent_* row is made for one purpose only, unshown and
outside the family: a failing ttft or latency rule's check from the send (compare/judging.py,
"Rules"; at a capped level that check's figure replays the slot queue on time, not sent_ttft). A rule on sent_ttft or sent_latency judges the capped
levels; with none, it is inconclusive and says so. Total token throughput has no row: with the workload held equal (or
the difference stated, compare/__init__.py, "Comparable runs"), prompt tokens per second are qps times the fixed
prompt, so its change is a weighted mix of the qps and throughput rows' -- one more row per
level to widen the family, and nothing new to say.

Turns. A multi-turn level (records with a `turn`: `multi_turn = true` chat) gets, after its
rows, p50 and p95 of ttft per user turn (`TURN_METRICS`) over the completed requests that sent
that turn -- what a multi-turn comparison (prefix caching on and off, a scheduler change) is
for, and what the level's rows mix across turns whose prompts differ by the whole history.
Where both runs cap the level (max_concurrency), p50 and p95 of sent_ttft follow each turn's
ttft rows, for the reason the level has sent_* rows ("From the send": a turn's queue and its
server time read apart); an uncapped level's turns get ttft's rows alone, as before.
Only the turns both runs sent are compared, the turns past the 20th as one ("turn 21+", as
results.json lists them); a turn only one run reached is said in a note, not a missing row (how
deep a level's sessions got depends on its length and the server's speed). Turn rows count in
the family-wise correction like any other; rules look at the level's rows only -- a rule's
`p95(ttft)` is the level's, and a deep turn short of samples must not make it inconclusive.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Literal

from soakspec.judge.summary import MAX_TURNS_LISTED


@dataclasses.dataclass(frozen=True)
class CompareMetric:
    """One compared metric: its registry name, how it is sampled and which way is worse."""

    name: str
    kind: Literal["distribution", "per_bucket", "proportion"]
    higher_is_worse: bool
    stats: tuple[str, ...]  # default statistics: "p50" ... or "mean", or "ratio" (a proportion)
    unit: str  # "s", "/s", "tok/s" or "ratio" (a share, shown as a percentage)
    per_request_samples: bool = False  # several correlated values per request: n = effective requests
    capped_only: bool = False  # rows only where both sides of the pair declare max_concurrency (module doc, "From the send")


METRICS: tuple[CompareMetric, ...] = (
    # the share of measured requests that did not complete (the gate's `errors`: failed, timed
    # out, rejected, disconnected). First: every other row is over completed requests only
    CompareMetric("errors", "proportion", True, ("ratio",), "ratio"),
    CompareMetric("ttft", "distribution", True, ("p50", "p95", "p99"), "s"),
    CompareMetric("itl", "distribution", True, ("p50", "p95", "p99"), "s", per_request_samples=True),
    CompareMetric("tpot", "distribution", True, ("p50", "p95", "p99"), "s"),
    CompareMetric("latency", "distribution", True, ("p50", "p95", "p99"), "s"),
    # from the send, after the wait for a slot (the server's view): a capped level's only
    CompareMetric("sent_ttft", "distribution", True, ("p50", "p95", "p99"), "s", capped_only=True),
    CompareMetric("sent_latency", "distribution", True, ("p50", "p95", "p99"), "s", capped_only=True),
    CompareMetric("qps", "per_bucket", False, ("mean",), "/s"),
    CompareMetric("throughput", "per_bucket", False, ("mean",), "tok/s"),
)
BY_NAME = {m.name: m for m in METRICS}
# a multi-turn level's rows per user turn (module doc, "Turns"): TTFT, what a conversation's
# growing history and the server's prefix cache change turn by turn; and where both runs cap
# the level (capped_only), sent_ttft, the same from the send, without the wait for a slot
TURN_METRICS: tuple[tuple[CompareMetric, tuple[str, ...]], ...] = ((BY_NAME["ttft"], ("p50", "p95")),
                                                                   (BY_NAME["sent_ttft"], ("p50", "p95")))
MAX_TURNS = MAX_TURNS_LISTED  # turns past it are one row group, numbered MAX_TURNS + 1 ("turn 21+"), as results.json lists them


def _q(stat: str) -> float | None:
    """The percentile of `p95` / `median`; None for `mean`."""
    if stat == "median":
        return 50.0
    m = re.fullmatch(r"p(\d+(?:\.\d+)?)", stat)
    return float(m.group(1)) if m else None
