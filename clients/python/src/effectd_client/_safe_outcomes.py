"""What the safe call records for a tool's outcome: unknown, error, or a value.

`is_unknown` says whether an exception leaves the tool's effect unknown
(ADR-010: an unknown outcome is never converted into success or failure):

  1. the tool's own declarations: `unknown_on`, then `definite_on`;
  2. `OutcomeUnknown`, any exception with `outcome_unknown = True`, builtin
     `TimeoutError` (and `asyncio.TimeoutError`), `ConnectionError`, a
     cancelled task;
  3. the transport and timeout families of common client libraries
     (`TRANSPORT_FAMILIES`), looked up only in modules already imported: an
     exception of a library nobody imported cannot exist, so none is imported
     here;
  4. gRPC failures whose request may have been served (`GRPC_UNKNOWN_CODES`),
     from `grpc.RpcError` or this client's own `EffectdError`;
  5. the exception it was raised from or while handling (`__cause__`, else
     `__context__` unless suppressed with `from None`), with the same rules.

Anything else is a definite failure, committed as an error result.

`encode_result` turns a tool's return value into what the ledger can store:
the `serialize` hook's answer, or the value itself, made JSON by a documented
fallback (`jsonable`), so that a tool that ran is never recorded as failed
because of its return type.
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import datetime
import enum
import json
import math
import re
import sys
from collections.abc import Callable, Iterable
from typing import Any

from effectd_client._exceptions import EffectdError, OutcomeUnknown

# A declaration: an exception class (with its subclasses) or a predicate.
Matcher = type[BaseException] | Callable[[BaseException], bool]

BUILTIN_UNKNOWN: tuple[type[BaseException], ...] = (
    TimeoutError,
    ConnectionError,
    asyncio.CancelledError,
)

# (module, attribute) of exception classes whose instances (and subclasses')
# mean "the request may have reached the other side": a timeout, a reset, a
# connection closed before or during the answer.
TRANSPORT_FAMILIES: tuple[tuple[str, str], ...] = (
    ("httpx", "TimeoutException"),
    ("httpx", "NetworkError"),
    ("httpx", "RemoteProtocolError"),
    ("httpx2", "TimeoutException"),
    ("httpx2", "NetworkError"),
    ("httpx2", "RemoteProtocolError"),
    ("requests.exceptions", "Timeout"),
    ("requests.exceptions", "ConnectionError"),
    ("requests.exceptions", "ChunkedEncodingError"),
    ("urllib3.exceptions", "TimeoutError"),
    ("urllib3.exceptions", "ProtocolError"),
    ("urllib3.exceptions", "MaxRetryError"),
    ("http.client", "IncompleteRead"),
    ("aiohttp", "ClientConnectionError"),
    ("aiohttp", "ClientPayloadError"),
    ("botocore.exceptions", "ConnectionError"),
    ("botocore.exceptions", "HTTPClientError"),
    ("botocore.exceptions", "IncompleteReadError"),
    ("openai", "APIConnectionError"),
    ("anthropic", "APIConnectionError"),
)

# gRPC status names after which the server may have acted on the request.
GRPC_UNKNOWN_CODES = frozenset(
    {"UNAVAILABLE", "DEADLINE_EXCEEDED", "UNKNOWN", "CANCELLED"}
)


def _matches(exc: BaseException, matchers: Iterable[Matcher]) -> bool:
    for m in matchers:
        if isinstance(m, type):
            if isinstance(exc, m):
                return True
        elif m(exc):
            return True
    return False


def _library_unknown(exc: BaseException) -> bool:
    for module_name, attribute in TRANSPORT_FAMILIES:
        module = sys.modules.get(module_name)
        cls = getattr(module, attribute, None) if module is not None else None
        if isinstance(cls, type) and isinstance(exc, cls):
            return True
    return False


def _grpc_code_name(exc: BaseException) -> str:
    if isinstance(exc, EffectdError):
        return exc.code.name
    grpc = sys.modules.get("grpc")
    rpc_error = getattr(grpc, "RpcError", None) if grpc is not None else None
    if not (isinstance(rpc_error, type) and isinstance(exc, rpc_error)):
        return ""
    code = getattr(exc, "code", None)
    try:
        status = code() if callable(code) else None
    except Exception:  # a hand-made RpcError may have no status
        return ""
    return str(getattr(status, "name", ""))


def _known_unknown(exc: BaseException) -> bool:
    if isinstance(exc, (OutcomeUnknown, *BUILTIN_UNKNOWN)):
        return True
    if getattr(exc, "outcome_unknown", False) is True:
        return True
    if _library_unknown(exc):
        return True
    return _grpc_code_name(exc) in GRPC_UNKNOWN_CODES


def is_unknown(
    exc: BaseException,
    unknown_on: Iterable[Matcher] = (),
    definite_on: Iterable[Matcher] = (),
) -> bool:
    """Whether `exc`, raised by a tool, leaves its effect unknown."""
    unknown_on, definite_on = tuple(unknown_on), tuple(definite_on)
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if _matches(current, unknown_on):
            return True
        if _matches(current, definite_on):
            return False
        if _known_unknown(current):
            return True
        if current.__cause__ is not None:
            current = current.__cause__
        elif current.__suppress_context__:
            current = None
        else:
            current = current.__context__
    return False


# -- results -------------------------------------------------------------------

# JSON numbers the daemon stores exactly (RFC 8785 reads them as doubles).
SAFE_INTEGER = 2**53 - 1


def jsonable(value: Any) -> Any:
    """`value` as plain JSON, lossless where JSON can say it (the fallback).

    JSON values stay as they are (tuples become lists). Otherwise: a
    dataclass becomes an object of its fields, an object with `model_dump`
    (pydantic) its `model_dump(mode="json")`, an enum its value, a set a
    list, bytes base64 text, a date or time its ISO 8601 text, an integer
    beyond +-(2**53 - 1) or a float that is not finite its text, a key that
    is not a string its text; anything else `str(value)`, and a value that
    contains itself `"<cycle>"`.
    """
    return _jsonable(value, set())


def _jsonable(value: Any, active: set[int]) -> Any:  # noqa: PLR0911, PLR0912
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, enum.Enum):
        return _jsonable(value.value, active)
    if isinstance(value, str):
        return str(value)
    if isinstance(value, int):
        return int(value) if abs(value) <= SAFE_INTEGER else str(value)
    if isinstance(value, float):
        return float(value) if math.isfinite(value) else repr(value)
    if isinstance(value, bytes | bytearray | memoryview):
        return base64.b64encode(bytes(value)).decode("ascii")
    if isinstance(value, datetime.date | datetime.time):
        return value.isoformat()
    if id(value) in active:
        return "<cycle>"
    active.add(id(value))
    try:
        if isinstance(value, dict):
            out: dict[str, Any] = {}
            for k, v in value.items():
                key = k if isinstance(k, str) else str(_jsonable(k, active))
                out[key if key not in out else repr(k)] = _jsonable(v, active)
            return out
        if isinstance(value, list | tuple):
            return [_jsonable(v, active) for v in value]
        if isinstance(value, set | frozenset):
            return sorted((_jsonable(v, active) for v in value), key=_sort_key)
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            return {
                f.name: _jsonable(getattr(value, f.name), active)
                for f in dataclasses.fields(value)
            }
        dump = getattr(value, "model_dump", None)
        if callable(dump):
            return _jsonable(dump(mode="json"), active)
        return str(value)
    finally:
        active.discard(id(value))


def _sort_key(v: Any) -> str:
    return json.dumps(v, sort_keys=True)


def encode_result(value: Any, serialize: Callable[[Any], Any] | None, raw: bool) -> Any:
    """What is committed for a tool that returned `value`: JSON, or bytes.

    Raises only what `serialize` raises.
    """
    if serialize is not None:
        value = serialize(value)
    if raw:
        if isinstance(value, bytes | bytearray | memoryview):
            return bytes(value)
        if isinstance(value, str):
            return value.encode("utf-8", "surrogatepass")
        return json.dumps(jsonable(value), ensure_ascii=False).encode()
    if isinstance(value, bytes | bytearray):
        return bytes(value)  # committed as raw bytes, as before
    return jsonable(value)


# -- texts the daemon bounds ---------------------------------------------------

# The daemon's limits (as for identifiers, contract §3.1): an error code is an
# identifier, a message or a reason free text; both refuse control characters
# other than \n and \t.
MAX_CODE_BYTES = 256
MAX_TEXT_BYTES = 4096
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def bounded_text(text: str, max_bytes: int = MAX_TEXT_BYTES) -> str:
    """`text` made acceptable to the daemon: printable, valid, cut to size."""
    text = _CONTROL.sub("?", text)
    data = text.encode("utf-8", "replace")
    if len(data) <= max_bytes:
        return data.decode("utf-8")
    return data[: max_bytes - 3].decode("utf-8", "ignore") + "..."
