"""The node agent's ZDS server while the next node proxy of a rollout gets its snapshot beside the
old one (docs/ztunnel.md, "Rollout: a handover"): pods enrolled or removed meanwhile reach the
new proxy as they should. The proxies are the independent peer of tests/netns/zds_peer.py
(written from the proto alone), its ack of one snapshot add held to widen the window.
"""

from __future__ import annotations

import asyncio
import os
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path

from meshctl_plugins.cni.zdsserver import SnapshotEntry, ZdsServer

from meshctl.core.wire import zds
from tests.netns.zds_peer import ProxyPeer


async def until(condition: Callable[[], object], timeout: float = 5.0) -> None:
    end = asyncio.get_running_loop().time() + timeout
    while not condition():
        assert asyncio.get_running_loop().time() < end, "condition not reached"
        await asyncio.sleep(0.02)


def info(name: str) -> zds.WorkloadInfo:
    return zds.WorkloadInfo(name, "shop", "default")


async def handover(act: Callable[[ZdsServer, dict[str, int]], object]) -> tuple[list, list]:
    """Old proxy synced with pods a and b; the new one's snapshot held at a's add (b still to
    send) while ``act`` runs; what each proxy received (kind, uid) once the new one is synced."""
    with tempfile.TemporaryDirectory() as tmp:
        files = {uid: Path(tmp, uid) for uid in ("a", "b", "c")}
        fds = {}
        for uid, path in files.items():
            path.touch()
            fds[uid] = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        entries = {"a": SnapshotEntry("a", info("a"), fds["a"])}
        entries["b"] = SnapshotEntry("b", info("b"), fds["b"])
        server = ZdsServer(str(Path(tmp, "ztunnel.sock")))
        ready = asyncio.Event()
        ready.set()
        server.start(
            snapshot=lambda: list(entries.values()), on_snapshot=lambda u, a: None, ready=ready
        )
        release = threading.Event()
        old = new = None
        try:
            old = ProxyPeer(Path(server.path)).start()
            await until(lambda: server.connected == 1)
            new = ProxyPeer(Path(server.path), hold={"a": release}).start()
            await until(lambda: any(r.uid == "a" for r in new.received))  # snapshot under way
            outcome = act(server, fds)
            if asyncio.iscoroutine(outcome):
                task = asyncio.ensure_future(outcome)
                await asyncio.sleep(0.2)
                release.set()
                await task
            else:
                release.set()
            await until(lambda: server.connected == 2)
            return (
                [(r.kind, r.uid) for r in old.received],
                [(r.kind, r.uid) for r in new.received],
            )
        finally:
            release.set()
            for peer in (old, new):
                if peer is not None:
                    peer.close()
            await server.close()
            for fd in fds.values():
                os.close(fd)


def test_a_pod_enrolled_during_the_new_proxys_snapshot_goes_to_the_new_proxy() -> None:
    old, new = asyncio.run(handover(lambda server, fds: server.add("c", info("c"), fds["c"])))
    assert ("add", "c") in new, new
    assert new[-1] == ("snapshot_sent", ""), new
    assert ("add", "c") not in old  # the old one is about to go: it need not have it


def test_a_pod_removed_during_the_new_proxys_snapshot_is_never_handed_to_it() -> None:
    # The snapshot's list (a, b) was taken before the delete; a's add is under way, b's not yet:
    # b is left out (the agent closes its netns descriptor once the delete returns).
    old, new = asyncio.run(handover(lambda server, fds: server.delete("b")))
    assert ("del", "b") in old
    assert ("add", "b") not in new, new
    assert new[-1] == ("snapshot_sent", ""), new
