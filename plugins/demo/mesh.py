"""The mesh parts of the demo: identities, the workloads file, capture rules, proxies, apps.

Owns starting the product's own processes inside the pod namespaces and talking to them there:
``meshctl iptables apply`` (the sidecar capture rules, as istio-init applies them),
``meshctl ztunnel run`` per meshed pod (the proxy as gid 1337, which the rules exempt), the demo
apps (``meshctl demo-app``), and the proxies' admin, readiness and metrics ports read from inside
each pod. Identities: SPIFFE certificates for ``spiffe://cluster.local/ns/NS/sa/SA`` signed by a
development root minted for this run (the ``ztunnel certs`` layout). Invariants: every process is
forked from a thread inside its pod's namespace (so it never runs in the host's), its output
goes to a log file in the state directory, and the workloads file is replaced atomically (the
proxies poll it: they never read half of one).
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import socket
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import yaml

from meshctl.core.pki.identity import SpiffeId
from meshctl.errors import MeshctlError
from meshctl.net import netns
from meshctl.process import self_command

from .node import Pod

if TYPE_CHECKING:
    from meshctl.core.mesh.localconfig import LocalConfig
    from meshctl.core.wire.dump import ConfigDump

TRUST_DOMAIN = "cluster.local"
PROXY_GID = 1337
APP_PORT = 8080
CA_PORT = 15012


def identity(pod: Pod) -> SpiffeId:
    return SpiffeId(TRUST_DOMAIN, pod.namespace, pod.name)


Where = Pod | netns.NetnsRef  # a pod's namespace, or the node's (the node proxy, the agent)


def _ref(where: Where) -> netns.NetnsRef:
    return where.ref if isinstance(where, Pod) else where


def write_tokens(
    folder: Path, accounts: Sequence[tuple[str, str, str]]
) -> tuple[Path, dict[str, Path]]:
    """The CA's token file (kube-apiserver's --token-auth-file format) and one token file per
    ``(name, namespace, service account)``, as a projected service-account token would be
    mounted; name -> its token file."""
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    lines, files = [], {}
    for name, namespace, account in accounts:
        token = secrets.token_urlsafe(32)
        lines.append(f"{token},system:serviceaccount:{namespace}:{account},{name}")
        path = folder / f"{name}.token"
        path.write_text(token)
        path.chmod(0o640)
        os.chown(path, -1, PROXY_GID)  # a sidecar runs as gid 1337 and reads it
        files[name] = path
    table = folder / "tokens.csv"
    table.write_text("".join(f"{line}\n" for line in lines))
    table.chmod(0o600)
    return table, files


def start_ca(
    node: netns.NetnsRef,
    gateway: str,
    folder: Path,
    tokens: Path,
    log: Path,
    *,
    node_accounts: Sequence[str] = (),
) -> subprocess.Popen[bytes]:
    """``meshctl controlplane ca`` in the node namespace, on the bridge's address: the pods
    reach it as they would reach the control plane's Service; ``node_accounts`` may
    impersonate (the node proxy's, in ambient mode)."""
    argv = self_command(
        "controlplane",
        "ca",
        "--ca-dir",
        str(folder),
        "--tokens",
        str(tokens),
        "--grpc-address",
        f"{gateway}:{CA_PORT}",
        "--serving-names",
        gateway,
        "--trust-domain",
        TRUST_DOMAIN,
        *(("--trusted-node-accounts", ",".join(node_accounts)) if node_accounts else ()),
    )
    with log.open("ab") as out, netns.entered(node):
        return subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=out, stderr=out, start_new_session=True
        )


def wait_ca(node: netns.NetnsRef, gateway: str, proc: subprocess.Popen[bytes], log: Path) -> None:
    end = time.monotonic() + 30
    while time.monotonic() < end:
        if proc.poll() is not None:
            tail = log.read_text(errors="replace").strip().splitlines()[-1:] or ["(no output)"]
            raise MeshctlError(
                f"the CA exited {proc.returncode}: {tail[0][:300]}", hint=f"see {log}"
            )
        with netns.entered(node):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        with sock:
            if sock.connect_ex((gateway, CA_PORT)) == 0:
                return
        time.sleep(0.05)
    raise MeshctlError("the CA did not listen within 30s", hint=f"see {log}")


