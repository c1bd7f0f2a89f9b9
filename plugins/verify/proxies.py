"""``meshctl verify --proxy``: the data-plane checks of ``--workload``, for every meshed pod.

The checks are the components' own ``workload`` checks (``Check.workload``), run unchanged once
per pod, each pod with a fresh ``CheckContext`` (its memo holds that pod's reads). A meshed pod
has a sidecar or the node agent's ambient annotation (``pending`` included: a pod the agent could
not hand to a node proxy is exactly what this should find); gateways are not workloads of these
checks. Invariant: one row per pod; the exit code is 3 when any pod's checks fail.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from meshctl.core.k8s import ambient
from meshctl.core.k8s.install.checks import (
    SYMBOL,
    Check,
    Outcome,
    Ran,
    ReportedCheck,
    exit_code,
    report_json,
)

WORKERS = 4  # pods checked at once (each check is a port-forward or a pods/proxy GET)


def meshed(pods: Sequence[Any]) -> list[tuple[str, str, str]]:
    """(namespace, name, mode) of the running meshed pods, sorted."""
    out = []
    for pod in pods:
        meta = pod.get("metadata") or {}
        status = pod.get("status") or {}
        if status.get("phase") != "Running" or meta.get("deletionTimestamp"):
            continue
        if ambient.has_sidecar(pod):
            mode = "sidecar"
        elif (meta.get("annotations") or {}).get(ambient.REDIRECTION):
            mode = "ambient"
        else:
            continue
        out.append((str(meta.get("namespace")), str(meta.get("name")), mode))
    return sorted(out)


def check_pods(
    pods: Sequence[tuple[str, str, str]],
    checks: Sequence[Check],
    context: Callable[[str], Any],
    run: Callable[[Sequence[Check], Any], list[Ran]],
) -> list[tuple[tuple[str, str, str], list[Ran]]]:
    """Each pod's checks run (``context(NS/POD)`` builds its context), at most ``WORKERS`` at
    once, in the pods' order."""

    def one(pod: tuple[str, str, str]) -> list[Ran]:
        return run(checks, context(f"{pod[0]}/{pod[1]}"))

    if not pods:
        return []
    with ThreadPoolExecutor(max_workers=min(WORKERS, len(pods))) as pool:
        return list(zip(pods, pool.map(one, pods), strict=True))


def _outcome(ran: Sequence[Ran]) -> Outcome:
    outcomes = {r.result.outcome for r in ran}
    for worst in (Outcome.FAIL, Outcome.WARN, Outcome.OK):
        if worst in outcomes:
            return worst
    return Outcome.SKIP


def rows(results: Sequence[tuple[tuple[str, str, str], list[Ran]]]) -> list[dict[str, object]]:
    """One record per pod: its mode, its worst outcome and its checks as ``verify -o json``
    reports them."""
    out: list[dict[str, object]] = []
    for (namespace, name, mode), ran in results:
        checks: list[ReportedCheck] = [
            c for category in report_json(ran)["categories"] for c in category["checks"]
        ]
        out.append(
            {
                "namespace": namespace,
                "name": name,
                "mode": mode,
                "result": _outcome(ran).value,
                "checks": checks,
            }
        )
    return out


def table(records: Sequence[dict[str, object]]) -> str:
    """Aligned rows: NAMESPACE POD MODE STATUS, then what the worst check said (and its hint)."""
    if not records:
        return "No meshed pods found.\n"
    lines = [["NAMESPACE", "POD", "MODE", "STATUS", "MESSAGE"]]
    for r in records:
        outcome = Outcome(r["result"])
        checks: list[Any] = r["checks"]  # type: ignore[assignment]
        worst = [c for c in checks if c["result"] == outcome.value]
        if outcome in (Outcome.FAIL, Outcome.WARN):
            message = "; ".join(
                f"{c['description']}: {c.get('error', '')}"
                + (f" (Hint: {c['hint']})" if c.get("hint") else "")
                for c in worst
            )
        else:
            message = "; ".join(c.get("message", "") for c in worst if c.get("message"))
        status = f"{SYMBOL[outcome]} {outcome.value}"
        lines.append([str(r["namespace"]), str(r["name"]), str(r["mode"]), status, message])
    widths = [max(len(line[i]) for line in lines) for i in range(4)]
    return "".join(
        "   ".join([*(c.ljust(w) for c, w in zip(line[:4], widths, strict=True)), line[4]]).rstrip()
        + "\n"
        for line in lines
    )


def code(results: Sequence[tuple[tuple[str, str, str], list[Ran]]]) -> int:
    return max((exit_code(ran) for _, ran in results), default=0)
