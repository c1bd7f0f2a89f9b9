"""One gateway data-plane worker (``meshctl gateway run --workers N`` starts N of them): its
listeners, fed by the supervisor over the channel.

Owns the worker's side of the channel: ``Hello``, then ``ProxyConfig`` (its index), every
``GatewayUpdate`` into its ``ConfigHolder``, ``Certs`` into its mesh identity, ``Drain`` (finish
requests in flight up to the deadline, then ``Drained`` and exit 0). Its readiness goes back as
``Status`` whenever it changes; on the descriptor channel, ``GatewayListeners``: the listening
sockets the supervisor bound, which it serves (every worker accepts from the same queue).
Invariants: a worker binds no port itself and serves no port of its own (readiness, metrics,
admin are the supervisor's), and ignores SIGTERM/SIGINT: the supervisor decides when it drains;
a closed channel (the supervisor is gone) drains it too.
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import json
import logging
import os
import signal
import socket
from typing import Any

from meshctl import descriptors, gateway_wire, logs
from meshctl.core.pki.identity import SpiffeId
from meshctl.core.wire import channel

from .identity import MeshIdentity
from .server import Gateway
from .settings import GatewaySettings
from .sources import ConfigHolder

log = logging.getLogger(__name__)

SETTINGS_ENV = "MESHCTL_GATEWAY_WORKER_SETTINGS"
_STATUS_INTERVAL = 0.05


def settings_text(settings: GatewaySettings) -> str:
    """The supervisor's resolved settings for its workers (an environment variable's value)."""
    return json.dumps(dataclasses.asdict(settings))


def settings_from(text: str) -> GatewaySettings:
    values: dict[str, Any] = json.loads(text)
    values["config"] = tuple(values.get("config") or ())
    return GatewaySettings(**values)


class Worker:
    def __init__(self, settings: GatewaySettings, sock: socket.socket) -> None:
        self.settings = settings
        self.sock = sock
        self.holder = ConfigHolder()
        self.index = -1
        self.gateway: Gateway | None = None
        self.identity: MeshIdentity | None = None
        self.listeners: descriptors.Receiver | None = None

    def _start(self, config: channel.ProxyConfig) -> Gateway:
        self.index = config.worker
        if config.workload:  # the supervisor has a mesh identity: its certificates follow
            self.identity = MeshIdentity(SpiffeId.parse(config.workload))
        return Gateway(
            self.settings,
            self.holder,
            identity=self.identity,
            supervised=True,
            name=f"gateway worker={config.worker} pid={os.getpid()}",
        )

    async def run(self) -> int:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, lambda: None)  # the supervisor drains us
        reader, writer = await asyncio.open_connection(sock=self.sock)
        writer.write(channel.encode(channel.Hello(pid=os.getpid())))
        decoder = channel.Decoder()
        tasks: list[asyncio.Task[None]] = []
        deadline = self.settings.drain_deadline
        try:
            while True:
                data = await reader.read(65536)
                if not data:
                    log.warning("the gateway supervisor is gone; draining")
                    break
                drain = None
                for message in decoder.feed(data):
                    drain = self._apply(message, writer, tasks) if drain is None else drain
                if drain is not None:
                    deadline = drain
                    break
        except (ConnectionError, channel.ChannelError) as exc:
            log.error("gateway worker channel: %s; draining", exc)  # noqa: TRY400 (expected; no traceback)
        remaining = 0
        if self.listeners is not None:
            self.listeners.close()
        if self.gateway is not None:
            self.gateway.settings = dataclasses.replace(self.settings, drain_deadline=deadline)
            await self.gateway.drain()
            remaining = len(self.gateway.connections)
        for task in tasks:
            task.cancel()
        if not writer.is_closing():
            writer.write(channel.encode(channel.Drained(remaining=remaining)))
            await writer.drain()
            writer.close()
        return 0

    def _apply(
        self,
        message: channel.Message,
        writer: asyncio.StreamWriter,
        tasks: list[asyncio.Task[None]],
    ) -> float | None:
        """Act on one message from the supervisor; a drain's deadline when it says drain."""
        if isinstance(message, channel.ProxyConfig) and self.gateway is None:
            self.gateway = self._start(message)
            if message.pod_channel >= 0:
                self.listeners = descriptors.Receiver(
                    message.pod_channel, self._adopt, "gateway listener"
                )
            tasks.append(asyncio.create_task(self.gateway.retry_binds()))
            tasks.append(asyncio.create_task(self._report(writer)))
        elif isinstance(message, channel.GatewayUpdate):
            self.holder.replace(gateway_wire.decode(base64.b64decode(message.config)))
        elif isinstance(message, channel.Certs) and self.identity is not None:
            self.identity.replace(message)
        elif isinstance(message, channel.Drain):
            return message.deadline
        return None

    def _adopt(self, message: channel.Message, fds: list[int]) -> None:
        if not isinstance(message, channel.GatewayListeners) or len(fds) != len(message.ports):
            raise channel.ChannelError(f"unexpected {message.TYPE} with {len(fds)} descriptor(s)")
        if self.gateway is not None:  # always: the receiver starts with the gateway
            pairs = zip(message.ports, fds, strict=True)
            self.gateway.adopt({port: socket.socket(fileno=fd) for port, fd in pairs})

    async def _report(self, writer: asyncio.StreamWriter) -> None:
        """Tell the supervisor whenever this worker's readiness changes (a bind is async)."""
        said: bool | None = None
        while True:
            gateway = self.gateway
            ready = gateway is not None and gateway.ready
            if ready != said and not writer.is_closing():
                writer.write(channel.encode(channel.Status(ready=ready)))
                said = ready
            await asyncio.sleep(_STATUS_INTERVAL)


def run(channel_fd: int) -> int:
    """Serve until drained; the settings come from the supervisor's environment variable."""
    import uvloop

    settings = settings_from(os.environ[SETTINGS_ENV])
    sock = socket.socket(fileno=channel_fd)

    async def main() -> int:
        logs.defer_writes(asyncio.get_running_loop().call_soon)
        return await Worker(settings, sock).run()

    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(main())
