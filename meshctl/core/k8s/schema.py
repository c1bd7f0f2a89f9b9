"""The Kubernetes API's objects as the mesh reads and writes them: TypedDict views of their JSON.

Owns the field names and value types (the API reference's, v1) of the objects and parts the code
reads field by field: object metadata; Pod with its spec, containers, probes, volumes and status;
Namespace, ConfigMap, Secret, Lease; the MutatingWebhookConfiguration's client config; the
AdmissionReview. Views, not validators: a body is taken as the API documents it once whoever
received it checked what it relies on (the injector's ``validation``, the cluster readers'
accessors), and every field is optional (``total=False``), as in the API's OpenAPI schema. Free at
runtime: the objects stay the plain dicts JSON and YAML readers build.
"""

from __future__ import annotations

from typing import Literal, TypedDict

# --- every object -------------------------------------------------------------------------------


class OwnerReference(TypedDict, total=False):
    apiVersion: str
    kind: str
    name: str
    uid: str
    controller: bool


class ObjectMeta(TypedDict, total=False):
    name: str
    generateName: str
    namespace: str
    uid: str
    resourceVersion: str
    generation: int
    creationTimestamp: str
    deletionTimestamp: str
    labels: dict[str, str]
    annotations: dict[str, str]
    ownerReferences: list[OwnerReference]
    finalizers: list[str]


class KubeObject(TypedDict, total=False):
    """What every object has; a kind's own view adds its fields."""

    apiVersion: str
    kind: str
    metadata: ObjectMeta


class APIResource(TypedDict, total=False):
    name: str  # the plural; "pods/status" for a subresource
    kind: str
    namespaced: bool
    verbs: list[str]


class APIResourceList(TypedDict, total=False):
    """What ``/api/v1`` or ``/apis/<group>/<version>`` answers (API discovery)."""

    resources: list[APIResource]


class GroupVersionForDiscovery(TypedDict, total=False):
    groupVersion: str


class APIGroup(TypedDict, total=False):
    preferredVersion: GroupVersionForDiscovery


class APIGroupList(TypedDict, total=False):
    """What ``/apis`` answers."""

    groups: list[APIGroup]


# --- containers ---------------------------------------------------------------------------------


class ObjectFieldSelector(TypedDict, total=False):
    apiVersion: str
    fieldPath: str


class EnvVarSource(TypedDict, total=False):
    fieldRef: ObjectFieldSelector


class EnvVar(TypedDict, total=False):
    name: str
    value: str
    valueFrom: EnvVarSource


class ContainerPort(TypedDict, total=False):
    name: str
    containerPort: int
    protocol: str


class HTTPHeader(TypedDict, total=False):
    name: str
    value: str


class HTTPGetAction(TypedDict, total=False):
    path: str
    port: int | str  # a number, or the name of one of the container's ports
    host: str
    scheme: str
    httpHeaders: list[HTTPHeader]


class TCPSocketAction(TypedDict, total=False):
    port: int | str
    host: str


class GRPCAction(TypedDict, total=False):
    port: int
    service: str


class ExecAction(TypedDict, total=False):
    command: list[str]


class Probe(TypedDict, total=False):
    """A probe, or (without the thresholds) a lifecycle hook's handler."""

    httpGet: HTTPGetAction
    tcpSocket: TCPSocketAction
    grpc: GRPCAction
    exec: ExecAction
    initialDelaySeconds: int
    periodSeconds: int
    timeoutSeconds: int
    successThreshold: int
    failureThreshold: int


class Lifecycle(TypedDict, total=False):
    postStart: Probe
    preStop: Probe


class Capabilities(TypedDict, total=False):
    add: list[str]
    drop: list[str]


class SecurityContext(TypedDict, total=False):
    allowPrivilegeEscalation: bool
    capabilities: Capabilities
    privileged: bool
    readOnlyRootFilesystem: bool
    runAsGroup: int
    runAsNonRoot: bool
    runAsUser: int


class ResourceRequirements(TypedDict, total=False):
    requests: dict[str, str]
    limits: dict[str, str]


class VolumeMount(TypedDict, total=False):
    name: str
    mountPath: str
    readOnly: bool
    subPath: str


class Container(TypedDict, total=False):
    name: str
    image: str
    imagePullPolicy: str
    command: list[str]
    args: list[str]
    env: list[EnvVar]
    ports: list[ContainerPort]
    resources: ResourceRequirements
    securityContext: SecurityContext
    volumeMounts: list[VolumeMount]
    restartPolicy: str  # "Always": a native sidecar (a restartable init container)
    readinessProbe: Probe
    livenessProbe: Probe
    startupProbe: Probe
    lifecycle: Lifecycle


# --- pods ---------------------------------------------------------------------------------------


class ServiceAccountTokenProjection(TypedDict, total=False):
    audience: str
    expirationSeconds: int
    path: str


class VolumeProjection(TypedDict, total=False):
    serviceAccountToken: ServiceAccountTokenProjection


class ProjectedVolumeSource(TypedDict, total=False):
    sources: list[VolumeProjection]


class LocalObjectReference(TypedDict, total=False):
    name: str


class Volume(TypedDict, total=False):
    """A volume; the sources meshctl writes are named, a user's may be any other."""

    name: str
    emptyDir: dict[str, str]
    projected: ProjectedVolumeSource
    configMap: LocalObjectReference


class Sysctl(TypedDict):
    name: str
    value: str


