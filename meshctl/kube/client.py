"""Connecting to the Kubernetes API: kubeconfig file and context, or in-cluster config.

Invariant: every failure to build a client is a ``KubeError`` or ``ConfigError`` with a one-line
message naming the kubeconfig, context or in-cluster source; nothing from the ``kubernetes``
package escapes except inside ``Kube`` (used by the verb modules of this package only).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from meshctl.errors import ConfigError, KubeError

DEFAULT_KUBECONFIG = Path("~/.kube/config")
SERVICE_HOST_ENV = "KUBERNETES_SERVICE_HOST"
DEFAULT_NAMESPACE = "default"
SERVICE_ACCOUNT_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
# Long-running watches each hold a pooled connection for minutes; the default pool (5 per core)
# would leave short requests queueing behind them or opening throwaway connections.
POOL_SIZE = 32


@dataclass(frozen=True, slots=True, kw_only=True)
class KubeSettings:
    """Where to find the cluster; ``kubeconfig`` may be a ``:``-separated list like kubectl's."""

    kubeconfig: str | None = None
    context: str | None = None
    request_timeout: float = 30.0  # seconds per request (kubectl's --request-timeout); 0: none


@dataclass(frozen=True, slots=True)
class Kube:
    """A connected client. ``api`` is a ``kubernetes.client.ApiClient``; only kube/ touches it."""

    api: Any
    source: str  # "kubeconfig <path> (context <name>)" or "in-cluster", for messages
    request_timeout: float
    # The context's namespace (kubectl's default for -n): the kubeconfig context's `namespace`,
    # in a pod the service account's, else "default".
    namespace: str = DEFAULT_NAMESPACE

    @property
    def timeout(self) -> float | None:
        """What to pass as ``_request_timeout``: None waits forever (``--request-timeout 0``)."""
        return self.request_timeout or None

    @property
    def server(self) -> str:
        return str(self.api.configuration.host)


def connect(settings: KubeSettings, env: Mapping[str, str] | None = None) -> Kube:
    """A client from ``--kubeconfig``/``--context``, else in-cluster config, else ~/.kube/config."""
    env = os.environ if env is None else env
    # Deferred: importing the kubernetes package costs ~0.3 s; only kube-facing commands pay it.
    from kubernetes import client, config
    from kubernetes.config.config_exception import ConfigException

    if settings.kubeconfig is None and settings.context is None and env.get(SERVICE_HOST_ENV):
        try:
            configuration = client.Configuration()
            config.load_incluster_config(client_configuration=configuration)
            _one_attempt(configuration)
        except ConfigException as exc:
            raise KubeError(
                f"in-cluster config unusable: {exc}",
                hint="mount the service-account token or pass --kubeconfig",
            ) from exc
        configuration.connection_pool_maxsize = POOL_SIZE
        return Kube(
            client.ApiClient(configuration),
            "in-cluster",
            settings.request_timeout,
            _pod_namespace(SERVICE_ACCOUNT_NAMESPACE),
        )

    paths = _kubeconfig_paths(settings.kubeconfig)
    for path in paths:
        if not path.is_file() or not os.access(path, os.R_OK):
            raise ConfigError(
                f"kubeconfig {path} is not a readable file",
                hint="pass --kubeconfig PATH or set KUBECONFIG to a readable kubeconfig",
            )
    documents = [_read_kubeconfig(path) for path in paths]
    source = ":".join(str(p) for p in paths)
    try:
        configuration = client.Configuration()
        if len(paths) == 1:
            _load_one(documents[0], paths[0], settings.context, configuration)
        else:  # the package merges several files (KUBECONFIG=a:b), reading them again
            config.load_kube_config(
                config_file=source, context=settings.context, client_configuration=configuration
            )
    except ConfigException as exc:
        raise ConfigError(
            f"kubeconfig {source}: {exc}", hint="check the file and the --context name"
        ) from exc
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        # The loader raises these for structurally broken files (e.g. YAML that is a list).
        raise ConfigError(
            f"kubeconfig {source} is malformed: {type(exc).__name__}: {exc}",
            hint="compare it with 'kubectl config view'",
        ) from exc
    except Exception as exc:  # the YAML parser's own errors, without importing yaml here
        raise ConfigError(
            f"kubeconfig {source} cannot be parsed: {exc}",
            hint="compare it with 'kubectl config view'",
        ) from exc
    _one_attempt(configuration)
    configuration.connection_pool_maxsize = POOL_SIZE
    where = f"kubeconfig {source}" + (f" (context {settings.context})" if settings.context else "")
    return Kube(
        client.ApiClient(configuration),
        where,
        settings.request_timeout,
        context_namespace(documents, settings.context),
    )


def context_namespace(documents: list[Any], context: str | None) -> str:
    """The namespace of the context in use, as kubectl picks it: ``--context`` or the first
    ``current-context`` set among the files, its first definition among the files."""
    dicts = [d for d in documents if isinstance(d, dict)]
    if context is None:
        context = next((d["current-context"] for d in dicts if d.get("current-context")), None)
    for document in dicts:
        for entry in document.get("contexts") or []:
            if isinstance(entry, dict) and entry.get("name") == context:
                body = entry.get("context")
                namespace = body.get("namespace") if isinstance(body, dict) else None
                return namespace if isinstance(namespace, str) and namespace else DEFAULT_NAMESPACE
    return DEFAULT_NAMESPACE


def _pod_namespace(path: Path) -> str:
    """The namespace of the pod this runs in (its service account's), else ``default``."""
    try:
        namespace = path.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError):
        return DEFAULT_NAMESPACE
    return namespace or DEFAULT_NAMESPACE


def _read_kubeconfig(path: Path) -> Any:
    """The kubeconfig by the bounded reader: an alias bomb or runaway nesting is refused, YAML
    errors are one line, and libyaml reads it (the kubernetes package's pure-Python parser
    takes seconds over a large file)."""
    from meshctl import inputs, yamlread
    from meshctl.structured import InputError

    limits = inputs.limits()
    try:
        return yamlread.load_yaml(inputs.read_bytes(path, str(path), limits), str(path), limits)
    except OSError as exc:
        raise ConfigError(
            f"kubeconfig {path}: {exc.strerror or exc}",
            hint="pass --kubeconfig PATH or set KUBECONFIG to a readable kubeconfig",
        ) from exc
    except InputError as exc:
        raise ConfigError(exc.message, hint=exc.hint) from exc


def _load_one(data: Any, path: Path, context: str | None, configuration: Any) -> None:
    """One kubeconfig already read: the package's loader over it, relative certificate paths
    taken from the file's folder (as the package does when it reads the file itself)."""
    from kubernetes.config.config_exception import ConfigException
    from kubernetes.config.kube_config import KubeConfigLoader

    if data is None:
        raise ConfigException(f"Invalid kube-config. {path} file is empty")
    loader = KubeConfigLoader(
        config_dict=data,
        active_context=context,
        config_base_path=str(path.expanduser().resolve().parent),
    )
    loader.load_and_set(configuration)


def _one_attempt(configuration: Any) -> None:
    """One try per request: urllib3's default retries turned a server that does not answer into
    four timeouts in a row (40 s at 10 s each) and printed a warning per retry. A command fails
    once, with one line; a controller's loop retries on its own terms."""
    configuration.retries = False


def _kubeconfig_paths(value: str | None) -> list[Path]:
    if value:
        return [Path(p).expanduser() for p in value.split(os.pathsep) if p]
    return [DEFAULT_KUBECONFIG.expanduser()]
