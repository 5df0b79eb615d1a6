"""Plan and evidence, joined once: `join(spec, evidence) -> JudgedRun`.

Everything the judge, results.json and the reports look up is indexed here, in dicts, once
per judged run: the plan the run followed (re-planned from the manifest's rehearsal,
time_scale and `only`), each backend's index of its records, each level by (backend,
workload, level index), and where each measured request sits. Rules never search: they ask
the `JudgedRun`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from soakspec import heap
from soakspec.judge.evidence import Evidence
from soakspec.judge.index import BackendIndex, LevelIndex, Window, index
from soakspec.lang.spec import Gate, Rule, Spec
from soakspec.plan import BackendPlan, Level, Plan, plan as make_plan

LevelKey = tuple[str, str, int]  # (backend, workload, level index)


@dataclasses.dataclass(frozen=True, eq=False)
class JudgedRun:
    """One run to judge: the spec, the evidence, the plan and the indexes that join them.

    indexes    every backend of the evidence, indexed, in the evidence's order (results.json)
    planned    the planned backends by name, in plan order
    backends   planned backend name -> its index (the first backend of that name)
    judged     the planned backends that have evidence, in plan order
    levels     (backend, workload, level index) -> the level's index, for judged backends
    """

    spec: Spec
    evidence: Evidence
    plan: Plan
    time_scale: float
    bad_time_scale: bool  # the manifest's time_scale is not in (0, 1] (judged as 1)
    rehearsal: bool
    indexes: tuple[BackendIndex, ...]
    planned: Mapping[str, BackendPlan]
    backends: Mapping[str, BackendIndex]
    judged: tuple[BackendIndex, ...]
    levels: Mapping[LevelKey, LevelIndex]
    restricted: tuple[str, ...] = ()  # the backends a restricted run (`only`, `--backend`) ran
    not_run: tuple[str, ...] = ()  # the spec's backends a restricted run left out
    retained: bool = False  # judged from retained evidence (`gate`), not right after the run
    gate_only: bool = False  # the gate itself was restricted (`gate --backend`), not only the run
    sweep: tuple[Any, ...] = ()  # a sweep spec: each backend's re-judged search (`soakspec.judge.sweep`)
    ran_spec: Spec | None = None  # the spec the run ran, where `spec` is another one and its text checks (`gate --spec`)

    @property
    def gate(self) -> Gate:
        return self.spec.gate

    @property
    def partial(self) -> bool:
        """Judged up to its last closed bucket (`gate --partial`): what the run cannot have yet
        is inconclusive, not a failure (`Evidence.partial`)."""
        return self.evidence.partial

    @property
    def multi_workload(self) -> bool:
        return len(self.spec.workloads) > 1

    def locate(self, backend: str, r: Mapping[str, Any]) -> tuple[LevelIndex, Window] | None:
        """The level and bucket holding measured request `r` of `backend` (None: none)."""
        lv = self.levels.get((backend, r.get("workload"), r.get("level")))  # type: ignore[arg-type]
        b = r.get("bucket")
        if lv is None or not isinstance(b, int) or b < 0:
            return None
        w = lv.window(b)
        return (lv, w) if w is not None else None

    def level(self, backend: str, lv: Level) -> LevelIndex | None:
        """The evidence of planned level `lv` on `backend` (None: it did not run)."""
        return self.levels.get((backend, lv.workload, lv.index))

    def plan_label(self, lv: Level) -> str:
        return f"{lv.workload} / {lv.label}" if self.multi_workload else lv.label

    def backends_for(self, rule: Rule) -> tuple[BackendIndex, ...]:
        """The judged backends a rule speaks about (all, or the one it names)."""
        if rule.backend is None:
            return self.judged
        bi = self.backends.get(rule.backend)
        return (bi,) if bi is not None else ()

    def unrun(self, rule: Rule) -> str | None:
        """Why `rule` names a backend this run did not run (None: it does not)."""
        if rule.backend is None or rule.backend in self.planned:
            return None
        if rule.backend in self.not_run:
            return (f"the run was restricted to {', '.join(self.restricted)}; backend {rule.backend} did not run, "
                    "so nothing here speaks about it")
        return f"backend {rule.backend} is not planned by this run"

    def planned_for(self, rule: Rule) -> list[tuple[str, BackendPlan]]:
        return [(n, bp) for n, bp in self.planned.items() if rule.backend is None or n == rule.backend]


def _time_scale(m: Mapping[str, Any]) -> tuple[float, bool]:
    ts = m.get("time_scale", 1.0)
    ok = isinstance(ts, (int, float)) and not isinstance(ts, bool) and 0 < ts <= 1
    scale = float(ts) if ok else 1.0
    return scale, scale != ts


def rederived(spec: Spec, evidence: Evidence) -> tuple[Evidence, Spec | None]:
    """`evidence` with every stored conclusion re-derived from its facts for judging with `spec`
    (`soakspec.judge.rederive`), and the spec the run ran where `spec` is another one (`gate
    --spec`; None otherwise, or when its embedded text does not check): what the run's requests
    asked for is read from it. `join` and `compare` read evidence through this."""
    from soakspec.judge.rederive import rederive
    from soakspec.judge.workload import ran_spec

    ran = None
    if evidence.spec_sha256 is not None and evidence.spec_sha256 != spec.sha256:  # judged with another spec
        ran = ran_spec(evidence)
    return rederive(spec, evidence, ran), ran


def join(spec: Spec, evidence: Evidence, *, retained: bool = False, backends: tuple[str, ...] = (),
         whole: bool = False) -> JudgedRun:
    """Re-plan the run from its manifest, re-derive every stored conclusion from its facts
    (`soakspec.judge.rederive`) and index the evidence against that plan (pure). `retained`:
    the evidence is judged after the fact (`soakspec gate`), so the run's own results.json and
    verdict.json must be there. `backends` (`gate --backend`): judge only these backends, as a
    `--backend` run of them would be judged -- the rules naming other backends are dropped.
    `whole` (`compare`): a sweep keeps every probe, not narrowed to its found level."""
    from soakspec.judge.sweep import narrow

    sweep: tuple[Any, ...] = ()
    if not whole:
        spec, evidence, sweep = narrow(spec, evidence)  # a sweep is judged at its found level
    evidence, ran = rederived(spec, evidence)
    heap.release()  # what trace matching and relabelling freed (the id index, each chunk's traces)
    m = evidence.manifest
    time_scale, bad_time_scale = _time_scale(m)
    rehearsal = m.get("rehearsal") is True
    only = m.get("only")
    names = {b.name for b in spec.backends}
    chosen = tuple(n for n in only if n in names) if isinstance(only, list) and only else ()
    gate_only = bool(backends)
    if gate_only:
        chosen = tuple(b.name for b in spec.backends if b.name in set(backends))
        spec = dataclasses.replace(spec, gate=dataclasses.replace(
            spec.gate, rules=tuple(r for r in spec.gate.rules if r.backend is None or r.backend in chosen)))
    p = make_plan(spec, time_scale=time_scale, rehearse=rehearsal, only=chosen)
    planned = {bp.name: bp for bp in p.backends}
    indexes = index(evidence)
    heap.release()  # the selections' temporaries, before the rules allocate theirs
    backends: dict[str, BackendIndex] = {}
    for bi in indexes:
        if bi.name in planned:
            backends.setdefault(bi.name, bi)
    judged = tuple(backends[n] for n in planned if n in backends)
    levels: dict[LevelKey, LevelIndex] = {}
    for bi in judged:
        for lv in bi.levels:
            levels.setdefault((bi.name, lv.workload, lv.index), lv)
    not_run = tuple(b.name for b in spec.backends if b.name not in planned) if chosen else ()
    return JudgedRun(spec, evidence, p, time_scale, bad_time_scale, rehearsal, indexes, planned, backends,
                     judged, levels, chosen, not_run, retained, gate_only, sweep, ran)
