"""The data plane's process-wide tuning (traps 1 and 2 of the performance notes)."""

from __future__ import annotations

import subprocess
import sys

from hyperframe.frame import DataFrame, SettingsFrame
from meshctl_plugins.dataplane.main import quiet_frame_repr, tune_malloc


def test_frame_repr_is_constant_size_so_h2_trace_logging_costs_nothing():
    quiet_frame_repr()
    frame = DataFrame(1, data=b"\xab" * (1 << 20), flags=["END_STREAM"])
    assert repr(frame) == "DataFrame(stream_id=1)"  # not a hex dump of the 1 MiB payload
    assert len(repr(SettingsFrame(0, settings={4: 1 << 20}))) < 40


def test_malloc_thresholds_are_raised_on_glibc():
    assert tune_malloc() is True  # this machine runs glibc; elsewhere it reports False


def test_gc_tuning_freezes_start_up_objects_and_collects_the_young_rarely():
    # In a child: freezing this test process's heap would outlive the test.
    code = (
        "import gc; from meshctl_plugins.dataplane.main import tune_gc; tune_gc(); "
        "print(gc.get_freeze_count() > 10_000, gc.get_threshold()[0])"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.split() == ["True", "20000"]
