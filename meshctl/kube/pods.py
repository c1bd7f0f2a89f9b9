"""Reading one pod, retrying briefly: the verb the CNI plugin needs (over ``meshctl.kube.rest``).

Invariant: retries only what can clear up within seconds (no answer, 404 while the pod object
lags the sandbox, 429, 5xx) and never past the deadline; the last error is raised unchanged so the
caller can tell "unreachable" (fail closed, try again) from "refused" (RBAC, really absent).
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, cast

from meshctl.kube.rest import ApiStatusError, ApiUnreachableError, RestConfig, get_json, pod_path

if TYPE_CHECKING:
    from meshctl.core.k8s.schema import Pod

log = logging.getLogger(__name__)

_RETRIED_STATUS = frozenset({404, 429, 500, 502, 503, 504})


def get_pod(
    config: RestConfig,
    namespace: str,
    name: str,
    *,
    timeout: float,
    deadline: float,
    first_delay: float = 0.05,
) -> Pod:
    """The pod as the API serves it; retried with doubling delays until ``deadline`` seconds
    pass."""
    give_up = time.monotonic() + deadline
    delay = first_delay
    attempt = 1
    while True:
        left = give_up - time.monotonic()
        try:
            found = get_json(
                config, pod_path(namespace, name), timeout=max(0.1, min(timeout, left))
            )
            return cast("Pod", found)
        except ApiStatusError as exc:
            if exc.status not in _RETRIED_STATUS or time.monotonic() >= give_up:
                raise
            log.info("pod %s/%s: attempt %d: %s; retrying", namespace, name, attempt, exc.message)
        except ApiUnreachableError as exc:
            if time.monotonic() >= give_up:
                raise
            log.info("pod %s/%s: attempt %d: %s; retrying", namespace, name, attempt, exc.message)
        # The last attempt lands on the deadline itself: a pod the API shows late still counts.
        time.sleep(max(0.0, min(delay, give_up - time.monotonic())))
        delay = min(delay * 2, 1.0)
        attempt += 1
