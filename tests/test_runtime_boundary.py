"""Runtime boundary detection from the spec's declaration, the launched env and the server log."""

from __future__ import annotations

import pytest

from soakspec.evidence.runtime import RuntimeDecl, detect_runtime_boundary, is_generic_label, validate_log_regex

LABEL = "NCCL 2.26.2, NCCL_IB_DISABLE=1, NCCL_P2P_DISABLE=1"
RX = r"NCCL version (\d+\.\d+\.\d+)"
ENV = {"NCCL_IB_DISABLE": "1", "NCCL_P2P_DISABLE": "1", "PATH": "/usr/bin"}
LOG = "INFO starting\nrank0: NCCL version 2.26.2+cuda12.4\nrank1: NCCL version 2.26.2+cuda12.4\n"


@pytest.mark.parametrize("label", ["", "  ", "unknown", "Unknown", "n/a", "N/A", "none", "default", "nccl", "NCCL",
                                   "NCCL default", "cuda", "TBD", None])
def test_generic_labels(label):
    assert is_generic_label(label)


@pytest.mark.parametrize("label", ["host-staged", "NCCL 2.26.2", LABEL, "NCCL, NCCL_IB_DISABLE=1", "gloo tcp", "nvlink p2p"])
def test_specific_labels(label):
    assert not is_generic_label(label)


def test_confirmed_from_log_and_env():
    rb = detect_runtime_boundary(RuntimeDecl(LABEL, RX, "2.26.2"), ENV, LOG)
    assert rb.status == "confirmed" and rb.detected_version == "2.26.2" and rb.display == LABEL
    assert dict(rb.env_observed) == {"NCCL_IB_DISABLE": "1", "NCCL_P2P_DISABLE": "1"}  # never the whole env
    j = rb.to_json()
    assert j["detected"] == "2.26.2" and j["status"] == "confirmed" and j["declared"] == LABEL


def test_version_in_the_label_is_the_expected_version():
    assert detect_runtime_boundary(RuntimeDecl(LABEL, RX), ENV, LOG).status == "confirmed"
    rb = detect_runtime_boundary(RuntimeDecl(LABEL, RX), ENV, LOG.replace("2.26.2", "2.21.5"))
    assert rb.status == "contradictory" and "2.21.5" in rb.details[0] and "2.26.2" in rb.details[0]


def test_contradictory_version_and_several_versions():
    rb = detect_runtime_boundary(RuntimeDecl(LABEL, RX, "2.26.2"), ENV, "NCCL version 2.21.5\n")
    assert rb.status == "contradictory" and rb.detected_version == "2.21.5"
    rb = detect_runtime_boundary(RuntimeDecl(LABEL, RX, "2.26.2"), ENV, "NCCL version 2.26.2\nNCCL version 2.21.5\n")
    assert rb.status == "contradictory" and "several versions" in rb.details[0]


def test_named_version_group():
    rb = detect_runtime_boundary(RuntimeDecl("NCCL 2.26.2", r"(NCCL) version (?P<version>[\d.]+)"), {}, "NCCL version 2.26.2")
    assert rb.status == "confirmed" and rb.detected_version == "2.26.2"


def test_missing_log_line_or_env_var():
    rb = detect_runtime_boundary(RuntimeDecl(LABEL, RX, "2.26.2"), ENV, "no nccl here\n")
    assert rb.status == "missing" and "not found in the server log" in rb.details[0]
    rb = detect_runtime_boundary(RuntimeDecl(LABEL, RX, "2.26.2"), {"NCCL_IB_DISABLE": "1"}, LOG)
    assert rb.status == "missing" and any("NCCL_P2P_DISABLE is not set" in d for d in rb.details)
    assert dict(rb.env_observed)["NCCL_P2P_DISABLE"] is None


def test_env_with_another_value_is_contradictory():
    rb = detect_runtime_boundary(RuntimeDecl(LABEL, RX, "2.26.2"), {**ENV, "NCCL_IB_DISABLE": "0"}, LOG)
    assert rb.status == "contradictory" and "NCCL_IB_DISABLE=0" in rb.details[0]


