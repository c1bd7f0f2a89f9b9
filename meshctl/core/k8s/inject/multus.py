"""Multus: a CNI-mode pod on a cluster whose default network is not chained lists the mesh's CNI
plugin in ``k8s.v1.cni.cncf.io/networks`` (the Network Plumbing Working Group's annotation).

Owns appending the NetworkAttachmentDefinition (``namespace/name``) to the annotation in either
of its spellings, as Istio's injector does: a comma-separated list (``a, ns/b``) gets
``, <ns>/<name>``; a JSON list gets ``{"name": ..., "namespace": ...}``; a value that already
names it is left as it is. Pure.
"""

from __future__ import annotations

import json

from meshctl.core.k8s.inject.errors import InvalidAnnotationError
from meshctl.structured import InputError, load_json

ANNOTATION = "k8s.v1.cni.cncf.io/networks"


def append_network(existing: str, network: str) -> str:
    """``existing`` with ``network`` (``ns/name`` or ``name``) added unless already there."""
    if not existing.strip():
        return network
    namespace, _, name = network.rpartition("/")
    end = existing.rfind("]")
    if end == -1:
        if any(item.strip() == network for item in existing.split(",")):
            return existing
        return f"{existing}, {network}"
    try:
        items = load_json(existing, ANNOTATION)
    except InputError:
        items = None
    if not isinstance(items, list) or not all(isinstance(i, dict) for i in items):
        raise InvalidAnnotationError(
            ANNOTATION, existing, expected='a JSON list of {"name", "namespace"} or "a, ns/b"'
        )
    for item in items:
        if item.get("name") == name and (item.get("namespace") or "") == namespace:
            return existing
    entry = {"name": name, **({"namespace": namespace} if namespace else {})}
    # Inserted before the closing bracket, so the rest of the user's text stays as written.
    text = ", " + json.dumps(entry, separators=(", ", ": "))
    return existing[:end] + text + existing[end:]