def workloads_doc(
    meshed: Sequence[Pod], unmeshed: Sequence[Pod], policies: Sequence[Mapping[str, object]] = ()
) -> LocalConfig:
    """ztunnel's local config (``LOCAL_XDS_PATH``): the pods, HBONE for meshed ones."""

    def one(pod: Pod, protocol: str) -> dict[str, object]:
        return {
            "uid": f"Kubernetes//Pod/{pod.namespace}/{pod.name}",
            "name": pod.name,
            "namespace": pod.namespace,
            "serviceAccount": pod.name,
            "workloadIps": [pod.ip],
            "protocol": protocol,
            "trustDomain": TRUST_DOMAIN,  # ztunnel reads a missing one as empty
            "clusterId": "Kubernetes",
            "services": {},  # ztunnel's reader requires it (no service is backed here)
        }

    return {
        "workloads": [one(p, "HBONE") for p in meshed] + [one(p, "TCP") for p in unmeshed],
        "services": [],
        "policies": [dict(p) for p in policies],
    }


def write_workloads(path: Path, doc: LocalConfig) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(yaml.safe_dump(dict(doc), sort_keys=False))
    tmp.chmod(0o644)
    tmp.replace(path)


def deny_policy(source: Pod, target: Pod) -> dict[str, object]:
    """An L4 DENY of ``source``'s identity to ``target``'s app port (Istio's AuthorizationPolicy
    as ztunnel's local config spells it)."""
    principal = str(identity(source)).removeprefix("spiffe://")
    return {
        "name": f"deny-{source.name}",
        "namespace": target.namespace,
        "scope": "Namespace",
        "action": "Deny",
        "rules": [[[{"principals": [{"Exact": principal}], "destinationPorts": [APP_PORT]}]]],
    }


def start_in(
    where: Where,
    argv: Sequence[str],
    log: Path,
    *,
    group: int | None = None,
    env: Mapping[str, str] | None = None,
) -> subprocess.Popen[bytes]:
    """Start ``argv`` inside the pod's (or node's) namespace, output to ``log``; own session (a
    Ctrl-C in the terminal reaches the demo, which stops them in order)."""
    with log.open("ab") as out, netns.entered(_ref(where)):
        return subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=out,
            env={**os.environ, **(env or {})},
            start_new_session=True,
            group=group,  # None: the demo's own, as are its supplementary groups
            extra_groups=None if group is None else [],
        )


def apply_capture(pod: Pod, log: Path) -> None:
    """The sidecar capture rules from the product's iptables engine, in the pod's namespace."""
    argv = self_command("iptables", "apply", "--netns", pod.sandbox)
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    log.write_text(done.stdout + done.stderr)
    if done.returncode != 0:
        raise MeshctlError(
            f"capture rules for pod {pod.name} failed: {done.stderr.strip()[-300:]}",
            hint=f"see {log}",
        )


def proxy_command(
    mode_args: Sequence[str], ca: tuple[str, Path, Path], cert_dir: Path, workloads: Path
) -> list[str]:
    """``meshctl ztunnel run MODE_ARGS`` with its certificates from the CA (``ca``: address,
    root, token) and its workloads from the local config. ``cert_dir`` (``<state>/certs/NAME``)
    is made and stays empty: files there would win over the CA. The proxy's run directory is
    ``<state>/run/NAME``, so what a proxy killed by a step or by teardown leaves goes with the
    state directory."""
    address, root, token = ca
    cert_dir.mkdir(parents=True, exist_ok=True)
    run_dir = cert_dir.parent.parent / "run" / cert_dir.name
    return self_command(
        "ztunnel",
        "run",
        *mode_args,
        "--cert-dir",
        str(cert_dir),
        "--run-dir",
        str(run_dir),
        "--ca-address",
        address,
        "--ca-root",
        str(root),
        "--token-file",
        str(token),
        "--local-config",
        str(workloads),
    )


def start_sidecar(
    pod: Pod, ca: tuple[str, Path, Path], cert_dir: Path, workloads: Path, log: Path
) -> subprocess.Popen[bytes]:
    """``meshctl ztunnel run`` for the pod, as gid 1337 (which its capture rules exempt);
    ``ca``: the CA's address, its root, the pod's token."""
    workload = ("--workload", f"{pod.namespace}/{pod.name}/{pod.name}")
    argv = proxy_command(workload, ca, cert_dir, workloads)
    return start_in(pod, argv, log, group=PROXY_GID, env={"MESHCTL_RELOAD_INTERVAL": "200ms"})


