"""The run: scope by namespace, order, exit code, thresholds, the report, a failing family, and
reading -f documents (file:line, default namespace, layering over live objects)."""

from __future__ import annotations

import pytest

from meshctl.core.analyze import codes as registry
from meshctl.core.analyze.findings import Level
from meshctl.core.analyze.run import Scope, analyze, exit_code, report_text, scope_of
from meshctl.core.analyze.snapshot import Item, Snapshot, layered, read_documents
from meshctl.structured import InputError, Limits

from .objects import healthy, namespace, policy, run


def test_findings_outside_the_namespaces_analyzed_are_not_shown():
    objects = [*healthy(), namespace("other"), policy("typo", "other", selector={"app": "x"})]
    assert [f.code.id for f in run(objects)] == ["MSH0101"]
    assert run(objects, {"shop"}) == []
    assert [f.code.id for f in run(objects, {"other"})] == ["MSH0101"]


def test_the_scope_of_a_run_follows_istioctl_and_the_files():
    files = read_documents([("app.yaml", DOCS)], "default", Limits())
    assert scope_of(all_namespaces=True, namespace=None, files=files, live=True) == Scope(None)
    assert scope_of(all_namespaces=False, namespace=None, files=files, live=False) == Scope(None)
    only = scope_of(all_namespaces=False, namespace="team", files=files, live=True)
    assert only == Scope(frozenset({"team"}))
    layered = scope_of(all_namespaces=False, namespace=None, files=files, live=True)
    assert layered == Scope(frozenset({"default", "shop"}))
    bare = scope_of(all_namespaces=False, namespace=None, files=[], live=True)
    assert bare == Scope(frozenset({"default"}))
    # Without -n a live run reads the kubeconfig context's namespace, as kubectl and istioctl.
    ctx = scope_of(
        all_namespaces=False, namespace=None, files=[], live=True, context_namespace="team"
    )
    assert ctx == Scope(frozenset({"team"}))


def test_errors_come_first_and_decide_the_exit_code():
    objects = [
        *healthy(),
        policy("typo", selector={"app": "x"}),
        namespace("a", **{"istio.io/rev": "x"}),
    ]
    found = run(objects)
    assert [f.level for f in found] == [Level.ERROR, Level.WARNING]
    assert exit_code(found) == 3
    assert exit_code(found[1:]) == 0
    assert exit_code(found[1:], Level.WARNING) == 3
    assert exit_code([]) == 0


def test_the_report_is_istioctls_lines_with_a_fix_each():
    found = run([*healthy(), policy("typo", selector={"app": "x"})])
    text = report_text(found, Scope(frozenset({"shop"})))
    first, fix = text.splitlines()
    assert first.startswith("Warning [MSH0101] (AuthorizationPolicy shop/typo) The selector")
    assert fix.startswith("    Fix: ")
    assert report_text([], Scope(frozenset({"shop"}))) == (
        "\u2714 No validation issues found when analyzing namespace: shop.\n"
    )


def test_a_family_that_raises_is_one_finding_and_the_others_still_run():
    def broken(snapshot):
        raise KeyError("spec")
        yield  # pragma: no cover

    def fine(snapshot):
        yield from ()

    found = analyze(Snapshot(()), Scope(None), [("broken", broken), ("fine", fine)])
    assert [f.code.id for f in found] == ["MSH0001"]
    assert "The broken checks stopped: KeyError" in found[0].message


def test_codes_are_unique_and_never_reused():
    ids = [c.id for c in registry.CODES]
    assert len(ids) == len(set(ids))
    assert len({c.name for c in registry.CODES}) == len(ids)


DOCS = """\
apiVersion: v1
kind: Namespace
metadata: {name: shop, labels: {istio-injection: enabled}}
---
apiVersion: v1
kind: List
items:
- apiVersion: security.istio.io/v1
  kind: AuthorizationPolicy
  metadata: {name: typo}
  spec: {selector: {matchLabels: {app: x}}}
"""


def test_file_objects_carry_file_and_line_and_the_default_namespace():
    items = read_documents([("app.yaml", DOCS)], "shop", Limits())
    assert [(i.kind, i.namespace, str(i.origin)) for i in items] == [
        ("Namespace", "", "app.yaml:1"),
        ("AuthorizationPolicy", "shop", "app.yaml:8"),
    ]


def test_files_replace_the_live_objects_they_name():
    live = [Item(o) for o in healthy()]
    files = read_documents(
        [("ns.yaml", "kind: Namespace\napiVersion: v1\nmetadata: {name: shop}\n")],
        "default",
        Limits(),
    )
    snapshot = layered(live, files)
    assert snapshot.namespaces()["shop"] == {"kubernetes.io/metadata.name": "shop"}
    assert len(snapshot.items) == len(live)


@pytest.mark.parametrize("text", ["- a\n- b\n", "kind: Pod\nmetadata: {}\n"])
def test_a_document_that_is_no_object_is_refused_with_its_line(text):
    with pytest.raises(InputError, match=r"x\.yaml") as raised:
        read_documents([("x.yaml", "---\n" + text)], "default", Limits())
    assert raised.value.line == 2
