"""Registers servicers with the server.

The generated `add_*Servicer_to_server` helpers are not used: their
deserializers turn a malformed message (invalid UTF-8 in a string, a broken
wire format) into an INTERNAL status. Here a request that does not parse
becomes `Unparsed`, naming its message type, which the request boundary
(`sidecar.rpc.boundary`) refuses INVALID_ARGUMENT. The boundary also answers
the servicers' domain errors and failures: they are served behind the gate
(`sidecar.rpc.gate`) only.

A servicer may answer a unary call with bytes already in the wire form of
its response (Recover does, `sidecar.rpc.recovery`): they are sent as they
are.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import grpc
from google.protobuf import message as pb_message
from google.protobuf.descriptor import ServiceDescriptor
from google.protobuf.message_factory import GetMessageClass

from sidecar.rpc.boundary import parsing


def _parser(cls: type[pb_message.Message]) -> Callable[[bytes], Any] | None:
    return parsing(cls.FromString, cls.DESCRIPTOR.full_name)


def _serializer(cls: type[pb_message.Message]) -> Callable[[Any], bytes]:
    serialize = cls.SerializeToString

    def serializer(answer: Any) -> bytes:
        return answer if isinstance(answer, bytes) else serialize(answer)

    return serializer


def generic_handler(
    service: ServiceDescriptor, *servicers: object
) -> grpc.GenericRpcHandler[Any, Any]:
    """A handler for every unary, server-streaming and bidirectional RPC of
    `service`, served by the method of the same name of the first of
    `servicers` that has one."""
    handlers = {}
    for m in service.methods:
        request_cls = GetMessageClass(m.input_type)
        response_cls = GetMessageClass(m.output_type)
        serve = next(getattr(s, m.name) for s in servicers if hasattr(s, m.name))
        if m.client_streaming and not m.server_streaming:
            raise ValueError(f"{m.full_name}: client streaming is not supported")
        if m.client_streaming:
            # Served behind the gate only, which hands it its messages'
            # boundary (`sidecar.rpc.boundary.Boundary.session`).
            handlers[m.name] = grpc.stream_stream_rpc_method_handler(
                serve,
                request_deserializer=_parser(request_cls),
                response_serializer=response_cls.SerializeToString,
            )
            continue
        if m.server_streaming:
            handlers[m.name] = grpc.unary_stream_rpc_method_handler(
                serve,
                request_deserializer=_parser(request_cls),
                response_serializer=response_cls.SerializeToString,
            )
            continue
        handlers[m.name] = grpc.unary_unary_rpc_method_handler(
            serve,
            request_deserializer=_parser(request_cls),
            response_serializer=_serializer(response_cls),
        )
    return grpc.method_handlers_generic_handler(service.full_name, handlers)
