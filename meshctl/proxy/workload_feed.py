"""What the supervisor sends a proxy's data plane: certificates, and the workloads of one store.

Owns ``WorkloadFeed``: certificates from a certificate feed (files, the CA, or one per identity),
workloads from one ``SourcedStore`` with two sources, the local config (``local``: what the
certificate feed sends as ``Workloads``, read and checked by ``file_sources``) and discovery
(``xds``: ``xds_client.XdsClient``, with a control plane), as ztunnel merges its local config and
xDS into one state. Invariants: a removal by one source never drops the other's records (where
both hold a key the local config wins); the data plane gets the whole store once, then each
change as ``WorkloadUpdates``; with discovery it gets no workloads until the client has ACKed a
response of every type (so it is not ready before: ztunnel's rule), and the client's state for
``/config_dump`` when it changes; grpc is loaded only for a proxy with a control plane.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import TYPE_CHECKING

from meshctl.core.mesh.localconfig import LocalConfig, parse_local_config
from meshctl.core.mesh.render import render, update_to_plain
from meshctl.core.mesh.store import SourcedStore, Store, Update
from meshctl.core.wire import channel
from meshctl.process import Feed

if TYPE_CHECKING:
    from meshctl.core.wire.dump import DiscoveryFacts

    from .xds_client import XdsClient, XdsConfig

log = logging.getLogger(__name__)


class WorkloadFeed(Feed):
    """Certificates from ``certs``; workloads from the local config ``certs`` sends and, with
    ``client_config``, from discovery."""

    def __init__(self, *, certs: Feed, client_config: XdsConfig | None = None) -> None:
        self._certs = certs
        self.store = SourcedStore(("local", "xds"))
        self.client: XdsClient | None = None
        if client_config is not None:
            from .xds_client import XdsClient  # grpc: only for a proxy with a control plane

            self.client = XdsClient(
                client_config, self._changed, self._state_changed, store=self.store, source="xds"
            )
        self._generation = 0
        self._pending: list[channel.Message] = []
        self._sent_state: DiscoveryFacts | None = None
        self._wake = asyncio.Event()
        self._stop = asyncio.Event()
        self._sent_snapshot = False
        self._not_workloads(certs.current())  # the local config as read at start
        # Without discovery every data plane gets the store in ``current``: changes follow it.
        self._sent_snapshot = self.client is None

    @property
    def synced(self) -> bool:
        """Whether the data plane may have the workloads (discovery, if any, has synced)."""
        return self.client is None or self.client.synced.is_set()

    def _changed(self, _store: Store, updates: list[Update]) -> None:
        self._generation += 1
        if self._sent_snapshot:
            plain = tuple(update_to_plain(u) for u in updates)
            self._pending.append(
                channel.WorkloadUpdates(updates=plain, generation=self._generation)
            )
        self._wake.set()

    def _state_changed(self) -> None:
        self._wake.set()

    def _snapshot(self) -> channel.Workloads:
        store = self.store.current
        document: LocalConfig = {
            "workloads": [render(w) for w in store.workloads],
            "services": [render(s) for s in store.services],
            "policies": [render(p) for p in store.policies],
        }
        return channel.Workloads(document=document, generation=self._generation)

    def _not_workloads(self, messages: list[channel.Message]) -> list[channel.Message]:
        """``messages`` but the local config's, which feed the store's ``local`` source."""
        out: list[channel.Message] = []
        for m in messages:
            if isinstance(m, channel.Workloads):
                # Checked by the source that read it (``file_sources.read_local_config``).
                changed = self.store.replace("local", parse_local_config(m.document))
                if changed:
                    self._changed(self.store.current, changed)
            elif not isinstance(m, channel.WorkloadUpdates):  # no certificate feed sends these
                out.append(m)
        return out

    def current(self) -> list[channel.Message]:
        out = self._not_workloads(self._certs.current())
        if self.synced:
            out.append(self._snapshot())
        if self.client is not None:
            out.append(channel.XdsState(state=self.client.state()))
        return out

    def changes(self) -> list[channel.Message]:
        out = self._not_workloads(self._certs.changes())
        if self.synced and not self._sent_snapshot:
            self._sent_snapshot = True
            self._pending.clear()  # the snapshot has them
            out.append(self._snapshot())
        out += self._pending
        self._pending = []
        if self.client is not None:
            state = self.client.state()
            if state != self._sent_state:
                self._sent_state = state
                out.append(channel.XdsState(state=state))
        return out

    async def wait(self, timeout: float) -> None:
        if self.client is None:  # only polled sources: as the certificate feed waits
            await self._certs.wait(timeout)
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._wake.wait(), timeout)
        self._wake.clear()

    async def run(self) -> None:
        """The certificates' own work (a CA client renewing) beside the discovery client."""
        if self.client is None:
            await self._certs.run()
            return
        await asyncio.gather(self._certs.run(), self._discover(self.client))

    async def _discover(self, client: XdsClient) -> None:
        while True:
            try:
                await client.run(self._stop)
            except Exception:  # a bug in the client must not leave the proxy without discovery
                log.exception("discovery client failed; restarting it")
                await asyncio.sleep(1.0)
