"""The server names Istio's east-west gateway routes on (``AUTO_PASSTHROUGH``, port 15443).

A sidecar reaching a service in another network sends, still encrypted end to end, the SNI
``outbound_.<port>_.<subset>_.<service host>`` (Istio's DNS-SRV form of its cluster name, as
``BuildDNSSrvSubsetKey`` in pilot/pkg/model/service.go writes it: the subset is empty for the
whole service, e.g. ``outbound_.8080_._.httpbin.default.svc.cluster.local``). Istio's gateway
matches that SNI exactly against the names it built, so only the canonical form routes: this
module parses exactly what ``format_auto_passthrough`` writes, and says why anything else is not
such a name. Invariants: pure; names compare lower-case (DNS names are case-insensitive).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_DIRECTION = "outbound"
_SEPARATOR = "_."
_LABEL = re.compile(r"[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?")  # RFC 1123 label (Istio's subsets)
MAX_HOST = 253  # RFC 1035 §2.3.4, written without the trailing dot


class ServerNameError(ValueError):
    """A server name that is not an AUTO_PASSTHROUGH name; the message says which part."""


@dataclass(frozen=True, slots=True, kw_only=True)
class AutoPassthroughName:
    port: int  # the service port
    subset: str  # a DestinationRule subset, "" for every endpoint of the service
    host: str  # the service's host, e.g. httpbin.default.svc.cluster.local


def format_auto_passthrough(name: AutoPassthroughName) -> str:
    """The SNI a client sends to reach ``name`` through an east-west gateway."""
    return f"{_DIRECTION}{_SEPARATOR}{name.port}{_SEPARATOR}{name.subset}{_SEPARATOR}{name.host}"


def parse_auto_passthrough(server_name: str) -> AutoPassthroughName:
    """The port, subset and host ``server_name`` names; ``ServerNameError`` when it is not the
    canonical ``outbound_.<port>_.<subset>_.<host>``."""
    if not server_name.isascii():  # lower() would fold e.g. the Kelvin sign into "k"
        raise ServerNameError(f"{server_name!r} is not ASCII")
    name = server_name.lower()
    parts = name.split(_SEPARATOR, 3)
    if len(parts) != 4:
        raise ServerNameError(
            f"{server_name!r} is not outbound_.<port>_.<subset>_.<host> "
            f"({len(parts) - 1} of 3 '_.' separators)"
        )
    direction, port_text, subset, host = parts
    if direction != _DIRECTION:
        raise ServerNameError(f"{server_name!r}: direction {direction!r}, not {_DIRECTION!r}")
    canonical = port_text.isascii() and port_text.isdigit() and not port_text.startswith("0")
    if not canonical or int(port_text) > 65535:
        raise ServerNameError(
            f"{server_name!r}: port {port_text!r} is not 1-65535 written without leading zeros"
        )
    port = int(port_text)
    if subset and not _LABEL.fullmatch(subset):
        raise ServerNameError(f"{server_name!r}: subset {subset!r} is not a DNS label")
    _check_host(server_name, host)
    return AutoPassthroughName(port=port, subset=subset, host=host)


def _check_host(server_name: str, host: str) -> None:
    if not host:
        raise ServerNameError(f"{server_name!r}: no service host after the subset")
    if len(host) > MAX_HOST:
        raise ServerNameError(f"{server_name!r}: host of {len(host)} characters, over {MAX_HOST}")
    for label in host.split("."):
        if not _LABEL.fullmatch(label):
            raise ServerNameError(f"{server_name!r}: host label {label!r} is not a DNS label")
