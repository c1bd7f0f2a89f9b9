"""The gateway proxies' configs as discovery serves them: the controller publishes, streams read.

Owns the published ``GatewayConfig`` per proxy name (``<namespace>/<gateway>``, or ``ingress``),
each stamped with the digest of its content as its version, who may read which (``may_read``),
and the ``delta.Catalog`` a discovery stream sees of them. Invariants: a publish replaces the
whole set at once and tells each listener exactly the names whose content changed (added,
changed, removed); an unchanged config keeps its version, so no stream is sent it again;
``synced`` is set by the first publish (streams asking for a gateway's config wait for it, so a
restarting control plane never tells a proxy its config was removed); a caller reads only the
configs of its own namespace (they carry private keys: Istio's gateways read only their own
namespace's credentials), the ``ingress`` proxy's only from the control plane's namespace.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable, Iterable, Mapping

from meshctl.core.gateway.config import GatewayConfig
from meshctl.core.pki.callers import Caller
from meshctl.core.xds.delta import Plain
from meshctl.gateway_wire import digest

INGRESS = "ingress"  # the proxy name of the Ingress classes' gateway

Listener = Callable[[set[str]], None]


def may_read(caller: Caller, name: str, *, ingress_namespace: str) -> bool:
    """Whether ``caller`` may be sent the config named ``name`` (it holds private keys)."""
    if name == INGRESS:
        return caller.namespace == ingress_namespace
    namespace, _, gateway = name.partition("/")
    return bool(gateway) and namespace == caller.namespace


class GatewayConfigs:
    """The current configs by proxy name; one writer (the controller), many readers."""

    def __init__(self) -> None:
        self._configs: dict[str, GatewayConfig] = {}
        self._listeners: list[Listener] = []
        self.synced = asyncio.Event()

    @property
    def current(self) -> Mapping[str, GatewayConfig]:
        return self._configs

    def subscribe(self, listener: Listener) -> None:
        self._listeners.append(listener)

    def publish(self, configs: Iterable[GatewayConfig]) -> set[str]:
        """Replace every config; returns (and tells the listeners) the names that changed."""
        fresh: dict[str, GatewayConfig] = {}
        for config in configs:
            version = digest(config)
            old = self._configs.get(config.name)
            fresh[config.name] = (
                old
                if old is not None and old.version == version
                else dataclasses.replace(config, version=version)
            )
        changed = {n for n in fresh.keys() | self._configs.keys() if n not in fresh}
        changed |= {n for n, c in fresh.items() if self._configs.get(n) is not c}
        self._configs = fresh
        first = not self.synced.is_set()
        self.synced.set()
        if changed or first:  # the first publish also wakes the streams waiting for it
            for listener in self._listeners:
                listener(changed)
        return changed


class GatewayCatalog(Plain):
    """What one stream may see of the configs (``core.xds.delta.Catalog``)."""

    def __init__(
        self, configs: Mapping[str, GatewayConfig], caller: Caller, *, ingress_namespace: str
    ) -> None:
        self._configs = configs
        self._caller = caller
        self._ingress_namespace = ingress_namespace

    def _allowed(self, name: str) -> bool:
        return may_read(self._caller, name, ingress_namespace=self._ingress_namespace)

    def resolve(self, name: str) -> tuple[str, str] | None:
        config = self._configs.get(name)
        if config is None or not self._allowed(name):
            return None
        return name, config.version

    def view(self) -> Iterable[str]:
        return [n for n in self._configs if self._allowed(n)]

    def in_view(self, key: str) -> bool:
        return key in self._configs and self._allowed(key)
