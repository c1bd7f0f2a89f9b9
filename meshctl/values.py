"""The values users type into flags, env vars and settings files: parsed and range-checked.

Each parser is a small value that knows its help metavar (``PORT``, ``DURATION``, ``N``)
and, called on the raw value, returns the parsed one or raises ``ValueError`` with a one-line
reason that states the allowed range, e.g. ``'70000' is not a port (1-65535)``. Parsers accept
an already-parsed value too (a YAML number from a settings file, a group's option handed down to
a subcommand), so running one twice changes nothing. Pure: no I/O. Plain classes, not
dataclasses: this module is on every command's start-up path (the root's --request-timeout), and
generating a dataclass's methods costs more than the rest of the module.
"""

from __future__ import annotations

import ipaddress
import math
import re
from typing import Any

# Go's time.ParseDuration units (what Istio, ztunnel and kubectl accept), plus days for TTLs.
_UNITS = {
    "ns": 1e-9,
    "us": 1e-6,
    "µs": 1e-6,
    "μs": 1e-6,
    "ms": 1e-3,
    "s": 1.0,
    "m": 60.0,
    "h": 3600.0,
    "d": 86400.0,
}
_DURATION = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|μs|ms|s|m|h|d)")
_NUMBER = re.compile(r"\d+(?:\.\d*)?|\.\d+")
DURATION_EXAMPLES = "e.g. 30s, 500ms, 1m30s, 2h"


def _text(raw: Any) -> str:
    if isinstance(raw, bool) or not isinstance(raw, str | int | float):
        # A YAML `true` or a list where a port belongs is bad input like any other (TRY004).
        raise ValueError(f"expected a value, not {type(raw).__name__}")  # noqa: TRY004
    return str(raw).strip()


class Integer:
    """A whole number in ``minimum..maximum`` (either bound may be open)."""

    __slots__ = ("maximum", "metavar", "minimum", "what")

    def __init__(
        self,
        minimum: int | None = None,
        maximum: int | None = None,
        *,
        what: str = "a whole number",
        metavar: str = "N",
    ) -> None:
        self.minimum, self.maximum, self.what, self.metavar = minimum, maximum, what, metavar

    def __call__(self, raw: Any) -> int:
        if isinstance(raw, int) and not isinstance(raw, bool):
            value = raw
        else:
            text = _text(raw)
            try:
                value = int(text, 10)
            except ValueError:
                raise ValueError(f"{text!r} is not {self.what} ({self.range()})") from None
        if (self.minimum is not None and value < self.minimum) or (
            self.maximum is not None and value > self.maximum
        ):
            raise ValueError(f"{value} is out of range for {self.what} ({self.range()})")
        return value

    def range(self) -> str:
        if self.minimum is not None and self.maximum is not None:
            return f"{self.minimum}-{self.maximum}"
        if self.minimum is not None:
            return f"at least {self.minimum}"
        if self.maximum is not None:
            return f"at most {self.maximum}"
        return "any whole number"


PORT = Integer(1, 65535, what="a port", metavar="PORT")
NUMERIC_ID = Integer(0, 4294967294, what="a numeric uid/gid", metavar="ID")


class Duration:
    """A length of time in seconds, written as Go writes durations (``1m30s``, ``250ms``) or as
    a bare number of seconds; ``positive`` excludes zero, ``maximum`` caps it."""

    __slots__ = ("maximum", "minimum", "positive", "whole")
    metavar = "DURATION"

    def __init__(
        self,
        *,
        minimum: float = 0.0,
        maximum: float | None = None,
        positive: bool = False,
        whole: bool = False,
    ) -> None:
        """``whole``: whole seconds only (an API field in seconds, e.g. ``timeoutSeconds``)."""
        self.minimum, self.maximum, self.positive, self.whole = minimum, maximum, positive, whole

    def __call__(self, raw: Any) -> float:
        if isinstance(raw, int | float) and not isinstance(raw, bool):
            value = float(raw)
        else:
            value = parse_duration(_text(raw))
        too_small = value <= self.minimum if self.positive else value < self.minimum
        if (
            too_small
            or not math.isfinite(value)
            or (self.maximum is not None and value > self.maximum)
        ):
            raise ValueError(f"{format_duration(value)} is out of range ({self.range()})")
        if self.whole and value != int(value):
            raise ValueError(f"{format_duration(value)} is not a whole number of seconds")
        return value

    def range(self) -> str:
        low = f"more than {format_duration(self.minimum)}" if self.positive else None
        if self.maximum is None:
            return low or f"at least {format_duration(self.minimum)}"
        if low:
            return f"{low}, at most {format_duration(self.maximum)}"
        return f"{format_duration(self.minimum)} to {format_duration(self.maximum)}"


