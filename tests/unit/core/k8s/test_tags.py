"""Revision tags as data: the tag's webhook configuration (goldens), which namespaces it takes,
and when setting or removing one is refused."""

from __future__ import annotations

import base64
from pathlib import Path

import pytest
import yaml

from meshctl.core.k8s import tags
from meshctl.core.k8s.inject.webhook_config import WebhookTarget, webhook_configuration
from meshctl.errors import MeshctlError, UserError
from meshctl.output import yaml_text
from tests.harness.golden import assert_golden

GOLDEN = Path(__file__).resolve().parents[3] / "golden" / "tags"
PEM = b"-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"


def revision_configuration(name: str, *, bundle: bytes | None = PEM) -> dict[str, object]:
    """A revision's injector configuration as the cluster holds it after install."""
    service = "meshctl-controlplane" if name == "default" else f"meshctl-controlplane-{name}"
    live = webhook_configuration(
        ca_bundle=bundle,
        target=WebhookTarget(service=service, namespace="meshctl-system", port=443),
        revision=name,
    )
    live["metadata"]["labels"][tags.COMPONENT_LABEL] = "controlplane"  # type: ignore[index]
    return live


CANARY = tags.revision_of(revision_configuration("canary"))


def test_a_revisions_own_configuration_names_its_injector_and_bundle():
    assert CANARY is not None
    assert CANARY.name == "canary"
    assert CANARY.service == "meshctl-controlplane-canary"
    assert CANARY.namespace == "meshctl-system"
    assert (CANARY.port, CANARY.path) == (443, "/inject")
    assert CANARY.ca_bundle == PEM
    assert CANARY.configuration == "meshctl-sidecar-injector-canary"


def test_a_configuration_without_the_install_label_is_no_revision():
    live = revision_configuration("canary")
    del live["metadata"]["labels"][tags.COMPONENT_LABEL]  # type: ignore[index]
    assert tags.revision_of(live) is None


@pytest.mark.parametrize("tag", ["prod", "default"])
def test_the_tag_webhook_golden(tag):
    assert CANARY is not None
    assert_golden(GOLDEN / f"{tag}-to-canary.yaml.golden", yaml_text(tags.webhook(tag, CANARY)))


def test_the_tag_sends_pods_of_tag_labelled_namespaces_to_the_revisions_injector():
    assert CANARY is not None
    hook = tags.webhook("prod", CANARY)
    assert hook["metadata"]["name"] == "meshctl-revision-tag-prod"  # type: ignore[index]
    labels = hook["metadata"]["labels"]  # type: ignore[index]
    assert labels["istio.io/tag"] == "prod"
    assert labels["istio.io/rev"] == "canary"
    assert tags.COMPONENT_LABEL not in labels  # uninstall of a revision never deletes a tag
    webhooks = hook["webhooks"]  # type: ignore[index]
    for w in webhooks:
        assert w["clientConfig"]["service"]["name"] == "meshctl-controlplane-canary"
        assert base64.b64decode(w["clientConfig"]["caBundle"]) == PEM
    selected = [
        e
        for w in webhooks
        for e in w["namespaceSelector"]["matchExpressions"]
        if e["key"] == "istio.io/rev" and e["operator"] == "In"
    ]
    assert selected == [{"key": "istio.io/rev", "operator": "In", "values": ["prod"]}]
    assert tags.tag_of(hook) == tags.Tag(
        name="prod", revision="canary", configuration="meshctl-revision-tag-prod"
    )


def test_only_the_default_tag_takes_injection_enabled_namespaces():
    assert CANARY is not None
    names = {w["name"].split(".sidecar")[0] for w in tags.webhook("default", CANARY)["webhooks"]}  # type: ignore[index]
    assert {"namespace", "istio-namespace", "object"} <= names
    names = {w["name"].split(".sidecar")[0] for w in tags.webhook("prod", CANARY)["webhooks"]}  # type: ignore[index]
    assert names == {"prod.rev.namespace", "prod.rev.object"}