class PodSecurityContext(TypedDict, total=False):
    sysctls: list[Sysctl]
    runAsUser: int
    runAsGroup: int


class PodSpec(TypedDict, total=False):
    containers: list[Container]
    initContainers: list[Container]
    volumes: list[Volume]
    imagePullSecrets: list[LocalObjectReference]
    hostNetwork: bool
    nodeName: str
    serviceAccountName: str
    securityContext: PodSecurityContext


class PodCondition(TypedDict, total=False):
    type: str
    status: str


class PodIP(TypedDict, total=False):
    ip: str


class PodStatus(TypedDict, total=False):
    phase: str
    podIP: str
    podIPs: list[PodIP]
    hostIP: str
    conditions: list[PodCondition]


class PodTemplate(TypedDict, total=False):
    """A pod template (a workload's ``spec.template``), or the part of a Pod injection reads."""

    metadata: ObjectMeta
    spec: PodSpec


class Pod(KubeObject, total=False):
    spec: PodSpec
    status: PodStatus


# --- other kinds --------------------------------------------------------------------------------


class NamespaceStatus(TypedDict, total=False):
    phase: str


class Namespace(KubeObject, total=False):
    status: NamespaceStatus


class ConfigMap(KubeObject, total=False):
    data: dict[str, str]


class Secret(KubeObject, total=False):
    type: str
    data: dict[str, str]  # base64 of each value


class LeaseSpec(TypedDict, total=False):
    holderIdentity: str | None  # null: released
    leaseDurationSeconds: int
    acquireTime: str
    renewTime: str
    leaseTransitions: int


class Lease(KubeObject, total=False):
    spec: LeaseSpec


class LabelSelectorRequirement(TypedDict, total=False):
    key: str
    operator: str  # In, NotIn, Exists, DoesNotExist
    values: list[str]


class LabelSelector(TypedDict, total=False):
    matchLabels: dict[str, str]
    matchExpressions: list[LabelSelectorRequirement]


class ServiceReference(TypedDict, total=False):
    name: str
    namespace: str
    path: str
    port: int


class WebhookClientConfig(TypedDict, total=False):
    url: str
    service: ServiceReference
    caBundle: str  # base64 of the PEM bundle


class RuleWithOperations(TypedDict, total=False):
    apiGroups: list[str]
    apiVersions: list[str]
    operations: list[str]
    resources: list[str]
    scope: str


class MutatingWebhook(TypedDict, total=False):
    name: str
    admissionReviewVersions: list[str]
    clientConfig: WebhookClientConfig
    failurePolicy: str
    matchPolicy: str
    namespaceSelector: LabelSelector
    objectSelector: LabelSelector
    reinvocationPolicy: str
    rules: list[RuleWithOperations]
    sideEffects: str
    timeoutSeconds: int


class MutatingWebhookConfiguration(KubeObject, total=False):
    webhooks: list[MutatingWebhook]


class UserInfo(TypedDict, total=False):
    username: str
    uid: str
    groups: list[str]
    extra: dict[str, list[str]]


class TokenReviewStatus(TypedDict, total=False):
    authenticated: bool
    user: UserInfo
    audiences: list[str]
    error: str


class TokenReview(KubeObject, total=False):
    status: TokenReviewStatus


class SubjectAccessReviewStatus(TypedDict, total=False):
    allowed: bool
    reason: str


class SelfSubjectAccessReview(KubeObject, total=False):
    status: SubjectAccessReviewStatus


class Status(TypedDict, total=False):
    """A ``Status`` as an API answer or a watch's ERROR event carries it."""

    code: int
    message: str
    reason: str


# --- a client's kubeconfig (v1 Config) ----------------------------------------------------------

KubeconfigCluster = TypedDict(
    "KubeconfigCluster",
    {
        "server": str,
        "certificate-authority": str,  # a file
        "certificate-authority-data": str,  # base64 of the PEM
        "insecure-skip-tls-verify": bool,
    },
    total=False,
)
KubeconfigUser = TypedDict(
    "KubeconfigUser",
    {
        "token": str,
        "tokenFile": str,
        "client-certificate": str,
        "client-certificate-data": str,
        "client-key": str,
        "client-key-data": str,
    },
    total=False,
)


class KubeconfigContext(TypedDict, total=False):
    cluster: str
    user: str
    namespace: str


class NamedCluster(TypedDict):
    name: str
    cluster: KubeconfigCluster


class NamedUser(TypedDict):
    name: str
    user: KubeconfigUser


class NamedContext(TypedDict):
    name: str
    context: KubeconfigContext


Kubeconfig = TypedDict(
    "Kubeconfig",
    {
        "apiVersion": str,
        "kind": str,
        "clusters": list[NamedCluster],
        "users": list[NamedUser],
        "contexts": list[NamedContext],
        "current-context": str,
    },
    total=False,
)


# --- admission ----------------------------------------------------------------------------------


class GroupVersionKind(TypedDict, total=False):
    group: str
    version: str
    kind: str


class AdmissionResponse(TypedDict, total=False):
    uid: str
    allowed: bool
    status: Status
    warnings: list[str]
    patchType: Literal["JSONPatch"]
    patch: str  # base64 of an RFC 6902 JSON patch


class AdmissionReviewAnswer(TypedDict):
    """The AdmissionReview a webhook answers with (the request's apiVersion)."""

    apiVersion: str
    kind: Literal["AdmissionReview"]
    response: AdmissionResponse
