"""Rendering the injected parts of a pod: the capture init container, the proxy, their volumes.

Owns the shape of what meshctl adds (names and mount paths follow Istio's, so Istio's docs and
``kubectl logs -c istio-proxy`` habits apply). Pure: settings and per-pod options in, fresh
mappings out; the caller decides where they go (merge.py).
"""

from __future__ import annotations

import dataclasses
import json
import posixpath
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar, cast

from meshctl.core.k8s import proxyconfig
from meshctl.core.k8s.inject import annotations as ann
from meshctl.core.k8s.inject.errors import InjectError, InvalidAnnotationError
from meshctl.core.k8s.inject.interception import (
    HBONE_PORT,
    INBOUND_CAPTURE_PORT,
    OUTBOUND_CAPTURE_PORT,
    READINESS_PORT,
    STATUS_PORT,
    Interception,
    interception_of,
    iptables_args,
    status_port,
)
from meshctl.core.k8s.inject.probes import PROBERS_ENV
from meshctl.core.k8s.inject.settings import InjectSettings

if TYPE_CHECKING:
    from meshctl.core.k8s.schema import (
        Capabilities,
        Container,
        ContainerPort,
        EnvVar,
        HTTPGetAction,
        Probe,
        ResourceRequirements,
        SecurityContext,
        Sysctl,
        Volume,
        VolumeMount,
    )

INIT_CONTAINER = "istio-init"
VALIDATION_CONTAINER = "istio-validation"  # CNI mode: proves the CNI plugin's capture works
PROXY_CONTAINER = "istio-proxy"
# The proxy image's entrypoint is not relied on: the command is spelled out.
MESHCTL = "meshctl"

TOKEN_VOLUME = "istio-token"  # noqa: S105 -- a volume name, not a secret
ROOT_CA_VOLUME = "istiod-ca-cert"
CERTS_VOLUME = "workload-certs"
# The proxy's root filesystem is read-only; /tmp is its one writable place: the data plane's
# metrics dir, and where a one-file frozen binary unpacks itself (an image built on it rather than
# on the one-dir tree our image carries, which unpacks nothing).
TMP_VOLUME = "meshctl-tmp"
VOLUMES = (CERTS_VOLUME, TMP_VOLUME, TOKEN_VOLUME, ROOT_CA_VOLUME)
CONTAINERS = (INIT_CONTAINER, VALIDATION_CONTAINER, PROXY_CONTAINER)

TOKEN_PATH = "/var/run/secrets/tokens"  # noqa: S105 -- a mount path
ROOT_CA_PATH = "/var/run/secrets/istio"
CERTS_PATH = "/var/run/secrets/workload-spiffe-credentials"
TOKEN_LIFETIME_SECONDS = 43200  # 12 h; the kubelet refreshes a projected token at 80 %


@dataclass(frozen=True, slots=True, kw_only=True)
class PodOptions:
    """Per-pod choices read from its annotations (validated), on top of the settings."""

    image: str
    native_sidecar: bool
    rewrite_probes: bool
    interception: Interception
    resources: ResourceRequirements
    readiness_initial_delay: int
    readiness_period: int
    readiness_failure_threshold: int
    status_port: int  # probes and merged metrics (status.sidecar.istio.io/port); 0: none
    proxy_config: proxyconfig.ProxyConfig  # proxy.istio.io/config
    gateway: bool = False  # inject.istio.io/templates: gateway (no capture, a plain container)
    user_volumes: dict[str, dict[str, object]]  # name -> volume source (userVolume)
    user_mounts: dict[str, dict[str, object]]  # volume name -> mount (userVolumeMount)


