"""``meshctl-cni``: the chained CNI plugin the container runtime runs for every pod sandbox.

A raw plugin (``main(argv) -> int``, no typer): meshctl/entry.py routes here when the binary runs
as ``meshctl-cni`` or with ``CNI_COMMAND`` set and no arguments (and ``meshctl cni-plugin``).
Invariants:
- stdout carries exactly one thing: the result JSON (ADD, VERSION) or the CNI error JSON; logs go
  to the run dir's file and the node agent (agentlog.py), never to stdout.
- ADD captures only pods injected in CNI mode, with the rules their init container would apply
  (``meshctl.core.k8s.cni.pod``), in their netns, in-process (``iptc`` backend by default).
- Fail closed: when the pod cannot be read for a namespace that is not excluded, ADD fails (code
  11, try again later) rather than let a pod start with its traffic uncaptured.
- DEL is idempotent and never blocks teardown: a missing netns or missing rules is success.
- Pods and namespaces come from the API server, or without one from the ``local_inventory``
  file the installer names in the config (the same objects, the same decisions).
- Ambient mode (``ambient_enabled``): a pod enrolled by its or its namespace's label is handed
  to the node agent, which captures it and gives it to the node proxy; the ADD fails (code 104)
  unless the agent confirms (fail closed). Every other pod's netns is reported to the agent too,
  best effort, so that a label added later can enroll it; DEL is reported the same way.
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, cast

from meshctl import inputs
from meshctl.core.k8s.cni import spec
from meshctl.core.k8s.cni.spec import CniError, Request
from meshctl.errors import ConfigError, KubeError, MeshctlError, NetError, UserError
from meshctl.structured import InputError, Limits

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

    from meshctl.core.capture.settings import CaptureSettings
    from meshctl.core.k8s.cni.messages import PluginEvent
    from meshctl.core.k8s.cni.pod import Decision
    from meshctl.core.k8s.schema import Namespace, Pod

    NamespaceReader = Callable[[], Namespace | None]

# The capture engine, the pod policy and the API client are imported where first used: VERSION,
# DEL of a gone sandbox and excluded namespaces never pay for them (start-up is the ADD budget).

log = logging.getLogger("meshctl.cni")


def main(argv: list[str]) -> int:
    """Serve one CNI invocation; exit 0 with the result, or 1 with the error JSON on stdout.

    Whatever happens (bad input, a bug, an interrupt), the runtime gets the spec's error JSON:
    a bug is code 199 (``INTERNAL``) with the exception in ``details``, never a traceback."""
    del argv  # the runtime passes everything through the environment and stdin
    try:
        return _serve(os.environ)
    except KeyboardInterrupt:
        return _fail(CniError(spec.TRY_AGAIN_LATER, "interrupted before finishing"), "")
    except Exception as exc:  # a bug: answer the runtime in the spec's format all the same
        log.exception("unexpected failure")
        failure = CniError(spec.INTERNAL, f"unexpected {type(exc).__name__}: {str(exc)[:300]}")
        return _fail(failure, spec.LATEST_VERSION)


def _serve(env: Mapping[str, str]) -> int:
    command = env.get("CNI_COMMAND", "")
    try:
        limits = _limits(env)
        stdin = _read_stdin(command, limits)
    except CniError as exc:
        return _fail(exc, spec.LATEST_VERSION)
    try:
        request = spec.parse_request(env, stdin, limits)
    except CniError as exc:
        _configure_logging_for_bad_input(stdin, limits)
        # Expected failures: the message is the record; a traceback would only be noise.
        log.error("rejected %s request: %s", command or "(none)", exc.msg)  # noqa: TRY400
        return _fail(exc, spec.error_version(env, stdin, limits))
    _configure_logging(request)
    try:
        output = _handle(request)
    except CniError as exc:
        log.error("%s %s failed: %s %s", request.command, request.pod, exc.msg, exc.details)  # noqa: TRY400
        return _fail(exc, request.cni_version)
    except Exception as exc:  # a bug must still answer the runtime in the spec's format
        log.exception("%s %s: unexpected failure", request.command, request.pod)
        failure = CniError(spec.INTERNAL, f"unexpected {type(exc).__name__}: {str(exc)[:300]}")
        return _fail(failure, request.cni_version)
    if output:
        sys.stdout.write(output + "\n")
    return 0


def _limits(env: Mapping[str, str]) -> Limits:
    try:
        return inputs.limits(env)
    except UserError as exc:
        raise CniError(spec.INVALID_ENVIRONMENT, exc.message, exc.hint or "") from exc


def _read_stdin(command: str, limits: Limits) -> bytes:
    """The network config; a runtime always pipes it, so a terminal or a closed stdin is a
    person trying the plugin, told at once instead of waiting for input."""
    stream = sys.stdin
    if stream is None:
        raise CniError(spec.DECODE_FAILURE, "no network config: stdin is closed", _BY_HAND)
    try:
        interactive = stream.isatty()
    except (ValueError, OSError):
        interactive = False
    if interactive:
        if command == "VERSION":  # the one command that needs no config
            return b""
        raise CniError(spec.DECODE_FAILURE, "no network config: stdin is a terminal", _BY_HAND)
    try:
        return inputs.read_stdin(limits, spec.CONFIG_SOURCE)
    except OSError as exc:
        raise CniError(spec.IO_FAILURE, f"cannot read stdin: {exc.strerror or exc}") from exc
    except InputError as exc:
        raise CniError(spec.DECODE_FAILURE, exc.message, exc.hint or "") from exc


_BY_HAND = (
    "the container runtime passes the network config as JSON on stdin; by hand: "
    'echo \'{"cniVersion": "1.0.0"}\' | CNI_COMMAND=VERSION meshctl-cni'
)


def _handle(request: Request) -> str | None:  # noqa: PLR0911 (one exit per outcome)
    if request.command == "VERSION":
        return spec.version_result(request)
    if request.command == "STATUS":
        _status(request)
        return None
    if request.command == "DEL":
        _delete(request)
        return None
    _require_netns(request)
    if request.pod_namespace in request.plugin.exclude_namespaces:
        log.info("%s %s: namespace excluded, nothing to do", request.command, request.pod)
        return spec.add_result(request) if request.command == "ADD" else None
    namespace, pod, decision = _decide(request)
    if not decision.capture:
        if request.plugin.ambient_enabled and request.command == "ADD":
            _ambient_add(request, namespace, pod, decision.reason)
            return spec.add_result(request)
        log.info("%s %s: no capture: %s", request.command, request.pod, decision.reason)
        return spec.add_result(request) if request.command == "ADD" else None
    if request.command == "ADD":
        _apply(request, decision.args)
        return spec.add_result(request)
    _check(request, decision.args)
    return None


def _require_netns(request: Request) -> None:
    if not Path(request.netns).exists():
        raise CniError(
            spec.INVALID_ENVIRONMENT,
            f"CNI_NETNS: network namespace {request.netns} does not exist",
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
    request: Request, read_namespace: NamespaceReader, pod: Pod, sidecar_reason: str
) -> None:
    """Hand an ambient pod to the node agent (fail closed); report any other pod's netns."""
    from meshctl.core.k8s import ambient

    from .agentevent import AgentUnavailableError, post

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
            post(request.plugin.run_dir, "/cmdadd", event, timeout=1.0)
        except AgentUnavailableError as exc:
            log.info("ADD %s: node agent not told about the netns: %s", request.pod, exc)
        return
    try:
        post(request.plugin.run_dir, "/cmdadd", event, timeout=request.plugin.agent_timeout)
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


