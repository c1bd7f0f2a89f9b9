"""The ClientHello reader against real ClientHellos of independent TLS clients: OpenSSL's
``s_client``, Python's ``ssl``, Node.js's ``tls`` and curl (four front ends on OpenSSL), and Go's
``crypto/tls`` (a TLS stack of its own), each told a server name and ALPN list and pinned to TLS
1.2 or 1.3. A loopback listener records the first bytes each client
sends and reads them; the reader must report what the client was told, consume exactly the
bytes the client sent, and answer the same when those bytes arrive one at a time or are cut
into small records again. (.ci/run installs openssl, curl and node, and needs Go for the kube
builds; under CI=true a missing one fails the test.)"""

from __future__ import annotations

import contextlib
import shutil
import socket
import ssl
import subprocess
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from meshctl.core.tls.clienthello import (
    ClientHello,
    ClientHelloReader,
    NeedMore,
    Result,
)
from tests.harness.plugin import in_ci
from tests.unit.core.tls.hellos import TLS12, TLS13, records

INTEROP = Path(__file__).parents[3] / "interop"
ALPN = (b"h2", b"http/1.1")
WAIT = 20.0


def need(tool: str, *elsewhere: str) -> str:
    path = shutil.which(tool) or next((p for p in elsewhere if Path(p).is_file()), None)
    if path is None:
        message = f"needs {tool} as an independent TLS client (.ci/run installs it)"
        if in_ci():
            pytest.fail(message)
        pytest.skip(message)
    return path


@dataclass
class Caught:
    received: bytes  # every byte the client sent before the listener closed
    result: Result


def catch(client: Callable[[int], object]) -> Caught:
    """Run ``client(port)`` against a loopback listener that reads the first connection's
    bytes until the reader decides, then closes it (the client's handshake then fails)."""
    caught: list[Caught] = []
    with socket.create_server(("127.0.0.1", 0)) as server:
        server.settimeout(WAIT)
        port = server.getsockname()[1]

        def serve() -> None:
            conn, _ = server.accept()
            with conn:
                conn.settimeout(WAIT)
                reader = ClientHelloReader()
                received = b""
                while isinstance(reader.result, NeedMore):
                    chunk = conn.recv(65536)
                    if not chunk:
                        break
                    received += chunk
                    reader.feed(chunk)
                caught.append(Caught(received, reader.result))

        thread = threading.Thread(target=serve, daemon=True)
        thread.start()
        client(port)
        thread.join(WAIT)
    assert caught, "the client never connected"
    return caught[0]


def run(argv: list[str]) -> None:
    subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, timeout=WAIT, check=False)


def openssl(name: str | None, version: int) -> Callable[[int], object]:
    exe = need("openssl")
    sni = ["-servername", name] if name else ["-noservername"]
    pin = "-tls1_3" if version == TLS13 else "-tls1_2"
    return lambda port: run(
        [exe, "s_client", "-connect", f"127.0.0.1:{port}", *sni, "-alpn", "h2,http/1.1", pin]
    )


def python_ssl(name: str | None, version: int) -> Callable[[int], object]:
    def client(port: int) -> None:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
        ctx.set_alpn_protocols([p.decode() for p in ALPN])
        pinned = ssl.TLSVersion.TLSv1_3 if version == TLS13 else ssl.TLSVersion.TLSv1_2
        ctx.minimum_version = ctx.maximum_version = pinned
        # the listener closes after the ClientHello: the handshake cannot end
        with (
            socket.create_connection(("127.0.0.1", port), WAIT) as raw,
            contextlib.suppress(ssl.SSLError, OSError),
        ):
            ctx.wrap_socket(raw, server_hostname=name or "127.0.0.1")

    return client


def node(name: str | None, version: int) -> Callable[[int], object]:
    exe = need("node")
    pin = "TLSv1.3" if version == TLS13 else "TLSv1.2"
    return lambda port: run(
        [exe, str(INTEROP / "tls_hello_client.js"), str(port), name or "-", "h2,http/1.1", pin]
    )


