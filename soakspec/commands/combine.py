"""`soakspec combine DIR... --out DIR`: one report across per-backend evidence directories.

Each child is verified (artifacts re-hashed) and re-judged with the spec embedded in it; nothing
a child says about itself (its verdict.json, results.json) is trusted. The combination checks
are in `soakspec.judge.combine` (only the provenance the spec declares is required; the same
backend in two children is a before/after series).

Output, in `--out DIR` (which must be new or empty):
  combined.json, combined.json.sha256   the checks and every child (sorted keys)
  an evidence directory                 when every backend appears once: each child's
      `backends/<name>/` copied (every file re-hashed against the child's manifest while
      copying), client.jsonl (each child's lines for its backends: the combined run is
      judged on its load generator's health, `_copy_client`), results.json and verdict.json (bound to the manifest, as `run` writes them),
      and a manifest.json holding every backend's entry, the first child's spec and
      host, the child time scale (children at different scales fail same_workload),
      `combined_from` (each child's run id, manifest sha256, host and times) and every
      artifact's sha256 -- so `soakspec verify`, `gate` and `report` accept the directory.
      A before/after series is not one run: no evidence directory is written for it (use
      `soakspec compare BEFORE AFTER`); nor is one made from a child whose evidence does not
      verify, nor when a combination check FAILs (children of different workloads or time
      scales, different provenance, a missing backend, a child failing its gate): the
      directory is judged as one run with the first child's spec, which cannot see what the
      check saw (a second child's other workload), so it could PASS where the combination
      fails. combined.json is always written, and says why (`evidence_directory_reason`).
Prints the report to stdout and exits 0 PASS, 1 FAIL, 3 INCONCLUSIVE, 2 on a usage error,
4 when the output cannot be written.
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from soakspec.exitcodes import ExitCode

COMBINED = "combined.json"


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("dirs", nargs="+", metavar="DIR", help="evidence directories, one per backend run")
    p.add_argument("--out", required=True, metavar="DIR", help="a new (or empty) directory for combined.json and the combined evidence")
    p.add_argument("--format", choices=("text", "json"), default="text", help="output format (default: text)")


class CopyMismatch(Exception):
    """A child's file changed between verification and copying."""


def combined_manifest(children: Sequence[Any]) -> dict[str, Any]:
    """The combined run's manifest (artifacts still empty): pure."""
    from soakspec.judge.combine import time_scale
    from soakspec.judge.joined import _time_scale

    first = children[0]
    m = copy.deepcopy(first.evidence.manifest)
    order = [b.name for b in first.spec.backends]
    entries = [copy.deepcopy(b.entry) for c in children for b in c.evidence.backends]
    entries.sort(key=lambda e: order.index(e["name"]) if e["name"] in order else len(order))
    ms = [c.evidence.manifest for c in children]
    starts = [x for x in (mm.get("started_at_epoch") for mm in ms) if isinstance(x, (int, float))]
    ends = [x for x in (mm.get("ended_at_epoch") for mm in ms) if isinstance(x, (int, float))]
    statuses = [mm.get("status") for mm in ms]
    run_id = "combined-" + hashlib.sha256("\n".join(str(c.evidence.run_id) for c in children).encode()).hexdigest()[:12]
    m.update(run_id=run_id, backends=entries, artifacts={})
    if starts:
        first_i = min(range(len(ms)), key=lambda i: ms[i].get("started_at_epoch") if isinstance(ms[i].get("started_at_epoch"), (int, float)) else float("inf"))
        m.update(started_at=ms[first_i].get("started_at"), started_at_epoch=min(starts))
    if ends:
        last_i = max(range(len(ms)), key=lambda i: ms[i].get("ended_at_epoch") if isinstance(ms[i].get("ended_at_epoch"), (int, float)) else float("-inf"))
        m.update(ended_at=ms[last_i].get("ended_at"), ended_at_epoch=max(ends))
    if all(s == "complete" for s in statuses):
        m.update(status="complete", incomplete_reason=None)
    else:
        bad = [f"{c.dir}: {mm.get('status')}" for c, mm in zip(children, ms) if mm.get("status") != "complete"]
        m.update(status="incomplete", incomplete_reason="a combined child did not complete: " + "; ".join(bad))
    m["rehearsal"] = any(mm.get("rehearsal") is True for mm in ms)
    if any(mm.get("preflight") is False for mm in ms):  # a child run with `--no-preflight`: the judge notes it
        m["preflight"] = False
    # children at different time scales fail same_workload (and combine then writes no
    # directory); a manifest made of them still never claims a scale no child ran at: the smallest, so full_scale_run cannot pass a scaled child (a
    # child's malformed time_scale is carried as it is, for the judge to call malformed again)
    malformed = [mm.get("time_scale", 1.0) for mm in ms if _time_scale(mm)[1]]
    m["time_scale"] = malformed[0] if malformed else min(time_scale(c) for c in children)
    names = {e["name"] for e in entries}
    if set(order) <= names:
        m.pop("only", None)
    else:
        m["only"] = [n for n in order if n in names]
    m["combined_from"] = [
        {"dir": c.dir, "run_id": c.evidence.run_id, "manifest_sha256": c.evidence.manifest_sha256,
         "backends": [b.name for b in c.evidence.backends], "started_at": mm.get("started_at"),
         "ended_at": mm.get("ended_at"), "host": mm.get("host"), "gpus": mm.get("gpus"),
         "time_scale": mm.get("time_scale")}
        for c, mm in zip(children, ms)
    ]
    return m


