"""verify's live listener request: any HTTP answer counts, anything else does not."""

from __future__ import annotations

from meshctl_plugins.gateway.checks import _listeners, answered, probe_request


def test_a_status_line_is_an_answer_and_garbage_is_not():
    assert answered(b"HTTP/1.1 404 Not Found\r\nx-meshctl-route: no-route\r\n\r\n") == (
        "HTTP/1.1 404 Not Found"
    )
    assert answered(b"") == ""
    assert answered(b"\x15\x03\x03\x00\x02\x02\x28") == ""  # a TLS alert on a plaintext probe
    assert answered(b"SSH-2.0-OpenSSH\r\n") == ""


def test_the_probe_names_the_host_and_closes():
    assert probe_request("a.example.com") == (
        b"HEAD / HTTP/1.1\r\nHost: a.example.com\r\nConnection: close\r\n\r\n"
    )


def test_only_http_and_https_listeners_are_probed():
    gw = {
        "spec": {
            "listeners": [
                {"name": "http", "port": 80, "protocol": "HTTP"},
                {"name": "tls", "port": 443, "protocol": "HTTPS", "hostname": "*.example.com"},
                {"name": "tcp", "port": 9000, "protocol": "TCP"},
                "garbage",
            ]
        }
    }
    assert _listeners(gw) == [("http", 80, "HTTP", ""), ("tls", 443, "HTTPS", "*.example.com")]