def pod_options(annotations: dict[str, str], settings: InjectSettings) -> PodOptions:
    """The pod's options: its annotations where set and valid, the settings otherwise (the
    mesh-wide defaults read as the annotations they stand for: a pod's own wins)."""
    defaults = settings.pod_defaults()
    if defaults:
        annotations = {**defaults, **annotations}

    def flag(key: str, default: bool) -> bool:
        value = annotations.get(key)
        return default if value is None else ann.parse_bool(key, value)

    def seconds(key: str, default: int, minimum: int) -> int:
        value = annotations.get(key)
        return default if value is None else ann.parse_seconds(key, value, minimum=minimum)

    image = annotations.get(ann.PROXY_IMAGE)
    return PodOptions(
        image=settings.image if image is None else ann.parse_image(ann.PROXY_IMAGE, image),
        native_sidecar=flag(ann.NATIVE_SIDECAR, settings.native_sidecar),
        rewrite_probes=flag(ann.REWRITE_PROBES, True),
        interception=interception_of(annotations),
        # Istio's gateway template has no default resources: only the annotations' values.
        resources=_resources(annotations, settings, defaults=_template(annotations) == "sidecar"),
        readiness_initial_delay=seconds(ann.READINESS_INITIAL_DELAY, 0, 0),
        readiness_period=seconds(ann.READINESS_PERIOD, 15, 1),
        readiness_failure_threshold=seconds(ann.READINESS_FAILURE_THRESHOLD, 4, 1),
        status_port=status_port(annotations),
        proxy_config=_proxy_config(annotations, settings),
        gateway=_template(annotations) == "gateway",
        user_volumes=_objects(annotations, ann.USER_VOLUME, "volume source"),
        user_mounts=_objects(annotations, ann.USER_VOLUME_MOUNT, "volume mount"),
    )


TEMPLATE_NAMES = ("sidecar", "gateway")
_PROXYLESS = (
    (
        "proxyless gRPC reads listeners, routes and clusters over xDS, which meshctl's control "
        "plane does not serve (it serves workloads and policies to L4 proxies)"
    ),
    "inject the sidecar template instead: the app's gRPC traffic then goes through the proxy",
)
# Istio's templates (built in, or the one its SPIRE guide defines) that meshctl refuses, and why.
UNSUPPORTED_TEMPLATES = {
    "spire": (
        (
            "meshctl's proxy has no SPIFFE Workload API client, so it would ignore the SPIRE "
            "socket and take its certificate from meshctl's CA"
        ),
        (
            "mount SPIRE-issued cert-chain.pem, key.pem and root-cert.pem at "
            f"{CERTS_PATH} with sidecar.istio.io/userVolume and userVolumeMount"
        ),
    ),
    "grpc-agent": _PROXYLESS,
    "grpc-simple": _PROXYLESS,
}


def _template(annotations: dict[str, str]) -> str:
    """The injection template a pod asks for: Istio's ``sidecar`` (default) or ``gateway``."""
    value = annotations.get(ann.TEMPLATES)
    if value is None:
        return "sidecar"
    names = [n.strip() for n in value.split(",") if n.strip()]
    for name in names:
        if name in UNSUPPORTED_TEMPLATES:
            why, hint = UNSUPPORTED_TEMPLATES[name]
            raise InjectError(
                f"template {name!r} (annotation {ann.TEMPLATES!r}) is not supported: {why}",
                hint=hint,
            )
    # The same template more than once is the same injection (each pass is idempotent).
    if len(set(names)) != 1 or names[0] not in TEMPLATE_NAMES:
        unknown = next((n for n in names if n not in TEMPLATE_NAMES), None)
        raise InvalidAnnotationError(
            ann.TEMPLATES,
            value,
            expected="one template: "
            + " or ".join(TEMPLATE_NAMES)
            + (f" (meshctl has no user-defined templates such as {unknown!r})" if unknown else ""),
        )
    return names[0]


