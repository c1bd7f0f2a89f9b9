"""App probes behind the proxy: rewrite them to the proxy's status port, and restore them.

With mTLS enforced the kubelet cannot reach the app's own probe endpoints, so, as Istio does,
every HTTP GET, TCP socket and gRPC probe (liveness, readiness, startup) and every HTTP GET or
TCP socket lifecycle hook (postStart, preStop) of the app's containers and of its own native
sidecars is pointed at ``:<status port>/app-health/<container>/<livez|readyz|startupz>`` (hooks:
``/app-lifecycle/<container>/<poststartz|prestopz>``) and the original action, with a named port
resolved to its number, is handed to the proxy in ``ISTIO_KUBE_APP_PROBERS`` (Istio's name and
JSON shape), which runs it on the kubelet's behalf (plugins/dataplane/app_probes.py).

Invariant: ``restore`` undoes ``rewrite`` exactly, given the originals ``rewrite`` returns (kept
by the pipeline in its undo record); from the probers alone (a pod Istio injected) it restores
everything but a port's name. Only the action key of a probe changes, in place; every other
field (thresholds, periods, the timeout) stays as the user wrote it.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, cast

from meshctl.core.k8s.inject.errors import ManifestError

if TYPE_CHECKING:
    from meshctl.core.k8s.schema import Container, HTTPGetAction, Probe

PROBERS_ENV = "ISTIO_KUBE_APP_PROBERS"
PROXY_CONTAINER = "istio-proxy"
# Probe field -> the last path element Istio uses for it (its order in ISTIO_KUBE_APP_PROBERS).
PROBE_KINDS = (
    ("readinessProbe", "readyz"),
    ("livenessProbe", "livez"),
    ("startupProbe", "startupz"),
)
HOOK_KINDS = (("preStop", "prestopz"), ("postStart", "poststartz"))
PROBE_ACTIONS = ("httpGet", "tcpSocket", "grpc")  # exec stays: it runs in the container
HOOK_ACTIONS = ("httpGet", "tcpSocket")  # exec and sleep stay


def probe_path(container: str, suffix: str) -> str:
    """``/app-health/<container>/<suffix>`` (hooks: ``/app-lifecycle/...``)."""
    group = "app-lifecycle" if suffix in ("prestopz", "poststartz") else "app-health"
    return f"/{group}/{container}/{suffix}"


@dataclass(slots=True)
class Rewritten:
    """What ``rewrite`` did: the probers for the proxy, and the untouched originals by path."""

    probers: dict[str, Probe] = field(default_factory=dict)
    originals: dict[str, Probe] = field(default_factory=dict)

    def not_in_probers(self) -> dict[str, Probe]:
        """The originals the probers do not already say (a named port's name): what an undo
        record must keep besides the probers."""
        return {
            path: original
            for path, original in self.originals.items()
            if any(_action(self.probers[path], a) != v for a, v in original.items())
        }


def rewrite(containers: Sequence[Container], status_port: int) -> Rewritten:
    """Points the probes and hooks of ``containers`` (changed in place) at the proxy.

    ``containers``: the pod's init containers, then its containers (the proxy's own probes are
    never touched). Raises ``ManifestError`` for a named port the container does not declare.
    """
    done = Rewritten()
    for container, holder, key, suffix, actions in _handlers(containers):
        handler = cast("dict[str, object]", holder[key])
        action = next((a for a in actions if isinstance(handler.get(a), dict)), None)
        if action is None:
            continue
        name = container["name"]
        original = cast("dict[str, object]", handler[action])
        resolved = dict(original)
        resolved["port"] = _port_number(container, original.get("port"), f"{key} of {name}")
        if resolved["port"] == status_port:
            continue  # aimed at the proxy already: nothing to take over (as Istio skips it)
        path = probe_path(name, suffix)
        # The user's action (and timeout) as the kubelet would read them: the proxy runs them.
        prober: dict[str, object] = {action: resolved}
        if handler.get("timeoutSeconds"):
            prober["timeoutSeconds"] = handler["timeoutSeconds"]
        done.probers[path] = cast("Probe", prober)
        done.originals[path] = cast("Probe", {action: original})
        holder[key] = _replace_action(handler, action, _target(action, original, path, status_port))
    return done


def restore(
    containers: Sequence[Container], originals: Mapping[str, object], status_port: int | None = None
) -> None:
    """Puts back every probe and hook ``rewrite`` redirected, from ``originals`` (in place)."""
    for container, holder, key, suffix, _ in _handlers(containers):
        handler = cast("dict[str, object]", holder[key])
        path = probe_path(container["name"], suffix)
        original = originals.get(path)
        target = handler.get("httpGet")
        if not isinstance(original, Mapping) or not isinstance(target, dict):
            continue
        if target.get("path") != path or (
            status_port is not None and target.get("port") != status_port
        ):
            continue
        action = next((a for a in PROBE_ACTIONS if isinstance(original.get(a), dict)), None)
        if action is not None:
            holder[key] = _replace_action(handler, "httpGet", original[action], new_key=action)


def _handlers(
    containers: Sequence[Container],
) -> Iterator[tuple[Container, dict[str, object], str, str, tuple[str, ...]]]:
    """(container, holder, key, suffix, actions) for every probe and hook: ``holder[key]`` is
    the probe (or hook handler) mapping. The holders are the user's JSON (a container checked
    for its name only), read as such."""
    for container in containers:
        if container["name"] == PROXY_CONTAINER:
            continue
        fields = cast("dict[str, object]", container)
        for key, suffix in PROBE_KINDS:
            if isinstance(fields.get(key), dict):
                yield container, fields, key, suffix, PROBE_ACTIONS
        lifecycle = fields.get("lifecycle")
        if isinstance(lifecycle, dict):
            for key, suffix in HOOK_KINDS:
                if isinstance(lifecycle.get(key), dict):
                    yield container, lifecycle, key, suffix, HOOK_ACTIONS


def _action(prober: Probe, name: str) -> object:
    return cast("dict[str, object]", prober).get(name)


def _target(action: str, original: Mapping[str, object], path: str, status_port: int) -> object:
    """The ``httpGet`` the kubelet now sends: to the proxy, in plain HTTP."""
    if action != "httpGet":
        return {"path": path, "port": status_port}
    # Headers stay (as in Istio's rewrite). The host goes: the kubelet must reach the pod's own
    # proxy (a host there would send it elsewhere); the proxy honours the host in its prober.
    target = cast("HTTPGetAction", {k: v for k, v in original.items() if k != "host"})
    target["path"], target["port"] = path, status_port
    if str(target.get("scheme", "")).upper() == "HTTPS":
        target["scheme"] = "HTTP"  # kubelet -> HTTP -> proxy -> HTTPS -> app
    return target


def _replace_action(
    handler: Mapping[str, object], old_key: str, value: object, *, new_key: str = "httpGet"
) -> dict[str, object]:
    """``handler`` with ``old_key`` replaced by ``new_key: value`` in the same place."""
    return {
        (new_key if k == old_key else k): (value if k == old_key else v) for k, v in handler.items()
    }


def _port_number(container: Container, port: object, what: str) -> object:
    """A probe's port as a number: a name is looked up in the container's ports."""
    if not isinstance(port, str):
        return port
    for item in container.get("ports") or ():
        if isinstance(item, Mapping) and item.get("name") == port:
            number = item.get("containerPort")
            if isinstance(number, int) and not isinstance(number, bool):
                return number
    raise ManifestError(
        f"the {what} uses port {port!r}, which the container does not declare",
        hint=f"add a port named {port!r} to the container's ports, or give the number",
    )
