"""The collector's reads, with the cluster faked at the adapters: a proxy's garbage is a finding,
never a traceback, key material in a dump is redacted, a long log keeps its newest lines."""

from __future__ import annotations

import json
from typing import Any

import pytest
from meshctl_plugins.bugreport import collect
from meshctl_plugins.bugreport.collect import Collector, Settings

from meshctl.core.bugreport.layout import Role
from meshctl.errors import KubeError
from meshctl.kube import podlog

POD = {
    "metadata": {"name": "web-1", "namespace": "shop"},
    "spec": {"nodeName": "n1", "containers": [{"name": "istio-proxy"}]},
    "status": {"phase": "Running"},
}
KEY = (
    "-----BEGIN PRIVATE KEY-----\nMIGHAgEAMBMGByqGSM49AgEGCCqGSM49AwEHBG0wawIBAQQg\n"
    "-----END PRIVATE KEY-----\n"
)


def _collector() -> Collector:
    settings = Settings(
        mesh_namespace="meshctl-system",
        namespaces=["shop"],
        since=3600.0,
        log_limit=1024,
        total_limit=1024 * 1024,
        concurrency=2,
        proxy_timeout=1.0,
    )
    return Collector(object(), settings)  # type: ignore[arg-type]  # the adapters are faked


def _answer(monkeypatch: pytest.MonkeyPatch, status: int, body: bytes | Exception) -> None:
    def http_get(*args: Any, **kwargs: Any) -> tuple[int, bytes]:
        if isinstance(body, Exception):
            raise body
        return status, body

    monkeypatch.setattr(collect.portforward, "http_get", http_get)


@pytest.mark.parametrize(
    ("status", "body", "why"),
    [
        (200, b"\x00\xff garbage \xfe", "unusable JSON"),
        (200, b"[" * 5000 + b"]" * 5000, "nested deeper"),
        (200, b"[1, 2]", "not a JSON object"),
        (503, b"not ready", "answered 503"),
        (0, KubeError("port-forward to pod shop/web-1 port 15000: refused"), "refused"),
    ],
    ids=["binary", "deep", "a-list", "503", "refused"],
)
def test_a_proxy_that_answers_garbage_or_nothing_is_a_finding(monkeypatch, status, body, why):
    _answer(monkeypatch, status, body)
    collector = _collector()
    collector._dump(POD, Role.SIDECAR)
    (answer,) = collector.got.proxies
    assert answer.dump is None
    assert why in answer.error


def test_a_dump_is_kept_redacted(monkeypatch):
    dump = {"identity": "spiffe://x", "config": {"key": KEY}, "token": "abc.def"}
    _answer(monkeypatch, 200, json.dumps(dump).encode())
    collector = _collector()
    collector._dump(POD, Role.SIDECAR)
    (member,) = collector.got.members
    assert member.name == "proxies/shop/web-1/config_dump.json"
    kept = json.loads(member.data)
    assert kept["identity"] == "spiffe://x"
    assert "PRIVATE KEY-----" not in member.data.decode()
    assert kept["token"] == "[REDACTED]"
    assert collector.got.proxies[0].error == ""


def test_a_read_that_raises_anything_is_a_line_not_the_end(monkeypatch):
    collector = _collector()

    def broken() -> None:
        raise RuntimeError("a bug")

    collector._run_all([("something", broken), ("nodes", lambda: None)])
    assert collector.got.not_collected == ["something: RuntimeError: a bug"]


def test_a_log_longer_than_the_cap_keeps_its_newest_lines(monkeypatch):
    lines = [f"line {i:04d}\n" for i in range(1000)]  # 10 bytes each
    asked: list[dict[str, str]] = []

    def request_text(kube, path, *, query=(), timeout=None):
        q = dict(query)
        asked.append(q)
        window = lines[-int(q["tailLines"]) :] if "tailLines" in q else lines
        return "".join(window)[: int(q["limitBytes"])]

    monkeypatch.setattr(podlog.api, "request_text", request_text)
    found = podlog.read(object(), "shop", "web-1", "istio-proxy", since=60, limit=1000)  # type: ignore[arg-type]
    assert found.cut
    assert found.text.endswith("line 0999\n")
    assert len(found.text.encode()) <= 1000
    assert asked[0] == {
        "container": "istio-proxy",
        "limitBytes": "1000",
        "sinceSeconds": "60",
    }
    assert asked[1]["tailLines"] == "100"
    short = podlog.read(object(), "shop", "web-1", "c", since=None, limit=100_000)  # type: ignore[arg-type]
    assert not short.cut
    assert "sinceSeconds" not in asked[-1]
