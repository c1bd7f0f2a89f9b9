"""The gateway process's entry: the event loop (uvloop, installed here only) and its config
source: the ``-f`` files, or the control plane's Delta xDS (``XDS_ADDRESS``) through
``xds_source.follow(config, gateway, deliver, stop)``, the controller's side of the seam, loaded
by name when it is there."""

from __future__ import annotations

import asyncio
import importlib
import logging
from collections.abc import Callable, Coroutine
from typing import Any

from meshctl import logs
from meshctl.errors import UserError

from .server import Gateway
from .settings import GatewaySettings
from .sources import ConfigHolder, FileSource, load

log = logging.getLogger(__name__)


XDS_SOURCE = f"{__package__}.xds_source"


def discovery(settings: GatewaySettings) -> Callable[[ConfigHolder], Coroutine[Any, Any, None]]:
    """The xDS source for ``settings`` (checked now: a usage error before anything binds)."""
    if not settings.gateway:
        raise UserError(
            "discovery needs the gateway's name",
            hint="pass --gateway NAMESPACE/NAME (or 'ingress'), or set GATEWAY_NAME",
        )
    try:
        module = importlib.import_module(XDS_SOURCE)
    except ModuleNotFoundError as exc:
        raise UserError(
            "this build has no xDS source for the gateway",
            hint="pass -f FILE (Kubernetes objects) instead",
        ) from exc
    from meshctl.proxy.xds_client import build_config  # grpc: only with a control plane

    config = build_config(settings)

    async def follow(holder: ConfigHolder) -> None:
        await module.follow(config, settings.gateway, holder.replace, asyncio.Event())

    return follow


def serve(settings: GatewaySettings, log_args: tuple[str, ...] = ()) -> int:
    """Serve until SIGTERM; a configuration the files cannot make stops here, before binding.
    With ``settings.workers`` > 1 this process supervises that many workers (``workers``)."""
    import uvloop

    follow = None if settings.config else discovery(settings)
    if settings.config:
        for problem in load(settings.config, settings.gateway, settings.trust_domain).problems:
            log.warning("config: %s", problem)  # the first read says what is wrong at once
    if settings.workers > 1:
        from .workers import supervise

        return supervise(settings, settings.workers, log_args, follow)

    async def main() -> None:
        logs.defer_writes(asyncio.get_running_loop().call_soon)
        holder = ConfigHolder()
        gateway = Gateway(settings, holder)
        if follow is not None:
            await gateway.run([lambda: follow(holder)])
            return
        source = FileSource(settings.config, settings.gateway, holder, settings.trust_domain)
        await gateway.run([lambda: source.run(settings.reload_interval)])

    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(main())
    return 0