def _apply(request: Request, args: tuple[str, ...]) -> None:
    from meshctl.core.capture.plan import plan
    from meshctl.net import capture as kernel
    from meshctl.net.netns import NetnsRef

    settings = _settings(request, args)
    try:
        outcome = kernel.apply(
            plan(settings),
            target=NetnsRef(request.netns, request.netns),
            backend=request.plugin.iptables_backend,
        )
    except MeshctlError as exc:
        raise CniError(
            spec.CAPTURE_FAILED,
            f"installing capture rules for pod {request.pod} in {request.netns} failed: "
            f"{exc.message}",
            exc.hint or "",
        ) from exc
    log.info(
        "ADD %s: captured (%s, backend %s, %s)",
        request.pod,
        settings.describe(),
        outcome.backend,
        " ".join(args),
    )


def _check(request: Request, args: tuple[str, ...]) -> None:
    from meshctl.core.capture.plan import plan
    from meshctl.net import capture as kernel
    from meshctl.net.netns import NetnsRef

    settings = _settings(request, args)
    try:
        drift = kernel.check(
            plan(settings),
            target=NetnsRef(request.netns, request.netns),
            backend="auto",  # read whichever tables hold the rules, as the user's check does
        )
    except MeshctlError as exc:
        raise CniError(
            spec.CAPTURE_FAILED, f"reading rules of {request.pod}: {exc.message}"
        ) from exc
    if not drift.in_sync:
        diff = "".join(drift.diffs.values()) + "\n".join(drift.routing)
        raise CniError(
            spec.RULES_MISSING,
            f"capture rules of pod {request.pod} are not as its annotations ask",
            diff[:2000],
        )


