"""The data plane's process-wide tuning (traps 1 and 2 of the performance notes)."""

from __future__ import annotations

from hyperframe.frame import DataFrame, SettingsFrame
from meshctl_plugins.dataplane.main import quiet_frame_repr, tune_malloc


def test_frame_repr_is_constant_size_so_h2_trace_logging_costs_nothing():
    quiet_frame_repr()
    frame = DataFrame(1, data=b"\xab" * (1 << 20), flags=["END_STREAM"])
    assert repr(frame) == "DataFrame(stream_id=1)"  # not a hex dump of the 1 MiB payload
    assert len(repr(SettingsFrame(0, settings={4: 1 << 20}))) < 40


def test_malloc_thresholds_are_raised_on_glibc():
    assert tune_malloc() is True  # this machine runs glibc; elsewhere it reports False
