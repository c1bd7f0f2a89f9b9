"""The demo's live view fits the terminal: all seven steps on 80x24, identities whole."""

from __future__ import annotations

import io
import re
import types

import pytest
from meshctl_plugins.demo.node import Pod
from meshctl_plugins.demo.scenario import Step
from meshctl_plugins.demo.view import Screen
from rich.console import Console

# What a real ambient run says (README's capture), step by step.
DETAILS = {
    "pods": "client 10.248.60.2 (default), server 10.248.60.3 (prod), legacy 10.248.60.4 "
    "(legacy) on bridge 10.248.60.0/24 via the CNI chain bridge + meshctl-cni (/usr/lib/cni)",
    "identities": "client=spiffe://cluster.local/ns/default/sa/client, server=spiffe://"
    "cluster.local/ns/prod/sa/server: 2/2 held by the one node proxy, issued by the control "
    "plane's CA at 127.0.0.1:15012 to its account meshctl-system/meshctl-ztunnel by "
    "impersonation; the node agent enrolled client, server (namespaces labelled "
    "istio.io/dataplane-mode=ambient; legacy: not enrolled)",
    "client -> server": "HTTP 200 'hello from server: you asked /hello' through the node proxy; "
    "the server's proxy counts 2 connection(s) as mutual_tls",
    "mTLS on the wire": "18 TCP segments on veth142d399b: request marker absent, 12 TLS records "
    "(12 application data) on 2 flow(s) to :15008, 0 non-15008 flow(s) from the client",
    "L4 policy": "DENY spiffe://cluster.local/ns/default/sa/client -> server:8080 applied: "
    "request refused (connection closed without an HTTP answer); the server's proxy answered "
    "the CONNECT with HTTP 401 (DENY +1 as destination, the node proxy DENY +1 as source); "
    "policy removed: HTTP 200",
    "proxy restart": "the node proxy killed (SIGKILL): request failed; restarted: HTTP 200 "
    "again after 2.1s",
    "unmeshed pod": "legacy 10.248.60.4 (no proxy) -> server: HTTP 200 through the server's "
    "inbound 15006 in plaintext (the server's proxy counts 1 connection(s) without mTLS; "
    "marker visible on the legacy link)",
}


class _Running:
    def poll(self) -> None:
        return None


def _screen() -> Screen:
    pods = {
        name: Pod(name, namespace, f"sb-{name}", ip, "veth", {})
        for name, namespace, ip in (
            ("client", "default", "10.248.60.2"),
            ("server", "prod", "10.248.60.3"),
            ("legacy", "legacy", "10.248.60.4"),
        )
    }
    ambient = "ambient (enabled, ZDS acked)"
    run = types.SimpleNamespace(
        pods=pods,
        sidecars={},
        ambient=True,
        meshed=lambda: [pods["client"], pods["server"]],
        enrollment={"client": ambient, "server": ambient, "legacy": "not enrolled"},
        node_proxy=_Running(),
        steps=[Step(name, True, detail, 1.0) for name, detail in DETAILS.items()],
    )
    screen = Screen(run)  # type: ignore[arg-type]
    screen.say("traffic: node proxy 2957 B/s, 10.0 conn/s; 65 connections (64 mutual_tls)")
    screen.say("the mesh keeps running; Ctrl-C stops it and removes everything")
    return screen


def _drawn(width: int, height: int) -> list[str]:
    console = Console(
        width=width, height=height, record=True, color_system=None, file=io.StringIO()
    )
    console.print(_screen())
    return console.export_text().rstrip("\n").splitlines()


@pytest.mark.parametrize(("width", "height"), [(80, 24), (100, 30), (160, 50)])
def test_every_step_and_whole_identities_fit_the_terminal(width, height):
    lines = _drawn(width, height)
    text = "\n".join(lines)
    assert len(lines) <= height, text
    assert max(len(line) for line in lines) <= width
    for step in DETAILS:  # each step's row: its mark, then its name
        row = re.compile(rf"PASS[ │]+{re.escape(step)} ")
        assert sum(bool(row.search(line)) for line in lines) == 1, (step, text)
    for who in ("ns/default/sa/client", "ns/prod/sa/server"):
        assert who in text  # whole, never cut mid-way
    assert "the mesh keeps running" in text


def test_a_large_terminal_keeps_the_full_view():
    text = "\n".join(_drawn(160, 50))
    assert "spiffe://cluster.local/ns/prod/sa/server" in text
    assert "marker visible on the legacy link" in text  # details wrap instead of being cut
