"""The data plane's preload imports what a forked worker runs, so the worker imports nothing big.

Run in a fresh interpreter: this test process may have imported the data plane already.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

PROBE = textwrap.dedent(
    """
    import json, sys
    from meshctl_plugins.dataplane import cli
    before = set(sys.modules)
    cli.preload()
    from meshctl_plugins.dataplane import main
    print(json.dumps({
        "new": sorted(set(sys.modules) - before),
        "libc_cached": main.libc_name.cache_info().currsize == 1,
    }))
    """
)


def test_preload_imports_the_runtime_its_libraries_and_resolves_libc_once():
    out = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, check=True, timeout=60
    )
    report = json.loads(out.stdout)
    new = set(report["new"])
    for module in (
        "uvloop",
        "ssl",
        "hpack",
        "meshctl.core.wire.hbone.connection",
        "prometheus_client",
        "meshctl_plugins.dataplane.main",
        "meshctl_plugins.dataplane.runtime",
    ):
        assert module in new, module
    assert report["libc_cached"]  # no 'ldconfig -p' per worker
