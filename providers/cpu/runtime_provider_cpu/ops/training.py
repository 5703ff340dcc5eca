"""CPU kernels: ai.onnx.preview.training (the optimizers Adagrad, Adam, Momentum, and Gradient).

The optimizers take ``R`` (learning rate, float or double scalar), ``T`` (update
count, int64 scalar) and then the variadic tensors grouped by kind: Adagrad
``X_1..X_n, G_1..G_n, H_1..H_n`` -> ``X_new.., H_new..``; Momentum ``X.., G.., V..``
-> ``X_new.., V_new..``; Adam ``X.., G.., V.., H..`` -> ``X_new.., V_new.., H_new..``.
Scalar coefficients are formed in float64 and the update runs in the tensors'
dtype (float or double), so each output has exactly its input's dtype.

``Gradient`` (ai.onnx.preview.training) differentiates the ``xs, zs -> y`` subgraph of
the graph that holds it by reverse mode: its capability check (which runs while the
provider is offered the graph) slices the nodes that compute ``y`` from ``xs`` / ``zs``
and constants, and declines unless every one is an op with a derivative rule here
(Add, Sub, Mul, Div, Neg, Identity, Sum, MatMul, Gemm, Relu, Tanh, Sigmoid, Exp, Log,
Sqrt).
The kernel reruns that forward slice on its own inputs (the values of ``xs`` then
``zs``) with the CPU kernels, then propagates the gradient back from a seed of ones in
y's shape (for a scalar y, dy/dx itself; otherwise the gradient of the sum of y).
An x that y does not depend on gets zeros.
"""

from __future__ import annotations

import weakref

import numpy as np

from ..registry import REGISTRY, SCOPE, KernelContext, kernel

_TRAINING = "ai.onnx.preview.training"


# -- optimizers (ai.onnx.preview.training) ---------------------------------------------

def _scalar(v, what):
    a = np.asarray(v)
    if a.size != 1:
        raise ValueError(f"{what} must be a scalar, got shape {a.shape}")
    return a.reshape(()).item()


def _groups(xs, k, op):
    if len(xs) % k:
        raise ValueError(f"{op}: {len(xs)} tensor inputs are not a multiple of {k}")
    n = len(xs) // k
    return [xs[i * n:(i + 1) * n] for i in range(k)]


def _c(v, like):
    """A float64 coefficient as a scalar of the tensor's dtype (keeps float32 float32)."""
    return like.dtype.type(v)


@kernel("Adagrad", 1, domain=_TRAINING)
def adagrad(ctx, r, t, *xs, decay_factor, epsilon, norm_coefficient):
    xs_, gs, hs = _groups(xs, 3, "Adagrad")
    rate = _scalar(r, "R") / (1.0 + _scalar(t, "T") * decay_factor)
    out_x, out_h = [], []
    for x, g, h in zip(xs_, gs, hs):
        g_reg = _c(norm_coefficient, x) * x + g
        h_new = h + g_reg * g_reg
        x_new = x - _c(rate, x) * g_reg / (np.sqrt(h_new) + _c(epsilon, x))
        out_x.append(x_new.astype(x.dtype, copy=False))
        out_h.append(h_new.astype(h.dtype, copy=False))
    return tuple(out_x + out_h)


@kernel("Momentum", 1, domain=_TRAINING)
def momentum(ctx, r, t, *xs, alpha, beta, mode, norm_coefficient):
    if alpha is None or beta is None or mode is None or norm_coefficient is None:
        raise ValueError("Momentum needs the attributes alpha, beta, mode and norm_coefficient")
    if mode not in ("standard", "nesterov"):
        raise ValueError(f"Momentum mode {mode!r} is not 'standard' or 'nesterov'")
    xs_, gs, vs = _groups(xs, 3, "Momentum")
    rate = _scalar(r, "R")
    beta_adj = beta if _scalar(t, "T") > 0 else 1.0
    out_x, out_v = [], []
    for x, g, v in zip(xs_, gs, vs):
        g_reg = _c(norm_coefficient, x) * x + g
        v_new = _c(alpha, x) * v + _c(beta_adj, x) * g_reg
        if mode == "standard":
            x_new = x - _c(rate, x) * v_new
        else:
            x_new = x - _c(rate, x) * (g_reg + _c(alpha, x) * v_new)
        out_x.append(x_new.astype(x.dtype, copy=False))
        out_v.append(v_new.astype(v.dtype, copy=False))
    return tuple(out_x + out_v)