def parse_duration(text: str) -> float:
    """``"1m30s"`` -> 90.0; a bare number is seconds. ``ValueError`` names the accepted forms."""
    stripped = text.strip()
    sign = -1.0 if stripped.startswith("-") else 1.0
    body = stripped[1:] if stripped[:1] in "+-" else stripped
    if _NUMBER.fullmatch(body):
        return sign * float(body)
    parts = _DURATION.findall(body)
    if not body or "".join(number + unit for number, unit in parts) != body:
        raise ValueError(f"{text!r} is not a duration ({DURATION_EXAMPLES})")
    return sign * sum(float(number) * _UNITS[unit] for number, unit in parts)


def format_duration(seconds: float) -> str:
    """90.0 -> ``"1m30s"``, 0.25 -> ``"250ms"``, 0 -> ``"0s"``: the inverse of ``parse_duration``
    for the values messages show."""
    if seconds < 0:
        return "-" + format_duration(-seconds)
    if seconds == 0:
        return "0s"
    if seconds < 1:
        millis = seconds * 1000
        return f"{millis:g}ms" if millis >= 1 else f"{seconds * 1e6:g}us"
    out = ""
    rest = seconds
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if rest >= size:
            count = int(rest // size)
            out += f"{count}{unit}"
            rest -= count * size
    if rest or not out:
        out += f"{rest:g}s"
    return out


class Address:
    """One IP address (v4 or v6), returned in its canonical text form."""

    __slots__ = ()
    metavar = "IP"

    def __call__(self, raw: Any) -> str:
        text = _text(raw)
        try:
            return str(ipaddress.ip_address(text.strip("[]")))
        except ValueError:
            raise ValueError(
                f"{text!r} is not an IP address (e.g. 0.0.0.0, 10.0.0.1, ::)"
            ) from None


class Cidr:
    """One CIDR (``10.96.0.0/12``, ``fd00::/8``); a bare address is its /32 or /128."""

    __slots__ = ()
    metavar = "CIDR"

    def __call__(self, raw: Any) -> str:
        text = _text(raw)
        try:
            return str(ipaddress.ip_network(text, strict=False))
        except ValueError:
            raise ValueError(f"{text!r} is not a CIDR (e.g. 10.96.0.0/12, fd00::/8)") from None


class Choice:
    """One of a fixed set of words."""

    __slots__ = ("choices",)

    def __init__(self, choices: tuple[str, ...]) -> None:
        self.choices = choices

    @property
    def metavar(self) -> str:
        return "|".join(self.choices)

    def __call__(self, raw: Any) -> str:
        text = _text(raw)
        if text not in self.choices:
            raise ValueError(f"{text!r} is not one of {', '.join(self.choices)}")
        return text


_PORT_RANGE = "port 1-65535"


def _split_host_port(text: str, example: str, form: str = "HOST:PORT") -> tuple[str, str]:
    """``HOST:PORT`` / ``[V6]:PORT`` / ``:PORT`` -> (host without brackets, port text)."""
    host, sep, port = text.rpartition(":")
    if not sep:
        raise ValueError(f"{text!r} is not {form} (e.g. {example}; {_PORT_RANGE})")
    if host.startswith("[") and host.endswith("]"):
        inner = host[1:-1]
        try:
            ipaddress.IPv6Address(inner)
        except ValueError:
            raise ValueError(f"{text!r}: {inner!r} is not an IPv6 address") from None
        return inner, port
    if ":" in host:
        raise ValueError(f"{text!r}: write an IPv6 address in brackets, e.g. [::1]:{port}")
    return host, port


def _port_of(text: str, port: str, *, zero_ok: bool) -> int:
    low = 0 if zero_ok else 1
    shown = f"{low}-65535" + ("; 0: any free port" if zero_ok else "")
    try:
        number = int(port, 10)
    except ValueError:
        raise ValueError(f"{text!r}: {port!r} is not a port ({shown})") from None
    if not low <= number <= 65535:
        raise ValueError(f"{text!r}: port {number} is out of range ({shown})")
    return number


class ListenAddress:
    """Where a server listens: ``HOST:PORT``, ``[V6]:PORT`` or ``:PORT`` (every address), the
    host an IP address; ``empty_ok`` lets ``''`` mean "do not listen", ``zero_ok`` lets port 0
    mean "any free port". Returned normalised (``host:port``, v6 in brackets)."""

    __slots__ = ("empty_ok", "zero_ok")
    metavar = "HOST:PORT"

    def __init__(self, *, empty_ok: bool = False, zero_ok: bool = False) -> None:
        self.empty_ok, self.zero_ok = empty_ok, zero_ok

    def __call__(self, raw: Any) -> str:
        text = _text(raw)
        if not text and self.empty_ok:
            return ""
        host, port = _split_host_port(text, "0.0.0.0:8000, :8000, [::]:8000")
        number = _port_of(text, port, zero_ok=self.zero_ok)
        if host:
            try:
                host = str(ipaddress.ip_address(host))
            except ValueError:
                raise ValueError(
                    f"{text!r}: {host!r} is not an IP address (listen on one of this host's "
                    "addresses, or 0.0.0.0 / :: for all of them)"
                ) from None
        return f"[{host}]:{number}" if ":" in host else f"{host}:{number}"


class Endpoint:
    """One peer of a connection: ``IP:PORT`` (``[V6]:PORT``), both required; returned
    normalised."""

    __slots__ = ()
    metavar = "IP:PORT"

    def __call__(self, raw: Any) -> str:
        text = _text(raw)
        host, port = _split_host_port(text, "10.96.0.10:80, [fd00::1]:80", "IP:PORT")
        number = _port_of(text, port, zero_ok=False)
        try:
            address = ipaddress.ip_address(host)
        except ValueError:
            raise ValueError(f"{text!r}: {host!r} is not an IP address") from None
        return f"[{address}]:{number}" if address.version == 6 else f"{address}:{number}"


# RFC 1123 host names (a DNS name, dots between labels of letters, digits and hyphens).
_HOST_NAME = re.compile(
    r"^(?=.{1,253}$)[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
    r"(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*\.?$"
)


class DialAddress:
    """Where a client connects: ``HOST:PORT`` with a DNS name or an IP address (v6 in brackets);
    ``https://HOST:PORT`` as ztunnel writes ``CA_ADDRESS``/``XDS_ADDRESS`` is read as the same.
    Returned as ``host:port`` (what gRPC dials)."""

    __slots__ = ()
    metavar = "HOST:PORT"

    def __call__(self, raw: Any) -> str:
        text = _text(raw)
        if text.startswith("http://"):
            raise ValueError(f"{text!r}: plaintext (http://) is not supported; TLS only (https://)")
        body = text.removeprefix("https://").rstrip("/")
        example = "meshctl-controlplane.meshctl-system.svc:15012, 127.0.0.1:15012"
        host, port = _split_host_port(body, example)
        number = _port_of(text, port, zero_ok=False)
        if not host:
            raise ValueError(f"{text!r} names no host (e.g. {example})")
        if ":" in host:
            return f"[{ipaddress.IPv6Address(host)}]:{number}"
        if not _HOST_NAME.match(host):
            raise ValueError(f"{text!r}: {host!r} is neither a host name nor an IP address")
        return f"{host}:{number}"


ADDRESS = Address()
CIDR = Cidr()
DIAL_ADDRESS = DialAddress()
ENDPOINT = Endpoint()
