"""Reading the API server's version (``GET /version``): the smallest proof a client works."""

from __future__ import annotations

from meshctl.errors import KubeError
from meshctl.kube.client import Kube


def server_version(kube: Kube) -> dict[str, str]:
    """``gitVersion``, ``platform`` and friends from ``/version``, as plain strings."""
    from kubernetes.client import VersionApi
    from kubernetes.client.exceptions import ApiException
    from urllib3.exceptions import HTTPError

    from meshctl.kube.api import unreachable

    where = f"API server {kube.server} ({kube.source})"
    try:
        info = VersionApi(kube.api).get_code(_request_timeout=kube.timeout)
    except ApiException as exc:
        raise KubeError(
            f"{where} answered {exc.status} {exc.reason}",
            hint="check your credentials and RBAC",
        ) from exc
    except (HTTPError, OSError) as exc:
        raise unreachable(where, exc, kube.request_timeout) from exc
    # sanitize_for_serialization gives the wire (camelCase) names, as `kubectl version` shows.
    wire = kube.api.sanitize_for_serialization(info)
    return {k: str(v) for k, v in wire.items() if v is not None}
