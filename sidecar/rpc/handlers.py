"""Registers servicers with the server behind one error boundary.

The generated `add_*Servicer_to_server` helpers are not used: their
deserializers turn a malformed message (invalid UTF-8 in a string, a broken
wire format) into an INTERNAL status. Here a request that does not parse is
INVALID_ARGUMENT, a domain refusal is its rich status, and anything else is
logged and answered INTERNAL without leaking details.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import grpc
from google.protobuf import message as pb_message
from google.protobuf.descriptor import ServiceDescriptor
from google.protobuf.message_factory import GetMessageClass

from sidecar.errors import EffectdError, FieldViolation, InvalidArgument
from sidecar.rpc import gate
from sidecar.rpc.errors import internal_status, to_status

log = logging.getLogger(__name__)

Handler = Callable[[Any, grpc.aio.ServicerContext[Any, Any]], Awaitable[Any]]
StreamHandler = Callable[[Any, grpc.aio.ServicerContext[Any, Any]], AsyncIterator[Any]]


@dataclass(frozen=True, slots=True)
class Undecodable:
    """Stands in for a request that did not parse."""

    type_name: str
    error: str


def _parser(cls: type[pb_message.Message]) -> Callable[[bytes], object]:
    def parse(data: bytes) -> object:
        try:
            return cls.FromString(data)
        except pb_message.DecodeError as exc:
            return Undecodable(cls.DESCRIPTOR.full_name, str(exc))

    return parse


def _guard(method: str, handler: Handler) -> Handler:
    async def guarded(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        try:
            if isinstance(request, Undecodable):
                raise InvalidArgument(
                    [
                        FieldViolation(
                            "", f"is not a valid {request.type_name}: {request.error}"
                        )
                    ]
                )
            return await handler(request, context)
        except EffectdError as exc:
            gate.note_refusal(exc.reason)
            status = to_status(exc)
        except Exception:
            log.exception("internal error in %s", method)
            status = internal_status("internal error; see the daemon log")
        await context.abort(status.code, status.details, status.trailing_metadata)
        raise AssertionError("abort returns only by raising")  # pragma: no cover

    return guarded


def _guard_stream(method: str, handler: StreamHandler) -> StreamHandler:
    async def guarded(
        request: Any, context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[Any]:
        try:
            if isinstance(request, Undecodable):
                raise InvalidArgument(
                    [
                        FieldViolation(
                            "", f"is not a valid {request.type_name}: {request.error}"
                        )
                    ]
                )
            async for item in handler(request, context):
                yield item
            return
        except EffectdError as exc:
            gate.note_refusal(exc.reason)
            status = to_status(exc)
        except Exception:
            log.exception("internal error in %s", method)
            status = internal_status("internal error; see the daemon log")
        await context.abort(status.code, status.details, status.trailing_metadata)

    return guarded


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
            raise ValueError(f"{m.full_name}: client streaming is not supported")
        if m.server_streaming:
            handlers[m.name] = grpc.unary_stream_rpc_method_handler(
                _guard_stream(m.full_name, getattr(servicer, m.name)),
                request_deserializer=_parser(request_cls),
                response_serializer=response_cls.SerializeToString,
            )
            continue
        handlers[m.name] = grpc.unary_unary_rpc_method_handler(
            _guard(m.full_name, getattr(servicer, m.name)),
            request_deserializer=_parser(request_cls),
            response_serializer=response_cls.SerializeToString,
        )
    return grpc.method_handlers_generic_handler(service.full_name, handlers)
