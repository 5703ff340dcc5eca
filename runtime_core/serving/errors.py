"""Typed errors of the server: each is a :mod:`runtime_core.errors` class and knows its HTTP status."""

from __future__ import annotations

from ..errors import InputError, InvalidArgumentError, RunTerminatedError


class RequestError(InvalidArgumentError):
    """An inference request is malformed (bad JSON, unknown datatype, data that does not fit its
    shape, truncated binary data): HTTP 400."""

    status = 400


class ModelNotFoundError(InvalidArgumentError, KeyError):
    """The request names a model (or version) the server does not serve: HTTP 404."""

    status = 404

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0]) if self.args else ""


class RequestTooLargeError(RequestError):
    """The request body is larger than the server's limit: HTTP 413."""

    status = 413


class RequestTimeoutError(RunTerminatedError):
    """The request did not finish within the model's timeout; its run was terminated: HTTP 504."""

    status = 504


class ServerBusyError(RequestError):
    """The model's queue is full or the server is shutting down: HTTP 503."""

    status = 503


def http_status(exc: BaseException) -> int:
    """The HTTP status for an error a request caused: 4xx for what the client sent."""
    status = getattr(exc, "status", None)
    if status is not None:
        return int(status)
    if isinstance(exc, (InputError, InvalidArgumentError)):
        return 400
    if isinstance(exc, RunTerminatedError):
        return 504
    return 500
