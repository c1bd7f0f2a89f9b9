"""The Gateway API's standard-channel CRDs that install applies (component ``crds``).

Owns reading them from this build's package data (``gateway_api_crds/``, filled from the pinned
upstream module by ``packaging/gateway_api.py``: never written into the repository) and the
``meshctl`` GatewayClass and IngressClass. (A cluster with a newer bundle keeps it: install's
rule, ``core.k8s.install.bundles``.) Invariants: the data's stamp must name ``VERSION``, else
install stops with one line saying the command that fetches it; the files are read once per
process.
"""

from __future__ import annotations

import functools
import importlib.resources

import yaml

from meshctl.core.k8s.install.components import Object
from meshctl.errors import ConfigError

VERSION = "v1.6.3"  # the version the conformance suite in tests/kube/gateway-api expects
GROUP = "gateway.networking.k8s.io"
DATA_DIR = "gateway_api_crds"
CLASS = "meshctl"
CONTROLLER = "meshctl.io/gateway-controller"
_FETCH = "python packaging/gateway_api.py"


@functools.cache
def _load() -> tuple[Object, ...]:
    data = importlib.resources.files(__package__ or "meshctl_plugins.controlplane") / DATA_DIR
    stamp = data / "VERSION"
    found = stamp.read_text().split()[0] if stamp.is_file() else ""
    if found != VERSION:
        what = f"has Gateway API {found}" if found else "has no Gateway API CRDs"
        raise ConfigError(
            f"this meshctl build {what} (install needs {VERSION}'s)",
            hint=f"from a source checkout: {_FETCH}, then reinstall or rebuild meshctl",
        )
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    out: list[Object] = []
    for item in sorted(data.iterdir(), key=lambda p: p.name):
        if item.name.endswith(".yaml"):
            out += [d for d in yaml.load_all(item.read_text(), Loader=loader) if d]
    return tuple(out)


def objects() -> list[Object]:
    """The CRDs, as upstream wrote them."""
    return list(_load())


def classes() -> list[Object]:
    """The GatewayClass and IngressClass ``meshctl`` (the gateway controller's)."""
    return [
        {
            "apiVersion": f"{GROUP}/v1",
            "kind": "GatewayClass",
            "metadata": {"name": CLASS},
            "spec": {
                "controllerName": CONTROLLER,
                "description": "meshctl's gateway: a proxy per Gateway, into the mesh",
            },
        },
        {
            "apiVersion": "networking.k8s.io/v1",
            "kind": "IngressClass",
            "metadata": {"name": CLASS},
            "spec": {"controller": CONTROLLER},
        },
    ]
