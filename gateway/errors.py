"""The gateway's own error tree, translated to OpenAI's error JSON at the boundary.

GatewayError                      500 server_error
├── InvalidRequest                400 invalid_request_error
│   ├── MalformedJSON             400
│   ├── UnknownModel              404 model_not_found
│   ├── NotFound                  404 (an unknown path, a response id no replica is known to hold)
│   ├── MethodNotAllowed          405
│   ├── BodyTooLarge              413
│   └── ClientGone                499 (the client went away before its body was read; nobody to answer)
├── AuthenticationError           401 invalid_api_key (a missing or wrong API key or admin token)
├── RateLimited                   429 rate_limit_exceeded (with Retry-After and x-ratelimit-* headers)
├── NoHealthyBackend              503 service_unavailable
└── UpstreamError                 502 upstream_error
    ├── UpstreamConnectError      502
    └── UpstreamTimeout           504

RulesError                        a rules file that does not validate (not an HTTP error)
MissingExtra                      a setting needs an optional extra that is not installed (not an HTTP error)
"""

from __future__ import annotations

from typing import TypeVar

import orjson

_E = TypeVar("_E", bound=BaseException)


class GatewayError(Exception):
    status_code = 500
    error_type = "server_error"
    code: str | None = None
    headers: tuple[tuple[bytes, bytes], ...] = ()  # extra response headers (Retry-After, x-ratelimit-*)

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        if code is not None:
            self.code = code

    def to_json(self) -> bytes:
        return error_body(self.message, self.error_type, self.param, self.code)


class InvalidRequest(GatewayError):
    status_code = 400
    error_type = "invalid_request_error"


class MalformedJSON(InvalidRequest):
    code = "invalid_json"


class UnknownModel(InvalidRequest):
    status_code = 404
    code = "model_not_found"


class NotFound(InvalidRequest):
    """OpenAI answers an unknown URL or object with 404, ``invalid_request_error`` and a null code."""

    status_code = 404


class MethodNotAllowed(InvalidRequest):
    status_code = 405


class BodyTooLarge(InvalidRequest):
    status_code = 413
    code = "request_too_large"


class ClientGone(InvalidRequest):
    """Counted as 499 (nginx's "client closed request"), not as a malformed request: the client disconnected
    (or its connection was refused by the HTTP layer) before the whole body arrived."""

    status_code = 499
    code = "client_closed_request"


class AuthenticationError(GatewayError):
    status_code = 401
    error_type = "invalid_request_error"
    code = "invalid_api_key"


class RateLimited(GatewayError):
    """Over a per-key limit. ``error_type`` is "requests" or "tokens", as OpenAI's 429s say."""

    status_code = 429
    error_type = "requests"
    code = "rate_limit_exceeded"

    def __init__(
        self, message: str, error_type: str, headers: tuple[tuple[bytes, bytes], ...], limit: str = "rpm"
    ) -> None:
        super().__init__(message)
        self.error_type = error_type
        self.headers = headers
        self.limit = limit  # which of the key's limits refused it: rpm, tpm or concurrency


class NoHealthyBackend(GatewayError):
    status_code = 503
    error_type = "service_unavailable"
    code = "no_healthy_backend"


class ShuttingDown(GatewayError):
    """The gateway's shutdown grace period ran out while this request was still in flight."""

    status_code = 503
    error_type = "service_unavailable"
    code = "shutting_down"


class UpstreamError(GatewayError):
    status_code = 502
    error_type = "upstream_error"
    code = "upstream_error"


class UpstreamConnectError(UpstreamError):
    code = "upstream_connect_error"


class UpstreamTimeout(UpstreamError):
    status_code = 504
    code = "upstream_timeout"


class RulesError(Exception):
    """A rules file failed to load; ``problems`` are ``path: message`` lines naming the bad key."""

    def __init__(self, source: str, problems: list[str]) -> None:
        self.source = source
        self.problems = problems
        super().__init__(f"{source}: " + "; ".join(problems))


def chained(error: _E, cause: BaseException | None) -> _E:
    """``error`` as ``raise error from cause`` leaves it: ``cause`` as its ``__cause__`` (None: the context hidden).

    The coroutines that run compiled (gateway/compiled.py) raise ``chained(...)`` instead of ``raise ... from``:
    mypyc 2.4.1 drops the cause of an exception raised that way in a coroutine (the interpreter keeps it)."""
    error.__cause__ = cause
    error.__suppress_context__ = True
    return error


def error_body(message: str, error_type: str, param: str | None = None, code: str | None = None) -> bytes:
    """OpenAI's error shape: ``{"error": {"message", "type", "param", "code"}}``."""
    return orjson.dumps({"error": {"message": message, "type": error_type, "param": param, "code": code}})


class MissingExtra(RuntimeError):
    """A setting needs an optional dependency (``pip install 'specgate[EXTRA]'``) that is not installed."""
