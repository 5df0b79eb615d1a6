"""The metric catalogue and the judge's registry name the same things.

A metric or predicate the checker accepts but the judge cannot compute would only surface when
a gate is judged, after the soak ran; a judge function for a name no spec can write is dead
code. Both directions fail here.
"""

import ast
import pathlib

import pytest

import soakspec.judge
from soakspec.judge import judge
from soakspec.judge.registry import BY_NAME, RULES
from soakspec.judge.testing import EvidenceBuilder, small_spec
from soakspec.lang.metrics import EVIDENCE_PREDICATES, GOODPUT, METRICS, Kind

CATALOGUE = set(METRICS) | set(EVIDENCE_PREDICATES) | {GOODPUT}  # goodput(...) / goodput_rate(...): SLO_FUNCTIONS

# a threshold of each result kind that every value of a clean run satisfies with `>=`
AT_LEAST_ZERO = {Kind.DURATION: "0s", Kind.SIZE: "0B", Kind.RATIO: "0%", Kind.RATE: "0rps", Kind.COUNT: "0", Kind.NUMBER: "0"}


def test_every_catalogue_name_has_a_judge_implementation():
    missing = sorted(CATALOGUE - set(BY_NAME))
    assert not missing, f"declared in soakspec.lang.metrics but not registered in soakspec.judge.registry.RULES: {missing}"


def test_every_registered_spec_name_is_declared_in_the_catalogue():
    unknown = sorted(e.name for e in RULES if e.in_spec and e.name not in CATALOGUE)
    assert not unknown, f"registered for specs but not declared in the catalogue: {unknown}"
    # the judge's own built-ins must stay out of what a spec can write
    own = sorted(e.name for e in RULES if not e.in_spec)
    assert own == ["abort_fired", "client_healthy", "full_scale_run", "min_samples"]
    assert not set(own) & CATALOGUE


def test_each_name_is_registered_once_with_the_function_its_class_needs():
    names = [e.name for e in RULES]
    assert len(names) == len(set(names))
    for e in RULES:
        if e.name in METRICS:
            assert e.klass == "performance" and e.measure is not None and e.check is None, e
        elif e.name == GOODPUT:  # judged with the rule's SLO set, not only its name
            assert e.klass == "performance" and e.check is not None and e.measure is None, e
        else:
            assert e.klass in ("validity", "evidence") and e.check is not None and e.measure is None, e


def _predicate_rule(name: str) -> str:
    kind = EVIDENCE_PREDICATES[name]
    return f"require {name}" if kind is Kind.BOOL else f"require {name} >= {AT_LEAST_ZERO[kind]}"


@pytest.mark.parametrize("name", sorted(EVIDENCE_PREDICATES))
def test_the_checker_and_the_registry_agree_on_a_predicates_class(name):
    """The checker decides a rule's class (validity/evidence); the judge judges it in that
    class: they must not disagree."""
    spec = small_spec(_predicate_rule(name))
    (rule,) = spec.gate.rules
    assert rule.klass == BY_NAME[name].klass
    v = judge(spec, EvidenceBuilder(spec).build())
    judged = [r for r in v.rules if r.metric == name and not r.builtin]
    assert len(judged) == 1 and judged[0].klass == rule.klass


def _metric_rule(name: str) -> str:
    if name == "server":  # names one of the server's own metrics (the builder's /metrics has it)
        return 'require max(server("vllm:num_requests_running")) >= 0 per level'
    m = METRICS[name]
    agg = "count" if m.bare_ok else next(a for a in m.aggregates if a != "p")
    expr = name if agg == "count" else f"{agg}({name})"
    return f"require {expr} >= {AT_LEAST_ZERO[m.result_kind(agg)]} per level"


@pytest.mark.parametrize("name", sorted(METRICS))
def test_every_catalogue_metric_is_computed_on_a_clean_run(name):
    """Each metric yields a value on a clean run, and `>= 0` holds on every level."""
    spec = small_spec(_metric_rule(name), duration="3m")
    v = judge(spec, EvidenceBuilder(spec).build())
    (r,) = [r for r in v.rules if r.klass == "performance"]
    assert r.status == "pass", r.text()
    assert isinstance(r.observed, float) and r.observed >= 0
    assert r.instances == 1


def test_the_judge_dispatches_nothing_by_name():
    """Rules are found in the registry, never with getattr(obj, some_string)."""
    root = pathlib.Path(soakspec.judge.__file__).parent
    found = []
    for path in sorted(root.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "getattr":
                found.append(f"{path.name}:{node.lineno}")
    assert not found


def test_rule_order_built_ins_then_the_specs_rules_by_class():
    """Per class: an unwritten built-in first, then the spec's rules in spec order, then the
    built-ins a spec cannot write; performance last. `require X` replaces built-in X; a
    `warn X` does not."""
    spec = small_spec("require failed == 0\nrequire bucket_coverage\nrequire artifacts_verified\nwarn completed_run")
    v = judge(spec, EvidenceBuilder(spec).build())
    assert [(r.metric, r.builtin, r.severity) for r in v.rules] == [
        ("completed_run", True, "require"),
        ("completed_run", False, "warn"),
        ("full_scale_run", True, "require"),
        ("min_samples", True, "require"),
        ("client_healthy", True, "require"),
        ("bucket_coverage", False, "require"),
        ("artifacts_verified", False, "require"),
        ("failed", False, "require"),
    ]
    spec = small_spec("require completed_run\nwarn artifacts_verified")
    v = judge(spec, EvidenceBuilder(spec).build())
    assert [(r.metric, r.builtin) for r in v.rules] == [
        ("completed_run", False), ("full_scale_run", True), ("min_samples", True), ("client_healthy", True),
        ("artifacts_verified", True), ("artifacts_verified", False),
    ]
