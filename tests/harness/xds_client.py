"""A Delta ADS test client written from the protos alone (it shares no code with the product's
client in ``meshctl.proxy.xds_client``), to drive a discovery server the way ztunnel does and
look at exactly what comes back.

Owns: one stream (``open``), sending requests, reading responses with a deadline, ACK/NACK, and
decoding resource bodies with the generated message classes only.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import grpc
import grpc.aio
from google.protobuf import struct_pb2

from meshctl.proto import authorization_pb2, workload_pb2, xds_pb2, xds_pb2_grpc

ADDRESS = "type.googleapis.com/istio.workload.Address"
AUTHORIZATION = "type.googleapis.com/istio.security.Authorization"


class _Token(grpc.AuthMetadataPlugin):
    def __init__(self, token: str, cluster_id: str) -> None:
        self._headers = (("authorization", f"Bearer {token}"), ("clusterid", cluster_id))

    def __call__(self, context: Any, callback: Any) -> None:
        callback(self._headers, None)


def ztunnel_node(
    ip: str = "10.9.0.1", pod: str = "ztunnel-x", ns: str = "meshctl-system"
) -> xds_pb2.Node:
    metadata = struct_pb2.Struct()
    metadata.update({"NAME": pod, "NAMESPACE": ns, "INSTANCE_IPS": ip, "NODE_NAME": "node-1"})
    return xds_pb2.Node(id=f"ztunnel~{ip}~{pod}.{ns}~{ns}.svc.cluster.local", metadata=metadata)


@dataclass
class TestStream:
    """One open DeltaAggregatedResources call; a reader task queues what arrives (cancelling
    a grpc.aio read cancels the whole call, so ``recv`` waits on the queue instead)."""

    call: Any
    outbox: asyncio.Queue[xds_pb2.DeltaDiscoveryRequest | None] = field(
        default_factory=asyncio.Queue
    )
    inbox: asyncio.Queue[Any] = field(default_factory=asyncio.Queue)
    reader: asyncio.Task[None] | None = None

    def start(self) -> None:
        async def read() -> None:
            while True:
                try:
                    item = await self.call.read()
                except BaseException as exc:  # the call's status, or its cancellation  # noqa: BLE001
                    await self.inbox.put(exc)
                    return
                await self.inbox.put(item)
                if item is grpc.aio.EOF:
                    return

        self.reader = asyncio.ensure_future(read())

    async def send(self, **fields: Any) -> None:
        await self.outbox.put(xds_pb2.DeltaDiscoveryRequest(**fields))

    async def recv(self, timeout: float = 5.0) -> xds_pb2.DeltaDiscoveryResponse:
        response = await asyncio.wait_for(self.inbox.get(), timeout)
        if isinstance(response, BaseException):
            await self.inbox.put(response)  # every later recv fails the same way
            raise response
        if response is grpc.aio.EOF:
            await self.inbox.put(response)
            raise EOFError("the server ended the stream")
        assert isinstance(response, xds_pb2.DeltaDiscoveryResponse)
        return response

    async def ack(self, response: xds_pb2.DeltaDiscoveryResponse) -> None:
        await self.send(type_url=response.type_url, response_nonce=response.nonce)

    async def nack(self, response: xds_pb2.DeltaDiscoveryResponse, message: str) -> None:
        await self.send(
            type_url=response.type_url,
            response_nonce=response.nonce,
            error_detail=xds_pb2.Status(message=message),
        )

    async def subscribe(
        self,
        type_url: str,
        names: Sequence[str] = (),
        *,
        unsubscribe: Sequence[str] = (),
        initial: Mapping[str, str] | None = None,
        node: xds_pb2.Node | None = None,
    ) -> None:
        fields: dict[str, Any] = {
            "type_url": type_url,
            "resource_names_subscribe": list(names),
            "resource_names_unsubscribe": list(unsubscribe),
            "initial_resource_versions": dict(initial or {}),
        }
        if node is not None:
            fields["node"] = node
        await self.send(**fields)

    async def close(self) -> None:
        await self.outbox.put(None)
        self.call.cancel()
        if self.reader is not None:
            await asyncio.gather(self.reader, return_exceptions=True)


async def open_stream(
    address: str,
    *,
    root_pem: bytes,
    token: str | None,
    server_name: str | None = None,
    cluster_id: str = "Kubernetes",
) -> tuple[grpc.aio.Channel, TestStream]:
    credentials = grpc.ssl_channel_credentials(root_certificates=root_pem)
    if token is not None:
        credentials = grpc.composite_channel_credentials(
            credentials, grpc.metadata_call_credentials(_Token(token, cluster_id))
        )
    options: list[tuple[str, Any]] = [("grpc.use_local_subchannel_pool", 1)]
    if server_name:
        options.append(("grpc.ssl_target_name_override", server_name))
    channel = grpc.aio.secure_channel(address, credentials, options=options)
    stub = xds_pb2_grpc.AggregatedDiscoveryServiceStub(channel)
    stream = TestStream(call=None)

    async def requests() -> AsyncIterator[xds_pb2.DeltaDiscoveryRequest]:
        while (item := await stream.outbox.get()) is not None:
            yield item

    stream.call = stub.DeltaAggregatedResources(requests())
    stream.start()
    return channel, stream


def decode(response: xds_pb2.DeltaDiscoveryResponse) -> dict[str, Any]:
    """name -> decoded message (Workload, Service or Authorization)."""
    out: dict[str, Any] = {}
    for r in response.resources:
        if response.type_url == AUTHORIZATION:
            out[r.name] = authorization_pb2.Authorization.FromString(r.resource.value)
        else:
            address = workload_pb2.Address.FromString(r.resource.value)
            out[r.name] = getattr(address, address.WhichOneof("type") or "workload")
    return out
