"""``meshctl install`` / ``manifest generate`` / ``uninstall`` without a cluster: values refused
with their range, the dry-run modes and their spelling."""

from __future__ import annotations

import pytest

from tests.harness.cli import run_meshctl as meshctl


@pytest.mark.parametrize("command", [("install", "--dry-run"), ("manifest", "generate")])
def test_a_replica_count_beyond_the_bound_is_a_usage_error_with_the_range(command):
    done = meshctl(*command, "--set", "components.controlplane.replicas=100000")
    assert done.returncode == 2, done.stderr
    assert done.stdout == ""
    assert done.stderr.startswith(
        "Error: --set components.controlplane.replicas=100000: components.controlplane.replicas:"
        " 100000 is out of range (1-100)\n"
    )
