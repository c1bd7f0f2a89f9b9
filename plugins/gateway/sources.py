"""Where the gateway's configuration comes from, and the one place the server reads it.

Owns ``ConfigHolder`` (the current ``GatewayConfig``, replaced whole: a request reads it once and
keeps that value to its end, so a config update never changes a request in flight) and the
standalone ``FileSource``: YAML files of Kubernetes objects, read with the house's bounded reader,
turned into a config by the core (``core.gateway.local``), polled and re-read when a file
changes. Invariant: a file that cannot be read or makes no config leaves the last good config
in place (logged once per change), so a half-written file never takes the gateway down.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import ssl
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from meshctl import inputs, keypair
from meshctl.core.gateway.config import GatewayConfig, KeyPair
from meshctl.core.gateway.local import ConfigProblemError, Local, gateway_config
from meshctl.errors import UserError
from meshctl.yamlread import yaml_documents

log = logging.getLogger(__name__)

Listener = Callable[[GatewayConfig], None]


class ConfigHolder:
    """The current configuration and who is told when it changes."""

    def __init__(self) -> None:
        self.current: GatewayConfig | None = None
        self._listeners: list[Listener] = []

    def subscribe(self, listener: Listener) -> None:
        self._listeners.append(listener)

    def replace(self, config: GatewayConfig) -> None:
        if self.current is not None and self.current.version == config.version:
            return
        self.current = config
        for listener in self._listeners:
            listener(config)


def usable_key_pair(pair: KeyPair) -> str:
    """ "" when the chain and key load into a TLS context together, else why not."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        keypair.load_key_pair(context, pair.chain_pem, pair.key_pem)
    except ssl.SSLError as exc:
        return f"certificate and key do not load ({exc.reason or exc})"
    return ""


def read_objects(paths: tuple[str, ...]) -> tuple[list[Any], str]:
    """Every object in the files (a ``v1 List`` unpacked) and a digest of their bytes."""
    limits = inputs.limits()
    found: list[Any] = []
    digest = hashlib.sha256()
    for name in paths:
        try:
            data = inputs.read_bytes(name, name, limits)
        except OSError as exc:
            raise UserError(
                f"cannot read {name}: {exc.strerror or exc}",
                hint="check the path given with -f",
            ) from exc
        digest.update(data)
        for document in yaml_documents(data, name, limits):
            value = document.data
            if isinstance(value, dict) and isinstance(value.get("items"), list):
                found.extend(value["items"])
            elif value is not None:
                found.append(value)
    return found, digest.hexdigest()[:12]


def load(paths: tuple[str, ...], gateway: str, trust_domain: str = "cluster.local") -> Local:
    """The config the files make for ``gateway`` (``UserError`` when they make none)."""
    items, digest = read_objects(paths)
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    try:
        return gateway_config(
            items,
            gateway=gateway,
            check=usable_key_pair,
            now=now,
            version=digest,
            trust_domain=trust_domain,
        )
    except ConfigProblemError as exc:
        raise UserError(
            f"{', '.join(paths)}: {exc}",
            hint="pass --gateway NAMESPACE/NAME (or 'ingress'), and a GatewayClass whose "
            "controllerName is meshctl.io/gateway-controller",
        ) from exc


class FileSource:
    """Polls ``paths`` and hands each new config to ``holder``."""

    def __init__(
        self,
        paths: tuple[str, ...],
        gateway: str,
        holder: ConfigHolder,
        trust_domain: str = "cluster.local",
    ) -> None:
        self.paths, self.gateway, self.holder = paths, gateway, holder
        self.trust_domain = trust_domain
        self._stamp: tuple[tuple[int, int], ...] = ()
        self._failed = ""

    def _stamps(self) -> tuple[tuple[int, int], ...]:
        out = []
        for name in self.paths:
            try:
                info = Path(name).stat()
                out.append((info.st_mtime_ns, info.st_size))
            except OSError:
                out.append((0, -1))
        return tuple(out)

    def poll(self) -> None:
        """Read the files again if any changed since the last read."""
        stamp = self._stamps()
        if stamp == self._stamp:
            return
        self._stamp = stamp
        try:
            local = load(self.paths, self.gateway, self.trust_domain)
        except UserError as exc:
            if str(exc) != self._failed:
                log.error("config not applied, keeping the last one: %s", exc)  # noqa: TRY400 (expected; no traceback)
                self._failed = str(exc)
            return
        self._failed = ""
        for problem in local.problems:
            log.warning("config: %s", problem)
        if self.holder.current is None or self.holder.current.version != local.config.version:
            log.info(
                "config %s for %s: %d listener port(s), %d certificate(s), %d backend(s)",
                local.config.version,
                local.config.name,
                len(local.config.table.ports),
                len(local.config.certificates),
                len(local.config.endpoints),
            )
        self.holder.replace(local.config)

    async def run(self, interval: float) -> None:
        while True:
            self.poll()
            await asyncio.sleep(interval)
