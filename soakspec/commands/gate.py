"""`soakspec gate DIR`: re-judge retained evidence.

The evidence is verified first (every artifact re-hashed against the manifest: an artifact edited
after the run FAILs the gate and is named), then judged against the spec embedded in the
manifest -- or against `--spec FILE` (a newer spec; a different sha256 is reported on stderr).
The run's own results.json and verdict.json are part of retained evidence: either missing makes
the verdict INCONCLUSIVE (incomplete evidence), whatever the rest says.
The verdict goes to stdout (text or JSON); the exit code is 0 PASS, 1 FAIL, 3 INCONCLUSIVE,
2 for a usage error (no evidence directory, a spec that does not check, a run still in progress:
`refuse_a_run_in_progress`). Nothing is written.

`--partial` judges a run that is still going, or was killed, up to its last closed bucket: the
backends' levels and bucket windows come from their buckets.jsonl (one line per closed bucket,
written during the run), the requests from requests.jsonl.gz (a cut-off last gzip member is
read as far as it goes), and only requests of closed buckets (and warm-up) are judged. The
verdict is always INCONCLUSIVE (exit 3) -- the evidence is incomplete by construction -- with
every rule's result shown and a note saying up to which bucket it judged; a rule that already
fails on the closed buckets says so. What a run not finished cannot have yet (its final status
and hashes, a cut-off or still-written last line, buckets and levels to come, the follow-up) is
inconclusive, not a failure (`Evidence.partial`), so `require completed_run` / `require
follow_up` never keep the performance rules from being judged. On a finished run (its manifest lists its backends)
`--partial` judges it in full, as plain `gate` does, and says so. A partial gate of a run
still going (or killed: the manifest cannot tell) runs at low CPU priority (`PARTIAL_NICE`):
on the soak's own machine, the look at a day-long soak -- minutes of a core -- must not starve
its load generator, whose client-health rules would then (rightly) call the soak
inconclusive. With a core to spare it costs nothing.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from pathlib import Path

from soakspec.exitcodes import ExitCode, UsageError
from soakspec.judge.cli_support import spec_for

PARTIAL_NICE = 10  # os.nice increment of a partial gate of a running soak: ~1/10 of a contended core


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("dir", metavar="DIR", help="an evidence directory (the run's output)")
    p.add_argument("--spec", metavar="FILE", help="judge with this spec instead of the one embedded in the evidence")
    p.add_argument("--format", choices=("text", "json"), default="text", help="output format (default: text)")
    p.add_argument("--verbose", action="store_true", help="text: list every instance, not only failures")
    p.add_argument("--backend", action="append", default=[], metavar="NAME",
                   help="judge only this backend (repeatable), as a `run --backend` of it: rules naming other backends are dropped")
    p.add_argument("--partial", action="store_true",
                   help="judge a run still going (or killed) up to its last closed bucket: INCONCLUSIVE; a finished run is judged in full")
    p.add_argument("--write", action="store_true",
                   help="a finished run whose results.json or verdict.json was never written (soakspec killed while "
                        "judging, the disk full then): judge it as `run` does at its end and write them, then judge it")


def load_for_judging(command: str, run_dir: str, spec_file: str | None, *, name_dir: bool = False):
    """Load (and hash-verify) an evidence directory and choose the spec to judge it with.
    Returns (spec, evidence), or an exit code after saying why on stderr. Shared by `gate`
    `report` and `combine`, which all re-judge rather than trust a stored verdict."""
    from soakspec.evidence.io import EvidenceError, EvidenceNotFound
    from soakspec.judge.cli_support import bare_evidence
    from soakspec.judge.evidence import load_evidence, spec_itl_thresholds, spec_windows

    where = str(run_dir).rstrip("/") or "/"
    try:
        # the spec first, from the manifest (or --spec): the evidence is then read once, its
        # `per window` rules' windows counted as the requests stream
        spec, notes = spec_for(bare_evidence(run_dir), spec_file, where)
        evidence = load_evidence(Path(run_dir), windows=spec_windows(spec), itl_thresholds=spec_itl_thresholds(spec))
    except EvidenceNotFound:
        raise  # a usage error, exit 2 (not the INCONCLUSIVE of evidence that cannot be read)
    except EvidenceError as e:
        print(f"soakspec {command}: {e}: the evidence cannot be judged", file=sys.stderr)
        return ExitCode.INCONCLUSIVE
    for n in notes:
        print(f"soakspec {command}: note: {where + ': ' if name_dir else ''}{n}", file=sys.stderr)
    return spec, evidence


def with_retained_notes(verdict, evidence, run_dir: str, *, restricted: bool = False):
    """`verdict` with what re-judging retained evidence adds (`gate` and `report` alike): where
    the run's own verdict.json says otherwise (a conclusion like any other: re-judged, and said
    so; not for a `--backend` subset), and whether the evidence is signed (runs nothing)."""
    from soakspec.evidence.signing import signature_status

    notes = list(verdict.notes)
    stored = _stored_outcome(evidence)
    if stored is not None and stored != verdict.outcome and not restricted:
        notes.append(f"the run's own verdict.json says {stored}; re-judged from the evidence: {verdict.outcome}")
    notes.append(f"evidence {signature_status(run_dir).text()}")
    return dataclasses.replace(verdict, notes=tuple(notes))


def _stored_outcome(evidence) -> str | None:
    """The outcome the run's verdict.json records (None: none readable)."""
    from soakspec.evidence import layout
    from soakspec.evidence.io import EvidenceError, read_json

    if evidence.root is None:
        return None
    path = Path(evidence.root) / layout.VERDICT
    try:
        doc = read_json(path) if layout.plain_file(path) else None
    except (EvidenceError, OSError):
        return None
    out = doc.get("outcome", doc.get("verdict")) if isinstance(doc, dict) else None
    return out if out in ("PASS", "FAIL", "INCONCLUSIVE") else None


