"""``meshctl verify --workload NS/POD``: the pod's proxy holds its identity and speaks mTLS.

Reads the proxy as ``istioctl proxy-config`` does: ``/config_dump`` on the admin port (15000,
loopback only, through port forwarding) for the certificate's SPIFFE id and its root, and the
merged metrics (15020, through the API server's pod proxy) for connections by security policy.
An ambient pod (no proxy of its own) is read through the node proxy on its node
(``ambient_checks``). Invariant: read-only; a pod that is not meshed is a failure that says so
(with the fix for either mode), not an error.
"""

from __future__ import annotations

import json
import re
from typing import TYPE_CHECKING, Any

from meshctl.core.k8s import layout
from meshctl.core.k8s.inject.render import PROXY_CONTAINER
from meshctl.core.k8s.install.checks import Check, Result
from meshctl.errors import KubeError

from . import ambient_checks

if TYPE_CHECKING:
    from meshctl.core.k8s.schema import Pod

CATEGORY = "meshctl-data-plane"
ADMIN_PORT = 15000
METRICS_PORT = 15020
_SAMPLE = re.compile(r"^istio_tcp_connections_opened_total\{(?P<labels>[^}]*)\}\s+(?P<value>\S+)")
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def _pod(ctx: Any) -> Pod | None:
    from meshctl.kube import objects
    from meshctl.kube.resources import PODS

    if "workload" not in ctx.memo:
        namespace, name = ctx.workload.split("/")
        ctx.memo["workload"] = objects.get(ctx.kube, PODS, name, namespace)
    pod: Pod | None = ctx.memo["workload"]
    return pod


def _proxied(pod: Pod) -> bool:
    spec = pod.get("spec") or {}
    names = [
        c.get("name")
        for c in (*(spec.get("initContainers") or ()), *(spec.get("containers") or ()))
    ]
    return PROXY_CONTAINER in names


def _identity(ctx: Any) -> Result:  # noqa: PLR0911 (one answer per finding)
    from meshctl.kube.portforward import http_get

    pod = _pod(ctx)
    if pod is None:
        return Result.fail(
            f"pod {ctx.workload} not found", hint="give NAMESPACE/POD of a running pod"
        )
    if not _proxied(pod):  # ambient, or not meshed at all
        return ambient_checks.identity(ctx, pod, lambda: _mesh_root_serials(ctx))
    namespace, name = ctx.workload.split("/")
    try:
        status, body = http_get(ctx.kube, namespace, name, ADMIN_PORT, "/config_dump")
        dump = json.loads(body)
    except (KubeError, ValueError) as exc:
        return Result.fail(
            f"cannot read the proxy's /config_dump: {exc}",
            hint=f"is {PROXY_CONTAINER} running? "
            f"'kubectl -n {namespace} logs {name} -c {PROXY_CONTAINER}'",
        )
    if status != 200:
        return Result.fail(f"/config_dump answered {status}", hint="see the proxy's log")
    expected = ambient_checks.pod_identity(ctx, pod)
    certificates = dump.get("certificates") or []
    chain = (certificates[0].get("certChain") or []) if certificates else []
    if not chain:
        return Result.fail(
            "the proxy holds no certificate",
            hint="it asks the control plane's CA with its projected token: see its log and the "
            "control plane's",
        )
    sans = chain[0].get("uriSans") or []
    if expected not in sans:
        return Result.fail(
            f"the proxy's certificate is for {', '.join(sans) or 'no identity'}, not {expected}",
            hint="the pod's service account and the mesh's trust domain must match its identity",
        )
    roots = {r.get("serialNumber") for r in certificates[0].get("rootCerts") or ()}
    mesh_root = _mesh_root_serials(ctx)
    if mesh_root and not roots & mesh_root:
        return Result.fail(
            "the proxy trusts a root other than the mesh's",
            hint=f"restart the pod: its root comes from the {ctx.values.namespace} root ConfigMap",
        )
    state = certificates[0].get("state", "?")
    if state != "Available":
        return Result.fail(f"its certificate is {state}", hint="see the proxy's log (renewal)")
    return Result.ok(f"{expected}, valid until {chain[0].get('expirationTime', '?')}")


def _mesh_root_serials(ctx: Any) -> set[str]:
    from meshctl.core.pki import certs
    from meshctl.core.wire import ztunnel_dump
    from meshctl.kube import objects
    from meshctl.kube.resources import CONFIG_MAPS

    from .manifest import NodeProxyValues

    # The node proxy's own root ConfigMap (beside an istiod: istiod's istio-ca-root-cert).
    name = layout.ROOT_CONFIGMAP
    if ctx.values.enabled("ztunnel"):
        name = ctx.values.own("ztunnel", NodeProxyValues).trust_bundle_name or name
    live = objects.get(ctx.kube, CONFIG_MAPS, name, ctx.values.namespace)
    bundle = ((live or {}).get("data") or {}).get("root-cert.pem")
    if not bundle:
        return set()
    # Decimal, as the dump (ztunnel's shape) writes serial numbers.
    return {ztunnel_dump.decimal_serial(f.serial) for f in certs.describe(bundle.encode())}


def _mtls(ctx: Any) -> Result:
    from meshctl.kube import api

    pod = _pod(ctx)
    if pod is None:
        return Result.skip("no such pod")
    own: str | None = None  # ambient: the node proxy's connections of this pod's identity
    if _proxied(pod):
        namespace, name = ctx.workload.split("/")
        path = f"/api/v1/namespaces/{namespace}/pods/{name}:{METRICS_PORT}/proxy/stats/prometheus"
        try:
            text = api.request_text(ctx.kube, path)
        except KubeError as exc:
            return Result.fail(
                f"cannot read the proxy's metrics: {exc.message}", hint="is it ready?"
            )
    else:
        found = ambient_checks.metrics_text(ctx, pod)
        if isinstance(found, Result):
            return found if ambient_checks.enrolled_state(pod) else Result.skip("not meshed")
        text, own = found
    peers = _mtls_peers(text, own)
    if not peers:
        return Result.warn(
            "no mTLS connection seen yet",
            hint="send traffic between this pod and another meshed pod, then verify again",
        )
    listed = ", ".join(f"{p} ({int(n)})" for p, n in sorted(peers.items()))
    return Result.ok(f"{int(sum(peers.values()))} mTLS connections with {listed}")


def _mtls_peers(text: str, own: str | None) -> dict[str, float]:
    """Connections opened with mutual TLS, by peer identity; ``own``: only those whose own
    side (source when it reported as source, else destination) is that identity."""
    peers: dict[str, float] = {}
    for line in text.splitlines():
        match = _SAMPLE.match(line)
        if not match:
            continue
        labels = dict(_LABEL.findall(match.group("labels")))
        source = labels.get("reporter") == "source"
        mine = labels.get("source_principal" if source else "destination_principal")
        if own is not None and mine != own:
            continue
        peer = labels.get("destination_principal" if source else "source_principal")
        if labels.get("connection_security_policy") == "mutual_tls":
            peers[peer or "unknown"] = peers.get(peer or "unknown", 0) + float(match.group("value"))
    return peers


checks = (
    Check(
        category=CATEGORY,
        description="the workload's proxy holds its identity",
        run=_identity,
        workload=True,
    ),
    Check(
        category=CATEGORY,
        description="the workload talks mTLS to meshed peers",
        run=_mtls,
        workload=True,
    ),
)
