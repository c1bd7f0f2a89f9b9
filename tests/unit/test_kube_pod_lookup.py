"""Reading one pod with retries: the CNI plugin's lookup keeps trying until its deadline."""

from __future__ import annotations

import time

import pytest

from meshctl.kube import pods, rest


def _config() -> rest.RestConfig:
    return rest.RestConfig(server="https://127.0.0.1:1")


def test_an_unreachable_api_is_retried_until_the_deadline_itself(monkeypatch):
    # Refusals come back at once: the doubling delays alone must not end the lookup early.
    attempts: list[float] = []

    def refused(*_args: object, **_kwargs: object) -> object:
        attempts.append(time.monotonic())
        raise rest.ApiUnreachableError("connection refused")

    monkeypatch.setattr(pods, "get_json", refused)
    started = time.monotonic()
    with pytest.raises(rest.ApiUnreachableError):
        pods.get_pod(_config(), "shop", "cart-1", timeout=1, deadline=1.0)
    elapsed = time.monotonic() - started
    assert 1.0 <= elapsed < 1.5
    assert len(attempts) >= 5
    assert attempts[-1] - started >= 1.0, "the last attempt is at the deadline"


def test_a_pod_that_appears_late_is_found(monkeypatch):
    appears = time.monotonic() + 0.3

    def lagging(*_args: object, **_kwargs: object) -> object:
        if time.monotonic() < appears:
            raise rest.ApiStatusError('pods "cart-1" not found', status=404)
        return {"metadata": {"name": "cart-1"}}

    monkeypatch.setattr(pods, "get_json", lagging)
    pod = pods.get_pod(_config(), "shop", "cart-1", timeout=1, deadline=2.0)
    assert pod["metadata"]["name"] == "cart-1"


def test_a_refusal_that_cannot_clear_up_is_not_retried(monkeypatch):
    calls = 0

    def forbidden(*_args: object, **_kwargs: object) -> object:
        nonlocal calls
        calls += 1
        raise rest.ApiStatusError("forbidden", status=403)

    monkeypatch.setattr(pods, "get_json", forbidden)
    with pytest.raises(rest.ApiStatusError):
        pods.get_pod(_config(), "shop", "cart-1", timeout=1, deadline=2.0)
    assert calls == 1
