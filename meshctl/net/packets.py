"""A raw packet capture on one interface of a network namespace (AF_PACKET, no tcpdump).

Owns the socket and its reader thread. Invariants: the socket is made inside the namespace and
bound to the one interface, so it sees exactly that link's frames, both directions; the buffer
is large enough that a burst of merged (GRO) frames is not dropped before the thread reads it;
``stop`` always closes the socket and returns what was read.
"""

from __future__ import annotations

import socket
import threading
import time

from meshctl.errors import NetError

from .netns import NetnsRef, entered

_ETH_P_ALL = 0x0003


class Capture:
    """Every frame on ``ifname`` inside ``ref`` from ``start`` until ``stop``."""

    def __init__(self, ref: NetnsRef | None, ifname: str) -> None:
        try:
            with entered(ref):
                sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(_ETH_P_ALL))
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16 << 20)
            sock.bind((ifname, _ETH_P_ALL))
        except OSError as exc:
            raise NetError(
                f"cannot capture on {ifname}: {exc.strerror}", hint="packet capture needs root"
            ) from exc
        sock.settimeout(0.1)
        self._sock = sock
        self.frames: list[bytes] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._read, name=f"capture {ifname}", daemon=True)
        self._thread.start()

    def _read(self) -> None:
        while not self._stop.is_set():
            try:
                self.frames.append(self._sock.recv(1 << 17))
            except TimeoutError:
                continue
            except OSError:
                return

    def stop(self, settle: float = 0.2) -> list[bytes]:
        """Wait ``settle`` seconds for frames in flight, then stop and return every frame."""
        time.sleep(settle)
        self._stop.set()
        self._thread.join(5)
        self._sock.close()
        return self.frames
