"""Working with objects on the real test node through the Python client (no kubectl).

Owns: server-side apply of manifests (plain dicts, any kind), waiting for ServiceAccounts, pods
and rollouts (Deployment, DaemonSet), pod exec and logs, and a namespace's diagnostics (container
logs and events) for failure reports. Every wait has a timeout and says what it waited for.
"""

from __future__ import annotations

import contextlib
import http
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException
from kubernetes.dynamic import DynamicClient
from kubernetes.stream import stream

FIELD_MANAGER = "meshctl-tests"
T = TypeVar("T")


def _until(what: str, ok: Callable[[], bool], timeout: float, interval: float = 0.2) -> float:
    started = time.monotonic()
    while True:
        try:
            if ok():
                return time.monotonic() - started
        except ApiException as exc:
            if exc.status != http.HTTPStatus.NOT_FOUND:
                raise
        if time.monotonic() - started > timeout:
            raise TimeoutError(f"not within {timeout:.0f}s: {what}")
        time.sleep(interval)


def retry(
    attempt: Callable[[], T], ok: Callable[[T], bool], timeout: float = 30, interval: float = 0.5
) -> T:
    """Calls ``attempt`` until ``ok`` holds for its result; returns the last result either way."""
    deadline = time.monotonic() + timeout
    while True:
        result = attempt()
        if ok(result) or time.monotonic() > deadline:
            return result
        time.sleep(interval)


def service_account_exists(api: k8s.ApiClient, namespace: str, name: str) -> bool:
    try:
        k8s.CoreV1Api(api).read_namespaced_service_account(name, namespace)
    except ApiException as exc:
        if exc.status == http.HTTPStatus.NOT_FOUND:
            return False
        raise
    return True


def wait_service_account(
    api: k8s.ApiClient, namespace: str, name: str = "default", timeout: float = 30
) -> None:
    """Pods are refused until the controller-manager made the namespace's ServiceAccount."""
    _until(
        f"ServiceAccount {namespace}/{name}",
        lambda: service_account_exists(api, namespace, name),
        timeout,
    )


def apply(
    api: k8s.ApiClient, objects: Iterable[Mapping[str, Any]], namespace: str | None = None
) -> list[dict[str, Any]]:
    """Server-side applies each object (in order); namespaced kinds default to ``namespace``."""
    dynamic = DynamicClient(api)
    applied = []
    for obj in objects:
        resource = dynamic.resources.get(api_version=obj["apiVersion"], kind=obj["kind"])
        body = dict(obj)
        ns = body.get("metadata", {}).get("namespace") or namespace if resource.namespaced else None
        result = dynamic.server_side_apply(
            resource, body=body, namespace=ns, field_manager=FIELD_MANAGER, force_conflicts=True
        )
        applied.append(result.to_dict())
    return applied


def delete(
    api: k8s.ApiClient,
    objects: Iterable[Mapping[str, Any]],
    namespace: str | None = None,
    *,
    wait: float = 60,
) -> None:
    """Deletes each object (reverse order, foreground: dependents first) and waits until gone."""
    dynamic = DynamicClient(api)
    pending = []
    for obj in reversed(list(objects)):
        resource = dynamic.resources.get(api_version=obj["apiVersion"], kind=obj["kind"])
        ns = obj.get("metadata", {}).get("namespace") or namespace if resource.namespaced else None
        name = obj["metadata"]["name"]
        with contextlib.suppress(ApiException):
            dynamic.delete(
                resource, name=name, namespace=ns, body={"propagationPolicy": "Foreground"}
            )
        pending.append((resource, name, ns))

    def gone() -> bool:
        for resource, name, ns in pending:
            try:
                dynamic.get(resource, name=name, namespace=ns)
            except ApiException as exc:
                if exc.status == http.HTTPStatus.NOT_FOUND:
                    continue
                raise
            return False
        return True

    _until("deleted objects to be gone", gone, wait)


