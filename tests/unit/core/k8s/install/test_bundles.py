"""Install never downgrades a bundled CRD: a newer live Gateway API bundle is kept and said."""

from __future__ import annotations

from meshctl.core.k8s.install import bundles


def crd(version: str | None) -> dict[str, object]:
    annotations = {} if version is None else {"gateway.networking.k8s.io/bundle-version": version}
    return {"kind": "CustomResourceDefinition", "metadata": {"annotations": annotations}}


def test_a_newer_live_bundle_is_kept_and_says_why():
    assert bundles.keep_live(crd("v1.6.3"), crd("v1.7.0")) == (
        "kept: the cluster has bundle v1.7.0 (gateway.networking.k8s.io/bundle-version), newer "
        "than this install's v1.6.3"
    )
    assert bundles.keep_live(crd("v1.6.3"), crd("v1.6.10")) is not None  # numeric, not text


def test_an_older_equal_absent_or_unreadable_live_bundle_is_applied_over():
    for live in (crd("v1.6.3"), crd("v1.5.1"), crd(None), crd("main"), None):
        assert bundles.keep_live(crd("v1.6.3"), live) is None
    assert bundles.keep_live({"metadata": {}}, crd("v9.9.9")) is None  # not a bundled CRD of ours