def _copy_backends(children: Sequence[Any], out: Path) -> None:
    """Copy every child's backends/<name>/ files into `out`, re-hashing each against the
    child's manifest (a file changed since it was verified is not copied)."""
    from soakspec.evidence import layout
    from soakspec.evidence.io import write_bytes_atomic

    for c in children:
        arts = c.evidence.manifest.get("artifacts") or {}
        root = Path(c.evidence.root)
        for b in c.evidence.backends:
            prefix = f"{layout.BACKENDS}/{b.safe_name}/"
            for rel, sha in sorted(arts.items()):
                if not rel.startswith(prefix):
                    continue
                data = (root / rel).read_bytes()
                if hashlib.sha256(data).hexdigest() != sha:
                    raise CopyMismatch(f"{c.dir}/{rel} changed after it was verified")
                dest = out / rel
                dest.parent.mkdir(parents=True, exist_ok=True)
                write_bytes_atomic(dest, data)


def _copy_client(children: Sequence[Any], out: Path) -> None:
    """client.jsonl: every child's lines for its own backends, in child order, each child's
    file re-hashed against its manifest (changed since verification: not copied). Written
    when any child has one, so the combined run is judged on its load generator's health:
    a child from before client.jsonl existed then has no samples for its buckets, which the
    judge's client_healthy calls INCONCLUSIVE (missing data is never a pass)."""
    from soakspec.evidence import layout
    from soakspec.evidence.io import write_bytes_atomic

    lines: list[bytes] = []
    listed = False
    for c in children:
        sha = (c.evidence.manifest.get("artifacts") or {}).get(layout.CLIENT)
        if sha is None:
            continue
        listed = True
        try:
            data = (Path(c.evidence.root) / layout.CLIENT).read_bytes()
        except OSError:
            raise CopyMismatch(f"{c.dir}/{layout.CLIENT} changed after it was verified") from None
        if hashlib.sha256(data).hexdigest() != sha:
            raise CopyMismatch(f"{c.dir}/{layout.CLIENT} changed after it was verified")
        names = {b.name for b in c.evidence.backends}
        for line in data.splitlines(keepends=True):
            try:
                row = json.loads(line)
            except ValueError:
                continue  # a partial or corrupt line: verification reported it
            if isinstance(row, dict) and row.get("backend") in names:
                lines.append(line if line.endswith(b"\n") else line + b"\n")
    if listed:
        write_bytes_atomic(out / layout.CLIENT, b"".join(lines))


def _write_results(out: Path, spec: Any) -> None:
    """results.json and verdict.json, bound to the final manifest, as `soakspec run` writes them."""
    from soakspec.evidence.results import write_results, write_verdict
    from soakspec.judge.evidence import load_evidence, spec_itl_thresholds, spec_windows
    from soakspec.judge.joined import join
    from soakspec.judge.judge import judge_run
    from soakspec.judge.summary import summarize_run

    run = join(spec, load_evidence(out, windows=spec_windows(spec), itl_thresholds=spec_itl_thresholds(spec)))
    write_results(out, summarize_run(run))
    write_verdict(out, judge_run(run).to_json())


def _no_directory_reason(children: Sequence[Any], series: bool, changed: list[str], failed: list[str]) -> str | None:
    """Why no combined evidence directory is written (None: it is). Never one that could pass
    where the combination does not: judged as one run with the first child's spec, it cannot
    see what a failed combination check saw."""
    if changed:
        return f"evidence that does not verify ({', '.join(changed)}): no combined evidence directory"
    if series:
        return ("a before/after series: no combined evidence directory; "
                f"compare the runs with `soakspec compare {children[0].dir} {children[-1].dir}`")
    if failed:
        return (f"the combination fails {', '.join(failed)}: no combined evidence directory (judged as one run with "
                f"the first child's spec, it could not see what {'these checks' if len(failed) > 1 else 'the check'} "
                "saw); judge or report each child on its own")
    return None