def wait_rollout(
    api: k8s.ApiClient, kind: str, namespace: str, name: str, timeout: float = 120
) -> float:
    """Waits until a Deployment or DaemonSet has rolled out (as `kubectl rollout status`)."""
    apps = k8s.AppsV1Api(api)

    def done() -> bool:
        if kind == "Deployment":
            d = apps.read_namespaced_deployment_status(name, namespace)
            s, want = d.status, d.spec.replicas if d.spec.replicas is not None else 1
            return bool(
                (s.observed_generation or 0) >= d.metadata.generation
                and (s.updated_replicas or 0) == want
                and (s.available_replicas or 0) == want
                and (s.replicas or 0) == want
            )
        if kind == "DaemonSet":
            ds = apps.read_namespaced_daemon_set_status(name, namespace)
            s = ds.status
            return bool(
                (s.observed_generation or 0) >= ds.metadata.generation
                and s.desired_number_scheduled > 0
                and (s.updated_number_scheduled or 0) == s.desired_number_scheduled
                and (s.number_available or 0) == s.desired_number_scheduled
            )
        raise ValueError(f"wait_rollout: {kind} has no rollout")

    return _until(f"{kind} {namespace}/{name} to roll out", done, timeout)


def pod_ready(pod: Any) -> bool:
    return any(c.type == "Ready" and c.status == "True" for c in (pod.status.conditions or []))


def wait_pod_ready(api: k8s.ApiClient, namespace: str, name: str, timeout: float = 60) -> Any:
    core = k8s.CoreV1Api(api)
    _until(
        f"pod {namespace}/{name} Ready",
        lambda: pod_ready(core.read_namespaced_pod(name, namespace)),
        timeout,
    )
    return core.read_namespaced_pod(name, namespace)


def wait_pod_phase(
    api: k8s.ApiClient, namespace: str, name: str, phases: Sequence[str], timeout: float = 60
) -> Any:
    core = k8s.CoreV1Api(api)
    _until(
        f"pod {namespace}/{name} in {'/'.join(phases)}",
        lambda: core.read_namespaced_pod(name, namespace).status.phase in phases,
        timeout,
    )
    return core.read_namespaced_pod(name, namespace)


def pods(api: k8s.ApiClient, namespace: str, selector: str = "") -> list[Any]:
    return list(k8s.CoreV1Api(api).list_namespaced_pod(namespace, label_selector=selector).items)


def pod_logs(
    api: k8s.ApiClient,
    namespace: str,
    name: str,
    container: str | None = None,
    *,
    previous: bool = False,
    tail: int | None = None,
) -> str:
    kwargs: dict[str, Any] = {"previous": previous}
    if container:
        kwargs["container"] = container
    if tail is not None:
        kwargs["tail_lines"] = tail
    text: str = k8s.CoreV1Api(api).read_namespaced_pod_log(name, namespace, **kwargs)
    return text


@dataclass(frozen=True, slots=True)
class ExecResult:
    returncode: int
    stdout: str
    stderr: str


def pod_exec(
    api: k8s.ApiClient,
    namespace: str,
    name: str,
    argv: Sequence[str],
    container: str | None = None,
    *,
    timeout: float = 60,
) -> ExecResult:
    """Runs ``argv`` in a pod's container through the apiserver and kubelet (as `kubectl exec`)."""
    # kubernetes' stream() swaps its client's request method while it connects: a call another
    # thread makes on the same client meanwhile goes out as a websocket (and fails). So every
    # exec has a client of its own.
    own = k8s.ApiClient(api.configuration)
    try:
        return _exec(own, namespace, name, argv, container, timeout)
    finally:
        own.close()


