"""Reaching the control plane's replicas and a proxy's admin port, through the API server only.

``sync_reports``: every control plane pod (all revisions) is asked for its sync report as
istioctl asks istiod: a state-of-the-world ``istio.io/debug/syncz`` request on its xDS port
(15012), reached through ``pods/portforward``, over TLS checked against the mesh root (the
``meshctl-ca-root-cert`` ConfigMap) for the replica's Service name, with a bearer token minted
by TokenRequest for the ``default`` service account of the mesh namespace (istioctl's choice:
the control plane serves its debug types to that namespace's accounts only, and a user who may
mint tokens there is an admin of the mesh). A replica that does not answer is a ``Failure``
(one line), never an exception. ``config_dump``: a proxy's ``/config_dump`` on
127.0.0.1:15000 through ``pods/portforward`` (never exec), parsed as JSON.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import Any

from meshctl import rpc  # first: it quiets grpc's C core logging before grpc loads

# isort: split
from meshctl.core.k8s import layout
from meshctl.core.proxystatus import syncz
from meshctl.core.proxystatus.report import Failure
from meshctl.errors import KubeError, MeshctlError
from meshctl.kube import objects, portforward
from meshctl.kube.client import Kube
from meshctl.kube.resources import CONFIG_MAPS, PODS
from meshctl.kube.tokens import request_token
from meshctl.proto import xds_pb2, xds_pb2_grpc

ADMIN_PORT = 15000
TOKEN_ACCOUNT = "default"  # noqa: S105 -- istioctl's: the mesh namespace's default service account
TOKEN_SECONDS = 600  # TokenRequest's shortest lifetime


@dataclass(frozen=True, slots=True, kw_only=True)
class Replica:
    pod: str
    server_name: str  # its Service's DNS name (the serving certificate's SAN)


def replicas(kube: Kube, namespace: str) -> list[Replica]:
    """Running control plane pods of every revision, by name."""
    pods, _ = objects.list_objects(
        kube,
        PODS,
        namespace,
        label_selector=f"app.kubernetes.io/name={layout.CONTROL_PLANE_SERVICE}",
    )
    found = []
    for pod in pods:
        meta = pod.get("metadata") or {}
        status = pod.get("status") or {}
        if status.get("phase") != "Running" or meta.get("deletionTimestamp"):
            continue
        revision = (meta.get("labels") or {}).get("istio.io/rev") or layout.DEFAULT_REVISION
        service = layout.revisioned(layout.CONTROL_PLANE_SERVICE, revision)
        found.append(Replica(pod=str(meta.get("name")), server_name=f"{service}.{namespace}.svc"))
    return sorted(found, key=lambda r: r.pod)


def mesh_root(kube: Kube, namespace: str) -> bytes:
    found = objects.get(kube, CONFIG_MAPS, layout.ROOT_CONFIGMAP, namespace)
    root = ((found or {}).get("data") or {}).get("root-cert.pem")
    if not root:
        raise KubeError(
            f"no mesh root in ConfigMap {namespace}/{layout.ROOT_CONFIGMAP}",
            hint="is the mesh installed in that namespace? (--mesh-namespace)",
        )
    return str(root).encode()


def sync_reports(
    kube: Kube, namespace: str, *, timeout: float
) -> tuple[list[syncz.Report], list[Failure]]:
    """Every replica's report, and the replicas that did not answer."""
    found = replicas(kube, namespace)
    if not found:
        raise KubeError(
            f"no running control plane pod in namespace {namespace}",
            hint="install the mesh (meshctl install) or name its namespace with --mesh-namespace",
        )
    root = mesh_root(kube, namespace)
    try:
        token = request_token(kube, namespace, TOKEN_ACCOUNT, ["istio-ca"], TOKEN_SECONDS)
    except KubeError as exc:
        raise KubeError(
            f"cannot get a token for {namespace}/{TOKEN_ACCOUNT}: {exc.message}",
            hint=f"proxy-status needs 'create serviceaccounts/token' in {namespace}",
        ) from exc
    reports: list[syncz.Report] = []
    failures: list[Failure] = []
    for replica in found:
        try:
            with portforward.local_port(
                kube, namespace, replica.pod, layout.CONTROL_PLANE_PORT
            ) as port:
                reports.append(
                    asyncio.run(ask(port, replica, root=root, token=token, timeout=timeout))
                )
        except (MeshctlError, syncz.ReportError, TimeoutError, OSError) as exc:
            failures.append(Failure(control_plane=replica.pod, error=_one_line(exc)))
    return reports, failures


def _one_line(exc: BaseException) -> str:
    text = getattr(exc, "message", None) or str(exc) or type(exc).__name__
    return str(text).splitlines()[0][:300]


async def ask(
    port: int, replica: Replica, *, root: bytes, token: str, timeout: float
) -> syncz.Report:
    address = f"127.0.0.1:{port}"
    channel = rpc.connect(
        address,
        root_pem=root,
        auth=rpc.CallAuth(token=token),
        server_name=replica.server_name,
    )
    try:
        async with asyncio.timeout(timeout):
            call = xds_pb2_grpc.AggregatedDiscoveryServiceStub(channel).StreamAggregatedResources()
            await call.write(xds_pb2.DiscoveryRequest(type_url=syncz.SYNCZ_TYPE))
            response = await rpc.read(
                call,
                what=f"{syncz.SYNCZ_TYPE} from {replica.pod}",
                address=address,
                server_name=replica.server_name,
            )
            await call.done_writing()
            call.cancel()
    finally:
        await channel.close()
    if response is None or not response.resources:
        raise syncz.ReportError(f"{replica.pod} answered no report")
    report = syncz.decode(response.resources[0].value)
    report["controlPlane"] = report["controlPlane"] or replica.pod
    return report


def config_dump(kube: Kube, namespace: str, pod: str, *, timeout: float) -> dict[str, Any]:
    """The proxy's ``/config_dump`` as a JSON object."""
    status, body = portforward.http_get(
        kube, namespace, pod, ADMIN_PORT, "/config_dump", timeout=timeout
    )
    where = f"pod {namespace}/{pod} port {ADMIN_PORT}"
    if status != 200:
        raise KubeError(
            f"{where} answered HTTP {status} for /config_dump",
            hint="is a meshctl proxy (sidecar or node proxy) running in that pod?",
        )
    try:
        dump = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError):
        dump = None
    if not isinstance(dump, dict):
        raise KubeError(
            f"{where} answered /config_dump with something that is not a JSON object "
            f"({len(body)} bytes)",
            hint="is this a meshctl or ztunnel admin port?",
        )
    return dump
