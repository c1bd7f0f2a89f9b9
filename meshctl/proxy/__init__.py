"""The shared proxy runtime: what every meshctl proxy is built from, below the plugins.

Owns the I/O shell of a proxy around the pure core; a plugin (the node and sidecar proxy today,
the ingress gateway next) adds only its process, its listeners' routing, its admin routes and its
CLI. Invariants: nothing here imports a plugin, typer or grpc (gRPC is ``meshctl.rpc``'s); the
adapters below (net, rpc, process, xds) never import this package (pyproject's layers contract).

Data plane (one worker process):
    tls           HBONE's TLS contexts per certificate generation; the identity a handshake proved
    tunnel        one HBONE connection: an asyncio protocol around the sans-IO core
    relay         bytes between an app socket and a tunnel stream or another socket; accept loops
    pool          pooled HBONE client connections by (source, destination identity, address)
    telemetry     Istio's TCP metrics registry and ``Flow``, one proxied connection's counters
    original_dst  a redirected connection's original destination (SO_ORIGINAL_DST)
    responder     a minimal HTTP/1.1 responder for a proxy's own ports (readiness, metrics, admin)

Supervisor (what feeds the data plane over the channel):
    file_sources  certificates from mounted files and workloads from the local config file
    ca_client     certificates from the mesh CA (``CreateCertificate``), renewed at half-life
    identities    per-identity certificates issued, cached and rotated (node proxy, gateway)
    xds_client    workloads from a control plane over Delta ADS, into the client's own store
"""
