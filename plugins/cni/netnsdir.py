"""Where the container runtime pins pod netns, against the directory the node agent mounts.

Owns noticing (and saying once) that the runtime pins netns where this agent cannot see them,
from any pod's sandbox, long before an enrolled pod fails on it, and the enrollment error that
names the fix (``components.cni.netnsDir``). Invariant: ``unseen`` only grows (each directory
once, with the first pod seen there); verify reads it through the agent's health.
"""

from __future__ import annotations

import errno
import logging
from pathlib import Path

from .podstate import EnrollmentError, PodState

log = logging.getLogger(__name__)


class NetnsDir:
    """``mounted``: the netns directory the agent sees ("" when not configured)."""

    def __init__(self, mounted: str) -> None:
        self.mounted = mounted
        # Directories of reported netns paths this agent cannot see (the runtime pins them
        # outside the mounted netns directory): every pod there fails, and verify says why.
        self.unseen: dict[str, str] = {}  # directory -> a pod whose netns was there

    def check(self, state: PodState) -> None:
        """Remember (and say once) where the runtime pins netns this agent cannot see: any
        pod's sandbox shows it, long before an enrolled pod fails on it."""
        where = str(Path(state.netns).parent)
        mounted = self.mounted
        if not mounted or where in self.unseen or _within(state.netns, mounted):
            return
        if Path(state.netns).exists():
            return  # visible all the same (the runtime's path is inside another mount)
        self.unseen[where] = state.ref
        log.error(
            "pod %s: its network namespace %s is not visible to the node agent (it mounts %s); "
            "ambient pods on this node cannot be enrolled: reinstall with "
            "--set components.cni.netnsDir=%s",
            state.ref,
            state.netns,
            mounted,
            where,
        )

    def vanished(self, state: PodState, exc: OSError) -> EnrollmentError:
        """Why ``state``'s netns cannot be opened, with the fix when it lies outside the
        directory this agent mounts (the runtime pins netns elsewhere)."""
        where = str(Path(state.netns).parent)
        mounted = self.mounted
        if exc.errno == errno.ENOENT and mounted and not _within(state.netns, mounted):
            self.unseen.setdefault(where, state.ref)
            return EnrollmentError(
                f"pod {state.ref}: its network namespace {state.netns} is not visible to the node "
                f"agent: the container runtime pins pod netns in {where}, but the agent mounts "
                f"{mounted}; reinstall with --set components.cni.netnsDir={where}",
                retry=False,
            )
        return EnrollmentError(
            f"pod {state.ref}: network namespace {state.netns} vanished: {exc.strerror or exc}",
            retry=False,
        )


def _within(path: str, directory: str) -> bool:
    return Path(path).is_relative_to(directory) or Path(path).is_relative_to(
        Path(directory).resolve()
    )
