"""Helpers for the capture tests in real namespaces: run meshctl in-process, read tables, and
small TCP/UDP actors (servers, a proxy stand-in that reads SO_ORIGINAL_DST).

Every actor lives in a namespace the test created; every socket has a timeout; threads are
daemons joined with a deadline, so a broken capture fails the test instead of hanging it.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from meshctl.cli import main
from meshctl.net.sockets import filesystem_ids, original_destination
from tests.harness.cli import isolate_capture_settings
from tests.harness.netns import Netns

TIMEOUT = 5.0
Handler = Callable[[socket.socket, bytes], bytes]  # (accepted connection, request) -> reply
SAVE = {
    "nft": "iptables-nft-save",
    "legacy": "iptables-legacy-save",
    "iptc": "iptables-legacy-save",
}
IPTABLES = {"nft": "iptables-nft", "legacy": "iptables-legacy", "iptc": "iptables-legacy"}
BACKENDS = ("nft", "legacy", "iptc")


class Meshctl:
    """``meshctl`` in this process (as the CNI plugin would run the engine), clean environment."""

    def __init__(self, capsys: Any, monkeypatch: Any, home: Any) -> None:
        self._capsys = capsys
        isolate_capture_settings(monkeypatch, home)

    def __call__(self, *args: str) -> tuple[int, str, str]:
        code = main(list(args))
        out, err = self._capsys.readouterr()
        return code, out, err

    def ok(self, *args: str) -> tuple[str, str]:
        code, out, err = self(*args)
        assert code == 0, f"meshctl {' '.join(args)} exited {code}: {err}"
        return out, err


def save(ns: Netns, backend: str, v6: bool = False) -> str:
    """The namespace's tables as iptables-save prints them, without comments or counters."""
    tool = SAVE[backend].replace("iptables", "ip6tables") if v6 else SAVE[backend]
    out = ns.run([tool]).stdout
    return "".join(
        (line.split(" [")[0] if line.startswith(":") else line) + "\n"
        for line in out.splitlines()
        if line and not line.startswith("#")
    )


def legacy_tables(ns: Netns) -> str:
    return ns.run(["cat", "/proc/net/ip_tables_names"], check=False).stdout.strip()


def nft_ruleset(ns: Netns) -> str:
    return ns.run(["nft", "list", "ruleset"], check=False).stdout.strip()


@dataclass
class Server:
    """A TCP server: answers ``<name>:<request>`` and records who connected."""

    listener: socket.socket
    name: str
    peers: list[tuple[str, int]] = field(default_factory=list)
    thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        return int(self.listener.getsockname()[1])

    def serve(self, handle: Handler | None = None) -> Server:
        def loop() -> None:
            while True:
                try:
                    conn, peer = self.listener.accept()
                except OSError:
                    return
                with conn:
                    conn.settimeout(TIMEOUT)
                    self.peers.append(peer[:2])
                    data = _read(conn)  # always read the request: unread data would mean a RST
                    reply = handle(conn, data) if handle else self.name.encode() + b":" + data
                    with contextlib.suppress(OSError):
                        conn.sendall(reply)

        self.thread = threading.Thread(target=loop, daemon=True)
        self.thread.start()
        return self

    def close(self) -> None:
        # shutdown() wakes an accept() blocked in the server thread; close() alone does not.
        with contextlib.suppress(OSError):
            self.listener.shutdown(socket.SHUT_RDWR)
        self.listener.close()
        if self.thread is not None:
            self.thread.join(TIMEOUT)


def _read(conn: socket.socket) -> bytes:
    data = b""
    while chunk := conn.recv(4096):
        data += chunk
        if data.endswith(b"\n"):
            break
    return data


def listen(ns: Netns, address: str, port: int, name: str, *, transparent: bool = False) -> Server:
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    with ns.entered():
        if transparent:
            from meshctl.net.sockets import transparent_listener

            sock = transparent_listener(family, address, port)
        else:
            sock = socket.socket(family, socket.SOCK_STREAM)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((address, port))
            sock.listen(16)
    return Server(sock, name)


@contextlib.contextmanager
def serving(server: Server, handle: Handler | None = None) -> Iterator[Server]:
    server.serve(handle)
    try:
        yield server
    finally:
        server.close()


def request(
    ns: Netns, address: str, port: int, payload: bytes = b"hello\n", *, uid: int | None = None
) -> bytes:
    """Connect from ``ns`` (as ``uid`` if given), send a line, return the whole reply."""
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    with ns.entered():
        if uid is None:
            sock = socket.socket(family, socket.SOCK_STREAM)
        else:
            with filesystem_ids(uid, uid):
                sock = socket.socket(family, socket.SOCK_STREAM)
    with sock:
        sock.settimeout(TIMEOUT)
        sock.connect((address, port))
        sock.sendall(payload)
        reply = b""
        while chunk := sock.recv(4096):
            reply += chunk
        return reply


def proxy_stand_in(ns: Netns, seen: list[tuple[str, int]], *, uid: int = 1337) -> Handler:
    """A handler for the outbound listener: reads SO_ORIGINAL_DST, forwards the request there as
    the proxy's uid (so capture lets it through), and tags the answer ``via-proxy``."""

    def handle(conn: socket.socket, data: bytes) -> bytes:
        original = original_destination(conn)
        assert original is not None, "accepted a connection that was not redirected"
        seen.append(original)
        upstream = request(ns, original[0], original[1], data, uid=uid)
        return b"via-proxy>" + upstream

    return handle
