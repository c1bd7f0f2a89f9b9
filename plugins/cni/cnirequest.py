"""The node agent's side of the CNI plugin: one CNI request (env + stdin), served in the agent.

The runtime runs ``meshctl-cni`` (the thin client, ``meshctl_plugins.cni_plugin.client``), which
hands the request to the agent over ``<run_dir>/pluginevent.sock`` (``POST /cni``, see
pluginserver.py); ``serve`` answers it here, already imported and warm, and the client prints
the answer. Invariants:
- The answer is what the runtime must see: the result JSON (ADD) or the CNI error JSON (SPEC.md
  "Error"), with exit code 0 or 1; a bug is code 199 with the exception, never a traceback.
- ADD captures only pods injected in CNI mode, with the rules their init container would apply
  (``meshctl.core.k8s.cni.pod``), in their netns (``iptc`` backend by default), through the
  agent's one kernel thread (``KernelRunner``: libiptc and setns act per thread).
- Fail closed: when the pod cannot be read for a namespace that is not excluded, ADD fails (code
  11, try again later) rather than let a pod start with its traffic uncaptured.
- DEL is idempotent and never blocks teardown: a missing netns or missing rules is success.
- Pods and namespaces come from the API server, or without one from the ``local_inventory``
  file the installer names in the config (the same objects, the same decisions).
- Ambient mode (``ambient_enabled``): a pod enrolled by its or its namespace's label is handed
  to the ambient agent in this process, which captures it and gives it to the node proxy; the
  ADD fails (code 104) unless it confirms (fail closed). Every other pod's netns is reported to
  it too, so that a label added later can enroll it; DEL is reported the same way.
- Records go to the logger ``meshctl.cni`` (the agent's log, and ``<run_dir>/meshctl-cni.log``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar, cast

from meshctl import inputs
from meshctl.core.k8s.cni import spec
from meshctl.core.k8s.cni.spec import CniError, Request
from meshctl.errors import ConfigError, KubeError, MeshctlError, NetError, UserError
from meshctl.structured import InputError, Limits, too_large

if TYPE_CHECKING:
    from collections.abc import Mapping

    from meshctl.core.capture.plan import CapturePlan
    from meshctl.core.capture.settings import CaptureSettings
    from meshctl.core.k8s.cni.messages import PluginEvent
    from meshctl.core.k8s.cni.pod import Decision
    from meshctl.core.k8s.schema import Namespace, Pod
    from meshctl.net.netns import NetnsRef

    NamespaceReader = Callable[[], Namespace | None]

log = logging.getLogger("meshctl.cni")
T = TypeVar("T")


class AgentUnavailableError(Exception):
    """The ambient agent did not take the pod; ``str()`` says why."""


class KernelRunner:
    """Runs kernel work on the agent's one kernel thread (``submit`` blocks until it is done)."""

    def __init__(self, submit: Callable[[Callable[[], Any]], Any]) -> None:
        self._submit = submit

    def __call__(self, fn: Callable[[], T]) -> T:
        return cast("T", self._submit(fn))


@dataclass(frozen=True, slots=True, kw_only=True)
class Context:
    """What a request may use of the agent: its kernel thread, and (ambient) the enrollment
    routes, called as ``agent(route, event, timeout) -> answer text`` (or
    ``AgentUnavailableError``)."""

    kernel: KernelRunner
    agent: Callable[[str, PluginEvent, float], str]
    # Where the runtime's netns files appear to the agent (its DaemonSet's mount, "" when it
    # runs on the host): a netns outside it cannot be entered from here.
    netns_dir: str = ""


@dataclass(frozen=True, slots=True)
class Answer:
    """What the thin client prints and exits with."""

    code: int  # 0, or 1 with the error JSON
    stdout: str


def serve(env: Mapping[str, str], stdin: bytes, context: Context) -> Answer:
    """Serve one CNI request as the plugin used to in its own process.

    Whatever happens (bad input, a bug), the answer is in the spec's format: a bug is code 199
    (``INTERNAL``) with the exception in ``details``."""
    command = env.get("CNI_COMMAND", "")
    try:
        limits = _limits(env)
    except CniError as exc:
        return _fail(exc, spec.LATEST_VERSION)
    if len(stdin) > limits.max_bytes:
        problem = too_large(spec.CONFIG_SOURCE, limits)
        return _fail(CniError(spec.DECODE_FAILURE, problem.message, problem.hint or ""), "")
    try:
        request = spec.parse_request(env, stdin, limits)
    except CniError as exc:
        # Expected failures: the message is the record; a traceback would only be noise.
        log.error("rejected %s request: %s", command or "(none)", exc.msg)  # noqa: TRY400
        return _fail(exc, spec.error_version(env, stdin, limits))
    try:
        output = _handle(request, context)
    except CniError as exc:
        log.error("%s %s failed: %s %s", request.command, request.pod, exc.msg, exc.details)  # noqa: TRY400
        return _fail(exc, request.cni_version)
    except Exception as exc:  # a bug must still answer the runtime in the spec's format
        log.exception("%s %s: unexpected failure", request.command, request.pod)
        failure = CniError(spec.INTERNAL, f"unexpected {type(exc).__name__}: {str(exc)[:300]}")
        return _fail(failure, request.cni_version)
    return Answer(0, output or "")


