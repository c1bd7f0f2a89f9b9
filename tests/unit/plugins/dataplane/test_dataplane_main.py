"""The data plane's process-wide tuning (traps 1 and 2 of the performance notes)."""

from __future__ import annotations

import subprocess
import sys

from meshctl_plugins.dataplane.main import tune_malloc


def test_the_data_plane_loads_no_general_http2_stack():
    # HBONE's framing is meshctl.core.wire.hbone's own: h2 and hyperframe stay out of the data plane
    # (their per-frame objects were most of its CPU per connection, and ~4 MB of its memory).
    code = (
        "import sys, meshctl_plugins.dataplane.runtime, meshctl_plugins.dataplane.main; "
        "print(sorted(m for m in ('h2', 'hyperframe') if m in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"


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
