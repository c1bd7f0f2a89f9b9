"""Small verbs over any kind of object, as plain dicts: get, list, create, replace, patch, apply,
delete.

Invariants: ``get`` answers None for an object that does not exist (404) instead of raising;
``create`` is create-only (409 ``AlreadyExists`` raises, nothing is overwritten) and ``replace``
carries the object's ``resourceVersion``, so a writer that lost a race gets 409 ``Conflict``
(optimistic concurrency, the API conventions) and never overwrites a newer object. Every other
failure is an ``ApiStatusError`` / ``ApiUnreachableError`` from ``meshctl.kube.api``.
``apply`` is server-side apply (the API conventions' field management): the server merges the
applier's intent with other managers' fields and records who owns what; a field another manager
owns is a 409 conflict unless ``force`` takes it over.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal, cast

from meshctl.kube import api
from meshctl.kube.client import Kube
from meshctl.kube.resources import Body, Resource
from meshctl.kube.rest import ApiStatusError

PatchType = Literal["merge", "json", "strategic"]
_PATCH_CONTENT = {
    "merge": "application/merge-patch+json",
    "json": "application/json-patch+json",
    "strategic": "application/strategic-merge-patch+json",
}
_PAGE = 500  # client-go's list page size


def is_conflict(exc: ApiStatusError) -> bool:
    """409: the object already exists (create) or changed since it was read (replace)."""
    return exc.status == 409


def get(
    kube: Kube, resource: Resource[Body], name: str, namespace: str | None = None
) -> Body | None:
    """The object, or None when it does not exist."""
    try:
        return cast(Body, api.request(kube, "GET", resource.path(namespace, name)))
    except ApiStatusError as exc:
        if exc.status == 404:
            return None
        raise


def list_objects(
    kube: Kube,
    resource: Resource[Body],
    namespace: str | None = None,
    *,
    label_selector: str | None = None,
    field_selector: str | None = None,
) -> tuple[list[Body], str]:
    """Every matching object (paged as client-go pages) and the list's resourceVersion.

    Items carry ``apiVersion`` and ``kind`` (the API leaves them out of list items).
    """
    query: list[tuple[str, str]] = [("limit", str(_PAGE))]
    if label_selector:
        query.append(("labelSelector", label_selector))
    if field_selector:
        query.append(("fieldSelector", field_selector))
    items: list[Body] = []
    token = ""
    while True:
        page = api.request(
            kube,
            "GET",
            resource.path(namespace),
            query=[*query, ("continue", token)] if token else query,
        )
        listed = page.get("items")
        for item in listed if isinstance(listed, list) else ():
            item.setdefault("apiVersion", resource.api_version)
            item.setdefault("kind", resource.kind)
            items.append(item)
        meta = page.get("metadata")
        meta = meta if isinstance(meta, dict) else {}
        token = str(meta.get("continue") or "")
        if not token:
            return items, str(meta.get("resourceVersion") or "")


def create(
    kube: Kube,
    resource: Resource[Body],
    body: Mapping[str, object],
    namespace: str | None = None,
    *,
    dry_run: bool = False,
    field_manager: str | None = None,
) -> Body:
    """Create-only: an existing object of that name raises 409 (``is_conflict``). A dry run
    goes through admission (webhooks included) and persists nothing."""
    return _write(
        kube, resource, "POST", namespace, None, body, _write_query(dry_run, field_manager)
    )


def replace(
    kube: Kube,
    resource: Resource[Body],
    body: Mapping[str, object],
    namespace: str | None = None,
    *,
    field_manager: str | None = None,
) -> Body:
    """Replace the object named in ``body``; its ``metadata.resourceVersion`` guards the write."""
    query = _write_query(False, field_manager)
    return _write(kube, resource, "PUT", namespace, _name(body), body, query)


def apply(
    kube: Kube,
    resource: Resource[Body],
    body: Mapping[str, object],
    namespace: str | None = None,
    *,
    field_manager: str,
    force: bool = False,
    dry_run: bool = False,
) -> Body:
    """Server-side apply of ``body`` (the whole intent of ``field_manager`` for this object)."""
    query = _write_query(dry_run, field_manager)
    if force:
        query.append(("force", "true"))
    # JSON is YAML: the apply content type takes the object as we hold it.
    return _write(
        kube, resource, "PATCH", namespace, _name(body), body, query, "application/apply-patch+yaml"
    )


def _write(
    kube: Kube,
    resource: Resource[Body],
    method: str,
    namespace: str | None,
    name: str | None,
    body: object,
    query: list[tuple[str, str]],
    content_type: str = "application/json",
    subresource: str | None = None,
) -> Body:
    """One write to the collection (``name`` None) or the object; the object as the server now
    has it, read as ``resource``'s view."""
    path = resource.path(namespace, name, subresource)
    answer = api.request(kube, method, path, body=body, query=query, content_type=content_type)
    return cast(Body, answer)


def _name(body: Mapping[str, object]) -> str:
    """``metadata.name`` of an object to write (KeyError without one, as a lookup would)."""
    metadata = body["metadata"]
    if not isinstance(metadata, Mapping):
        raise KeyError("metadata")
    return str(metadata["name"])


def _write_query(dry_run: bool, field_manager: str | None) -> list[tuple[str, str]]:
    query = [("dryRun", "All")] if dry_run else []
    if field_manager:
        query.append(("fieldManager", field_manager))
    return query


def patch(
    kube: Kube,
    resource: Resource[Body],
    name: str,
    body: object,
    namespace: str | None = None,
    *,
    patch_type: PatchType = "merge",
    subresource: str | None = None,
) -> Body:
    """Patch one object (RFC 7386 merge, RFC 6902 JSON patch, or strategic merge), or one of
    its subresources (``status``)."""
    content = _PATCH_CONTENT[patch_type]
    return _write(kube, resource, "PATCH", namespace, name, body, [], content, subresource)


def delete(
    kube: Kube,
    resource: Resource[Mapping[str, object]],
    name: str,
    namespace: str | None = None,
    *,
    propagation: Literal["Foreground", "Background", "Orphan"] | None = None,
    dry_run: bool = False,
) -> bool:
    """Delete the object; False when it was already gone. ``Foreground`` keeps the object (with
    a deletion timestamp) until the garbage collector removed its dependents (a DaemonSet's
    pods), so waiting for it to be gone waits for them too. A dry run goes through admission
    and deletes nothing."""
    body = {"kind": "DeleteOptions", "apiVersion": "v1", "propagationPolicy": propagation}
    try:
        api.request(
            kube,
            "DELETE",
            resource.path(namespace, name),
            body=body if propagation else None,
            query=[("dryRun", "All")] if dry_run else [],
        )
    except ApiStatusError as exc:
        if exc.status == 404:
            return False
        raise
    return True
