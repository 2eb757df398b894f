"""One taxonomy of request failures for both HTTP clients (raw asyncio and aiohttp).

Every failed request carries a :class:`RequestFailure`: its :class:`ErrorKind`, a message and,
for HTTP errors, the status. The raw client classifies while it parses; the aiohttp client maps
aiohttp's exceptions with :func:`classify_aiohttp`, so the same reply from a server is the same
kind whichever client read it (``tests/reliability`` sends the same garbage to both).
"""
from __future__ import annotations

import asyncio
import enum
from dataclasses import dataclass

from ..exportmodel import ErrorDetails

DEFAULT_MAX_RESPONSE_BYTES = 64 << 20  # per response; a larger one is ResponseTooLarge


class ErrorKind(str, enum.Enum):
    """What went wrong with one request (the ``type`` of its error in exports)."""

    HTTP = "HTTPError"                  # the server answered with a status >= 400 (or < 200)
    TIMEOUT = "Timeout"                 # no complete response within --request-timeout
    CONNECT = "ConnectionError"         # could not connect (refused, unreachable)
    RESET = "ConnectionReset"           # the connection closed before the response ended
    MALFORMED = "MalformedStream"       # not HTTP, bad framing, invalid JSON or SSE event
    EMPTY = "EmptyResponse"             # a well-formed response without any content
    SERVER = "ServerError"              # an error object inside a 200 response or stream
    TOO_LARGE = "ResponseTooLarge"      # more than --max-response-mb: reading stopped
    INVALID_REQUEST = "InvalidRequest"  # the loader could not build the request
    CANCELLED = "Cancelled"             # cancelled at shutdown
    CLIENT = "ClientError"              # a defect in the loader itself


@dataclass(frozen=True)
class RequestFailure:
    """One failed request: its kind, a human message and the HTTP status when there is one."""

    kind: ErrorKind
    message: str
    code: int | str | None = None

    def as_dict(self) -> ErrorDetails:
        return {"type": self.kind.value, "code": self.code, "message": self.message}


def error(kind: ErrorKind | str, message: str, code: int | str | None = None) -> ErrorDetails:
    """The export form of a failure (``{"type", "code", "message"}``)."""
    return RequestFailure(ErrorKind(kind), message, code).as_dict()


def too_large(limit: int) -> ErrorDetails:
    return error(ErrorKind.TOO_LARGE, f"response larger than {limit / (1 << 20):g} MB; stopped "
                                      "reading (raise --max-response-mb)")


def classify_aiohttp(exc: BaseException, timeout_s: float) -> ErrorDetails:
    """The failure an aiohttp exception means, in the raw client's terms."""
    import aiohttp
    from aiohttp import http_exceptions

    if isinstance(exc, asyncio.TimeoutError):
        return error(ErrorKind.TIMEOUT, f"no complete response within {timeout_s:g} s")
    if isinstance(exc, aiohttp.ClientPayloadError):
        cause = exc.__cause__ or (exc.args[1] if len(exc.args) > 1 else None)
        if isinstance(cause, (http_exceptions.ContentLengthError,
                              http_exceptions.TransferEncodingError)) or \
                "not completed" in str(exc):
            return error(ErrorKind.RESET, f"connection closed mid-stream ({exc})")
        return error(ErrorKind.MALFORMED, f"bad response body ({exc})")
    if isinstance(exc, (aiohttp.ServerDisconnectedError, ConnectionResetError)):
        return error(ErrorKind.RESET, f"connection closed ({exc.__class__.__name__})")
    if isinstance(exc, aiohttp.ClientConnectorError):
        return error(ErrorKind.CONNECT, f"cannot connect: {exc}")
    if isinstance(exc, aiohttp.ClientOSError):  # connected, then the server went away
        return error(ErrorKind.RESET, f"connection closed before any response ({exc})")
    if isinstance(exc, (aiohttp.ClientResponseError, http_exceptions.HttpProcessingError)):
        # aiohttp's parser refused the status line, a header or the framing: not HTTP we can read
        message = getattr(exc, "message", "") or str(exc)
        return error(ErrorKind.MALFORMED,
                     f"not a valid HTTP response: {' '.join(str(message).split())[:120]}")
    return error(ErrorKind.CONNECT, f"{exc.__class__.__name__}: {exc}")
