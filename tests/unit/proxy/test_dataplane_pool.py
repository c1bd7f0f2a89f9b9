"""The pool's dialling rules, with the dial itself replaced (the sockets are netns tests')."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest
import uvloop

from meshctl.core.pki.identity import SpiffeId
from meshctl.core.wire.hbone import TunnelSettings
from meshctl.proxy.pool import DialError, Pool

KEY = (
    SpiffeId("cluster.local", "a", "a"),
    SpiffeId("cluster.local", "b", "b"),
    ("10.0.0.2", 15008),
)


def _pool(dial) -> Pool:
    pool = Pool(
        contexts=lambda: None,  # type: ignore[arg-type,return-value]
        settings=TunnelSettings(),
        max_streams=100,
        idle_timeout=300,
        connect_timeout=1,
        handshake_timeout=1,
        new_socket=lambda ip: None,  # type: ignore[arg-type,return-value]
    )
    pool._dial = dial  # type: ignore[method-assign]
    return pool


def _died_after_handshake() -> SimpleNamespace:
    """What a TLS 1.3 dial returns when the peer refuses our certificate: connected, then dead
    by the time the waiting stream looks at it."""
    return SimpleNamespace(
        usable=False,
        error="peer closed the connection before speaking HTTP/2 (did it refuse our certificate?)",
        flags="TLS",
        core=SimpleNamespace(can_open=lambda: True),
    )


def test_a_connection_dead_after_its_handshake_fails_its_waiters_and_is_not_redialled():
    dials = []

    async def dial(key):
        dials.append(key)
        await asyncio.sleep(0)
        return _died_after_handshake()

    async def main() -> None:
        async with asyncio.timeout(10):  # the old pool dialled forever here
            await scenario()

    async def scenario() -> None:
        pool = _pool(dial)
        for _ in range(3):  # three app connections, one after another
            with pytest.raises(DialError) as err:
                await pool.connection(KEY)
            assert err.value.flags == "TLS"
            assert "refuse our certificate" in str(err.value)
        # Ten streams waiting on one dial share its failure: still one handshake.
        results = await asyncio.gather(
            *(pool.connection(KEY) for _ in range(10)), return_exceptions=True
        )
        assert all(isinstance(r, DialError) for r in results)

    uvloop.run(main())
    assert len(dials) == 4  # one per app connection, and one for the ten that shared it
