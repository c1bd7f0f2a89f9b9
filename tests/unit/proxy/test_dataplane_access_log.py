"""The access log's byte fields read as ztunnel's do, for both reporters.

ztunnel (src/proxy/metrics.rs) counts ``recv`` = client -> server and ``sent`` = server ->
client on either side, and logs them "unflipped": the source reporter's ``bytes_sent`` is what
the client sent, the destination reporter's ``bytes_sent`` is what the server sent.
"""

from __future__ import annotations

import logging

import pytest

from meshctl.proxy.telemetry import Flow, Peer, Telemetry

REQUEST, RESPONSE = 1001, 1032  # client -> server, server -> client


@pytest.mark.parametrize(
    ("direction", "sent", "recv"),
    [("outbound", REQUEST, RESPONSE), ("inbound", RESPONSE, REQUEST)],
    ids=["source", "destination"],
)
def test_bytes_sent_and_recv_are_ztunnels_for_each_reporter(caplog, direction, sent, recv):
    flow = Flow(
        Telemetry(), direction=direction, src=Peer(("10.0.0.1", 5000)), dst=Peer(("10.0.0.2", 80))
    )
    flow.open()
    flow.request_bytes(REQUEST)
    flow.response_bytes(RESPONSE)
    with caplog.at_level(logging.INFO, logger="meshctl.access"):
        flow.close()
    (record,) = caplog.records
    assert (record.access["bytes_sent"], record.access["bytes_recv"]) == (sent, recv)
    assert f"bytes_sent={sent} bytes_recv={recv}" in record.getMessage()
    # The metrics keep Istio's names whatever the reporter: received = the request's bytes.
    assert (flow.bytes_received, flow.bytes_sent) == (REQUEST, RESPONSE)