def _proxy_config(annotations: dict[str, str], settings: InjectSettings) -> proxyconfig.ProxyConfig:
    """The pod's ProxyConfig over the mesh-wide one, field by field (``proxyMetadata`` key by
    key), as Istio merges ``proxy.istio.io/config`` over ``meshConfig.defaultConfig``."""
    mesh = settings.mesh_proxy_config() if settings.proxy_config else None
    value = annotations.get(proxyconfig.ANNOTATION)
    if value is None:
        return mesh or proxyconfig.ProxyConfig()
    try:
        pod = proxyconfig.parse(value)
    except ValueError as exc:
        raise InvalidAnnotationError(
            proxyconfig.ANNOTATION, value, expected=f"ProxyConfig fields ({exc})"
        ) from None
    if mesh is None:
        return pod
    return dataclasses.replace(
        pod,
        hold_application=_first(pod.hold_application, mesh.hold_application),
        termination_drain=_first(pod.termination_drain, mesh.termination_drain),
        concurrency=_first(pod.concurrency, mesh.concurrency),
        metadata={**mesh.metadata, **pod.metadata},
    )


_T = TypeVar("_T")


def _first(pod: _T | None, mesh: _T | None) -> _T | None:
    return mesh if pod is None else pod


def hold_application(options: PodOptions, container: Container) -> None:
    """holdApplicationUntilProxyStarts for a classic sidecar: the app containers start only
    once the proxy's postStart hook has seen it ready (a native sidecar's startup probe does
    that by itself)."""
    container["lifecycle"] = {"postStart": {"exec": {"command": [MESHCTL, "ztunnel", "wait"]}}}


def _objects(annotations: dict[str, str], key: str, what: str) -> dict[str, dict[str, object]]:
    value = annotations.get(key)
    return {} if value is None else ann.parse_json_objects(key, value, what=what)


def _resources(
    annotations: dict[str, str], settings: InjectSettings, *, defaults: bool = True
) -> ResourceRequirements:
    """Istio's rule: with any of the four resource annotations set, the proxy gets exactly what
    they say (requests from proxyCPU/proxyMemory, limits only from the *Limit ones); with none,
    the settings' requests and limits (an empty one: none, as a null in Istio's values)."""
    keys = (
        ("requests", "cpu", ann.PROXY_CPU, settings.proxy_cpu),
        ("requests", "memory", ann.PROXY_MEMORY, settings.proxy_memory),
        ("requests", "ephemeral-storage", None, settings.proxy_ephemeral_storage),
        ("limits", "cpu", ann.PROXY_CPU_LIMIT, settings.proxy_cpu_limit),
        ("limits", "memory", ann.PROXY_MEMORY_LIMIT, settings.proxy_memory_limit),
        ("limits", "ephemeral-storage", None, settings.proxy_ephemeral_storage_limit),
    )
    given = any(key in annotations for _, _, key, _ in keys if key)
    sections: dict[str, dict[str, str]] = {}
    for section, resource, key, default in keys:
        value = annotations.get(key) if key else None
        if key and value is not None:
            sections.setdefault(section, {})[resource] = ann.parse_quantity(key, value)
        elif defaults and not given and default:
            sections.setdefault(section, {})[resource] = default
    chosen: ResourceRequirements = {}
    if "requests" in sections:
        chosen["requests"] = sections["requests"]
    if "limits" in sections:
        chosen["limits"] = sections["limits"]
    # The API server refuses a pod whose request exceeds its limit; say which annotation did it.
    for resource, key in (("cpu", ann.PROXY_CPU), ("memory", ann.PROXY_MEMORY)):
        request = chosen.get("requests", {}).get(resource)
        limit = chosen.get("limits", {}).get(resource)
        if (
            request is not None
            and limit is not None
            and ann.quantity(request) > ann.quantity(limit)
        ):
            blamed = key if key in annotations else key + "Limit"
            raise InvalidAnnotationError(
                blamed,
                annotations.get(blamed, request if blamed == key else limit),
                expected=f"a {resource} request no larger than the limit ({request} > {limit})",
            )
    return chosen


