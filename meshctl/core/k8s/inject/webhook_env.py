"""Injector settings given at install time (``components.controlplane.inject``) as the env the
webhook's injector reads (``MESHCTL_INJECT_*``), so a platform team sets Istio's mesh-wide
injection values (``values.global.network``, the capture ranges, the interception mode, ...)
with ``meshctl install`` instead of editing the control plane's Deployment.

Invariants: pure; every item is ``NAME=VALUE`` with NAME a setting of the ``inject:`` settings
section (``network``, ``interception-mode``, ...), checked with the injector's own parser before
anything is rendered (a bad name or value is one ``ConfigError`` naming the key); the settings
install decides itself (the image it deploys, CNI mode, the revision, the mesh's names and the
CA the proxies use) are refused, so two sources never disagree.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from meshctl import config
from meshctl.core.k8s.inject.settings import InjectSettings
from meshctl.errors import ConfigError

# Decided by install from its own values and layout, never by this list.
INSTALL_OWNED = frozenset(
    {
        "image",
        "image-pull-policy",
        "cni",
        "revision",
        "trust-domain",
        "cluster-id",
        "mesh-id",
        "ca-address",
        "token-audience",
        "root-ca-configmap",
    }
)


def webhook_env(items: Sequence[str], source: str) -> list[tuple[str, str]]:
    """``NAME=VALUE`` items as ``(env name, value)`` pairs for the webhook, in the settings'
    order; ``ConfigError`` naming ``source`` for anything the injector would refuse."""
    given: dict[str, str] = {}
    for item in items:
        name, eq, raw = item.partition("=")
        name = name.strip().replace("_", "-")
        if not eq or not name:
            raise ConfigError(
                f"{source}: {item!r} is not NAME=VALUE",
                hint="e.g. network=net1 or interception-mode=TPROXY (the 'inject:' settings)",
            )
        if name in INSTALL_OWNED:
            raise ConfigError(
                f"{source}: {name} is set by install itself",
                hint="use install's own value (image, imagePullPolicy, revision, trustDomain, "
                "components.cni) instead",
            )
        given[name] = raw
    # The injector's own parser: unknown names, types, choices and cross-checks, as it reads them.
    config.resolve(InjectSettings, env={}, file=given, file_name=source)
    out = []
    for f in dataclasses.fields(InjectSettings):
        name = f.name.replace("_", "-")
        if name in given:
            env = f.metadata["env"]
            out.append((env if isinstance(env, str) else env[0], given[name]))
    return out
