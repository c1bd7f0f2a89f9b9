"""CNI spec types: the request (env + stdin), the plugin's own config keys, results and errors.

Follows the CNI specification (SPEC.md, versions 0.3.1 to 1.1.0): "Parameters" (the CNI_*
environment variables), "Errors" and "Well-known Error Codes", "Network Configuration Lists"
(``prevResult``), and the ``VERSION``/``STATUS`` operations.
Invariants: ``parse_request`` either returns a complete, validated ``Request`` or raises
``CniError`` with the spec's code and a message naming the offending variable or key; the result
of ``ADD`` is the ``prevResult`` unchanged but for ``cniVersion``, which must be the config's.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Final, cast

from meshctl.core.k8s.layout import MESH_NAMESPACE
from meshctl.structured import InputError, Limits, load_json

if TYPE_CHECKING:
    from meshctl.core.k8s.cni.messages import ErrorResult, Result

SUPPORTED_VERSIONS: Final = ("0.3.1", "0.4.0", "1.0.0", "1.1.0")
LATEST_VERSION: Final = SUPPORTED_VERSIONS[-1]
COMMANDS: Final = ("ADD", "DEL", "CHECK", "VERSION", "STATUS")
PLUGIN_TYPE: Final = "meshctl-cni"  # the binary's name in the CNI bin dir and our entry's "type"

# Well-known error codes (SPEC.md "Error" section, 0-99 reserved).
INCOMPATIBLE_VERSION: Final = 1
UNSUPPORTED_FIELD: Final = 2
CONTAINER_UNKNOWN: Final = 3
INVALID_ENVIRONMENT: Final = 4
IO_FAILURE: Final = 5
DECODE_FAILURE: Final = 6
INVALID_CONFIG: Final = 7
TRY_AGAIN_LATER: Final = 11
NOT_AVAILABLE: Final = 50  # STATUS (1.1.0): the plugin cannot serve ADDs now
# Plugin-specific codes (100+ are free for plugins).
CAPTURE_FAILED: Final = 100  # the kernel refused the capture rules
BAD_ANNOTATIONS: Final = 101  # the pod asks for capture with values we cannot use
API_REFUSED: Final = 102  # the API server answered, but not with the pod (RBAC, not found)
RULES_MISSING: Final = 103  # CHECK: the pod's capture rules are not as they must be
INTERNAL: Final = 199  # a bug: details carry the exception

DEFAULT_RUN_DIR: Final = "/var/run/meshctl-cni"
KUBECONFIG_NAME: Final = "meshctl-cni-kubeconfig"
LOG_NAME: Final = "meshctl-cni.log"
LOG_SOCKET_NAME: Final = "log.sock"
PLUGIN_EVENT_SOCKET_NAME: Final = "pluginevent.sock"  # the node agent's (ambient mode)
# How the node agent's answer to a DEL begins when it released the pod (its rules removed).
AGENT_RELEASED: Final = "released"
AGENT_UNAVAILABLE: Final = 104  # ambient: the node agent could not capture the pod
DEFAULT_EXCLUDED_NAMESPACES: Final = ("kube-system", MESH_NAMESPACE)
_REQUIRED_ENV: Final = {
    "ADD": ("CNI_CONTAINERID", "CNI_NETNS", "CNI_IFNAME"),
    "CHECK": ("CNI_CONTAINERID", "CNI_NETNS", "CNI_IFNAME"),
    "DEL": ("CNI_CONTAINERID", "CNI_IFNAME"),
    "VERSION": (),
    "STATUS": (),
}
_POD_ARGS: Final = ("K8S_POD_NAMESPACE", "K8S_POD_NAME")
CONFIG_SOURCE: Final = "network config on stdin"  # how the bounded reader names it


class CniError(Exception):
    """A failure reported to the runtime as the spec's error JSON (exit code 1)."""

    def __init__(self, code: int, msg: str, details: str = "") -> None:
        super().__init__(msg)
        self.code = code
        self.msg = msg
        self.details = details

    def to_json(self, cni_version: str = LATEST_VERSION) -> str:
        body: ErrorResult = {"cniVersion": cni_version, "code": self.code, "msg": self.msg}
        if self.details:
            body["details"] = self.details
        return json.dumps(body)


@dataclass(frozen=True, slots=True, kw_only=True)
class PluginConfig:
    """Our keys in the network config (written by ``meshctl cni install``); unknown keys ignored."""

    run_dir: str = DEFAULT_RUN_DIR
    kubeconfig: str = ""  # default: <run_dir>/meshctl-cni-kubeconfig
    # No API server: pods and namespaces from this file (``meshctl.core.k8s.podlist``) instead.
    local_inventory: str = ""
    exclude_namespaces: tuple[str, ...] = DEFAULT_EXCLUDED_NAMESPACES
    log_level: str = "info"
    iptables_backend: str = "iptc"  # in-process libiptc: no fork/exec on the pod start path
    pod_lookup_timeout: float = 5.0  # total time to find the pod (it may lag the sandbox)
    api_timeout: float = 2.0  # one request
    ambient_enabled: bool = False  # Istio's key: hand pods enrolled in ambient mode to the agent
    agent_timeout: float = 15.0  # the agent's whole enrollment of one pod

    @property
    def kubeconfig_path(self) -> str:
        return self.kubeconfig or f"{self.run_dir.rstrip('/')}/{KUBECONFIG_NAME}"