def curl(name: str | None, version: int) -> Callable[[int], object]:
    exe = need("curl")
    pin = ["--tlsv1.3"] if version == TLS13 else ["--tlsv1.2", "--tls-max", "1.2"]
    assert name, "curl names the host it connects to"

    def client(port: int) -> None:
        url = f"https://{name}:{port}/"
        resolve = f"{name}:{port}:127.0.0.1"
        run([exe, "-sk", "--http2", "--resolve", resolve, *pin, "--max-time", "20", url])

    return client


def go_tls(binary: Path) -> Client:
    def make(name: str | None, version: int) -> Callable[[int], object]:
        pin = "1.3" if version == TLS13 else "1.2"
        return lambda port: run([str(binary), str(port), name or "-", "h2,http/1.1", pin])

    return make


@pytest.fixture(scope="module")
def go_client(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The Go client, built once (a cold build cache takes longer than one client may wait)."""
    exe = need("go", "/usr/local/go/bin/go")  # where tests/kube/build.sh finds it too
    out = tmp_path_factory.mktemp("go") / "tls_hello_client"
    subprocess.run(
        [exe, "build", "-o", str(out), str(INTEROP / "tls_hello_client.go")],
        capture_output=True,
        timeout=600,
        check=True,
    )
    return out


Client = Callable[[str | None, int], Callable[[int], object]]
CLIENTS: dict[str, Client] = {
    "openssl": openssl,
    "python-ssl": python_ssl,
    "node": node,
    "curl": curl,
}
GO = "go-crypto-tls"


def client_for(request: pytest.FixtureRequest, client: str) -> Client:
    if client == GO:
        return go_tls(request.getfixturevalue("go_client"))
    return CLIENTS[client]


def fragments(hello: bytes) -> Iterator[bytes]:
    """The handshake layer of a client's hello records (records of any size)."""
    at = 0
    while at < len(hello):
        length = int.from_bytes(hello[at + 3 : at + 5])
        yield hello[at + 5 : at + 5 + length]
        at += 5 + length


@pytest.mark.parametrize("version", [TLS13, TLS12], ids=["tls1.3", "tls1.2"])
@pytest.mark.parametrize("client", [*sorted(CLIENTS), GO])
def test_a_real_clients_hello_reports_the_name_and_protocols_it_was_told(
    request: pytest.FixtureRequest, client: str, version: int
) -> None:
    name = f"{client}.passthrough.example"
    caught = catch(client_for(request, client)(name, version))
    got = caught.result
    assert isinstance(got, ClientHello), got
    assert got.server_name == name
    assert got.alpn == ALPN
    assert got.version == version
    assert got.legacy_version == TLS12  # RFC 8446 §4.1.2: 1.3 clients send 0x0303 here too
    assert got.consumed == len(caught.received)

    one_at_a_time = ClientHelloReader()
    for byte in caught.received:
        answer = one_at_a_time.feed(bytes([byte]))
    assert answer == got

    layer = b"".join(fragments(caught.received))
    small = records(layer, [7] * (len(layer) // 7))
    again = ClientHelloReader().feed(small)
    assert isinstance(again, ClientHello), again
    assert (again.server_name, again.alpn, again.supported_versions) == (
        got.server_name,
        got.alpn,
        got.supported_versions,
    )
    assert again.records == len(layer) // 7 + (1 if len(layer) % 7 else 0)


@pytest.mark.parametrize("client", ["openssl", "python-ssl", "node", GO])
def test_a_real_client_without_a_server_name_sends_no_sni(
    request: pytest.FixtureRequest, client: str
) -> None:
    # openssl -noservername; the others given an IP literal (RFC 6066 §3 forbids it as SNI)
    got = catch(client_for(request, client)(None, TLS13)).result
    assert isinstance(got, ClientHello), got
    assert got.server_name == ""
    assert got.alpn == ALPN
