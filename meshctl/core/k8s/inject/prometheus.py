"""Prometheus metrics merging, as Istio's injector does it: scrape the proxy, which merges the app.

With merging on (the default; ``prometheus.istio.io/merge-metrics: "false"`` or
``prometheus.io/scrape: "false"`` turns it off) the pod's ``prometheus.io/{scrape,port,path}``
annotations move into the proxy's ``ISTIO_PROMETHEUS_ANNOTATIONS`` env (Istio's name and JSON
shape) and are replaced by ones that point Prometheus at the proxy's status port, whose
``/stats/prometheus`` then serves the proxy's metrics followed by the app's. Keys are matched as
Istio does, after replacing every character a Prometheus label cannot hold with ``_`` (so
``prometheus.io.scrape`` counts too). Pure: annotations in, the change out.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass

from meshctl.core.k8s.inject import annotations as ann
from meshctl.core.k8s.inject.errors import InvalidAnnotationError
from meshctl.structured import InputError, load_json

SCRAPE, PORT, PATH = "prometheus.io/scrape", "prometheus.io/port", "prometheus.io/path"
MERGE = "prometheus.istio.io/merge-metrics"
ENV = "ISTIO_PROMETHEUS_ANNOTATIONS"
METRICS_PATH = "/stats/prometheus"
# The proxy's own ports: scraping one of them through the merge would loop or double count.
RESERVED_PORTS = frozenset({15000, 15001, 15004, 15006, 15008, 15020, 15021, 15053, 15090})
_NOT_LABEL = re.compile(r"[^A-Za-z0-9_]")


def _key(name: str) -> str:
    return _NOT_LABEL.sub("_", name)


_KEYS = {_key(SCRAPE): "scrape", _key(PORT): "port", _key(PATH): "path"}


@dataclass(frozen=True, slots=True)
class Merge:
    """The change: annotation keys to drop, annotations to set, and the proxy's env value."""

    remove: tuple[str, ...]
    set: tuple[tuple[str, str], ...]
    env: str | None  # None: the pod had no scrape annotations to hand over


def plan(annotations: Mapping[str, str], status_port: int) -> Merge | None:
    """How to merge the pod's metrics into the proxy's, or None when merging is off."""
    found = {_KEYS[_key(k)]: (k, v) for k, v in annotations.items() if _key(k) in _KEYS}
    scrape = found.get("scrape", ("", ""))[1]
    if scrape.strip().lower() in ("false", "0", "f"):
        return None
    merge = annotations.get(MERGE)
    if merge is not None and not ann.parse_bool(MERGE, merge):
        return None
    port_key, port = found.get("port", ("", ""))
    if port == str(status_port):
        return None  # pointing at the proxy already (re-injected, or the user's choice)
    if port:
        if not port.isdigit() or not 0 < int(port) < 65536:
            raise InvalidAnnotationError(port_key, port, expected="a port number 1-65535")
        if int(port) in RESERVED_PORTS:
            raise InvalidAnnotationError(
                port_key, port, expected="the app's own metrics port, not one of the proxy's"
            )
    config = {"scrape": scrape, "path": found.get("path", ("", ""))[1], "port": port}
    env = json.dumps(config, separators=(",", ":")) if any(config.values()) else None
    return Merge(
        remove=tuple(k for k, _ in found.values()),
        set=((PORT, str(status_port)), (PATH, METRICS_PATH), (SCRAPE, "true")),
        env=env,
    )


def keys(annotations: Mapping[str, str]) -> list[str]:
    """The pod's scrape annotations, in any of their spellings."""
    return [k for k in annotations if _key(k) in _KEYS]


def restored(env: str) -> dict[str, str]:
    """The annotations a pod had before Istio's merge, from its proxy's env ("" if unreadable)."""
    try:
        config = load_json(env, "ISTIO_PROMETHEUS_ANNOTATIONS")
    except (InputError, TypeError):
        return {}
    if not isinstance(config, dict):
        return {}
    names = {"scrape": SCRAPE, "path": PATH, "port": PORT}
    return {names[k]: v for k, v in config.items() if k in names and isinstance(v, str) and v}
