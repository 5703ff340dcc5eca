"""CPU kernels: control flow (If, Loop, Scan).

Bodies are compiled once per node into ``ctx.subgraphs`` (see ``execution.subgraph``);
the kernels run them with the outer-scope values they read (``outer``). A node whose
bodies hold an op the provider cannot run is declined at capability time, naming it.
A cancelled run (``check_stop``) ends between iterations, and between a body's steps.

Values: tensors are numpy arrays, sequences are lists, an empty optional is ``None``.
"""

from __future__ import annotations

import numpy as np

from ..execution.step import check_stop
from ..execution.subgraph import subgraph_decline_reason
from ..registry import kernel

_ALL_IF_LOOP = (1, 11, 13, 16, 19, 21, 23, 24, 25)  # one semantics, wider type lists
_SCAN_9 = (9, 11, 16, 19, 21, 23, 24, 25)


def check_bodies(node) -> str | None:
    """Decline a control-flow node when any op of its (nested) subgraphs cannot run."""
    from ..plugin import decline_reason  # lazily: plugin imports the kernel modules

    return subgraph_decline_reason(node, decline_reason)


def _scalar_bool(v, what: str) -> bool:
    a = np.asarray(v)
    if a.size != 1:
        raise ValueError(f"{what} must hold a single element, got shape {a.shape}")
    return bool(a.reshape(-1)[0])


def _empty_stack(info, what: str):
    """The scan output of zero iterations: shape ``(0, *element shape)``."""
    shape = getattr(info, "static_shape", None) if info is not None else None
    dtype = getattr(info, "dtype", None) if info is not None else None
    if shape is None or dtype is None:
        raise ValueError(f"{what} has no iterations and the element shape of the scan output "
                         "is not known statically")
    return np.empty((0,) + tuple(shape), dtype=dtype)


def _stack(items, what: str):
    try:
        return np.stack(items, axis=0)
    except ValueError as exc:
        shapes = sorted({tuple(np.shape(x)) for x in items})
        raise ValueError(f"{what}: scan output shapes differ across iterations {shapes}") from exc


# -- If ----------------------------------------------------------------------------------

@kernel("If", *_ALL_IF_LOOP, control=True, check=check_bodies)
def if_(ctx, cond, *, then_branch, else_branch, outer):
    sub = ctx.subgraphs["then_branch" if _scalar_bool(cond, "If condition") else "else_branch"]
    outs = sub.run([], outer)
    if len(outs) != ctx.n_outputs:
        raise ValueError(f"the {'then' if sub is ctx.subgraphs['then_branch'] else 'else'} branch "
                         f"returns {len(outs)} values, the node has {ctx.n_outputs} outputs")
    return tuple(outs)


# -- Loop --------------------------------------------------------------------------------

@kernel("Loop", *_ALL_IF_LOOP, control=True, check=check_bodies)
def loop(ctx, M=None, cond=None, *v_initial, body, outer):
    sub = ctx.subgraphs["body"]
    n_carried = len(v_initial)
    n_scan = len(sub.output_names) - 1 - n_carried
    if len(sub.input_names) != 2 + n_carried or n_scan < 0:
        raise ValueError(f"Loop body takes {len(sub.input_names)} inputs and returns "
                         f"{len(sub.output_names)} outputs; the node carries {n_carried} values")
    trip = None
    if M is not None:
        m = np.asarray(M)
        if m.size != 1:
            raise ValueError(f"Loop trip count M must hold one element, got shape {m.shape}")
        trip = int(m.reshape(-1)[0])
    if cond is None:
        cond_v = np.array(True)
        keep = True
    else:
        cond_v = cond
        keep = _scalar_bool(cond, "Loop condition")
    carried = list(v_initial)
    scans = [[] for _ in range(n_scan)]
    i = 0
    while keep and (trip is None or i < trip):
        check_stop()
        outs = sub.run([np.array(i, dtype=np.int64), cond_v, *carried], outer)
        cond_v = outs[0]
        if cond_v is None:
            raise ValueError("the Loop body returned no condition value")
        keep = _scalar_bool(cond_v, "Loop body condition output")
        carried = list(outs[1:1 + n_carried])
        for k in range(n_scan):
            scans[k].append(outs[1 + n_carried + k])
        i += 1
    res = list(carried)
    for k in range(n_scan):
        what = f"Loop scan output {k}"
        res.append(_stack(scans[k], what) if scans[k] else
                   _empty_stack(sub.output_info[1 + n_carried + k], what))
    return tuple(res)


# -- Scan --------------------------------------------------------------------------------

def _axes(values, n, default=0):
    vals = list(values) if values is not None else []
    if len(vals) not in (0, n):
        raise ValueError(f"expected {n} values, got {len(vals)}")
    return vals if vals else [default] * n


def _check_scan9(node) -> str | None:
    why = check_bodies(node)
    if why:
        return why
    if node.since_version == 9:
        for k in ("scan_input_axes", "scan_output_axes"):
            if any(a < 0 for a in (node.attrs.get(k) or [])):
                return f"Scan-9 {k} must be non-negative (negative axes came with Scan-11)"
    return None


