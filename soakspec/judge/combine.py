"""Combining per-backend evidence into one report (pure; `soakspec combine` does the I/O).

Every child is re-verified and re-judged by the caller, never trusted; `combine` then runs the
checks of `CHECKS`, in order, all of which must hold:

  children_pass         every child's verdict is PASS (a FAIL fails, an INCONCLUSIVE makes the
                        combination inconclusive)
  backends_once         every backend the spec declares appears in a child, and no child has a
                        backend the spec does not declare. A backend in several children is a
                        before/after series (allowed; `soakspec compare` gives the statistics)
  one_commit            one source commit across all children and backends, unchanged and from a
                        clean tree (required when the spec declares a source repository); in a
                        before/after series the commit is what changed: shown, not required equal
  model_provenance      identical model revision (when the spec names one), model fingerprint
                        (when it names a model path, outside rehearsals) and server binary sha256
                        (for `launch` backends: `sim`, `url` and `shell` backends have no binary
                        soakspec can hash, so none is required of them); a before/after
                        series may change the binary
  same_workload         the same spec (sha256), or at least identical workloads, gate, backend
                        declarations, model, source and telemetry blocks (what the judge reads:
                        a spec may differ in its header, claims and compare blocks; a before/
                        after series, which writes no directory, only workloads and gate), run at one
                        time scale (`run --time-scale` shrinks every duration and bucket), and
                        all rehearsals or none (the combined manifest's `rehearsal` is the run's)
  runtime_boundaries    a runtime boundary for every backend, confirmed or declared, as the
                        judge re-derives it from the spec, the retained log and environment

Provenance is read from each child's evidence as the judge re-derives it
(`soakspec.judge.rederive`), never from stored conclusions.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal

from soakspec.exitcodes import ExitCode
from soakspec.judge.evidence import Evidence
from soakspec.judge.verdict import Verdict
from soakspec.lang.spec import Spec

SCHEMA_VERSION = 1
Outcome = Literal["PASS", "FAIL", "INCONCLUSIVE"]


@dataclasses.dataclass(frozen=True)
class Child:
    dir: str
    spec: Spec
    evidence: Evidence
    verdict: Verdict
    # the evidence re-derived with `spec`, where the caller re-derived it already (the command:
    # before it let the child's requests go, `without_requests`); None: `combine` re-derives it
    rederived: Evidence | None = None


def without_requests(ev: Evidence) -> Evidence:
    """`ev` as the combination's checks and the combined directory read it -- the manifest,
    each backend's entry, the integrity -- with its requests, traces, telemetry, scrapes and
    client samples let go. The command holds every child until it has combined them: a
    day-long child's request table is hundreds of MiB (10^7 requests: ~500), and three children
    held three. What a check reads is computed before: the verdict (`judge`) and the
    re-derived entries (`Child.rederived`)."""
    from soakspec.judge.clientsamples import samples_of
    from soakspec.judge.scrapes import build_scrapes
    from soakspec.judge.evidence import StoredTraces

    return dataclasses.replace(ev, backends=tuple(dataclasses.replace(
        b, records=(), table=None, traces=StoredTraces(), telemetry=(), client=samples_of(()), metrics=build_scrapes(()),
        server_log=None) for b in ev.backends))


@dataclasses.dataclass(frozen=True)
class Check:
    name: str
    status: Literal["pass", "fail", "inconclusive"]
    message: str

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "status": self.status, "message": self.message}


@dataclasses.dataclass(frozen=True)
class Combined:
    outcome: Outcome
    checks: tuple[Check, ...]
    children: tuple[Child, ...]

    @property
    def exit_code(self) -> ExitCode:
        return {"PASS": ExitCode.OK, "FAIL": ExitCode.GATE_FAILED, "INCONCLUSIVE": ExitCode.INCONCLUSIVE}[self.outcome]

    def to_json(self) -> dict[str, Any]:
        backends = []
        for c in self.children:
            for b in c.evidence.backends:
                e = b.entry
                backends.append({
                    "name": b.name,
                    "child": c.dir,
                    "runtime_boundary": e.get("runtime_boundary"),
                    "commit": _get(e, "source", "commit_before"),
                    "model": {k: _get(e, "model", k) for k in ("id", "revision", "fingerprint")},
                    "server_binary_sha256": _get(e, "server_binary", "sha256"),
                })
        return {
            "schema_version": SCHEMA_VERSION,
            "verdict": self.outcome,
            "exit_code": int(self.exit_code),
            "summary": self.summary(),
            "checks": [c.to_json() for c in self.checks],
            "children": [
                {
                    "dir": c.dir,
                    "run_id": c.evidence.run_id,
                    "verdict": c.verdict.outcome,
                    "summary": c.verdict.summary(),
                    "spec_sha256": c.evidence.spec_sha256,
                    "manifest_sha256": c.evidence.manifest_sha256,
                    "artifacts": dict(sorted(_artifacts(c.evidence).items())),
                    "backends": [b.name for b in c.evidence.backends],
                    "failed_rules": [r.text() for r in c.verdict.rules if r.severity == "require" and r.status != "pass"],
                }
                for c in self.children
            ],
            "backends": backends,
        }

    def summary(self) -> str:
        bad = [c.name for c in self.checks if c.status != "pass"]
        if self.outcome == "PASS":
            return f"PASS: {len(self.children)} children, all {len(self.checks)} combination checks hold"
        return f"{self.outcome}: {', '.join(bad)}"


def _artifacts(ev: Evidence) -> dict[str, str]:
    a = ev.manifest.get("artifacts")
    return {str(k): str(v) for k, v in a.items()} if isinstance(a, Mapping) else {}


def _get(entry: Mapping[str, Any], *path: str) -> Any:
    cur: Any = entry
    for p in path:
        cur = cur.get(p) if isinstance(cur, Mapping) else None
    return cur


def _distinct(values: Mapping[str, Any], label: str) -> str | None:
    vals = {str(v) for v in values.values()}
    missing = [k for k, v in values.items() if v is None]
    if missing:
        return f"no {label} recorded for {', '.join(missing)}"
    if len(vals) > 1:
        return f"different {label}s: " + ", ".join(f"{k}: {str(v)[:16]}" for k, v in values.items())
    return None


def children_pass(children: Sequence[Child]) -> Check:
    failed = [c for c in children if c.verdict.outcome == "FAIL"]
    unsure = [c for c in children if c.verdict.outcome == "INCONCLUSIVE"]
    if failed:
        return Check("children_pass", "fail", "; ".join(f"{c.dir}: {c.verdict.summary()}" for c in failed))
    if unsure:
        return Check("children_pass", "inconclusive", "; ".join(f"{c.dir}: {c.verdict.summary()}" for c in unsure))
    return Check("children_pass", "pass", f"all {len(children)} children pass their gate")


def backends_once(children: Sequence[Child]) -> Check:
    where: dict[str, list[str]] = {}
    for c in children:
        for b in c.evidence.backends:
            where.setdefault(b.name, []).append(c.dir)
    declared = [b.name for b in children[0].spec.backends] if children else []
    problems = [f"backend {n} is in no child" for n in declared if n not in where]
    problems += [f"backend {n} is not declared by the spec" for n in where if n not in declared]
    series = [f"backend {n} appears in {len(ds)} children ({', '.join(ds)}): a before/after series"
              for n, ds in where.items() if len(ds) > 1]
    if problems:
        return Check("backends_once", "fail", "; ".join(problems + series))
    return Check("backends_once", "pass", "; ".join(series) or f"each of {', '.join(declared)} appears once")


def before_after(children: Sequence[Child]) -> bool:
    """True when some backend appears in more than one child (a before/after series)."""
    names = [b.name for c in children for b in c.evidence.backends]
    return len(names) != len(set(names))


@dataclasses.dataclass(frozen=True)
class _Entry:
    entry: Mapping[str, Any]  # the backend's manifest entry, re-derived
    spec: Spec  # the child's spec
    rehearsal: bool


def _entries(children: Sequence[Child]) -> dict[str, Mapping[str, Any]]:
    """Every backend of every child: `name in dir` -> its manifest entry (re-derived)."""
    return {k: e.entry for k, e in _full_entries(children).items()}


def _full_entries(children: Sequence[Child]) -> dict[str, _Entry]:
    out: dict[str, _Entry] = {}
    for c in children:
        ev = c.evidence  # re-derived by `combine`
        rehearsal = ev.manifest.get("rehearsal") is True
        for b in ev.backends:
            out[f"{b.name} in {c.dir}"] = _Entry(b.entry, c.spec, rehearsal)
    return out


def one_commit(children: Sequence[Child]) -> Check:
    entries = _full_entries(children)
    commits: dict[str, Any] = {}
    msgs = []
    for k, fe in entries.items():
        e = fe.entry
        before, after = _get(e, "source", "commit_before"), _get(e, "source", "commit_after")
        if before is None and after is None and fe.spec.source.repo is None:
            continue  # no source repository declared: no commit to record
        if before != after:
            msgs.append(f"{k}: commit changed during the run")
        if _get(e, "source", "dirty_before") is True or _get(e, "source", "dirty_after") is True:
            msgs.append(f"{k}: the working tree had uncommitted changes (dirty before: {_get(e, 'source', 'dirty_before')}, "
                        f"after: {_get(e, 'source', 'dirty_after')})")
        commits[k] = before
    if not commits:
        return Check("one_commit", "pass", "no source repository declared, so no commit to check")
    if before_after(children):
        shown = ", ".join(f"{k}: {str(v)[:12] if v else 'none'}" for k, v in commits.items())
        return Check("one_commit", "fail" if msgs else "pass", "; ".join(msgs) or f"before/after series; commits {shown}")
    m = _distinct(commits, "commit")
    if m:
        msgs.append(m)
    return Check("one_commit", "fail" if msgs else "pass",
                 "; ".join(msgs) or f"one commit {str(next(iter(commits.values()), ''))[:12]} across {len(commits)} backends")


def _required(fe: _Entry, label: str) -> bool:
    """Whether a backend can have (so must have) this kind of provenance."""
    if label == "model revision":
        return fe.spec.model.revision is not None or _get(fe.entry, "model", "revision") is not None
    if label == "model fingerprint":
        return (fe.spec.model.path is not None and not fe.rehearsal) or _get(fe.entry, "model", "fingerprint") is not None
    return fe.entry.get("kind") == "launch"  # server binary: only a launched binary has one


def model_provenance(children: Sequence[Child]) -> Check:
    entries = _full_entries(children)
    msgs = []
    series = before_after(children)
    for label, path in (("model revision", ("model", "revision")), ("model fingerprint", ("model", "fingerprint")),
                        ("server binary sha256", ("server_binary", "sha256"))):
        vals = {k: _get(fe.entry, *path) for k, fe in entries.items() if _required(fe, label)}
        if series and label == "server binary sha256":  # the binary is what a before/after may change
            missing = [k for k, v in vals.items() if v is None]
            if missing:
                msgs.append(f"no {label} recorded for {', '.join(missing)}")
            continue
        m = _distinct(vals, label)
        if m:
            msgs.append(m)
    return Check("model_provenance", "fail" if msgs else "pass",
                 "; ".join(msgs) or "identical model revision, fingerprint and server binary across backends (where they exist)")


def time_scale(child: Child) -> float:
    """The time scale a child ran at, as the judge reads its manifest (absent: 1, full scale)."""
    from soakspec.judge.joined import _time_scale

    return _time_scale(child.evidence.manifest)[0]


def _scale_text(scale: float) -> str:
    return f"{scale:g} (full scale)" if scale == 1 else f"{scale:g}"


# what the judge reads of a spec: the combined evidence directory is judged with the first
# child's spec, so a child run under other backend declarations (runtime, env, traces), model,
# source or telemetry blocks would be judged there by rules it did not run under. A before/after
# series writes no directory: what changed between its runs may be a backend's declaration
JUDGED_PARTS: dict[str, Callable[[Spec], Any]] = {
    "workloads": lambda s: s.workloads, "gate": lambda s: s.gate, "backends": lambda s: s.backends,
    "model": lambda s: s.model, "source": lambda s: s.source, "telemetry": lambda s: s.telemetry,
}
SERIES_PARTS = ("workloads", "gate")  # what a before/after series must share


def same_workload(children: Sequence[Child]) -> Check:
    msgs = []
    scales = {c.dir: time_scale(c) for c in children}
    if len(set(scales.values())) > 1:  # a time-scaled run shrinks every duration, bucket and deadline
        msgs.append("different time scales: " + ", ".join(f"{d}: {_scale_text(s)}" for d, s in scales.items()))
    rehearsed = {c.dir: c.evidence.manifest.get("rehearsal") is True for c in children}
    if len(set(rehearsed.values())) > 1:  # the manifest's `rehearsal` is the whole run's: one kind of run
        msgs.append(f"a rehearsal beside a real run: {', '.join(d for d, r in rehearsed.items() if r)} "
                    f"{'is a rehearsal' if sum(rehearsed.values()) == 1 else 'are rehearsals'}, "
                    f"{', '.join(d for d, r in rehearsed.items() if not r)} {'is' if sum(not r for r in rehearsed.values()) == 1 else 'are'} not")
    shas = {c.dir: c.spec.sha256 for c in children}
    series = before_after(children)
    if len(set(shas.values())) > 1:
        first = children[0].spec
        for c in children[1:]:
            parts = [p for p in (SERIES_PARTS if series else JUDGED_PARTS) if JUDGED_PARTS[p](c.spec) != JUDGED_PARTS[p](first)]
            if parts:
                msgs.append(f"{', '.join(parts)} differ from {children[0].dir} in {c.dir}")
    if msgs:
        return Check("same_workload", "fail", "; ".join(msgs))
    scale = next(iter(scales.values()), 1.0)
    at = "" if scale == 1 else f", at time scale {scale:g}"
    if len(set(shas.values())) <= 1:
        return Check("same_workload", "pass", f"every child ran the same spec{at}")
    same = "workloads and gate (a before/after series)" if series else "workloads, gate, backends, model, source and telemetry"
    return Check("same_workload", "pass", f"specs differ in text but have identical {same}{at}")


def runtime_boundaries(children: Sequence[Child]) -> Check:
    msgs, shown = [], []
    for k, e in _entries(children).items():
        status = _get(e, "runtime_boundary", "status")
        display = _get(e, "runtime_boundary", "display")
        if status in ("confirmed", "declared"):
            shown.append(f"{k}: {display}")
        else:
            msgs.append(f"{k}: runtime boundary {display!r} is {status or 'not recorded'}")
    return Check("runtime_boundaries", "fail" if msgs else "pass", "; ".join(msgs) or "; ".join(shown))


CHECKS: tuple[Callable[[Sequence[Child]], Check], ...] = (
    children_pass, backends_once, one_commit, model_provenance, same_workload, runtime_boundaries,
)


def combine(children: Sequence[Child]) -> Combined:
    from soakspec.judge.rederive import rederive

    # every check reads facts: each child's stored conclusions re-derived once -- here, unless
    # the caller did (`Child.rederived`: the command, before it let the child's requests go)
    children = [dataclasses.replace(c, evidence=c.rederived if c.rederived is not None else rederive(c.spec, c.evidence))
                for c in children]
    checks = [check(children) for check in CHECKS]
    if not children:
        checks.append(Check("children", "fail", "no children"))
    statuses = [c.status for c in checks]
    outcome: Outcome = "FAIL" if "fail" in statuses else "INCONCLUSIVE" if "inconclusive" in statuses else "PASS"
    return Combined(outcome, tuple(checks), tuple(children))


def render_text(c: Combined) -> str:
    lines = [f"combined report of {len(c.children)} children"]
    for ch in c.children:
        lines.append(f"  {ch.verdict.outcome:12} {ch.dir} (run {ch.evidence.run_id}: {', '.join(b.name for b in ch.evidence.backends)})")
        for r in ch.verdict.rules:
            if r.severity == "require" and r.status != "pass":
                lines.append(f"                 {r.text()}")
    for k in c.checks:
        lines.append(f"  {k.status.upper():12} {k.name} — {k.message}")
    lines.append(c.summary())
    return "\n".join(lines)