@dataclass(frozen=True, slots=True, kw_only=True)
class Request:
    """One invocation: the command, its CNI_* parameters and the network config."""

    command: str
    cni_version: str
    container_id: str = ""
    netns: str = ""
    ifname: str = ""
    args: Mapping[str, str] = field(default_factory=dict)
    config: Mapping[str, object] = field(default_factory=dict)  # the JSON on stdin
    prev_result: Result | None = None
    plugin: PluginConfig = field(default_factory=PluginConfig)

    @property
    def pod_namespace(self) -> str:
        return self.args.get("K8S_POD_NAMESPACE", "")

    @property
    def pod_name(self) -> str:
        return self.args.get("K8S_POD_NAME", "")

    @property
    def pod(self) -> str:
        return f"{self.pod_namespace}/{self.pod_name}"


def error_version(env: Mapping[str, str], stdin: bytes, limits: Limits = Limits()) -> str:  # noqa: B008
    """The ``cniVersion`` an error JSON should carry: the config's when usable, else the latest."""
    config = readable_config(stdin, limits)
    version = config.get("cniVersion") if config is not None else None
    return version if version in SUPPORTED_VERSIONS else LATEST_VERSION


def readable_config(stdin: bytes, limits: Limits = Limits()) -> dict[str, object] | None:  # noqa: B008
    """The config on ``stdin`` when it is a JSON object within ``limits``, else None (for
    reporting a request that was refused)."""
    try:
        config = load_json(stdin or b"{}", CONFIG_SOURCE, limits)
    except InputError:
        return None
    return config if isinstance(config, dict) else None


def parse_request(env: Mapping[str, str], stdin: bytes, limits: Limits = Limits()) -> Request:  # noqa: B008
    """Validate the CNI_* variables and the config on stdin (read within ``limits``: size and
    nesting); raise ``CniError`` on bad input."""
    command = env.get("CNI_COMMAND", "")
    if not command:
        raise CniError(INVALID_ENVIRONMENT, "CNI_COMMAND is not set")
    if command not in COMMANDS:
        raise CniError(
            INVALID_ENVIRONMENT,
            f"CNI_COMMAND: unknown command {command!r}",
            f"supported: {', '.join(COMMANDS)}",
        )
    if command == "VERSION":
        # The runtime may send only {"cniVersion": ...} or nothing at all.
        config = _decode(stdin, limits) if stdin.strip() else {}
        asked = config.get("cniVersion")
        version = asked if asked in SUPPORTED_VERSIONS else LATEST_VERSION
        return Request(command=command, cni_version=version, config=config)
    config = _decode(stdin, limits)
    version = _config_version(config)
    if command == "CHECK" and _older(version, "0.4.0"):
        raise CniError(
            INCOMPATIBLE_VERSION, f"CHECK needs cniVersion 0.4.0 or later, not {version}"
        )
    if command == "STATUS" and _older(version, "1.1.0"):
        raise CniError(INCOMPATIBLE_VERSION, f"STATUS needs cniVersion 1.1.0, not {version}")
    missing = [name for name in _REQUIRED_ENV[command] if not env.get(name)]
    if missing:
        raise CniError(INVALID_ENVIRONMENT, f"{command} needs {', '.join(missing)} (not set)")
    args = parse_cni_args(env.get("CNI_ARGS", ""))
    if command in ("ADD", "CHECK"):
        absent = [key for key in _POD_ARGS if not args.get(key)]
        if absent:
            raise CniError(
                INVALID_ENVIRONMENT,
                f"CNI_ARGS lacks {', '.join(absent)}",
                "meshctl-cni runs for Kubernetes pods: the runtime must pass the pod's namespace "
                "and name in CNI_ARGS",
            )
    prev = config.get("prevResult")
    if prev is not None and not isinstance(prev, dict):
        raise CniError(INVALID_CONFIG, f"prevResult must be an object, not {type(prev).__name__}")
    if prev is None and command in ("ADD", "CHECK"):
        raise CniError(
            INVALID_CONFIG,
            "missing prevResult: meshctl-cni is a chained plugin",
            "list it after the plugin that creates the pod's interface (e.g. bridge, calico)",
        )
    return Request(
        command=command,
        cni_version=version,
        container_id=env.get("CNI_CONTAINERID", ""),
        netns=env.get("CNI_NETNS", ""),
        ifname=env.get("CNI_IFNAME", ""),
        args=args,
        config=config,
        prev_result=cast("Result | None", prev),
        plugin=plugin_config(config),
    )


