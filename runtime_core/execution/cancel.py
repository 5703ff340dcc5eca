"""Cancellation: what turns ``RunOptions.terminate`` into the ``stop`` a run checks.

``stop`` is a zero-argument callable that raises :class:`RunTerminatedError` once the
flag is set; the executor calls it between partitions and passes it to each executable
whose ``run`` takes a ``stop`` keyword (plugin API 1.3), which calls it between its
own steps (see ``ExecutionProvider.compile``).
"""

from __future__ import annotations

import inspect

from ..errors import RunTerminatedError


def terminated_error() -> RunTerminatedError:
    """The error a cancelled run raises."""
    return RunTerminatedError("the run was terminated: RunOptions.terminate is set")


def make_stop(run_options):
    """The ``stop`` callable of a run made with ``run_options`` (``None`` without options).
    Raises :class:`RunTerminatedError` at once when the flag is already set."""
    if run_options is None:
        return None
    if getattr(run_options, "terminate", False):
        raise terminated_error()

    def stop() -> None:
        if run_options.terminate:
            raise terminated_error()
    return stop


def accepts_stop(run) -> bool:
    """Whether an executable's ``run`` takes a ``stop`` keyword (decided once, at compile)."""
    try:
        params = inspect.signature(run).parameters
    except (TypeError, ValueError):
        return False
    return "stop" in params or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())


def in_chain(exc: BaseException | None, cls: type):
    """The first exception of class ``cls`` in ``exc``'s chain of causes (``__cause__``, else
    ``__context__``), or ``None``: providers wrap their kernels' errors."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, cls):
            return exc
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return None


def find_terminated(exc: BaseException) -> RunTerminatedError | None:
    """The :class:`RunTerminatedError` in ``exc``'s chain of causes, if any: a provider
    may wrap the error ``stop`` raised (a kernel running a subgraph does)."""
    return in_chain(exc, RunTerminatedError)
