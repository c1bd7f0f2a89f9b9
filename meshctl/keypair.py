"""Loading a PEM certificate chain and private key into an ``ssl.SSLContext`` without a file.

OpenSSL (through ``ssl``) loads a key pair only from paths. Invariant: the PEMs never touch a
filesystem: they are written to anonymous memory files (``memfd_create``) read through
``/proc/self/fd``, closed as soon as OpenSSL has read them. A pod's /tmp is often disk-backed, and
an unlinked file's blocks are not wiped, so a temporary file would leave private keys on the
node's disk. A key encrypted with a passphrase is refused (never an interactive prompt).
"""

from __future__ import annotations

import contextlib
import os
import ssl
from collections.abc import Iterator


@contextlib.contextmanager
def _memory_file(name: str, data: bytes) -> Iterator[str]:
    fd = os.memfd_create(name, os.MFD_CLOEXEC)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        yield f"/proc/self/fd/{fd}"
    finally:
        os.close(fd)


def load_key_pair(context: ssl.SSLContext, chain_pem: bytes, key_pem: bytes) -> None:
    """``context.load_cert_chain`` from PEM bytes; ``ssl.SSLError`` when they do not load."""
    with (
        _memory_file("meshctl-chain", chain_pem) as chain,
        _memory_file("meshctl-key", key_pem) as key,
    ):
        # A passphrase callback that gives none: OpenSSL would otherwise prompt on the terminal.
        context.load_cert_chain(chain, key, password=lambda: b"")
