"""API discovery: which resource serves an ``apiVersion``/``kind``, and every listable type.

What ``kubectl``'s REST mapper does, reduced: ``/api/v1`` and ``/apis/<group>/<version>`` list
their resources with kind, plural and scope. Invariants: answers are cached per ``Mapper`` (one
command run) and refreshed once on a miss, so a CRD established a moment ago is found; a kind the
server does not serve is a one-line ``KubeError`` naming it (a CRD not installed, an API group
turned off).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

from meshctl.errors import KubeError
from meshctl.kube import api
from meshctl.kube.client import Kube
from meshctl.kube.resources import Resource
from meshctl.kube.rest import ApiStatusError

if TYPE_CHECKING:
    from meshctl.core.k8s.schema import APIGroupList, APIResourceList

# A kind known only at run time (an install's manifests): whoever reads its objects knows the kind.
Discovered = Resource[dict[str, Any]]


@dataclass
class Mapper:
    kube: Kube
    _by_version: dict[str, dict[str, Discovered]] = field(default_factory=dict)

    def _load(self, api_version: str) -> dict[str, Discovered]:
        group, _, version = api_version.rpartition("/")
        path = f"/apis/{group}/{version}" if group else f"/api/{version}"
        try:
            answer = cast("APIResourceList", api.request(self.kube, "GET", path))
        except ApiStatusError as exc:
            if exc.status == 404:
                return {}
            raise
        kinds: dict[str, Discovered] = {}
        for item in answer.get("resources") or ():
            name = str(item.get("name", ""))
            if "/" in name:  # a subresource (status, scale, proxy)
                continue
            kinds[str(item.get("kind"))] = Resource(
                group,
                version,
                name,
                str(item.get("kind")),
                namespaced=bool(item.get("namespaced")),
            )
        self._by_version[api_version] = kinds
        return kinds

    def resource(self, api_version: str, kind: str) -> Discovered:
        """The resource serving ``kind`` in ``api_version`` (refreshed once when not found)."""
        kinds = self._by_version.get(api_version)
        if kinds is None or kind not in kinds:
            kinds = self._load(api_version)
        if kind not in kinds:
            raise KubeError(
                f"the API server ({self.kube.source}) does not serve {kind} in {api_version}",
                hint="is the CustomResourceDefinition installed and the API group enabled?",
            )
        return kinds[kind]

    def served(self, api_version: str, kind: str) -> bool:
        try:
            self.resource(api_version, kind)
        except KubeError:
            return False
        return True

    def listable(self) -> list[Discovered]:
        """One resource per kind the server serves and can list, at each group's preferred
        version (what ``kubectl api-resources --verbs=list`` shows)."""
        found: list[Discovered] = []
        versions = ["v1"]
        groups = cast("APIGroupList", api.request(self.kube, "GET", "/apis")).get("groups") or ()
        for served in groups:
            preferred = (served.get("preferredVersion") or {}).get("groupVersion")
            if preferred:
                versions.append(str(preferred))
        for version in versions:
            group, _, ver = version.rpartition("/")
            path = f"/apis/{group}/{ver}" if group else f"/api/{ver}"
            try:
                answer = cast("APIResourceList", api.request(self.kube, "GET", path))
            except ApiStatusError:
                continue  # an aggregated API that is down: listed as missing, not fatal
            for item in answer.get("resources") or ():
                name = str(item.get("name", ""))
                if "/" in name or "list" not in (item.get("verbs") or ()):
                    continue
                found.append(
                    Resource(group, ver, name, str(item.get("kind")), bool(item.get("namespaced")))
                )
        return found
