"""``meshctl-cni``, the thin client the container runtime runs for every pod sandbox.

It hands the whole CNI request (the ``CNI_*`` environment and the config on stdin) to the node
agent (``meshctl cni install``, the CNI DaemonSet) over ``<run_dir>/pluginevent.sock`` and
prints the agent's answer; the agent reads the pod, decides and applies the rules in the pod's
netns (``meshctl_plugins.cni.cnirequest``). Istio's istio-cni plugin forwards the same way.
Invariants:
- Stdlib built-ins only (``_socket``, ``os``, ``sys``): this module is what the tree's
  ``meshctl-cni`` launcher (packaging/cni/launcher.c) and the unfrozen launcher script run under
  ``python -I -S``; ``json`` is imported only off the hot path (VERSION and failures). A test
  holds it to that.
- stdout carries exactly one thing: the agent's result, or the CNI error JSON (SPEC.md "Error").
- Fail closed: when the agent cannot be reached (not running, restarting) the request is tried
  again every 0.1 s for ``AGENT_WAIT`` seconds; then ADD fails with code 104 and CHECK too (the
  pod never starts uncaptured), STATUS answers 50, and DEL succeeds (the spec's DEL must not fail
  on missing state; the runtime removes the netns and its rules next, and the restarted agent
  forgets a sandbox whose netns is gone). One JSON line goes to ``<run_dir>/meshctl-cni.log``.
- VERSION is answered here, without the agent.
"""

from __future__ import annotations

import _socket
import os
import sys
import time

# Kept equal to meshctl.core.k8s.cni.spec by a test (importing it costs more than this whole
# module: dataclasses, json, typing).
SUPPORTED_VERSIONS = ("0.3.1", "0.4.0", "1.0.0", "1.1.0")
LATEST_VERSION = SUPPORTED_VERSIONS[-1]
# The installer's run dir: where the agent is when a config names none (or cannot be read); the
# unfrozen launcher script gets the installer's own value here.
DEFAULT_RUN_DIR = "/var/run/meshctl-cni"
SOCKET_NAME = "pluginevent.sock"
LOG_NAME = "meshctl-cni.log"
ROUTE = "/cni"
DECODE_FAILURE = 6
INTERNAL = 199
NOT_AVAILABLE = 50
AGENT_UNAVAILABLE = 104
# How long a request waits for an agent that is not answering (a restart: the DaemonSet's new
# pod binds the socket within a few seconds); MESHCTL_CNI_AGENT_WAIT overrides it (seconds).
AGENT_WAIT = 10.0
RETRY_EVERY = 0.1
ANSWER_TIMEOUT = 120.0  # the agent's own bounds (pod lookup, ambient enrollment) end sooner
MAX_STDIN = 64 * 1024 * 1024  # the agent's reader refuses far less (MESHCTL_MAX_INPUT_BYTES)
SCAN_LIMIT = 1024 * 1024  # how much of the config config_string reads
# Forwarded to the agent: the CNI parameters and meshctl's input limits, nothing else.
FORWARDED = ("CNI_", "MESHCTL_MAX_INPUT_")
BY_HAND = (
    "the container runtime passes the network config as JSON on stdin; by hand: "
    'echo \'{"cniVersion": "1.0.0"}\' | CNI_COMMAND=VERSION meshctl-cni'
)


class UnreachableError(Exception):
    """The agent did not take or did not finish the request (retried within the bound)."""


class RefusedError(Exception):
    """The agent answered, but not with a CNI answer (a bug or a malformed request on its side)."""


def main() -> int:
    """Serve one CNI invocation; the exit code (0, or 1 with the error JSON on stdout)."""
    try:
        return _serve()
    except KeyboardInterrupt:
        return _fail(11, "interrupted before finishing", "", LATEST_VERSION)
    except Exception as exc:  # noqa: BLE001 -- a bug: the runtime still gets the spec's format
        return _fail(INTERNAL, f"unexpected {type(exc).__name__}: {str(exc)[:300]}", "", "")


def _serve() -> int:
    env = os.environ
    command = env.get("CNI_COMMAND", "")
    stdin = _read_stdin(command)
    if stdin is None:
        return 1
    if command == "VERSION":
        return _version(stdin)
    run_dir = config_string(stdin, "run_dir") or DEFAULT_RUN_DIR
    request = _request(env, stdin)
    try:
        code, out = _exchange(run_dir, request, _wait(env))
    except UnreachableError as exc:
        return _agent_gone(command, run_dir, str(exc), stdin)
    except RefusedError as exc:
        version = _version_of(stdin)
        return _fail(INTERNAL, f"the node agent refused the request: {exc}", "", version)
    if out:
        sys.stdout.write(out if out.endswith("\n") else out + "\n")
        sys.stdout.flush()
    if code:
        _say_error(out)
    return code


