"""Root distribution under more than one name (Istio's ``istio-ca-root-cert`` beside ours): one
ConfigMap watch per name, every namespace reconciled only once every watch has listed, and each
name written with the same bundle and labels."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import pytest
from meshctl_plugins.controlplane import roots
from meshctl_plugins.controlplane.roots import RootPublisher
from meshctl_plugins.controlplane.settings import ControlPlaneSettings

from meshctl.errors import ConfigError
from meshctl.kube.informer import Informers
from tests.unit.kube.reflectors import Reflectors


def test_every_name_is_published_in_every_namespace_once_all_watches_listed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    created: list[tuple[str, str, dict[str, Any]]] = []

    def create(kube: object, resource: object, body: dict[str, Any], namespace: str) -> Any:
        created.append((namespace, body["metadata"]["name"], body))
        return body

    monkeypatch.setattr(roots.objects, "create", create)
    reflectors = Reflectors()

    async def scenario() -> None:
        informers = Informers(None, reflector=reflectors)
        names = ("meshctl-ca-root-cert", "istio-ca-root-cert")
        publisher = RootPublisher(informers, None, lambda: "PEM", names=names)  # type: ignore[arg-type]
        leading = asyncio.ensure_future(publisher.run())
        await asyncio.sleep(0.05)
        (namespaces,) = reflectors.of("namespaces")
        ours, istios = reflectors.of("configmaps")
        assert ours.selector.field_selector == "metadata.name=meshctl-ca-root-cert"
        assert istios.selector.field_selector == "metadata.name=istio-ca-root-cert"
        namespaces.send("ADDED", {"metadata": {"name": "shop", "resourceVersion": "1"}})
        namespaces.send("SYNCED", {})
        ours.send("SYNCED", {})
        await asyncio.sleep(0.1)
        assert not publisher.synced.is_set()  # Istio's name not listed yet: nothing written
        assert created == []
        istios.send("SYNCED", {})
        await asyncio.wait_for(publisher.synced.wait(), 2)
        async with asyncio.timeout(2):
            while len(created) < 2:
                await asyncio.sleep(0.01)
        leading.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await leading

    asyncio.run(scenario())
    assert sorted((ns, name) for ns, name, _ in created) == [
        ("shop", "istio-ca-root-cert"),
        ("shop", "meshctl-ca-root-cert"),
    ]
    for _, _, body in created:
        assert body["data"] == {"root-cert.pem": "PEM"}
        assert body["metadata"]["labels"] == roots.LABELS


def test_the_settings_publish_ours_first_and_refuse_a_name_that_is_no_configmap_name() -> None:
    settings = ControlPlaneSettings(root_configmap_aliases=("istio-ca-root-cert",))
    assert settings.root_configmaps == ("meshctl-ca-root-cert", "istio-ca-root-cert")
    assert ControlPlaneSettings().root_configmaps == ("meshctl-ca-root-cert",)
    with pytest.raises(ConfigError, match="is not a ConfigMap name"):
        ControlPlaneSettings(root_configmap_aliases=("Istio_CA",))
