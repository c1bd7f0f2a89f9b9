"""L4 authorization: Istio's ALLOW/DENY semantics, field by field, including ``not`` forms."""

from __future__ import annotations

import pytest

from meshctl.core.mesh.authz import ConnectionFacts, evaluate
from meshctl.core.mesh.localconfig import parse_local_config
from meshctl.core.pki.identity import SpiffeId

ALICE = SpiffeId("cluster.local", "default", "alice")
BOB = SpiffeId("cluster.local", "prod", "bob")


def policies(*specs):
    doc = {"policies": [{"namespace": "prod", "scope": "Namespace", **s} for s in specs]}
    for i, p in enumerate(doc["policies"]):
        p.setdefault("name", f"p{i}")
    return parse_local_config(doc).policies


def conn(src=ALICE, ip="10.0.0.1", dst="10.0.0.2", port=80):
    return ConnectionFacts.of(src, ip, dst, port)


def rule(**match):
    return [[[match]]]


def test_no_policies_allow_everything():
    d = evaluate([], conn())
    assert (d.allowed, d.reason) == (True, "no policies")


def test_a_matching_deny_refuses_even_when_an_allow_matches():
    ps = policies(
        {"action": "Allow", "rules": rule(namespaces=["default"])},
        {"action": "Deny", "rules": rule(destinationPorts=[80])},
    )
    d = evaluate(ps, conn())
    assert (d.allowed, d.reason) == (False, "denied by prod/p1")


def test_only_denies_allow_the_rest():
    ps = policies({"action": "Deny", "rules": rule(destinationPorts=[9999])})
    assert evaluate(ps, conn(port=80)).allowed
    assert not evaluate(ps, conn(port=9999)).allowed


def test_with_an_allow_policy_one_must_match():
    ps = policies({"action": "Allow", "rules": rule(principals=["cluster.local/ns/prod/sa/bob"])})
    assert evaluate(ps, conn(src=BOB)).allowed
    d = evaluate(ps, conn(src=ALICE))
    assert (d.allowed, d.reason) == (False, "no ALLOW policy matched")


def test_a_policy_without_rules_never_matches():
    assert evaluate(policies({"action": "Deny", "rules": []}), conn()).allowed
    assert not evaluate(policies({"action": "Allow", "rules": []}), conn()).allowed


@pytest.mark.parametrize(
    ("match", "facts", "expected"),
    [
        ({"namespaces": ["default"]}, conn(), True),
        ({"namespaces": ["prod"]}, conn(), False),
        ({"notNamespaces": ["default"]}, conn(), False),
        ({"serviceAccounts": [{"namespace": "default", "serviceAccount": "alice"}]}, conn(), True),
        (
            {"notServiceAccounts": [{"namespace": "default", "serviceAccount": "alice"}]},
            conn(),
            False,
        ),
        ({"principals": ["*"]}, conn(), True),
        ({"principals": ["*"]}, conn(src=None), False),
        ({"notPrincipals": ["*"]}, conn(src=None), True),  # "deny plaintext"
        ({"principals": ["cluster.local/ns/default/*"]}, conn(), True),
        ({"principals": ["*/sa/bob"]}, conn(), False),
        ({"principals": [{"Exact": "cluster.local/ns/default/sa/alice"}]}, conn(), True),
        ({"sourceIps": ["10.0.0.0/24"]}, conn(), True),
        ({"notSourceIps": ["10.0.0.1"]}, conn(), False),
        ({"destinationIps": ["10.0.0.2/32"]}, conn(), True),
        ({"notDestinationIps": ["10.0.0.0/8"]}, conn(), False),
        ({"destinationPorts": [80, 443]}, conn(), True),
        ({"notDestinationPorts": [80]}, conn(), False),
        ({"namespaces": ["default"], "destinationPorts": [443]}, conn(), False),  # fields AND
        ({"sourceIps": ["10.0.0.0/24"], "notSourceIps": ["10.0.0.1/32"]}, conn(), False),
    ],
)
def test_each_match_field_and_its_not_form(match, facts, expected):
    ps = policies({"action": "Deny", "rules": rule(**match)})
    assert evaluate(ps, facts).allowed is not expected


def test_clauses_and_matches_nest_as_or_of_and_of_or():
    # rule = [clause1, clause2]: clause1 = ns default OR ns prod; clause2 = port 80.
    rules = [
        [[{"namespaces": ["default"]}, {"namespaces": ["prod"]}], [{"destinationPorts": [80]}]]
    ]
    ps = policies({"action": "Deny", "rules": rules})
    assert not evaluate(ps, conn(src=ALICE, port=80)).allowed
    assert not evaluate(ps, conn(src=BOB, port=80)).allowed
    assert evaluate(ps, conn(src=ALICE, port=81)).allowed  # second clause fails the AND
    # Two rules OR: either one denies.
    ps = policies(
        {"action": "Deny", "rules": [[[{"destinationPorts": [1]}]], [[{"destinationPorts": [80]}]]]}
    )
    assert not evaluate(ps, conn()).allowed


def test_dry_run_policies_report_but_do_not_enforce():
    ps = policies({"action": "Deny", "dryRun": True, "rules": rule(destinationPorts=[80])})
    d = evaluate(ps, conn())
    assert d.allowed
    assert d.dry_run_denials == ("prod/p0",)


def test_empty_rules_clauses_and_matches_read_as_ztunnel_reads_them():
    # A rule with no clauses holds: Istio's "rules: [{}]" (allow everything).
    assert not evaluate(policies({"action": "Deny", "rules": [[]]}), conn()).allowed
    # A clause with no matches holds; the rule still needs its other clause.
    rules = [[[], [{"destinationPorts": [80]}]]]
    assert not evaluate(policies({"action": "Deny", "rules": rules}), conn(port=80)).allowed
    assert evaluate(policies({"action": "Deny", "rules": rules}), conn(port=81)).allowed
    # A match with no field set never holds (ztunnel skips it).
    assert evaluate(policies({"action": "Deny", "rules": [[[{}]]]}), conn()).allowed


@pytest.mark.parametrize(
    ("namespaces", "expected"),
    [(["def*"], True), (["*ault"], True), (["*"], True), ([{"Exact": "prod"}], False)],
)
def test_namespaces_are_string_matches(namespaces, expected):
    ps = policies({"action": "Deny", "rules": rule(namespaces=namespaces)})
    assert evaluate(ps, conn()).allowed is not expected
