"""The gateway process's entry: the event loop (uvloop, installed here only) and its sources."""

from __future__ import annotations

import asyncio
import logging

from meshctl import logs

from .server import Gateway
from .settings import GatewaySettings
from .sources import ConfigHolder, FileSource, load

log = logging.getLogger(__name__)


def serve(settings: GatewaySettings) -> None:
    """Serve until SIGTERM; a configuration the files cannot make stops here, before binding."""
    import uvloop

    for problem in load(settings.config, settings.gateway, settings.trust_domain).problems:
        log.warning("config: %s", problem)  # the first read says what is wrong at once

    async def main() -> None:
        logs.defer_writes(asyncio.get_running_loop().call_soon)
        holder = ConfigHolder()
        gateway = Gateway(settings, holder)
        source = FileSource(settings.config, settings.gateway, holder, settings.trust_domain)
        await gateway.run([source.run(settings.reload_interval)])

    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(main())
