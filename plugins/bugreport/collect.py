"""Collecting a bug report from the cluster: every read, bounded, redacted as it arrives.

Owns what is read and how: the mesh namespace's and the selected namespaces' pods, their logs
(``pods/log``: ``--since``, the per-log cap, the previous run of a restarted container), the
proxies' ``/config_dump`` through pod port-forwarding (never exec), the CNI node agents'
``/debug/conflist`` through the API server's pod proxy, the install record, the mesh's objects
and the namespaces' events, nodes and versions. Invariants: reads only; every API call has the
client's timeout and every proxy read ``proxy_timeout``; at most ``concurrency`` reads at once;
a read that fails is a line in the summary's "not collected" (a proxy that does not answer is a
finding), never the end of the report; every member's bytes went through the redaction rules
before they are held.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from meshctl import __version__, inputs
from meshctl.core.bugreport import layout
from meshctl.core.bugreport.layout import Member, Priority, Role
from meshctl.core.bugreport.redact import redact_object, redact_text, secret_stub
from meshctl.core.bugreport.summary import Collected, LogText, ProxyAnswer
from meshctl.core.k8s.install import manifest as mf
from meshctl.errors import KubeError, MeshctlError
from meshctl.kube import api, objects, podlog, portforward
from meshctl.kube.client import Kube
from meshctl.kube.resources import (
    CONFIG_MAPS,
    DAEMONSETS,
    DEPLOYMENTS,
    EVENTS,
    MUTATING_WEBHOOK_CONFIGURATIONS,
    NAMESPACES,
    NODES,
    PODS,
    SECRETS,
    SERVICE_ACCOUNTS,
    SERVICES,
    Resource,
)
from meshctl.output import json_text, yaml_documents
from meshctl.structured import InputError, load_json

VALIDATING_WEBHOOK_CONFIGURATIONS: Resource[dict[str, Any]] = Resource(
    "admissionregistration.k8s.io",
    "v1",
    "validatingwebhookconfigurations",
    "ValidatingWebhookConfiguration",
    namespaced=False,
)
# The API groups whose every kind is mesh configuration: policies and the Gateway API.
MESH_GROUPS = ("security.istio.io", "networking.istio.io", "gateway.networking.k8s.io")
# Namespace labels that put a namespace in the mesh (sidecar injection, a revision, ambient).
MESH_LABELS = ("istio-injection=enabled", "istio.io/rev", "istio.io/dataplane-mode=ambient")
DUMP_LIMIT = 16 * 1024 * 1024  # bytes of one proxy's /config_dump read at most


@dataclass(frozen=True, slots=True, kw_only=True)
class Settings:
    mesh_namespace: str
    namespaces: Sequence[str] | None  # None: every namespace labelled for the mesh
    since: float | None  # seconds of logs; None: all the runtime kept
    log_limit: int  # bytes per log
    total_limit: int  # bytes of the whole report (uncompressed)
    concurrency: int
    proxy_timeout: float


@dataclass
class _Gathered:
    """What the reads hand back, under one lock (they run on a pool)."""

    members: list[Member] = field(default_factory=list)
    logs: list[LogText] = field(default_factory=list)
    proxies: list[ProxyAnswer] = field(default_factory=list)
    not_collected: list[str] = field(default_factory=list)
    log_bytes: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, member: Member) -> None:
        with self.lock:
            self.members.append(member)

    def missed(self, what: str, exc: BaseException) -> None:
        reason = exc.message if isinstance(exc, MeshctlError) else f"{type(exc).__name__}: {exc}"
        with self.lock:
            self.not_collected.append(f"{what}: {redact_text(reason)}")


def text_member(name: str, text: str, priority: Priority) -> Member:
    """A member from text, through the redaction rules."""
    return Member(name, redact_text(text).encode(), int(priority))


def objects_member(name: str, items: Sequence[Mapping[str, Any]], priority: Priority) -> Member:
    """Kubernetes objects as YAML documents, redacted object by object (Secrets become stubs)."""
    return text_member(name, yaml_documents([redact_object(o) for o in items]), priority)


class Collector:
    def __init__(self, kube: Kube, settings: Settings) -> None:
        self.kube = kube
        self.settings = settings
        self.got = _Gathered()
        self.events: list[Mapping[str, Any]] = []  # every namespace's, for the findings

    # --- the whole report --------------------------------------------------------------------

    def run(self, cluster_version: Mapping[str, str]) -> tuple[list[Member], Collected]:
        """Everything read; the members (not yet fitted to the total cap) and the findings'
        inputs. Raises only when a namespace given with -n does not exist or the namespaces
        cannot be read at all."""
        settings = self.settings
        namespaces = self._namespaces()
        mesh_pods = self._pods(settings.mesh_namespace)
        pods = list(mesh_pods)
        for namespace in namespaces:
            try:
                pods += self._pods(namespace)
            except KubeError as exc:
                self.got.missed(f"pods of namespace {namespace}", exc)
        self.got.add(text_member("meshctl/version.json", json_text(_client()), Priority.VERSIONS))
        self.got.add(
            text_member("cluster/version.json", json_text(cluster_version), Priority.VERSIONS)
        )
        reads: list[tuple[str, Callable[[], None]]] = []
        reads += [(f"install record in {settings.mesh_namespace}", self._install_record)]
        reads += [("nodes", self._nodes), ("webhook configurations", self._webhooks)]
        reads += [("mesh configuration (policies, Gateway API)", self._mesh_config)]
        for namespace in [settings.mesh_namespace, *namespaces]:
            reads += [
                (f"objects of namespace {namespace}", partial(self._objects, namespace)),
                (f"events of namespace {namespace}", partial(self._events, namespace)),
            ]
        reads += self._pod_reads(pods)
        self._run_all(reads)
        collected = Collected(
            mesh_namespace=settings.mesh_namespace,
            namespaces=namespaces,
            since=_since_text(settings.since),
            cluster_version=str(cluster_version.get("gitVersion", "?")),
            meshctl_version=__version__,
            pods=[redact_object(p) for p in pods],
            events=list(self.events),
            logs=list(self.got.logs),
            proxies=list(self.got.proxies),
            not_collected=sorted(self.got.not_collected),
        )
        return list(self.got.members), collected

    def _run_all(self, reads: Sequence[tuple[str, Callable[[], None]]]) -> None:
        pool = ThreadPoolExecutor(max_workers=self.settings.concurrency)
        try:
            futures: list[tuple[str, Future[None]]] = [(w, pool.submit(f)) for w, f in reads]
            for what, future in futures:
                try:
                    future.result()
                except Exception as exc:  # noqa: BLE001 -- one failed read must not end the report
                    self.got.missed(what, exc)
        finally:
            # Ctrl-C: queued reads are dropped; running ones end within their timeouts.
            pool.shutdown(wait=True, cancel_futures=True)

    # --- namespaces and pods -----------------------------------------------------------------

    def _namespaces(self) -> list[str]:
        """The selected namespaces (each must exist), or every one labelled for the mesh."""
        mesh = self.settings.mesh_namespace
        if objects.get(self.kube, NAMESPACES, mesh) is None:  # still worth a report: say so
            self.got.missed(
                f"namespace {mesh}",
                MeshctlError("it does not exist: is the mesh installed in another namespace?"),
            )
        if self.settings.namespaces is not None:
            for name in self.settings.namespaces:
                if objects.get(self.kube, NAMESPACES, name) is None:
                    raise MeshctlError(
                        f"namespace {name} does not exist",
                        hint="list them with 'kubectl get namespaces'",
                    )
            return [n for n in dict.fromkeys(self.settings.namespaces) if n != mesh]
        found: set[str] = set()
        for selector in MESH_LABELS:
            items, _ = objects.list_objects(self.kube, NAMESPACES, label_selector=selector)
            found.update(str((i.get("metadata") or {}).get("name")) for i in items)
        found.discard(mesh)
        return sorted(found)

    def _pods(self, namespace: str) -> list[dict[str, Any]]:
        items, _ = objects.list_objects(self.kube, PODS, namespace)
        return [dict(p) for p in items]

    def _pod_reads(self, pods: Iterable[Mapping[str, Any]]) -> list[tuple[str, Callable[[], None]]]:
        reads: list[tuple[str, Callable[[], None]]] = []
        for pod in pods:
            role = layout.role_of(pod)
            meta = pod.get("metadata") or {}
            namespace, name = str(meta.get("namespace")), str(meta.get("name"))
            running = (pod.get("status") or {}).get("phase") == "Running"
            restarted = layout.restarts(pod)
            for container in layout.logged_containers(pod, role):
                reads.append(
                    (
                        f"log of {namespace}/{name} {container}",
                        partial(self._log, pod, container, role, previous=False),
                    )
                )
                if container in restarted:
                    reads.append(
                        (
                            f"previous log of {namespace}/{name} {container}",
                            partial(self._log, pod, container, role, previous=True),
                        )
                    )
            if layout.has_admin(role) and running:
                reads.append((f"config dump of {namespace}/{name}", partial(self._dump, pod, role)))
            if role is Role.CNI_AGENT and running:
                reads.append((f"CNI config of {namespace}/{name}", partial(self._conflist, pod)))
        return reads

    # --- reads -------------------------------------------------------------------------------

    def _log(self, pod: Mapping[str, Any], container: str, role: Role, *, previous: bool) -> None:
        meta = pod.get("metadata") or {}
        namespace, name = str(meta.get("namespace")), str(meta.get("name"))
        member = layout.log_member(namespace, name, container, previous=previous)
        with self.got.lock:  # memory stays bounded: past twice the cap no log is read
            full = self.got.log_bytes > 2 * self.settings.total_limit
        if full:
            self.got.missed(member, MeshctlError("skipped: the report's size cap was reached"))
            return
        found = podlog.read(
            self.kube,
            namespace,
            name,
            container,
            since=self.settings.since,
            limit=self.settings.log_limit,
            previous=previous,
        )
        text = redact_text(found.text)
        priority = (
            Priority.PREVIOUS_LOG
            if previous
            else Priority.CONTROL_PLANE_LOG
            if role is Role.CONTROL_PLANE
            else Priority.PROXY_LOG
        )
        log = LogText(
            namespace=namespace,
            pod=name,
            container=container,
            previous=previous,
            text=text,
            cut=found.cut,
        )
        with self.got.lock:
            self.got.log_bytes += len(text)
            self.got.logs.append(log)
            self.got.members.append(Member(member, text.encode(), int(priority)))

    def _dump(self, pod: Mapping[str, Any], role: Role) -> None:
        meta = pod.get("metadata") or {}
        namespace, name = str(meta.get("namespace")), str(meta.get("name"))
        dump: Mapping[str, Any] | None = None
        error = ""
        try:
            status, body = portforward.http_get(
                self.kube,
                namespace,
                name,
                layout.ADMIN_PORT,
                layout.CONFIG_DUMP_PATH,
                timeout=self.settings.proxy_timeout,
                limit=DUMP_LIMIT,
            )
        except KubeError as exc:
            error = exc.message
        else:
            if status != 200:
                error = f"admin port answered {status}: {body[:200].decode(errors='replace')}"
            else:
                try:  # the proxy's answer is a peer's JSON: the bounded reader (depth, size)
                    parsed = load_json(body, f"{namespace}/{name} /config_dump", inputs.limits())
                except InputError as exc:
                    parsed, error = None, f"admin port answered unusable JSON: {exc.message}"
                if isinstance(parsed, dict):
                    dump = redact_object(parsed)
                    self.got.add(
                        text_member(
                            layout.dump_member(namespace, name), json_text(dump), Priority.DUMP
                        )
                    )
                else:
                    error = error or f"admin port answered {len(body)} bytes, not a JSON object"
                    self.got.add(
                        text_member(
                            layout.dump_member(namespace, name) + ".txt",
                            body.decode(errors="replace"),
                            Priority.DUMP,
                        )
                    )
        answer = ProxyAnswer(
            namespace=namespace, pod=name, role=str(role), dump=dump, error=redact_text(error)
        )
        with self.got.lock:
            self.got.proxies.append(answer)

    def _conflist(self, pod: Mapping[str, Any]) -> None:
        meta = pod.get("metadata") or {}
        namespace, name = str(meta.get("namespace")), str(meta.get("name"))
        node = str((pod.get("spec") or {}).get("nodeName") or name)
        path = PODS.path(namespace, f"{name}:{layout.CNI_STATUS_PORT}", "proxy")
        answer = api.request(
            self.kube,
            "GET",
            path + layout.CNI_CONFLIST_PATH,
            timeout=self.settings.proxy_timeout,
        )
        self.got.add(
            text_member(
                layout.conflist_member(node), json_text(redact_object(answer)), Priority.NODE
            )
        )

    def _install_record(self) -> None:
        items, _ = objects.list_objects(
            self.kube,
            CONFIG_MAPS,
            self.settings.mesh_namespace,
            label_selector=f"{mf.COMPONENT_LABEL}={mf.INSTALL}",
        )
        if not items:
            self.got.missed(
                "install record",
                MeshctlError(f"no install record in {self.settings.mesh_namespace}"),
            )
        for item in items:
            record_name = str((item.get("metadata") or {}).get("name"))
            self.got.add(objects_member(f"install/{record_name}.yaml", [item], Priority.INSTALL))

    def _nodes(self) -> None:
        items, _ = objects.list_objects(self.kube, NODES)
        self.got.add(objects_member("cluster/nodes.yaml", items, Priority.VERSIONS))

    def _webhooks(self) -> None:
        for resource in (MUTATING_WEBHOOK_CONFIGURATIONS, VALIDATING_WEBHOOK_CONFIGURATIONS):
            items, _ = objects.list_objects(self.kube, resource)
            self.got.add(
                objects_member(layout.objects_member(None, resource.kind), items, Priority.OBJECTS)
            )

    def _mesh_config(self) -> None:
        for resource in self._mesh_kinds():
            items, _ = objects.list_objects(self.kube, resource)
            if items:
                where = None if not resource.namespaced else "_all"
                name = layout.objects_member(where, f"{resource.kind}.{resource.group}")
                self.got.add(objects_member(name, items, Priority.OBJECTS))

    def _mesh_kinds(self) -> list[Resource[dict[str, Any]]]:
        """Every listable kind of ``MESH_GROUPS`` at each group's preferred version."""
        groups = api.request(self.kube, "GET", "/apis").get("groups")
        found: list[Resource[dict[str, Any]]] = []
        for group in groups if isinstance(groups, list) else ():
            if not isinstance(group, dict) or group.get("name") not in MESH_GROUPS:
                continue
            version = str((group.get("preferredVersion") or {}).get("version") or "")
            if not version:
                continue
            answer = api.request(self.kube, "GET", f"/apis/{group['name']}/{version}")
            for item in answer.get("resources") or ():  # type: ignore[attr-defined]
                plural = str(item.get("name", ""))
                if "/" in plural or "list" not in (item.get("verbs") or ()):
                    continue
                found.append(
                    Resource(
                        str(group["name"]),
                        version,
                        plural,
                        str(item.get("kind")),
                        bool(item.get("namespaced")),
                    )
                )
        return found

    def _objects(self, namespace: str) -> None:
        mesh = namespace == self.settings.mesh_namespace
        kinds: list[Resource[Any]] = [PODS, SERVICES]
        if mesh:
            kinds += [DEPLOYMENTS, DAEMONSETS, CONFIG_MAPS, SERVICE_ACCOUNTS]
        for resource in kinds:
            items, _ = objects.list_objects(self.kube, resource, namespace)
            self.got.add(
                objects_member(
                    layout.objects_member(namespace, resource.kind), items, Priority.OBJECTS
                )
            )
        if mesh:  # by name and type only
            secrets, _ = objects.list_objects(self.kube, SECRETS, namespace)
            stubs = [secret_stub(s) for s in secrets]
            self.got.add(
                objects_member(layout.objects_member(namespace, "Secret"), stubs, Priority.OBJECTS)
            )

    def _events(self, namespace: str) -> None:
        items, _ = objects.list_objects(self.kube, EVENTS, namespace)
        redacted = [redact_object(e) for e in items]
        with self.got.lock:
            self.events.extend(redacted)
        self.got.add(objects_member(layout.events_member(namespace), redacted, Priority.EVENTS))


def _since_text(since: float | None) -> str:
    from meshctl.values import format_duration

    return "the start of each log" if since is None else format_duration(since)


def _client() -> dict[str, str]:
    import platform
    import sys

    return {
        "meshctl": __version__,
        "python": platform.python_version(),
        "platform": f"{sys.platform}/{platform.machine()}",
        "frozen": str(bool(getattr(sys, "frozen", False))).lower(),
    }
