"""The control plane's pure-ish logic: the reconcile queue, the caBundle patch, settings."""

from __future__ import annotations

import asyncio
import base64
import itertools
from datetime import timedelta

import pytest
from meshctl_plugins.controlplane.cabundle import bundle_patch
from meshctl_plugins.controlplane.reconcile import WorkQueue
from meshctl_plugins.controlplane.settings import ControlPlaneSettings, address, duration

from meshctl.errors import ConfigError


def test_a_key_queued_twice_runs_once_and_never_concurrently_with_itself() -> None:
    runs: list[str] = []
    running: set[str] = set()

    async def scenario() -> None:
        async def reconcile(key: str) -> None:
            assert key not in running, "the same key ran twice at once"
            running.add(key)
            runs.append(key)
            await asyncio.sleep(0.02)
            running.discard(key)

        queue: WorkQueue[str] = WorkQueue("test", reconcile)
        task = asyncio.ensure_future(queue.run(workers=4))
        for key in ("a", "a", "b", "a"):
            queue.add(key)
        await asyncio.sleep(0.005)
        queue.add("a")  # while "a" runs: once more after it
        while not queue.idle:
            await asyncio.sleep(0.01)
        task.cancel()

    asyncio.run(scenario())
    assert sorted(runs) == ["a", "a", "b"]


def test_a_failing_key_is_retried_with_growing_delays_until_it_succeeds() -> None:
    attempts: list[float] = []

    async def scenario() -> None:
        loop = asyncio.get_running_loop()

        async def reconcile(_key: str) -> None:
            attempts.append(loop.time())
            if len(attempts) < 3:
                raise RuntimeError("API said no")

        queue: WorkQueue[str] = WorkQueue("test", reconcile, first_retry=0.05, max_retry=1.0)
        task = asyncio.ensure_future(queue.run())
        queue.add("k")
        while len(attempts) < 3 or not queue.idle:
            await asyncio.sleep(0.01)
        task.cancel()

    asyncio.run(scenario())
    gaps = [b - a for a, b in itertools.pairwise(attempts)]
    assert len(attempts) == 3
    assert gaps[0] >= 0.05
    assert gaps[1] >= 0.1  # doubled


def _configuration(*bundles: str | None) -> dict:
    hooks = []
    for bundle in bundles:
        client: dict = {"url": "https://x/inject"}
        if bundle is not None:
            client["caBundle"] = bundle
        hooks.append({"name": f"w{len(hooks)}", "clientConfig": client})
    return {"metadata": {"resourceVersion": "42"}, "webhooks": hooks}


def test_bundle_patch_sets_only_the_wrong_bundles_and_tests_the_version() -> None:
    pem = "-----BEGIN CERTIFICATE-----\nx\n-----END CERTIFICATE-----\n"
    good = base64.b64encode(pem.encode()).decode()
    ops = bundle_patch(_configuration(good, "b2xk", None), pem)
    assert ops == [
        {"op": "test", "path": "/metadata/resourceVersion", "value": "42"},
        {"op": "replace", "path": "/webhooks/1/clientConfig/caBundle", "value": good},
        {"op": "add", "path": "/webhooks/2/clientConfig/caBundle", "value": good},
    ]
    assert bundle_patch(_configuration(good, good), pem) == []


def test_durations_and_addresses_parse_or_say_what_to_write() -> None:
    assert duration("90d", "x") == timedelta(days=90)
    assert duration("1.5s", "x") == timedelta(seconds=1.5)
    assert duration("300ms", "x") == timedelta(milliseconds=300)
    with pytest.raises(ConfigError, match="not a duration"):
        duration("-1h", "x")
    assert address(":15012", "x") == ("0.0.0.0", 15012)  # noqa: S104 -- the parsed default
    assert address("[::1]:8080", "x") == ("::1", 8080)
    with pytest.raises(ConfigError, match="not HOST:PORT"):
        address("15012", "x")
    with pytest.raises(ConfigError, match="not an IP address"):
        address("istiod:15012", "x")


def test_serving_names_follow_service_namespace_and_revision() -> None:
    settings = ControlPlaneSettings(
        namespace="mesh", revision="canary", serving_names=("127.0.0.1", "cp.example.org")
    )
    dns, ips = settings.serving_dns_and_ips()
    assert dns == [
        "meshctl-controlplane-canary.mesh.svc",
        "meshctl-controlplane.mesh.svc",
        "meshctl-controlplane-canary.mesh.svc.cluster.local",
        "cp.example.org",
    ]
    assert ips == ["127.0.0.1"]
    assert ControlPlaneSettings().node_accounts == {"meshctl-system/meshctl-ztunnel"}
