"""Cancellation: what turns ``RunOptions.terminate`` into the ``stop`` a run checks.

``stop`` (a :class:`RunStop`) is a zero-argument callable that raises
:class:`RunTerminatedError` once the flag is set; the executor calls it between partitions
and passes it to each executable whose ``run`` takes a ``stop`` keyword (plugin API 1.3),
which calls it between its own steps (see ``ExecutionProvider.compile``). Its ``flag``, a
byte that ``RunOptions.terminate`` sets, is what compiled code polls between the parts of
one long kernel.
"""

from __future__ import annotations

import inspect

from ..errors import RunTerminatedError


def terminated_error() -> RunTerminatedError:
    """The error a cancelled run raises."""
    return RunTerminatedError("the run was terminated: RunOptions.terminate is set")


class RunStop:
    """The ``stop`` of one run made with ``RunOptions``: calling it raises
    :class:`RunTerminatedError` once the run is to end.

    ``flag`` is a one-byte ``bytearray`` that becomes 1 when ``RunOptions.terminate`` is set
    (from any thread) and stays 1 for this run, so that compiled code can poll it between the
    parts of a long kernel without the GIL and a kernel cut short never hands on its output
    (plugin API 1.3: an executable may read ``getattr(stop, "flag", None)``). ``close()``
    when the run ends.
    """

    __slots__ = ("flag", "_options")

    def __init__(self, run_options):
        self.flag = bytearray(1)
        self._options = run_options
        watch = getattr(run_options, "_watch", None)
        if watch is not None:  # RunOptions sets the flag itself; duck-typed options are polled
            watch(self.flag)

    def __call__(self) -> None:
        if self.flag[0] or self._options.terminate:
            self.flag[0] = 1
            raise terminated_error()

    @property
    def terminated(self) -> bool:
        """Whether the run is to end (the flag is set)."""
        if not self.flag[0] and self._options.terminate:
            self.flag[0] = 1
        return bool(self.flag[0])

    def close(self) -> None:
        """The run is over: later changes of ``terminate`` no longer reach this flag."""
        unwatch = getattr(self._options, "_unwatch", None)
        if unwatch is not None:
            unwatch(self.flag)


def make_stop(run_options):
    """The :class:`RunStop` of a run made with ``run_options`` (``None`` without options).
    Raises :class:`RunTerminatedError` at once when the flag is already set."""
    if run_options is None:
        return None
    stop = RunStop(run_options)
    if stop.terminated:
        stop.close()
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
