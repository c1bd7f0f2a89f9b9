"""Every command that reads a file, stdin or an env var a user controls, fed the hostile corpus.

For each (reader, corpus item): the exit code is the one docs/cli.md gives for refused input of
that kind (or 0 where the item is valid input for it, such as an empty settings file), the first
stderr line is ``Error: ...``, there is no traceback and no ``internal error``, and the command
is done within 2 s and 200 MiB (its own CPU time and peak RSS, measured by ``run_measured``: the
work the input made it do, whatever else the machine runs; the wall clock only has to show it did
not hang). The CNI plugin answers in its own protocol instead: the spec's error JSON on stdout,
never code 199 (our bug).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from meshctl.core.k8s.cni import spec
from tests.harness.cni import PREV_RESULT, NodeAgent, install_launcher
from tests.harness.measured import MESHCTL, Measured, run_measured
from tests.hostile.corpus import NAMES, write_corpus

SECONDS = 2.0  # CPU
WALL_SECONDS = 15.0  # no hang, on a loaded machine
MIB = 200.0
EMPTY = frozenset({"empty", "blank", "many-empty-documents"})  # valid where nothing is needed


@dataclass(frozen=True)
class Place:
    """Where the readers' other inputs live (certificates, CNI directories), made once."""

    root: Path
    corpus: dict[str, Path]
    certs: Path
    plugin: Path


@dataclass(frozen=True)
class Reader:
    """One command reading user input: how to point it at a corpus item, and what it owes."""

    argv: Callable[[Place, Path], list[str]]
    code: int  # docs/cli.md: the exit code of refused input for this reader
    stdin: bool = False  # the item goes to stdin instead of being named
    env: Callable[[Place, Path], dict[str, str]] = field(default=lambda place, item: {})
    accepts: frozenset[str] = frozenset()  # items that are valid input here (exit 0 allowed)
    starts: frozenset[str] = frozenset()  # items a daemon accepts and then serves forever on


def _cert_dir(place: Place, item: Path) -> list[str]:
    folder = place.root / f"certs-{item.stem}"
    folder.mkdir(exist_ok=True)
    for name in ("key.pem", "root-cert.pem"):
        (folder / name).write_bytes((place.certs / name).read_bytes())
    (folder / "cert-chain.pem").write_bytes(item.read_bytes())
    return ["ztunnel", "run", "--workload", "ns/pod/sa", "--cert-dir", str(folder)]


def _local_config(place: Place, item: Path) -> list[str]:
    argv = ["ztunnel", "run", "--workload", "ns/pod/sa", "--cert-dir", str(place.certs)]
    return [*argv, "--local-config", str(item)]


def _tokens(place: Place, item: Path) -> list[str]:
    argv = ["controlplane", "ca", "--tokens", str(item), "--ca-dir", str(place.root / "ca")]
    return [*argv, "--grpc-address", "127.0.0.1:0"]


def _inventory(place: Place, item: Path) -> list[str]:
    argv = ["cni", "install", "--ambient", "--local-inventory", str(item), "--node-name", "n1"]
    argv += ["--cni-bin-dir", str(place.root / "bin"), "--cni-conf-dir", str(place.root / "net.d")]
    return [*argv, "--run-dir", str(place.root / "run")]


def _image_archive(place: Place) -> Path:
    """A valid image tarball (for the readers of another file of ``image push``)."""
    path = place.root / "image.tar"
    if not path.exists():
        from meshctl.image import oci

        layer = oci.Layer("one", (oci.file_bytes("/hello", b"hi\n"),))
        image = oci.Image(repository="localhost/t", tag="1", layers=(layer,), entrypoint=("/h",))
        oci.write_archive(image, path)
    return path


def _push_from(place: Place, item: Path) -> list[str]:
    return ["image", "push", "127.0.0.1:1/m:1", "--from", str(item), "--dry-run"]


def _push_ca_file(place: Place, item: Path) -> list[str]:
    archive = str(_image_archive(place))
    return ["image", "push", "127.0.0.1:1/m:1", "--from", archive, "--ca-file", str(item)]