def partial_entries(spec, root: Path) -> tuple[list[dict], list[str]]:
    """Backend entries for a run whose manifest has none yet, from each backend's buckets.jsonl:
    the plan's levels, each with the windows of its closed buckets. Returns (entries, notes)."""
    from soakspec.evidence import layout
    from soakspec.evidence.io import iter_jsonl
    from soakspec.plan import plan as make_plan

    entries, notes = [], []
    for bp in make_plan(spec).backends:
        path = layout.RunLayout(root).buckets(bp.name)
        lines = [r for _, r in iter_jsonl(path, [])] if layout.plain_file(path, root) else []
        closed: dict[tuple, dict[int, dict]] = {}
        for r in lines:
            if isinstance(r, dict) and isinstance(r.get("bucket"), int):
                closed.setdefault((r.get("workload"), r.get("level")), {})[r["bucket"]] = r
        levels = []
        for lv in bp.levels:
            got = closed.get((lv.workload, lv.index))
            if not got:
                continue
            ks = [k for k in sorted(got) if 0 <= k < len(lv.buckets)]
            ms = got[ks[0]]["start"] - lv.buckets[ks[0]].start_s
            windows = [{"index": k, "start": got[k]["start"], "end": got[k]["end"], "planned_length_s": lv.buckets[k].length_s}
                       for k in ks]  # fmt: skip
            # every planned bucket closed: the level ran its full duration (its last bucket closes
            # once its requests have ended); otherwise it is still going, or was killed
            whole = ks == list(range(len(lv.buckets)))
            levels.append(lv.to_json() | {
                "started_at": ms - lv.warmup_s, "measure_start": ms, "measure_end": windows[-1]["end"], "drained_at": None,
                "completed": whole, "buckets": windows, "sent": None,
            })  # fmt: skip
            notes.append(f"{bp.name} {lv.workload} / {lv.label}: judged buckets {ks[0]}-{ks[-1]} of {len(lv.buckets)}")
        if not levels:
            notes.append(f"{bp.name}: no bucket has closed yet")
        entry = {"name": bp.name, "safe_name": layout.safe_name(bp.name), "kind": bp.launch.kind,
                 "trace_source": bp.traces.source, "levels": levels, "partial": True}  # fmt: skip
        if bp.metrics is not None:
            entry["metrics"] = _scrapes_so_far(bp.metrics, layout.RunLayout(root).metrics(bp.name), root)
        entries.append(entry)
    return entries, notes


def _scrapes_so_far(scrape, path: Path, root: Path) -> dict:
    """The manifest's `metrics` summary of a backend whose run never finalized it: the one the
    runner keeps while it scrapes (`runner.scrape.ScrapeLog`), replayed over the whole lines
    metrics.jsonl holds (a cut-off last line is no scrape). Without it `metrics_scraped` read
    the recorded scrapes as none and FAILED a SIGKILLed run; a scrape the file records as failed
    still fails it, and none recorded yet is INCONCLUSIVE (`servermetrics.metrics_scraped`)."""
    from soakspec.evidence import layout
    from soakspec.evidence.io import iter_jsonl
    from soakspec.runner.scrape import ScrapeLog

    log = ScrapeLog(scrape)
    rows = [r for _, r in iter_jsonl(path, [])] if layout.plain_file(path, root) else []
    for r in rows:
        if isinstance(r, dict) and isinstance(r.get("ok"), bool):
            log.add(dict(r, families=r.get("families") or {}, error=r.get("error")))
        if log.status == "not available":
            break
    return log.to_json() | {"partial": True}


