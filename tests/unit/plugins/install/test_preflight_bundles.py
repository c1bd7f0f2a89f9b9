"""Install's preflight keeps a live Gateway API CRD of a newer bundle (says so, applies nothing
over it) and applies over an older one."""

from __future__ import annotations

from typing import Any

from meshctl_plugins.install.apply import Installer

from meshctl.core.k8s.install.manifest import Rendered


def crd(name: str, version: str, *, ours: bool = True) -> dict[str, Any]:
    labels = {"install.meshctl.io/component": "crds"} if ours else {}
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": name,
            "labels": labels,
            "annotations": {"gateway.networking.k8s.io/bundle-version": version},
        },
    }


class Mapper:
    def served(self, api_version: str, kind: str) -> bool:
        return True


class LiveInventory:
    """The cluster's objects by name (what preflight reads)."""

    def __init__(self, *live: dict[str, Any]) -> None:
        self.kube = None
        self.mapper = Mapper()
        self._live = {o["metadata"]["name"]: o for o in live}

    def get(self, obj: dict[str, Any]) -> dict[str, Any] | None:
        return self._live.get(obj["metadata"]["name"])


def test_a_newer_live_bundle_is_kept_and_an_older_one_applied_over():
    ours = [
        Rendered(component="crds", revisioned=False, object=crd("gateways.x", "v1.6.3")),
        Rendered(component="crds", revisioned=False, object=crd("httproutes.x", "v1.6.3")),
    ]
    inventory = LiveInventory(
        crd("gateways.x", "v1.7.0", ours=False), crd("httproutes.x", "v1.5.0")
    )
    said: list[str] = []
    installer = Installer(inventory, None, None, ours, say=said.append)  # type: ignore[arg-type]
    problems = installer.preflight()
    assert problems == []  # the foreign newer one is no take-over either
    assert [r.key for r in installer.rendered] == [ours[1].key]
    assert len(said) == 1
    assert "kept: the cluster has bundle v1.7.0" in said[0]
    assert "gateways.x" in said[0]
