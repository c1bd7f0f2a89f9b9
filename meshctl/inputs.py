"""Files and stdin a user names, read within the input limits: the edge of the bounded reader.

Owns reading (a regular file's size is checked before it is read; a pipe or a device is read
no further than the limit), UTF-8 decoding, and the limits in force: the defaults of
``meshctl.structured`` unless ``MESHCTL_MAX_INPUT_{BYTES,DEPTH,NODES}`` say otherwise.
Invariants: an ``OSError`` (missing, a directory, no permission) reaches the caller unchanged,
for it to say which flag named the path; content we refuse is an ``InputError`` naming it.
"""

from __future__ import annotations

import os
import stat
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import BinaryIO

from meshctl.structured import Limits, decode, limits_from_env, too_large

STDIN_NAME = "<stdin>"


def limits(env: Mapping[str, str] | None = None) -> Limits:
    """The limits for this process (``env`` defaults to ``os.environ``)."""
    return limits_from_env(os.environ if env is None else env)


def read_bytes(path: str | Path, source: str, limits: Limits) -> bytes:
    """The whole file at ``path`` (named ``source`` in errors), at most ``limits.max_bytes``."""
    with open(path, "rb") as handle:  # noqa: PTH123 -- one open, then fstat on the same file
        info = os.fstat(handle.fileno())
        if stat.S_ISREG(info.st_mode) and info.st_size > limits.max_bytes:
            raise too_large(source, limits)
        return _bounded(handle, source, limits)


def read_text(path: str | Path, source: str, limits: Limits) -> str:
    """``read_bytes`` decoded as UTF-8 (a byte-order mark dropped)."""
    return decode(read_bytes(path, source, limits), source)


def read_stdin(limits: Limits, source: str = STDIN_NAME) -> bytes:
    """All of stdin, at most ``limits.max_bytes``."""
    return _bounded(sys.stdin.buffer, source, limits)


def open_stream(name: str) -> tuple[BinaryIO, str]:
    """A binary stream for ``name`` (``-`` is stdin, left open) and its name for messages,
    for readers that take one document at a time."""
    if name == "-":
        return sys.stdin.buffer, STDIN_NAME
    return Path(name).expanduser().open("rb"), name


def _bounded(handle: BinaryIO, source: str, limits: Limits) -> bytes:
    """Reads in chunks: a limit raised far above what is there allocates nothing extra."""
    chunks: list[bytes] = []
    size = 0
    while chunk := handle.read(min(_CHUNK, limits.max_bytes + 1 - size)):
        chunks.append(chunk)
        size += len(chunk)
        if size > limits.max_bytes:
            raise too_large(source, limits)
    return b"".join(chunks)


_CHUNK = 1 << 20
