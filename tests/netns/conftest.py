"""Every netns test that starts a data plane fails if an exception escaped into its log."""

from __future__ import annotations

from tests.netns.ztunnel_harness import no_exception_escapes_the_data_plane

__all__ = ["no_exception_escapes_the_data_plane"]  # an autouse fixture: registered by import