@kernel("Adam", 1, domain=_TRAINING)
def adam(ctx, r, t, *xs, alpha, beta, epsilon, norm_coefficient, norm_coefficient_post):
    xs_, gs, vs, hs = _groups(xs, 4, "Adam")
    rate = _scalar(r, "R")
    step = _scalar(t, "T")
    if step > 0:
        rate = rate * np.sqrt(1.0 - beta ** step) / (1.0 - alpha ** step)
    out_x, out_v, out_h = [], [], []
    for x, g, v, h in zip(xs_, gs, vs, hs):
        g_reg = _c(norm_coefficient, x) * x + g
        v_new = _c(alpha, x) * v + _c(1.0 - alpha, x) * g_reg
        h_new = _c(beta, x) * h + _c(1.0 - beta, x) * (g_reg * g_reg)
        x_new = x - _c(rate, x) * (v_new / (np.sqrt(h_new) + _c(epsilon, x)))
        x_final = _c(1.0 - norm_coefficient_post, x) * x_new
        out_x.append(x_final.astype(x.dtype, copy=False))
        out_v.append(v_new.astype(v.dtype, copy=False))
        out_h.append(h_new.astype(h.dtype, copy=False))
    return tuple(out_x + out_v + out_h)


# -- Gradient (ai.onnx.preview.training) --------------------------------------------------

def _unbroadcast(g, shape):
    """Sum ``g`` down to ``shape`` (the reverse of numpy broadcasting)."""
    shape = tuple(shape)
    if g.shape == shape:
        return g
    lead = g.ndim - len(shape)
    if lead:
        g = g.sum(axis=tuple(range(lead)))
    axes = tuple(i for i, d in enumerate(shape) if d == 1 and g.shape[i] != 1)
    if axes:
        g = g.sum(axis=axes, keepdims=True)
    return g.reshape(shape)


def _vjp_matmul(g, a, b):
    a2 = a[None, :] if a.ndim == 1 else a
    b2 = b[:, None] if b.ndim == 1 else b
    g2 = g
    if a.ndim == 1:
        g2 = np.expand_dims(g2, -2)
    if b.ndim == 1:
        g2 = np.expand_dims(g2, -1)
    ga = np.matmul(g2, np.swapaxes(b2, -1, -2))
    gb = np.matmul(np.swapaxes(a2, -1, -2), g2)
    ga = _unbroadcast(ga, a2.shape).reshape(a.shape)
    gb = _unbroadcast(gb, b2.shape).reshape(b.shape)
    return ga, gb


def _vjp_gemm(g, i, y, at):
    a, b = i[0], i[1]
    alpha, beta = at.get("alpha", 1.0), at.get("beta", 1.0)
    ta, tb = bool(at.get("transA", 0)), bool(at.get("transB", 0))
    a2, b2 = (a.T if ta else a), (b.T if tb else b)
    ga = (g @ b2.T) * g.dtype.type(alpha)
    gb = (a2.T @ g) * g.dtype.type(alpha)
    out = [ga.T if ta else ga, gb.T if tb else gb]
    if len(i) > 2 and i[2] is not None:
        out.append(_unbroadcast(g * g.dtype.type(beta), i[2].shape))
    return tuple(out)


# op -> fn(g, inputs, output, attrs) -> gradient of each input (None: no gradient flows)
_VJP = {
    "Add": lambda g, i, y: (_unbroadcast(g, i[0].shape), _unbroadcast(g, i[1].shape)),
    "Sub": lambda g, i, y: (_unbroadcast(g, i[0].shape), _unbroadcast(-g, i[1].shape)),
    "Mul": lambda g, i, y: (_unbroadcast(g * i[1], i[0].shape), _unbroadcast(g * i[0], i[1].shape)),
    "Div": lambda g, i, y: (_unbroadcast(g / i[1], i[0].shape),
                            _unbroadcast(-g * i[0] / (i[1] * i[1]), i[1].shape)),
    "Neg": lambda g, i, y: (-g,),
    "Identity": lambda g, i, y: (g,),
    "Sum": lambda g, i, y: tuple(_unbroadcast(g, x.shape) for x in i),
    "MatMul": lambda g, i, y: _vjp_matmul(g, i[0], i[1]),
    "Relu": lambda g, i, y: (g * (i[0] > 0),),
    "Tanh": lambda g, i, y: (g * (1 - y * y),),
    "Sigmoid": lambda g, i, y: (g * y * (1 - y),),
    "Exp": lambda g, i, y: (g * y,),
    "Log": lambda g, i, y: (g / i[0],),
    "Sqrt": lambda g, i, y: (g / (2 * y),),
}
_VJP = {k: (lambda f: lambda g, i, y, at: f(g, i, y))(f) for k, f in _VJP.items()}
_VJP["Gemm"] = _vjp_gemm  # the optimizer fuses MatMul + Add into Gemm

