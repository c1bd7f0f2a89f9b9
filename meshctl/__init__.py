"""meshctl: a service mesh in one binary. This package is the entrypoint and the shared core.

It knows no subcommand by name: subcommands are plugins found through the ``meshctl.plugins``
entry-point group (see ``meshctl.plugins``).
"""

from __future__ import annotations

__version__ = "0.1.0"