def _read_stdin(command: str) -> bytes | None:
    """The config; a runtime always pipes it, so a closed stdin or a terminal is a person
    trying the plugin, answered at once (None: the error is out)."""
    stream = sys.stdin
    if stream is None:
        _fail(DECODE_FAILURE, "no network config: stdin is closed", BY_HAND, LATEST_VERSION)
        return None
    try:
        interactive = stream.isatty()
    except (ValueError, OSError):
        interactive = False
    if interactive:
        if command == "VERSION":  # the one command that needs no config
            return b""
        _fail(DECODE_FAILURE, "no network config: stdin is a terminal", BY_HAND, LATEST_VERSION)
        return None
    try:
        return stream.buffer.read(MAX_STDIN + 1)
    except OSError as exc:
        _fail(5, f"cannot read stdin: {exc.strerror or exc}", "", LATEST_VERSION)
        return None


def _wait(env: os._Environ[str] | dict[str, str]) -> float:
    try:
        return max(0.0, float(env.get("MESHCTL_CNI_AGENT_WAIT", AGENT_WAIT)))
    except ValueError:
        return AGENT_WAIT


def _request(env: os._Environ[str] | dict[str, str], stdin: bytes) -> bytes:
    """HTTP/1.1 ``POST /cni``; the body: ``NAME=VALUE`` NUL-terminated per forwarded variable,
    one more NUL, then stdin as it came (an environment value holds no NUL)."""
    names = sorted(k for k in env if k.startswith(FORWARDED))
    block = b"".join(os.fsencode(f"{k}={env[k]}") + b"\0" for k in names) + b"\0"
    body = block + stdin
    head = (
        f"POST {ROUTE} HTTP/1.1\r\nHost: node-agent\r\n"
        f"Content-Type: application/x-cni-request\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


def _exchange(run_dir: str, request: bytes, wait: float) -> tuple[int, str]:
    """Send ``request`` until an agent answers it or ``wait`` seconds have passed.

    A request the agent took but never answered (it was stopped mid-way) is sent again: every
    command is idempotent on the agent's side."""
    path = run_dir.rstrip("/") + "/" + SOCKET_NAME
    give_up = time.monotonic() + wait
    while True:
        try:
            return _once(path, request)
        except UnreachableError:
            # No run dir: no agent was ever installed here (a restart keeps the host's dir).
            if time.monotonic() + RETRY_EVERY > give_up or not os.path.isdir(run_dir):  # noqa: PTH112
                raise
            time.sleep(RETRY_EVERY)


def _once(path: str, request: bytes) -> tuple[int, str]:
    sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
    try:
        try:
            sock.settimeout(2.0)
            sock.connect(path)
            sock.sendall(request)
            sock.settimeout(ANSWER_TIMEOUT)
            chunks = []
            while chunk := sock.recv(65536):
                chunks.append(chunk)
        except OSError as exc:
            raise UnreachableError(
                f"node agent at {path} unreachable: {exc.strerror or exc}"
            ) from exc
    finally:
        sock.close()
    return _answer(b"".join(chunks), path)


def _answer(data: bytes, path: str) -> tuple[int, str]:
    """``HTTP/1.1 200 OK`` with ``<exit code>\\n<stdout>``; anything else is the agent's own
    failure (its text says which)."""
    head, sep, body = data.partition(b"\r\n\r\n")
    if not sep:
        raise UnreachableError(f"node agent at {path} closed the connection before answering")
    status = head.split(b" ", 2)[1:2]
    text = body.decode("utf-8", "replace")
    if status != [b"200"]:
        raise RefusedError(text.strip()[:500] or "no reason given")
    code, _, out = text.partition("\n")
    if code not in ("0", "1"):
        raise RefusedError(f"malformed answer {text[:100]!r}")
    return int(code), out.rstrip("\n")


def _agent_gone(command: str, run_dir: str, reason: str, stdin: bytes) -> int:
    version = _version_of(stdin)
    pod = _pod(os.environ.get("CNI_ARGS", ""))
    if command == "DEL":
        _log(run_dir, "warning", f"DEL {pod}: {reason}; nothing removed (the netns goes next)")
        return 0
    if command == "STATUS":
        return _fail(
            NOT_AVAILABLE,
            "meshctl-cni cannot serve ADD: the node agent is not answering",
            f"{reason}; is the meshctl-cni-node DaemonSet (meshctl cni install) running?",
            version,
        )
    msg = (
        f"the node agent did not answer, so pod {pod} cannot be captured; refusing to start it "
        "uncaptured (fail closed)"
    )
    _log(run_dir, "error", f"{command} {pod}: {msg}: {reason}")
    return _fail(AGENT_UNAVAILABLE, msg, reason, version)


def _pod(cni_args: str) -> str:
    found = dict(p.partition("=")[::2] for p in cni_args.split(";") if "=" in p)
    return f"{found.get('K8S_POD_NAMESPACE', '')}/{found.get('K8S_POD_NAME', '')}"


def _log(run_dir: str, level: str, msg: str) -> None:
    """One JSON line in the plugin's log (the agent, which logs everything else, is away)."""
    import json

    stamp = time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime())
    line = json.dumps({"time": stamp, "level": level, "logger": "meshctl.cni", "msg": msg})
    try:
        # No pathlib: it costs more to import than this whole client.
        with open(run_dir.rstrip("/") + "/" + LOG_NAME, "a", encoding="utf-8") as out:  # noqa: PTH123
            out.write(line + "\n")
    except OSError:
        sys.stderr.write(msg + "\n")


