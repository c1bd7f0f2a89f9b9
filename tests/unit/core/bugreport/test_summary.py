"""The summary from collected data: what stands out, counted, with first examples."""

from __future__ import annotations

from meshctl.core.bugreport.summary import (
    NOTHING_FOUND,
    Collected,
    LogText,
    ProxyAnswer,
    error_lines,
    markdown,
    summarize,
)


def _pod(name: str, *, ready: bool, restarts: int = 0, waiting: str | None = None):
    status: dict[str, object] = {
        "phase": "Running" if ready else "Pending",
        "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
        "containerStatuses": [
            {
                "name": "istio-proxy",
                "restartCount": restarts,
                "state": {"waiting": {"reason": waiting}} if waiting else {"running": {}},
                "lastState": {"terminated": {"reason": "Error", "exitCode": 1}} if restarts else {},
            }
        ],
    }
    return {"metadata": {"name": name, "namespace": "shop"}, "status": status}


def _collected(**kw) -> Collected:
    base = {
        "mesh_namespace": "meshctl-system",
        "namespaces": ["shop"],
        "since": "1h",
        "cluster_version": "v1.33.0",
        "meshctl_version": "0.1.0",
    }
    return Collected(**{**base, **kw})


def test_a_healthy_collection_says_nothing_stands_out():
    found = summarize(_collected(pods=[_pod("a", ready=True)]))
    assert found["podsNotReady"] == []
    assert found["podsRestarting"] == []
    assert found["warningEvents"] == {"count": 0, "examples": []}
    assert NOTHING_FOUND in markdown(found, archive="r.tar.gz")


def test_pods_not_ready_and_restarting_are_named_with_why():
    pods = [
        _pod("web-1", ready=False, waiting="CrashLoopBackOff", restarts=4),
        _pod("web-2", ready=True),
    ]
    found = summarize(_collected(pods=pods))
    assert found["podsNotReady"] == [
        {"pod": "shop/web-1", "why": "container istio-proxy waiting: CrashLoopBackOff"}
    ]
    assert found["podsRestarting"] == [
        {"pod": "shop/web-1", "container": "istio-proxy", "restarts": 4, "lastExit": "Error (1)"}
    ]
    text = markdown(found)
    assert "shop/web-1: container istio-proxy waiting: CrashLoopBackOff" in text
    assert "shop/web-1 istio-proxy: 4 restarts, last exit Error (1)" in text


def test_warning_events_are_counted_newest_first():
    events = [
        {
            "type": "Warning",
            "reason": "BackOff",
            "message": "Back-off   restarting",
            "count": 3,
            "lastTimestamp": "2026-01-01T00:00:02Z",
            "involvedObject": {"kind": "Pod", "name": "web-1", "namespace": "shop"},
        },
        {
            "type": "Warning",
            "reason": "FailedMount",
            "message": "no such secret",
            "lastTimestamp": "2026-01-01T00:00:05Z",
            "involvedObject": {"kind": "Pod", "name": "web-2", "namespace": "shop"},
        },
        {"type": "Normal", "reason": "Pulled", "involvedObject": {}},
    ]
    found = summarize(_collected(events=events))
    assert found["warningEvents"] == {
        "count": 2,
        "examples": [
            "shop/Pod/web-2: FailedMount: no such secret",
            "shop/Pod/web-1: BackOff: Back-off restarting (x3)",
        ],
    }


def test_error_lines_in_logs_are_counted_per_log_with_first_examples():
    text = (
        "2026-01-01 INFO a: fine\n"
        "2026-01-01 ERROR meshctl.xds: stream reset\n"
        '{"level": "error", "msg": "nope"}\n'
        "Traceback (most recent call last):\n"
        "an error word in prose is not a level\n"
    )
    logs = [
        LogText(namespace="shop", pod="web-1", container="istio-proxy", previous=False, text=text),
        LogText(namespace="shop", pod="web-2", container="istio-proxy", previous=True, text="ok\n"),
    ]
    assert len(error_lines(text)) == 3
    found = summarize(_collected(logs=logs))
    assert found["logErrors"]["count"] == 3
    assert found["logErrors"]["byLog"] == {"logs/shop/web-1/istio-proxy.log": 3}
    assert found["logErrors"]["examples"][0] == (
        "shop/web-1/istio-proxy: 2026-01-01 ERROR meshctl.xds: stream reset"
    )


def test_proxies_that_did_not_answer_nacks_and_disconnects_are_findings():
    dump = {
        "xds": {
            "connected": False,
            "lastError": "connection refused",
            "types": {
                "type.googleapis.com/istio.workload.Address": {"nacks": 2, "lastNack": "bad"},
                "type.googleapis.com/istio.security.Authorization": {"nacks": 0},
            },
        }
    }
    proxies = [
        ProxyAnswer(namespace="shop", pod="web-1", role="sidecar", dump=dump),
        ProxyAnswer(namespace="shop", pod="web-2", role="sidecar", dump=None, error="refused"),
    ]
    found = summarize(_collected(proxies=proxies))
    assert found["proxiesNotAnswering"] == [
        {"pod": "shop/web-2", "role": "sidecar", "error": "refused"}
    ]
    assert found["nacks"] == [
        {"pod": "shop/web-1", "type": "Address", "nacks": 2, "lastNack": "bad"}
    ]
    assert found["discoveryDisconnected"] == [
        {"pod": "shop/web-1", "lastError": "connection refused"}
    ]
    text = markdown(found)
    assert "## Findings" in text
    assert "shop/web-2 (sidecar): refused" in text
    assert "shop/web-1 Address: 2 NACKs, last: bad" in text


def test_what_could_not_be_collected_or_was_cut_is_listed():
    found = summarize(
        _collected(
            not_collected=["log of shop/web-1 istio-proxy: 400"],
            cut=["logs/x.log: kept 10 of 20 bytes"],
            left_out=["logs/y.log (20 bytes)"],
            logs=[
                LogText(namespace="s", pod="p", container="c", previous=False, text="", cut=True)
            ],
        )
    )
    text = markdown(found)
    assert "## What this report lacks" in text
    assert "- not collected: log of shop/web-1 istio-proxy: 400" in text
    assert "- log cut by the per-log cap (oldest lines dropped): logs/s/p/c.log" in text
    assert "- cut by the total size cap: logs/x.log: kept 10 of 20 bytes" in text
    assert "- left out by the total size cap: logs/y.log (20 bytes)" in text
