"""In-place kernel variants: when a step may overwrite one of its inputs.

Decided in two halves: at compile time, which inputs of a step die at it and are
intermediates of the partition (:func:`candidates`); at run time, whether the array is
exclusively this call's (:func:`owned`, by reference count).
"""

from __future__ import annotations

import math
import os
import sys

import numpy as np

_getrefcount = sys.getrefcount


def inplace_variant(kernel_fn, *positions):
    """Register ``variant`` as the in-place form of ``kernel_fn`` (a decorator).

    ``variant(ctx, owned, *inputs, **attrs)`` must return exactly what ``kernel_fn`` returns;
    it may overwrite (and return) input ``owned``, one of ``positions``. The executable calls
    it instead of the kernel only when that input's array is exclusively this call's:

    * at compile time: the value is an intermediate of this partition (not a partition input,
      output or constant), this node is its last reader and reads it once;
    * at run time: the array is writeable, nothing else references it (reference count: no
      other slot, view, cache or caller holds it; a view of it would hold it through ``base``),
      and it owns its memory or is a view of an array that only it references (the owner's
      reference count says so: a reshape of a kernel's fresh result qualifies, a view of a
      feed, initializer or any live value does not).

    Otherwise the plain kernel runs. A variant still checks shapes and dtypes itself (say, that
    the owned array has the broadcast result's shape) and falls back to fresh arrays.
    """
    def deco(variant):
        kernel_fn.inplace = (tuple(positions), variant)
        return variant
    return deco


def owned(args, slots, cands) -> int:
    """The position of the first candidate input whose array is exclusively this call's, or -1.

    A candidate's slot dies at this step, so it is cleared first (the step's ``frees`` would
    clear it anyway); then the only references left are ``args``, the local name and
    ``getrefcount``'s own argument: any other holder (another slot aliasing the same object, a
    view's ``base``, a kernel cache, the caller) makes the count larger.
    """
    for p, s in cands:
        a = args[p]
        if type(a) is not np.ndarray or not a.flags.writeable:
            continue
        base = a.base
        if base is not None:
            # a view (a reshape of a kernel's fresh result, say) of an array that nothing else
            # holds: numpy points every view at the array owning the memory, so a count of 2
            # (``a.base`` and this name, plus getrefcount's argument: 3) means no other view
            if type(base) is not np.ndarray or base.base is not None or _getrefcount(base) != 3:
                continue
        base = None
        slots[s] = None
        if _getrefcount(a) == 3:
            return p
    return -1


def calibrate() -> bool:
    """Whether reference counts mean what :func:`owned` assumes on this interpreter: an
    exclusive array (and a view of an otherwise unreferenced array) is accepted, and one extra
    holder of either is refused. Checked once at import; in-place execution is off when not,
    or when ``RUNTIME_CORE_CPU_INPLACE=0``."""
    if os.environ.get("RUNTIME_CORE_CPU_INPLACE", "") == "0":
        return False
    try:
        args = [np.empty(4)]
        ok = owned(args, [None, args[0]], ((0, 1),)) == 0
        held = np.empty(4)
        args = [held]
        ok = ok and owned(args, [None, held], ((0, 1),)) == -1
        args = [np.empty(8).reshape(2, 4)]
        ok = ok and owned(args, [None, args[0]], ((0, 1),)) == 0
        base = np.empty(8)
        args = [base.reshape(2, 4)]
        ok = ok and owned(args, [None, args[0]], ((0, 1),)) == -1
        del base, held, args
        return ok
    except Exception:  # noqa: BLE001 - any surprise: run every kernel out of place
        return False


ENABLED = calibrate()


def min_elements() -> int:
    """``RUNTIME_CORE_CPU_INPLACE_MIN``, else 4096 (see :data:`MIN_ELEMENTS`)."""
    raw = os.environ.get("RUNTIME_CORE_CPU_INPLACE_MIN", "")
    try:
        return max(0, int(raw)) if raw else 4096
    except ValueError:
        return 4096


#: a step whose outputs all have static sizes below this many elements runs its plain kernel:
#: the ownership test (about 0.7 us a call) costs more than a fresh small array saves.
#: ``RUNTIME_CORE_CPU_INPLACE_MIN`` overrides it (the test suite sets 0, so that its small
#: tensors exercise every in-place variant).
MIN_ELEMENTS = min_elements()


def small_outputs(node) -> bool:
    """Whether every output of ``node`` has a static shape of fewer than
    :data:`MIN_ELEMENTS` elements (unknown or symbolic shapes are not small)."""
    if MIN_ELEMENTS <= 0:
        return False
    seen = False
    for info in node.output_info:
        if info is None:
            continue
        shape = info.shape
        if shape is None or not all(type(d) is int for d in shape):
            return False
        if math.prod(shape) >= MIN_ELEMENTS:
            return False
        seen = True
    return seen


def assign(steps, input_slots, parallel: bool) -> int:
    """Give each step its in-place candidates (``step[6]``: ``(variant, ((position, slot),
    ...))`` or ``None``); steps are lists whose ``[5]`` already holds the slots dying there.
    Returns how many steps got a variant.

    Candidates: inputs that die here, read once by this node, never a partition input (feeds
    belong to the caller) nor kept (outputs, constants). Never with a parallel schedule:
    "last reader" is then an order in time that no longer holds (an earlier reader may run at
    the same time on another thread and still be about to read the slot that :func:`owned`
    clears), and the reference count :func:`owned` relies on can change under it. Subgraph
    bodies stay sequential, so their in-place steps are safe: a body's intermediates are only
    ever seen by the thread running it.
    """
    inputs_set = set(input_slots)
    n = 0
    for st in steps:
        alt = st[6]
        st[6] = None
        if alt is None or not ENABLED or parallel or small_outputs(st[1].node):
            continue
        dying = set(st[5])
        cands = tuple((p, st[2][p]) for p in alt[0] if p < len(st[2])
                      and st[2][p] in dying and st[2][p] not in inputs_set
                      and st[2].count(st[2][p]) == 1)
        if cands:
            st[6] = (alt[1], cands)
            n += 1
    return n
