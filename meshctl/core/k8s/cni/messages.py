"""The JSON the CNI plugin exchanges: results and errors (the CNI spec's), and what it tells the
ambient node agent.

Owns their shapes, per the CNI specification (SPEC.md "Success" and "Error") and Istio's
``/cmdadd`` body. Imported for types only: the plugin starts for every sandbox, and defining
these at its start-up would cost it for nothing.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, TypedDict

if TYPE_CHECKING:
    from meshctl.core.k8s.schema import Pod


class IPConfig(TypedDict, total=False):
    """One address of a result (SPEC.md "Success": ``ips``)."""

    address: str  # CIDR notation
    gateway: str
    interface: int


class Interface(TypedDict, total=False):
    """One interface of a result (``sandbox``: the netns path, for the pod's own)."""

    name: str
    mac: str
    sandbox: str


class Result(TypedDict, total=False):
    """A plugin's success result, as the previous plugin of the chain hands it on
    (``prevResult``); what meshctl reads of it (the rest passes through unread)."""

    cniVersion: str
    interfaces: list[Interface]
    ips: list[IPConfig]


class ErrorResult(TypedDict, total=False):
    """SPEC.md "Error": what a failed plugin prints."""

    cniVersion: str
    code: int
    msg: str
    details: str


class PluginEvent(TypedDict, total=False):
    """What the CNI plugin tells the ambient node agent about a sandbox (Istio's ``/cmdadd``
    body; ``/cmddel`` carries the first five keys): the agent reads it as untrusted JSON."""

    podName: str
    podNamespace: str
    podUid: str
    containerId: str
    netns: str
    ifname: str
    ips: list[str]  # the pod's addresses, from the previous plugin's result
    enroll: bool  # the plugin found the pod enrolled in ambient mode: capture it now
    pod: Pod  # the pod as the plugin read it (the agent's watch may lag)