@kernel("Scan", *_SCAN_9, control=True, check=_check_scan9)
def scan(ctx, *args, body, num_scan_inputs, scan_input_axes=None, scan_input_directions=None,
         scan_output_axes=None, scan_output_directions=None, outer):
    sub = ctx.subgraphs["body"]
    n_in = num_scan_inputs
    n_state = len(args) - n_in
    if n_in < 1 or n_state < 0:
        raise ValueError(f"Scan needs num_scan_inputs ({n_in}) >= 1 scan inputs, got {len(args)} inputs")
    n_out = len(sub.output_names) - n_state
    in_axes = _axes(scan_input_axes, n_in)
    in_dirs = _axes(scan_input_directions, n_in)
    out_axes = _axes(scan_output_axes, n_out)
    out_dirs = _axes(scan_output_directions, n_out)
    states = list(args[:n_state])
    seqs = []
    length = None
    for j, x in enumerate(args[n_state:]):
        x = np.asarray(x)
        ax = in_axes[j] + x.ndim if in_axes[j] < 0 else in_axes[j]
        if not 0 <= ax < x.ndim:
            raise ValueError(f"scan input {j} axis {in_axes[j]} is out of range for rank {x.ndim}")
        x = np.moveaxis(x, ax, 0)
        if in_dirs[j]:
            x = x[::-1]
        if length is None:
            length = x.shape[0]
        elif x.shape[0] != length:
            raise ValueError(f"scan inputs have different lengths ({length} and {x.shape[0]})")
        seqs.append(x)
    acc = [[] for _ in range(n_out)]
    for t in range(length):
        check_stop()
        outs = sub.run(states + [s[t] for s in seqs], outer)
        states = list(outs[:n_state])
        for k in range(n_out):
            acc[k].append(outs[n_state + k])
    res = states
    for k in range(n_out):
        what = f"Scan output {n_state + k}"
        y = _stack(acc[k], what) if acc[k] else _empty_stack(sub.output_info[n_state + k], what)
        if out_dirs[k]:
            y = y[::-1]
        ax = out_axes[k] + y.ndim if out_axes[k] < 0 else out_axes[k]
        if not 0 <= ax < y.ndim:
            raise ValueError(f"scan output {k} axis {out_axes[k]} is out of range for rank {y.ndim}")
        if ax:
            y = np.moveaxis(y, 0, ax)
        res.append(np.ascontiguousarray(y))
    return tuple(res)


@kernel("Scan", 8, control=True, check=check_bodies)
def scan8(ctx, sequence_lens, *args, body, num_scan_inputs, directions=None, outer):
    """Scan-8: axis 0 of every input is the batch, axis 1 of scan inputs the sequence;
    ``sequence_lens`` (optional) bounds each batch entry's steps; scan outputs are
    zero past a shorter sequence's end."""
    sub = ctx.subgraphs["body"]
    n_in = num_scan_inputs
    n_state = len(args) - n_in
    if n_in < 1 or n_state < 0:
        raise ValueError(f"Scan needs num_scan_inputs ({n_in}) >= 1 scan inputs, got {len(args)} inputs")
    n_out = len(sub.output_names) - n_state
    dirs = _axes(directions, n_in)
    xs = [np.asarray(x) for x in args[n_state:]]
    batch = xs[0].shape[0]
    max_len = xs[0].shape[1]
    for x in xs:
        if x.ndim < 2 or x.shape[0] != batch or x.shape[1] != max_len:
            raise ValueError("Scan-8 scan inputs must share batch and sequence dims, got shapes "
                             f"{[tuple(x.shape) for x in xs]}")
    if sequence_lens is None:
        lens = [max_len] * batch
    else:
        lens = [int(v) for v in np.asarray(sequence_lens).reshape(-1)]
        if len(lens) != batch or any(not 0 <= v <= max_len for v in lens):
            raise ValueError(f"sequence_lens {lens} do not fit batch {batch} and length {max_len}")
    final_states = [[] for _ in range(n_state)]
    per_batch = [[] for _ in range(n_out)]
    for b in range(batch):
        states = [np.asarray(s)[b] for s in args[:n_state]]
        n = lens[b]
        acc = [[] for _ in range(n_out)]
        for t in range(n):
            check_stop()
            outs = sub.run(states + [x[b, (n - 1 - t) if d else t] for x, d in zip(xs, dirs)], outer)
            states = list(outs[:n_state])
            for k in range(n_out):
                acc[k].append(outs[n_state + k])
        for i in range(n_state):
            final_states[i].append(states[i])
        for k in range(n_out):
            what = f"Scan output {n_state + k}"
            if acc[k]:
                y = _stack(acc[k], what)
                if n < max_len:
                    y = np.concatenate([y, np.zeros((max_len - n,) + y.shape[1:], y.dtype)])
            else:
                e = _empty_stack(sub.output_info[n_state + k], what)
                y = np.zeros((max_len,) + e.shape[1:], e.dtype)
            per_batch[k].append(y)
    res = []
    for i in range(n_state):
        if final_states[i]:
            res.append(_stack(final_states[i], "Scan state"))
        else:
            s = np.asarray(args[i])
            res.append(s.copy())
    for k in range(n_out):
        res.append(_stack(per_batch[k], f"Scan output {n_state + k}") if per_batch[k] else
                   np.empty((0, max_len) + tuple(_empty_stack(sub.output_info[n_state + k],
                                                               "Scan output").shape[1:])))
    return tuple(res)
