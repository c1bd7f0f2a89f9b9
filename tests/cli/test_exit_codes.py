"""docs/cli.md's exit codes, walked over the whole command tree: an input file that is missing,
malformed or binary is 2, a port in use is 1 with the same words everywhere, Ctrl-C is 130.

Each command of the tree is in ``RECIPES`` (a new command fails the walk until it is): the
arguments that bring it to its work without a cluster, and its input files. ``ztunnel run`` binds
Istio's fixed ports, so its port and Ctrl-C cases run in a namespace (tests/netns); the demo's
Ctrl-C and ``demo exec``'s 127/126 are in tests/netns/test_demo.py.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterator

import pytest
from typer import _click as click

from meshctl import cli
from meshctl.errors import EXIT_INTERRUPTED, EXIT_RUNTIME, EXIT_USAGE
from tests.cli.test_conventions import COMMANDS, Node, _long, _parse
from tests.harness.cli import MESHCTL
from tests.harness.cni import fake_node
from tests.harness.gateway import MINIMAL, free_offset

TOKENS = "tok,system:serviceaccount:default:a,u1\n"
BINARY = bytes(range(256)) * 4
MALFORMED = "kind: [unclosed\n  - {: ::\n"
MANIFEST = "apiVersion: v1\nkind: Pod\nmetadata: {name: a}\nspec: {containers: [{name: a}]}\n"


@dataclasses.dataclass(frozen=True)
class Recipe:
    """How a command reaches its work here: ``args`` (with ``{places}``), the input files it
    reads at start (option -> a valid file's place), the options of a daemon's ports, and the
    arguments that keep it busy until a signal (None: it ends at once)."""

    args: tuple[str, ...] = ()
    files: dict[str, str] = dataclasses.field(default_factory=dict)
    ports: tuple[str, ...] = ()
    blocking: tuple[str, ...] | None = None


DAEMON_CERT = ("--tls-cert", "{cert}", "--tls-key", "{key}")
CNI_NODE = (
    *("--cni-bin-dir", "{node}/bin", "--cni-conf-dir", "{node}/net.d", "--run-dir", "{node}/run"),
    *("--service-account-dir", "{node}/sa", "--kube-server", "https://127.0.0.1:6443"),
    *("--readiness-address", "127.0.0.1:{port}", "--poll-interval", "0.2"),
)
DEAD_CLUSTER = ("--kubeconfig", "{kubeconfig}")
CONTROL_PLANE = (
    *("--grpc-address", "127.0.0.1:0", "--webhook-address", "127.0.0.1:0"),
    *("--monitoring-address", "127.0.0.1:0"),
)

RECIPES: dict[str, Recipe] = {
    "version": Recipe(),
    "completion": Recipe(("bash",)),
    "inject": Recipe(("-f", "{manifest}"), files={"-f": "manifest"}, blocking=("-f", "-")),
    "inject webhook": Recipe(
        (*DAEMON_CERT, "--port", "{port}", "--address", "127.0.0.1"),
        files={"--tls-cert": "cert", "--tls-key": "key"},
        ports=("--port",),
        blocking=(),
    ),
    "inject webhook-config": Recipe(
        ("--ca-bundle", "{cert}", "--url", "https://h:15017/inject"), files={"--ca-bundle": "cert"}
    ),
    "ztunnel run": Recipe(
        ("--workload", "a/b/c", "--cert-dir", "{certs}", "--local-config", "{local}"),
        # Binary: the hostile-input tier (issue 24's other half). --xds-root-ca, --ca-root and
        # --token-file are read on each use (a pod's mounts may come later): retried, logged.
        files={"--local-config": "local"},
    ),
    "ztunnel certs": Recipe(("--out", "{tmp}/out", "--workload", "a/b/c")),
    "ztunnel wait": Recipe(("--port", "{port}", "--timeout", "1s"), blocking=("--timeout", "1h")),
    "ztunnel manifest": Recipe(),
    "cni install": Recipe(CNI_NODE, ports=("--readiness-address",), blocking=()),
    "cni uninstall": Recipe(
        ("--cni-bin-dir", "{node}/bin", "--cni-conf-dir", "{node}/net.d", "--run-dir", "{tmp}/r")
    ),
    "cni manifest": Recipe(),
    "controlplane run": Recipe(
        (*CONTROL_PLANE, "--readiness-address", "127.0.0.1:{port}"),
        # Bound at once (gRPC and the webhook once the CA is read from the cluster).
        ports=("--readiness-address",),
        # It waits for the cluster, so no listening line: interrupted while it waits.
        blocking=(*CONTROL_PLANE, "--readiness-address", "127.0.0.1:0"),
    ),
    "controlplane ca": Recipe(
        ("--ca-dir", "{tmp}/ca", "--tokens", "{tokens}", "--grpc-address", "127.0.0.1:{port}"),
        # Binary --tokens: the hostile-input tier (issue 24's other half).
        files={"--tokens": "tokens"},
        ports=("--grpc-address",),
        blocking=(),
    ),
    "controlplane manifest": Recipe(),
    "demo": Recipe(),  # its runs need root and namespaces: tests/netns/test_demo.py
    "demo down": Recipe(("--state-dir", "{tmp}/none")),
    "demo exec": Recipe(("--state-dir", "{tmp}/none", "client", "--", "true")),
    "install": Recipe(("--dry-run",), files={"-f": "values"}, blocking=("--dry-run", "-f", "-")),
    "uninstall": Recipe(("-y",)),
    "manifest": Recipe(),
    "manifest generate": Recipe(files={"-f": "values"}, blocking=("-f", "-")),
    "manifest profiles": Recipe(),
    "verify": Recipe(("--pre",), files={"-f": "values"}, blocking=("--pre", "-f", "-")),
    "iptables": Recipe(),
    "iptables render": Recipe(),
    "iptables apply": Recipe(("--dry-run", "--netns", "{tmp}/no-netns")),
    "iptables check": Recipe(("--netns", "{tmp}/no-netns")),
    "iptables clean": Recipe(("--dry-run", "--netns", "{tmp}/no-netns")),
    "iptables trace": Recipe(("--dst", "10.0.0.1:80")),
    "iptables validate": Recipe(("--netns", "{tmp}/no-netns")),
    "gateway run": Recipe(
        ("-f", "{gateway}", "--bind-address", "127.0.0.1", "--port-offset", "{offset}"),
        # Its own ports bind at start (a taken one: tests/cli/test_gateway_run.py).
        files={"-f": "gateway"},
        blocking=(),
    ),
    "gateway routes": Recipe(("-f", "{gateway}"), files={"-f": "gateway"}),
    "gateway explain": Recipe(("http://example.com/", "-f", "{gateway}"), files={"-f": "gateway"}),
    "gateway": Recipe(),
    "ztunnel": Recipe(),
    "cni": Recipe(),
    "controlplane": Recipe(),
    "image": Recipe(),
    "image build": Recipe(("--tree", "{tmp}", "--archive", "{tmp}/image.tar")),
    "image push": Recipe(
        ("127.0.0.1:{port}/m:1", "--from", "{archive}", "--ca-file", "{cert}"),
        files={"--from": "archive", "--ca-file": "cert"},
    ),
    "stat": Recipe(),
    "top": Recipe(("--once",)),
    "bug-report": Recipe(("-O", "{tmp}/report.tar.gz")),  # the dead cluster: one Error line
    "proxy-status": Recipe(),  # the root's dead --kubeconfig: it fails at its first request
    "proxy-config": Recipe(("workloads", "web-1")),
    "analyze": Recipe(
        ("--use-kube=false", "-f", "{manifest}"),
        files={"-f": "manifest"},
        blocking=("--use-kube=false", "-f", "-"),
    ),
    "tag": Recipe(),
    "tag set": Recipe(("prod", "--revision", "canary")),
    "tag list": Recipe(),
    "tag remove": Recipe(("prod",)),
    "upgrade": Recipe(("--dry-run",), files={"-f": "values"}, blocking=("--dry-run", "-f", "-")),
}
ROOT_FILES = {"--config": "settings"}  # the root's own input file, for every command


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture(scope="module")
def places(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """Valid inputs for every recipe, and a kubeconfig whose server nothing serves."""
    from datetime import UTC, datetime, timedelta

    from meshctl.core.pki import certs

    tmp_path = tmp_path_factory.mktemp("exit-codes")
    ca = certs.mint_root(trust_domain="cluster.local", now=datetime.now(UTC), ttl=timedelta(1))
    (tmp_path / "cert.pem").write_bytes(ca.cert_pem)
    (tmp_path / "key.pem").write_bytes(ca.key_pem)
    (tmp_path / "manifest.yaml").write_text(MANIFEST)
    (tmp_path / "values.yaml").write_text("revision: canary\n")
    (tmp_path / "settings.yaml").write_text("log-level: warning\n")
    (tmp_path / "tokens.csv").write_text(TOKENS)
    (tmp_path / "local.yaml").write_text("workloads: []\nservices: []\n")
    (tmp_path / "gateway.yaml").write_text(MINIMAL)
    (tmp_path / "node").mkdir()
    node = fake_node(tmp_path / "node")
    (node / "bin").mkdir()
    subprocess.run(
        [*MESHCTL, "ztunnel", "certs", "--out", str(tmp_path / "certs"), "--workload", "a/b/c"],
        check=True,
        capture_output=True,
        timeout=60,
    )
    server = f"https://127.0.0.1:{_free_port()}"
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": server}}],
                "users": [{"name": "u", "user": {"token": "x"}}],
                "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "c",
            }
        )
    )
    return {
        "tmp": str(tmp_path),
        "cert": str(tmp_path / "cert.pem"),
        "key": str(tmp_path / "key.pem"),
        "manifest": str(tmp_path / "manifest.yaml"),
        "values": str(tmp_path / "values.yaml"),
        "settings": str(tmp_path / "settings.yaml"),
        "tokens": str(tmp_path / "tokens.csv"),
        "local": str(tmp_path / "local.yaml"),
        "certs": str(tmp_path / "certs"),
        "node": str(node),
        "kubeconfig": str(kubeconfig),
        "port": str(_free_port()),
        "gateway": str(tmp_path / "gateway.yaml"),
        "offset": str(free_offset((80,))),
        "archive": str(_small_image(tmp_path / "image.tar")),
    }


def _small_image(path):
    from meshctl.image import oci

    layer = oci.Layer("one", (oci.file_bytes("/hello", b"hi\n"),))
    image = oci.Image(repository="localhost/t", tag="1", layers=(layer,), entrypoint=("/hello",))
    oci.write_archive(image, path)
    return path


def _argv(node: Node, args: tuple[str, ...], places: dict[str, str]) -> list[str]:
    cluster = [a.format(**places) for a in DEAD_CLUSTER]
    return [*cluster, *node.path, *(a.format(**places) for a in args)]


def _meshctl(argv: list[str], **kw) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "MESHCTL_CONFIG": "", "KUBECONFIG": ""}
    return subprocess.run(
        [*MESHCTL, *argv], capture_output=True, text=True, timeout=120, check=False, env=env, **kw
    )


def _one_error(done: subprocess.CompletedProcess[str]) -> str:
    lines = done.stderr.splitlines()
    errors = [line for line in lines if line.startswith("Error: ")]
    assert len(errors) == 1, done.stderr
    assert "Traceback" not in done.stderr
    assert "internal error" not in done.stderr
    return errors[0]


def test_every_command_of_the_tree_has_a_recipe():
    assert {n.id for n in COMMANDS} == set(RECIPES)


def test_every_file_a_command_reads_at_start_is_in_its_recipe():
    """An option that takes an existing file (or -f) must say how its bad input is tested."""
    for node in COMMANDS:
        for param in node.options:
            takes_file = type(_parse(param)).__name__ == "ExistingFile" or "-f" in param.opts
            if takes_file:
                key = "-f" if "-f" in param.opts else _long(param)
                assert key in RECIPES[node.id].files, f"meshctl {node.id} {key}"


FILE_CASES = [
    (node, option, place) for node in COMMANDS for option, place in RECIPES[node.id].files.items()
] + [(next(n for n in COMMANDS if n.id == "version"), "--config", "settings")]


def _with_file(node: Node, option: str, path: str, places: dict[str, str]) -> list[str]:
    recipe = RECIPES[node.id]
    args = list(_argv(node, recipe.args, places))
    if option == "--config":
        return ["--config", path, *args]
    valid = places[recipe.files[option]]
    if valid in args:
        args[args.index(valid)] = path
    else:
        args += [option, path]
    return args


@pytest.mark.parametrize(
    ("node", "option", "place"), FILE_CASES, ids=[f"{n.id} {o}" for n, o, _ in FILE_CASES]
)
def test_an_input_file_that_cannot_be_used_is_a_usage_error(node, option, place, places, tmp_path):
    bad = tmp_path / "bad"
    bad.mkdir()
    missing = str(bad / "missing.yaml")
    done = _meshctl(_with_file(node, option, missing, places))
    assert done.returncode == EXIT_USAGE, done.stderr
    assert missing in _one_error(done)
    kinds = {"malformed": MALFORMED.encode()}
    if (node.id, option) not in BINARY_ELSEWHERE:
        kinds["binary"] = BINARY
    for kind, data in kinds.items():
        path = bad / f"{kind}.yaml"
        path.write_bytes(data)
        done = _meshctl(_with_file(node, option, str(path), places))
        assert done.returncode == EXIT_USAGE, f"{kind}: {done.stderr}"
        _one_error(done)


# Binary input to these readers is issue 24's other half (bounded readers, the hostile-input tier).
BINARY_ELSEWHERE = {
    ("ztunnel run", "--local-config"),
    ("controlplane ca", "--tokens"),
    ("version", "--config"),
}


PORT_CASES = [(n, o) for n in COMMANDS for o in RECIPES[n.id].ports]


@contextlib.contextmanager
def _taken(port: str) -> Iterator[None]:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", int(port)))
        holder.listen()
        yield


@pytest.mark.parametrize(("node", "option"), PORT_CASES, ids=[f"{n.id} {o}" for n, o in PORT_CASES])
def test_a_port_in_use_is_a_runtime_error_in_the_same_words(node, option, places):
    with _taken(places["port"]):
        done = _meshctl(_argv(node, RECIPES[node.id].args, places))
    assert done.returncode == EXIT_RUNTIME, done.stderr
    error = _one_error(done)
    assert f"127.0.0.1:{places['port']}" in error
    assert error.endswith("the port is already in use"), error


def test_the_port_cases_cover_every_daemon_with_a_port():
    daemons = {n.id for n, _ in PORT_CASES} | {"ztunnel run"}  # in a namespace: tests/netns
    assert daemons == {
        "inject webhook",
        "controlplane run",
        "controlplane ca",
        "cni install",
        "ztunnel run",
    }


# --- Ctrl-C ------------------------------------------------------------------------------------


# Groups that only hold subcommands: nothing of theirs runs, so nothing to interrupt.
GROUPS_ONLY = {"ztunnel", "cni", "controlplane", "iptables", "manifest", "gateway", "image", "tag"}
RUNNABLE = [n for n in COMMANDS if n.id not in GROUPS_ONLY]


@pytest.mark.parametrize("node", RUNNABLE, ids=[n.id for n in RUNNABLE])
def test_ctrl_c_in_any_command_exits_130(node, places, monkeypatch, capsys):
    """Wherever the interrupt lands in a command's own code, the root answers 130, silently."""
    original = click.Context.invoke
    reached = []

    def interrupted(self, callback, *args, **kwargs):
        if self.command_path == f"meshctl {node.id}":
            reached.append(node.id)
            raise KeyboardInterrupt
        return original(self, callback, *args, **kwargs)

    monkeypatch.setattr(click.Context, "invoke", interrupted)
    code = cli.main(_argv(node, RECIPES[node.id].args, places))
    _, err = capsys.readouterr()
    assert reached == [node.id]  # the command itself was running when Ctrl-C came
    assert code == EXIT_INTERRUPTED, err
    assert err == ""


BLOCKING = [n for n in COMMANDS if RECIPES[n.id].blocking is not None]


@pytest.mark.parametrize("node", BLOCKING, ids=[n.id for n in BLOCKING])
def test_ctrl_c_while_a_command_works_or_serves_exits_130(node, places):
    recipe = RECIPES[node.id]
    args = recipe.args if recipe.blocking == () else recipe.blocking
    env = {**os.environ, "MESHCTL_CONFIG": "", "KUBECONFIG": ""}
    proc = subprocess.Popen(
        [*MESHCTL, "--log-level", "info", *_argv(node, args, places)],
        stdin=subprocess.PIPE,  # open and silent: a command reading -f - waits on it
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env=env,
    )
    try:
        _until_busy(proc, recipe)
        proc.send_signal(signal.SIGINT)
        code = proc.wait(30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    err = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
    assert code == EXIT_INTERRUPTED, err
    assert "Traceback" not in err


def _until_busy(proc: subprocess.Popen[bytes], recipe: Recipe) -> None:
    """A daemon: until its listening line; anything else: until it has started its work."""
    if recipe.blocking != ():
        time.sleep(3)  # reading stdin, or polling: well past start-up
        assert proc.poll() is None, proc.stderr.read() if proc.stderr else b""
        return
    assert proc.stderr is not None
    os.set_blocking(proc.stderr.fileno(), False)
    seen = b""
    end = time.monotonic() + 60
    while b"listening on" not in seen:
        assert proc.poll() is None, seen.decode(errors="replace")
        assert time.monotonic() < end, seen.decode(errors="replace")
        seen += proc.stderr.read() or b""
        time.sleep(0.05)
    os.set_blocking(proc.stderr.fileno(), True)