def _limits(env: Mapping[str, str]) -> Limits:
    try:
        return inputs.limits(env)
    except UserError as exc:
        raise CniError(spec.INVALID_ENVIRONMENT, exc.message, exc.hint or "") from exc


def _handle(request: Request, context: Context) -> str | None:  # noqa: PLR0911 (one exit per outcome)
    if request.command == "VERSION":
        return spec.version_result(request)
    if request.command == "STATUS":
        _status(request)
        return None
    if request.command == "DEL":
        _delete(request, context)
        return None
    _require_netns(request, context)
    if request.pod_namespace in request.plugin.exclude_namespaces:
        log.info("%s %s: namespace excluded, nothing to do", request.command, request.pod)
        return spec.add_result(request) if request.command == "ADD" else None
    namespace, pod, decision = _decide(request)
    if not decision.capture:
        if request.plugin.ambient_enabled and request.command == "ADD":
            _ambient_add(request, context, namespace, pod, decision.reason)
            return spec.add_result(request)
        log.info("%s %s: no capture: %s", request.command, request.pod, decision.reason)
        return spec.add_result(request) if request.command == "ADD" else None
    if request.command == "ADD":
        _apply(request, context, decision.args)
        return spec.add_result(request)
    _check(request, context, decision.args)
    return None


def _require_netns(request: Request, context: Context) -> None:
    if Path(request.netns).exists() or not _visible_here(request.netns, context):
        return  # one the agent cannot see is refused only where it must be entered (_enter)
    raise CniError(
        spec.INVALID_ENVIRONMENT,
        f"CNI_NETNS: network namespace {request.netns} does not exist",
    )


def _visible_here(netns: str, context: Context) -> bool:
    """Whether ``netns`` lies where this agent sees the runtime's netns files."""
    if not context.netns_dir:
        return True
    return Path(netns).is_relative_to(context.netns_dir)


def _enter(request: Request, context: Context) -> None:
    """Refuse (fail closed) a netns the agent must enter but cannot see, naming the fix."""
    if _visible_here(request.netns, context) or Path(request.netns).exists():
        return
    pinned = str(Path(request.netns).parent)
    raise CniError(
        spec.INVALID_ENVIRONMENT,
        f"network namespace {request.netns} of pod {request.pod} is not visible to the node "
        f"agent, which mounts the runtime's netns directory {context.netns_dir}; refusing to "
        "start it uncaptured (fail closed)",
        f"the container runtime pins pod netns in {pinned}: reinstall with "
        f"--set components.cni.netnsDir={pinned} (meshctl cni manifest --netns-dir {pinned})",
    )


def _decide(request: Request) -> tuple[NamespaceReader, Pod, Decision]:
    from meshctl.core.k8s.cni import pod as pods
    from meshctl.core.k8s.inject.errors import InvalidAnnotationError

    if request.plugin.local_inventory:
        namespace, pod = _from_inventory(request)
    else:
        namespace, pod = _from_api(request)
    try:
        decision = pods.decide(pod)
    except InvalidAnnotationError as exc:
        raise CniError(spec.BAD_ANNOTATIONS, f"pod {request.pod}: {exc.message}") from exc
    log.debug("%s %s: %s %s", request.command, request.pod, decision.reason, decision.args)
    return namespace, pod, decision


def _from_api(request: Request) -> tuple[NamespaceReader, Pod]:
    """The pod from the API server, and how to read its namespace there (fail closed)."""
    from meshctl.kube import pods as kube_pods
    from meshctl.kube import rest

    fail_closed = (
        f"cannot read pod {request.pod} from the API server, so it cannot tell whether the pod "
        "must be captured; refusing to start it uncaptured (fail closed)"
    )
    try:
        config = rest.load(request.plugin.kubeconfig_path)
    except ConfigError as exc:
        raise CniError(spec.TRY_AGAIN_LATER, fail_closed, f"{exc.message}; {exc.hint}") from exc
    try:
        pod = kube_pods.get_pod(
            config,
            request.pod_namespace,
            request.pod_name,
            timeout=request.plugin.api_timeout,
            deadline=request.plugin.pod_lookup_timeout,
        )
    except rest.ApiUnreachableError as exc:
        raise CniError(spec.TRY_AGAIN_LATER, fail_closed, exc.message) from exc
    except rest.ApiStatusError as exc:
        raise CniError(
            spec.API_REFUSED, f"reading pod {request.pod} failed (HTTP {exc.status})", exc.message
        ) from exc

    def namespace() -> Namespace | None:
        try:
            found = rest.get_json(
                config,
                rest.namespace_path(request.pod_namespace),
                timeout=request.plugin.api_timeout,
            )
            return cast("Namespace", found)
        except KubeError as exc:
            raise CniError(
                spec.TRY_AGAIN_LATER,
                f"cannot read namespace {request.pod_namespace}, so it cannot tell whether pod "
                f"{request.pod} is in ambient mode; refusing to start it uncaptured (fail closed)",
                exc.message,
            ) from exc

    return namespace, pod


