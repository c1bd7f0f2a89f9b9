"""The TypedDict views (Kubernetes objects, the data plane's /config_dump, the CNI plugin's JSON)
are types only.

Defining a TypedDict costs ~55 us at import: the ~60 views would add ~4 ms to every process that
imported them (the CNI plugin's ADD, the proxy's start, ``meshctl --help``), so the product
imports them under ``TYPE_CHECKING`` alone, and a process that runs without them must still work.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[4]
VIEWS = ("meshctl.core.k8s.schema", "meshctl.core.wire.dump", "meshctl.core.k8s.cni.messages")


def _imports_outside_type_checking(path: Path) -> list[int]:
    tree = ast.parse(path.read_text(), str(path))
    guarded: set[int] = set()
    for node in ast.walk(tree):
        test = node.test if isinstance(node, ast.If) else None
        if isinstance(test, ast.Name) and test.id == "TYPE_CHECKING":
            guarded |= {id(child) for child in ast.walk(node)}
    return [
        node.lineno
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.module in VIEWS and id(node) not in guarded
    ]


def test_the_views_are_imported_for_type_checking_only():
    found = {
        f"{path.relative_to(ROOT)}:{line}"
        for folder in ("meshctl", "plugins")
        for path in (ROOT / folder).rglob("*.py")
        for line in _imports_outside_type_checking(path)
    }
    assert not found


def test_the_processes_that_read_the_views_run_without_them():
    code = (
        "import importlib, sys\n"
        "for name in sys.argv[1:]:\n"
        "    importlib.import_module(name)\n"
        f"print(sorted(m for m in {VIEWS!r} if m in sys.modules))\n"
    )
    modules = [
        "meshctl_plugins.cni_plugin.main",
        "meshctl_plugins.cni.cnirequest",
        "meshctl_plugins.cni.daemon",
        "meshctl_plugins.dataplane.runtime",
        "meshctl_plugins.controlplane.plane",
        "meshctl_plugins.demo.scenario",
        "meshctl.core.k8s.inject.admission",
        "meshctl.core.k8s.inject.documents",
        "meshctl.kube.informer",
        "meshctl.proxy.xds_client",
    ]
    done = subprocess.run(
        [sys.executable, "-c", code, *modules], capture_output=True, text=True, check=True
    )
    assert done.stdout.strip() == "[]"
