"""The simulator's client errors: an OpenAI-style error body and the exception that carries it
(raised while a request is parsed, its media included; answered by the server)."""
from __future__ import annotations

import orjson

__all__ = ["RequestError", "error_body"]


class RequestError(Exception):
    """A client error answered with an OpenAI-style error body."""

    def __init__(self, status: int, message: str, etype: str = "invalid_request_error",
                 code: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.etype, self.code = status, message, etype, code

    def body(self) -> bytes:
        return error_body(self.status, self.message, self.etype, self.code)


def error_body(status: int, message: str, etype: str = "invalid_request_error",
               code: str | None = None) -> bytes:
    return orjson.dumps({"error": {"message": message, "type": etype, "param": None,
                                   "code": code if code is not None else status}})