def _from_inventory(request: Request) -> tuple[NamespaceReader, Pod]:
    """The pod from the local inventory file, re-read until it lists the pod or the lookup
    time is up (whoever writes it may lag the sandbox, as the API may); then fail closed."""
    import functools
    import time

    from meshctl.core.k8s import podlist

    path = request.plugin.local_inventory
    give_up = time.monotonic() + request.plugin.pod_lookup_timeout
    while True:
        try:
            limits = inputs.limits()
            current = podlist.parse(inputs.read_bytes(path, path, limits), path, limits)
            problem = f"pod {request.pod} is not in it"
        except (OSError, InputError, podlist.InventoryError) as exc:
            current, problem = None, getattr(exc, "strerror", None) or str(exc)
        pod = current.pod(request.pod_namespace, request.pod_name) if current else None
        if current is not None and pod is not None:
            return functools.partial(current.namespace, request.pod_namespace), pod
        if time.monotonic() + 0.1 > give_up:
            raise CniError(
                spec.TRY_AGAIN_LATER,
                f"cannot find pod {request.pod} in the local inventory {path}, so it cannot tell "
                "whether the pod must be captured; refusing to start it uncaptured (fail closed)",
                problem,
            )
        time.sleep(0.1)


def _ambient_add(
    request: Request,
    context: Context,
    read_namespace: NamespaceReader,
    pod: Pod,
    sidecar_reason: str,
) -> None:
    """Hand an ambient pod to the ambient agent (fail closed); report any other pod's netns."""
    from meshctl.core.k8s import ambient

    namespace: Namespace | None = None
    labels = pod.get("metadata", {}).get("labels") or {}
    if labels.get(ambient.DATAPLANE_MODE) not in (ambient.MODE_AMBIENT, ambient.MODE_NONE):
        namespace = read_namespace()  # only its label can decide (fail closed when unreadable)
    decision = ambient.enrollment(
        pod, namespace, excluded_namespaces=request.plugin.exclude_namespaces
    )
    event: PluginEvent = {
        "podName": request.pod_name,
        "podNamespace": request.pod_namespace,
        "podUid": str(pod.get("metadata", {}).get("uid", "")),
        "containerId": request.container_id,
        "netns": request.netns,
        "ifname": request.ifname,
        "ips": _result_ips(request),
        "enroll": decision.enrolled,
        "pod": pod,
    }
    if not decision.enrolled:
        log.info(
            "ADD %s: no capture: %s; not ambient: %s", request.pod, sidecar_reason, decision.reason
        )
        try:
            context.agent("/cmdadd", event, 1.0)
        except AgentUnavailableError as exc:
            log.info("ADD %s: node agent not told about the netns: %s", request.pod, exc)
        return
    try:
        context.agent("/cmdadd", event, request.plugin.agent_timeout)
    except AgentUnavailableError as exc:
        raise CniError(
            spec.AGENT_UNAVAILABLE,
            f"pod {request.pod} is in ambient mode ({decision.reason}) but the node agent did "
            "not capture it; refusing to start it uncaptured (fail closed)",
            str(exc),
        ) from exc
    log.info("ADD %s: ambient: captured by the node agent (%s)", request.pod, decision.reason)


def _result_ips(request: Request) -> list[str]:
    """The pod's addresses from the previous plugin's result (the API does not have them yet)."""
    ips = (request.prev_result or {}).get("ips") or []
    out = []
    for entry in ips:
        address = str(entry.get("address", "")) if isinstance(entry, dict) else ""
        if address:
            out.append(address.split("/", 1)[0])
    return out


def _settings(request: Request, args: tuple[str, ...]) -> CaptureSettings:
    from meshctl.core.capture.settings import settings_from_args

    try:
        return settings_from_args(args)
    except ConfigError as exc:
        raise CniError(spec.BAD_ANNOTATIONS, f"pod {request.pod}: {exc.message}") from exc