def _version(stdin: bytes) -> int:
    import json

    asked = LATEST_VERSION
    if stdin.strip():
        try:
            config = json.loads(stdin)
        except (ValueError, RecursionError):
            return _fail(DECODE_FAILURE, "failed to decode the network config on stdin", "", "")
        if isinstance(config, dict) and config.get("cniVersion") in SUPPORTED_VERSIONS:
            asked = config["cniVersion"]
    result = {"cniVersion": asked, "supportedVersions": list(SUPPORTED_VERSIONS)}
    sys.stdout.write(json.dumps(result) + "\n")
    return 0


def _version_of(stdin: bytes) -> str:
    """The config's ``cniVersion`` for an error JSON, when usable; else the latest."""
    version = config_string(stdin, "cniVersion")
    return version if version in SUPPORTED_VERSIONS else LATEST_VERSION


def _say_error(out: str) -> None:
    import json

    try:
        msg = json.loads(out).get("msg", "")
    except (ValueError, AttributeError):
        msg = out
    sys.stderr.write(f"Error: {msg}\n")


def _fail(code: int, msg: str, details: str, version: str) -> int:
    import json

    body = {"cniVersion": version or LATEST_VERSION, "code": code, "msg": msg}
    if details:
        body["details"] = details
    sys.stdout.write(json.dumps(body) + "\n")
    sys.stdout.flush()
    sys.stderr.write(f"Error: {msg}\n")
    return 1


def config_string(stdin: bytes, key: str) -> str | None:
    """The string value of ``key`` at the top level of the JSON object in ``stdin``, without a
    JSON parser (importing one costs more than the rest of this client).

    Reads only as much structure as it must: strings (with their escapes) and nesting depth. A
    value that holds an escape is decoded by ``json`` (rare). None when absent or not a string;
    a malformed document gives None or a guess, which only picks the socket: the agent parses
    the config itself and refuses it properly."""
    # A runtime's config is a few KiB; a huge one is the agent's to refuse, not ours to scan.
    text = stdin[:SCAN_LIMIT].decode("utf-8", "replace")
    depth, i, n = 0, 0, len(text)
    while i < n:
        c = text[i]
        if c == '"':
            end = _string_end(text, i)
            if end < 0:
                return None
            j = _skip_space(text, end + 1)
            if depth == 1 and j < n and text[j] == ":" and text[i + 1 : end] == key:
                k = _skip_space(text, j + 1)
                if k >= n or text[k] != '"':
                    return None
                close = _string_end(text, k)
                if close < 0:
                    return None
                raw = text[k + 1 : close]
                if "\\" not in raw:
                    return raw
                import json

                value = json.loads(text[k : close + 1])
                return value if isinstance(value, str) else None
            i = end + 1
            continue
        if c in "{[":
            depth += 1
        elif c in "}]":
            depth -= 1
        i += 1
    return None


def _string_end(text: str, start: int) -> int:
    """The index of the quote closing the string opened at ``start``; -1 if none."""
    i = start + 1
    while True:
        i = text.find('"', i)
        if i < 0:
            return -1
        slashes = 0
        while text[i - 1 - slashes] == "\\":
            slashes += 1
        if slashes % 2 == 0:
            return i
        i += 1


def _skip_space(text: str, i: int) -> int:
    while i < len(text) and text[i] in " \t\r\n":
        i += 1
    return i


if __name__ == "__main__":  # the unfrozen launcher script is this file
    sys.exit(main())