def test_a_revision_without_its_ca_bundle_yet_cannot_be_tagged():
    pending = tags.revision_of(revision_configuration("canary", bundle=None))
    assert pending is not None
    with pytest.raises(MeshctlError, match="no CA bundle"):
        tags.webhook("prod", pending)


def test_set_refuses_a_revision_that_is_not_installed():
    installed = tags.revisions([revision_configuration("default")])
    with pytest.raises(MeshctlError, match=r"'canary' is not installed.*default") as caught:
        tags.check_set("prod", "canary", installed, {}, overwrite=False)
    assert "meshctl install --revision canary" in (caught.value.hint or "")


def test_set_refuses_a_tag_named_as_an_installed_revision():
    installed = tags.revisions(
        [revision_configuration("default"), revision_configuration("canary")]
    )
    with pytest.raises(MeshctlError, match="name of an installed revision"):
        tags.check_set("default", "canary", installed, {}, overwrite=False)
    with pytest.raises(MeshctlError, match="name of an installed revision"):
        tags.check_set("canary", "default", installed, {}, overwrite=False)


def test_moving_an_existing_tag_needs_overwrite():
    installed = tags.revisions(
        [revision_configuration("default"), revision_configuration("canary")]
    )
    existing = {"prod": tags.Tag(name="prod", revision="default", configuration="x")}
    with pytest.raises(MeshctlError, match="already points at revision 'default'") as caught:
        tags.check_set("prod", "canary", installed, existing, overwrite=False)
    assert "--overwrite" in (caught.value.hint or "")
    assert tags.check_set("prod", "canary", installed, existing, overwrite=True).name == "canary"
    # Setting it again to where it points is no move.
    assert tags.check_set("prod", "default", installed, existing, overwrite=False).name == "default"


@pytest.mark.parametrize("bad", ["Prod", "-x", "a_b", "x" * 64, ""])
def test_a_tag_is_a_label_value(bad):
    with pytest.raises(UserError, match="invalid tag"):
        tags.validate_tag(bad)


NAMESPACES = [
    ("shop", {"istio.io/rev": "prod"}),
    ("books", {"istio.io/rev": "prod", "istio-injection": "enabled"}),  # the explicit label wins
    ("legacy", {"istio-injection": "enabled"}),
    ("new", {"meshctl-injection": "enabled"}),
    ("plain", {}),
    ("kube-system", {"kubernetes.io/metadata.name": "kube-system", "istio.io/rev": "prod"}),
]


def test_namespaces_using_a_tag_are_those_its_selectors_match():
    assert tags.namespaces_using("prod", NAMESPACES) == ["shop"]
    # istio-injection=enabled takes "books" for the default tag (as the default webhook would).
    assert tags.namespaces_using("default", NAMESPACES) == ["books", "legacy", "new"]


def test_list_rows_name_tag_revision_and_namespaces():
    configurations = [
        tags.webhook("prod", CANARY),  # type: ignore[arg-type]
        revision_configuration("canary"),
        {"metadata": {"name": "someone-else", "labels": {"istio.io/tag": "x"}}},
    ]
    found = tags.tags(configurations)
    assert tags.rows(found, NAMESPACES) == [
        {"tag": "prod", "revision": "canary", "namespaces": ["shop"]}
    ]


def test_remove_refuses_a_tag_in_use_unless_forced():
    existing = {"prod": tags.Tag(name="prod", revision="canary", configuration="c")}
    with pytest.raises(MeshctlError, match=r"still used by namespace.*shop") as caught:
        tags.check_remove("prod", existing, ["shop"], force=False)
    assert "--force" in (caught.value.hint or "")
    assert tags.check_remove("prod", existing, ["shop"], force=True).name == "prod"
    with pytest.raises(MeshctlError, match="not found"):
        tags.check_remove("staging", existing, [], force=False)


def test_golden_documents_are_valid_yaml_objects():
    paths = sorted(GOLDEN.glob("*.golden"))
    assert [p.name for p in paths] == [
        "default-to-canary.yaml.golden",
        "prod-to-canary.yaml.golden",
    ]
    for path in paths:
        assert yaml.safe_load(path.read_text())["kind"] == "MutatingWebhookConfiguration"
