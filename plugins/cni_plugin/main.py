"""The ``cni-plugin`` raw entry point: ``meshctl cni-plugin``, ``meshctl-cni`` from pip, and the
one-file binary run as ``meshctl-cni``; all run the thin client (client.py).

The fast forms on a node run client.py without this module or meshctl's entry: the tree's
``meshctl-cni`` launcher (packaging/cni/launcher.c) and the unfrozen launcher script.
"""

from __future__ import annotations


def main(argv: list[str]) -> int:
    """Serve one CNI invocation (the runtime passes no arguments; any given are ignored)."""
    del argv
    from .client import main as client_main

    return client_main()
