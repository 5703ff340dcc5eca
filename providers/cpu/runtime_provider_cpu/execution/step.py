"""The one step body: every run path (sequential, profiled, parallel) calls :func:`run_step`.

A step is the tuple ``(fn, ctx, in_slots, out_slots, attrs, frees, alt)`` fixed when the
partition compiles: the kernel (or its bound call), its :class:`KernelContext`, the slots it
reads and writes (``-1``: an omitted output), its resolved attributes, the slots that die
after it, and its in-place variant with its candidate inputs (or ``None``).
"""

from __future__ import annotations

import contextvars

import numpy as np

from ..fast.policy import NATIVE as _NATIVE
from . import inplace

#: slot 0 always holds None: omitted optional inputs read it
NONE_SLOT = 0

#: the run's ``stop`` callable (see :meth:`CPUExecutable.run`) while a run is in progress,
#: for what runs inside a kernel: subgraph bodies and the iterations of Loop and Scan
STOP: contextvars.ContextVar = contextvars.ContextVar("runtime_provider_cpu_stop", default=None)

#: True while a run's steps execute on this thread inside the run's ``np.errstate(all="ignore")``
#: (set by ``CPUExecutable._run``): kernels then skip their own ``np.errstate`` (~2 us an enter
#: and exit under the GIL; see ``ops/_common.ignore_fp``)
FP_IGNORED: contextvars.ContextVar = contextvars.ContextVar("runtime_provider_cpu_fp_ignored", default=False)


def run_scope(stop, limit: int = -1, joined: bool = False):
    """Open the compiled kernels' run scope on this thread (``_native.run_enter``): the kernel
    pool counts the run as one in flight (its cores are shared with concurrent runs) and the
    parts of a long kernel poll ``stop``'s flag (``RunStop.flag``: a byte the core sets with
    ``RunOptions.terminate``). Returns what :func:`end_scope` takes (None without the extension).

    A thread's outermost scope first waits its turn, the GIL released, while ``limit`` runs are
    in flight (-1: the process's, ``_native.run_gate``; 0: no limit); scopes inside it (If, Loop
    and Scan bodies, a session run inside a kernel) and ``joined`` ones (a thread working for a
    run already admitted: the parallel executor's helpers) never wait. A run cancelled while it
    waits raises ``stop``'s error, holding nothing; on the main thread Ctrl-C (any signal
    handler's exception) ends the wait the same way."""
    if _NATIVE is None:
        return None
    scope = _NATIVE.run_enter(getattr(stop, "flag", None), limit, joined)
    if scope is None:  # the flag was set while it waited: the run's usual cancelled error
        stop()
        raise RuntimeError("the run was cancelled while it waited for its turn")  # a stop that did not raise
    return scope


def end_scope(scope) -> None:
    """Close a :func:`run_scope` on the thread that opened it."""
    if scope is not None:
        _NATIVE.run_exit(scope)


def check_stop() -> None:
    """Raise the run's stop error when the caller asked the run to end (a cancelled run);
    kernels with long loops of their own call it between parts. Nothing when no run is
    in progress or its caller gave no ``stop``."""
    stop = STOP.get()
    if stop is not None:
        stop()


class CPUKernelError(RuntimeError):
    """A kernel raised; carries the node's name and op so the core can say where."""

    def __init__(self, message: str, node_name: str, op_type: str):
        super().__init__(message)
        self.node_name = node_name
        self.op_type = op_type


def kernel_error(ctx, exc: Exception) -> CPUKernelError:
    """The error a run raises for a kernel that raised ``exc``: names the node and its op."""
    node = ctx.node
    return CPUKernelError(f"{node.op_type} node {node.name!r} failed: {type(exc).__name__}: {exc}",
                          node.name, node.op_type)


def run_step(step, slots: list, check: bool):
    """Run ``step`` on ``slots``: its in-place variant when an input is exclusively this
    call's, else its kernel; store its results; check them when ``check``. Returns the
    arguments the kernel saw (for profiling). A kernel's error
    is raised as :class:`CPUKernelError` naming the node, chained to the original."""
    fn, ctx, in_slots, out_slots, attrs, _, alt = step
    args = [slots[s] for s in in_slots]
    try:
        if alt is not None and (own := inplace.owned(args, slots, alt[1])) >= 0:
            res = alt[0](ctx, own, *args, **attrs)
        elif attrs:
            res = fn(ctx, *args, **attrs)
        else:  # no keywords to unpack (a bound step's call, say): a cheaper call
            res = fn(ctx, *args)
    except CPUKernelError:
        raise
    except Exception as exc:
        raise kernel_error(ctx, exc) from exc
    if type(res) is np.ndarray and len(out_slots) == 1:
        # the common case, one array for one output (~0.25 us a node less than the loop)
        if out_slots[0] >= 0:
            slots[out_slots[0]] = res
        if check:
            check_outputs(ctx, (res,))
        return args
    if type(res) is not tuple:
        res = (res,)
    for s, r in zip(out_slots, res):
        if s >= 0:
            if type(r) is not np.ndarray and r is not None and not isinstance(r, (list, dict)):
                r = np.asarray(r)
            slots[s] = r
    if check:
        check_outputs(ctx, res)
    return args


def check_outputs(ctx, res) -> None:
    """Raise :class:`CPUKernelError` when a kernel returned too few outputs or a dtype the
    model does not declare (``RUNTIME_CORE_CHECK_KERNELS``)."""
    node = ctx.node
    n_wanted = sum(1 for o in node.outputs if o)
    produced = sum(1 for o, r in zip(node.outputs, res) if o)
    if produced < n_wanted:
        raise CPUKernelError(f"{node.op_type} node {node.name!r} returned {len(res)} outputs, "
                             f"the node declares {len(node.outputs)}", node.name, node.op_type)
    for i, (name, r) in enumerate(zip(node.outputs, res)):
        want = ctx.output_dtypes[i] if i < len(ctx.output_dtypes) else None
        if not name or want is None or not isinstance(r, np.ndarray):
            continue
        got = np.asarray(r).dtype
        if got != want and not (want == np.dtype(object) and got.kind in "OUS"):
            raise CPUKernelError(
                f"{node.op_type} node {node.name!r} output {i} ({name!r}) has dtype {got}, "
                f"the model says {want}", node.name, node.op_type)
