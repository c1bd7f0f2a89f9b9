"""Reading the API server's version (``GET /version``): the smallest proof a client works."""

from __future__ import annotations

from meshctl.errors import KubeError
from meshctl.kube.client import Kube
from meshctl.values import format_duration


def server_version(kube: Kube) -> dict[str, str]:
    """``gitVersion``, ``platform`` and friends from ``/version``, as plain strings."""
    from kubernetes.client import VersionApi
    from kubernetes.client.exceptions import ApiException
    from urllib3.exceptions import HTTPError, MaxRetryError, NewConnectionError, SSLError
    from urllib3.exceptions import TimeoutError as Urllib3Timeout

    where = f"API server {kube.server} ({kube.source})"
    try:
        info = VersionApi(kube.api).get_code(_request_timeout=kube.timeout)
    except ApiException as exc:
        raise KubeError(
            f"{where} answered {exc.status} {exc.reason}",
            hint="check your credentials and RBAC",
        ) from exc
    except (HTTPError, OSError) as exc:
        reason = exc.reason if isinstance(exc, MaxRetryError) and exc.reason else exc
        # NewConnectionError (refused, no route) subclasses ConnectTimeoutError in urllib3 2.
        if isinstance(reason, Urllib3Timeout | TimeoutError) and not isinstance(
            reason, NewConnectionError
        ):
            raise KubeError(
                f"{where} did not answer within {format_duration(kube.request_timeout)}",
                hint="is the cluster up and reachable from here? if it is only slow, "
                "raise --request-timeout",
            ) from exc
        if isinstance(reason, SSLError):
            raise KubeError(
                f"{where}: TLS failed ({reason})",
                hint="check the kubeconfig's certificate-authority and server address",
            ) from exc
        raise KubeError(
            f"{where} unreachable: {_cause(reason)}",
            hint="is the cluster running and the kubeconfig's server address right?",
        ) from exc
    # sanitize_for_serialization gives the wire (camelCase) names, as `kubectl version` shows.
    wire = kube.api.sanitize_for_serialization(info)
    return {k: str(v) for k, v in wire.items() if v is not None}


def _cause(exc: BaseException) -> str:
    """The innermost OS reason (``connection refused``) rather than urllib3's wrapper text."""
    inner: BaseException | None = exc
    while inner is not None:
        if isinstance(inner, OSError) and inner.strerror:
            return inner.strerror.lower()
        inner = inner.__cause__ or inner.__context__
    return type(exc).__name__
