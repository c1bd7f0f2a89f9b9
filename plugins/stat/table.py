"""The table ``stat`` and ``top`` print: linkerd viz stat's columns (NAME MESHED SUCCESS RPS
LATENCY_P50 LATENCY_P99 TCP_CONN) and the L4 figures meshctl's proxies measure besides (new
connections per second, bytes per second each way, the mTLS share), ``-`` where nothing was
measured, and why a row lacks figures."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from meshctl.output import render_table


def _percent(value: object) -> str:
    return "-" if not isinstance(value, int | float) else f"{value * 100:.2f}%"


def _number(value: object, unit: str = "") -> str:
    if not isinstance(value, int | float):
        return "-"
    return f"{value:.1f}{unit}"


def _ms(value: object) -> str:
    if not isinstance(value, int | float):
        return "-"
    return f"{value:.0f}ms" if value >= 10 else f"{value:.1f}ms"


def _bytes(value: object) -> str:
    if not isinstance(value, int | float):
        return "-"
    for unit in ("B", "KiB", "MiB"):
        if value < 1024:
            return f"{value:.0f}{unit}/s" if unit == "B" else f"{value:.1f}{unit}/s"
        value /= 1024
    return f"{value:.1f}GiB/s"


def cells(row: Mapping[str, object], *, namespaces: bool) -> dict[str, str]:
    out = {"NAMESPACE": str(row["namespace"])} if namespaces else {}
    success = _percent(row.get("success"))
    if row.get("successOf") == "connections":
        success += " (conn)"
    out.update(
        {
            "NAME": str(row["name"]),
            "MESHED": str(row["meshed"]),
            "SUCCESS": success,
            "RPS": _number(row.get("rps")),
            "LATENCY_P50": _ms(row.get("latencyP50Ms")),
            "LATENCY_P99": _ms(row.get("latencyP99Ms")),
            "TCP_CONN": str(row.get("tcpOpen", 0)),
            "CPS": _number(row.get("cps")),
            "READ": _bytes(row.get("bytesInPerSecond")),
            "WRITE": _bytes(row.get("bytesOutPerSecond")),
            "MTLS": _percent(row.get("mtls")),
        }
    )
    if row.get("reason"):
        out["REASON"] = str(row["reason"])
    return out


def text(rows: Sequence[Mapping[str, object]], *, namespaces: bool) -> str:
    """Aligned columns (``meshctl.output``'s); REASON only when a row has one."""
    if not rows:
        return ""
    return render_table([cells(r, namespaces=namespaces) for r in rows])
