"""App HTTP probes behind the proxy: rewrite them to the proxy's status port, and restore them.

With mTLS enforced the kubelet cannot reach the app's own HTTP probe endpoints, so each HTTP
probe's ``httpGet`` is pointed at ``:15020/app-health/<container>/<livez|readyz|startupz>`` and
the original ``httpGet`` (and ``timeoutSeconds``) is handed to the proxy in the
``ISTIO_KUBE_APP_PROBERS`` env var (Istio's name and JSON shape), which the proxy probes on the
kubelet's behalf. Invariant: ``restore(rewrite(c)) == c`` for the containers given; only
``httpGet`` is replaced, every other probe field is left as the user wrote it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from meshctl.core.inject.interception import STATUS_PORT

PROBERS_ENV = "ISTIO_KUBE_APP_PROBERS"
# Probe field -> the last path element Istio uses for it.
PROBE_KINDS = (
    ("livenessProbe", "livez"),
    ("readinessProbe", "readyz"),
    ("startupProbe", "startupz"),
)


def probe_path(container: str, suffix: str) -> str:
    """``/app-health/<container>/<suffix>``: where the kubelet asks the proxy."""
    return f"/app-health/{container}/{suffix}"


def rewrite(containers: list[Any]) -> dict[str, Any]:
    """Points every HTTP probe of ``containers`` (changed in place) at the proxy.

    Returns the probers for the proxy: ``{path: {"httpGet": original, "timeoutSeconds": n}}``
    in container order. Probes without an ``httpGet`` mapping (exec, tcpSocket, grpc) stay.
    """
    probers: dict[str, Any] = {}
    for container in containers:
        if not isinstance(container, dict) or not isinstance(container.get("name"), str):
            continue
        for field, suffix in PROBE_KINDS:
            probe = container.get(field)
            if not isinstance(probe, dict) or not isinstance(probe.get("httpGet"), dict):
                continue
            path = probe_path(container["name"], suffix)
            prober: dict[str, Any] = {"httpGet": probe["httpGet"]}
            if "timeoutSeconds" in probe:
                prober["timeoutSeconds"] = probe["timeoutSeconds"]
            probers[path] = prober
            # Replacing the value keeps the key where the user had it (stable YAML diffs).
            probe["httpGet"] = {"path": path, "port": STATUS_PORT}
    return probers


def restore(containers: list[Any], probers: Mapping[str, Any]) -> None:
    """Puts back the original ``httpGet`` of every probe ``rewrite`` redirected (in place)."""
    for container in containers:
        if not isinstance(container, dict) or not isinstance(container.get("name"), str):
            continue
        for field, suffix in PROBE_KINDS:
            probe = container.get(field)
            if not isinstance(probe, dict):
                continue
            path = probe_path(container["name"], suffix)
            original = probers.get(path)
            if probe.get("httpGet") == {"path": path, "port": STATUS_PORT} and isinstance(
                original, Mapping
            ):
                probe["httpGet"] = original.get("httpGet")
