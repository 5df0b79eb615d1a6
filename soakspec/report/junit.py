"""`--format junit`: one <testcase> per rule, for CI systems.

    <testsuites name="soakspec" tests failures errors="0" skipped>
      <testsuite name="<soak>" ...>
        <properties> verdict, run_id, manifest_sha256, spec_sha256, rehearsal, time_scale
        <testcase classname="<rule class>" name="<rule text>" time="0">
          <failure message="<explanation>" type="fail">...</failure>    a failed rule
          <skipped message="<reason>"/>                                 inconclusive / not evaluated
          <system-out>observed value, threshold, scope, samples, where</system-out>

A `warn` rule that did not hold passes (warnings never fail the gate) and says so in its
system-out. Built with xml.etree (attribute and text escaping); characters XML 1.0 cannot
carry are replaced first (`common.clean_text`), so the output always parses.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from collections.abc import Mapping
from typing import Any

from soakspec.report import common as C


def _x(value: Any) -> str:
    return C.clean_text(value)


def render(verdict: Any, results: Mapping[str, Any], meta: Mapping[str, Any], spec: Any) -> str:
    rules = list(verdict.rules)
    n = verdict.counts()
    failures, skipped = n["fail"], n["inconclusive"] + n["not_evaluated"]
    soak = getattr(getattr(spec, "header", None), "name", None) or verdict.soak
    counts = {"tests": str(len(rules)), "failures": str(failures), "errors": "0", "skipped": str(skipped), "time": "0"}
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
        case = ET.SubElement(suite, "testcase", {"classname": _x(r.klass), "name": _x(r.rule), "time": "0"})
        details = C.rule_detail_lines(r)
        body = "\n".join([r.message] + details)
        if r.status == "fail":
            el = ET.SubElement(case, "failure", {"message": _x(r.message), "type": "fail"})
            el.text = _x(body)
        elif r.status in ("inconclusive", "not_evaluated"):
            reason = f"{r.status_word}: {r.message}"
            if r.severity == "warn":
                reason = "warn rule " + reason
            ET.SubElement(case, "skipped", {"message": _x(reason)})
        out = C.observed_lines(r)
        if r.status == "warn":
            out.insert(0, "WARNING: this warn rule did not hold (warnings never fail the gate)")
        ET.SubElement(case, "system-out").text = "\n".join(out)
    ET.indent(root, space="  ")
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"
