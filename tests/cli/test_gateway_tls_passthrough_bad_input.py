"""Issue 26's bad input at a TLS passthrough listener, through a real ``meshctl gateway run -f``
process, each with the outcome docs/gateway.md ("Outcomes") and docs/tls-passthrough.md give it:
random bytes, an SSLv2 hello and a slowloris client (before or during the hello) are closed
without an alert within the header timeout; a record over 2^14 bytes gets ``decode_error``; a
whole 16 KiB record of hello and a hello sent one byte at a time are routed. A good connection
opened before each one and used after it is unaffected."""

from __future__ import annotations

import contextlib
import random
import socket
import ssl
import time
from collections.abc import Iterator

import pytest

from tests.cli.tls_backends import TlsBackend, client_context, gateway_objects, tls_backends
from tests.harness import gateway as gw

NAME = "good.passthrough.test"
HEADER_TIMEOUT = 1.0
DECODE_ERROR = 50  # RFC 8446 §6 AlertDescription


@pytest.fixture(scope="module")
def running(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[gw.Running, TlsBackend]]:
    tmp = tmp_path_factory.mktemp("passthrough-bad")
    with (
        tls_backends([NAME], tmp) as backends,
        gw.run_gateway(
            tmp,
            gateway_objects(backends),
            listener_ports=(443,),
            env={"MESHCTL_HEADER_TIMEOUT": f"{HEADER_TIMEOUT:g}s"},
        ) as proc,
    ):
        yield proc, backends[NAME]


@contextlib.contextmanager
def good_connection(proc: gw.Running, backend: TlsBackend) -> Iterator[None]:
    """A connection through the gateway, handshake done before the block, used after it."""
    raw = socket.create_connection(("127.0.0.1", proc.port(443)), timeout=10)
    with client_context(backend).wrap_socket(raw, server_hostname=NAME) as tls:
        yield
        tls.sendall(b"5 7\nhello")
        answer = b""
        while chunk := tls.recv(4096):
            answer += chunk
    assert answer.endswith(b"\n")
    assert answer[7:].split()[0] == NAME.encode()


def _answer(sock: socket.socket) -> bytes:
    """Everything the gateway sends until it closes (a FIN or a reset)."""
    out = b""
    with contextlib.suppress(ConnectionResetError):
        while chunk := sock.recv(65536):
            out += chunk
    return out


def _hello(server_name: str) -> bytes:
    """A real ClientHello (Python's ``ssl``), as its client would send it."""
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    maker = ssl.create_default_context().wrap_bio(incoming, outgoing, server_hostname=server_name)
    with contextlib.suppress(ssl.SSLWantReadError):
        maker.do_handshake()
    return outgoing.read()


def _padded_to_one_full_record(hello: bytes) -> bytes:
    """``hello`` (one record) with its padding extension (RFC 7685; OpenSSL sends one) grown, or
    one added, so that its record's payload is exactly 2^14 bytes, the most a record may carry
    (RFC 8446 §5.1)."""
    body = bytearray(hello[9:])
    at = 2 + 32  # legacy_version, random
    at += 1 + body[at]  # session id
    at += 2 + int.from_bytes(body[at : at + 2])  # cipher suites
    at += 1 + body[at]  # compression methods
    length_at, end = at, at + 2 + int.from_bytes(body[at : at + 2])
    extensions: list[tuple[int, bytes]] = []
    at += 2
    while at < end:
        kind, size = int.from_bytes(body[at : at + 2]), int.from_bytes(body[at + 2 : at + 4])
        extensions.append((kind, bytes(body[at + 4 : at + 4 + size])))
        at += 4 + size
    kept = [(k, v) for k, v in extensions if k != 21]
    without = sum(4 + len(v) for k, v in kept)
    pad = (1 << 14) - 4 - length_at - 2 - without - 4
    assert pad >= 0
    kept.append((21, bytes(pad)))
    block = b"".join(k.to_bytes(2) + len(v).to_bytes(2) + v for k, v in kept)
    body = body[:length_at] + len(block).to_bytes(2) + block
    handshake = b"\x01" + len(body).to_bytes(3) + body
    return hello[:3] + len(handshake).to_bytes(2) + bytes(handshake)


def test_random_bytes_are_closed_without_an_alert(running):
    proc, backend = running
    noise = random.Random(26).randbytes(4096)  # noqa: S311 (fixed noise, no secret)
    # No content type first, and not an SSLv2 header followed by msg_type 1 either.
    assert noise[0] not in (20, 21, 22, 23, 24)
    assert not (noise[0] & 0x80 and noise[2] == 1)
    with good_connection(proc, backend):
        with socket.create_connection(("127.0.0.1", proc.port(443)), timeout=5) as sock:
            sock.sendall(noise)
            assert _answer(sock) == b""
        proc.wait_log(f'reason="not-tls (first byte 0x{noise[0]:02x} is no TLS content type)"')