def _delete(request: Request) -> None:
    if request.plugin.ambient_enabled and _ambient_delete(request):
        # The agent removed what it added in the pod; nothing of ours is left there (a pod
        # the plugin captured itself, in sidecar mode, is one the agent never enrolls).
        log.info("DEL %s: released by the node agent", request.pod)
        return
    if not request.netns or not Path(request.netns).exists():
        log.info("DEL %s: netns already gone, nothing to remove", request.pod)
        return
    if request.pod_namespace in request.plugin.exclude_namespaces:
        return
    # Only now: the capture engine (pyroute2 alone is ~0.3 s of imports) is not needed above.
    from meshctl.net import capture as kernel
    from meshctl.net.netns import NetnsRef

    try:
        outcomes = kernel.clean(target=NetnsRef(request.netns, request.netns), backend="auto")
    except (NetError, MeshctlError) as exc:
        # The rules live only in this netns, which the runtime deletes next: failing DEL would
        # only block the sandbox's teardown.
        log.warning("DEL %s: removing capture rules failed: %s", request.pod, exc.message)
        return
    removed = [o.backend for o in outcomes if o.changed]
    log.info("DEL %s: %s", request.pod, f"removed ({', '.join(removed)})" if removed else "none")


def _ambient_delete(request: Request) -> bool:
    """Tell the agent the sandbox is going (best effort: DEL never fails on it); whether it
    released the pod (and removed its rules there)."""
    from .agentevent import AgentUnavailableError, post

    event: PluginEvent = {
        "podName": request.pod_name,
        "podNamespace": request.pod_namespace,
        "podUid": request.args.get("K8S_POD_UID", ""),
        "containerId": request.container_id,
        "netns": request.netns,
    }
    try:
        answer = post(request.plugin.run_dir, "/cmddel", event, timeout=2.0)
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


def _configure_logging(request: Request) -> None:
    from .agentlog import configure

    configure(request.plugin.run_dir, request.plugin.log_level)


def _configure_logging_for_bad_input(stdin: bytes, limits: Limits) -> None:
    """Log a rejected request where the config would have sent it, when that much is readable."""
    from .agentlog import configure

    config = spec.readable_config(stdin, limits) or {}
    run_dir = config.get("run_dir", spec.DEFAULT_RUN_DIR)
    if isinstance(run_dir, str) and run_dir and "\0" not in run_dir and Path(run_dir).is_dir():
        configure(run_dir, "info")


def _fail(error: CniError, cni_version: str) -> int:
    """The spec's error JSON on stdout (the config's version when known), one line on stderr."""
    sys.stdout.write(error.to_json(cni_version or spec.LATEST_VERSION) + "\n")
    sys.stdout.flush()
    sys.stderr.write(f"Error: {error.msg}\n")
    return 1