def test_required_env_declared_explicitly():
    decl = RuntimeDecl("host-staged", required_env={"STAGING": "host", "ANY": None})
    assert detect_runtime_boundary(decl, {"STAGING": "host", "ANY": "x"}, "").status == "confirmed"
    assert detect_runtime_boundary(decl, {"STAGING": "host"}, "").status == "missing"


def test_generic_undeclared_and_declared():
    assert detect_runtime_boundary(None, ENV, LOG).status == "undeclared"
    assert detect_runtime_boundary(RuntimeDecl(), ENV, LOG).status == "undeclared"
    rb = detect_runtime_boundary(RuntimeDecl("nccl", RX), ENV, LOG)
    assert rb.status == "generic" and "generic" in rb.details[0]
    assert detect_runtime_boundary(RuntimeDecl(""), ENV, LOG).status == "generic"
    rb = detect_runtime_boundary(RuntimeDecl("host-staged"), ENV, LOG)
    assert rb.status == "declared" and rb.display == "host-staged"


def test_display_without_a_label_comes_from_detection():
    rb = detect_runtime_boundary(RuntimeDecl(None, RX, "2.26.2", {"NCCL_IB_DISABLE": "1"}), ENV, LOG)
    assert rb.status == "confirmed" and rb.display == "version 2.26.2, NCCL_IB_DISABLE=1"


def test_secret_env_values_are_redacted_in_the_observation():
    rb = detect_runtime_boundary(RuntimeDecl("x-mode", required_env={"HF_TOKEN": None}), {"HF_TOKEN": "hf_secret"}, "")
    assert rb.status == "confirmed" and dict(rb.env_observed) == {"HF_TOKEN": "<redacted>"}


def test_validate_log_regex():
    assert validate_log_regex(RX) is None
    assert "invalid regular expression" in validate_log_regex("NCCL (")
    assert "group" in validate_log_regex("NCCL version")


def test_boundary_is_frozen():
    rb = detect_runtime_boundary(RuntimeDecl("host-staged"), {}, "")
    with pytest.raises(AttributeError):
        rb.status = "confirmed"


@pytest.mark.parametrize("label", ["NCCL x.y.z", "nccl 2", "NCCL vX", "NCCL x.y.z, NCCL_IB_DISABLE=1"])
def test_a_versioned_runtime_without_its_version_is_generic(label):
    rb = detect_runtime_boundary(RuntimeDecl(label), {"NCCL_IB_DISABLE": "1"}, "NCCL version 2.26.2\n")
    assert rb.status == "generic" and "names NCCL without a version" in rb.details[0]


def test_a_label_version_is_checked_against_the_runtimes_own_log_line():
    env = {"NCCL_IB_DISABLE": "1"}
    label = "NCCL 2.26.2, NCCL_IB_DISABLE=1"
    assert detect_runtime_boundary(RuntimeDecl(label), env, "NCCL version 2.18.1\n").status == "contradictory"
    assert detect_runtime_boundary(RuntimeDecl(label), env, "NCCL version 2.26.2\n").status == "confirmed"
    unconfirmed = detect_runtime_boundary(RuntimeDecl(label), env, "ready\n")
    assert unconfirmed.status == "declared" and any("nothing in the server log confirms it" in d for d in unconfirmed.details)


def test_a_required_secret_variable_is_checked_but_its_value_never_said():
    """`require_env = ["HF_TOKEN"]`: the boundary confirms it is set, and neither its
    details (stored in the manifest, shown in reports) nor what it observed say the value."""
    decl = RuntimeDecl(label="host-staged", required_env=(("HF_TOKEN", None), ("MODE", "fast")))
    b = detect_runtime_boundary(decl, {"HF_TOKEN": "hf_live_SECRET_12345", "MODE": "fast"}, "")
    assert b.status == "confirmed"
    assert "hf_live_SECRET_12345" not in repr(b.to_json())
    assert "HF_TOKEN=<redacted> in the launched environment" in b.details and "MODE=fast in the launched environment" in b.details
    label = RuntimeDecl(label="API_KEY=sk-declared-0000 host-staged")
    c = detect_runtime_boundary(label, {"API_KEY": "sk-other-99999999"}, "")
    assert c.status == "contradictory"
    assert "sk-other-99999999" not in repr(c.to_json()) and "API_KEY=<redacted> in the launched environment" in c.details[0]
