"""TLS as the gateway sees it before any handshake: a sans-IO ClientHello reader
(``clienthello``) and the names SNI carries (``sni``). Nothing here terminates TLS or touches
a socket: the proxy feeds bytes in and replays them upstream unchanged."""