def init_container(options: PodOptions, settings: InjectSettings) -> Container:
    """The privileged one-shot container that installs the capture rules in the pod's netns."""
    return _capture_container(
        INIT_CONTAINER,
        "apply",
        options,
        settings,
        {
            "allowPrivilegeEscalation": False,
            # Only what rule installation needs; runs as root because iptables needs it.
            "capabilities": {"add": ["NET_ADMIN", "NET_RAW"], "drop": ["ALL"]},
            "privileged": False,
            "readOnlyRootFilesystem": False,
            "runAsGroup": 0,
            "runAsNonRoot": False,
            "runAsUser": 0,
        },
    )


def validation_container(options: PodOptions, settings: InjectSettings) -> Container:
    """CNI mode's unprivileged one-shot check, Istio's ``istio-validation``: a probe from the
    proxy's uid must be redirected, else it exits 126 and the kubelet restarts the pod (the CNI
    plugin may not have set up capture for it yet). Runs before the proxy: it borrows the
    capture ports."""
    container = _capture_container(
        VALIDATION_CONTAINER,
        "validate",
        options,
        settings,
        {
            "allowPrivilegeEscalation": False,
            "capabilities": {"drop": ["ALL"]},
            "privileged": False,
            "readOnlyRootFilesystem": True,
            "runAsGroup": settings.gid,
            "runAsNonRoot": True,
            "runAsUser": settings.proxy_uid,
        },
    )
    # The one writable place, for an image whose meshctl is the one-file binary (it unpacks into
    # /tmp); our image's one-dir tree needs none.
    container["volumeMounts"] = [{"name": TMP_VOLUME, "mountPath": "/tmp"}]  # noqa: S108
    return container


def _capture_container(
    name: str, verb: str, options: PodOptions, settings: InjectSettings, security: SecurityContext
) -> Container:
    """``meshctl iptables <verb>`` with the pod's capture arguments, as an init container."""
    args = iptables_args(options.interception, proxy_uid=settings.proxy_uid, proxy_gid=settings.gid)
    metadata = _metadata_env(options)
    return {
        "name": name,
        "image": options.image,
        "imagePullPolicy": settings.image_pull_policy,
        "command": [MESHCTL],
        "args": ["iptables", verb, *args],
        **({"env": metadata} if metadata else {}),
        "resources": _copy_resources(options.resources),
        "securityContext": security,
    }


