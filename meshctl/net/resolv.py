"""The resolvers in ``/etc/resolv.conf`` (whose port 53 DNS capture redirects, as Istio does).

Invariant: an unreadable file means "no resolvers known", never an exception; the caller decides
what no resolver means (istio-iptables then leaves DNS uncaptured, with a warning).
"""

from __future__ import annotations

import logging
from pathlib import Path

from meshctl.core.capture.settings import Address, nameservers

log = logging.getLogger(__name__)

RESOLV_CONF = Path("/etc/resolv.conf")


def system_nameservers(path: Path = RESOLV_CONF) -> tuple[Address, ...]:
    try:
        return nameservers(path.read_text(encoding="utf-8", errors="replace"))
    except OSError as exc:
        log.debug("cannot read %s: %s", path, exc)
        return ()
