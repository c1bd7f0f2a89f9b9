"""A node's Pods and Namespaces from a file, for places without an API server (a laptop, a VM).

Owns the format of ``--local-inventory``: a Kubernetes ``v1 List`` (what ``kubectl get -o yaml``
prints) of ``Namespace`` and ``Pod`` objects, or those objects as YAML documents, in the shapes
the API server returns, so the same decisions read them as they read a watch's objects.
Invariants: pure (text in, values out); a pod without ``metadata.uid`` gets one derived from its
namespace and name (UUID 5), so every reader of the same file agrees on it; any problem is an
``InventoryError`` naming the source, the item and what to fix, before anything is returned.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

from meshctl import yamlread
from meshctl.core.pki.identity import IdentityError, SpiffeId
from meshctl.structured import InputError, Limits

if TYPE_CHECKING:
    from meshctl.core.k8s.schema import Namespace, ObjectMeta, Pod

# Derived pod uids: uuid5 of "<namespace>/<name>" under this namespace.
_UID_NAMESPACE = uuid.UUID("6f0d2b8e-5c1a-4f3e-9a57-1d2c3b4a5e6f")
_KINDS = ("Namespace", "Pod")


class InventoryError(ValueError):
    """The file is unusable; ``str()`` is one line naming the source and the item."""


@dataclass(frozen=True, slots=True)
class Inventory:
    """Namespaces by name and Pods by uid, in the shapes the API server returns (names,
    namespaces, uids and label and annotation maps checked)."""

    namespaces: Mapping[str, Namespace] = field(default_factory=dict)
    pods: Mapping[str, Pod] = field(default_factory=dict)

    def pod(self, namespace: str, name: str) -> Pod | None:
        for pod in self.pods.values():
            meta = pod["metadata"]
            if meta["namespace"] == namespace and meta["name"] == name:
                return pod
        return None

    def namespace(self, name: str) -> Namespace | None:
        return self.namespaces.get(name)

    def pods_on(self, node: str) -> dict[str, Pod]:
        """The pods whose ``spec.nodeName`` is ``node`` (a watch's field selector)."""
        return {
            uid: pod
            for uid, pod in self.pods.items()
            if (pod.get("spec") or {}).get("nodeName") == node
        }


def derived_uid(namespace: str, name: str) -> str:
    return str(uuid.uuid5(_UID_NAMESPACE, f"{namespace}/{name}"))


def parse(text: str | bytes, source: str, limits: Limits = Limits()) -> Inventory:  # noqa: B008
    """The inventory in ``text`` (read from ``source``, named in every error), read within
    ``limits`` (``meshctl.structured``)."""
    namespaces: dict[str, Namespace] = {}
    pods: dict[str, Pod] = {}
    seen: set[tuple[str, str]] = set()
    for number, item in enumerate(_items(text, source, limits), start=1):
        where = f"{source}: item {number}"
        kind, meta = _kind_and_metadata(item, where)
        name = meta["name"]
        if kind == "Namespace":
            if name in namespaces:
                raise InventoryError(f"{where}: Namespace {name} is listed twice")
            namespaces[name] = cast("Namespace", {**item, "metadata": meta})
            continue
        pod = _pod(item, meta, where)
        key = (meta["namespace"], name)
        if key in seen:
            raise InventoryError(f"{where}: Pod {key[0]}/{name} is listed twice")
        seen.add(key)
        if meta["uid"] in pods:
            raise InventoryError(f"{where}: Pod {key[0]}/{name} repeats uid {meta['uid']}")
        pods[meta["uid"]] = pod
    return Inventory(namespaces=namespaces, pods=pods)


def _items(text: str | bytes, source: str, limits: Limits) -> list[Any]:
    """Every object of every document, a ``List``'s items in its place."""
    try:
        documents = [d.data for d in yamlread.yaml_documents(text, source, limits)]
    except InputError as exc:
        raise InventoryError(exc.message) from exc
    items: list[Any] = []
    for document in documents:
        if isinstance(document, dict) and document.get("kind") == "List":
            listed = document.get("items")
            if listed is None:
                continue
            if not isinstance(listed, list):
                raise InventoryError(f"{source}: the List's items must be a list")
            items.extend(listed)
        else:
            items.append(document)
    return items


def _pod(item: Mapping[str, object], meta: ObjectMeta, where: str) -> Pod:
    """The pod with its namespace (``default`` when unset) and uid filled in, checked."""
    name = meta["name"]
    namespace = meta.setdefault("namespace", "default")
    _check_name(namespace, f"{where} (Pod {name}): metadata.namespace")
    meta["uid"] = str(meta.get("uid") or derived_uid(namespace, name))
    spec = item.get("spec")
    if spec is not None and not isinstance(spec, dict):
        raise InventoryError(f"{where} (Pod {namespace}/{name}): spec must be a mapping")
    account = (spec or {}).get("serviceAccountName", "default")
    if not isinstance(account, str) or not _valid_account(namespace, account):
        raise InventoryError(
            f"{where} (Pod {namespace}/{name}): spec.serviceAccountName {account!r} is not "
            "a service account name"
        )
    return cast("Pod", {**item, "metadata": meta})


def _kind_and_metadata(item: object, where: str) -> tuple[str, ObjectMeta]:
    if not isinstance(item, dict):
        raise InventoryError(f"{where}: expected a Namespace or Pod object, got {_type(item)}")
    kind = item.get("kind")
    if kind not in _KINDS or item.get("apiVersion", "v1") != "v1":
        version = f" (apiVersion {item['apiVersion']!r})" if "apiVersion" in item else ""
        raise InventoryError(
            f"{where}: kind {kind!r}{version} is not a v1 Namespace or Pod; only those are read"
        )
    meta = item.get("metadata")
    if not isinstance(meta, dict):
        raise InventoryError(f"{where} ({kind}): metadata must be a mapping with a name")
    meta = cast("ObjectMeta", dict(meta))  # its name and string maps are checked below
    _check_name(meta.get("name"), f"{where} ({kind}): metadata.name")
    for key in ("labels", "annotations"):
        values = meta.get(key)
        if values is None:
            continue
        if not isinstance(values, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in values.items()
        ):
            raise InventoryError(
                f"{where} ({kind} {meta['name']}): metadata.{key} must map strings to strings "
                "(quote values such as 'true')"
            )
    return str(kind), meta


def _check_name(value: Any, where: str) -> None:
    if not isinstance(value, str) or not value:
        raise InventoryError(f"{where} is missing")
    try:
        SpiffeId("cluster.local", value, "default")
    except IdentityError as exc:
        raise InventoryError(f"{where} {value!r} is not a valid name: {exc}") from exc


def _valid_account(namespace: str, account: str) -> bool:
    try:
        SpiffeId("cluster.local", namespace, account)
    except IdentityError:
        return False
    return True


def _type(value: Any) -> str:
    return "nothing" if value is None else type(value).__name__
