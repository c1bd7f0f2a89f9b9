"""CRD bundles install never downgrades: a live CRD of a newer bundle version is kept as it is.

Owns the rule install applies to CRDs that carry a bundle version (the Gateway API's
``gateway.networking.k8s.io/bundle-version`` annotation): when the cluster already has a newer
version (another controller, or a later meshctl, installed it), ours is not applied and install
says so; an older or equal one is applied over (the same fields, or an upgrade). Invariant: pure.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

BUNDLE_ANNOTATIONS = ("gateway.networking.k8s.io/bundle-version",)
_VERSION = re.compile(r"v?(\d+)\.(\d+)\.(\d+)")


def bundle_version(obj: Mapping[str, object]) -> tuple[str, tuple[int, int, int]] | None:
    """(annotation, version) of a bundled CRD, or None (no bundle version it can read)."""
    meta = obj.get("metadata")
    annotations = meta.get("annotations") if isinstance(meta, Mapping) else None
    if not isinstance(annotations, Mapping):
        return None
    for name in BUNDLE_ANNOTATIONS:
        text = annotations.get(name)
        match = _VERSION.fullmatch(text) if isinstance(text, str) else None
        if match:
            return name, (int(match[1]), int(match[2]), int(match[3]))
    return None


def keep_live(ours: Mapping[str, object], live: Mapping[str, object] | None) -> str | None:
    """Why the live object stays as it is (its bundle is newer than ours), or None."""
    mine, theirs = bundle_version(ours), bundle_version(live or {})
    if mine is None or theirs is None or mine[0] != theirs[0] or theirs[1] <= mine[1]:
        return None
    newer, older = (".".join(map(str, v[1])) for v in (theirs, mine))
    return (
        f"kept: the cluster has bundle v{newer} ({theirs[0]}), newer than this install's v{older}"
    )
