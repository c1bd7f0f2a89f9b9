"""Istio's per-pod ``ProxyConfig``: the ``proxy.istio.io/config`` annotation and ``PROXY_CONFIG``.

Owns reading the fields meshctl acts on from the annotation (YAML or JSON, Istio's
``meshconfig.ProxyConfig`` field names) into a frozen value, writing the effective value as the
proxy's ``PROXY_CONFIG`` env (JSON, as Istio's injector does), and mapping it onto the proxy's
own settings. Fields: ``holdApplicationUntilProxyStarts``, ``terminationDrainDuration``,
``concurrency``, ``proxyMetadata`` (env of the proxy), ``statusPort``. Any other field is named
in ``unsupported`` (the injector warns), never dropped silently. Pure.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypedDict, TypeVar

from meshctl import yamlread
from meshctl.structured import InputError

ANNOTATION = "proxy.istio.io/config"
ENV = "PROXY_CONFIG"
_DURATION = re.compile(r"^\d+(\.\d+)?(ms|s|m|h)$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


_T = TypeVar("_T")


class ProxyConfigJson(TypedDict, total=False):
    """``PROXY_CONFIG``: Istio's field names, the fields set."""

    holdApplicationUntilProxyStarts: bool
    terminationDrainDuration: str
    concurrency: int
    proxyMetadata: dict[str, str]
    statusPort: int


@dataclass(frozen=True, slots=True, kw_only=True)
class ProxyConfig:
    """The fields set (None: not set, so the proxy's defaults apply)."""

    hold_application: bool | None = None
    termination_drain: str | None = None
    concurrency: int | None = None
    metadata: dict[str, str] = field(default_factory=dict)
    status_port: int | None = None
    unsupported: tuple[str, ...] = ()

    def to_env(self) -> str:
        """``PROXY_CONFIG``: the set fields as JSON, Istio's names ("{}" when none)."""
        out: ProxyConfigJson = {}
        if self.hold_application is not None:
            out["holdApplicationUntilProxyStarts"] = self.hold_application
        if self.termination_drain is not None:
            out["terminationDrainDuration"] = self.termination_drain
        if self.concurrency is not None:
            out["concurrency"] = self.concurrency
        if self.metadata:
            out["proxyMetadata"] = dict(self.metadata)
        if self.status_port is not None:
            out["statusPort"] = self.status_port
        return json.dumps(out, separators=(",", ":"))

    def ztunnel_settings(self, cpus: int) -> dict[str, str | int]:
        """The ``meshctl ztunnel run`` settings this asks for (below its flags and env)."""
        out: dict[str, str | int] = {}
        if self.termination_drain is not None:
            out["drain-deadline"] = self.termination_drain
        if self.concurrency is not None:
            # 0 is Istio's "one worker per CPU".
            out["workers"] = self.concurrency or max(1, min(cpus, 64))
        if self.status_port:
            out["metrics-port"] = self.status_port
        return out


class ProxyConfigError(ValueError):
    """A ProxyConfig field the proxy cannot use; the message names it."""


def _bool(value: Any) -> bool:
    if not isinstance(value, bool):
        raise ProxyConfigError("must be true or false")
    return value


def _duration(value: Any) -> str:
    if not isinstance(value, str) or not _DURATION.match(value):
        raise ProxyConfigError("must be a duration such as 5s")
    return value


def _count(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 64:
        raise ProxyConfigError("must be a whole number 0-64")
    return int(value)


def _metadata(value: Any) -> dict[str, str]:
    if not isinstance(value, dict) or not all(
        isinstance(k, str) and _ENV_NAME.match(k) and isinstance(v, str) for k, v in value.items()
    ):
        raise ProxyConfigError("must map env names to strings")
    return dict(value)


def _port(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 65536:
        raise ProxyConfigError("must be a port number")
    return int(value)


# Istio's field name -> its validator.
_FIELDS: dict[str, Callable[[Any], object]] = {
    "holdApplicationUntilProxyStarts": _bool,
    "terminationDrainDuration": _duration,
    "concurrency": _count,
    "proxyMetadata": _metadata,
    "statusPort": _port,
}


def parse(text: str, *, source: str = ANNOTATION) -> ProxyConfig:
    """``text`` (YAML or JSON) as a ProxyConfig; ``ProxyConfigError`` (a ``ValueError``)
    names the field at fault."""
    try:
        data = yamlread.load_yaml(text, source) if text.strip() else {}
    except InputError as exc:
        raise ProxyConfigError(f"{source} is not YAML or JSON: {exc.problem}") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ProxyConfigError(f"{source} must be a mapping of ProxyConfig fields")
    unsupported = []
    for key, value in data.items():  # checked in the document's order: the first bad one is named
        if key not in _FIELDS:
            unsupported.append(str(key))
            continue
        try:
            _FIELDS[key](value)
        except ProxyConfigError as exc:
            raise ProxyConfigError(f"{source}: {key} {exc}") from None

    def given(key: str, check: Callable[[Any], _T]) -> _T | None:
        return check(data[key]) if key in data else None  # checked above: cannot fail

    return ProxyConfig(
        hold_application=given("holdApplicationUntilProxyStarts", _bool),
        termination_drain=given("terminationDrainDuration", _duration),
        concurrency=given("concurrency", _count),
        metadata=given("proxyMetadata", _metadata) or {},
        status_port=given("statusPort", _port),
        unsupported=tuple(unsupported),
    )