def proxy_container(
    options: PodOptions,
    settings: InjectSettings,
    *,
    workload_name: str,
    app_containers: list[str],
    probers: Mapping[str, Probe],
    extra_env: tuple[tuple[str, str], ...] = (),
    prometheus_env: str | None = None,
) -> Container:
    """The proxy (``meshctl ztunnel run --mode sidecar``), a native sidecar unless told not to."""

    def field_env(name: str, path: str) -> EnvVar:
        return {"name": name, "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": path}}}

    env: list[EnvVar] = [
        field_env("POD_NAME", "metadata.name"),
        field_env("POD_NAMESPACE", "metadata.namespace"),
        field_env("SERVICE_ACCOUNT", "spec.serviceAccountName"),
        field_env("INSTANCE_IP", "status.podIP"),
        field_env("HOST_IP", "status.hostIP"),
        field_env("NODE_NAME", "spec.nodeName"),
        field_env("CANONICAL_SERVICE", f"metadata.labels['{ann.CANONICAL_NAME_LABEL}']"),
        field_env("CANONICAL_REVISION", f"metadata.labels['{ann.CANONICAL_REVISION_LABEL}']"),
        {"name": "CA_ADDR", "value": settings.control_plane_address},
        # Workloads from the same control plane's discovery (ztunnel's variable).
        {"name": "XDS_ADDRESS", "value": settings.control_plane_address},
        {"name": "TRUST_DOMAIN", "value": settings.trust_domain},
        {"name": "ISTIO_META_CLUSTER_ID", "value": settings.cluster_id},
    ]
    if settings.network:  # values.global.network: the proxy's network, for cross-network peers
        env.append({"name": "ISTIO_META_NETWORK", "value": settings.network})
    if settings.mesh_id:
        env.append({"name": "ISTIO_META_MESH_ID", "value": settings.mesh_id})
    env += [
        {"name": "ISTIO_META_INTERCEPTION_MODE", "value": options.interception.mode},
        {"name": "ISTIO_META_WORKLOAD_NAME", "value": workload_name},
        {"name": "ISTIO_META_APP_CONTAINERS", "value": ",".join(app_containers)},
    ]
    config = _effective_config(options)
    if config.to_env() != "{}":
        env.append({"name": proxyconfig.ENV, "value": config.to_env()})
    # proxyMetadata: env of the proxy (and of the capture's init container), as in Istio.
    env += _metadata_env(options)
    if prometheus_env is not None:  # the app's scrape settings, for the proxy's merged metrics
        env.append({"name": "ISTIO_PROMETHEUS_ANNOTATIONS", "value": prometheus_env})
    if probers:
        # Sorted by path, as Istio's injector writes the map.
        text = json.dumps(dict(sorted(probers.items())), separators=(",", ":"))
        env.append({"name": PROBERS_ENV, "value": text})
    # Env from the webhook's URL path (see admission.py) overrides the settings' values.
    at = {e["name"]: i for i, e in enumerate(env)}
    for name, value in extra_env:
        if name in at:
            env[at[name]] = {"name": name, "value": value}
        else:
            at[name] = len(env)
            env.append({"name": name, "value": value})

    capabilities: Capabilities = {"drop": ["ALL"]}
    uid, non_root = settings.proxy_uid, True
    if options.interception.mode == "TPROXY":
        # TPROXY mode binds to foreign addresses (IP_TRANSPARENT), which needs NET_ADMIN; the
        # kubelet makes an added capability effective for uid 0 only (no ambient capabilities),
        # so the proxy runs as root, as Istio's does, and the capture exempts its traffic by
        # its group (-g), which stays the proxy's.
        capabilities = {"add": ["NET_ADMIN"], "drop": ["ALL"]}
        uid, non_root = 0, False
    # Built field by field in the order Istio's template writes them (the output keeps it).
    container: Container = {
        "name": PROXY_CONTAINER,
        "image": options.image,
        "imagePullPolicy": settings.image_pull_policy,
        "command": [MESHCTL],
        "args": ["ztunnel", "run", "--mode", "sidecar"],
    }
    if options.native_sidecar:
        # A restartable init container (KEP-753): starts before the app, stops after it, and
        # does not keep a Job's pod running once the Job's containers are done.
        container["restartPolicy"] = "Always"
    container["env"] = env
    container["ports"] = [
        container_port("mesh-outbound", OUTBOUND_CAPTURE_PORT),
        container_port("mesh-inbound", INBOUND_CAPTURE_PORT),
        container_port("mesh-hbone", HBONE_PORT),
        container_port("mesh-metrics", options.status_port or STATUS_PORT),
        container_port("mesh-health", READINESS_PORT),
    ]
    if options.status_port != 0:  # port 0: no probes of the proxy either (as Istio's template)
        _add_proxy_probes(container, options)
    container["resources"] = _copy_resources(options.resources)
    container["securityContext"] = {
        "allowPrivilegeEscalation": False,
        "capabilities": capabilities,
        "privileged": False,
        "readOnlyRootFilesystem": True,
        "runAsGroup": settings.gid,
        "runAsNonRoot": non_root,
        "runAsUser": uid,
    }
    container["volumeMounts"] = _proxy_mounts(options)
    if options.gateway:
        # Istio's gateway template: the ids only (it binds low ports, with the pod's sysctl),
        # and no startup probe (nothing waits for a gateway's proxy).
        container.pop("startupProbe", None)
        container["securityContext"] = {
            "runAsUser": settings.proxy_uid,
            "runAsGroup": settings.gid,
        }
    return container


