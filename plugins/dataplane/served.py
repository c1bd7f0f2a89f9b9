"""The seams inside the data plane: what a traffic path sees of the workload it serves, and what
that workload sees of its process.

Owns two protocols over the process-wide state both share (``Shared``). ``Served`` is what the
paths (inbound, inbound plaintext, outbound) read and call; ``Local`` implements it, one per
served workload. ``Process`` is what a ``Local`` delegates to; ``Runtime`` implements it.
Invariant: the paths and ``Local`` depend on these protocols, never on the modules that implement
them, so the data plane's files import each other in one direction only (runtime -> local ->
paths -> served).
"""

from __future__ import annotations

from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import socket

    from meshctl.core.mesh.records import Workload
    from meshctl.core.mesh.store import Store
    from meshctl.core.pki.identity import SpiffeId
    from meshctl.core.wire import channel
    from meshctl.core.wire.hbone import TunnelSettings
    from meshctl.proxy.pool import Pool
    from meshctl.proxy.telemetry import Telemetry
    from meshctl.proxy.tls import TlsContexts


class Shared(Protocol):
    """The process-wide state both see: one store snapshot, telemetry, config, drain."""

    @property
    def store(self) -> Store: ...
    @property
    def telemetry(self) -> Telemetry: ...
    @property
    def config(self) -> channel.ProxyConfig: ...
    @property
    def own_ports(self) -> frozenset[int]: ...
    @property
    def tunnel_settings(self) -> TunnelSettings: ...
    @property
    def draining(self) -> bool: ...

    def spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        """Run ``coro`` as a task the drain cancels."""
        ...


class Process(Shared, Protocol):
    """The data plane's process, as a ``Local`` sees it."""

    @property
    def ready(self) -> bool: ...


class Served(Shared, Protocol):
    """One served workload as the traffic paths see it."""

    @property
    def me(self) -> Workload | None: ...  # our record in the store, once it is there
    @property
    def identity(self) -> SpiffeId: ...
    @property
    def contexts(self) -> TlsContexts | None: ...  # None until a certificate arrives
    @property
    def baggage(self) -> str: ...
    @property
    def pool(self) -> Pool: ...

    def upstream_socket(
        self, ip: str, *, inbound: bool = False, source: str | None = None
    ) -> socket.socket:
        """A non-blocking TCP socket for a connection made for this workload."""
        ...

    def is_local_ip(self, ip: str) -> bool:
        """Whether ``ip`` is an address of this workload's namespace."""
        ...