def main(args: argparse.Namespace) -> int:
    from soakspec.cli import UsageError
    from soakspec.commands.gate import load_for_judging
    from soakspec.evidence.io import EvidenceError, write_bytes_atomic, write_json_atomic
    from soakspec.evidence.manifest import write_manifest
    from soakspec.evidence.verify import finalize_artifacts
    from soakspec.judge.combine import Child, before_after, combine, render_text, without_requests
    from soakspec.judge.rederive import rederive
    from soakspec.judge.joined import join
    from soakspec.judge.judge import judge_run

    seen: dict[str, str] = {}
    for d in args.dirs:  # `run`, `run/`, `./run` and a symlink to it are one directory
        real = os.path.realpath(d)
        if real in seen:
            raise UsageError(f"the same directory is given twice ({seen[real]} and {d})")
        seen[real] = d
    out = Path(args.out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise UsageError(f"--out {args.out} exists and is not an empty directory")
    from soakspec.commands.outpath import refuse_inside_evidence

    refuse_inside_evidence(args.out, args.dirs)  # a child's evidence would no longer verify
    children = []
    for d in args.dirs:
        where = str(d).rstrip("/") or "/"
        loaded = load_for_judging("combine", d, None, name_dir=True)
        if isinstance(loaded, int):
            return loaded
        spec, evidence = loaded
        # judged and re-derived now, then held without its requests (`without_requests`): the
        # next child is read with none of this one's table in memory. The judge's join has
        # re-derived the evidence already -- the trace re-match, most of the time -- and that is
        # combine's own re-derivation unless a sweep narrowed it or another spec ran the run.
        run = join(spec, evidence)
        verdict = judge_run(run)
        rederived = run.evidence if not run.sweep and run.ran_spec is None else None
        del run  # its indexes, before a re-derivation of its own
        if rederived is None:
            rederived = rederive(spec, evidence)
        children.append(Child(where, spec, without_requests(evidence), verdict, without_requests(rederived)))
        del loaded, evidence, rederived
    runs: dict[str, str] = {}
    for c in children:  # a copy of a run is that run: not a before/after series of itself
        sha = c.evidence.manifest_sha256
        if sha is not None and sha in runs:
            raise UsageError(f"the same run is given twice: {runs[sha]} and {c.dir} hold one manifest (sha256 {sha[:12]})")
        if sha is not None:
            runs[sha] = c.dir
    result = combine(children)
    doc = result.to_json()
    series = before_after(children)
    changed = [c.dir for c in children if c.evidence.integrity.tampered or c.evidence.integrity.malformed]
    failed = [k.name for k in result.checks if k.status == "fail"]
    why = _no_directory_reason(children, series, changed, failed)
    as_evidence = why is None
    doc["evidence_directory"] = as_evidence
    doc["evidence_directory_reason"] = why
    try:
        out.mkdir(parents=True, exist_ok=True)
        if as_evidence:
            _copy_backends(children, out)
            _copy_client(children, out)
        sha = write_json_atomic(out / COMBINED, doc)
        write_bytes_atomic(out / (COMBINED + ".sha256"), f"{sha}  {COMBINED}\n".encode())
        if as_evidence:
            m = combined_manifest(children)
            m["artifacts"] = finalize_artifacts(out)
            write_manifest(out, m)
            _write_results(out, children[0].spec)
    except CopyMismatch as e:
        print(f"soakspec combine: {e}; nothing combined", file=sys.stderr)
        return ExitCode.GATE_FAILED
    except (OSError, EvidenceError) as e:
        print(f"soakspec combine: cannot write {out}: {e}", file=sys.stderr)
        return ExitCode.ABORTED
    if args.format == "json":
        print(json.dumps(dict(doc, combined_sha256=sha), indent=2, sort_keys=True, ensure_ascii=False))
    else:
        print(render_text(result))
        if why is not None:
            print(why, file=sys.stderr)
        else:
            print(f"wrote {out} (an evidence directory: soakspec verify/gate/report {out})", file=sys.stderr)
        print(f"wrote {out / COMBINED} (sha256 {sha})", file=sys.stderr)
    return result.exit_code
