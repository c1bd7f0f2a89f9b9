"""The control plane's parts share the process's informers: discovery and root distribution
read Namespaces from one list+watch and one cache, and a part that stops (a replica that stops
leading) leaves the watches the others still use running."""

from __future__ import annotations

import asyncio
import contextlib
from types import SimpleNamespace
from typing import Any

from meshctl_plugins.controlplane.cluster import Discovery
from meshctl_plugins.controlplane.metrics import Metrics
from meshctl_plugins.controlplane.roots import RootPublisher
from meshctl_plugins.controlplane.settings import ControlPlaneSettings

from meshctl.kube.informer import Informers
from meshctl.kube.resources import NAMESPACES
from tests.unit.kube.reflectors import Reflectors


def test_discovery_and_root_distribution_share_one_namespaces_watch() -> None:
    reflectors = Reflectors()

    async def scenario() -> None:
        informers = Informers(None, reflector=reflectors)
        discovery = Discovery(ControlPlaneSettings())
        tasks: list[asyncio.Task[Any]] = []
        plane = SimpleNamespace(
            informers=informers,
            server=SimpleNamespace(add=lambda *args: None),
            authenticator=None,
            metrics=Metrics(),
            issued=None,
            spawn=lambda coro, name: tasks.append(asyncio.ensure_future(coro)) or tasks[-1],
        )
        await discovery.start(plane)  # type: ignore[arg-type]
        roots = RootPublisher(informers, None, lambda: None)  # type: ignore[arg-type]
        leading = asyncio.ensure_future(roots.run())
        await asyncio.sleep(0.05)
        (namespaces,) = reflectors.of("namespaces")
        namespaces.send("ADDED", {"metadata": {"name": "shop", "resourceVersion": "1"}})
        for reflector in reflectors.made:
            reflector.send("SYNCED", {})
        await asyncio.wait_for(roots.synced.wait(), 2)
        async with asyncio.timeout(2):
            while discovery.not_ready():
                await asyncio.sleep(0.01)
        assert informers.informer(NAMESPACES).get("shop") is not None  # one cache for both

        leading.cancel()  # this replica stops leading
        with contextlib.suppress(asyncio.CancelledError):
            await leading
        (maps,) = reflectors.of("configmaps")
        assert maps.stopped  # nobody else needs the root ConfigMaps
        assert not namespaces.stopped  # discovery still reads Namespaces
        await discovery.stop()
        assert namespaces.stopped

    asyncio.run(scenario())
    assert len(reflectors.of("namespaces")) == 1
