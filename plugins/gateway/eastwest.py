"""One connection through an east-west port (Istio's ``AUTO_PASSTHROUGH``, 15443): its
ClientHello read, never terminated; its SNI ``outbound_.<port>_.<subset>_.<host>`` names the
Service port (``meshctl.core.gateway.eastwest``); the bytes spliced, unchanged, to a ready
endpoint of it: in plaintext TCP to an unmeshed one, inside an HBONE stream to a meshed one (the
gateway's own identity on the outer mTLS only; the client's mTLS stays inside, end to end).

Owns the east-west outcomes (docs/east-west.md): a hello refused or not complete in time is
handled as on a passthrough port; a malformed name, an unknown Service, port or subset, or a
port with no ready endpoint closes the connection without an alert (as Envoy does when no filter
chain takes the SNI) with the reason in the access log; no endpoint answering: closed, ``UF``.
Invariants are the passthrough port's (``passthrough.Passthrough``): bytes unchanged and in
order, half-closes passed on, the idle timeout, one access-log line and the ``istio_tcp_*``
counters per connection.
"""

from __future__ import annotations

import asyncio

from meshctl.core.gateway import eastwest

from .metrics import Sample
from .passthrough import Passthrough, StreamLog, splice


class EastWest(Passthrough):
    """The handler of east-west ports' connections (``__call__`` each, ``tls=True``)."""

    async def _serve(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        port: int,
        entry: StreamLog,
    ) -> None:
        greeting = await self._greeting(reader, writer, entry)
        if greeting is None:
            return
        hello, data, config = greeting
        found = eastwest.destination(config, hello.server_name, self.domain)
        entry.route = f"auto-passthrough :{port}"
        entry.reason = found.reason
        if found.service is not None:
            key = found.service
            entry.backend = str(key)
            entry.sample.update(
                service_host=f"{key.name}.{key.namespace}.svc.{self.domain}",
                service_name=key.name,
                service_namespace=key.namespace,
            )
        if found.outcome is not eastwest.Outcome.FORWARD:
            entry.flags = "UH" if found.outcome is eastwest.Outcome.NO_ENDPOINT else "NR"
            return
        upstream = await self._dial(found.endpoints, entry)
        if upstream is None:
            entry.reason = f"no-healthy-upstream (every endpoint of {found.service} refused)"
            entry.flags = "UF"
            return
        if self.metrics is not None:
            entry.opened = True
            self.metrics.connection_opened(Sample(status=0, protocol="tcp", **entry.sample))
        up_reader, up_writer = upstream
        entry.reason = found.reason
        up_writer.write(bytes(data))  # the hello and whatever followed it, unchanged
        await splice(reader, writer, up_reader, up_writer, self.limits.idle_timeout, entry)
