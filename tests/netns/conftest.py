"""Every netns test that starts a data plane fails if an exception escaped into its log."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.netns.ztunnel_harness import unhandled_errors_since_last_check


@pytest.fixture(autouse=True)
def _no_exception_escapes_the_data_plane() -> Iterator[None]:
    unhandled_errors_since_last_check()  # a previous test's leftovers are its own
    yield
    found = unhandled_errors_since_last_check()
    if found:
        pytest.fail(
            "an exception reached the event loop or a task (a bug, whatever the peer did):\n"
            + "\n".join(found[:20])
        )
