"""The data plane process: process-wide tuning, the event loop, and the runtime.

Owns everything that is global to the process and therefore done once, here: glibc malloc
thresholds (uvloop's TLS transport reads each record into a fresh 256 KiB buffer, above the mmap
threshold: an mmap/munmap pair and page faults per record), log records without caller lookups,
the cyclic garbage collector's pace, and uvloop as the event loop (installed here only, per the
architecture rules).
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import functools
import gc
import logging
import socket

from meshctl import logs

log = logging.getLogger(__name__)

_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
_MALLOC_THRESHOLD = 4 * 1024 * 1024  # above the largest buffer the loop or h2 allocates per read


@functools.cache
def libc_name() -> str | None:
    """The C library's name: ``find_library`` runs ``ldconfig -p`` (a process), so a fork
    server asks once in its preload and its workers inherit the answer."""
    return ctypes.util.find_library("c")


def tune_malloc() -> bool:
    """Keep 256 KiB-1 MiB buffers on the heap instead of fresh mmaps (trap 1 of the notes)."""
    name = libc_name()
    if not name:
        return False
    try:
        libc = ctypes.CDLL(name)
        ok = int(libc.mallopt(_M_MMAP_THRESHOLD, _MALLOC_THRESHOLD)) == 1
        return ok and int(libc.mallopt(_M_TRIM_THRESHOLD, 2 * _MALLOC_THRESHOLD)) == 1
    except (OSError, AttributeError):
        return False  # not glibc: nothing to tune


def lean_log_records() -> None:
    """Skip what a LogRecord gathers that our formats never show (the logging HOWTO's
    "Optimization" switches): the caller's file and line (a stack walk per record), thread,
    process and multiprocessing names. One access-log record per connection made these a
    visible share of the per-connection cost."""
    logging._srcfile = None  # the documented switch that skips findCaller
    logging.logThreads = False
    logging.logProcesses = False
    logging.logMultiprocessing = False


def tune_gc() -> None:
    """Collect cyclic garbage rarely and never rescan what start-up built.

    Everything alive once the modules are loaded (code, hpack's tables, the config)
    lives as long as the process: ``gc.freeze`` moves it out of the collector's sight, so a full
    collection scans only per-connection objects. Connections allocate many small containers
    (streams, frames, events), so the default young-generation threshold of 700 ran a collection
    every few connections; a higher one trades a little memory for fewer pauses in the latency
    tail.
    """
    gc.collect()
    gc.freeze()
    gc.set_threshold(_GC_YOUNG, 20, 20)


_GC_YOUNG = 20_000  # allocations between young collections (CPython's default: 700)


def raise_fd_limit() -> int:
    """Every proxied connection holds two or three sockets: take the hard limit as the soft one."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return hard


def run(channel_fd: int) -> int:
    """Serve until drained; ``channel_fd`` is the supervisor's end of the message channel."""
    import uvloop

    from .runtime import Runtime

    tune_malloc()
    lean_log_records()
    raise_fd_limit()
    sock = socket.socket(fileno=channel_fd)
    tune_gc()  # last: after every import the data plane needs

    async def main() -> int:
        # Log lines (one access line per connection) leave in one write per loop iteration.
        logs.defer_writes(asyncio.get_running_loop().call_soon)
        return await Runtime(sock).run()

    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(main())