def _in_pod_netns(
    request: Request,
    context: Context,
    args: tuple[str, ...],
    run: Callable[[CapturePlan, NetnsRef], T],
    failure: str,
) -> tuple[CaptureSettings, T]:
    """Plan the pod's rules and run ``run`` on them in its netns; kernel refusals are CNI errors."""
    from meshctl.core.capture.plan import plan
    from meshctl.net.netns import NetnsRef

    settings = _settings(request, args)
    _enter(request, context)
    try:
        return settings, context.kernel(
            lambda: run(plan(settings), NetnsRef(request.netns, request.netns))
        )
    except MeshctlError as exc:
        raise CniError(spec.CAPTURE_FAILED, f"{failure}: {exc.message}", exc.hint or "") from exc


def _apply(request: Request, context: Context, args: tuple[str, ...]) -> None:
    from meshctl.net import capture as kernel

    settings, outcome = _in_pod_netns(
        request,
        context,
        args,
        lambda rules, target: kernel.apply(
            rules, target=target, backend=request.plugin.iptables_backend
        ),
        f"installing capture rules for pod {request.pod} in {request.netns} failed",
    )
    log.info(
        "ADD %s: captured (%s, backend %s, %s)",
        request.pod,
        settings.describe(),
        outcome.backend,
        " ".join(args),
    )


def _check(request: Request, context: Context, args: tuple[str, ...]) -> None:
    from meshctl.net import capture as kernel

    _, drift = _in_pod_netns(
        request,
        context,
        args,
        # Read whichever tables hold the rules, as the user's check does.
        lambda rules, target: kernel.check(rules, target=target, backend="auto"),
        f"reading rules of {request.pod}",
    )
    if not drift.in_sync:
        diff = "".join(drift.diffs.values()) + "\n".join(drift.routing)
        raise CniError(
            spec.RULES_MISSING,
            f"capture rules of pod {request.pod} are not as its annotations ask",
            diff[:2000],
        )


def _delete(request: Request, context: Context) -> None:
    if request.plugin.ambient_enabled and _ambient_delete(request, context):
        # The agent removed what it added in the pod; nothing of ours is left there (a pod
        # the plugin captured itself, in sidecar mode, is one the agent never enrolls).
        log.info("DEL %s: released by the node agent", request.pod)
        return
    if not request.netns or not Path(request.netns).exists():
        log.info("DEL %s: netns already gone, nothing to remove", request.pod)
        return
    if request.pod_namespace in request.plugin.exclude_namespaces:
        return
    from meshctl.net import capture as kernel
    from meshctl.net.netns import NetnsRef

    try:
        target = NetnsRef(request.netns, request.netns)
        outcomes = context.kernel(lambda: kernel.clean(target=target, backend="auto"))
    except (NetError, MeshctlError) as exc:
        # The rules live only in this netns, which the runtime deletes next: failing DEL would
        # only block the sandbox's teardown.
        log.warning("DEL %s: removing capture rules failed: %s", request.pod, exc.message)
        return
    removed = [o.backend for o in outcomes if o.changed]
    log.info("DEL %s: %s", request.pod, f"removed ({', '.join(removed)})" if removed else "none")


def _ambient_delete(request: Request, context: Context) -> bool:
    """Tell the ambient agent the sandbox is going (best effort: DEL never fails on it);
    whether it released the pod (and removed its rules there)."""
    event: PluginEvent = {
        "podName": request.pod_name,
        "podNamespace": request.pod_namespace,
        "podUid": request.args.get("K8S_POD_UID", ""),
        "containerId": request.container_id,
        "netns": request.netns,
    }
    try:
        answer = context.agent("/cmddel", event, 2.0)
    except AgentUnavailableError as exc:
        log.info("DEL %s: node agent not told: %s", request.pod, exc)
        return False
    return answer.startswith(spec.AGENT_RELEASED)


def _status(request: Request) -> None:
    from meshctl.kube import rest

    if request.plugin.local_inventory:
        if not Path(request.plugin.local_inventory).is_file():
            raise CniError(
                spec.NOT_AVAILABLE,
                f"meshctl-cni cannot serve ADD: its local inventory "
                f"{request.plugin.local_inventory} is missing",
                "is 'meshctl cni install --local-inventory' running on this node?",
            )
        return

    try:
        rest.load(request.plugin.kubeconfig_path)
    except ConfigError as exc:
        raise CniError(
            spec.NOT_AVAILABLE,
            "meshctl-cni cannot serve ADD: its kubeconfig is missing",
            f"{exc.message}; is 'meshctl cni install' running on this node?",
        ) from exc


def _fail(error: CniError, cni_version: str) -> Answer:
    """The spec's error JSON (the config's version when known)."""
    return Answer(1, error.to_json(cni_version or spec.LATEST_VERSION))
