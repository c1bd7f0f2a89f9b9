"""How a daemon is asked to stop, and the exit code that follows.

SIGTERM (the kubelet, ``meshctl demo down``) and SIGINT (Ctrl-C) both start the same drain;
afterwards a daemon stopped by SIGINT exits 130 (128 + 2, what a shell reports for Ctrl-C), one
stopped by SIGTERM 0 (the kubelet's request, done). One implementation for every daemon
(docs/cli.md's exit codes): ``ztunnel run``, ``inject webhook``, ``controlplane run`` and ``ca``,
``cni install``.
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Callable

from meshctl.errors import EXIT_INTERRUPTED, EXIT_OK

SIGNALS = (signal.SIGTERM, signal.SIGINT)


class StopSignals:
    """SIGTERM and SIGINT call ``on_stop`` (on the running loop) and are remembered."""

    def __init__(self, on_stop: Callable[[], None]) -> None:
        self._on_stop = on_stop
        self.received: signal.Signals | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def install(self) -> None:
        self._loop = asyncio.get_running_loop()
        for sig in SIGNALS:
            self._loop.add_signal_handler(sig, self._stop, sig)

    def remove(self) -> None:
        if self._loop is not None:
            for sig in SIGNALS:
                self._loop.remove_signal_handler(sig)

    def _stop(self, sig: signal.Signals) -> None:
        self.received = self.received or sig
        self._on_stop()

    def exit_code(self, code: int = EXIT_OK) -> int:
        """``code``, except that a clean stop by Ctrl-C is 130."""
        return EXIT_INTERRUPTED if code == EXIT_OK and self.received == signal.SIGINT else code
