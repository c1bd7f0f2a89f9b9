"""Which Kubernetes objects carry a pod template, where it sits, and which workload it belongs to.

Owns the table of workload kinds (by API group and kind, so a custom resource that happens to be
called ``Job`` passes through untouched) and the workload name a pod reports as its own. Pure:
looks at mappings, never changes them.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

# kind -> (API groups it is served from, path from the object to its pod template).
# A Pod is its own template (empty path).
WORKLOAD_KINDS: dict[str, tuple[frozenset[str], tuple[str, ...]]] = {
    "Pod": (frozenset({""}), ()),
    "ReplicationController": (frozenset({""}), ("spec", "template")),
    "Deployment": (frozenset({"apps", "extensions"}), ("spec", "template")),
    "DaemonSet": (frozenset({"apps", "extensions"}), ("spec", "template")),
    "ReplicaSet": (frozenset({"apps", "extensions"}), ("spec", "template")),
    "StatefulSet": (frozenset({"apps"}), ("spec", "template")),
    "Job": (frozenset({"batch"}), ("spec", "template")),
    "CronJob": (frozenset({"batch"}), ("spec", "jobTemplate", "spec", "template")),
    # OpenShift's (deprecated) Deployment; "" is OpenShift 3's legacy /oapi/v1 spelling, which
    # Istio's kube-inject reads too.
    "DeploymentConfig": (frozenset({"apps.openshift.io", ""}), ("spec", "template")),
}

# A CronJob names its Jobs <cronjob>-<scheduled time in minutes since the epoch>.
_CRONJOB_JOB = re.compile(r"^(?P<name>.+)-\d{8,}$")


def api_group(obj: Mapping[str, Any]) -> str:
    """``apps`` for ``apps/v1``; ``""`` for the core group's ``v1``."""
    api_version = obj.get("apiVersion")
    if not isinstance(api_version, str):
        return ""
    group, _, _ = api_version.rpartition("/")
    return group


def template_path(obj: Mapping[str, Any]) -> tuple[str, ...] | None:
    """The path to the object's pod template, or None if it is not a workload we inject."""
    entry = WORKLOAD_KINDS.get(str(obj.get("kind", "")))
    if entry is None:
        return None
    groups, path = entry
    return path if api_group(obj) in groups else None


def is_list(obj: Mapping[str, Any]) -> bool:
    """A ``v1 List`` (what ``kubectl get -o yaml`` prints for several objects)."""
    return obj.get("kind") == "List" and api_group(obj) == ""


def describe(obj: Mapping[str, Any]) -> str:
    """``Deployment web`` for messages; the kind alone when the object has no name."""
    kind = str(obj.get("kind") or "object")
    metadata = obj.get("metadata")
    name = metadata.get("name") if isinstance(metadata, Mapping) else None
    return f"{kind} {name}" if isinstance(name, str) and name else kind


def object_name(obj: Mapping[str, Any]) -> str:
    """The object's name, else its ``generateName`` without the trailing dash, else ""."""
    metadata = obj.get("metadata")
    if not isinstance(metadata, Mapping):
        return ""
    name = metadata.get("name")
    if isinstance(name, str) and name:
        return name
    generate = metadata.get("generateName")
    return generate.rstrip("-") if isinstance(generate, str) else ""


def workload_name_of_pod(pod: Mapping[str, Any]) -> str:
    """The workload a pod created by a controller belongs to, as the webhook sees the pod.

    A ReplicaSet's pods report the Deployment (the ReplicaSet's name less the pod's
    ``pod-template-hash``); a Job's pods report the CronJob when the Job's name has the CronJob
    suffix; other controllers report themselves; a bare pod reports its own name.
    """
    metadata = pod.get("metadata")
    metadata = metadata if isinstance(metadata, Mapping) else {}
    owner = _controller(metadata.get("ownerReferences"))
    if owner is None:
        return object_name(pod)
    kind, name = owner
    if kind == "ReplicaSet":
        labels = metadata.get("labels")
        template_hash = labels.get("pod-template-hash") if isinstance(labels, Mapping) else None
        if isinstance(template_hash, str) and name.endswith("-" + template_hash):
            return name[: -len(template_hash) - 1]
    if kind == "Job" and (match := _CRONJOB_JOB.match(name)):
        return match.group("name")
    return name


def _controller(references: Any) -> tuple[str, str] | None:
    """(kind, name) of the controlling owner reference, if any."""
    if not isinstance(references, list):
        return None
    for ref in references:
        if isinstance(ref, Mapping) and ref.get("controller") is True:
            kind, name = ref.get("kind"), ref.get("name")
            if isinstance(kind, str) and isinstance(name, str) and name:
                return kind, name
    return None