def http(
    where: Where, host: str, port: int, path: str, *, timeout: float = 3.0
) -> tuple[int | None, str]:
    """One HTTP/1.1 GET made from inside ``where`` (a pod's capture rules apply): status and
    body, or (None, why) when the connection failed."""
    try:
        with netns.entered(_ref(where)):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        with sock:
            sock.settimeout(timeout)
            sock.connect((host, port))
            request = f"GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n"
            sock.sendall(request.encode())
            data = b""
            while chunk := sock.recv(65536):
                data += chunk
    except OSError as exc:
        return None, exc.strerror or type(exc).__name__
    head, _, body = data.partition(b"\r\n\r\n")
    try:
        return int(head.split()[1]), body.decode(errors="replace")
    except (IndexError, ValueError):
        return None, "connection closed without an HTTP answer"


def wait_ready(
    where: Where, proc: subprocess.Popen[bytes], log: Path, timeout: float = 30, *, what: str = ""
) -> None:
    """Until the proxy's readiness (15021) answers 200, or a one-line error with its log;
    ``what`` names the proxy (default: the pod's)."""
    what = what or (f"the proxy of pod {where.name}" if isinstance(where, Pod) else "the proxy")
    wait_ok(where, ("127.0.0.1", 15021), "/healthz/ready", proc, log, what=what, timeout=timeout)


def wait_ok(
    where: Where,
    address: tuple[str, int],
    path: str,
    proc: subprocess.Popen[bytes],
    log: Path,
    *,
    what: str,
    timeout: float = 30,
) -> None:
    """Until ``GET path`` on ``address`` in ``where`` answers 200; a one-line error naming
    ``what`` (and its log's last line when ``proc`` exited) otherwise."""
    end = time.monotonic() + timeout
    last = "no answer"
    while time.monotonic() < end:
        if proc.poll() is not None:
            tail = log.read_text(errors="replace").strip().splitlines()[-1:] or ["(no output)"]
            raise MeshctlError(
                f"{what} exited {proc.returncode}: {tail[0][:300]}", hint=f"see {log}"
            )
        status, body = http(where, *address, path, timeout=1)
        if status == 200:
            return
        last = body.strip() or str(status)
        time.sleep(0.05)
    raise MeshctlError(f"{what} is not ready after {timeout:.0f}s: {last[:200]}", hint=f"see {log}")


def wait_app(pod: Pod, port: int, timeout: float = 15) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            with netns.entered(pod.ref):
                sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            with sock:
                sock.settimeout(1)
                sock.connect(("127.0.0.1", port))
        except OSError:
            time.sleep(0.05)
        else:
            return
    raise MeshctlError(f"the app in pod {pod.name} did not listen on {port}", hint="see its log")


def _label(labels: str, name: str) -> str:
    marker = f'{name}="'
    return labels.split(marker, 1)[1].split('"', 1)[0] if marker in labels else ""


def metrics(where: Where) -> dict[str, float]:
    """The proxy's ``istio_tcp_*`` metrics summed four ways: by ``name``, by
    ``name{response_flags}``, by ``name[connection_security_policy]`` and by
    ``name{response_flags}/reporter`` (empty: proxy down)."""
    status, text = http(where, "127.0.0.1", 15020, "/stats/prometheus", timeout=2)
    if status != 200:
        return {}
    sums: dict[str, float] = {}
    for line in text.splitlines():
        if not line.startswith("istio_tcp_"):
            continue
        name_labels, _, value = line.rpartition(" ")
        name, _, labels = name_labels.partition("{")
        try:
            number = float(value)
        except ValueError:
            continue
        flags = f"{name}{{{_label(labels, 'response_flags')}}}"
        keys = {name, flags, f"{flags}/{_label(labels, 'reporter')}"}
        keys.add(f"{name}[{_label(labels, 'connection_security_policy')}]")
        for key in keys:
            sums[key] = sums.get(key, 0.0) + number
    return sums


def config_dump(where: Where) -> ConfigDump:
    """The proxy's ``/config_dump`` (empty when it does not answer)."""
    status, text = http(where, "127.0.0.1", 15000, "/config_dump", timeout=5)
    if status != 200:
        return {}
    data: ConfigDump = json.loads(text)
    return data


def kill_tree(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL a proxy and its data-plane children at once (what a crash or OOM kill does)."""
    children = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == proc.pid:
                children.append(int(entry.name))
    proc.kill()
    for pid in children:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    proc.wait(5)
