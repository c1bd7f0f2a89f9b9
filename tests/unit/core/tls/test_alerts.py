"""TLS alert records the gateway sends before closing a passthrough connection."""

from __future__ import annotations

from meshctl.core.tls import alerts
from meshctl.core.tls.clienthello import Reason


def test_unrecognized_name_is_a_fatal_alert_record_with_description_112():
    assert alerts.fatal(alerts.Description.UNRECOGNIZED_NAME) == bytes([21, 3, 3, 0, 2, 2, 112])


def test_the_record_version_echoes_the_clients_first_record():
    hello_start = bytes([22, 3, 1, 0, 200])
    assert alerts.record_version(hello_start) == 0x0301
    assert alerts.fatal(alerts.Description.DECODE_ERROR, 0x0301)[1:3] == b"\x03\x01"


def test_a_first_record_that_is_not_tls_gets_the_default_version():
    assert alerts.record_version(b"GET / HTTP/1.1") == alerts.DEFAULT_VERSION
    assert alerts.record_version(b"\x16\x03") == alerts.DEFAULT_VERSION
    assert alerts.record_version(bytes([22, 3, 9])) == alerts.DEFAULT_VERSION


def test_clients_that_spoke_no_tls_records_get_no_alert():
    assert Reason.NOT_TLS not in alerts.FOR_REFUSAL
    assert Reason.SSLV2 not in alerts.FOR_REFUSAL
    assert alerts.FOR_REFUSAL[Reason.MALFORMED] is alerts.Description.DECODE_ERROR
    assert alerts.FOR_REFUSAL[Reason.NOT_HANDSHAKE] is alerts.Description.UNEXPECTED_MESSAGE