def closed_buckets(entries: list[dict]):
    """By backend name, what a partial judge takes of its requests (`judge.evidence.Closed`):
    those of its levels' closed buckets, and the warm-up of a level with one."""
    from soakspec.judge.evidence import Closed

    return {entry["name"]: Closed({(lv["workload"], lv["index"]): frozenset(b["index"] for b in lv["buckets"])
                                   for lv in entry["levels"]})
            for entry in entries}  # fmt: skip


def _closed_only(evidence, entries: list[dict]) -> tuple[object, list[str]]:
    """`evidence` (read with `closed_buckets(entries)`: its tables hold only the closed
    buckets' requests) with each level's `sent` set to what is judged of it -- a run still
    going has counted nothing sent yet -- and, per backend, a note of the requests left out."""
    from soakspec.judge.index import recorded

    notes = []
    for be, entry in zip(evidence.backends, entries):
        have = recorded(be.requests)
        for lv in entry["levels"]:
            lv["sent"] = have.get((lv["workload"], lv["index"]), 0)
        if be.left_out:
            notes.append(f"{be.name}: {be.left_out} recorded requests of buckets not closed (or of the follow-up) "
                         "left out")
    return dataclasses.replace(evidence, manifest=dict(evidence.manifest, backends=entries), partial=True), notes


def _yield_cpu() -> None:
    """Lower this process's CPU priority by PARTIAL_NICE (see the module doc), and say so."""
    try:
        now = os.nice(PARTIAL_NICE)
    except OSError:  # not permitted here: judged at the priority it has
        return
    print(f"soakspec gate: note: the run may still be going: judging it at low CPU priority (nice {now}), "
          "so that its load generator keeps the CPU it needs", file=sys.stderr)


def unfinished(manifest) -> bool:
    """Whether a manifest is a run's start-of-run one, never finalized: status running, no
    backend listed (the run is still going, or was killed). Its evidence is read as
    `load_partial` reads it."""
    return isinstance(manifest, dict) and (manifest.get("status") == "running" or not manifest.get("backends"))


def load_partial(command: str, root: Path, spec_file: str | None, where: str):
    """A run still going, or killed, read up to its last closed bucket (`gate --partial`, and
    `report` of such a run): (spec, evidence, the note saying how far it was read)."""
    from soakspec.judge.cli_support import bare_evidence
    from soakspec.judge.evidence import load_evidence, spec_itl_thresholds, spec_windows

    from soakspec.judge.workload import ran_spec

    # the spec first (the manifest embeds it from the start), then the evidence it plans
    bare = bare_evidence(root)
    spec, notes = spec_for(bare, spec_file, where)
    for n in notes:
        print(f"soakspec {command}: note: {n}", file=sys.stderr)
    # the levels as the run planned them (its own spec): a newer --spec judges them, it does not
    # say what ran (a level it plans otherwise is named by completed_run)
    ran = ran_spec(bare) if spec_file is not None else None
    entries, judged = partial_entries(ran if ran is not None else spec, root)
    evidence = load_evidence(root, entries=entries, windows=spec_windows(spec), closed=closed_buckets(entries),
                             itl_thresholds=spec_itl_thresholds(spec))
    evidence, left_out = _closed_only(evidence, entries)
    note = ("partial: the run is incomplete (status " + str(evidence.manifest.get("status")) + "); judged up to the last "
            "closed bucket: " + "; ".join(judged + left_out))
    return spec, evidence, note


def _main_partial(args: argparse.Namespace) -> int:
    from soakspec.evidence import layout
    from soakspec.evidence.io import EvidenceError, read_json, require_evidence_dir
    from soakspec.judge.judge import judge
    from soakspec.judge.verdict import render_text

    root = require_evidence_dir(args.dir)
    where = str(args.dir).rstrip("/") or "/"
    try:
        manifest = read_json(root / layout.MANIFEST)
    except EvidenceError as e:
        print(f"soakspec gate: {e}: the evidence cannot be judged", file=sys.stderr)
        return ExitCode.INCONCLUSIVE
    if isinstance(manifest, dict) and not unfinished(manifest):
        print(f"soakspec gate: note: {where} holds a finished run (status {manifest.get('status')}); judged in full",
              file=sys.stderr)
        args.partial = False
        return main(args)
    _yield_cpu()
    spec, evidence, note = load_partial("gate", root, args.spec, where)
    verdict = judge(spec, evidence, backends=tuple(args.backend))
    failing = [r.rule for r in verdict.rules if r.status == "fail" and r.klass == "performance"]
    if failing:
        note += f"; already failing on the closed buckets: {', '.join(failing)}"
    verdict = dataclasses.replace(verdict, outcome="INCONCLUSIVE", notes=verdict.notes + (note,))
    if args.format == "json":
        print(json.dumps(verdict.to_json() | {"partial": True}, indent=2, sort_keys=True, ensure_ascii=False))
    else:
        print(render_text(verdict, verbose=args.verbose))
    return verdict.exit_code


