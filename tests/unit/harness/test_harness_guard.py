"""The netns suite's guard finds an exception that escaped into a sidecar's log."""

from __future__ import annotations

from tests.netns import ztunnel_harness as harness


def test_an_escaped_exception_in_a_sidecar_log_is_found_once(tmp_path):
    log = tmp_path / "a.log"
    log.write_text(
        "INFO meshctl.access: connection complete ...\n"
        "ERROR asyncio: Fatal error: protocol.data_received() call failed.\n"
        "Traceback (most recent call last):\n"
        "h2.exceptions.StreamClosedError: 1\n"
    )
    car = harness.Sidecar(None, "ns/a/a", tmp_path, tmp_path, log_path=log)  # type: ignore[arg-type]
    harness._STARTED.append(car)
    found = harness.unhandled_errors_since_last_check()
    assert [line.split(": ", 1)[1][:12] for line in found] == ["ERROR asynci", "Traceback (m"]
    assert harness.unhandled_errors_since_last_check() == []  # each log is scanned once
