"""``meshctl inject webhook`` as a test subprocess on 127.0.0.1, with a throwaway CA.

Owns starting the server the way the console script runs it, waiting until it listens, and
stopping it with SIGTERM (killing it if the drain overruns). Invariant: listens on 127.0.0.1
only; the process is gone after ``stop`` or a failed start.
"""

from __future__ import annotations

import signal
import socket
import ssl
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from tests.harness.kube import CertificateAuthority, free_port

TEST_IMAGE = "registry.example/meshctl:test"


@dataclass(frozen=True)
class WebhookProcess:
    """A running webhook: its port, the CA that signed its certificate, the process."""

    port: int
    ca_pem: bytes
    ca_file: Path
    process: subprocess.Popen[bytes]
    ca: CertificateAuthority  # issues a replacement serving certificate (rotation tests)
    cert_file: Path
    key_file: Path

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}/inject"

    def context(self, alpn: str) -> ssl.SSLContext:
        """A client TLS context trusting the CA and offering ``alpn``."""
        ctx = ssl.create_default_context(cafile=str(self.ca_file))
        ctx.set_alpn_protocols([alpn])
        return ctx


def _wait_listening(port: int, process: subprocess.Popen[bytes], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            error = process.stderr.read() if process.stderr else b""
            raise RuntimeError(f"webhook exited {process.returncode}: {error!r}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.05)
    raise TimeoutError(f"webhook not listening on 127.0.0.1:{port} after {timeout}s")


def start_webhook(
    workdir: Path,
    *extra: str,
    timeout: float = 30.0,
    group: tuple[str, ...] = (),
    image: str | None = TEST_IMAGE,
) -> WebhookProcess:
    """Starts the webhook with a fresh CA and serving certificate kept in ``workdir``;
    ``group`` are options given to ``meshctl inject`` itself, before ``webhook``."""
    ca = CertificateAuthority("meshctl-test-inject-ca")
    ca_file = workdir / "ca.crt"
    ca_file.write_bytes(ca.cert_pem)
    cert, key = ca.issue("webhook", server=True, ip_sans=["127.0.0.1"]).write(workdir, "serving")
    port = free_port()
    argv = [sys.executable, "-c", "from meshctl.entry import run; run()", "inject", *group]
    argv += ["webhook", "--address", "127.0.0.1", "--port", str(port), "--tls-cert", str(cert)]
    argv += ["--tls-key", str(key), *(("--image", image) if image else ()), *extra]
    # stderr is read when the start fails, or by a test; the server logs a few lines at most.
    process = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        _wait_listening(port, process, timeout)
    except BaseException:
        process.kill()
        process.wait()
        raise
    return WebhookProcess(port, ca.cert_pem, ca_file, process, ca, cert, key)


def stop_webhook(webhook: WebhookProcess, grace: float = 15.0) -> int:
    """SIGTERM, wait up to ``grace`` seconds (then SIGKILL); returns the exit code."""
    process = webhook.process
    process.send_signal(signal.SIGTERM)
    try:
        return process.wait(timeout=grace)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        if process.stderr is not None:
            process.stderr.close()