def _write_missing(args: argparse.Namespace) -> int | None:
    """`gate --write`: results.json and verdict.json of a finished run that never wrote them,
    judged as `run` judges at its end with the run's own spec and bound to its manifest
    (`judge_and_write`); None to go on judging, or the exit code of a write the disk refused.
    A run still in progress was refused before (`refuse_a_run_in_progress`, once for every gate)."""
    from soakspec.evidence import layout
    from soakspec.evidence.io import EvidenceWriteError, read_json, require_evidence_dir
    from soakspec.judge.cli_support import bare_evidence, judge_and_write

    if args.spec is not None or args.backend:
        raise UsageError("--write judges with the run's own spec and every backend (no --spec, no --backend)")
    root = require_evidence_dir(args.dir)
    status = (read_json(root / layout.MANIFEST) or {}).get("status")
    if status not in ("complete", "aborted"):
        raise UsageError(f"--write: {args.dir} holds no finished run (status {status}): nothing to write")
    if (root / layout.RESULTS).exists() and (root / layout.VERDICT).exists():
        print(f"soakspec gate: note: {args.dir} has its results.json and verdict.json: nothing to write", file=sys.stderr)
        return None
    spec, _ = spec_for(bare_evidence(root), None, str(args.dir))
    try:
        judge_and_write(root, spec, write=True)
    except EvidenceWriteError as e:
        print(f"soakspec gate: error: {e}", file=sys.stderr)
        return ExitCode.ABORTED
    print(f"soakspec gate: wrote the missing results.json and verdict.json of {args.dir}", file=sys.stderr)
    return None


def refuse_a_run_in_progress(run_dir: str) -> None:
    """Plain `gate` of a run still in progress -- a live `soakspec run` holds its `.lock` (the
    lock is an flock, so a killed run's leftover `.lock` holds nothing) -- judges nothing: the
    run is not over, and judging it whole FAILed `require completed_run` ("the run's status is
    running") on a soak in which nothing had failed. It is a usage error (exit 2), as `--write`
    of it is: no verdict was reached, so neither FAIL (1) nor INCONCLUSIVE (3), which CI reads as
    a verdict on a finished run; `gate --partial DIR` is the way to look at it. A killed run (its
    lock's process gone) is judged as before: its plain gate names `--partial` in completed_run."""
    from soakspec.evidence.io import lock_holder, require_evidence_dir

    holder = lock_holder(require_evidence_dir(run_dir))
    if holder is None:
        return
    who = f"pid {holder}" if holder else "a process that did not write its pid"
    raise UsageError(f"{run_dir} holds a run still in progress (its .lock is held by {who}): nothing is judged until it "
                     f"ends; `soakspec gate --partial {run_dir}` judges it up to its last closed bucket")


def main(args: argparse.Namespace) -> int:
    from soakspec.judge.judge import judge
    from soakspec.judge.verdict import render_text

    if getattr(args, "partial", False):
        if getattr(args, "write", False):
            raise UsageError("--write and --partial: a run judged partially has no verdict to write")
        return _main_partial(args)
    refuse_a_run_in_progress(args.dir)  # --write too: what a live run is writing is not its to write
    if getattr(args, "write", False):
        code = _write_missing(args)
        if code is not None:
            return code
    loaded = load_for_judging("gate", args.dir, args.spec)
    if isinstance(loaded, int):
        return loaded
    spec, evidence = loaded
    names = {b.name for b in spec.backends}
    unknown = [n for n in args.backend if n not in names]
    if unknown:
        raise UsageError(f"--backend {unknown[0]}: the spec declares no such backend ({', '.join(sorted(names))})")
    # after the fact: the run's results/verdict must be there
    verdict = judge(spec, evidence, retained=True, backends=tuple(args.backend))
    verdict = with_retained_notes(verdict, evidence, args.dir, restricted=bool(args.backend))
    if args.format == "json":
        print(json.dumps(verdict.to_json(), indent=2, sort_keys=True, ensure_ascii=False))
    else:
        print(render_text(verdict, verbose=args.verbose))
    return verdict.exit_code