def _proxy_mounts(options: PodOptions) -> list[VolumeMount]:
    """The proxy's mounts, then the user's (``sidecar.istio.io/userVolumeMount``, as Istio's
    template adds them). A user mount at one of our paths replaces ours: that is how
    certificates from a Secret reach the proxy's cert dir, and two mounts at one path would make
    the API server refuse the pod."""
    # The user's JSON, as the API server will read it (it refuses what is no VolumeMount).
    user = [
        cast("VolumeMount", {"name": name, **mount}) for name, mount in options.user_mounts.items()
    ]
    taken = {posixpath.normpath(str(mount.get("mountPath", ""))) for mount in user}
    ours: list[VolumeMount] = [
        {"name": CERTS_VOLUME, "mountPath": CERTS_PATH},
        {"name": TMP_VOLUME, "mountPath": "/tmp"},  # noqa: S108 -- the pod's own emptyDir
        {"name": TOKEN_VOLUME, "mountPath": TOKEN_PATH, "readOnly": True},
        {"name": ROOT_CA_VOLUME, "mountPath": ROOT_CA_PATH, "readOnly": True},
    ]
    return [mount for mount in ours if mount["mountPath"] not in taken] + user


# A gateway pod's proxy may bind ports below 1024 without a capability (Istio's template).
GATEWAY_SYSCTL: Sysctl = {"name": "net.ipv4.ip_unprivileged_port_start", "value": "0"}


def _effective_config(options: PodOptions) -> proxyconfig.ProxyConfig:
    """The pod's ProxyConfig with the status port the injector uses (the annotation's)."""
    port = options.status_port if options.status_port != STATUS_PORT else None
    return dataclasses.replace(options.proxy_config, status_port=port, unsupported=())


def _metadata_env(options: PodOptions) -> list[EnvVar]:
    # In name order, as Istio's template ranges over the map (mesh-wide and pod keys merged).
    return [{"name": k, "value": v} for k, v in sorted(options.proxy_config.metadata.items())]


def _add_proxy_probes(container: Container, options: PodOptions) -> None:
    ready: HTTPGetAction = {"path": "/healthz/ready", "port": READINESS_PORT}
    container["readinessProbe"] = {
        "httpGet": ready.copy(),
        "initialDelaySeconds": options.readiness_initial_delay,
        "periodSeconds": options.readiness_period,
        "timeoutSeconds": 3,
        "failureThreshold": options.readiness_failure_threshold,
    }
    # Up to 10 minutes for the first certificate; as a native sidecar this also holds the app
    # containers back until the proxy is ready (the kubelet waits on it).
    container["startupProbe"] = {
        "httpGet": ready.copy(),
        "initialDelaySeconds": 0,
        "periodSeconds": 1,
        "timeoutSeconds": 3,
        "failureThreshold": 600,
    }


def volumes(settings: InjectSettings, options: PodOptions) -> list[Volume]:
    """The pod volumes the proxy mounts, in the order of ``VOLUMES``, then the user's
    ``sidecar.istio.io/userVolume`` ones."""
    return [
        {"name": CERTS_VOLUME, "emptyDir": {}},
        {"name": TMP_VOLUME, "emptyDir": {}},
        {
            "name": TOKEN_VOLUME,
            "projected": {
                "sources": [
                    {
                        "serviceAccountToken": {
                            "audience": settings.token_audience,
                            "expirationSeconds": TOKEN_LIFETIME_SECONDS,
                            "path": TOKEN_VOLUME,
                        }
                    }
                ]
            },
        },
        {"name": ROOT_CA_VOLUME, "configMap": {"name": settings.root_ca_configmap}},
        *(
            cast("Volume", {"name": name, **source})
            for name, source in options.user_volumes.items()
        ),
    ]


def container_port(name: str, number: int) -> ContainerPort:
    """A TCP port of a container, named."""
    return {"name": name, "containerPort": number, "protocol": "TCP"}


def _copy_resources(resources: ResourceRequirements) -> ResourceRequirements:
    copied: ResourceRequirements = {}
    if "requests" in resources:
        copied["requests"] = dict(resources["requests"])
    if "limits" in resources:
        copied["limits"] = dict(resources["limits"])
    return copied
