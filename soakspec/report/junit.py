"""`--format junit`: one <testcase> per rule, for CI systems.

    <testsuites name="soakspec" tests failures errors skipped time>
      <testsuite name="<soak>" ... time>
        <properties> verdict, run_id, manifest_sha256, spec_sha256, rehearsal, time_scale
        <testcase classname="<rule class>" name="<rule text>">
          <failure message="<explanation>" type="fail">...</failure>    a failed rule
          <error message="<reason>" type="inconclusive">...</error>     a required rule not decided
          <skipped message="<reason>"/>                                 not evaluated (a validity or
                                                                        evidence rule failed first),
                                                                        or a warn rule not decided
          <system-out>observed value, threshold, scope, samples, where</system-out>

A required rule that could not be decided is an error, not a skip: the verdict is INCONCLUSIVE
(exit 3), and a CI that shows only this file must not show it green -- missing data is never a
pass. A rule not evaluated is skipped: it was not judged because a required validity or
evidence rule failed, whose <failure> already fails the suite. A `warn` rule never fails the
gate: one that did not hold passes and says so in its system-out, one that could not be
decided is skipped.

Times: the suite's `time` is the run's wall time in seconds, the manifest's start to its end
(`started_at_epoch`, `ended_at_epoch`: the run clock's); absent where the manifest has no end (a
run never finalized) -- never a 0 that reads as measured. A <testcase> carries no `time`: a
rule is judged over the run's evidence, not run for a time of its own, and the run's time on
each would have a CI that sums its cases count the soak once per rule. JUnit's readers take
the attribute as optional (Jenkins's junit-10.xsd; GitLab and GitHub's reporters read a
missing one as 0). Built with xml.etree (attribute and text escaping); characters XML 1.0 cannot
carry are replaced first (`common.clean_text`), so the output always parses.
"""

from __future__ import annotations

import math
import xml.etree.ElementTree as ET
from collections.abc import Mapping
from typing import Any

from soakspec.report import common as C


def _x(value: Any) -> str:
    return C.clean_text(value)


def _wall_s(meta: Mapping[str, Any]) -> float | None:
    """The run's wall time (s), from its manifest's start to its end; None without both."""
    m = meta.get("manifest")
    m = m if isinstance(m, Mapping) else {}
    start, end = C.num(m.get("started_at_epoch")), C.num(m.get("ended_at_epoch"))
    if start is None or end is None or not math.isfinite(end - start) or end < start:
        return None
    return end - start


def render(verdict: Any, results: Mapping[str, Any], meta: Mapping[str, Any], spec: Any) -> str:
    rules = list(verdict.rules)
    n = verdict.counts()
    errors = sum(r.status == "inconclusive" and r.severity != "warn" for r in rules)
    failures, skipped = n["fail"], n["inconclusive"] + n["not_evaluated"] - errors
    soak = getattr(getattr(spec, "header", None), "name", None) or verdict.soak
    counts = {"tests": str(len(rules)), "failures": str(failures), "errors": str(errors), "skipped": str(skipped)}
    if (wall := _wall_s(meta)) is not None:
        counts["time"] = f"{wall:.3f}"
    root = ET.Element("testsuites", {"name": "soakspec", **counts})
    suite = ET.SubElement(root, "testsuite", {"name": _x(soak), **counts})
    props = ET.SubElement(suite, "properties")
    for name, value in (
        ("verdict", verdict.outcome),
        ("summary", verdict.summary()),
        ("run_id", meta.get("run_id") or verdict.run_id),
        ("manifest_sha256", meta.get("manifest_sha256") or verdict.manifest_sha256),
        ("spec_sha256", verdict.spec_sha256),
        ("evidence_spec_sha256", verdict.evidence_spec_sha256),
        ("rehearsal", str(verdict.rehearsal).lower()),
        ("time_scale", f"{verdict.time_scale:g}"),
        *(("note", n) for n in verdict.notes),  # a restricted run, a skipped pre-flight, ...
        *((f"run: {k}", v) for k, v in C.run_state_lines(meta)),  # status, abort time and reason, crash diagnosis
    ):
        if value is not None:
            ET.SubElement(props, "property", {"name": name, "value": _x(value)})
    for r in rules:
        case = ET.SubElement(suite, "testcase", {"classname": _x(r.klass), "name": _x(r.rule)})
        details = C.rule_detail_lines(r)
        body = "\n".join([r.message] + details)
        if r.status == "fail":
            el = ET.SubElement(case, "failure", {"message": _x(r.message), "type": "fail"})
            el.text = _x(body)
        elif r.status == "inconclusive" and r.severity != "warn":
            el = ET.SubElement(case, "error", {"message": _x(f"{r.status_word}: {r.message}"), "type": r.status})
            el.text = _x(body)
        elif r.status in ("inconclusive", "not_evaluated"):
            ET.SubElement(case, "skipped", {"message": _x(f"warn rule {r.status_word}: {r.message}")})
        out = C.observed_lines(r)
        if r.status == "warn":
            out.insert(0, "WARNING: this warn rule did not hold (warnings never fail the gate)")
        ET.SubElement(case, "system-out").text = "\n".join(out)
    ET.indent(root, space="  ")
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"