def test_an_sslv2_hello_is_closed_without_an_alert(running):
    proc, backend = running
    # RFC 5246 Appendix E.2: a two-byte length with the high bit set, msg_type 1, version 3.1,
    # the cipher specs' (3 bytes each), session id's and challenge's lengths, then those.
    specs, challenge = bytes.fromhex("0000ff00002f"), bytes(range(16))
    message = b"\x01\x03\x01" + (6).to_bytes(2) + (0).to_bytes(2) + (16).to_bytes(2)
    message += specs + challenge
    sslv2 = (0x8000 | len(message)).to_bytes(2) + message
    with good_connection(proc, backend):
        with socket.create_connection(("127.0.0.1", proc.port(443)), timeout=5) as sock:
            sock.sendall(sslv2)
            assert _answer(sock) == b""
        proc.wait_log('reason="sslv2-hello')


def test_a_record_over_sixteen_kib_gets_a_decode_error_alert(running):
    proc, backend = running
    hello = _padded_to_one_full_record(_hello(NAME))
    oversized = hello[:3] + ((1 << 14) + 1).to_bytes(2) + hello[5:] + b"\x00"
    with good_connection(proc, backend):
        with socket.create_connection(("127.0.0.1", proc.port(443)), timeout=5) as sock:
            sock.sendall(oversized)
            answer = _answer(sock)
        # A fatal alert record: type 21, a 3.x version, length 2, level 2 (fatal), the reason.
        assert answer[:2] == b"\x15\x03"
        assert answer[3:] == b"\x00\x02\x02" + bytes([DECODE_ERROR])
        proc.wait_log('reason="malformed (a record of 16385 bytes, over 2^14')


def test_a_hello_filling_a_whole_sixteen_kib_record_is_routed(running):
    proc, backend = running
    hello = _padded_to_one_full_record(_hello(NAME))
    assert len(hello) == 5 + (1 << 14)
    with good_connection(proc, backend):
        with socket.create_connection(("127.0.0.1", proc.port(443)), timeout=5) as sock:
            sock.sendall(hello)
            first = sock.recv(6)
        # The backend's ServerHello (a handshake record, message type 2): it got the hello.
        assert (first[0], first[5]) == (22, 2), first
        proc.wait_log(f"received={len(hello)} ")


def test_a_hello_sent_one_byte_at_a_time_is_routed_and_the_handshake_completes(running):
    proc, backend = running
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls = client_context(backend).wrap_bio(incoming, outgoing, server_hostname=NAME)
    with good_connection(proc, backend):
        with socket.create_connection(("127.0.0.1", proc.port(443)), timeout=10) as sock:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with contextlib.suppress(ssl.SSLWantReadError):
                tls.do_handshake()
            hello = outgoing.read()
            paced_until = time.monotonic() + HEADER_TIMEOUT / 2  # well inside the timeout
            for i in range(len(hello)):
                sock.send(hello[i : i + 1])  # its own segment (no Nagle), as often as not
                if time.monotonic() < paced_until:
                    time.sleep(0.0005)
            while True:  # the rest of the handshake, driven through the memory BIOs
                incoming.write(sock.recv(65536))
                try:
                    tls.do_handshake()
                    break
                except ssl.SSLWantReadError:
                    sock.sendall(outgoing.read())
            sock.sendall(outgoing.read())
            assert tls.getpeercert(binary_form=True) == backend.der
            tls.write(b"3 4\nabc")
            sock.sendall(outgoing.read())
            answer = b""
            while not answer.endswith(b"\n"):
                data = sock.recv(65536)
                assert data, answer
                incoming.write(data)
                with contextlib.suppress(ssl.SSLWantReadError):
                    while chunk := tls.read(65536):
                        answer += chunk
        assert answer[4:].split()[0] == NAME.encode()


@pytest.mark.parametrize(
    ("label", "sent", "gap"),
    [
        ("silent", b"", 0.0),
        # Three bytes of a hello each 0.2 s: the timeout is for the whole hello, not each read.
        ("trickling", b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03", 0.2),
    ],
)
def test_a_slowloris_client_is_dropped_within_the_header_timeout(running, label, sent, gap):
    proc, backend = running
    dropped = proc.output().count('reason="hello-timeout (')
    with good_connection(proc, backend):
        with socket.create_connection(("127.0.0.1", proc.port(443)), timeout=10) as sock:
            began = time.monotonic()
            closed = False
            for i in range(len(sent)):
                try:
                    sock.send(sent[i : i + 1])
                except (BrokenPipeError, ConnectionResetError):
                    closed = True
                    break
                time.sleep(gap)
            if not closed:
                assert _answer(sock) == b""
            waited = time.monotonic() - began
        assert HEADER_TIMEOUT * 0.9 < waited < HEADER_TIMEOUT + 2, (label, waited)
        deadline = time.monotonic() + 5
        while proc.output().count('reason="hello-timeout (') == dropped:
            assert time.monotonic() < deadline, proc.output()[-2000:]
            time.sleep(0.05)