#: the forward slice of each claimed Gradient node, found by its capability check
_GRAD_PLANS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def _graph_nodes():
    # SCOPE is (opsets, value lookup, every node of the graph) while get_capability runs
    scope = SCOPE.get()
    if not scope or len(scope) < 3 or scope[1] is None or not scope[2]:
        return None
    return tuple(scope[2]), scope[1]


def _gradient_plan(node):
    """(forward nodes in order, constants) or a reason string."""
    got = _graph_nodes()
    if got is None:
        return "Gradient needs the enclosing graph, which this provider was not offered"
    nodes, value_of = got
    a = node.attrs
    xs = list(a.get("xs") or [])
    zs = list(a.get("zs") or [])
    y = a.get("y")
    if not xs or not y:
        return "Gradient needs the xs and y attributes"
    n_in = sum(1 for i in node.inputs if i)
    if n_in != len(xs) + len(zs):
        return f"Gradient has {n_in} inputs for {len(xs)} xs and {len(zs)} zs"
    leaves = set(xs) | set(zs)
    producer = {}
    for n in nodes:
        for o in n.outputs:
            if o:
                producer[o] = n
    needed, seen, order, consts = [y], set(), [], {}
    while needed:
        v = needed.pop()
        if v in seen or v in leaves or not v:
            continue
        seen.add(v)
        p = producer.get(v)
        if p is None:
            info = value_of(v)
            if info is not None and getattr(info, "const", None) is not None:
                consts[v] = info.const
                continue
            return f"Gradient: {v!r} on the path to {y!r} is neither in xs/zs, a constant, nor computed here"
        if p is node:
            return "Gradient: y depends on the Gradient node itself"
        if p.domain not in ("", "ai.onnx") or p.op_type not in _VJP:
            return f"Gradient through {p.op_type} is not implemented (rules: {', '.join(sorted(_VJP))})"
        if REGISTRY.lookup(p.domain, p.op_type, p.since_version) is None:
            return f"Gradient: no CPU kernel for {p.qualified_op}"
        if p not in order:
            order.append(p)
        needed.extend(i for i in p.inputs if i)
    pos = {id(n): k for k, n in enumerate(nodes)}
    order.sort(key=lambda n: pos[id(n)])  # topological, as the graph lists them
    return order, consts


def _gradient_check(node):
    plan = _gradient_plan(node)
    if isinstance(plan, str):
        return plan
    _GRAD_PLANS[node] = plan
    return None


@kernel("Gradient", 1, domain=_TRAINING, check=_gradient_check)
def gradient(ctx, *inputs, xs, y, zs=None):
    plan = _GRAD_PLANS.get(ctx.node)
    if plan is None:
        raise RuntimeError("Gradient: the forward subgraph was not recorded at capability time")
    order, consts = plan
    zs = list(zs or [])
    env = dict(consts)
    env.update(zip(list(xs) + zs, inputs))
    # forward: rerun the slice at the given values, keeping each node's inputs and outputs
    records = []
    for n in order:
        spec = REGISTRY.lookup(n.domain, n.op_type, n.since_version)
        kctx = KernelContext(node=n, n_outputs=len(n.outputs),
                             input_dtypes=tuple(i.dtype if i is not None else None for i in n.input_info),
                             output_dtypes=tuple(o.dtype if o is not None else None for o in n.output_info))
        ins = [env[i] for i in n.inputs if i]
        out = spec.fn(kctx, *ins, **dict(n.attrs))
        out = out if isinstance(out, tuple) else (out,)
        for name, v in zip(n.outputs, out):
            if name:
                env[name] = np.asarray(v)
        records.append((n, ins, np.asarray(out[0])))
    yv = np.asarray(env[y])
    grads = {y: np.ones_like(yv)}
    for n, ins, out in reversed(records):
        g = grads.get(n.outputs[0])
        if g is None:
            continue
        for name, gi in zip([i for i in n.inputs if i], _VJP[n.op_type](g, ins, out, n.attrs)):
            if gi is None:
                continue
            grads[name] = grads[name] + gi if name in grads else gi
    res = []
    for x, xv in zip(xs, inputs):
        g = grads.get(x)
        xv = np.asarray(xv)
        res.append(np.zeros_like(xv) if g is None else np.asarray(g).astype(xv.dtype, copy=False).reshape(xv.shape))
    return tuple(res) if len(res) > 1 else res[0]
