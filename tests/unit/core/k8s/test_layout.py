"""Where the mesh lives is written once: the layout's defaults, and the names derived from them."""

from __future__ import annotations

from pathlib import Path

import pytest

from meshctl.core.k8s import layout

ROOT = Path(__file__).resolve().parents[4]
LAYOUT = ROOT / "meshctl" / "core" / "k8s" / "layout.py"


def product_sources() -> list[Path]:
    return sorted(p for top in ("meshctl", "plugins") for p in (ROOT / top).rglob("*.py"))


@pytest.mark.parametrize(
    "literal",
    [
        '"meshctl-system"',
        "/opt/cni/bin",  # also inside longer paths (/host/opt/cni/bin is derived, never written)
        '"/etc/cni/net.d"',
        '"/var/run/netns"',
        '"meshctl-ca-root-cert"',
    ],
)
def test_each_default_of_the_layout_is_written_once_in_product_code(literal):
    found = [
        f"{path.relative_to(ROOT)}:{number}"
        for path in product_sources()
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if literal in line and not line.lstrip().startswith("#")
    ]
    assert len(found) == 1, found
    assert found[0].startswith(str(LAYOUT.relative_to(ROOT))), found


def test_a_host_directory_is_seen_under_the_mount_inside_a_node_agent():
    assert layout.mounted(layout.HOST_CNI_BIN_DIR) == "/host/opt/cni/bin"
    assert layout.mounted(layout.HOST_CNI_CONF_DIR) == "/host/etc/cni/net.d"


def test_the_control_plane_address_follows_the_revision_as_istiod_does():
    assert layout.control_plane_address("mesh") == "meshctl-controlplane.mesh.svc:15012"
    assert (
        layout.control_plane_address("mesh", "canary")
        == "meshctl-controlplane-canary.mesh.svc:15012"
    )
    assert layout.revisioned("x", layout.DEFAULT_REVISION) == "x"