# kube-apiserver's token-file format takes any line of three comma-separated fields as a token:
# these items are valid token files, and the CA starts serving on them.
TOKEN_LINES = EMPTY | {"truncated-json", "alias-bomb", "alias-bomb-flow", "wrong-types-json"}

READERS: dict[str, Reader] = {
    "inject -f FILE": Reader(lambda p, item: ["inject", "-f", str(item)], code=2),
    "inject -f -": Reader(lambda p, item: ["inject", "-f", "-"], code=2, stdin=True),
    "inject -f FILE -o json": Reader(
        lambda p, item: ["inject", "-f", str(item), "-o", "json"], code=2
    ),
    "manifest generate -f FILE": Reader(
        lambda p, item: ["manifest", "generate", "-f", str(item)], code=2, accepts=EMPTY
    ),
    "manifest generate -f -": Reader(
        lambda p, item: ["manifest", "generate", "-f", "-"], code=2, stdin=True, accepts=EMPTY
    ),
    "--config FILE": Reader(
        lambda p, item: ["--config", str(item), "version", "-o", "json"], code=2, accepts=EMPTY
    ),
    "MESHCTL_CONFIG=FILE": Reader(
        lambda p, item: ["version", "-o", "json"],
        code=2,
        env=lambda p, item: {"MESHCTL_CONFIG": str(item)},
        accepts=EMPTY,
    ),
    "--kubeconfig FILE": Reader(
        lambda p, item: ["--kubeconfig", str(item), "version", "--server", "-o", "json"], code=2
    ),
    "ztunnel run --local-config FILE": Reader(_local_config, code=2, starts=EMPTY),
    "ztunnel run --cert-dir (cert-chain.pem)": Reader(_cert_dir, code=2),
    "controlplane ca --tokens FILE": Reader(_tokens, code=2, starts=TOKEN_LINES),
    "cni install --local-inventory FILE": Reader(_inventory, code=2, starts=EMPTY),
    "image push --from FILE": Reader(_push_from, code=2),
    "image push --ca-file FILE": Reader(_push_ca_file, code=2),
}


@pytest.fixture(scope="module")
def place(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Place]:
    root = tmp_path_factory.mktemp("hostile")
    certs = root / "certs"
    minted = run_measured(
        (*MESHCTL, "ztunnel", "certs", "--out", str(certs), "--workload", "ns/pod/sa")
    )
    assert minted.returncode == 0, minted.describe()
    for name in ("bin", "net.d", "run"):
        (root / name).mkdir()
    plugin = install_launcher(root / "cni-bin", root / "run")
    with NodeAgent(root / "run"):  # the CNI plugin's requests are served by its node agent
        yield Place(root, write_corpus(root / "corpus"), certs, plugin)


def assert_refused_cleanly(run: Measured, code: int, may_pass: bool) -> None:
    assert not run.timed_out, run.describe()
    if run.returncode == 0 and may_pass:
        pass
    else:
        assert run.returncode == code, run.describe()
        first = run.stderr.splitlines()[0] if run.stderr else ""
        assert first.startswith("Error: "), run.describe()
    assert "Traceback" not in run.stderr, run.describe()
    assert "internal error" not in run.stderr, run.describe()
    assert run.cpu_seconds <= SECONDS, run.describe()
    assert run.seconds <= WALL_SECONDS, run.describe()
    assert run.max_rss_mib <= MIB, run.describe()


# Every (reader, item) but those a daemon takes as valid and then serves on: those would not end.
CASES = [
    (reader, item) for reader, spec in READERS.items() for item in NAMES if item not in spec.starts
]


@pytest.mark.parametrize(("reader", "item"), CASES)
def test_a_reader_refuses_hostile_input_cleanly_and_quickly(place: Place, reader: str, item):
    spec_ = READERS[reader]
    path = place.corpus[item]
    run = run_measured(
        (*MESHCTL, *spec_.argv(place, path)),
        stdin=path if spec_.stdin else None,
        env=spec_.env(place, path),
        timeout=30,
    )
    assert_refused_cleanly(run, spec_.code, item in spec_.accepts)