def _config_version(config: Mapping[str, object]) -> str:
    """The config's ``cniVersion``, one we support (codes 7 and 1 say what is wrong)."""
    version = config.get("cniVersion")
    if version is None or version == "":
        raise CniError(INVALID_CONFIG, "network config has no cniVersion")
    if not isinstance(version, str):
        raise CniError(
            INVALID_CONFIG,
            f'cniVersion must be a string such as "{LATEST_VERSION}", not '
            f"{_json_type(version)} {json.dumps(version)[:40]}",
        )
    if version not in SUPPORTED_VERSIONS:
        raise CniError(
            INCOMPATIBLE_VERSION,
            f"incompatible CNI version {version!r}",
            f"meshctl-cni supports {', '.join(SUPPORTED_VERSIONS)}",
        )
    return version


def parse_cni_args(text: str) -> dict[str, str]:
    """``K=V;K2=V2`` (CNI_ARGS) as a mapping; unknown keys kept (callers ignore them)."""
    out: dict[str, str] = {}
    for pair in filter(None, text.split(";")):
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise CniError(INVALID_ENVIRONMENT, f"CNI_ARGS: {pair!r} is not KEY=VALUE")
        out[key] = value
    return out


def plugin_config(config: Mapping[str, object]) -> PluginConfig:
    """Our keys from the network config, type-checked (code 7 names the key and the value)."""
    default = PluginConfig()
    strings = {
        key: _string(config, key) if key in config else getattr(default, key)
        for key in ("run_dir", "kubeconfig", "local_inventory", "log_level", "iptables_backend")
    }
    exclude = default.exclude_namespaces
    if "exclude_namespaces" in config:
        raw = config["exclude_namespaces"]
        if not isinstance(raw, list) or not all(isinstance(i, str) for i in raw):
            raise CniError(INVALID_CONFIG, f"exclude_namespaces must be a list of names: {raw!r}")
        exclude = tuple(raw)
    ambient = default.ambient_enabled
    if "ambient_enabled" in config:
        raw = config["ambient_enabled"]
        if not isinstance(raw, bool):
            raise CniError(INVALID_CONFIG, f"ambient_enabled must be true or false: {raw!r}")
        ambient = raw
    seconds: dict[str, float] = {}
    for key in ("pod_lookup_timeout", "api_timeout", "agent_timeout"):
        raw = config.get(key, getattr(default, key))
        if isinstance(raw, bool) or not isinstance(raw, int | float) or raw <= 0:
            raise CniError(INVALID_CONFIG, f"{key} must be a positive number: {raw!r}")
        seconds[key] = float(raw)
    if strings["log_level"] not in ("debug", "info", "warning", "error"):
        raise CniError(INVALID_CONFIG, f"log_level: invalid value {strings['log_level']!r}")
    if strings["iptables_backend"] not in ("auto", "nft", "legacy", "iptc"):
        raise CniError(
            INVALID_CONFIG, f"iptables_backend: invalid value {strings['iptables_backend']!r}"
        )
    return PluginConfig(
        run_dir=strings["run_dir"],
        kubeconfig=strings["kubeconfig"],
        local_inventory=strings["local_inventory"],
        log_level=strings["log_level"],
        iptables_backend=strings["iptables_backend"],
        exclude_namespaces=exclude,
        ambient_enabled=ambient,
        pod_lookup_timeout=seconds["pod_lookup_timeout"],
        api_timeout=seconds["api_timeout"],
        agent_timeout=seconds["agent_timeout"],
    )


def add_result(request: Request) -> str:
    """The ADD output: ``prevResult`` passed through, in the config's ``cniVersion``."""
    prev = dict(request.prev_result or {})
    prev.pop("cniVersion", None)
    return json.dumps({"cniVersion": request.cni_version, **prev})


def version_result(request: Request) -> str:
    return json.dumps(
        {"cniVersion": request.cni_version, "supportedVersions": list(SUPPORTED_VERSIONS)}
    )


def _decode(stdin: bytes, limits: Limits) -> dict[str, object]:
    if not stdin.strip():
        raise CniError(
            DECODE_FAILURE,
            "no network config on stdin (it is empty)",
            "the container runtime passes the config as JSON on stdin",
        )
    try:
        data = load_json(stdin, CONFIG_SOURCE, limits)
    except InputError as exc:
        raise CniError(
            DECODE_FAILURE, "failed to decode the network config on stdin", exc.problem
        ) from None
    if not isinstance(data, dict):
        raise CniError(
            DECODE_FAILURE, f"network config must be a JSON object, not {_json_type(data)}"
        )
    return data


def _json_type(value: object) -> str:
    names = {bool: "a boolean", int: "a number", float: "a number", str: "a string"}
    names |= {list: "an array", dict: "an object", type(None): "null"}
    return names.get(type(value), type(value).__name__)


def _string(config: Mapping[str, object], key: str) -> str:
    value = config[key]
    if not isinstance(value, str):
        raise CniError(INVALID_CONFIG, f"{key} must be a string: {value!r}")
    return value


def _older(version: str, than: str) -> bool:
    return SUPPORTED_VERSIONS.index(version) < SUPPORTED_VERSIONS.index(than)
