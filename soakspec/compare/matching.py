"""How `soakspec compare` pairs two runs: backends by name, levels by what they are (`_identity`),
what is left unpaired (`Unpaired`) and what the new run lacks (`_lacking`), and the notes on a
paired backend reached by another network path or a paired level warmed up otherwise.

Matching. Backends are matched by name; when the two runs have no backend name in common and
each has exactly one backend, those two are paired (a renamed backend, said in a note). Levels
are paired by what they are, never by their position: within a workload, a named phase by its
name (a phase whose load differs between the runs is still compared, and the row says so),
any other level by its load -- mode, concurrency, rate, batch size, a ramp's or a replay's
shape, a count-bounded level's `requests_per_level` (it pairs only with a level of the same
count, never with a timed one): what results.json names it by (`concurrency 8`, `rate 2 rps`,
`concurrency 8, 100 requests`). A sweep's probes run in
the order its search took, and two searches take different paths (1, 12, 6, 3 ... against
1, 16, 8 ...): probe k of one run and probe k of the other are different loads, and only the
loads both probed are compared. A load a workload ran more than once pairs its k-th run in the
base with its k-th in the new run. A level with no counterpart is listed as unpaired
(`Comparison.unpaired`, "only in the base run" / "only in the new run"); it has no rows, does
not count in the family-wise correction, and no rule looks at it. What the new run lacks makes
the comparison INCONCLUSIVE (`_lacking`, in `Comparison.reasons`): a backend only the base run
has, and a level only the base run has unless the backend's levels are a sweep's probes (a
search's path differs run to run by design). What only the new run has is new coverage.
Two sweeps compare their figure, the highest load that held, too (`soakspec.compare.sweep`:
`Comparison.sweeps`, decided within the searches' step; a drop beyond it FAILs the comparison,
an INCONCLUSIVE probe in either run makes it INCONCLUSIVE).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from soakspec.plan import shape_identity
from soakspec.units import format_duration
from soakspec.compare.samples import BackendSamples, LevelSamples


@dataclasses.dataclass(frozen=True)
class Unpaired:
    """A level of one run that the other run has no level of the same load (or phase) for."""

    side: Literal["base", "new"]  # the run it is in
    backend: str  # that run's backend name
    workload: str
    level: int  # its index in that run
    label: str  # as results.json names it

    def describe(self) -> str:
        other = "new" if self.side == "base" else "base"
        return (f"{self.backend} · {self.label} (level {self.level} of {self.workload}): only in the {self.side} run, "
                f"no level of this load in the {other} run")

    def to_json(self) -> dict[str, Any]:
        return {"side": self.side, "backend": self.backend, "workload": self.workload, "level": self.level,
                "label": self.label, "message": self.describe()}


def _pairs(base: Sequence[BackendSamples], new: Sequence[BackendSamples], notes: list[str]) -> list[tuple[BackendSamples, BackendSamples]]:
    by_new = {b.name: b for b in new}
    pairs = [(b, by_new[b.name]) for b in base if b.name in by_new]
    if not pairs and len(base) == 1 and len(new) == 1:
        notes.append(f"no backend name in common: comparing base {base[0].name!r} with new {new[0].name!r}")
        return [(base[0], new[0])]
    names = {b.name for b, _ in pairs}
    for b in new:
        if b.name not in names and not (len(pairs) == 1 and pairs[0][1] is b):
            notes.append(f"backend {b.name!r} is only in the new run")
    return pairs


def _path_notes(pairs: Sequence[tuple[BackendSamples, BackendSamples]], notes: list[str]) -> None:
    """A note for each paired backend the two runs reached by another network path, where both
    manifests say it (`network_path`): the rows cannot tell the path's latency from the server's."""
    for b, n in pairs:
        (wb, hb), (wn, hn) = b.path, n.path
        if wb is None or wn is None or (wb == wn and (hb is None or hn is None or hb == hn)):
            continue
        said = [f"{which} on {w}" + (f", {h}" if h is not None else "") for which, w, h in (("base", wb, hb), ("new", wn, hn))]
        notes.append(f"backend {b.name!r} was reached by another network path: {said[0]}; {said[1]} -- a port forward "
                     "or another host adds latency of its own to every TTFT and latency (AIPerf PR #850): a change in "
                     "those rows may be the path's, not the server's")


def warmup_of(entry: Mapping[str, Any]) -> str | None:
    """A level's warmup in words, from its manifest entry: "20 requests" (counted:
    `warmup_requests`), "30s" or "none" (timed: `warmup_s`); None where the entry says neither."""
    n = entry.get("warmup_requests")
    if type(n) is int:
        return f"{n} requests"
    s = entry.get("warmup_s")
    if not isinstance(s, (int, float)) or isinstance(s, bool):
        return None
    return format_duration(float(s)) if s > 0 else "none"


def _warmup_notes(backend: str, level_pairs: Sequence[tuple[LevelSamples, LevelSamples]], notes: list[str]) -> None:
    """A note for each paired level the two runs warmed up differently (a counted warmup against
    a timed one, or another N or duration: `warmup_of`), levels with the same difference in one
    note. Levels pair by their load, not their warmup, and the measured window begins on a server
    the warmup left (its prefix cache, its batch sizes, a compiled graph): the rows cannot tell
    the warmup's effect from the server's. A note, as another network path is: both runs
    measured what they say."""
    by: dict[tuple[str, str], list[str]] = {}
    for a, z in level_pairs:
        wa, wz = warmup_of(a.entry), warmup_of(z.entry)
        if wa is not None and wz is not None and wa != wz:
            by.setdefault((wa, wz), []).append(a.label)
    for (wa, wz), labels in by.items():
        notes.append(f"backend {backend!r} {'level' if len(labels) == 1 else 'levels'} {'; '.join(labels)} warmed up "
                     f"differently: base warmup {wa}, new warmup {wz} -- the measured window began on a server warmed "
                     "otherwise (its caches, its batches): a change in those rows may be the warmup's, not the server's")


def _lacking(base: Sequence[BackendSamples], pairs: Sequence[tuple[BackendSamples, BackendSamples]],
             unpaired: Sequence[Unpaired]) -> list[str]:
    """Why the comparison is INCONCLUSIVE when the new run lacks what the base run measured: a
    backend, or a level of a backend that is not a sweep's (module doc, "Matching"). Missing data
    is never a pass; what only the new run has is new coverage, and a sweep's probes differ
    from run to run by design."""
    paired = {id(b) for b, _ in pairs}
    sweeps = {b.name for pair in pairs for b in pair if b.sweep}
    what = [f"backend {b.name!r}" for b in base if id(b) not in paired]
    what += [f"{u.backend} · {u.label} (level {u.level} of {u.workload})" for u in unpaired
             if u.side == "base" and u.backend not in sweeps]
    if not what:
        return []
    return ["the new run lacks what the base run measured (" + "; ".join(what) + "): not compared, and missing data "
            "is never a pass"]


def _load(lv: LevelSamples) -> str:
    e = lv.entry
    return f"{e.get('mode')} concurrency={e.get('concurrency')} rate={e.get('rate')}"


def _identity(lv: LevelSamples) -> str:
    """What a level is, for pairing (module doc): its workload and its phase's name, or else
    its load as the manifest entry gives it (a rate to 9 significant digits: the same spec
    value read back, not float noise; a replay's trace by its content, not the path it was read
    from: `plan.shape_identity`)."""
    e = lv.entry
    if e.get("phase") is not None:
        what: list[Any] = ["phase", e.get("phase")]
    else:
        rate = e.get("rate")
        if isinstance(rate, float):
            rate = float(f"{rate:.9g}")
        what = [e.get("mode"), e.get("concurrency"), rate, e.get("batch_requests"), shape_identity(e.get("shape"))]
        count = e.get("requests_per_level")
        if type(count) is int:  # a count-bounded level is not its timed namesake (nor one of another count)
            what.append(["requests_per_level", count])
            least = e.get("min_duration_s")
            if isinstance(least, int | float) and not isinstance(least, bool):  # nor one with another min_duration
                what.append(["min_duration_s", float(f"{least:.9g}")])
    return json.dumps([lv.workload, *what], sort_keys=True, default=str)


def _level_pairs(base: BackendSamples, new: BackendSamples) -> tuple[list[tuple[LevelSamples, LevelSamples]], list[Unpaired]]:
    """The two backends' levels paired by `_identity`, in the base's run order (the k-th of an
    identity in one run with the k-th in the other), and those left unpaired (base's, then new's)."""
    waiting: dict[str, list[LevelSamples]] = {}
    for lv in new.levels:
        waiting.setdefault(_identity(lv), []).append(lv)
    pairs: list[tuple[LevelSamples, LevelSamples]] = []
    unpaired: list[Unpaired] = []
    for lv in base.levels:
        same = waiting.get(_identity(lv))
        if same:
            pairs.append((lv, same.pop(0)))
        else:
            unpaired.append(Unpaired("base", base.name, lv.workload, lv.index, lv.label))
    taken = {id(z) for _, z in pairs}
    unpaired += [Unpaired("new", new.name, lv.workload, lv.index, lv.label) for lv in new.levels if id(lv) not in taken]
    return pairs, unpaired