# --- the CNI plugin: its own protocol ----------------------------------------------------------

CNI_ENV = {
    "CNI_COMMAND": "ADD",
    "CNI_CONTAINERID": "c1",
    "CNI_IFNAME": "eth0",
    "CNI_ARGS": "K8S_POD_NAMESPACE=default;K8S_POD_NAME=app",
}


def assert_cni_error(run: Measured, codes: set[int]) -> dict[str, object]:
    assert not run.timed_out, run.describe()
    assert run.returncode == 1, run.describe()
    assert run.stdout.count("\n") == 1, run.describe()
    error = json.loads(run.stdout)
    assert error["code"] in codes, run.describe()
    assert error["code"] != spec.INTERNAL, run.describe()
    assert run.stderr.startswith("Error: "), run.describe()
    assert "Traceback" not in run.stderr, run.describe()
    assert run.cpu_seconds <= SECONDS, run.describe()
    assert run.seconds <= WALL_SECONDS, run.describe()
    assert run.max_rss_mib <= MIB, run.describe()
    return error


@pytest.mark.parametrize("item", NAMES)
def test_the_cni_plugin_answers_hostile_config_with_the_spec_error(place: Place, item: str):
    run = run_measured(
        (str(place.plugin),),
        stdin=place.corpus[item],
        env={**CNI_ENV, "CNI_NETNS": str(place.root / "run")},
        timeout=30,
    )
    assert_cni_error(run, {spec.DECODE_FAILURE, spec.INVALID_CONFIG, spec.INCOMPATIBLE_VERSION})


@pytest.mark.parametrize("item", NAMES)
def test_the_cni_plugin_fails_closed_on_a_hostile_local_inventory(place: Place, item: str):
    config = {
        "cniVersion": "1.0.0",
        "name": "n",
        "type": "meshctl-cni",
        "prevResult": PREV_RESULT,
        "run_dir": str(place.root / "run"),
        "local_inventory": str(place.corpus[item]),
        "pod_lookup_timeout": 0.3,
    }
    run = run_measured(
        (str(place.plugin),),
        stdin=json.dumps(config).encode(),
        env={**CNI_ENV, "CNI_NETNS": str(place.root / "run")},
        timeout=30,
    )
    error = assert_cni_error(run, {spec.TRY_AGAIN_LATER})
    assert "fail closed" in str(error["msg"])


# --- env vars -----------------------------------------------------------------------------------

ENV_VALUES = {
    "nested": "[" * 10_000,
    "long": "x" * 100_000,  # Linux takes up to 128 KiB in one variable
    "control": "\x1b[31m\x07",
    "latin1-as-text": "caf\xe9",
    "negative": "-1",
    "huge-number": "9" * 5_000,
    "empty": "",
}
ENV_NAMES = (
    "MESHCTL_MAX_INPUT_BYTES", "MESHCTL_MAX_INPUT_DEPTH", "MESHCTL_MAX_INPUT_NODES",
    "MESHCTL_LOG_LEVEL", "MESHCTL_LOG_FORMAT", "MESHCTL_REQUEST_TIMEOUT", "MESHCTL_DEBUG",
)  # fmt: skip
# (name, value) pairs that are valid settings: an empty variable is unset; a long timeout is one.
ENV_VALID = {(name, "empty") for name in ENV_NAMES} | {("MESHCTL_REQUEST_TIMEOUT", "huge-number")}


@pytest.mark.parametrize("value", ENV_VALUES)
@pytest.mark.parametrize("name", ENV_NAMES)
def test_env_vars_with_hostile_values_are_usage_errors(place: Place, name: str, value: str):
    values_file = place.root / "values.yaml"
    values_file.write_text("{}\n")
    run = run_measured(
        (*MESHCTL, "manifest", "generate", "-f", str(values_file)),
        env={name: ENV_VALUES[value]},
        timeout=30,
    )
    assert_refused_cleanly(run, 2, may_pass=(name, value) in ENV_VALID)
