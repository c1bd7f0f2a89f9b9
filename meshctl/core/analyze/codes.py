"""The registry of finding codes. A code, once given, keeps its name, level and meaning for good:
a retired check leaves its code unused, a new check takes a new number (docs/analyze.md lists
them all; a test holds the page and this registry to each other).

Numbering: MSH00xx the analysis itself, MSH01xx authorization policies, MSH02xx injection and
ambient enrolment, MSH03xx revisions, MSH04xx webhooks, MSH05xx service ports.
"""

from __future__ import annotations

from .findings import Code, Level

ANALYZER_FAILED = Code(
    "MSH0001",
    "AnalyzerFailed",
    Level.ERROR,
    "A family of checks stopped on an object of an unexpected shape; its findings are missing.",
)
POLICY_SELECTS_NOTHING = Code(
    "MSH0101",
    "AuthorizationPolicySelectsNothing",
    Level.WARNING,
    "An AuthorizationPolicy's selector matches no pod or pod template in its namespace.",
)
POLICY_UNKNOWN_PORT = Code(
    "MSH0102",
    "AuthorizationPolicyUnknownPort",
    Level.WARNING,
    "An AuthorizationPolicy names a port that no workload it applies to listens on.",
)
POLICY_NOT_ENFORCED_AS_WRITTEN = Code(
    "MSH0103",
    "AuthorizationPolicyNotEnforcedAsWritten",
    Level.WARNING,
    "Part of an AuthorizationPolicy cannot be enforced at L4: a rule is dropped or widened.",
)
POLICY_UNREADABLE = Code(
    "MSH0104",
    "AuthorizationPolicyUnreadable",
    Level.ERROR,
    "The control plane cannot read an AuthorizationPolicy, so it enforces none of it.",
)
INJECTION_WITHOUT_CONTROL_PLANE = Code(
    "MSH0201",
    "InjectionWithoutControlPlane",
    Level.ERROR,
    "A namespace is labelled for sidecar injection but no control plane serves it.",
)
REVISION_NOT_INSTALLED = Code(
    "MSH0202",
    "RevisionNotInstalled",
    Level.ERROR,
    "A namespace or pod names a revision (istio.io/rev) that is not installed.",
)
AMBIENT_WITHOUT_NODE_PROXY = Code(
    "MSH0203",
    "AmbientWithoutNodeProxy",
    Level.ERROR,
    "A namespace is labelled for ambient mode but no node proxy is installed.",
)
POD_MISSING_SIDECAR = Code(
    "MSH0204",
    "PodMissingSidecar",
    Level.ERROR,
    "A pod that the injection labels select runs without a sidecar.",
)
POD_NOT_ENROLLED = Code(
    "MSH0205",
    "PodNotEnrolled",
    Level.ERROR,
    "A running pod that ambient mode should serve was never redirected by the node agent.",
)
NAMESPACE_NOT_MESHED = Code(
    "MSH0206",
    "NamespaceNotMeshed",
    Level.INFO,
    "A namespace with workloads is labelled neither for injection nor for ambient mode.",
)
CONFLICTING_INJECTION_LABELS = Code(
    "MSH0301",
    "ConflictingInjectionLabels",
    Level.WARNING,
    "A namespace carries both an injection label and istio.io/rev; the revision is ignored.",
)
DEFAULT_REVISION_CLAIMED_TWICE = Code(
    "MSH0302",
    "DefaultRevisionClaimedTwice",
    Level.ERROR,
    "More than one control plane claims the default revision.",
)
SIDECAR_AND_AMBIENT = Code(
    "MSH0303",
    "SidecarAndAmbient",
    Level.WARNING,
    "A namespace is labelled for both sidecar injection and ambient mode.",
)
FOREIGN_INJECTION_WEBHOOK = Code(
    "MSH0401",
    "ForeignInjectionWebhook",
    Level.ERROR,
    "Another mutating webhook intercepts pods that meshctl injects.",
)
SERVICE_PORT_UNNAMED = Code(
    "MSH0501",
    "ServicePortUnnamed",
    Level.INFO,
    "A Service port has neither a name nor an appProtocol; the mesh treats it as opaque TCP.",
)
SERVICE_PORT_UNKNOWN_PROTOCOL = Code(
    "MSH0502",
    "ServicePortUnknownProtocol",
    Level.WARNING,
    "A Service port's name or appProtocol names no protocol the mesh knows.",
)

CODES: tuple[Code, ...] = (
    ANALYZER_FAILED,
    POLICY_SELECTS_NOTHING,
    POLICY_UNKNOWN_PORT,
    POLICY_NOT_ENFORCED_AS_WRITTEN,
    POLICY_UNREADABLE,
    INJECTION_WITHOUT_CONTROL_PLANE,
    REVISION_NOT_INSTALLED,
    AMBIENT_WITHOUT_NODE_PROXY,
    POD_MISSING_SIDECAR,
    POD_NOT_ENROLLED,
    NAMESPACE_NOT_MESHED,
    CONFLICTING_INJECTION_LABELS,
    DEFAULT_REVISION_CLAIMED_TWICE,
    SIDECAR_AND_AMBIENT,
    FOREIGN_INJECTION_WEBHOOK,
    SERVICE_PORT_UNNAMED,
    SERVICE_PORT_UNKNOWN_PROTOCOL,
)