def _exec(
    api: k8s.ApiClient,
    namespace: str,
    name: str,
    argv: Sequence[str],
    container: str | None,
    timeout: float,
) -> ExecResult:
    core = k8s.CoreV1Api(api)
    kwargs: dict[str, Any] = {"container": container} if container else {}
    ws = stream(
        core.connect_get_namespaced_pod_exec,
        name,
        namespace,
        command=list(argv),
        stdin=False,
        stdout=True,
        stderr=True,
        tty=False,
        _preload_content=False,
        **kwargs,
    )
    out, err = [], []
    deadline = time.monotonic() + timeout
    try:
        while ws.is_open():
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"exec {list(argv)} in {namespace}/{name} ran over {timeout:.0f}s"
                )
            ws.update(timeout=1)
            if ws.peek_stdout():
                out.append(ws.read_stdout())
            if ws.peek_stderr():
                err.append(ws.read_stderr())
        code = ws.returncode
    finally:
        ws.close()
    return ExecResult(int(code) if code is not None else -1, "".join(out), "".join(err))


def delete_namespace_now(
    api: k8s.ApiClient, name: str, *, wait: bool = True, timeout: float = 120
) -> None:
    """Deletes a namespace's pods without grace, then the namespace; waits until it is gone."""
    core = k8s.CoreV1Api(api)
    with contextlib.suppress(ApiException):
        core.delete_collection_namespaced_pod(name, grace_period_seconds=0)
    try:
        core.delete_namespace(name)
    except ApiException as exc:
        if exc.status == http.HTTPStatus.NOT_FOUND:
            return
        raise
    if not wait:
        return

    def gone() -> bool:
        try:
            core.read_namespace(name)
        except ApiException as exc:
            if exc.status == http.HTTPStatus.NOT_FOUND:
                return True
            raise
        return False

    _until(f"namespace {name} to be deleted", gone, timeout)


def describe_namespace(api: k8s.ApiClient, namespace: str, tail: int = 40) -> str:
    """Every pod's phase and container states, each container's last log lines, and the events."""
    core = k8s.CoreV1Api(api)
    lines: list[str] = []
    for pod in core.list_namespaced_pod(namespace).items:
        lines.append(f"pod {pod.metadata.name}: {pod.status.phase} on {pod.spec.node_name}")
        statuses = (pod.status.init_container_statuses or []) + (
            pod.status.container_statuses or []
        )
        for status in statuses:
            lines.append(
                f"  container {status.name}: ready={status.ready} "
                f"restarts={status.restart_count} state={_state(status.state)}"
            )
            for previous in (False, True) if status.restart_count else (False,):
                try:
                    text = pod_logs(
                        api, namespace, pod.metadata.name, status.name, previous=previous, tail=tail
                    )
                except ApiException as exc:
                    text = f"(no logs: {exc.status} {exc.reason})"
                label = "previous logs" if previous else "logs"
                lines += [
                    f"  --- {status.name} {label} ---",
                    *(f"  | {t}" for t in text.splitlines()),
                ]
    events = core.list_namespaced_event(namespace).items
    events.sort(key=lambda e: str(e.last_timestamp or e.event_time or ""))
    lines.append("events:")
    for event in events:
        obj = event.involved_object
        lines.append(f"  {event.type} {obj.kind}/{obj.name} {event.reason}: {event.message}")
    return "\n".join(lines)


def _state(state: Any) -> str:
    if state is None:
        return "?"
    for name in ("running", "waiting", "terminated"):
        detail = getattr(state, name)
        if detail is not None:
            reason = getattr(detail, "reason", None)
            code = getattr(detail, "exit_code", None)
            return (
                name
                + (f" ({reason})" if reason else "")
                + (f" exit {code}" if code is not None else "")
            )
    return "?"


def busybox_pod(name: str, image: str, command: Sequence[str], **spec: Any) -> dict[str, Any]:
    """A one-container pod of the node's busybox image (never pulled: the image is imported)."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"app": name}},
        "spec": {
            "terminationGracePeriodSeconds": 0,
            "containers": [
                {
                    "name": "main",
                    "image": image,
                    "imagePullPolicy": "Never",
                    "command": list(command),
                }
            ],
            **spec,
        },
    }
