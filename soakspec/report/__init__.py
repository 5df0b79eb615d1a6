"""Reports: a verdict and its evidence, rendered for people and for CI.

    evidence_meta(evidence) -> dict     what reports show about the run itself (pure)
    prepare(spec, evidence) -> Inputs   judge + summarize + evidence_meta, in one call (pure);
                                        meta["backend_status"]: each backend's status from its
                                        own rules (soakspec.report.status)
    render(verdict, results, evidence_meta, spec, fmt) -> str    one format, pure

Formats, one module each:
    md     soakspec.report.md      the PR-ready section: the seed's results table, workload,
                                   provenance, rules that did not pass, the claim boundary;
                                   passes `soakspec lint-claims` by construction
    html   soakspec.report.html    one self-contained page: inline SVG charts per backend and
                                   bucket (no script, no network), the tables
    junit  soakspec.report.junit   one <testcase> per rule
    json   soakspec.report.jsonfmt {schema_version, verdict, results}
    bench  soakspec.report.bench   each backend and level in vLLM bench serve's result-block
                                   layout, marked `Tool: soakspec` (lint-claims checks it)

`soakspec report DIR` (soakspec.commands.report) does the I/O: it loads and verifies the
evidence, re-judges it (a stored verdict.json is never read) and calls `render`.
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Mapping, Sequence
from typing import Any

_MODULES = {"md": "soakspec.report.md", "html": "soakspec.report.html", "json": "soakspec.report.jsonfmt",
            "junit": "soakspec.report.junit", "bench": "soakspec.report.bench"}
FORMATS = tuple(_MODULES)
_PERCENTILE_FORMATS = ("md", "html", "bench")  # the formats whose tables `--percentiles` chooses


def evidence_meta(evidence: Any) -> dict[str, Any]:
    """The run-level facts a report shows, from an `Evidence`: its manifest, the manifest's
    sha256, the directory and what verification found."""
    integ = evidence.integrity

    def findings(fs: Any) -> list[dict[str, Any]]:
        return [{"path": f.path, "code": f.code, "message": f.message, "line": f.line} for f in fs]

    return {
        "run_id": evidence.run_id,
        "dir": evidence.root,
        "manifest": evidence.manifest,
        "manifest_sha256": evidence.manifest_sha256,
        "integrity": {
            "verified": integ.verified,
            "checked": integ.checked,
            "tampered": findings(integ.tampered),
            "malformed": findings(integ.malformed),
            "incomplete": findings(integ.incomplete),
        },
    }


@dataclasses.dataclass(frozen=True)
class Inputs:
    verdict: Any
    results: Mapping[str, Any]
    meta: Mapping[str, Any]
    spec: Any

    def render(self, fmt: str, percentiles: Sequence[str] | None = None) -> str:
        return render(self.verdict, self.results, self.meta, self.spec, fmt, percentiles)


def prepare(spec: Any, evidence: Any) -> Inputs:
    """Judge `evidence` with `spec` and collect everything `render` needs (pure)."""
    from soakspec.judge.joined import join
    from soakspec.judge.judge import judge_run
    from soakspec.judge.summary import summarize_run

    from soakspec.report.status import backend_statuses

    run = join(spec, evidence)  # once: indexing a long soak's records is the costly part
    verdict = judge_run(run)
    meta = evidence_meta(evidence)
    meta["backend_status"] = backend_statuses(run, verdict)  # each backend's own rules
    return Inputs(verdict, summarize_run(run), meta, spec)


def render(verdict: Any, results: Mapping[str, Any], evidence_meta: Mapping[str, Any], spec: Any, fmt: str,
           percentiles: Sequence[str] | None = None) -> str:
    """Render one format (`md`, `html`, `json`, `junit`, `bench`); pure, deterministic, ends in a newline.
    `percentiles` (results.json keys, `common.parse_percentiles`; None: p50, p95, p99): what the
    Markdown and HTML tables and the bench blocks show; JSON carries every stored percentile and JUnit none."""
    if fmt not in _MODULES:
        raise ValueError(f"unknown report format {fmt!r} (one of {', '.join(FORMATS)})")
    module = importlib.import_module(_MODULES[fmt])
    if percentiles is not None and fmt in _PERCENTILE_FORMATS:
        return module.render(verdict, results, evidence_meta, spec, percentiles=tuple(percentiles))
    return module.render(verdict, results, evidence_meta, spec)


__all__ = ["FORMATS", "Inputs", "evidence_meta", "prepare", "render"]
