"""Registers servicers with the server.

The generated `add_*Servicer_to_server` helpers are not used: their
deserializers turn a malformed message (invalid UTF-8 in a string, a broken
wire format) into an INTERNAL status. Here a request that does not parse
becomes `Unparsed`, naming its message type, which the request boundary
(`sidecar.rpc.boundary`) refuses INVALID_ARGUMENT. The boundary also answers
the servicers' domain errors and failures: they are served behind the gate
(`sidecar.rpc.gate`) only.
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


def generic_handler(
    service: ServiceDescriptor, servicer: object
) -> grpc.GenericRpcHandler[Any, Any]:
    """A handler for every unary and server-streaming RPC of `service`,
    served by the servicer's method of the same name."""
    handlers = {}
    for m in service.methods:
        request_cls = GetMessageClass(m.input_type)
        response_cls = GetMessageClass(m.output_type)
        if m.client_streaming:
            # The session stream is served by its own handler
            # (not yet: until then it answers UNIMPLEMENTED).
            continue
        if m.server_streaming:
            handlers[m.name] = grpc.unary_stream_rpc_method_handler(
                getattr(servicer, m.name),
                request_deserializer=_parser(request_cls),
                response_serializer=response_cls.SerializeToString,
            )
            continue
        handlers[m.name] = grpc.unary_unary_rpc_method_handler(
            getattr(servicer, m.name),
            request_deserializer=_parser(request_cls),
            response_serializer=response_cls.SerializeToString,
        )
    return grpc.method_handlers_generic_handler(service.full_name, handlers)
